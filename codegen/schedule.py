"""Config -> Schedule: the concrete loop structure codegen emits (all sizes and strides known).

A schedule is a short list of frozen decisions plus the facts of the workload it was made for, so
code generation needs nothing else.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from aotune.analysis.polyhedral import AccessInfo, TensorAccessInfo
from aotune.analysis.workload import ConvParams, Workload
from aotune.constraints.cpu import (
    ORDERS,
    PAR_LOOPS,
    CpuSpace,
    group_extent,
    group_stride,
    must_pack_because,
)
from aotune.constraints.space import Config
from aotune.errors import ConfigError
from aotune.hwspecs.spec import HwSpec

GroupSteps = tuple[
    tuple[int, tuple[int, ...]], ...
]  # per loop, outer to inner: (extent, index step per dim)


@dataclass(frozen=True)
class Gather:
    """How packing reads an input that is not one stride per group (a convolution window).

    Element (row, k) of the GEMM operand is ``tensor[offsets + steps(row) + steps(k)]``, and zero
    where a ``guarded`` dim leaves ``[0, dims[d])``. Codegen turns this into offset tables.
    """

    dims: tuple[int, ...]  # the addressed tensor's shape (the zero-padded copy's when there is one)
    rows: GroupSteps  # the operand's m group (A) or n group (B)
    k: GroupSteps
    offsets: tuple[int, ...]
    guarded: tuple[int, ...]

    def _run(self, group: GroupSteps, lane_guard: bool) -> int:
        if not group:
            return 1
        extent, step = group[-1]
        last = len(self.dims) - 1
        unit = step[last] == 1 and not any(step[:last])
        return extent if unit and (lane_guard or last not in self.guarded) else 1

    @property
    def run(self) -> int:
        """How many consecutive k indices are consecutive in memory (the innermost reduction loop,
        e.g. NHWC channels), so packing can copy them as one contiguous run; 1 if none."""
        return self._run(self.k, lane_guard=False)

    @property
    def row_run(self) -> int:
        """The same along the operand's rows (NCHW output pixels of one row, at stride 1). A run
        may cross the edge of a guarded innermost dim: its copy masks those lanes
        (``lane_guard_dim``)."""
        return self._run(self.rows, lane_guard=True)

    @property
    def lane_guard_dim(self) -> int | None:
        """The guarded innermost dim that row runs cross (NCHW width with padding): its bound is
        checked per lane, the other guards once per run; None when there is none."""
        last = len(self.dims) - 1
        return last if self.row_run > 1 and last in self.guarded else None

    @staticmethod
    def _flat(group: GroupSteps, ndim: int) -> np.ndarray:
        """Index contribution per dim (columns) of every flat group index (rows), row-major."""
        if not group:
            return np.zeros((1, ndim), dtype=np.int64)
        extents = [e for e, _ in group]
        digits = np.indices(extents).reshape(len(extents), -1)
        steps = np.array([s for _, s in group], dtype=np.int64)  # loops x dims
        return digits.T.astype(np.int64) @ steps

    def tables(self) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray, int]]]:
        """(row offsets, k offsets, per guarded dim: row indices, k indices, bound), in elements.

        A read is inside when ``0 <= row_idx + k_idx < bound`` for every guarded dim; the constant
        offsets are folded into the row tables.
        """
        nd = len(self.dims)
        row_strides = np.array([math.prod(self.dims[d + 1 :]) for d in range(nd)], dtype=np.int64)
        rows = self._flat(self.rows, nd) + np.array(self.offsets, dtype=np.int64)
        ks = self._flat(self.k, nd)
        guards = [(rows[:, d], ks[:, d], self.dims[d]) for d in self.guarded]
        return rows @ row_strides, ks @ row_strides, guards


@dataclass(frozen=True)
class PadCopy:
    """Copy one input into a zero-padded buffer before the GEMM, so packing needs no bounds checks
    (a buffer per thread holding the rows its share reads: ``codegen/launch.py``)."""

    operand: str  # "a" or "b"
    shape: tuple[int, ...]
    lo: tuple[int, ...]  # zeros before each dim
    padded: tuple[int, ...]

    @property
    def elems(self) -> int:
        """Elements of the padded buffer."""
        return math.prod(self.padded)


@dataclass(frozen=True)
class CpuSchedule:
    """Loop structure of a BLIS-style contraction kernel for one CPU target."""

    M: int
    N: int
    K: int
    mr: int
    nr: int
    kc: int
    mc: int
    nc: int
    order: str  # outer-to-inner cache-block loops, e.g. "nkm"
    pack_a: bool
    pack_b: bool
    unroll: int
    par: str  # "m" or "n"
    threads: int
    lanes: int  # fp32 lanes per vector
    a_sm: int  # element strides of A[m,k], B[k,n], C[m,n]
    a_sk: int
    b_sk: int
    b_sn: int
    c_sm: int
    batch: tuple[
        tuple[int, int, int, int], ...
    ] = ()  # per batch loop: (extent, A, B, C element strides)
    shapes: tuple[
        tuple[int, ...], ...
    ] = ()  # A, B, C tensor shapes (row-major), as the kernel expects them
    reference: str = (
        "mk,kn->mn"  # the contraction as an einsum over (A, B) -> C, for numpy checks ("" for conv)
    )
    bias: bool = False  # epilogue: add bias[n] to the finished output tile
    activation: str = "none"  # epilogue: then apply this activation
    a_gather: Gather | None = None  # A read through offset tables while packing (else a_sm/a_sk)
    a_shared: bool = (
        False  # A is indexed by the columns too: read in place as vectors via a_gather's tables
    )
    b_gather: Gather | None = None
    pad_copy: PadCopy | None = None
    conv: ConvParams | None = (
        None  # a convolution: the numpy reference is sliding windows, not einsum
    )
    a_is_first: bool = True  # A is the statement's first input (for a convolution: X)
    b_prefetch_rows: int = (
        0  # unpacked B: the micro-kernel prefetches the row this many k steps ahead
    )
    b_prefetch_level: int = (
        1  # ... into this cache level (2 where B rows alias one set group of L1)
    )
    c_prefetch_steps: int = 0  # the micro-kernel prefetches its C tile this many k steps early
    a_pack_prefetch_rows: int = 0  # A's pack prefetches the row this many rows ahead of its copy

    @property
    def batch_count(self) -> int:
        """How many independent GEMMs the batch loops hold."""
        count = 1
        for extent, *_ in self.batch:
            count *= extent
        return count

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations, over every batch entry."""
        return 2 * self.M * self.N * self.K * self.batch_count

    @property
    def pad_copy_per_thread(self) -> bool:
        """Whether each thread copies the whole input, rather than about its share of it.

        Where the parallel loop does not pick the padded operand's rows (NCHW output channels, or
        NHWC depthwise channels, split over the threads), every thread reads all of them and so
        copies all of them; where it does, each copies the rows its share reads
        (``launch.padded_rows_read``). Each copies into a buffer of its own either way: a buffer
        split over the threads sent its rows between the cores' caches (14x14x256 NCHW, side by
        side: 199-200 GFLOP/s shared, 202-203 private).
        """
        if self.pad_copy is None or self.threads < 2:
            return False
        return (self.pad_copy.operand == "a") != (self.par == "m")

    @property
    def has_epilogue(self) -> bool:
        """Whether the output tile's final store carries fused element-wise work."""
        return self.bias or self.activation != "none"

    @property
    def a_panel_row_major(self) -> bool:
        """A gathered A is packed row by row (kc apart), so each window's contiguous channel runs
        copy as vectors; the micro-kernel then reads A rows kc apart instead of interleaved."""
        return self.pack_a and self.a_gather is not None

    @property
    def a_pack_run(self) -> int:
        """Elements packing copies per contiguous run of a gathered A (1: element by element)."""
        return self.a_gather.run if self.a_panel_row_major and self.a_gather is not None else 1

    @property
    def b_pack_run(self) -> int:
        """The same for a gathered B, whose runs lie along its columns."""
        return self.b_gather.row_run if self.pack_b and self.b_gather is not None else 1

    @property
    def b_pack_copies_vectors(self) -> bool:
        """Packing copies B's panel rows as whole vectors: B is not gathered, its columns are
        contiguous and a panel is whole vectors wide."""
        return (
            self.pack_b and self.b_gather is None and self.b_sn == 1 and self.nr % self.lanes == 0
        )

    @property
    def pack_a_elems(self) -> int:
        """Workspace for one packed A block (mc rows rounded up to mr, kc deep)."""
        return -(-self.mc // self.mr) * self.mr * self.kc if self.pack_a else 1

    @property
    def pack_b_elems(self) -> int:
        """Workspace for one packed B block (kc deep, nc columns rounded up to nr)."""
        return -(-self.nc // self.nr) * self.nr * self.kc if self.pack_b else 1

    def thread_ranges(self) -> list[tuple[int, int]]:
        """[lo, hi) of the parallel loop for each thread, in whole register tiles, balanced."""
        extent, unit = (self.M, self.mr) if self.par == "m" else (self.N, self.nr)
        units = -(-extent // unit)
        bounds = [t * units // self.threads for t in range(self.threads + 1)]
        return [
            (bounds[t] * unit, min(extent, bounds[t + 1] * unit))
            for t in range(self.threads)
            if bounds[t + 1] > bounds[t]
        ]


def column_vector_widths(cols: int, lanes: int) -> tuple[int, ...]:
    """Lanes of each vector a micro-kernel uses across ``cols`` columns: full vectors, then a tail
    vector of the smallest power-of-two width that holds the rest (masked where it is not full).

    A narrower vector costs fewer FMA-pipe slots where the pipes are narrower than the registers
    (Zen 4 runs a 512-bit FMA as two 256-bit halves; a 7x7 NCHW row of 49 pixels is 3 x 16 lanes
    plus one: 7 slots, not 8) and never more elsewhere.
    """
    full, tail = divmod(cols, lanes)
    return (lanes,) * full + ((min(lanes, 1 << (tail - 1).bit_length()),) if tail else ())


def last_vector_lanes_used(cols: int, lanes: int) -> int:
    """Lanes of the last of ``column_vector_widths(cols, lanes)`` that hold columns: fewer than
    its width where it overhangs the tile, and its loads and stores are masked."""
    widths = column_vector_widths(cols, lanes)
    return cols - (len(widths) - 1) * lanes


def schedule_from_config(space: CpuSpace, cfg: Config) -> CpuSchedule:
    """Lower a valid config of ``space`` to a schedule (invalid configs are refused, with
    reasons)."""
    bad = space.violations(cfg)
    if bad:
        raise ConfigError(f"config is not valid for {space.title}: " + "; ".join(map(str, bad)))
    w, r, info, hw = space.workload, space.roles, space.info, space.hw
    assert w is not None and r is not None and info is not None and hw is not None
    c = cfg.as_dict()
    a, b, out = info.tensor(r.a), info.tensor(r.b), info.tensor(r.c)
    pad = _pad_copy(w, info, r.a) if c.get("pad_copy") else None

    def addressed(t: TensorAccessInfo, operand: str) -> tuple[int, ...]:
        return (
            pad.padded if pad is not None and pad.operand == operand else w.tensor(t.tensor).shape
        )

    def stride(t: TensorAccessInfo, operand: str, loop: str) -> int:
        dims = addressed(t, operand)
        return sum(
            dict(coeffs).get(loop, 0) * math.prod(dims[d + 1 :])
            for d, coeffs in enumerate(t.coefficients)
        )

    def gather(
        t: TensorAccessInfo,
        operand: str,
        rows: tuple[str, ...],
        vector_axis: bool,
        always: bool = False,
    ) -> Gather | None:
        if not always and must_pack_because(w, info, t.tensor, rows, r.k, vector_axis) is None:
            return None
        dims = addressed(t, operand)
        copied = pad is not None and pad.operand == operand
        lo = pad.lo if copied else (0,) * len(dims)

        def steps(group: tuple[str, ...]) -> GroupSteps:
            return tuple(
                (w.loop(n).extent, tuple(dict(cf).get(n, 0) for cf in t.coefficients))
                for n in group
            )

        return Gather(
            dims,
            steps(rows),
            steps(r.k),
            tuple(o + p for o, p in zip(t.offsets, lo)),
            () if copied else tuple(d for d, (below, above) in enumerate(t.halo) if below or above),
        )

    def linear(t: TensorAccessInfo, group: tuple[str, ...]) -> int:
        s = group_stride(w, t, group)
        return s if s is not None else 0  # unused: a gathered operand is always packed

    a_gather = gather(a, "a", r.m, False, always=r.shared_n)
    return CpuSchedule(
        M=group_extent(w, r.m),
        N=group_extent(w, r.n),
        K=group_extent(w, r.k),
        mr=c["mr"],
        nr=c["nr"],
        kc=c["kc"],
        mc=c["mc"],
        nc=c["nc"],
        order=ORDERS[c["order"]],
        pack_a=bool(c["pack_a"]),
        pack_b=bool(c["pack_b"]),
        unroll=c["unroll"],
        par=PAR_LOOPS[c["par"]],
        threads=c["threads"],
        lanes=hw.vector_lanes_f32,
        a_sm=linear(a, r.m),
        a_sk=linear(a, r.k),
        b_sk=linear(b, r.k),
        b_sn=linear(b, r.n) or 1,
        c_sm=linear(out, r.m),
        shapes=tuple(w.tensor(t).shape for t in (r.a, r.b, r.c)),
        reference=_reference_spec(w, r.a) if w.conv is None else "",
        batch=tuple(
            (w.loop(bl).extent, stride(a, "a", bl), stride(b, "b", bl), out.stride(bl))
            for bl in r.batch
        ),
        bias=w.epilogue.bias,
        activation=w.epilogue.activation,
        a_gather=a_gather,
        a_shared=r.shared_n,
        b_gather=gather(b, "b", r.n, True),
        pad_copy=pad,
        conv=w.conv,
        a_is_first=w.statement.inputs[0].tensor == r.a,
        b_prefetch_rows=b_prefetch_rows(
            hw,
            c["mr"],
            c["nr"],
            bool(c["pack_b"]) or r.shared_n,
            linear(b, r.k),
        ),
        b_prefetch_level=b_prefetch_level(hw, linear(b, r.k)),
        c_prefetch_steps=c_prefetch_steps(hw, c["mr"], c["nr"], c["kc"]),
        a_pack_prefetch_rows=a_pack_prefetch_rows(
            hw,
            bool(c["pack_a"]) and a_gather is None,
            linear(a, r.k),
            c["kc"],
            group_extent(w, r.m) * group_extent(w, r.k) * 4,
        ),
    )


def b_prefetch_rows(
    hw: HwSpec,
    mr: int,
    nr: int,
    contiguous: bool,
    b_row_stride: int = 0,
) -> int:
    """How many k steps ahead the micro-kernel prefetches an unpacked B row: far enough that the
    row arrives from beyond L2 in ``memory.prefetch_ahead_cycles``, counted at FMA speed (at the
    FMA latency for tiles too small to fill the pipes), but no further than L1 keeps the rows
    fetched ahead (``rows_l1_keeps_ahead``; B's row stride in elements, 0 where it is not known:
    no cap).

    The hardware prefetchers do not follow a stream of short rows a whole operand row apart: read
    in place from L3 or DRAM, each row waited for its lines (a 13 x 32 tile over 7x7 NHWC weights,
    2 KiB apart, ran at 83-104 GFLOP/s without prefetching, 176-205 with it, side by side). Packed
    panels are contiguous (and an A shared along the columns has a tiny B), so 0: no prefetch.
    """
    if contiguous:
        return 0
    ahead = _steps_ahead(hw, mr, nr)
    if b_row_stride and b_prefetch_level(hw, b_row_stride) == 1:
        ahead = min(ahead, rows_l1_keeps_ahead(hw, nr, b_row_stride))
    return ahead


def _steps_ahead(hw: HwSpec, mr: int, nr: int) -> int:
    """K steps of an mr x nr tile that take ``memory.prefetch_ahead_cycles``, the lead a
    prefetch needs to bring a line from memory, counted at FMA speed (at the FMA latency for
    tiles too small to fill the pipes)."""
    vectors = -(-nr // hw.vector_lanes_f32)
    # the FMAs a core issues per cycle at this vector width (Zen 4: one 512-bit FMA on two
    # 256-bit pipes), so the distance is in the core's own cycles, as hw calibrate measures it
    fma_rate = hw.core.fma_units * min(1.0, hw.core.fma_width_bits / hw.isa.vector_bits)
    # a k step is at least one FMA latency: each accumulator is a chain of one FMA per step (a
    # 3 x 16 tile over rows 16 KiB apart ran 12 cycles a step 200 rows ahead, 9 at 75)
    cycles_per_step = max(mr * vectors / fma_rate, hw.core.fma_latency_cycles)
    return max(1, math.ceil(hw.memory.prefetch_ahead_cycles / cycles_per_step))


def c_prefetch_steps(hw: HwSpec, mr: int, nr: int, kc: int) -> int:
    """How many k steps before a call's end the micro-kernel prefetches its C tile, which it adds
    to its sums and stores only after the last step: enough for the lines to come from memory
    (``_steps_ahead``), so a C block that did not stay in L2 between its k blocks is not waited
    for (Zen 2, 2048^3 and the BERT shapes, 6 x 16 tiles at kc = 256, side by side: 1.7-7%
    faster). 0, no prefetch, where a k block is shorter than that: the reorder window holds
    several such calls, which overlap their waits (``_calls_in_flight``), and prefetched at the
    start a kc = 64 call gained 1.6% where the model's charge for its wait was 6%."""
    steps = _steps_ahead(hw, mr, nr)
    return steps if kc >= steps else 0


def a_pack_prefetch_rows(
    hw: HwSpec, packs_rows: bool, a_k_stride: int, kc: int, a_bytes: int
) -> int:
    """How many rows ahead A's packing copy prefetches the row it will copy: enough rows that
    the prefetch leads by ``memory.prefetch_ahead_cycles``, each row's kc elements copied at a
    store a cycle. 0 where A is not packed row by row along a contiguous k (a gathered A, or
    one whose k stride is not 1: its rows share their lines), or where A (``a_bytes``, one
    batch entry's, as the model takes a once-packed A's source) fits in the usable share of a
    core of the farthest level that keeps swept lines (``HwSpec.swept_bytes_held``), so its rows
    come from there.

    The copy's loads are a few instructions an element, so the reorder window reaches only a
    few lines ahead, and rows a whole A row apart are short streams the prefetchers barely
    start on: copied from DRAM, the copy waited for most lines (Zen 2, 2048^3, side by side: 3%
    faster with the prefetch, par = n; Emerald Rapids, whose L3 streams no faster than memory,
    A of 16 MiB: 0.8 cycles an element against 1.9-2.1). From L3 it gained nothing, or lost
    (384x4096x1024: 2.5% slower, not understood)."""
    held = hw.swept_bytes_held()
    if not packs_rows or a_k_stride != 1 or a_bytes <= held:
        return 0
    per_row = kc / hw.core.store_ports
    return max(1, math.ceil(hw.memory.prefetch_ahead_cycles / per_row))


@functools.lru_cache(maxsize=4096)
def rows_l1_keeps_ahead(hw: HwSpec, nr: int, b_row_stride: int) -> int:
    """How many B rows a micro-kernel can prefetch into L1 ahead of its reads before they evict
    one another (stride in elements; at least 1).

    A line prefetched ahead is not kept like one just read: in the sets the rows share, the next
    line fetched into its set evicts it first, so a row survives while fewer rows than one per
    set are fetched ahead of it (measured on Zen 3 with rows in 2-64 sets: the README's "how far
    ahead B rows are prefetched").
    """
    l1 = hw.cache(1)
    line, sets = l1.line_bytes, l1.size_kib * 1024 // (l1.line_bytes * l1.associativity)
    stride, row_bytes = 4 * b_row_stride, 4 * nr
    fetched = [0] * sets
    # the rows' lines over one period of their set pattern (a sample where the stride is not a
    # whole number of lines)
    for i in range(sets):
        for ln in range(i * stride // line, (i * stride + row_bytes - 1) // line + 1):
            fetched[ln % sets] += 1
    return max(1, sets // max(fetched))


def b_prefetch_level(hw: HwSpec, b_row_stride: int) -> int:  # stride in elements
    """The cache level B rows are prefetched into: L1, unless rows a whole L1 way apart (a multiple
    of size / associativity) all land in one set group, where a row fetched ahead would evict the
    rows in use (Zen 4: an 8 x 16 tile at N=2048, panel read once per call: 141-157 GFLOP/s
    unprefetched, 119-138 prefetched into L1, 157-169 into L2). On a core whose L2 prefetch fills
    L1 too (``memory.l2_prefetch_fills_l1``) there is no such level: L1, and its cap on how far
    ahead (Zen 3: a 13 x 8 tile with B rows 16 KiB apart, 53 rows ahead into "L2" 43.6-44.3 ms,
    none 35.6-35.9)."""
    l1 = hw.cache(1)
    way_bytes = l1.size_kib * 1024 // l1.associativity
    whole_ways = b_row_stride * 4 % way_bytes == 0
    return 2 if whole_ways and not hw.memory.l2_prefetch_fills_l1 else 1


def _pad_copy(w: Workload, info: AccessInfo, a_name: str) -> PadCopy:
    """The zero-padded copy of the input that reads outside its bounds."""
    t = next(t for t in info.tensors if not t.is_output and t.reads_outside)
    shape = w.tensor(t.tensor).shape
    lo = tuple(below for below, _ in t.halo)
    padded = tuple(n + below + above for n, (below, above) in zip(shape, t.halo))
    return PadCopy("a" if t.tensor == a_name else "b", shape, lo, padded)


def _reference_spec(w: Workload, a_name: str) -> str:
    """The workload's einsum string with the inputs in (A, B) order."""
    ins, out = w.einsum_spec().split("->")
    first, second = ins.split(",")
    if w.statement.inputs[0].tensor != a_name:
        first, second = second, first
    return f"{first},{second}->{out}"
