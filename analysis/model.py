"""Analytical performance model: predicted seconds with a breakdown that names the bottleneck.

Roadmap: two tiers share one cost function. ``estimate_batch`` takes the micro-kernel's instruction
mix from the config alone (cheap, for every GA candidate); ``predict_batch`` takes it from the
disassembled object code (``features.py``), which sees what LLVM really emitted: folded loads,
broadcasts, spills, extra unrolling. Coefficients (issue rates, latencies, bandwidths) come from the
hwspec; nothing is measured.

Cost of one thread (the slowest one, since threads split the parallel loop):
    compute   = k steps * max(FMA issue, load ports, issue width, store port, FMA latency) + per-call C I/O
    L1/L2/L3  = bytes moved into the level above / that level's bandwidth
    memory    = bytes from DRAM (all threads) / DRAM bandwidth
    seconds   = max(compute, L2, L3, memory) + packing + call/thread overhead
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from aotune.analysis.features import LoopFeatures
from aotune.codegen.schedule import CpuSchedule
from aotune.hwspecs.spec import HwSpec


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds, a breakdown by component, and the component that dominates."""

    seconds: float
    breakdown: tuple[tuple[str, float], ...]
    bottleneck: str
    tier: str  # "estimate" (config only) or "asm" (from the object code)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {"seconds": self.seconds, "breakdown": dict(self.breakdown), "bottleneck": self.bottleneck,
                "tier": self.tier}


@dataclass(frozen=True)
class KStepMix:
    """Instructions per step of the micro-kernel's k loop."""

    fma: float
    vector_loads: float
    scalar_loads: float
    stores: float
    spills: float
    instructions: float


