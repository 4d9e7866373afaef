"""The CP-SAT space of CPU schedules for a two-input contraction (BLIS-style GEMM structure).

Loop roles come from the access analysis, not from the operator name: ``n`` is the group of
loops along which the output is contiguous, ``m`` the spatial loops of the other input, ``k`` the
reductions; each group is flattened into one GEMM dimension. The schedule is: three cache-block
loops (mc, nc, kc) in one of a few orders, optional packing of each input into contiguous panels,
then an mr x nr register tile whose k loop is unrolled.

An input that is not one stride per group (a convolution window) or reads outside its bounds
(zero padding) must be packed: packing gathers it through offset tables, with bounds checks or
from a zero-padded copy (the ``pad_copy`` decision). That is direct convolution: no im2col matrix
is ever materialised, only the L2-sized panels the micro-kernel reads.
Batch loops run outermost, one GEMM at a time.
When the output's contiguous loop indexes every tensor (NHWC depthwise channels), it becomes the
column loop with A "shared" along it: the micro-kernel loads A as vectors through offset tables
(element-wise with B) instead of broadcasting it, so the vector lanes stay full.
Roadmap: the same in-place window walk for the GEMM-shaped convolutions, to skip packing A.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aotune.analysis.polyhedral import AccessInfo, TensorAccessInfo, analyze
from aotune.analysis.workload import Workload, einsum
from aotune.constraints.expr import CeilDiv, Const, Expr, Prod, Sum, Var
from aotune.constraints.space import Config, Constraint, DecisionVar, Space
from aotune.errors import UnsatisfiableError, UnsupportedWorkloadError
from aotune.hwspecs.spec import HwSpec

ORDERS = ("nkm", "mkn", "nmk")  # outer-to-inner cache-block loops; nkm is BLIS's jc, pc, ic
PAR_LOOPS = ("m", "n")
# the labels of the categorical decisions (what --config takes), by decision name
CATEGORICAL_LABELS = {"order": ORDERS, "par": PAR_LOOPS}
UNROLLS = (1, 2, 4, 8)
KC_CANDIDATES = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 768, 1024)
MAX_BLOCK = 4096  # cache blocks beyond this are never useful on today's caches


@dataclass(frozen=True)
class Roles:
    """Which loops the GEMM rows (m), columns (n) and reduction (k) flatten, outer to inner, and
    which tensor is A (has m), B (has n) and C (the output).

    A convolution is a GEMM in disguise: NHWC rows are (n, oh, ow), columns ``ko`` and the
    reduction (r, s, c). ``batch`` loops run outermost, one GEMM after another: loops that index
    every tensor, and loops that would break the output's row or column stride. Loops of extent 1
    take no part anywhere; an empty group has extent 1.
    """

    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    a: str
    b: str
    c: str
    batch: tuple[str, ...] = ()
    shared_n: bool = (
        False  # the columns also index A: A is loaded as vectors along them, not broadcast
    )


def group_extent(w: Workload, group: tuple[str, ...]) -> int:
    """Extent of a flattened loop group."""
    return math.prod(w.loop(n).extent for n in group)


def group_stride(w: Workload, t: TensorAccessInfo, group: tuple[str, ...]) -> int | None:
    """Element stride of ``t`` along the flattened group, or None where the group is not one stride
    (e.g. a convolution window: stepping ``s`` past its end jumps a whole input row)."""
    if not group:
        return 0
    inner = t.stride(group[-1])
    for outer, nxt in zip(group[:-1], group[1:]):
        if t.stride(outer) != t.stride(nxt) * w.loop(nxt).extent:
            return None
    return inner


def _linear_run(
    w: Workload, out: TensorAccessInfo, loops: list[str], innermost: str | None
) -> tuple[str, ...]:
    """The longest chain of ``loops``, from ``innermost`` outwards, along which the output is one
    stride."""
    if innermost is None:
        candidates = sorted(loops, key=out.stride)
        if not candidates:
            return ()
        innermost = candidates[0]
    chain = [innermost]
    rest = [n for n in loops if n != innermost]
    while True:
        need = out.stride(chain[0]) * w.loop(chain[0]).extent
        nxt = next((n for n in rest if out.stride(n) == need), None)
        if nxt is None:
            return tuple(chain)
        chain.insert(0, nxt)
        rest.remove(nxt)


def find_roles(w: Workload, info: AccessInfo) -> Roles:
    """GEMM roles from the accesses; unsupported structures get a clear error."""
    if len(w.statement.inputs) != 2:
        raise UnsupportedWorkloadError(f"{w.op}: the CPU schedule handles two-input contractions")
    in0, in1 = (info.tensor(a.tensor) for a in w.statement.inputs)
    out = info.tensor(w.statement.output.tensor)
    live = [lp for lp in w.loops if lp.extent > 1]
    for lp in live:
        if lp.kind == "reduction" and (
            lp.name in in0.invariant_loops or lp.name in in1.invariant_loops
        ):
            raise UnsupportedWorkloadError(
                f"{w.op}: reduction index {lp.name} appears in only one input; "
                "the CPU schedule handles contractions whose every reduction index is in both "
                "inputs (sum that input first)"
            )
    spatial = [lp.name for lp in live if lp.kind == "spatial"]
    batch = [n for n in spatial if n not in in0.invariant_loops and n not in in1.invariant_loops]
    only = {
        t.tensor: [n for n in spatial if n not in batch and n not in t.invariant_loops]
        for t in (in0, in1)
    }
    # B holds the loop along which the output is contiguous (the vector axis of the micro-kernel)
    last = w.statement.output.indices[-1].terms if w.statement.output.indices else ()
    contiguous = [n for n in spatial if n not in batch and out.stride(n) == 1 and (n, 1) in last]
    order = [lp.name for lp in w.loops]
    k_group = tuple(lp.name for lp in live if lp.kind == "reduction")
    shared = [n for n in batch if out.stride(n) == 1 and (n, 1) in last]
    if not contiguous and shared:
        # The output's contiguous loop indexes every tensor (a depthwise convolution's channels):
        # the columns are that loop, element-wise in both inputs. A is the input with loops of its
        # own, read as vectors along the columns, so it needs unit stride there.
        a_t = in0 if only[in0.tensor] or not only[in1.tensor] else in1
        b_t = in1 if a_t is in0 else in0
        if a_t.stride(shared[0]) == 1:
            m_group = _linear_run(w, out, only[a_t.tensor], None)
            rest = [
                n
                for n in batch + only[a_t.tensor] + only[b_t.tensor]
                if n != shared[0] and n not in m_group
            ]
            return Roles(
                m_group,
                (shared[0],),
                k_group,
                a_t.tensor,
                b_t.tensor,
                out.tensor,
                tuple(sorted(rest, key=order.index)),
                shared_n=True,
            )
    if contiguous:
        b_t = in0 if contiguous[0] in only[in0.tensor] else in1
    else:  # no column loop (N = 1): B is the input with no loops of its own, if there is one
        b_t = in1 if only[in1.tensor] == [] or only[in0.tensor] else in0
    a_t = in1 if b_t is in0 else in0
    n_group = _linear_run(w, out, only[b_t.tensor], contiguous[0]) if contiguous else ()
    m_group = _linear_run(w, out, only[a_t.tensor], None)
    batch += [
        n for n in only[a_t.tensor] + only[b_t.tensor] if n not in m_group and n not in n_group
    ]
    return Roles(
        m_group,
        n_group,
        k_group,
        a_t.tensor,
        b_t.tensor,
        out.tensor,
        tuple(sorted(batch, key=order.index)),
    )


def must_pack_because(
    w: Workload,
    info: AccessInfo,
    tensor: str,
    rows: tuple[str, ...],
    k: tuple[str, ...],
    vector_axis: bool,
) -> str | None:
    """Why the micro-kernel cannot read ``tensor`` in place, or None when it can: that needs one
    stride per group, no reads outside its bounds and, for the vector operand, unit stride along
    its columns."""
    t = info.tensor(tensor)
    row_stride = group_stride(w, t, rows)
    if t.reads_outside:
        return "reads outside its bounds (zero padding)"
    if row_stride is None or group_stride(w, t, k) is None:
        return "is not one stride along its rows or the reduction"
    if vector_axis and row_stride != 1 and group_extent(w, rows) > 1:
        return "is not contiguous along the vector axis"
    return None


@dataclass
class CpuSpace(Space):
    """A Space plus what codegen and the model need to read its configs."""

    workload: Workload | None = None
    hw: HwSpec | None = None
    info: AccessInfo | None = None
    roles: Roles | None = None
    # a sample's draws then cost a Python check, not a solve, where one decision moves alone: that
    # was half a default search's time, now spent on twice the estimates (README, stop 112)
    sample_by_replacement = True

    def landmarks(self, cfg: Config) -> dict[str, tuple[int, ...]]:
        """The cache blocks mc and nc that cut a thread's share of their loop into equal blocks,
        near ``cfg``'s number of blocks: any other block leaves a short last block that pays a
        block's packing and sweeps for little work, and a search that walks the domain by a
        spread seldom lands on them."""
        if self.workload is None or self.roles is None:
            return {}
        par = self.var("par").label(cfg["par"])
        found = {}
        for block, group, unit in (("mc", self.roles.m, "mr"), ("nc", self.roles.n, "nr")):
            share = group_extent(self.workload, group)
            if par == block[0]:  # the parallel loop: a thread's share, as thread_ranges cuts it
                share = -(-share // (cfg[unit] * cfg["threads"])) * cfg[unit]
            found[block] = even_blocks(share, cfg[unit], cfg[block])
        return found


# Entries of the constant offset tables a gathered operand is read through (codegen emits them
# into the kernel: 2^20 entries already take ~12 s to compile).
MAX_TABLE_ENTRIES = 1 << 22


def check_offset_tables(w: Workload, info: AccessInfo, r: Roles) -> None:
    """Refuse, before any table is built, a gathered operand whose offset tables (one entry per
    row and per reduction index, and the same again per bounds-checked dimension) would not fit."""
    for tensor, rows, vector_axis, shared in (
        (r.a, r.m, False, r.shared_n),
        (r.b, r.n, True, False),
    ):
        if not shared and must_pack_because(w, info, tensor, rows, r.k, vector_axis) is None:
            continue
        t = info.tensor(tensor)
        guarded = sum(1 for below, above in t.halo if below or above)
        entries = (group_extent(w, rows) + group_extent(w, r.k)) * (1 + guarded)
        if entries > MAX_TABLE_ENTRIES:
            raise UnsupportedWorkloadError(
                f"{w.op}: reading {tensor} through offset tables would need {entries} entries "
                f"(at most {MAX_TABLE_ENTRIES}): {group_extent(w, rows)} rows x "
                f"{group_extent(w, r.k)} reduction steps; split the batch or the image into "
                "smaller calls, or use less padding"
            )


def footprint_expr(info: AccessInfo, tensors: tuple[str, ...], tile_vars: dict[str, Expr]) -> Expr:
    """Bytes touched by a tile whose size per loop is ``tile_vars``, from isl's extents."""
    terms: list[Expr] = []
    for name in tensors:
        t = info.tensor(name)
        factors: list[Expr] = [Const(t.itemsize)]
        for ext in t.extents:
            parts: list[Expr] = [
                Prod((Const(c), tile_vars[loop])) if c != 1 else tile_vars[loop]
                for loop, c in ext.terms
            ]
            if ext.const:
                parts.append(Const(ext.const))
            if len(parts) == 1 and parts[0] == Const(1):
                continue  # a loop held at one value (a batch index) adds no factor
            factors.append(parts[0] if len(parts) == 1 else Sum(tuple(parts)))
        terms.append(Prod(tuple(factors)))
    return Sum(tuple(terms)) if len(terms) > 1 else terms[0]


