# ruff: noqa: E501  (the docstring's mapping table is one row per line)
"""The CP-SAT space of GPU (SIMT fp32) schedules for a two-input contraction: a tiled GEMM family
a GPU engineer recognises, CLBlast's Xgemm (also Kernel Tuner's and CLTune's GEMM) included.

Loop roles come from the access analysis exactly as on the CPU (``find_roles``): rows m, columns n,
reduction k, batch loops (one grid z index each); a convolution is an implicit GEMM whose operands
are read through their affine index maps, with bounds checks where the padding reaches outside.

One thread block computes a ``bm x bn`` tile of C, stepping through K ``bk`` at a time:

| decision | meaning | CLBlast Xgemm |
|---|---|---|
| bm, bn, bk | block tile in M, N, K | MWG, NWG, KWG |
| tx, ty | compute threads along M and N; each owns (bm/tx) x (bn/ty) outputs | MDIMC, NDIMC |
| vm, vn | a thread owns M (N) in runs of vm (vn) elements: register vectors, shared-memory load width, C store width where C is contiguous there | VWM, VWN |
| strm, strn | 0: a thread's runs are adjacent; 1: strided by tx*vm (ty*vn) | STRM, STRN |
| sa, sb | stage the A (B) tile in shared memory (1) or load it straight into registers (0) | SA, SB |
| la, lb | staging: threads along the operand's contiguous axis (the rest along the other) | MDIMA, NDIMB |
| va, vb | staging: elements per global load along the operand's contiguous axis | VWM, VWN |
| unroll | unroll of the loop over the bk step | KWI |
| pad_a, pad_b | elements added to each shared-memory row (bank conflicts) | 0 |
| ahead | the k loop reads its non-staged operands one k step ahead of their FMAs (registers for the next step's values, latency hidden behind a step's work) | - (nvcc schedules CLBlast's loads) |

Decisions that mean nothing for a config take one canonical value (la = va = 1 and pad_a = 0
when A is not staged), so two configs of the space are always two different kernels.
The mapping of every Xgemm parameter is written down in ``constraints/xgemm.py`` and tested on
every measured configuration in ``shared/data/kernel-tuner``.

Roadmap: double buffering (a stages decision: the shared-memory sum already has the form
``stages x buffers``), warp tiles, split-K for skinny shapes, tensor cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aotune.analysis.polyhedral import AccessInfo, analyze
from aotune.analysis.workload import Workload
from aotune.constraints.cpu import Roles, find_roles, group_extent, group_stride
from aotune.constraints.expr import CeilDiv, Const, Expr, Prod, Sum, Var
from aotune.constraints.space import Constraint, DecisionVar, Space
from aotune.errors import HardwareLimitError, UnsupportedWorkloadError
from aotune.hwspecs.gpu_spec import GpuSpec

VECTOR_WIDTHS = (1, 2, 4, 8)
UNROLLS = (1, 2, 4, 8)
PADS = (0, 1, 2, 4)
MAX_BLOCK_EDGE = 256
MAX_BK = 64
# Registers are not a validity limit: ptxas fits any thread tile into the registers a launch of
# the block allows (the kernel declares its thread count) by spilling the rest to local memory, and
# such kernels run (Kernel Tuner's measured Xgemm space holds 16 x 16 thread tiles). The bound
# below keeps the search away from tiles that could never avoid spilling; the model charges
# estimated spills in tier 1 and ptxas's in tier 2.
MAX_THREAD_TILE = 256


def _pow2_upto(n: int) -> tuple[int, ...]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return tuple(out)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class GemmView:
    """The GEMM a workload is on the GPU: extents, loop groups and each operand's contiguous
    axis (the one its staging threads run along)."""

    M: int
    N: int
    K: int
    batch: int
    a_major: str  # "m" or "k": A's unit-stride GEMM axis ("k" if neither is)
    b_major: str  # "n" or "k"
    c_major: str  # "m" or "n"


def gemm_view(w: Workload, info: AccessInfo, r: Roles) -> GemmView:
    """Extents and contiguous axes of ``w``'s GEMM."""
    a, b, c = info.tensor(r.a), info.tensor(r.b), info.tensor(r.c)

    def unit(t, group: tuple[str, ...]) -> bool:
        return group_extent(w, group) > 1 and group_stride(w, t, group) == 1

    return GemmView(
        M=group_extent(w, r.m),
        N=group_extent(w, r.n),
        K=group_extent(w, r.k),
        batch=group_extent(w, r.batch),
        a_major="m" if unit(a, r.m) else "k",
        b_major="n" if unit(b, r.n) else "k",
        c_major="m" if unit(c, r.m) else "n",
    )


