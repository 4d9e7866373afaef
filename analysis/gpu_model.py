"""The GPU performance model: predicted seconds with a breakdown naming the bottleneck.

Roadmap: two tiers share one cost function, as on the CPU. ``estimate`` reads the instruction mix
and registers from the schedule alone (every GA candidate); ``predict`` reads them from the
kernel ptxas assembled (SASS, or PTX on sm_70: ``gpu_features.py``, per k tile as the loops run)
and ptxas's register and spill report. Every constant is a property of the target in its spec
file; nothing is fitted to measurements.

One SM runs ``b`` blocks at once (occupancy: registers in warp allocation units, shared memory
in its allocation unit plus the per-block reserve, threads, warps, blocks). Per k-loop iteration,
each resident warp needs:
    pipes     on its own partition: its FFMAs x (warp / FP32 lanes per partition) cycles, or its
              warp instructions at one per cycle if more (an FFMA issues in one cycle and keeps
              the FMA pipe two: other instructions fill the gap)
    LD/ST     on its own partition: each memory instruction x (warp / LD/ST units per partition)
    SRAM      on the SM's banked SRAM, for the data: shared-memory wavefronts (bank conflicts
              counted from the warp's addresses, 128-bit accesses in quarter-warp phases); a
              global load that hits L1 reads the same banks, its wavefronts at the L1 load
              path's rate (``memory.l1_bytes_per_cycle``)
    latency   what the iteration waits for its loads: for direct global loads, in an iteration
              whose loads start lines no earlier iteration of the tile touched (every one where
              each k row is new lines, one per line's worth of k where the rows run along k),
              L2's latency (DRAM's for the share of traffic that misses L2), for every warp of a
              block that loads the same elements (they wait for one fill), and an L1 hit's in
              the others: once per iteration in tier 1, and in tier 2 as often and as long as
              the SASS leaves each load too few instructions before its first use
              (``exposed_cycles``); shared memory's otherwise; once per tile, the staging loads'
              and stores' latency
The warps share these as a closed queueing network, solved by mean-value analysis
(``warp_throughput``): throughput rises with warps until a resource saturates, and stays below
every bound where two are nearly balanced and a partition has few warps. Per tile, the blocks'
tiles also pass L2 (the L1 filters what the warps of a block re-read) at this SM's share of its
bandwidth: a station of the same network, so a load waits longer as the L2 fills (the latency
under load), beside the idle latency of the delay. An SM's blocks run ``k_tiles`` tiles, then
store C.

The grid runs in waves of SMs x b blocks; the last, partial wave runs at its own (lower) load,
so its time is that of the blocks left per SM, not of a whole wave. DRAM bounds the whole
kernel: each wave reads the rows of A and columns of B its blocks cover (they step through K
together, so the blocks of a wave share them in L2), unless an operand fits in L2 for all waves.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from aotune.analysis.gpu_features import GpuFeatures, GpuMix, exposed_cycles
from aotune.analysis.model import Prediction
from aotune.codegen.gpu_schedule import GpuSchedule, OperandAccess
from aotune.hwspecs.gpu_spec import GpuSpec

# registers a thread needs beside its accumulators, operand values and staging loads (indices,
# pointers, loop counters): the tier-1 estimate; ptxas reports the truth in tier 2
REGISTER_MARGIN = 16
# what aotune's generated loop issues beside FFMAs and memory instructions, per k-loop iteration
# (counter, compare, branch, pointer increments) and per memory instruction (its address): the
# tier-1 estimate of the code generator's own output; tier 2 counts the SASS
LOOP_OVERHEAD_PER_ITERATION = 4.0
ADDRESS_PER_MEMORY_INSTRUCTION = 0.5
# the widest access one thread makes in one instruction (LDS.128, LDG.E.128)
MAX_ACCESS_BYTES = 16


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
        # each partition's warps take registers from its own quarter of the file (CUDA's
        # occupancy calculator, cuda_occupancy.h): warps per partition, then whole blocks
        "registers": hw.compute.partitions_per_sm
        * (lim.registers_per_sm // hw.compute.partitions_per_sm // max(1, per_warp))
        // warps,
        "shared memory": sh.bytes_per_sm // smem if smem else lim.max_blocks_per_sm,
        "threads": lim.max_threads_per_sm // s.threads,
        "warps": lim.max_warps_per_sm // warps,
        "blocks": lim.max_blocks_per_sm,
        # ptxas has a floor of its own (24 on sm_90): a kernel past the spec's per-thread limit
        # cannot launch on the GPU the spec describes
        "registers per thread": 0
        if registers > lim.max_registers_per_thread
        else lim.max_blocks_per_sm,
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
    """One warp's memory instructions per k tile, from the first warp's addresses: how many
    (each passes its partition's LD/ST units) and the cycles their data spends in the SM's
    banked SRAM (shared-memory wavefronts; L1 wavefronts at the L1 load path's rate)."""

    lds_cycles: float  # compute reads of staged tiles from shared memory
    sts_cycles: float  # staging stores into shared memory
    ldg_cycles: float  # direct global loads of the k loop, through the L1
    staging_cycles: float  # the staging tiles' global loads, through the L1
    direct_loads: bool  # the k loop itself loads from global memory (latency per iteration)
    lds_per_k: float  # shared-memory load instructions per k step (per thread)
    ldg_per_k: float  # direct global load instructions per k step (per thread)
    staging_loads: float  # staging load (= store) instructions per tile (per thread)
    sts_instructions: float = 0.0  # staging stores per tile (per thread)
    # per tile, the k-loop iterations in which the warp's direct loads touch a line no earlier
    # iteration did: all of them where every k row is new lines, one where a line holds the
    # tile's whole k range, fewer where it holds several tiles'
    fresh_iterations: float = 0.0


# instructions of one kind sampled per warp (their pattern repeats: a run or a row further on
# shifts every thread's address alike), the rest counted as the mean of the sampled ones
SAMPLED_RUNS = 2


def _sampled(n: int) -> tuple[list[int], float]:
    """Which of ``n`` like instructions to look at, and the factor that scales them to all n."""
    picked = list(range(min(n, SAMPLED_RUNS)))
    return picked, (n / len(picked) if picked else 0.0)


def warp_access(s: GpuSchedule, hw: GpuSpec) -> WarpAccess:
    """Bank conflicts, coalescing and LD/ST cost of the first warp of block (0, 0, 0)."""
    c = hw.compute
    return _warp_access(
        s.a, s.b, s.m_loops, s.n_loops, s.k_loops, s.c_major, s.a_major, s.b_major, s.shared_n,
        tuple(getattr(s, f) for f in WARP_FIELDS), hw.shared.banks, hw.shared.bank_bytes,
        c.warp_size, hw.memory.l1_bytes_per_cycle, hw.memory.line_bytes, s.unroll,
    )  # fmt: skip


WARP_FIELDS = ("bm", "bn", "bk", "tx", "ty", "vm", "vn", "strm", "strn", "sa", "sb", "la", "lb",
               "va", "vb", "pad_a", "pad_b")  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _warp_access(a, b, m_loops, n_loops, k_loops, c_major, a_major, b_major, shared_n, fields,
                 banks, bank_bytes, warp_size, l1_bytes, line_bytes,
                 unroll) -> WarpAccess:  # fmt: skip
    s = _Fields(a, b, m_loops, n_loops, k_loops, c_major, a_major, b_major, shared_n,
                **dict(zip(WARP_FIELDS, fields)))  # fmt: skip
    warp = range(min(warp_size, s.threads))
    lanes = len(warp)
    per_access = MAX_ACCESS_BYTES // 4
    l1_cycles = banks * bank_bytes / l1_bytes  # cycles per L1 wavefront

    def global_cycles(addrs: list[list[int]]) -> float:
        # a load that hits L1 reads the same banked SRAM as shared memory: its wavefronts follow
        # the bank rules, each at the L1 load path's rate (half the banks' on Turing)
        return bank_wavefronts(addrs, banks) * l1_cycles

    lds = ldg = staged_ldg = 0.0
    lds_n = ldg_n = 0.0
    # iterations are counted over whole tiles spanning at least a line of k-contiguous words
    span = s.bk * max(1, line_bytes // 4 // s.bk)
    fresh: set[int] = set()
    for which in ("a", "b"):
        per, width, threads, strided, staged = (
            (s.mwi, s.vm, s.tx, s.strm, s.sa) if which == "a" else (s.nwi, s.vn, s.ty, s.strn, s.sb)
        )
        axis = 0 if which == "a" else 1
        own = [thread_elements(s.thread_xy(t)[axis], per, width, threads, strided) for t in warp]
        picked, scale = _sampled(per // width)
        for j in picked:
            words = [o[j * width : (j + 1) * width] for o in own]
            for piece in range(0, width, per_access):
                part = [w[piece : piece + per_access] for w in words]
                if staged:
                    lds += bank_wavefronts(part, banks) * scale * s.bk
                    lds_n += scale
                elif not (which == "a" and s.shared_n):
                    op = s.a if which == "a" else s.b
                    group = s.m_loops if which == "a" else s.n_loops
                    addrs = [[_flat(op, _digits(r, group)) for r in w] for w in part]
                    ldg += global_cycles(addrs) * scale * s.bk
                    ldg_n += scale
                    fresh |= {
                        k // unroll for k in _fresh_steps(op, s.k_loops, addrs, span, line_bytes)
                    }
    if s.shared_n:  # A per (row, k, column): one scalar load per output and k step
        fresh |= set(range(span // unroll))
        n = s.mwi * s.nwi / max(1, s.vn)
        ldg_n += n
        ldg += lanes * 4 / l1_bytes * n * s.bk  # a word per lane
    sts = 0.0
    staging = sts_n = 0.0
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
        staging += (per_major // width) * per_other * -(-width // per_access)
        for j in runs:
            for i in lines:
                cells = []
                for t, m in zip(warp, mine):
                    other = (t // lthreads) * per_other + i
                    run = m[j * width : (j + 1) * width]
                    cells.append([(r, other) if row_major else (other, r) for r in run])
                for piece in range(0, width, per_access):
                    part = [cell[piece : piece + per_access] for cell in cells]
                    addrs = [
                        [_flat(op, {**_digits(r, group), **_digits(k, s.k_loops)}) for r, k in c]
                        for c in part
                    ]
                    staged_ldg += global_cycles(addrs) * scale
                    words = [[k * (rows + pad) + r for r, k in c] for c in part]
                    wavefronts = (
                        bank_wavefronts(words, banks)
                        if row_major
                        else sum(bank_wavefronts([[w] for w in col], banks) for col in zip(*words))
                    )
                    sts += wavefronts * scale
                    sts_n += (1 if row_major else len(words[0])) * scale
    direct = bool(ldg_n)
    return WarpAccess(
        lds, sts, ldg, staged_ldg, direct, lds_n, ldg_n, staging, sts_n, len(fresh) * s.bk / span
    )


def _fresh_steps(
    op: OperandAccess, k_loops, addrs: list[list[int]], steps: int, line_bytes: int
) -> list[int]:
    """Which of the first ``steps`` k steps touch a line no earlier one did (``addrs[t]``: the
    flat elements lane t loads at k = 0; the access is affine, so step k adds its own offset)."""
    seen: set[int] = set()
    fresh = []
    for k in range(steps):
        step = _flat(op, _digits(k, k_loops)) - op.flat_offset
        lines = {4 * (a + step) // line_bytes for w in addrs for a in w}
        if not lines <= seen:
            fresh.append(k)
        seen |= lines
    return fresh


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

    def thread_xy(self, t: int) -> tuple[int, int]:
        """The (m, n) coordinates of thread ``t`` among the compute threads."""
        return (t % self.tx, t // self.tx) if self.c_major == "m" else (t // self.ty, t % self.ty)

    @property
    def nwi(self) -> int:
        return self.bn // self.ty


def mix_from_schedule(s: GpuSchedule, hw: GpuSpec) -> GpuMix:
    """The instruction mix the schedule implies, per FFMA of one k tile (tier 1)."""
    wa = warp_access(s, hw)
    ffma = s.mwi * s.nwi * s.bk
    lds, ldg, staging = wa.lds_per_k * s.bk, wa.ldg_per_k * s.bk, wa.staging_loads
    bar = 2.0 if (s.sa or s.sb) else 0.0
    iterations = max(1, s.bk // s.unroll)
    other = LOOP_OVERHEAD_PER_ITERATION * iterations + ADDRESS_PER_MEMORY_INSTRUCTION * (
        lds + ldg + 2 * staging
    )
    regs, spill = estimated_registers(s, hw)
    spilled = spill // 4 // 2  # registers spilled (the estimate counts their store and load)
    local = 2.0 * spilled * s.bk  # each spilled value stored and reloaded once per k step
    lds_bytes = 4.0 * s.bk * ((s.mwi if s.sa else 0) + (s.nwi if s.sb else 0))
    ldg_bytes = 4.0 * s.bk * ((0 if s.sa else s.mwi) + (0 if s.sb else s.nwi))
    ldg_bytes += 4.0 * (s.sa * s.bm * s.bk + s.sb * s.bn * s.bk) / s.threads
    return GpuMix(
        lds / ffma,
        lds_bytes / ffma,
        staging / ffma,
        (ldg + staging) / ffma,
        other / ffma,
        "schedule",
        bar / ffma,
        ldg_bytes / ffma,
        ldg_bytes / ffma if staging else 0.0,
        local / ffma,
        4.0 * local / ffma,
    )


def registers_per_thread_cap(threads: int, hw: GpuSpec) -> int:
    """The most registers each thread of a block of ``threads`` may have: the thread limit, or
    an SM's register file shared by the block's threads, whichever is fewer."""
    return min(hw.limits.max_registers_per_thread, hw.limits.registers_per_sm // max(1, threads))


def estimated_registers(s: GpuSchedule, hw: GpuSpec) -> tuple[int, int]:
    """(registers, spill bytes) the schedule implies: accumulators, one k step's operand values
    and a margin, which spill where they do not fit in the registers a thread may have at this
    block size (the bytes stored and reloaded, as ptxas counts them); beside them, the staging
    loads held between their global load and their store to shared memory, as many as the
    registers left hold: ptxas issues fewer of them ahead of their stores rather than spill."""
    staged = (s.sa * s.bm * s.bk + s.sb * s.bn * s.bk) // s.threads
    cap = registers_per_thread_cap(s.threads, hw)
    need = s.mwi * s.nwi + s.mwi + s.nwi + REGISTER_MARGIN
    if s.reads_ahead:  # the next k step's values of the operands read in place, in flight
        need += (0 if s.sa else s.mwi) + (0 if s.sb or s.shared_n else s.nwi)
    held = min(staged, max(0, cap - need))
    return min(need + held, cap), 2 * 4 * max(0, need - cap)


@dataclass(frozen=True)
class TileWork:
    """One warp's work per k tile: cycles of its partition's pipes (FMA, issue) and LD/ST units
    (address generation), of the SM's banked SRAM (the data), the latency its k-loop iterations
    and its staging wait through, and one block's L2 bytes per tile."""

    fma: float  # FMA-pipe cycles of the warp's FFMAs on its partition
    issue: float  # warp instructions (issue cycles on its partition's scheduler)
    agu: float  # its memory instructions through its partition's LD/ST units
    data: float  # their data through the SM's shared-memory banks and L1 load path
    iterations: int  # k-loop iterations per tile
    wait: float  # latency each iteration waits for what it loads
    stage_wait: float  # latency of the staging loads and stores, once per tile
    l2_bytes: float  # per block


def warp_throughput(
    warps: int, partition: Sequence[float], shared: Sequence[float], delay: float, partitions: int
) -> float:
    """Warp iterations per cycle of one SM: mean-value analysis of the closed network each of
    ``warps`` warps cycles through once per iteration: stations every partition has one of
    (``partition``: its pipes, its LD/ST units; a warp uses its own partition's, modelled as one
    station of ``partitions`` servers in Seidmann's approximation), stations the SM has one of
    (``shared``: the banked SRAM) and the latency it waits (``delay``, no server). Throughput
    rises with warps until a server saturates; where two are nearly balanced and a partition has
    few warps, each warp queues at both and the SM stays below either bound. Arrivals are as
    bursty as the network's own (exact mean-value analysis): every warp of a block issues its
    loads at the top of each iteration, and the block's barriers line its warps up again every
    tile."""
    if warps <= 0:
        return 0.0
    demands = [d / partitions for d in partition] + list(shared)
    fixed = sum(d - d / partitions for d in partition) + delay
    queue = [0.0] * len(demands)
    x = 0.0
    for n in range(1, warps + 1):
        times = [d * (1 + q) for d, q in zip(demands, queue)]
        x = n / (sum(times) + fixed)
        queue = [x * t for t in times]
    # Seidmann's approximation can overshoot a server's capacity by a little; and warps are
    # bound to partitions, so the busiest partition bounds its stations
    busiest = -(-warps // partitions)
    bounds = [1.0 / d for d in shared if d > 0] + [
        warps / (busiest * d) for d in partition if d > 0
    ]
    return min([x, *bounds])


def dram_bytes(s: GpuSchedule, hw: GpuSpec, blocks_per_sm: int) -> float:
    """DRAM traffic of the whole kernel: per wave, the rows of A and columns of B its blocks
    cover (the blocks of a wave step through K together and share them in L2); an operand that
    fits in half the L2 is read once for all waves; C is written once."""
    gx, gy, gz = s.grid
    wave = max(1, hw.compute.sms * blocks_per_sm)
    blocks = gx * gy * gz
    waves = -(-blocks // wave)
    cover_x, cover_y = min(wave, gx), min(gy, -(-wave // gx))
    cover_z = min(gz, -(-wave // (gx * gy)))
    l2 = hw.memory.l2_kib * 1024
    total = 0.0
    for t, covered, extent in ((s.a, cover_x, gx), (s.b, cover_y, gy)):
        nbytes = 4.0 * math.prod(t.shape)
        per_wave = nbytes / max(1, gz) * cover_z * covered / extent
        total += nbytes if nbytes <= l2 / 2 else max(nbytes, waves * per_wave)
    return total + 4.0 * math.prod(s.c.shape)


def tile_work(
    s: GpuSchedule, hw: GpuSpec, f: GpuFeatures, memory_latency: float, blocks_per_sm: int = 1
) -> TileWork:
    """TileWork of ``s`` with features ``f`` (module docstring)."""
    c = hw.compute
    mix = f.mix
    wa = warp_access(s, hw)
    ffma = s.mwi * s.nwi * s.bk
    pipe = c.warp_size / (c.fp32_lanes_per_sm / c.partitions_per_sm)  # cycles per warp FFMA
    fma = ffma * pipe
    per_ffma = 1 + mix.lds_per_ffma + mix.sts_per_ffma + mix.ldg_per_ffma + mix.bar_per_ffma
    issue = ffma * (per_ffma + mix.other_per_ffma + mix.local_per_ffma)
    # memory instructions: as many as the code has (SASS in tier 2: a kernel that splits an
    # access the schedule calls one vector issues every piece), at least the addresses' count
    memory = (
        max(
            s.bk * (wa.lds_per_k + wa.ldg_per_k) + wa.staging_loads + wa.sts_instructions,
            ffma * (mix.lds_per_ffma + mix.ldg_per_ffma + mix.sts_per_ffma),
        )
        + ffma * mix.local_per_ffma
    )
    agu = memory * c.warp_size / (c.ldst_units_per_sm / c.partitions_per_sm)
    local_bytes = mix.local_bytes_per_ffma / mix.local_per_ffma if mix.local_per_ffma else 4.0
    local = mix.local_per_ffma * ffma * c.warp_size * local_bytes / hw.memory.l1_bytes_per_cycle
    data = wa.lds_cycles + wa.sts_cycles + wa.ldg_cycles + wa.staging_cycles + local
    # each k-loop iteration waits for what it loads: global or shared memory; staging waits for
    # memory, then for its stores, once per tile. An iteration whose direct loads start new lines
    # waits for memory (the warps of a block that load the same elements step together, as each
    # barrier lines them up: one misses L1 and the others wait for the same fill); the others
    # hit the lines an earlier k step brought to L1
    n_it = max(1, s.bk // s.unroll)
    new = min(1.0, wa.fresh_iterations / n_it)
    l1 = hw.memory.l1_latency_cycles
    wait = new * memory_latency + (1 - new) * l1 if wa.direct_loads else hw.shared.latency_cycles
    if wa.direct_loads and s.reads_ahead and not s.shared_n:
        # tier 1: each k step's reads were issued a k step earlier, as long ago as one warp
        # takes to issue a k step's instructions and FFMAs (NHWC depthwise reads A per output
        # at its use, never ahead: its k steps wait as before)
        step = max(issue / s.bk, s.mwi * s.nwi * pipe)
        wait = max(
            hw.shared.latency_cycles,
            s.unroll * (new * max(0.0, memory_latency - step) + (1 - new) * max(0.0, l1 - step)),
        )
    if wa.direct_loads and f.loop_trips:  # tier 2: the SASS says how soon each load is used
        exposed = f.loop_trips * (
            new * exposed_cycles(f.load_uses, f.loop_length, memory_latency, f.ffma_at, pipe)
            + (1 - new) * exposed_cycles(f.load_uses, f.loop_length, l1, f.ffma_at, pipe)
        )
        wait = max(hw.shared.latency_cycles, exposed / n_it)
    staged = bool(s.sa or s.sb)
    return TileWork(
        fma,
        issue / c.issue_per_partition,
        agu,
        data,
        n_it,
        wait,
        (memory_latency + hw.shared.latency_cycles) if staged else 0.0,
        4.0 * s.bk * (s.bm + s.bn),
    )


def cost(s: GpuSchedule, hw: GpuSpec, f: GpuFeatures, tier: str) -> Prediction:
    """Seconds for one launch of ``s`` on ``hw`` with features ``f``."""
    c, mem = hw.compute, hw.memory
    clock = c.boost_clock_ghz * 1e9
    occ = occupancy(s, hw, max(1, f.registers), f.shared_bytes)
    if occ.blocks_per_sm == 0:
        return Prediction(math.inf, (("launch", math.inf),), "cannot launch", tier)
    bps = occ.blocks_per_sm
    blocks = s.grid[0] * s.grid[1] * s.grid[2]
    warps = -(-s.threads // c.warp_size)
    dram = dram_bytes(s, hw, bps)
    l2_total = blocks * s.k_tiles * 4.0 * s.bk * (s.bm + s.bn)
    miss = min(1.0, max(0.0, dram - 4.0 * math.prod(s.c.shape)) / max(1.0, l2_total))
    latency = mem.l2_latency_cycles + miss * (mem.dram_latency_cycles - mem.l2_latency_cycles)
    w = tile_work(s, hw, f, latency, bps)
    l2_per_cycle = mem.l2_bandwidth_gbs * 1e9 / clock / c.sms  # this SM's share
    n_it = w.iterations

    def per_tile(b: int) -> dict[str, float]:
        """Cycles of one tile of ``b`` blocks: each resource's bound, and the queueing model."""
        n = b * warps
        per_partition = -(-n // c.partitions_per_sm)
        pipe = max(w.fma, w.issue)
        x = warp_throughput(
            n,
            (pipe / n_it, w.agu / n_it),
            (w.data / n_it, w.l2_bytes / warps / n_it / l2_per_cycle),  # SRAM, this SM's L2
            w.wait + w.stage_wait / n_it,
            c.partitions_per_sm,
        )
        return {
            "fma": per_partition * w.fma,
            "issue": per_partition * w.issue,
            "lsu": max(per_partition * w.agu, n * w.data),
            "l2": b * w.l2_bytes / l2_per_cycle,
            "latency": n * n_it / x,
        }

    def sm_cycles(b: int) -> tuple[float, dict[str, float]]:
        parts = per_tile(b)
        store = b * 4.0 * s.bm * s.bn / l2_per_cycle + latency
        return s.k_tiles * max(parts.values()) + store, parts

    full, rest = divmod(blocks, c.sms * bps)
    last = -(-rest // c.sms)
    cycles, parts = sm_cycles(bps)
    total = full * cycles
    comps = {k: full * s.k_tiles * v for k, v in parts.items()}
    if rest:
        tail, tail_parts = sm_cycles(last)
        total += tail
        for k, v in tail_parts.items():
            comps[k] += s.k_tiles * v
    dram_seconds = dram / (mem.dram_bandwidth_gbs * 1e9)
    seconds = max(total / clock, dram_seconds) + hw.launch.overhead_seconds
    breakdown = {k: v / clock for k, v in comps.items()}
    breakdown["dram"] = dram_seconds
    breakdown["launch"] = hw.launch.overhead_seconds
    # the bottleneck: the resource the queueing model keeps busiest; latency when none is
    # above half busy (the warps wait more than they work)
    busy = {k: v / max(breakdown["latency"], dram_seconds) for k, v in breakdown.items()
            if k not in ("latency", "launch")}  # fmt: skip
    bottleneck = max(busy, key=lambda k: busy[k])
    if busy[bottleneck] < 0.5:
        bottleneck = "latency"
    if hw.launch.overhead_seconds > seconds / 2:  # a small problem: the launch takes most of it
        bottleneck = "launch"
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
            f = GpuFeatures(mix_from_schedule(s, self.hw), regs, spills, s.smem_bytes)
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
