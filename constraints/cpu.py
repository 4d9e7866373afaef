"""The CP-SAT space of CPU schedules for a two-input contraction (BLIS-style GEMM structure).

Loop roles come from the access analysis, not from the operator name: ``n`` is the spatial loop
along which the output is contiguous, ``m`` the other spatial loop, ``k`` the reduction. The
schedule is: three cache-block loops (mc, nc, kc) in one of a few orders, optional packing of each
input into contiguous panels, then an mr x nr register tile whose k loop is unrolled.

Batch loops (spatial loops that index every tensor) run outermost, one GEMM at a time.
Roadmap: several loops per role (conv windows) generalise ``Roles`` to loop groups; the
constraint table below already takes every footprint from isl.
"""
from __future__ import annotations

from dataclasses import dataclass

from aotune.analysis.polyhedral import AccessInfo, analyze
from aotune.analysis.workload import Workload
from aotune.constraints.expr import CeilDiv, Const, Expr, Prod, Sum, Var
from aotune.constraints.space import Constraint, DecisionVar, Space
from aotune.errors import UnsatisfiableError, UnsupportedWorkloadError
from aotune.hwspecs.spec import HwSpec

ORDERS = ("nkm", "mkn", "nmk")  # outer-to-inner cache-block loops; nkm is BLIS's jc, pc, ic
PAR_LOOPS = ("m", "n")
UNROLLS = (1, 2, 4, 8)
KC_CANDIDATES = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 768, 1024)
MAX_BLOCK = 4096  # cache blocks beyond this are never useful on today's caches


@dataclass(frozen=True)
class Roles:
    """Which workload loop plays m, n and k, and which tensor is A (has m), B (has n), C (output).

    ``batch`` are the spatial loops every tensor is indexed by: independent GEMMs, run one after
    another inside each thread (outermost loops).
    """

    m: str
    n: str
    k: str
    a: str
    b: str
    c: str
    batch: tuple[str, ...] = ()


def find_roles(w: Workload, info: AccessInfo) -> Roles:
    """GEMM roles from the accesses; unsupported structures get a clear error."""
    if len(w.statement.inputs) != 2:
        raise UnsupportedWorkloadError(f"{w.op}: the CPU schedule handles two-input contractions")
    tensors = [info.tensor(a.tensor) for a in (*w.statement.inputs, w.statement.output)]
    spatial = [lp.name for lp in w.loops if lp.kind == "spatial"]
    reduction = [lp.name for lp in w.loops if lp.kind == "reduction"]
    batch = tuple(n for n in spatial if all(n not in t.invariant_loops for t in tensors))
    spatial = [n for n in spatial if n not in batch]
    if len(spatial) != 2 or len(reduction) != 1:
        raise UnsupportedWorkloadError(
            f"{w.op}: the CPU schedule handles contractions with batch loops (indexing every tensor), "
            f"2 other spatial loops and 1 reduction loop; got spatial {spatial or 'none'} and reduction "
            f"{reduction or 'none'}: merge adjacent indices into one (e.g. 'ab' -> one index of size a*b)")
    out = info.tensor(w.statement.output.tensor)
    # The loop indexing the output's last dimension is the contiguous one; strides alone cannot
    # tell when an extent is 1 (a 2x1 output has stride 1 along both loops).
    last = w.statement.output.indices[-1].terms if w.statement.output.indices else ()
    contiguous = [n for n in spatial if out.stride(n) == 1 and (n, 1) in last]
    if not contiguous:
        raise UnsupportedWorkloadError(f"{w.op}: output is contiguous along no loop; put a non-batch index last")
    n = contiguous[0]
    m = next(s for s in spatial if s != n)
    k = reduction[0]
    ins = [info.tensor(a.tensor) for a in w.statement.inputs]
    a_t = [t for t in ins if m not in t.invariant_loops and n in t.invariant_loops]
    b_t = [t for t in ins if n not in t.invariant_loops and m in t.invariant_loops]
    if len(a_t) != 1 or len(b_t) != 1 or k in a_t[0].invariant_loops or k in b_t[0].invariant_loops:
        raise UnsupportedWorkloadError(f"{w.op}: inputs are not of the form A[m,k], B[k,n] (in any layout)")
    return Roles(m, n, k, a_t[0].tensor, b_t[0].tensor, out.tensor, batch)