@dataclass
class GpuSpace(Space):
    """A Space plus what the GPU schedule and model need to read its configs."""

    # every GA search starts from SEED_DRAW x population samples: most of their steps are one
    # decision changed that breaks nothing, which a Python check settles without a CP-SAT solve
    sample_by_replacement = True
    # A GA search solves this small model (19 decisions with domains of 2-9 values) a few thousand
    # times, each a feasibility question or a "fewest changes" repair. Presolve, the LP relaxation,
    # probing and symmetry detection cost more than the search they would shorten (5-7x per solve
    # here; the repairs reach the same optimum), so the search's solves go without them.
    search_solver_parameters = {
        "cp_model_presolve": False,
        "linearization_level": 0,
        "cp_model_probing_level": 0,
        "symmetry_level": 0,
    }

    workload: Workload | None = None
    hw: GpuSpec | None = None
    info: AccessInfo | None = None
    roles: Roles | None = None
    view: GemmView | None = None


def _threads() -> Expr:
    return Prod((Var("tx"), Var("ty")))


def check_device_memory(w: Workload, hw: GpuSpec) -> None:
    """Refuse a workload whose tensors alone do not fit in the GPU's memory: every kernel reads its
    inputs from and writes its output to device memory, with no tiling across launches."""
    need = sum(math.prod(t.shape) * t.itemsize for t in w.tensors)
    have = hw.memory.dram_gib * 2**30
    if need > have:
        sizes = ", ".join(
            f"{t.name} {math.prod(t.shape) * t.itemsize / 2**30:.3g}" for t in w.tensors
        )
        raise HardwareLimitError(
            f"{w.op} {'x'.join(str(v) for _, v in w.shape)}: its tensors in the device memory of "
            f"{hw.name}, in GiB ({sizes})",
            math.ceil(need / 2**30 * 100) / 100,  # rounded up: never 'requires' the limit
            hw.memory.dram_gib,
            "use a smaller shape (or split a batch over several calls), or a GPU with more "
            "memory (memory.dram_gib in its spec)",
        )


