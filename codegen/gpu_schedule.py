"""Config -> GpuSchedule: everything the GPU kernel emitter needs, all sizes known.

A GPU schedule is the GEMM view of the workload (extents and loop groups of m, n, k and the batch,
from the same roles as the CPU), one ``OperandAccess`` per tensor (its affine index map, so any
einsum layout and a convolution's window read the same way), and the config's decisions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from aotune.analysis.polyhedral import TensorAccessInfo
from aotune.analysis.workload import ConvParams, Workload
from aotune.constraints.gpu import GpuSpace
from aotune.constraints.space import Config
from aotune.errors import ConfigError

Group = tuple[tuple[str, int], ...]  # (loop, extent), outer to inner


@dataclass(frozen=True)
class OperandAccess:
    """How one tensor is addressed: ``tensor[sum(coeff * loop) + offset]`` per dimension."""

    tensor: str
    shape: tuple[int, ...]
    coefficients: tuple[tuple[tuple[str, int], ...], ...]  # per dim: (loop, coeff)
    offsets: tuple[int, ...]
    guarded: tuple[int, ...]  # dims whose index can leave [0, shape[d]): zeros there

    @functools.cached_property
    def row_strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each dim (row-major)."""
        return tuple(math.prod(self.shape[d + 1 :]) for d in range(len(self.shape)))

    @functools.cached_property
    def _flat_coefficients(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for cf, st in zip(self.coefficients, self.row_strides):
            for loop, c in cf:
                out[loop] = out.get(loop, 0) + c * st
        return out

    def flat_coefficient(self, loop: str) -> int:
        """Elements the flat address moves per step of ``loop``."""
        return self._flat_coefficients.get(loop, 0)

    @functools.cached_property
    def flat_offset(self) -> int:
        """The flat address of the all-zero iteration."""
        return sum(o * st for o, st in zip(self.offsets, self.row_strides))

    def dim_loops(self, d: int) -> frozenset[str]:
        """Loops that move dim ``d``'s index."""
        return frozenset(n for n, _ in self.coefficients[d])

    def unit_stride(self, group: Group) -> bool:
        """Whether consecutive flat indices of ``group`` are consecutive elements."""
        if not group:
            return False
        expect = 1
        for name, extent in reversed(group):
            if self.flat_coefficient(name) != expect:
                return False
            expect *= extent
        return True

    def vector_ok(self, group: Group, width: int, others: tuple[str, ...]) -> bool:
        """Whether ``width`` consecutive indices of ``group`` (starting at a multiple of width)
        are always one aligned, in-bounds-together vector: unit stride along the group, an extent
        that is a multiple of width, every other address term a multiple of width, and no bounds
        check on a dimension the group moves."""
        if width == 1:
            return True
        if not self.unit_stride(group) or math.prod(e for _, e in group) % width:
            return False
        if self.flat_offset % width or any(self.flat_coefficient(n) % width for n in others):
            return False
        names = {n for n, _ in group}
        return not any(self.dim_loops(d) & names for d in self.guarded)


def operand_access(w: Workload, t: TensorAccessInfo) -> OperandAccess:
    """The OperandAccess of one analysed tensor."""
    return OperandAccess(
        t.tensor,
        w.tensor(t.tensor).shape,
        t.coefficients,
        t.offsets,
        tuple(d for d, (lo, hi) in enumerate(t.halo) if lo or hi),
    )


@dataclass(frozen=True)
class GpuSchedule:
    """A tiled GEMM kernel for one GPU: the GEMM view plus the config's decisions."""

    M: int
    N: int
    K: int
    m_loops: Group
    n_loops: Group
    k_loops: Group
    batch_loops: Group
    a: OperandAccess
    b: OperandAccess
    c: OperandAccess
    a_major: str
    b_major: str
    c_major: str
    bm: int
    bn: int
    bk: int
    tx: int
    ty: int
    vm: int
    vn: int
    strm: int
    strn: int
    sa: int
    sb: int
    la: int
    lb: int
    va: int
    vb: int
    unroll: int
    pad_a: int
    pad_b: int
    shared_n: bool = False  # A is indexed by the columns too (NHWC depthwise)
    # the k loop issues its direct global reads one k step ahead of their FMAs (``ahead``)
    reads_ahead: bool = False
    bias: bool = False
    activation: str = "none"
    # for the numpy reference (the same fields as a CpuSchedule's)
    reference: str = ""
    conv: ConvParams | None = None
    a_is_first: bool = True
    shapes: tuple[tuple[int, ...], ...] = ()  # A, B, C tensor shapes as the kernel takes them

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.tx * self.ty

    @property
    def mwi(self) -> int:
        """Rows a thread owns."""
        return self.bm // self.tx

    @property
    def nwi(self) -> int:
        """Columns a thread owns."""
        return self.bn // self.ty

    @property
    def batch(self) -> int:
        """Independent GEMMs (grid z)."""
        return math.prod(e for _, e in self.batch_loops)

    @property
    def grid(self) -> tuple[int, int, int]:
        """Blocks along M, N and the batch."""
        return (-(-self.M // self.bm), -(-self.N // self.bn), self.batch)

    @property
    def k_tiles(self) -> int:
        """Steps of bk along K."""
        return -(-self.K // self.bk)

    @property
    def smem_a_elems(self) -> int:
        """fp32 elements of A's shared-memory tile (0 when A is not staged)."""
        return self.bk * (self.bm + self.pad_a) if self.sa else 0

    @property
    def smem_b_elems(self) -> int:
        """fp32 elements of B's shared-memory tile."""
        return self.bk * (self.bn + self.pad_b) if self.sb else 0

    @property
    def smem_bytes(self) -> int:
        """The kernel's shared memory (without the runtime's per-block reserve)."""
        return 4 * (self.smem_a_elems + self.smem_b_elems)

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two operations."""
        return 2 * self.M * self.N * self.K * self.batch

    @property
    def has_epilogue(self) -> bool:
        """Whether the store of C carries fused element-wise work."""
        return self.bias or self.activation != "none"


def schedule_from_config(space: GpuSpace, cfg: Config) -> GpuSchedule:
    """Lower a valid config of ``space`` to a schedule (invalid configs are refused, with
    reasons)."""
    bad = space.violations(cfg)
    if bad:
        raise ConfigError(f"config is not valid for {space.title}: " + "; ".join(map(str, bad)))
    w, r, info, v = space.workload, space.roles, space.info, space.view
    assert w is not None and r is not None and info is not None and v is not None
    c = cfg.as_dict()

    def group(names: tuple[str, ...]) -> Group:
        return tuple((n, w.loop(n).extent) for n in names)

    ref = ""
    if w.conv is None:
        ins, out = w.einsum_spec().split("->")
        first, second = ins.split(",")
        if w.statement.inputs[0].tensor != r.a:
            first, second = second, first
        ref = f"{first},{second}->{out}"
    return GpuSchedule(
        M=v.M,
        N=v.N,
        K=v.K,
        m_loops=group(r.m),
        n_loops=group(r.n),
        k_loops=group(r.k),
        batch_loops=group(r.batch),
        a=operand_access(w, info.tensor(r.a)),
        b=operand_access(w, info.tensor(r.b)),
        c=operand_access(w, info.tensor(r.c)),
        a_major=v.a_major,
        b_major=v.b_major,
        c_major=v.c_major,
        shared_n=r.shared_n,
        bias=w.epilogue.bias,
        activation=w.epilogue.activation,
        reference=ref,
        conv=w.conv,
        a_is_first=w.statement.inputs[0].tensor == r.a,
        shapes=tuple(w.tensor(t).shape for t in (r.a, r.b, r.c)),
        **{k: c[k] for k in ("bm", "bn", "bk", "tx", "ty", "vm", "vn", "strm", "strn")},
        **{k: c[k] for k in ("sa", "sb", "la", "lb", "va", "vb", "unroll", "pad_a", "pad_b")},
        reads_ahead=bool(c["ahead"]),
    )