@dataclass
class CpuSpace(Space):
    """A Space plus what codegen and the model need to read its configs."""

    workload: Workload | None = None
    hw: HwSpec | None = None
    info: AccessInfo | None = None
    roles: Roles | None = None


def footprint_expr(info: AccessInfo, tensors: tuple[str, ...], tile_vars: dict[str, Expr]) -> Expr:
    """Bytes touched by a tile whose size per loop is ``tile_vars``, from isl's extents."""
    terms: list[Expr] = []
    for name in tensors:
        t = info.tensor(name)
        factors: list[Expr] = [Const(t.itemsize)]
        for ext in t.extents:
            parts: list[Expr] = [Prod((Const(c), tile_vars[loop])) if c != 1 else tile_vars[loop] for loop, c in ext.terms]
            if ext.const:
                parts.append(Const(ext.const))
            if len(parts) == 1 and parts[0] == Const(1):
                continue  # a loop held at one value (a batch index) adds no factor
            factors.append(parts[0] if len(parts) == 1 else Sum(tuple(parts)))
        terms.append(Prod(tuple(factors)))
    return Sum(tuple(terms)) if len(terms) > 1 else terms[0]


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def build_cpu_space(w: Workload, hw: HwSpec, info: AccessInfo | None = None) -> CpuSpace:
    """Decision variables and constraints for ``w`` on CPU target ``hw``."""
    info = info or analyze(w)
    r = find_roles(w, info)
    M, N, K = w.loop(r.m).extent, w.loop(r.n).extent, w.loop(r.k).extent
    vw, regs = hw.vector_lanes_f32, hw.isa.vector_registers
    if regs < 3:
        raise UnsatisfiableError(
            f"target {hw.name} has {regs} vector register(s); a register tile needs at least 3 "
            f"(1 accumulator, 1 B vector, 1 A broadcast): fix isa.vector_registers in its spec")
    mr_max = max(1, min(M, regs - 2))
    nr_vec_max = max(1, min(-(-N // vw), (regs - 1) // 2))
    kcs = sorted({kc for kc in KC_CANDIDATES if kc < K} | {min(K, KC_CANDIDATES[-1])})
    m_cap, n_cap = min(M, MAX_BLOCK), min(_round_up(N, vw), MAX_BLOCK)
    variables = (
        DecisionVar("mr", tuple(range(1, mr_max + 1)), f"register tile rows (along {r.m})"),
        DecisionVar("nr", tuple(vw * i for i in range(1, nr_vec_max + 1)), f"register tile columns (along {r.n}), a multiple of {vw} lanes"),
        DecisionVar("kc", tuple(kcs), f"L1 block of the reduction {r.k}"),
        DecisionVar("mc", tuple(range(1, m_cap + 1)), f"L2 block of {r.m}, a multiple of mr"),
        DecisionVar("nc", tuple(range(vw, n_cap + 1, vw)), f"L3 block of {r.n}, a multiple of nr"),
        DecisionVar("order", tuple(range(len(ORDERS))), "cache-block loop order, outer to inner", ORDERS),
        DecisionVar("pack_a", (0, 1), f"copy {r.a} blocks into contiguous mr-row panels"),
        DecisionVar("pack_b", (0, 1), f"copy {r.b} blocks into contiguous nr-column panels"),
        DecisionVar("unroll", UNROLLS, f"unroll factor of the micro-kernel's {r.k} loop"),
        DecisionVar("par", tuple(range(len(PAR_LOOPS))), "loop split over the cores", PAR_LOOPS),
        DecisionVar("threads", tuple(range(1, hw.core.cores + 1)), "threads (one per core)"),
    )
    mr, nr, kc, mc, nc = (Var(x) for x in ("mr", "nr", "kc", "mc", "nc"))
    nr_vec = CeilDiv(nr, Const(vw))
    one = {bl: Const(1) for bl in r.batch}  # one batch entry at a time
    tile = {"L1": {r.m: mr, r.n: nr, r.k: kc, **one}, "L2": {r.m: mc, r.n: nr, r.k: kc, **one},
            "L3": {r.m: mc, r.n: nc, r.k: kc, **one}}

    def budget(level: int) -> int:
        return int(hw.cache_bytes_per_core(level) * hw.cache(level).usable_fraction)

    ab = (r.a, r.b)
    abc = (r.a, r.b, r.c)
    constraints = [
        Constraint("registers", Sum((Prod((mr, nr_vec)), nr_vec, Const(1))), "<=", Const(regs),
                   f"accumulators mr*nr/{vw} + operand regs (nr/{vw} + 1) <= {regs} vector registers",
                   "reduce mr or nr"),
        Constraint("vector alignment", nr, "divides", Const(vw), f"nr is a multiple of the vector width ({vw} lanes)",
                   f"use nr in steps of {vw}"),
        Constraint("mc multiple of mr", mc, "divides", mr, "mc is a multiple of mr", "round mc to a multiple of mr"),
        Constraint("nc multiple of nr", nc, "divides", nr, "nc is a multiple of nr", "round nc to a multiple of nr"),
        Constraint(f"cover {r.m}", mc, "<=", Prod((CeilDiv(Const(M), mr), mr)), f"mc <= {M} rounded up to mr",
                   "reduce mc"),
        Constraint(f"cover {r.n}", nc, "<=", Prod((CeilDiv(Const(N), nr), nr)), f"nc <= {N} rounded up to nr",
                   "reduce nc"),
        Constraint("L1 footprint", footprint_expr(info, ab, tile["L1"]), "<=", Const(budget(1)),
                   f"L1 footprint(mr, nr, kc) = {footprint_expr(info, ab, tile['L1'])} B <= "
                   f"{hw.cache(1).usable_fraction:g} * {hw.cache(1).size_kib // hw.cache(1).shared_by_cores} KiB",
                   "reduce kc, mr or nr"),
        Constraint("L2 footprint", footprint_expr(info, abc, tile["L2"]), "<=", Const(budget(2)),
                   f"L2 footprint(mc, nr, kc) = {footprint_expr(info, abc, tile['L2'])} B <= "
                   f"{hw.cache(2).usable_fraction:g} * {hw.cache_bytes_per_core(2) // 1024} KiB",
                   "reduce mc or kc"),
        Constraint("unroll within kc", Var("unroll"), "<=", kc, "unroll <= kc", "reduce unroll"),
        Constraint("parallel chunks m", CeilDiv(Const(M), mr), ">=", Var("threads"),
                   f"ceil({M}/mr) row panels >= threads", "use fewer threads or a smaller mr, or par=n",
                   when=("par", 0)),
        Constraint("parallel chunks n", CeilDiv(Const(N), nr), ">=", Var("threads"),
                   f"ceil({N}/nr) column panels >= threads", "use fewer threads or a smaller nr, or par=m",
                   when=("par", 1)),
    ]
    if len(hw.caches) >= 3:
        constraints.append(
            Constraint("L3 footprint", footprint_expr(info, abc, tile["L3"]), "<=", Const(budget(3)),
                       f"L3 footprint(mc, nc, kc) = {footprint_expr(info, abc, tile['L3'])} B <= "
                       f"{hw.cache(3).usable_fraction:g} * {hw.cache_bytes_per_core(3) // 1024} KiB per core",
                       "reduce nc, mc or kc"))
    if info.tensor(r.b).stride(r.n) != 1:
        constraints.append(Constraint(f"{r.b} not contiguous along {r.n}", Var("pack_b"), "==", Const(1),
                                      f"pack_b = 1 ({r.b} must be packed for vector loads)", "set pack_b=1"))
    if info.tensor(r.c).stride(r.n) != 1:
        raise UnsupportedWorkloadError(f"{w.op}: output {r.c} must be contiguous along {r.n}")
    space = CpuSpace(f"{w.op} {'x'.join(str(v) for _, v in w.shape)} on {hw.name}", variables, tuple(constraints),
                     workload=w, hw=hw, info=info, roles=r)
    return space