def _group_label(group: tuple[str, ...], role: str) -> str:
    """The loops a role (the GEMM's m, n or k) stands for; a role with none (every index of it of
    extent 1) by its GEMM name."""
    return (
        "(" + ", ".join(group) + ")"
        if len(group) > 1
        else (group[0] if group else f"{role} (extent 1)")
    )


def even_blocks(extent: int, unit: int, now: int, reach: int = 2) -> tuple[int, ...]:
    """For b = 1 and each b within ``reach`` of the blocks a block of ``now`` cuts ``extent``
    into, the smallest block (a multiple of ``unit``) that cuts it into b blocks or fewer: the one
    whose last block is the least short."""
    units = -(-extent // unit)
    count = -(-units // max(1, now // unit))
    counts = {1} | set(range(max(1, count - reach), min(units, count + reach) + 1))
    return tuple(sorted({-(-units // b) * unit for b in counts}))


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def build_cpu_space(w: Workload, hw: HwSpec, info: AccessInfo | None = None) -> CpuSpace:
    """Decision variables and constraints for ``w`` on CPU target ``hw``."""
    info = info or analyze(w)
    r = find_roles(w, info)
    M, N, K = (group_extent(w, g) for g in (r.m, r.n, r.k))
    check_offset_tables(w, info, r)
    # Footprints are those of the GEMM the micro-kernel sees: packed panels, or the operand itself
    # where it is read in place (then its groups are single strides, so the view is exact).
    # An A shared along the columns is a vector per (row, k): its tile is mr x kc x nr.
    view = analyze(
        einsum(
            "mkn,kn->mn" if r.shared_n else "mk,kn->mn",
            {"m": M, "n": N, "k": K},
            names=(r.a, r.b, r.c),
        )
    )
    vw, regs = hw.vector_lanes_f32, hw.isa.vector_registers
    if regs < 3:
        raise UnsatisfiableError(
            f"target {hw.name} has {regs} vector register(s); a register tile needs at least 3 "
            f"(1 accumulator, 1 B vector, 1 A broadcast): fix isa.vector_registers in its spec"
        )
    mr_max = max(1, min(M, regs - 2))
    nr_vec_max = max(1, min(-(-N // vw), (regs - 1) // 2))
    kcs = sorted({kc for kc in KC_CANDIDATES if kc < K} | {min(K, KC_CANDIDATES[-1])})
    # A block may run past the extent to the next multiple of the register tile, so one block can
    # cover an extent that no tile divides (M=49 with mr=13: mc=52 reads B once, mc=39 twice).
    m_cap = min(M + mr_max - 1, MAX_BLOCK)
    n_cap = min(_round_up(N, vw) + (nr_vec_max - 1) * vw, MAX_BLOCK)
    variables = (
        DecisionVar(
            "mr",
            tuple(range(1, mr_max + 1)),
            f"register tile rows (along {_group_label(r.m, 'm')})",
        ),
        DecisionVar(
            "nr",
            tuple(vw * i for i in range(1, nr_vec_max + 1)),
            f"register tile columns (along {_group_label(r.n, 'n')}), a multiple of {vw} lanes",
        ),
        DecisionVar("kc", tuple(kcs), f"L1 block of the reduction {_group_label(r.k, 'k')}"),
        DecisionVar(
            "mc",
            tuple(range(1, m_cap + 1)),
            f"L2 block of {_group_label(r.m, 'm')}, a multiple of mr",
        ),
        DecisionVar(
            "nc",
            tuple(range(vw, n_cap + 1, vw)),
            f"L3 block of {_group_label(r.n, 'n')}, a multiple of nr",
        ),
        DecisionVar(
            "order", tuple(range(len(ORDERS))), "cache-block loop order, outer to inner", ORDERS
        ),
        DecisionVar("pack_a", (0, 1), f"copy {r.a} blocks into contiguous mr-row panels"),
        DecisionVar("pack_b", (0, 1), f"copy {r.b} blocks into contiguous nr-column panels"),
        DecisionVar(
            "unroll", UNROLLS, f"unroll factor of the micro-kernel's {_group_label(r.k, 'k')} loop"
        ),
        DecisionVar("par", tuple(range(len(PAR_LOOPS))), "loop split over the cores", PAR_LOOPS),
        DecisionVar("threads", tuple(range(1, hw.core.cores + 1)), "threads (one per core)"),
    )
    mr, nr, kc, mc, nc = (Var(x) for x in ("mr", "nr", "kc", "mc", "nc"))
    nr_vec = CeilDiv(nr, Const(vw))
    tile = {
        "L1": {"m": mr, "n": nr, "k": kc},
        "L2": {"m": mc, "n": nr, "k": kc},
        "L3": {"m": mc, "n": nc, "k": kc},
    }

    def budget(level: int) -> int:
        return int(hw.usable_bytes_per_core(level))

    ab = (r.a, r.b)
    abc = (r.a, r.b, r.c)
    constraints = [
        Constraint(
            "registers",
            Sum((Prod((mr, nr_vec)), nr_vec, Const(1))),
            "<=",
            Const(regs),
            f"accumulators mr*nr/{vw} + operand regs (nr/{vw} + 1) <= {regs} vector registers",
            "reduce mr or nr",
        ),
        Constraint(
            "vector alignment",
            nr,
            "divides",
            Const(vw),
            f"nr is a multiple of the vector width ({vw} lanes)",
            f"use nr in steps of {vw}",
        ),
        Constraint(
            "mc multiple of mr",
            mc,
            "divides",
            mr,
            "mc is a multiple of mr",
            "round mc to a multiple of mr",
        ),
        Constraint(
            "nc multiple of nr",
            nc,
            "divides",
            nr,
            "nc is a multiple of nr",
            "round nc to a multiple of nr",
        ),
        Constraint(
            "cover m",
            mc,
            "<=",
            Prod((CeilDiv(Const(M), mr), mr)),
            f"mc <= {M} rounded up to mr",
            "reduce mc",
        ),
        Constraint(
            "cover n",
            nc,
            "<=",
            Prod((CeilDiv(Const(N), nr), nr)),
            f"nc <= {N} rounded up to nr",
            "reduce nc",
        ),
        Constraint(
            "L1 footprint",
            footprint_expr(view, ab, tile["L1"]),
            "<=",
            Const(budget(1)),
            f"L1 footprint(mr, nr, kc) = {footprint_expr(view, ab, tile['L1'])} B <= "
            f"{hw.cache(1).usable_fraction:g} * "
            f"{hw.cache(1).size_kib // hw.cache(1).shared_by_cores} KiB",
            "reduce kc, mr or nr",
        ),
        Constraint(
            "L2 footprint",
            footprint_expr(view, abc, tile["L2"]),
            "<=",
            Const(budget(2)),
            f"L2 footprint(mc, nr, kc) = {footprint_expr(view, abc, tile['L2'])} B <= "
            f"{hw.cache(2).usable_fraction:g} * {hw.cache_bytes_per_core(2) / 1024:g} KiB",
            "reduce mc or kc",
        ),
        Constraint("unroll within kc", Var("unroll"), "<=", kc, "unroll <= kc", "reduce unroll"),
        Constraint(
            "parallel chunks m",
            CeilDiv(Const(M), mr),
            ">=",
            Var("threads"),
            f"ceil({M}/mr) row panels >= threads",
            "use fewer threads or a smaller mr, or par=n",
            when=("par", 0),
        ),
        Constraint(
            "parallel chunks n",
            CeilDiv(Const(N), nr),
            ">=",
            Var("threads"),
            f"ceil({N}/nr) column panels >= threads",
            "use fewer threads or a smaller nr, or par=m",
            when=("par", 1),
        ),
    ]
    if len(hw.caches) >= 3:
        constraints.append(
            Constraint(
                "L3 footprint",
                footprint_expr(view, abc, tile["L3"]),
                "<=",
                Const(budget(3)),
                f"L3 footprint(mc, nc, kc) = {footprint_expr(view, abc, tile['L3'])} B <= "
                f"{hw.cache(3).usable_fraction:g} * "
                f"{hw.cache_bytes_per_core(3) / 1024:g} KiB per core",
                "reduce nc, mc or kc",
            )
        )
    for flag, tensor, rows, vector_axis in (
        ("pack_a", r.a, r.m, False),
        ("pack_b", r.b, r.n, True),
    ):
        if flag == "pack_a" and r.shared_n:
            constraints.append(
                Constraint(
                    f"{tensor} is read in place",
                    Var(flag),
                    "==",
                    Const(0),
                    f"pack_a = 0 ({tensor} shares the column loop {r.n[0]}: the micro-kernel "
                    f"loads it as vectors through row and k offset tables)",
                    "set pack_a=0",
                )
            )
            continue
        why = must_pack_because(w, info, tensor, rows, r.k, vector_axis)
        if why is not None:
            constraints.append(
                Constraint(
                    f"{tensor} must be packed",
                    Var(flag),
                    "==",
                    Const(1),
                    f"{flag} = 1 ({tensor} {why}; packing gathers it into panels)",
                    f"set {flag}=1",
                )
            )
    padded = [t.tensor for t in info.tensors if not t.is_output and t.reads_outside]
    if padded:
        variables += (
            DecisionVar(
                "pad_copy",
                (0, 1),
                f"0: bounds checks while packing {padded[0]}; "
                f"1: copy it into a zero-padded buffer first",
            ),
        )
        if r.shared_n and padded[0] == r.a:
            constraints.append(
                Constraint(
                    f"{r.a} is read padded",
                    Var("pad_copy"),
                    "==",
                    Const(1),
                    f"pad_copy = 1 ({r.a} is read in place, which has no bounds checks, "
                    f"and reads outside its bounds)",
                    "set pad_copy=1",
                )
            )
    space = CpuSpace(
        f"{w.label()} on {hw.name}",
        variables,
        tuple(constraints),
        joint_moves=(("mr", "nr"),),
        workload=w,
        hw=hw,
        info=info,
        roles=r,
    )
    return space