def mix_from_schedule(s: CpuSchedule) -> KStepMix:
    """The mix the schedule implies: nr/lanes B vectors, mr broadcasts, mr*nr/lanes FMAs, loop control."""
    nvec = -(-s.nr // s.lanes)
    fma = s.mr * nvec
    return KStepMix(fma, nvec, s.mr, 0.0, 0.0, fma + nvec + s.mr + 3.0 / s.unroll)


def mix_from_features(s: CpuSchedule, f: LoopFeatures) -> KStepMix:
    """The mix the disassembled loop shows, normalised to one k step."""
    nvec = -(-s.nr // s.lanes)
    steps = max(1.0, f.fma / (s.mr * nvec)) if f.function == f"ukernel_{s.mr}x{s.nr}" else max(1.0, float(s.unroll))
    return KStepMix(f.fma / steps, f.vector_loads / steps, f.scalar_loads / steps, f.stores / steps,
                    f.spills / steps, f.instructions / steps)


def _cycles_per_kstep(mix: KStepMix, hw: HwSpec, kc: int) -> tuple[float, float]:
    """(cycles per k step, of which load-port cycles).

    Each accumulator is a chain of one FMA per k step, so a k step takes at least the FMA latency,
    unless the reorder window holds several tiles' calls at once: their chains are independent.
    """
    c = hw.core
    vec_bits = hw.isa.vector_bits
    fma_rate = c.fma_units * min(1.0, c.fma_width_bits / vec_bits)
    vload_rate = c.load_ports * min(1.0, c.load_width_bits / vec_bits)
    load_cycles = mix.vector_loads / vload_rate + mix.scalar_loads / c.load_ports
    calls_in_flight = max(1.0, c.reorder_window / (kc * mix.instructions + CALL_INSTRUCTIONS))
    cycles = max(mix.fma / fma_rate, load_cycles, mix.instructions / c.issue_width, mix.stores / c.store_ports,
                 c.fma_latency_cycles / calls_in_flight)
    return cycles + 2.0 * mix.spills, load_cycles


CALL_INSTRUCTIONS = 30.0  # call, pointer set-up, C tile load/store loop control around one micro-kernel call


def cost(s: CpuSchedule, hw: HwSpec, mix: KStepMix, tier: str) -> Prediction:
    """The model: seconds for one call of the kernel built from ``s``."""
    c = hw.core
    freq = c.frequency_ghz * 1e9
    lanes, isz = s.lanes, 4
    nvec = -(-s.nr // lanes)
    Mt, Nt, Kt = -(-s.M // s.mr), -(-s.N // s.nr), -(-s.K // s.kc)
    ranges = s.thread_ranges()
    widest = max(hi - lo for lo, hi in ranges)
    threads = len(ranges)
    # the slowest thread's share of the parallel loop, in register tiles and in elements
    if s.par == "m":
        m_share, n_share = widest, s.N
        Mt_t, Nt_t = -(-widest // s.mr), Nt
    else:
        m_share, n_share = s.M, widest
        Mt_t, Nt_t = Mt, -(-widest // s.nr)
    calls = Mt_t * Nt_t * Kt
    ksteps = Mt_t * Nt_t * s.K
    cyc_k, load_k = _cycles_per_kstep(mix, hw, s.kc)
    cyc_k += _conflict_miss_cycles(s, hw)
    vload_rate = c.load_ports * min(1.0, c.load_width_bits / hw.isa.vector_bits)
    call_cycles = 20.0 + s.mr * nvec * (1.0 / vload_rate + 1.0 / c.store_ports)
    compute = (ksteps * cyc_k + calls * call_cycles) / freq
    l1_time = ksteps * load_k / freq

    def bw(level: int) -> float:
        return hw.cache(level).bandwidth_bytes_per_cycle * freq

    def fits(level: int, nbytes: float) -> bool:
        return nbytes <= hw.cache_bytes_per_core(level) * hw.cache(level).usable_fraction

    mblocks, nblocks = -(-m_share // s.mc), -(-n_share // s.nc)
    # B micro-panel (kc x nr) is reused across the mr-row tiles of an mc block if it stays in L1;
    # unpacked B rows sit b_sk apart, so a power-of-two stride can map them onto few L1 sets.
    b_reused = s.pack_b or _rows_fit_l1(s.b_sk * isz, s.kc, s.nr * isz, hw)
    a_bytes_l2 = calls * s.mr * s.kc * isz
    b_bytes_l2 = (calls * s.kc * s.nr if not b_reused else Nt_t * Kt * mblocks * s.kc * s.nr) * isz
    c_bytes = calls * s.mr * s.nr * isz * 2
    l2_time = (a_bytes_l2 + b_bytes_l2 + c_bytes) / bw(2)
    # Into L2 from L3: A blocks once per n block, B panels once per m block, C tiles every call
    # unless the C rows of an mc block stay in L2.
    a_bytes_l3 = m_share * s.K * isz * (1 if s.order == "mkn" else nblocks)
    b_bytes_l3 = n_share * s.K * isz * mblocks
    c_l3 = c_bytes if not fits(2, s.mc * n_share * isz) else m_share * n_share * isz * 2
    levels = len(hw.caches)
    l3_time = (a_bytes_l3 + b_bytes_l3 + c_l3) / bw(3) if levels >= 3 else 0.0
    # From DRAM (all threads share it)
    total = (s.M * s.K + s.K * s.N + s.M * s.N) * isz
    last = levels
    whole_fits = total <= hw.cache(last).size_kib * 1024 * hw.cache(last).usable_fraction
    mem_bytes = total + s.M * s.N * isz if whole_fits else (
        s.M * s.K * isz * nblocks + s.K * s.N * isz * (1 if s.order != "mkn" else -(-s.M // s.mc)) + 2 * s.M * s.N * isz * Kt)
    mem_time = mem_bytes / (hw.memory.bandwidth_gbs * 1e9)
    # Packing: scalar copy loops, one element per max(store slot, 4 issue slots) cycle.
    per_elem = max(1.0 / c.store_ports, 4.0 / c.issue_width)
    pack_elems = 0
    if s.pack_a:
        pack_elems += m_share * s.K * (1 if s.order == "mkn" else nblocks)
    if s.pack_b:
        pack_elems += n_share * s.K * (1 if s.order == "nkm" else mblocks)
    packing = pack_elems * per_elem / freq
    overhead = hw.overhead.call_seconds + (threads - 1) * hw.overhead.thread_seconds
    parts = {"compute": compute, "L1": l1_time, "L2": l2_time, "L3": l3_time, "memory": mem_time}
    bound = max(parts.values())
    seconds = bound + packing + overhead
    breakdown = {**parts, "packing": packing, "overhead": overhead}
    bottleneck = max(("compute", "L2", "L3", "memory", "packing", "overhead"), key=breakdown.__getitem__)
    if bottleneck == "compute" and l1_time >= compute * 0.999:
        bottleneck = "L1"
    return Prediction(seconds, tuple(breakdown.items()), bottleneck, tier)


def _conflict_miss_cycles(s: CpuSchedule, hw: HwSpec) -> float:
    """Extra cycles per k step when an unpacked operand's rows are a page or more apart.

    Such rows map to few L1 sets, so the micro-panel cannot stay in L1, and the stride prefetcher
    stops at every page boundary: each line is fetched again from L2 at L2 latency. (Measured on
    Zen 4: at a 4 KiB stride a 1 x 32 tile spends ~46 cycles per k step; at 1-2 KiB strides the
    prefetcher hides the misses.) Packing exists to avoid this.
    """
    line, isz, page = hw.cache(1).line_bytes, 4, hw.memory.page_bytes
    l2_latency = hw.cache(2).latency_cycles if len(hw.caches) > 1 else hw.cache(1).latency_cycles
    extra = 0.0
    b_stride, a_stride = s.b_sk * isz, s.a_sm * isz
    if not s.pack_b and b_stride >= page and not _rows_fit_l1(b_stride, s.kc, s.nr * isz, hw):
        extra += -(-s.nr * isz // line) * l2_latency  # each k step reads a new B row
    if not s.pack_a and a_stride >= page and not _rows_fit_l1(a_stride, s.mr, s.kc * isz, hw):
        extra += s.mr * isz / line * l2_latency  # an A row's line serves line/4 k steps
    return extra


def _rows_fit_l1(stride_bytes: int, rows: int, row_bytes: int, hw: HwSpec) -> bool:
    l1 = hw.cache(1)
    line = l1.line_bytes
    sets = max(1, l1.size_kib * 1024 // (line * l1.associativity))
    step = (stride_bytes // line) % sets if stride_bytes % line == 0 else 1
    distinct = sets // math.gcd(step, sets) if step else 1
    lines_per_row = -(-row_bytes // line)
    return rows * lines_per_row <= distinct * l1.associativity * l1.usable_fraction


class AnalyticalCpuModel:
    """The cost-model interface: a few batch methods over schedules of one target."""

    def __init__(self, hw: HwSpec) -> None:
        self.hw = hw

    def estimate_batch(self, schedules: Sequence[CpuSchedule]) -> list[Prediction]:
        """Tier 1: from the schedules alone."""
        return [cost(s, self.hw, mix_from_schedule(s), "estimate") for s in schedules]

    def predict_batch(self, schedules: Sequence[CpuSchedule], loops: Sequence[LoopFeatures]) -> list[Prediction]:
        """Tier 2: with the instruction mix read from each kernel's object code."""
        return [cost(s, self.hw, mix_from_features(s, f), "asm") for s, f in zip(schedules, loops)]
