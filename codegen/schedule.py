"""Config -> Schedule: the concrete loop structure codegen emits (all sizes and strides known).

A schedule is a short list of frozen decisions plus the facts of the workload it was made for, so
code generation needs nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotune.analysis.workload import Workload
from aotune.constraints.cpu import ORDERS, PAR_LOOPS, CpuSpace
from aotune.constraints.space import Config
from aotune.errors import ConfigError


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
    batch: tuple[tuple[int, int, int, int], ...] = ()  # per batch loop: (extent, A, B, C element strides)
    shapes: tuple[tuple[int, ...], ...] = ()  # A, B, C tensor shapes (row-major), as the kernel expects them
    reference: str = "mk,kn->mn"  # the contraction as an einsum over (A, B) -> C, for numpy checks
    bias: bool = False  # epilogue: add bias[n] to the finished output tile
    activation: str = "none"  # epilogue: then apply this activation

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
    def has_epilogue(self) -> bool:
        """Whether the output tile's final store carries fused element-wise work."""
        return self.bias or self.activation != "none"

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
        return [(bounds[t] * unit, min(extent, bounds[t + 1] * unit)) for t in range(self.threads)
                if bounds[t + 1] > bounds[t]]


def schedule_from_config(space: CpuSpace, cfg: Config) -> CpuSchedule:
    """Lower a valid config of ``space`` to a schedule (invalid configs are refused, with reasons)."""
    bad = space.violations(cfg)
    if bad:
        raise ConfigError(f"config is not valid for {space.title}: " + "; ".join(map(str, bad)))
    w, r, info, hw = space.workload, space.roles, space.info, space.hw
    assert w is not None and r is not None and info is not None and hw is not None
    c = cfg.as_dict()
    a, b, out = info.tensor(r.a), info.tensor(r.b), info.tensor(r.c)
    return CpuSchedule(
        M=w.loop(r.m).extent, N=w.loop(r.n).extent, K=w.loop(r.k).extent,
        mr=c["mr"], nr=c["nr"], kc=c["kc"], mc=c["mc"], nc=c["nc"], order=ORDERS[c["order"]],
        pack_a=bool(c["pack_a"]), pack_b=bool(c["pack_b"]), unroll=c["unroll"], par=PAR_LOOPS[c["par"]],
        threads=c["threads"], lanes=hw.vector_lanes_f32,
        a_sm=a.stride(r.m), a_sk=a.stride(r.k), b_sk=b.stride(r.k), b_sn=b.stride(r.n), c_sm=out.stride(r.m),
        shapes=tuple(w.tensor(t).shape for t in (r.a, r.b, r.c)), reference=_reference_spec(w, r.a),
        batch=tuple((w.loop(bl).extent, a.stride(bl), b.stride(bl), out.stride(bl)) for bl in r.batch),
        bias=w.epilogue.bias, activation=w.epilogue.activation,
    )


def _reference_spec(w: Workload, a_name: str) -> str:
    """The workload's einsum string with the inputs in (A, B) order."""
    ins, out = w.einsum_spec().split("->")
    first, second = ins.split(",")
    if w.statement.inputs[0].tensor != a_name:
        first, second = second, first
    return f"{first},{second}->{out}"