def build_gpu_space(w: Workload, hw: GpuSpec, info: AccessInfo | None = None) -> GpuSpace:
    """Decision variables and constraints for ``w`` on GPU target ``hw``."""
    info = info or analyze(w)
    r = find_roles(w, info)
    v = gemm_view(w, info, r)
    if v.batch > hw.limits.max_grid_yz:
        raise UnsupportedWorkloadError(
            f"{w.op}: {v.batch} independent GEMMs exceed the grid's z limit "
            f"({hw.limits.max_grid_yz}) on {hw.name}; split the batch into smaller calls"
        )
    check_device_memory(w, hw)
    warp = hw.compute.warp_size
    max_t = hw.limits.max_threads_per_block
    sector_elems = hw.memory.sector_bytes // 4

    def edge_domain(extent: int, cap: int) -> tuple[int, ...]:
        return _pow2_upto(min(cap, max(warp, _next_pow2(extent))))

    variables = (
        DecisionVar("bm", edge_domain(v.M, MAX_BLOCK_EDGE), "block tile rows (M)"),
        DecisionVar("bn", edge_domain(v.N, MAX_BLOCK_EDGE), "block tile columns (N)"),
        DecisionVar("bk", _pow2_upto(min(MAX_BK, _next_pow2(v.K))), "reduction step of a block"),
        DecisionVar("tx", _pow2_upto(max_t), "compute threads along M"),
        DecisionVar("ty", _pow2_upto(max_t), "compute threads along N"),
        DecisionVar("vm", VECTOR_WIDTHS, "a thread's run of rows: register vector width in M"),
        DecisionVar("vn", VECTOR_WIDTHS, "a thread's run of columns: register vector width in N"),
        DecisionVar("strm", (0, 1), "0: a thread's M runs are adjacent; 1: strided by tx*vm"),
        DecisionVar("strn", (0, 1), "0: a thread's N runs are adjacent; 1: strided by ty*vn"),
        DecisionVar("sa", (0, 1), "stage the A tile in shared memory"),
        DecisionVar("sb", (0, 1), "stage the B tile in shared memory"),
        DecisionVar("la", _pow2_upto(max_t), f"staging threads along A's {v.a_major} axis"),
        DecisionVar("lb", _pow2_upto(max_t), f"staging threads along B's {v.b_major} axis"),
        DecisionVar("va", VECTOR_WIDTHS, f"staging: A elements per global load along {v.a_major}"),
        DecisionVar("vb", VECTOR_WIDTHS, f"staging: B elements per global load along {v.b_major}"),
        DecisionVar("unroll", UNROLLS, "unroll of the loop over the bk step"),
        DecisionVar("pad_a", PADS, "elements added to each shared-memory row of A"),
        DecisionVar("pad_b", PADS, "elements added to each shared-memory row of B"),
        DecisionVar(
            "ahead",
            (0, 1),
            "read the operands not staged a k step ahead of their FMAs",
            default=0,  # the kernels of configs written before this decision existed
        ),
    )
    bm, bn, bk, tx, ty = (Var(x) for x in ("bm", "bn", "bk", "tx", "ty"))
    vm, vn, la, lb, va, vb = (Var(x) for x in ("vm", "vn", "la", "lb", "va", "vb"))
    sa, sb, pad_a, pad_b = Var("sa"), Var("sb"), Var("pad_a"), Var("pad_b")
    threads = _threads()
    mwi, nwi = CeilDiv(bm, tx), CeilDiv(bn, ty)
    sh = hw.shared
    smem = Sum(
        (
            Prod((Const(4), sa, bk, Sum((bm, pad_a)))),
            Prod((Const(4), sb, bk, Sum((bn, pad_b)))),
            Const(sh.reserved_per_block),
        )
    )
    # limits that cannot bind on this target (threads/SM above threads/block, ...) are left out of
    # the CP-SAT model: every GA child is a solve of it
    binding = {
        "threads/SM": hw.limits.max_threads_per_sm < max_t,
        "warps/SM": hw.limits.max_warps_per_sm < -(-max_t // warp),
    }
    # blocks along M (grid x) and N (grid y), each at most its grid limit where that can bind
    grids = (("grid x", "M", v.M, bm, "bm", hw.limits.max_grid_x),
             ("grid y", "N", v.N, bn, "bn", hw.limits.max_grid_yz))  # fmt: skip
    binding |= {name: extent > limit for name, _, extent, _, _, limit in grids}
    constraints = [
        Constraint(
            "whole warps",
            threads,
            "divides",
            Const(warp),
            f"threads/block tx*ty is a multiple of the warp ({warp})",
            "change tx or ty",
        ),
        Constraint(
            "threads/block",
            threads,
            "<=",
            Const(max_t),
            f"threads/block tx*ty <= {max_t}",
            "reduce tx or ty",
        ),
        Constraint(
            "threads/SM",
            threads,
            "<=",
            Const(hw.limits.max_threads_per_sm),
            f"threads/block tx*ty <= {hw.limits.max_threads_per_sm} threads per SM",
            "reduce tx or ty",
        ),
        Constraint(
            "warps/SM",
            CeilDiv(threads, Const(warp)),
            "<=",
            Const(hw.limits.max_warps_per_sm),
            f"warps/block tx*ty/{warp} <= {hw.limits.max_warps_per_sm} warps per SM",
            "reduce tx or ty",
        ),
        Constraint(
            "thread tile M",
            bm,
            "divides",
            Prod((tx, vm)),
            "bm is a multiple of tx*vm (each thread owns whole runs of vm rows)",
            "change bm, tx or vm",
        ),
        Constraint(
            "thread tile N",
            bn,
            "divides",
            Prod((ty, vn)),
            "bn is a multiple of ty*vn (each thread owns whole runs of vn columns)",
            "change bn, ty or vn",
        ),
        Constraint("unroll", bk, "divides", Var("unroll"), "unroll divides bk", "change unroll"),
        Constraint(
            "thread tile size",
            Prod((mwi, nwi)),
            "<=",
            Const(MAX_THREAD_TILE),
            f"outputs per thread (bm/tx)*(bn/ty) <= {MAX_THREAD_TILE}: the search's bound (a "
            f"thread has at most {hw.limits.max_registers_per_thread} registers; past that ptxas "
            f"spills, which the model charges and tier 2 reads from ptxas)",
            "reduce bm/tx or bn/ty",
        ),
        Constraint(
            "shared memory/block",
            smem,
            "<=",
            Const(sh.bytes_per_block_optin),
            f"shared memory/block 4*(sa*bk*(bm+pad_a) + sb*bk*(bn+pad_b)) + "
            f"{sh.reserved_per_block} reserved <= {sh.bytes_per_block_optin} B (opt-in maximum; "
            f"{sh.bytes_per_block} without opt-in)",
            "reduce bk, bm or bn, or stage fewer operands",
        ),
        *(
            Constraint(
                name,
                CeilDiv(Const(extent), tile),
                "<=",
                Const(limit),
                f"blocks along {axis} ceil({extent}/{tile_name}) <= {limit}",
                f"increase {tile_name}",
            )
            for name, axis, extent, tile, tile_name, limit in grids
        ),
    ]
    constraints = [c for c in constraints if binding.get(c.name, True)]
    # Roller's alignment: a tile edge along a contiguous global axis is whole 32-byte sectors
    for axis, tile, extent in (("m", bm, v.M), ("n", bn, v.N), ("k", bk, v.K)):
        contiguous = {v.a_major, v.b_major, v.c_major}
        if axis in contiguous and extent >= sector_elems:
            constraints.append(
                Constraint(
                    f"sector alignment {axis}",
                    tile,
                    "divides",
                    Const(sector_elems),
                    f"b{axis} is whole {hw.memory.sector_bytes}-byte sectors "
                    f"({sector_elems} fp32) along the contiguous axis {axis}",
                    f"use b{axis} in multiples of {sector_elems}",
                )
            )
    for op, flag, lthreads, lvec, pad, major, row_tile in (
        ("A", "sa", la, va, pad_a, v.a_major, bm),
        ("B", "sb", lb, vb, pad_b, v.b_major, bn),
    ):
        major_tile, other_tile = (bk, row_tile) if major == "k" else (row_tile, bk)
        ln, vname = str(lthreads), str(lvec)
        constraints += [
            Constraint(
                f"{op} staging threads",
                threads,
                "divides",
                lthreads,
                f"{ln} divides the block's threads tx*ty",
                f"change {ln}",
                when=(flag, 1),
            ),
            Constraint(
                f"{op} staging along {major}",
                major_tile,
                "divides",
                Prod((lthreads, lvec)),
                f"the tile's {major} edge is a multiple of {ln}*{vname}",
                f"change {ln} or {vname}",
                when=(flag, 1),
            ),
            Constraint(
                f"{op} staging across",
                other_tile,
                "divides",
                CeilDiv(threads, lthreads),
                f"the tile's other edge is a multiple of tx*ty/{ln}",
                f"change {ln}",
                when=(flag, 1),
            ),
        ]
        for name in (ln, vname, str(pad)):
            constraints.append(
                Constraint(
                    f"{name} unused",
                    Var(name),
                    "==",
                    Const(0 if name.startswith("pad") else 1),
                    f"{name} = {0 if name.startswith('pad') else 1} when {op} is not staged "
                    f"({flag}=0): one kernel, one config",
                    f"set {name}={0 if name.startswith('pad') else 1}",
                    when=(flag, 0),
                )
            )
    # reading ahead needs an operand the k loop reads from global memory itself
    ahead_unused = (Var("ahead"), sa, sb) if not r.shared_n else (Var("ahead"), sb)
    constraints.append(
        Constraint(
            "ahead unused",
            Prod(ahead_unused),
            "==",
            Const(0),
            "ahead = 0 when the k loop reads no operand from global memory itself ("
            + (f"sb=1, {r.a} being read per output" if r.shared_n else "sa=1 and sb=1")
            + "): one kernel, one config",
            "set ahead=0",
        )
    )
    if r.shared_n:
        constraints.append(
            Constraint(
                f"{r.a} is read in place",
                sa,
                "==",
                Const(0),
                f"sa = 0 ({r.a} is indexed by the columns {r.n[0]} too: each thread reads it per "
                f"row, tap and column)",
                "set sa=0",
            )
        )
    return GpuSpace(
        f"{w.label()} on {hw.name}",
        variables,
        tuple(constraints),
        joint_moves=(("tx", "ty"), ("bm", "bn")),
        workload=w,
        hw=hw,
        info=info,
        roles=r,
        view=v,
    )
