"""The GPU performance model: predicted seconds with a breakdown naming the bottleneck.

Roadmap: two tiers share one cost function, as on the CPU. ``estimate`` reads the instruction mix
and registers from the schedule alone (every GA candidate); ``predict`` reads them from the
kernel ptxas assembled (SASS, or PTX on sm_70) and ptxas's register and spill report. Every
constant is a property of the target in its spec file.

One SM runs ``blocks_per_sm`` blocks at once (occupancy: registers in warp allocation units,
shared memory in its allocation unit plus the per-block reserve, threads, warps, blocks); the grid
runs in ``waves`` of ``SMs x blocks_per_sm`` blocks (the last wave is a whole wave of time: the
tail). Per K step of bk, the SM is bound by the largest of
    FFMA      warp FFMAs / (FP32 lanes / 32) per cycle
    issue     every warp instruction / (partitions x issue per partition)
    shared    shared-memory wavefronts (bank conflicts counted from the warp's addresses) and
              LD/ST slots (a warp instruction takes warp / LD/ST units cycles)
    L2, DRAM  the blocks' global traffic in 32-byte sectors (coalescing counted from the warp's
              addresses) over this SM's share of L2 and DRAM bandwidth
    latency   one block's critical path per step: global latency + its own compute, which the
              other resident blocks hide only as far as they have work (warps x ILP)
plus spills (local-memory traffic through L2) and the launch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from aotune.analysis.gpu_features import GpuFeatures, GpuMix
from aotune.analysis.model import Prediction
from aotune.codegen.gpu_schedule import GpuSchedule, OperandAccess
from aotune.hwspecs.gpu_spec import GpuSpec

# registers a thread needs beside its accumulators and operand values (indices, pointers, loop
# counters): the tier-1 estimate; ptxas reports the truth in tier 2
REGISTER_MARGIN = 16
# instructions per k step a thread spends beside FFMAs and loads (loop control, addresses)
LOOP_OVERHEAD_PER_K = 2.0


@dataclass(frozen=True)
class Occupancy:
    """Blocks of a kernel one SM runs at once, and what limits them."""

    blocks_per_sm: int
    limit: str
    warps_per_sm: int
    occupancy: float  # resident warps / the SM's maximum

    def as_dict(self) -> dict[str, object]:
        """JSON form."""
        return vars(self)


def occupancy(s: GpuSchedule, hw: GpuSpec, registers: int, shared_bytes: int) -> Occupancy:
    """Blocks per SM from registers, shared memory, threads, warps and the block limit."""
    lim, sh = hw.limits, hw.shared
    warps = -(-s.threads // hw.compute.warp_size)
    unit = lim.register_alloc_unit
    per_warp = -(-registers * hw.compute.warp_size // unit) * unit
    smem = -(-(shared_bytes + sh.reserved_per_block) // sh.alloc_unit) * sh.alloc_unit
    limits = {
        "registers": lim.registers_per_sm // max(1, per_warp * warps),
        "shared memory": sh.bytes_per_sm // smem if smem else lim.max_blocks_per_sm,
        "threads": lim.max_threads_per_sm // s.threads,
        "warps": lim.max_warps_per_sm // warps,
        "blocks": lim.max_blocks_per_sm,
    }
    name = min(limits, key=lambda k: limits[k])
    bps = limits[name]
    return Occupancy(bps, name, bps * warps, bps * warps / lim.max_warps_per_sm)


def thread_elements(idx: int, per: int, width: int, threads: int, strided: int) -> list[int]:
    """The elements a thread owns along one axis (the kernel's ``runs``, in Python)."""
    starts = [
        (j * threads + idx) * width if strided else idx * per + j * width
        for j in range(per // width)
    ]
    return [st + e for st in starts for e in range(width)]


def bank_wavefronts(words: list[list[int]], banks: int) -> int:
    """Shared-memory cycles of one warp instruction in which thread t reads ``words[t]`` (its
    consecutive 4-byte words): 128-bit accesses go in 4 phases of 8 threads, 64-bit in 2 of 16;
    each phase costs the largest number of distinct words one bank must deliver."""
    width = len(words[0])
    per_phase = max(1, 32 // max(1, width))
    cycles = 0
    for p in range(0, len(words), per_phase):
        by_bank: dict[int, set[int]] = {}
        for t in words[p : p + per_phase]:
            for w in t:
                by_bank.setdefault(w % banks, set()).add(w)
        cycles += max(len(v) for v in by_bank.values())
    return cycles


def warp_sectors(addresses: list[list[int]], sector_bytes: int) -> int:
    """32-byte sectors one warp instruction touches (``addresses[t]``: thread t's elements)."""
    return len({4 * a // sector_bytes for t in addresses for a in t})


def _flat(op: OperandAccess, coords: dict[str, int]) -> int:
    return op.flat_offset + sum(op.flat_coefficient(n) * v for n, v in coords.items())


def _digits(flat: int, group) -> dict[str, int]:
    out = {}
    for name, extent in reversed(group):
        out[name] = flat % extent
        flat //= extent
    return out


@dataclass(frozen=True)
class WarpAccess:
    """Per k step of one thread: shared-memory cycles and global sectors, from the first warp."""

    lds_cycles_per_k: float  # shared-memory wavefronts per warp and k step (compute reads)
    sts_cycles_per_tile: float  # wavefronts per warp to stage one k tile
    ldg_sectors_per_tile: float  # sectors per warp per k tile (staging or direct loads)
    ldg_requests_per_tile: float


# instructions of one kind sampled per warp (their pattern repeats: a run or a row further on
# shifts every thread's address alike), the rest counted as the mean of the sampled ones
SAMPLED_RUNS = 2


def _sampled(n: int) -> tuple[list[int], float]:
    """Which of ``n`` like instructions to look at, and the factor that scales them to all n."""
    picked = list(range(min(n, SAMPLED_RUNS)))
    return picked, (n / len(picked) if picked else 0.0)


def warp_access(s: GpuSchedule, hw: GpuSpec) -> WarpAccess:
    """Bank conflicts and coalescing of the first warp of block (0, 0, 0), from its addresses."""
    return _warp_access(
        s.a, s.b, s.m_loops, s.n_loops, s.k_loops, s.c_major, s.a_major, s.b_major, s.shared_n,
        tuple(getattr(s, f) for f in WARP_FIELDS), hw.shared.banks, hw.memory.sector_bytes,
        hw.compute.warp_size,
    )  # fmt: skip


WARP_FIELDS = ("bm", "bn", "bk", "tx", "ty", "vm", "vn", "strm", "strn", "sa", "sb", "la", "lb",
               "va", "vb", "pad_a", "pad_b")  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _warp_access(a, b, m_loops, n_loops, k_loops, c_major, a_major, b_major, shared_n, fields,
                 banks, sector, warp_size) -> WarpAccess:  # fmt: skip
    s = _Fields(a, b, m_loops, n_loops, k_loops, c_major, a_major, b_major, shared_n,
                **dict(zip(WARP_FIELDS, fields)))  # fmt: skip
    warp = range(min(warp_size, s.threads))

    def xy(t: int) -> tuple[int, int]:
        return (t % s.tx, t // s.tx) if s.c_major == "m" else (t // s.ty, t % s.ty)

    lds = 0.0
    ldg_sectors = ldg_req = 0.0
    for which in ("a", "b"):
        per, width, threads, strided, staged, pad, rows = (
            (s.mwi, s.vm, s.tx, s.strm, s.sa, s.pad_a, s.bm)
            if which == "a"
            else (s.nwi, s.vn, s.ty, s.strn, s.sb, s.pad_b, s.bn)
        )
        own = [thread_elements(xy(t)[0 if which == "a" else 1], per, width, threads, strided)
               for t in warp]  # fmt: skip
        picked, scale = _sampled(per // width)
        for j in picked:
            words = [o[j * width : (j + 1) * width] for o in own]
            if staged:
                lds += bank_wavefronts(words, banks) * scale
            elif not (which == "a" and s.shared_n):
                op = s.a if which == "a" else s.b
                group = s.m_loops if which == "a" else s.n_loops
                addrs = [[_flat(op, _digits(r, group)) for r in w] for w in words]
                ldg_sectors += warp_sectors(addrs, sector) * s.bk * scale
                ldg_req += s.bk * scale
    if s.shared_n:  # A per (row, k, column)
        ldg_req += s.mwi * s.nwi * s.bk / max(1, s.vn)
        ldg_sectors += s.mwi * s.nwi * s.bk / max(1, s.vn) * math.ceil(32 * 4 / sector) / 4
    sts = 0.0
    for which, staged, lthreads, width, major, rows, pad, strided in (
        ("a", s.sa, s.la, s.va, s.a_major, s.bm, s.pad_a, s.strm),
        ("b", s.sb, s.lb, s.vb, s.b_major, s.bn, s.pad_b, s.strn),
    ):
        if not staged:
            continue
        row_major = major != "k"
        major_tile, other_tile = (rows, s.bk) if row_major else (s.bk, rows)
        per_major = major_tile // lthreads
        per_other = other_tile // (s.threads // lthreads)
        op = s.a if which == "a" else s.b
        group = s.m_loops if which == "a" else s.n_loops
        mine = [
            thread_elements(t % lthreads, per_major, width, lthreads, strided if row_major else 1)
            for t in warp
        ]
        runs, run_scale = _sampled(per_major // width)
        lines, line_scale = _sampled(per_other)
        scale = run_scale * line_scale
        for j in runs:
            for i in lines:
                cells = []
                for t, m in zip(warp, mine):
                    other = (t // lthreads) * per_other + i
                    run = m[j * width : (j + 1) * width]
                    cells.append([(r, other) if row_major else (other, r) for r in run])
                addrs = [
                    [_flat(op, {**_digits(r, group), **_digits(k, s.k_loops)}) for r, k in c]
                    for c in cells
                ]
                ldg_sectors += warp_sectors(addrs, sector)
                ldg_req += 1
                smem_words = [[k * (rows + pad) + r for r, k in c] for c in cells]
                sts += (
                    bank_wavefronts(smem_words, banks)
                    if row_major
                    else sum(bank_wavefronts([[w] for w in col], banks) for col in zip(*smem_words))
                )
    return WarpAccess(lds, sts, ldg_sectors, ldg_req)


@dataclass(frozen=True)
class _Fields:
    """The parts of a schedule the warp's addresses depend on (the cache key of warp_access)."""

    a: OperandAccess
    b: OperandAccess
    m_loops: tuple
    n_loops: tuple
    k_loops: tuple
    c_major: str
    a_major: str
    b_major: str
    shared_n: bool
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
    pad_a: int
    pad_b: int

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    @property
    def mwi(self) -> int:
        return self.bm // self.tx

    @property
    def nwi(self) -> int:
        return self.bn // self.ty


def mix_from_schedule(s: GpuSchedule) -> GpuMix:
    """The instruction mix the schedule implies, per FFMA."""
    fma = s.mwi * s.nwi
    lds = (s.mwi // s.vm if s.sa else 0) + (s.nwi // s.vn if s.sb else 0)
    lds_bytes = 4 * ((s.mwi if s.sa else 0) + (s.nwi if s.sb else 0))
    ldg = (0 if s.sa else s.mwi // s.vm) + (0 if s.sb else s.nwi // s.vn)
    if s.shared_n:
        ldg += s.mwi * s.nwi // s.vn
    staged = (s.bm * s.bk // s.va if s.sa else 0) + (s.bn * s.bk // s.vb if s.sb else 0)
    per_k = staged / s.threads / s.bk  # staging loads (and as many stores) per thread and k
    return GpuMix(
        lds / fma,
        lds_bytes / fma,
        per_k / fma,
        (ldg + per_k) / fma,
        LOOP_OVERHEAD_PER_K / fma,
        "schedule",
    )


def estimated_registers(s: GpuSchedule, hw: GpuSpec) -> tuple[int, int]:
    """(registers, spill bytes) the schedule implies: accumulators, one value per owned row and
    column, and a margin; what does not fit in the architectural maximum spills."""
    staged = (s.sa * s.bm * s.bk + s.sb * s.bn * s.bk) // s.threads
    need = s.mwi * s.nwi + s.mwi + s.nwi + staged + REGISTER_MARGIN
    cap = min(hw.limits.max_registers_per_thread, hw.limits.registers_per_sm // max(1, s.threads))
    return min(need, cap), 4 * max(0, need - cap)


def cost(s: GpuSchedule, hw: GpuSpec, f: GpuFeatures, tier: str) -> Prediction:
    """Seconds for one launch of ``s`` on ``hw`` with features ``f``."""
    c, mem = hw.compute, hw.memory
    clock = c.boost_clock_ghz * 1e9
    occ = occupancy(s, hw, max(1, f.registers), f.shared_bytes)
    if occ.blocks_per_sm == 0:
        return Prediction(math.inf, (("launch", math.inf),), "cannot launch", tier)
    bps = occ.blocks_per_sm
    blocks = s.grid[0] * s.grid[1] * s.grid[2]
    waves = -(-blocks // (c.sms * bps))
    warps = -(-s.threads // c.warp_size)
    # per block and k step of bk: warp instructions
    ffma = warps * s.mwi * s.nwi * s.bk
    mix = f.mix
    issue = ffma * (1 + mix.lds_per_ffma + mix.sts_per_ffma + mix.ldg_per_ffma + mix.other_per_ffma)
    wa = warp_access(s, hw)
    lsu_slot = c.warp_size / c.ldst_units_per_sm
    shared = warps * (
        max(wa.lds_cycles_per_k * s.bk, mix.lds_per_ffma * s.mwi * s.nwi * s.bk * lsu_slot)
        + max(wa.sts_cycles_per_tile, mix.sts_per_ffma * s.mwi * s.nwi * s.bk * lsu_slot)
    )
    sectors = warps * wa.ldg_sectors_per_tile
    l2_bytes = sectors * mem.sector_bytes
    # every SM shares L2 and DRAM: this SM's share of their bandwidth per cycle
    l2_per_cycle = mem.l2_bandwidth_gbs * 1e9 / clock / c.sms
    dram_per_cycle = mem.dram_bandwidth_gbs * 1e9 / clock / c.sms
    unique = 4 * (s.M * s.K + s.N * s.K + s.M * s.N) * s.batch
    l2_total = l2_bytes * blocks * s.k_tiles
    # reuse across blocks stays in L2 when the operands fit; else blocks re-read their tiles
    fits = (4 * (s.M * s.K + s.N * s.K)) <= mem.l2_kib * 1024
    dram_total = unique if fits else max(unique, l2_total * 0.5)
    per_step = {
        "fma": bps * ffma / (c.fp32_lanes_per_sm / c.warp_size),
        "issue": bps * issue / (c.partitions_per_sm * c.issue_per_partition),
        "shared": bps * shared,
        "l2": bps * l2_bytes / l2_per_cycle,
        "dram": bps * (dram_total / blocks / s.k_tiles) / dram_per_cycle,
    }
    own = max(ffma / (c.fp32_lanes_per_sm / c.warp_size), shared)
    latency = (
        mem.l2_latency_cycles if fits else mem.dram_latency_cycles
    ) + hw.shared.latency_cycles
    # one block's step waits for its loads before it computes; the other resident blocks' work
    # fills that wait only as far as they have work (bps x own, above)
    per_step["latency"] = latency + own
    step = max(per_step.values())
    spill_bytes = f.spill_bytes * s.threads * bps * s.k_tiles
    spill_cycles = spill_bytes / l2_per_cycle if f.spill_bytes else 0.0
    store_cycles = bps * warps * s.mwi * s.nwi * 4 * c.warp_size / l2_per_cycle
    wave_cycles = s.k_tiles * step + spill_cycles + store_cycles
    seconds = waves * wave_cycles / clock + hw.launch.overhead_seconds
    scale = waves * s.k_tiles / clock
    breakdown = {k: v * scale for k, v in per_step.items()}
    breakdown["spills"] = waves * spill_cycles / clock
    breakdown["launch"] = hw.launch.overhead_seconds
    bottleneck = max(breakdown, key=lambda k: breakdown[k])
    return Prediction(seconds, tuple(breakdown.items()), bottleneck, tier)


class AnalyticalGpuModel:
    """Two-tier GPU model over one target."""

    def __init__(self, hw: GpuSpec) -> None:
        self.hw = hw

    def estimate_batch(self, schedules: Sequence[GpuSchedule]) -> list[Prediction]:
        """Tier 1: from the schedules alone."""
        out = []
        for s in schedules:
            regs, spills = estimated_registers(s, self.hw)
            f = GpuFeatures(mix_from_schedule(s), regs, spills, s.smem_bytes)
            out.append(cost(s, self.hw, f, "estimate"))
        return out

    def predict_batch(
        self, schedules: Sequence[GpuSchedule], features: Sequence[GpuFeatures]
    ) -> list[Prediction]:
        """Tier 2: from the assembled kernels' features."""
        return [cost(s, self.hw, f, "sass") for s, f in zip(schedules, features)]

    def occupancy(self, s: GpuSchedule, f: GpuFeatures) -> Occupancy:
        """The occupancy ``cost`` assumes."""
        return occupancy(s, self.hw, max(1, f.registers), f.shared_bytes)
