"""Analytical performance model: predicted seconds with a breakdown that names the bottleneck.

Roadmap: two tiers share one cost function. ``estimate_batch`` takes the micro-kernel's instruction
mix from the config alone (cheap, for every GA candidate); ``predict_batch`` takes it from the
disassembled object code (``features.py``), which sees what LLVM really emitted: folded loads,
broadcasts, spills, extra unrolling. Coefficients (issue rates, latencies, bandwidths) come from the
hwspec; nothing is measured.

Constants: every property of a CPU is a spec field with its origin (``hwspecs/*.toml``, measured
by ``aotune hw calibrate``). What stays in this module does not depend on the machine: counts of
the instructions codegen emits (CALL_INSTRUCTIONS, A_SHARED_LOOP_REGISTERS, RUN_SETUP_INSTRUCTIONS,
the ROW_RUN_* counts, PACK_INSTRUCTIONS_PER_ELEMENT, the epilogue's), the form in which two bounds
overlap (a 4-norm), and one share of the cache-set model that was fitted on Zen 4 and is said to
be so where it is defined (PANEL_L1_SHARE).

Cost of one thread (the slowest one, since threads split the parallel loop):
    compute   = k steps * (max(FMA issue, load ports and prefetch slots, issue width, store port)
                overlapped with the FMA latency over the calls in flight and with unpacked-operand
                L1 misses, plus DTLB misses) + per call: the call, its own instructions beyond the
                issue slots its k steps leave idle, the C tile's loads and stores beyond the
                ports' idle cycles, C stores that miss, or whose line pair another thread
                writes, C fills queued in the few L1 sets a sweep down rows a page apart crowds
                (where the window holds the next call), or, where the next call's unpacked B loads
                match these C stores in the page-offset bits, the FMA chain beyond the call's
                steps and an L2 round trip (the calls no longer overlap); calls in flight are
                bounded by the reorder window and by the FMAs the schedulers hold; unpacked B
                rows that the micro-kernel prefetches pay no first-touch or translation wait, but
                a page walk per row where a sweep over their pages outruns the second-level TLB;
                plus A's lines from DRAM, when A is read in place with rows a page apart, at
                memory latency over the misses in flight
    L1/L2/L3  = bytes moved into the level above / that level's bandwidth (a copied block of B
                that fits L1 is read from there by the tiles right after its copy)
    memory    = bytes from DRAM (all threads) / DRAM bandwidth: each tensor once, and on each
                sweep that comes back to it after more than the last level holds (the loop
                order's reuse distance) the share the level did not keep; none when the working
                set stays there between calls
    seconds   = 4-norm(compute, L2, L3, memory) + packing + call/thread overhead: the work and
                the traffic overlap, but not perfectly when close (as issue and L1 misses do)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from aotune.analysis.features import LoopFeatures, tile_of_function
from aotune.codegen.llvm_cpu import LINE_FLOATS
from aotune.codegen.schedule import (
    CpuSchedule,
    Gather,
    column_vector_widths,
    last_vector_lanes_used,
)
from aotune.hwspecs.spec import CacheSpec, HwSpec


@dataclass(frozen=True)
class Prediction:
    """Predicted seconds, a breakdown by component, and the component that dominates."""

    seconds: float
    breakdown: tuple[tuple[str, float], ...]
    bottleneck: str
    tier: str  # "estimate" (config only) or "asm" (from the object code)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly form."""
        return {
            "seconds": self.seconds,
            "breakdown": dict(self.breakdown),
            "bottleneck": self.bottleneck,
            "tier": self.tier,
        }


@dataclass(frozen=True)
class KStepMix:
    """Instructions per step of the micro-kernel's k loop."""

    fma: float
    vector_loads: float
    scalar_loads: float
    stores: float
    spills: float  # stack accesses a k step makes besides a spilled value's store and reload
    instructions: float
    mixed_fma: float = (
        0.0  # FMA instructions in rows that mix full vectors with a narrower tail vector
    )
    prefetches: float = 0.0  # software prefetches of B's rows ahead (no data comes back)
    # stores reloaded on the loop-carried chain through the most of them (a spilled
    # accumulator's), per k step: each adds the store's forwarding to the chain's FMA latency
    stack_round_trips: float = 0.0


def mix_from_schedule(s: CpuSchedule, hw: HwSpec) -> KStepMix:
    """The mix the schedule implies: nr/lanes B vectors, mr broadcasts, mr*nr/lanes FMAs, a
    prefetch per line of the B row ahead where codegen prefetches B, loop control."""
    nvec = -(-s.nr // s.lanes)
    fma = s.mr * nvec
    prefetches = float(b_row_prefetches(s, s.nr))
    if s.a_shared:
        # A is a vector per (row, k) too, at its row's address plus one k-offset table load; the
        # FMAs take those vectors as memory operands. Each row's address needs an integer register
        # beside the loop's own pointers: rows past what is left are reloaded from the stack every
        # k step (x86-64, 9x32 tiles: none; 16x16: 7-9; 30x16: 21-24 reloads).
        reloads = max(0.0, s.mr - (hw.isa.general_registers - A_SHARED_LOOP_REGISTERS))
        return KStepMix(
            fma,
            nvec + fma,
            1.0 + reloads,
            0.0,
            reloads,
            fma + nvec + 2.0 + reloads + prefetches + 3.0 / s.unroll,
            prefetches=prefetches,
        )
    instructions = fma + nvec + s.mr + prefetches + 3.0 / s.unroll
    return KStepMix(fma, nvec, s.mr, 0.0, 0.0, instructions, prefetches=prefetches)


def b_row_prefetches(s: CpuSchedule, cols: int) -> int:
    """Prefetches per k step of a tile ``cols`` wide: codegen prefetches each line of the B row
    ``b_prefetch_rows`` ahead, where it prefetches B at all."""
    return -(-cols // LINE_FLOATS) if s.b_prefetch_rows else 0


A_SHARED_LOOP_REGISTERS = 6  # B, C, k-offset table, k and its bound, stack pointer


def mix_from_features(s: CpuSchedule, f: LoopFeatures, hw: HwSpec) -> KStepMix:
    """The mix the disassembled loop shows, normalised to one k step.

    The loop's FMAs per k step are its tile's rows times vectors, read from the function's name:
    LLVM may unroll further than the schedule asked (a 1 x 49 tile, the whole row of a 7 x 7 image,
    showed 8 k steps in one iteration). A loop found in a tile of another shape than mr x nr (no
    full tile fits the extent) does not show the full tile's mix; the schedule's is used then.
    A micro-kernel with no k loop (K <= 8, unrolled whole) mixes the k steps with the C tile's
    loads and stores, which ``cost`` charges per call: the schedule's mix per k step is used, with
    the stack spills the body shows spread over its k steps.
    """
    nvec = -(-s.nr // s.lanes)
    tile = tile_of_function(f.function)
    if f.loop_free:
        mix = mix_from_schedule(s, hw)
        steps = max(1.0, f.fma / (s.mr * nvec))
        return dataclasses.replace(mix, spills=f.spills / steps)
    if tile is None:
        steps = max(1.0, float(s.unroll))
    else:
        rows, vecs = tile[0], -(-tile[1] // s.lanes)
        if (rows, vecs) != (s.mr, nvec):
            return mix_from_schedule(s, hw)
        steps = max(1.0, f.fma / (rows * vecs))
    return KStepMix(
        f.fma / steps,
        f.vector_loads / steps,
        f.scalar_loads / steps,
        f.stores / steps,
        f.unpaired_spills / steps,
        f.instructions / steps,
        prefetches=f.prefetches / steps,
        stack_round_trips=f.stack_round_trips / steps,
    )


def _cycles_per_kstep(mix: KStepMix, hw: HwSpec, kc: int) -> tuple[float, float]:
    """(cycles per k step, of which load-port cycles).

    Each accumulator is a chain of one FMA per k step, so a k step takes at least the FMA latency,
    unless the reorder window holds several tiles' calls at once: their chains are independent.
    That latency and the pipes' throughput overlap as issue and misses do (``_overlapped``): a
    tile whose chains only just fill the pipes loses slots whenever its FMAs wait (Zen 5, packed
    6 x 16 and 8 x 16 tiles at kc = 320, one thread: 4.58 and 5.26 cycles a k step measured,
    4.1 and 4.8 by the larger bound alone). Where one pipe takes every vector FMA (Zen 4's 512-bit
    FMAs use both 256-bit pipes) there is no pipe to pick: four chains ran a packed 4 x 16 tile at
    the 8 x 16's pace per FMA, where the blend said 1.11x, so the step is capped at the larger of
    the throughput and the chains' own latency.
    """
    c = hw.core
    fma_rate = hw.vector_fmas_per_cycle
    vload_rate = _vector_load_rate(hw)
    # a prefetch returns no data: it takes an address slot, which cores with more address pipes
    # than load data paths issue faster than loads, and beside them the two add (Zen 5)
    load_cycles = (
        mix.vector_loads / vload_rate
        + mix.scalar_loads / c.load_ports
        + mix.prefetches / c.prefetches_per_cycle
    )
    calls_in_flight = _calls_in_flight(mix, hw, kc)
    fma_cycles = max(mix.fma / fma_rate, mix.mixed_fma * c.mixed_width_fma_cycles)
    throughput = max(
        fma_cycles,
        load_cycles,
        mix.instructions / c.issue_width,
        mix.stores / c.store_ports,
    )
    # a spilled accumulator's chain waits on its store's forwarding as well as on its FMAs
    chain = c.fma_latency_cycles + mix.stack_round_trips * c.store_forward_cycles
    cycles = _overlapped(throughput, chain / calls_in_flight)
    if fma_rate <= 1.0:
        # one vector FMA a cycle through one pipe: no pipe to pick, so a call's own chains take
        # their turns and a step takes no longer than their latency or the pipe's throughput
        cycles = min(cycles, max(throughput, chain))
    return cycles + c.spill_cycles * mix.spills, load_cycles


CALL_INSTRUCTIONS = (
    30.0  # call, pointer set-up, C tile load/store loop control around one micro-kernel call
)


def _overlapped_terms(terms: Sequence[float], power: int = 4) -> float:
    """The micro-kernels' work and the traffic of each level beyond L1 (or a k step's issue and
    its operand's refills, or a B copy's bandwidth, set refills and translations), which overlap
    as the L1 misses do with issue (``_overlapped``'s 4-norm), or less (``power`` 2) where only
    the loop's own loads fetch B (``_miss_overlap_power``)."""
    return sum(v**power for v in terms) ** (1.0 / power)


def b_rows_fetched_by_the_loop(s: CpuSchedule, hw: HwSpec) -> bool:
    """Whether B is read in place with its rows further apart than the hardware prefetchers
    follow: its lines then come only as the micro-kernel's own loads and prefetches ask for them,
    so their traffic overlaps the FMAs less than a stream the prefetchers run ahead of the loop.
    Bounds that are equal cost 1.41x the larger (a 2-norm), not 1.19x: a Zen 4 7 x 16 tile whose
    prefetched B rows each waited ~7 cycles for L2 ran at ~10 a k step, not 7 or 8.3; on a Zen 5
    slice, 28 tiles of 1-12 rows meeting such panels once per call (rows 4-8 KiB apart, from L2
    and L3) ran at 0.92-1.22x the 2-norm's time and 1.07-1.42x the 4-norm's (README, stop 74)."""
    return not s.pack_b and s.b_sk * 4 > hw.memory.prefetch_stride_bytes


def _miss_overlap_power(s: CpuSchedule, hw: HwSpec) -> int:
    """The norm that overlaps a kernel's work with its waits for lines beyond L1: 2 where only
    the loop's own loads fetch B (``b_rows_fetched_by_the_loop``), the same for the k step's issue
    and its B rows' set refills (Zen 5 slice, 2048^3, B rows 8 KiB apart in one L1 set, kc = 128:
    2 x 16 to 12 x 16 tiles ran 8.4-12.4 cycles a k step, the 4-norm 7.9-9.1, the 2-norm
    8.4-10.7), else 4 (``_overlapped``)."""
    return 2 if b_rows_fetched_by_the_loop(s, hw) else 4


def _overlapped(issue_cycles: float, miss_cycles: float) -> float:
    """Cycles per k step of a loop bound both by its issue and by the L1 misses (or the FMA
    chains' latency) it waits on.

    The two overlap, but not perfectly when they are close: a 7 x 16 tile (7 FMA cycles per k
    step) whose prefetched B rows each wait ~7 cycles for L2 ran at ~10 on Zen 4, not 7, and was
    the model's first pick at 512^3 with a plain max (measured 134 GFLOP/s where the sample's
    best ran 209). A 4-norm: the larger when they differ by 2x or more, 1.19x it when equal.
    """
    return _overlapped_terms((issue_cycles, miss_cycles))


def _calls_in_flight(mix: KStepMix, hw: HwSpec, kc: int) -> float:
    """How many micro-kernel calls the core holds at once: short calls overlap, so latencies they
    wait on (FMA chains, C tiles from afar) overlap too. The running call, plus as many later ones
    as the schedulers hold waiting FMAs of (dispatch stops when they are full), or the reorder
    window instructions of, whichever is less: on Zen 4 (64 FP scheduler entries) 1 x 16 and
    2 x 16 tiles ran at 1 + 64 / (FMAs per call) within 7% from 96 to 512 FMAs per call."""
    window = hw.core.reorder_window / (kc * mix.instructions + CALL_INSTRUCTIONS)
    waiting = hw.core.scheduler_entries / max(1.0, kc * mix.fma)
    return 1.0 + min(window, waiting)


def _next_call_in_window(mix: KStepMix, hw: HwSpec, kc: int) -> float:
    """Share of the next call that the reorder window holds beside the running one: its C loads,
    at its end, issue before the running call's C stores drain only as far as the window
    reaches."""
    calls = hw.core.reorder_window / (kc * mix.instructions + CALL_INSTRUCTIONS)
    return min(1.0, max(0.0, calls - 1.0))


@dataclass(frozen=True)
class ThreadShare:
    """The slowest thread's share of the parallel loop: what every term below is charged for."""

    ranges: tuple[tuple[int, int], ...]
    m_share: int  # rows of C the thread computes
    n_share: int  # columns
    m_tiles: int  # register tiles along them
    n_tiles: int
    k_blocks: int

    @property
    def threads(self) -> int:
        """Threads that run a share."""
        return len(self.ranges)

    @property
    def calls(self) -> int:
        """Micro-kernel calls of the thread: tiles x k blocks."""
        return self.m_tiles * self.n_tiles * self.k_blocks

    @staticmethod
    def of(s: CpuSchedule) -> ThreadShare:
        """The widest share of ``s``'s parallel split."""
        ranges = tuple(s.thread_ranges())
        widest = max(hi - lo for lo, hi in ranges)
        kt = -(-s.K // s.kc)
        if s.par == "m":
            return ThreadShare(ranges, widest, s.N, -(-widest // s.mr), -(-s.N // s.nr), kt)
        return ThreadShare(ranges, s.M, widest, -(-s.M // s.mr), -(-widest // s.nr), kt)


def cost(s: CpuSchedule, hw: HwSpec, mix: KStepMix, tier: str) -> Prediction:
    """The model: seconds for one call of the kernel built from ``s``.

    The named terms, each for the slowest thread (batch entries run one after another):
        compute  micro-kernel cycles: k steps at the issue/latency/miss bound plus per-call work,
                 and the wait for A's lines from DRAM when A is read in place
        L1..L3   bytes each level serves the one above, over its bandwidth
        memory   DRAM bytes of all threads over the memory bandwidth
        packing  copies into panels and the zero-padded input
        overhead the call and the threads' hand-over
    seconds = 4-norm(compute, L2, L3, memory) + packing + overhead (L1's load cycles are in
    compute already); their plain sum where each packed B panel serves one tile whatever the
    tile (``panels_serve_one_tile``), their 2-norm where only the loop's own loads fetch B
    (``b_rows_fetched_by_the_loop``).
    """
    freq = hw.core.frequency_ghz * 1e9
    share = ThreadShare.of(s)
    mix = _with_split_loads(mix, s, hw)
    compute_cycles, load_cycles = micro_kernel_cycles(s, hw, mix, share)
    l2_bytes, l3_bytes, dram_bytes = traffic_bytes(s, hw, share)
    nb = s.batch_count
    parts = {
        "compute": nb * (compute_cycles + epilogue_cycles(s, hw, share)) / freq,
        "L1": nb * load_cycles / freq,
        "L2": nb * l2_bytes / (hw.cache(2).bandwidth_bytes_per_cycle * freq),
        "L3": (
            nb * l3_bytes / (hw.cache(3).bandwidth_bytes_per_cycle * freq)
            if len(hw.caches) >= 3
            else 0.0
        ),
        "memory": nb * dram_bytes / (hw.memory.bandwidth_gbs * 1e9),
    }
    packing = (nb * packing_cycles(s, hw, share) + pad_copy_cycles(s, hw, share)) / freq
    overhead = hw.overhead.call_seconds + (share.threads - 1) * hw.overhead.thread_seconds
    beyond_l1 = [v for k, v in parts.items() if k != "L1"]  # L1's are in compute already
    if panels_serve_one_tile(s):
        body = sum(beyond_l1)
    else:
        body = _overlapped_terms(beyond_l1, _miss_overlap_power(s, hw))
    seconds = body + packing + overhead
    breakdown = {**parts, "packing": packing, "overhead": overhead}
    bottleneck = max(
        ("compute", "L2", "L3", "memory", "packing", "overhead"), key=breakdown.__getitem__
    )
    if bottleneck == "compute" and parts["L1"] >= parts["compute"] * 0.999:
        bottleneck = "L1"
    return Prediction(seconds, tuple(breakdown.items()), bottleneck, tier)


def panels_serve_one_tile(s: CpuSchedule) -> bool:
    """Whether each packed B panel serves one tile, whatever the tile: C has one row per batch
    entry (M = 1: a depthwise convolution's groups, a matrix-vector product). The panel's source
    lines arrive during its copy and its tile needs the copy done, so no FMAs run beside that
    traffic and the terms add (Zen 4, NCHW depthwise rows, the four kept timings with a copied
    block read from L1 where it fits: measured at a median 1.44-1.58x the overlapped prediction,
    1.04-1.17x the sum). Only M = 1 is claimed: with more rows, tiles of fewer rows than M would
    share a panel and keep the overlap, and how much of it is not measured; a rule on the tile
    would rank them apart by that alone."""
    return s.pack_b and s.M == 1


def micro_kernel_cycles(
    s: CpuSchedule, hw: HwSpec, mix: KStepMix, share: ThreadShare
) -> tuple[float, float]:
    """(cycles, of which load-port cycles) of the thread's micro-kernel calls, one batch entry.

    Per tile class (full tiles and the m, n and corner tails): its k steps at the bound of
    ``_cycles_per_kstep`` overlapped with the L1 misses of an unpacked operand, plus DTLB misses
    and page walks beyond that wait for the misses, plus per call the call itself, its
    instructions beyond the k steps' idle issue slots (``_call_issue_cycles``), the C tile's
    loads and stores beyond the ports' idle cycles, masked C stores where a tile row ends in a
    partial vector, C stores that miss L1 (or, for short calls, C fills queued behind the last
    calls' write-backs in the sets a sweep down C's rows crowds, or the next call's B loads
    waiting for these stores: ``_b_after_c_store_cycles``), a C tile fetched from beyond
    L2 beyond what the call's prefetch of it hides (``c_prefetch_steps``), and C lines another
    thread writes too (on each visit) or whose pair it does (on visits that miss L1:
    ``shared_pair_shares``), unless the threads meet them only at their runs' ends; for the
    share of the run the other thread still runs where it has fewer columns
    (``shared_lines_contended_share``). A swept B row's lines refilled one set each add
    their cost to the k step (``_swept_row_refill_cycles``), less what the core overlaps of them
    (``_with_swept_refills``). Plus, once, the wait for A's lines
    from DRAM read in place (``a_demand_miss_cycles``).
    """
    c, lanes, isz = hw.core, s.lanes, 4
    vload_rate = _vector_load_rate(hw)
    conflict = _conflict_miss_cycles(s, hw, share.m_share, mix)
    swept_refills = _swept_row_refill_cycles(s, hw, share.m_share)
    power = _miss_overlap_power(s, hw)
    dtlb = _dtlb_miss_cycles(s, hw, share.m_share)
    walks = _page_walk_cycles(s, hw, share.m_share, share.n_share)
    c_fetch = _c_tile_fetch_cycles(s, hw, share.m_share, share.n_share)  # every tile class's
    lockstep = _threads_store_shared_lines_at_once(s, share)
    shared_wait = _shared_line_wait_cycles(s, hw, share)
    if shared_wait > 0.0 and not lockstep:
        shared_wait *= shared_lines_contended_share(s, hw, mix, share)
    compute_cycles = load_cycles = 0.0
    for tiles, rows, cols in _tile_classes(share.m_share, share.n_share, s.mr, s.nr):
        tile_mix = _tail_mix(mix, s, rows, cols, hw)
        cyc_k, load_k = _cycles_per_kstep(tile_mix, hw, s.kc)
        # the k step's issue and its unpacked operand's misses overlap as the traffic terms do
        step = _with_swept_refills(_overlapped_terms((cyc_k, conflict), power), swept_refills, hw)
        # the C lines B evicts, and B's rows' translations, are waited for beside B's own
        # misses: only the excess adds
        evicted = _c_evicted_by_b_cycles(s, hw, rows, cols, share.m_share) / s.kc
        step += max(0.0, evicted - (step - cyc_k))
        step += max(0.0, dtlb + walks - (step - cyc_k))
        tile_vecs = rows * -(-cols // lanes)
        call_cycles = c.call_cycles + _c_tile_port_cycles(
            tile_vecs, s.kc, cyc_k, load_k, tile_mix.stores, vload_rate, c.store_ports
        )
        call_cycles += _call_issue_cycles(tile_mix, tile_vecs, s.kc, cyc_k, hw)
        # a row whose last vector overhangs the tile stores it with a mask
        call_cycles += rows * _masked_store_extra_cycles(hw) * _row_end_masked(cols, lanes)
        # C fills queued in few L1 sets arise only while the window holds the next call (most
        # calls are too long for that: the sets are not counted then); the call's issue hides them
        in_window = _next_call_in_window(tile_mix, hw, s.kc)
        queued = 0.0
        if in_window > 0.0:
            work = s.kc * cyc_k + call_cycles
            queued = (_c_sweep_set_cycles(s, hw, rows, cols, share) - work) * in_window
        # all wait for the same in-order drain of the last call's C stores: the longest counts
        call_cycles += max(
            _c_store_miss_cycles(s, hw, rows, cols),
            _store_alias_cycles(s, hw, rows),
            queued,
            _b_after_c_store_cycles(s, hw, step),
        )
        # waits for C lines from afar, which the calls in flight wait for together; shared lines
        # the threads store at once wait in full
        in_flight = _calls_in_flight(tile_mix, hw, s.kc)
        shared = shared_wait * rows * -(-cols * isz // hw.cache(1).line_bytes)
        # the call prefetches its C tile this many cycles before it adds to it
        lead = s.c_prefetch_steps * step
        call_cycles += max(0.0, c_fetch - lead) / in_flight
        call_cycles += shared if lockstep else shared / in_flight
        compute_cycles += tiles * (s.K * step + share.k_blocks * call_cycles)
        load_cycles += tiles * s.K * load_k
    return compute_cycles + a_demand_miss_cycles(s, hw, share), load_cycles


def _row_end_masked(cols: int, lanes: int) -> bool:
    """Whether a tile row of ``cols`` columns stores its last vector with a lane mask: the
    vector overhangs the tile."""
    return last_vector_lanes_used(cols, lanes) < column_vector_widths(cols, lanes)[-1]


def _masked_store_extra_cycles(hw: HwSpec) -> float:
    """Cycles a full-width store with a lane mask takes beyond a plain store's slot, added whole:
    AVX2's masked store is microcoded on AMD cores (12-17 cycles each on a Zen 3 slice), and
    microcode holds the decoders, so nothing else issues beside it."""
    return max(0.0, hw.core.masked_store_cycles - 1.0 / hw.core.store_ports)


def a_demand_miss_cycles(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Cycles the thread waits for A's lines from memory when it reads A in place, its rows a page
    or more apart: each row's next line is met once per sweep down the block's rows, on a page of
    its own, as a demand miss; those overlap as far as the core keeps misses in flight, so each
    costs memory's latency over ``memory.misses_in_flight`` (a packed A waits in its copy instead,
    ``packing_cycles``). Under par=n both threads sweep all rows; each line comes from memory once,
    to whichever thread meets it first, so each waits for about its share. Only a plain A contiguous
    along k is priced (a transposed or gathered A is another walk), and only where a k block sweeps
    more rows than one tile's: a block one tile high walks its rows along k call after call, streams
    the prefetchers follow. A floor: on Zen 4 such kernels waited about twice this (README, "A read
    in place from DRAM"). Where calls step down the rows within the stride the prefetchers follow
    (``memory.far_prefetch_stride_bytes``, measured on lines from the last level), a visit of
    several lines to a row waited for its first line only on Zen 5 (A from DRAM ran as fast as A
    in the caches from two lines a visit on: README, stop 77); Zen 4, with no such stride
    measured, paid for every line. The sweeps that L2 does not keep (``_l2_sweeps``) wait for L3
    the same way, at its latency; under par=n that includes the lines the other thread brought
    from memory, since each thread's L2 is its own (README, stop 106: nc 32 against 512 timed
    6.1-9.1 ms apart on Emerald Rapids, 5.9 predicted)."""
    line = hw.cache(1).line_bytes
    plain = s.a_gather is None and s.a_sk == 1 and not s.a_shared
    if s.pack_a or not plain or s.a_sm * 4 < hw.memory.page_bytes or _a_rows_stream(s, share):
        return 0.0
    a_bytes = dram_bytes_by_tensor(s, hw, share)[0]
    own = share.m_share / s.M if s.par == "m" else 1.0 / share.threads
    waiting = 1.0
    if _calls_step_down_rows(s) and s.mr * s.a_sm * 4 <= hw.memory.far_prefetch_stride_bytes:
        waiting = min(1.0, line / (s.kc * 4))  # the rest of the visit comes ahead of it
    misses = waiting / line / hw.memory.misses_in_flight  # per byte
    cycles = a_bytes * own * misses * hw.memory.latency_cycles
    if len(hw.caches) >= 3:
        # the sweeps L2 does not keep come from L3: the same demand misses at its latency
        from_l3 = share.m_share * s.K * 4 * _l2_sweeps(s, hw, share)[0] - a_bytes * own
        cycles += max(0.0, from_l3) * misses * hw.cache(3).latency_cycles
    return cycles


def _a_rows_stream(s: CpuSchedule, share: ThreadShare) -> bool:
    """Whether a plain A, contiguous along k, has its rows walked along k as streams the
    prefetchers follow: a k block meets no more rows than one tile's (the block is one tile high
    and m is not innermost), so each row's next elements come call after call (or pack after
    pack), not once per sweep down the rows."""
    if s.a_gather is not None or s.a_sk != 1:
        return False
    swept_rows = share.m_share if s.order == "nkm" else min(s.mc, share.m_share)
    return swept_rows <= s.mr


def _vector_load_rate(hw: HwSpec) -> float:
    """Full-width vector loads the core issues per cycle."""
    c = hw.core
    return c.load_ports * min(1.0, c.load_width_bits / hw.isa.vector_bits)


def c_tile_port_cycles(s: CpuSchedule, hw: HwSpec) -> float:
    """What each call of a full mr x nr tile is charged for its C tile's loads and stores (0 where
    they fit in the ports' idle cycles): the term ``micro_kernel_cycles`` adds per call."""
    mix = mix_from_schedule(s, hw)
    cyc_k, load_k = _cycles_per_kstep(mix, hw, s.kc)
    tile_vecs = s.mr * -(-s.nr // s.lanes)
    return _c_tile_port_cycles(
        tile_vecs, s.kc, cyc_k, load_k, mix.stores, _vector_load_rate(hw), hw.core.store_ports
    )


def _c_tile_port_cycles(
    tile_vecs: int,
    kc: int,
    cyc_k: float,
    load_k: float,
    stores_k: float,
    vload_rate: float,
    store_ports: int,
) -> float:
    """Cycles a call's C tile loads and stores add: only what does not fit in the load and store
    ports' idle cycles during the call's k steps, where the reorder window issues them (an 8 x 16
    tile's 8 loads and 8 stores per call of 8 k steps, 64 FMA cycles, add nothing)."""
    busy = kc * cyc_k
    loads = max(0.0, kc * load_k + tile_vecs / vload_rate - busy)
    stores = max(0.0, (kc * stores_k + tile_vecs) / store_ports - busy)
    return loads + stores


def _call_issue_cycles(mix: KStepMix, tile_vecs: int, kc: int, cyc_k: float, hw: HwSpec) -> float:
    """Cycles a call's own instructions (its set-up, C tile loads and stores) add where they do
    not fit in the issue slots its k steps leave idle. ``core.call_cycles`` is measured on calls
    whose k steps leave room (FMA-bound tiles, 8 k steps); a call of one k step of a one-vector
    tile has almost none (Zen 5, depthwise NCHW, K = 9 in blocks of 8 and 1: about 8 cycles more
    per call of the one-step block, measured side by side with one block of 9)."""
    issue = hw.core.issue_width
    idle = kc * max(0.0, cyc_k * issue - mix.instructions)
    return max(0.0, CALL_INSTRUCTIONS + 2.0 * tile_vecs - idle) / issue


def _operand_elements(s: CpuSchedule) -> tuple[float, float]:
    """Elements per batch entry of A and B: a gathered operand (a convolution input) is smaller
    than its GEMM view, because its windows overlap."""
    a_elems = math.prod(s.a_gather.dims) / s.batch_count if s.a_gather else s.M * s.K
    b_elems = math.prod(s.b_gather.dims) / s.batch_count if s.b_gather else s.K * s.N
    return a_elems, b_elems


def traffic_bytes(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> tuple[float, float, float]:
    """(bytes into L1 from L2, into L2 from L3, from DRAM) of one batch entry: the thread's for
    the caches, all threads' for DRAM. The tiles right after a copy of B read what its stores
    left in L1 where the block fits there (``_packed_b_block_stays_in_l1``)."""
    isz = 4
    calls, m_share, n_share = share.calls, share.m_share, share.n_share
    mblocks = -(-m_share // s.mc)
    a_elems, b_elems = _operand_elements(s)
    # B micro-panel (kc x nr) is reused across the mr-row tiles of an mc block if it stays in L1;
    # unpacked B rows sit b_sk apart, so a power-of-two stride can map them onto few L1 sets, and
    # the lines those sets cannot keep beside the call's other lines come back from L2.
    b_thrash = 0.0 if s.pack_b else _l1_thrash_share(s, hw)
    b_reused = b_thrash < 1.0 and _panel_stays_in_l1(s, hw)
    # An A shared along the columns is read as nr-wide vectors, in place: a tile's overlapping
    # windows touch fewer distinct elements than (row, k) pairs.
    a_tile = s.nr * _distinct_share(s.a_gather, s.mr, s.kc) if s.a_shared and s.a_gather else 1.0
    # a call's mean depth: the last k block holds what is left of K (K = 9, kc = 8: 8 and 1)
    k_call = s.K / share.k_blocks
    a_bytes_l2 = calls * s.mr * k_call * a_tile * isz
    b_panels = calls if not b_reused else share.n_tiles * share.k_blocks * mblocks
    if b_reused and _reuse_bytes(s, share)[1] <= _panel_l1_room(hw):
        b_panels = share.n_tiles * share.k_blocks  # all of B the m blocks use stays in L1
    if b_reused:
        b_panels += b_thrash * (calls - b_panels)
    if _packed_b_block_stays_in_l1(s, hw, share):
        # the tiles right after a copy read the block its stores just left in L1
        b_panels = max(0.0, b_panels - share.n_tiles * share.k_blocks * _b_packs(s, share))
    b_bytes_l2 = b_panels * k_call * s.nr * isz
    c_bytes = calls * s.mr * s.nr * isz * 2
    if _c_stays_in_l1(s, hw, m_share, n_share):
        c_bytes = min(c_bytes, m_share * n_share * isz * 2)  # in once, out once
    l2_bytes = a_bytes_l2 + b_bytes_l2 + c_bytes
    # Into L2 from L3: A blocks once per n block, B panels once per m block, unless what the
    # thread touches between two uses stays in its L2 (a B copied in vectors: in its copy, not
    # here); C tiles every call unless what the calls between two visits of a tile touch stays in
    # L2 (under nkm, the whole C strip of an n block).
    a_sweeps, b_sweeps = _l2_sweeps(s, hw, share)
    a_bytes_l3 = m_share * s.K * isz * a_sweeps
    if s.a_gather and s.a_shared:
        # each element belongs to one column: the thread's rows of A, once
        a_bytes_l3 = a_elems * isz * m_share / s.M
    elif s.a_gather and s.pack_a:
        # packing gathers the window from the tensor: L3 serves each element once
        a_bytes_l3 = min(a_bytes_l3, a_elems * isz * m_share / s.M * a_sweeps)
    b_bytes_l3 = n_share * s.K * isz * b_sweeps
    if s.b_gather and s.pack_b:
        b_bytes_l3 = min(b_bytes_l3, b_elems * isz * n_share / s.N * b_sweeps)
    if s.b_pack_copies_vectors:
        b_bytes_l3 = 0.0  # only the copy reads B: ``packing`` prices it at its source's bandwidth
    c_in_l2 = _bytes_between_visits(s, m_share, n_share) <= hw.usable_bytes_per_core(2)
    c_l3 = m_share * n_share * isz * 2 if c_in_l2 else c_bytes
    l3_bytes = a_bytes_l3 + b_bytes_l3 + c_l3
    return l2_bytes, l3_bytes, dram_bytes_of(s, hw, share)


def _reuse_bytes(s: CpuSchedule, share: ThreadShare) -> tuple[float, float]:
    """(A's, B's) reuse distance: the bytes the thread touches between two uses of an element of
    A in consecutive n blocks (0 when m is outermost: A is used in one sweep) and of B in
    consecutive m blocks."""
    isz, m_share, n_share = 4, share.m_share, share.n_share
    a_block, c_block = s.mc * s.K * isz, s.mc * min(s.nc, n_share) * isz
    a_reuse = (m_share * s.K + s.K * s.nc + m_share * s.nc) * isz
    if s.order == "mkn":
        return 0.0, n_share * s.K * isz + a_block + s.mc * n_share * isz
    if s.order == "nmk":
        return a_reuse, s.K * s.nc * isz + a_block + c_block
    # nkm: a kc x nc panel of B serves the m blocks of its k block
    return a_reuse, (s.kc * s.nc + s.mc * s.kc) * isz + c_block


def _l2_sweeps(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> tuple[float, float]:
    """(times A, times B) of the thread's share come into its L2 from L3: again per n block (A,
    unless m is outermost) and per m block (B), unless the thread's data touched between two
    uses fits its L2 (a 4 KiB B of a 2048 x 16 x 64 matmul stays there over all 2048 m blocks).
    A comes again for each of the nr-column tiles that sweep its block (jr) where the block's
    lines overflow their L2 sets (``_a_block_l2_set_overflow``), and B for each of the mr-row
    tiles that sweep its micro-panel where the panel's do (``_b_panel_l2_set_overflow``)."""
    l2 = hw.usable_bytes_per_core(2)
    a_reuse, b_reuse = _reuse_bytes(s, share)
    a_sweeps: float = 1 if a_reuse <= l2 else -(-share.n_share // s.nc)
    uses = -(-share.n_share // s.nr)  # calls that read each element of A
    a_sweeps += (uses - a_sweeps) * _a_block_l2_set_overflow(s, hw, share)
    b_sweeps: float = -(-share.m_share // s.mc) if b_reuse > l2 else 1
    b_uses = -(-share.m_share // s.mr)  # calls that read each element of B
    b_sweeps += (b_uses - b_sweeps) * _b_panel_l2_set_overflow(s, hw)
    return a_sweeps, b_sweeps


# numpy advises transparent huge pages for arrays of this many bytes or more (numpy's alloc.c)
HUGE_PAGE_ARRAY_BYTES = 1 << 22


def _l2_sets_follow_addresses(hw: HwSpec, array_bytes: int) -> bool:
    """Whether an array of ``array_bytes`` read in place picks its L2 sets by its addresses: on
    a spec with L3 whose frames lie in address order (``memory.addresses_pick_l2_sets``), for an
    array large enough for numpy to ask for huge pages. Off it, the set bits above the page
    offset scatter: a C block crowds only its page offsets' sets (``_l2_set_overflow_share``),
    and A and B read in place are not taken to crowd any (on Zen 4, B read in place over rows
    16 KiB apart ran at 0.68-0.89 of the price that keeps it in L2, stop 108)."""
    if len(hw.caches) < 3 or not hw.memory.addresses_pick_l2_sets:
        return False
    return array_bytes >= HUGE_PAGE_ARRAY_BYTES


def _l2_set_overflow_share(
    hw: HwSpec, stride_bytes: int, rows: int, row_bytes: int, array_bytes: int
) -> float:
    """Share of the lines of rows ``stride_bytes`` apart (of an array of ``array_bytes``) beyond
    what their L2 sets keep (a spec with L3: the caller checks). Where the addresses pick the sets
    (``_l2_sets_follow_addresses``), they are the sets the addresses say; elsewhere the frames
    scatter the set bits above the page offset, but the offset still picks the rest: the lines
    at one page offset share the ways of all that offset's sets, taken as spread evenly over them
    (Zen 4, 1 MiB L2 of 8 ways: 256 lines an offset; 384 rows 16 KiB apart overflow them)."""
    l2 = hw.cache(2)
    sets, ways = _sets(l2), l2.conflict_slack * l2.associativity
    per_page = max(1, hw.memory.page_bytes // l2.line_bytes)
    if sets > per_page and not _l2_sets_follow_addresses(hw, array_bytes):
        sets, ways = per_page, ways * sets / per_page
    return _set_overflow_share(stride_bytes, rows, row_bytes, l2.line_bytes, sets, ways)


def _a_block_l2_set_overflow(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Share of the lines of an A block read in place (mc rows x kc) that miss L2 on each sweep
    by an nr-column tile: the block's lines in each L2 set, swept again in the same order, miss
    as ``cyclic_sweep_miss_share`` says once they outnumber the set's ways (under LRU, all of
    them). Rows a power of two apart crowd few sets (16 KiB apart, 8 of the 2048 that 128 KiB of
    addresses spans on Emerald Rapids). L2's set bits lie above the 4 KiB page offset, so
    addresses pick them only where the frames lie in address order
    (``memory.addresses_pick_l2_sets``), and are taken to do so only for an A of
    ``HUGE_PAGE_ARRAY_BYTES`` or more. 0 for a packed or gathered A, or a spec without L3."""
    if s.pack_a or s.a_gather is not None or s.a_sk != 1 or s.a_shared:
        return 0.0
    if not _l2_sets_follow_addresses(hw, _operand_elements(s)[0] * _batch_copies(s, 0) * 4):
        return 0.0
    l2, isz = hw.cache(2), 4
    rows = min(s.mc, share.m_share)
    per_set = np.array(_lines_per_set(s.a_sm * isz, rows, s.kc * isz, l2.line_bytes, _sets(l2)))
    if not per_set.size:
        return 0.0
    missed = per_set * cyclic_sweep_miss_share(per_set, l2.conflict_slack * l2.associativity, l2)
    return float(missed.sum() / per_set.sum())


def _b_panel_l2_set_overflow(s: CpuSchedule, hw: HwSpec) -> float:
    """Share of the lines of a B micro-panel read in place (kc rows x nr, b_sk apart) that miss
    L2 on each sweep by the next mr-row tile: as ``_a_block_l2_set_overflow`` for A's block, with
    the rows the micro-kernel prefetches past the panel (``b_prefetch_rows`` ahead: the same rows
    on every call) in the panel's sets beside it. Rows 16 KiB apart fill 8 L2 sets on Emerald
    Rapids; a kc of 96 with 75 rows prefetched puts 21 lines in each (README, stop 108). Taken
    to apply, as for A, only to a B of ``HUGE_PAGE_ARRAY_BYTES`` or more. 0 for a packed or
    gathered B, a spec without L3, or one whose frames scatter the rows."""
    if s.pack_b or s.b_gather is not None or s.b_sn != 1:
        return 0.0
    if not _l2_sets_follow_addresses(hw, _operand_elements(s)[1] * _batch_copies(s, 1) * 4):
        return 0.0
    l2, ahead = hw.cache(2), s.b_prefetch_rows
    # k steps 0..kc-1 prefetch rows ahead..kc+ahead-1: those from max(kc, ahead) on lie past
    # the panel, and only those inside B are fetched (the first k block's)
    first = max(s.kc, ahead)
    past = max(0, min(s.kc, ahead, s.K - first))
    return _panel_l2_overflow_share(
        s.b_sk * 4, s.kc, s.nr * 4, first, past, l2.line_bytes, _sets(l2), l2
    )


@functools.lru_cache(maxsize=4096)
def _panel_l2_overflow_share(
    stride: int,
    kc: int,
    row_bytes: int,
    first: int,
    past: int,
    line: int,
    sets: int,
    cache: CacheSpec,
) -> float:
    """``_b_panel_l2_set_overflow`` of a panel of ``kc`` rows with ``past`` rows from row
    ``first`` on prefetched beside it (cached: each estimate asks for it from two terms)."""
    panel = np.array(_lines_in_each_set(stride, 0, kc, row_bytes, line, sets), dtype=float)
    if not panel.any():
        return 0.0
    per_set = panel + np.array(_lines_in_each_set(stride, first, past, row_bytes, line, sets))
    share = cyclic_sweep_miss_share(per_set, cache.conflict_slack * cache.associativity, cache)
    return float((panel * share).sum() / panel.sum())


def cyclic_sweep_miss_share(lines: np.ndarray, ways: float, cache: CacheSpec) -> np.ndarray:
    """Share of ``lines`` lines of one set, swept again and again in the same order, that miss on
    each sweep, by the level's ``replacement`` policy. LRU evicts each line just before its reuse:
    all miss once they outnumber the ``ways``. Random eviction keeps a line through the m(n - 1/2)
    misses between its uses with chance (1 - 1/ways) each, so the miss share m solves
    m = 1 - (1 - 1/ways)^(m (n - 1/2)): 0 up to about the ways, 0.59 at 1.5x, 0.80 at 2x (the
    n - 1/2 matches a simulation of the policy from ways + 1 to 3x ways to 0.005 at 16 ways and
    0.01 at 8: the tests). One way evicts its one line either way."""
    n = np.asarray(lines, dtype=float)
    if cache.replacement == "lru" or ways <= 1:
        return (n > ways).astype(float)
    counts, where = np.unique(n, return_inverse=True)  # few distinct counts: solve each once
    keep = math.log1p(-1.0 / ways)
    lo, hi = np.zeros_like(counts), np.ones_like(counts)
    for _ in range(48):  # bisection: the root is the one m > 0 where the two sides cross
        mid = (lo + hi) / 2
        above = 1.0 - np.exp(keep * mid * np.maximum(counts - 0.5, 0.0)) > mid
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    return np.where(counts > ways, lo, 0.0)[where].reshape(n.shape)


def dram_bytes_of(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Bytes from DRAM of one batch entry, all threads (they share it): A's, B's and C's of
    ``dram_bytes_by_tensor``."""
    return sum(dram_bytes_by_tensor(s, hw, share))


def dram_bytes_by_tensor(
    s: CpuSchedule, hw: HwSpec, share: ThreadShare
) -> tuple[float, float, float]:
    """(A's, B's, C's) bytes from DRAM of one batch entry, all threads: each tensor once, C read
    and written, and again on each sweep of a loop that comes back to a tensor after more than the
    last level holds went through it in between (the reuse distance, all threads' data), less
    the capacity's worth the level keeps (``last_level_miss_share``).

    By order, outer to inner: A is swept again per n block unless m is outermost (mkn), with all
    of A, a B strip and a C strip in between; B per m block unless m is innermost (nkm): all of B
    (mkn) or its K x nc strip (nmk) in between, with an A strip; C per k block unless k is
    innermost (nmk): a C strip and a k slice of the other input in between. The whole working
    set, every batch entry's, staying in the last level from one call to the next costs nothing
    (measured on Zen 4: NHWC depthwise, 4.9 MB per call, ran in 85 us where DRAM bandwidth alone
    would take 122).
    """
    isz, levels = 4, len(hw.caches)
    llc = hw.cache(levels).size_kib * 1024 * hw.cache(levels).usable_fraction
    a_elems, b_elems = _operand_elements(s)
    a_all, b_all, c_all = a_elems * isz, b_elems * isz, s.M * s.N * isz
    copies = [_batch_copies(s, operand) for operand in range(3)]
    if a_all * copies[0] + b_all * copies[1] + c_all * copies[2] <= llc:
        return 0.0, 0.0, 0.0
    if a_all + b_all + c_all <= llc:
        # one entry's working set stays, all of them do not: each entry's tensors come once per
        # call, an operand every entry shares once for all of them
        nb = s.batch_count
        return a_all * copies[0] / nb, b_all * copies[1] / nb, 2 * c_all * copies[2] / nb
    threads, par_m = share.threads, s.par == "m"
    mblocks, nblocks = -(-share.m_share // s.mc), -(-share.n_share // s.nc)
    # all threads' pieces: data split by the parallel loop is one piece per thread
    a_strip = min(s.mc * s.K * isz * (threads if par_m else 1), a_all)  # mc rows of A
    b_strip = min(s.K * s.nc * isz * (1 if par_m else threads), b_all)  # nc columns of B
    c_rows = min(s.mc * s.N * isz * (threads if par_m else 1), c_all)  # mc rows of C
    c_cols = min(s.M * s.nc * isz * (1 if par_m else threads), c_all)  # nc columns of C
    c_block = min(s.mc * s.nc * isz * threads, c_all)
    k_share = min(1.0, s.kc / s.K)

    def sweeps(reuse_bytes: float, blocks: int) -> float:
        return 1 + (blocks - 1) * last_level_miss_share(reuse_bytes, llc)

    if s.order == "mkn":
        a = 1
        b = sweeps(b_all + a_strip + c_rows, mblocks)
        c = sweeps(c_rows + b_all * k_share, share.k_blocks)
    elif s.order == "nkm":
        a = sweeps(a_all + b_strip + c_cols, nblocks)
        b = 1
        c = sweeps(c_cols + a_all * k_share, share.k_blocks)
    else:  # nmk
        a = sweeps(a_all + b_strip + c_cols, nblocks)
        b = sweeps(b_strip + a_strip + c_block, mblocks)
        c = 1
    return a_all * a, b_all * b, 2 * c_all * c


def _batch_copies(s: CpuSchedule, operand: int) -> int:
    """Distinct copies of operand 0 (A), 1 (B) or 2 (C) over the batch entries: the extents of
    the batch loops it moves along (a zero stride shares it)."""
    copies = 1
    for extent, *strides in s.batch:
        copies *= extent if strides[operand] else 1
    return copies


def last_level_miss_share(reuse_bytes: float, capacity: float) -> float:
    """Share of a sweep over ``reuse_bytes`` that the last cache level, holding ``capacity`` of
    them, misses when the sweep comes back: its replacement keeps a capacity's worth of a sweep
    too large for it rather than evicting each line before its reuse as LRU would (Zen 4: B of a
    2048^3 matmul, 16 MiB against a 16 MiB share, repacked per row of A in 547 ms, where all of it
    from DRAM takes 969 ms of memory alone)."""
    return max(0.0, 1.0 - capacity / reuse_bytes) if reuse_bytes > 0 else 0.0


# instructions per element of an element-wise packing copy: index, load, store, loop step
PACK_INSTRUCTIONS_PER_ELEMENT = 4.0


def packing_cycles(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Cycles the thread spends copying A and B blocks into panels, one batch entry.

    A's copy is element-wise, one element per max(store slot, 4 issue slots) cycle or its wait per
    line, which rows walked along k as streams do not have (``_a_rows_stream``), nor rows the copy
    prefetches ahead (``a_pack_prefetch_rows``); a plain B's
    copies panel rows as vectors, at its source's bandwidth; a gathered operand pays its table
    loads and bounds checks per element, or, copied in contiguous runs, a vector per ``lanes``
    elements plus the run's set-up.
    """
    c, isz, lanes = hw.core, 4, s.lanes
    m_share, n_share, threads = share.m_share, share.n_share, share.threads
    nblocks = -(-n_share // s.nc)
    per_elem = max(1.0 / c.store_ports, PACK_INSTRUCTIONS_PER_ELEMENT / c.issue_width)
    cycles = 0.0
    if s.pack_a:
        packs = 1 if s.order == "mkn" else nblocks
        plain = per_elem  # rows that stream, or that the copy prefetches, wait for no line
        if not _a_rows_stream(s, share) and not s.a_pack_prefetch_rows:
            plain = _strided_pack_cycles_per_elem(
                hw,
                per_elem,
                s.kc if s.a_sk == 1 else 1,
                m_share * s.K * isz,
                packs,
                s.M * s.K * isz,
                threads,
                rows_in_flight=_pack_rows_in_flight(hw, min(s.mc, m_share), s.a_sm * isz),
            )
        per_a = _pack_cycles_per_elem(s.a_gather, s.a_pack_run, s.kc, hw, plain, lanes)
        cycles += m_share * s.K * packs * per_a
    if s.pack_b:
        packs = _b_packs(s, share)
        if s.b_pack_copies_vectors:
            source = _b_pack_source_bytes(s, share)
            per_b = _vector_pack_cycles_per_elem(s, hw, source, threads, share)
        else:
            plain = _strided_pack_cycles_per_elem(
                hw,
                per_elem,
                s.nr if s.b_sn == 1 else 1,
                n_share * s.K * isz,
                packs,
                s.K * s.N * isz,
                threads,
            )
            per_b = (
                _row_run_pack_cycles_per_elem(s, hw)
                if s.b_pack_run > 1
                else _pack_cycles_per_elem(s.b_gather, 1, s.nr, hw, plain, lanes)
            )
        cycles += n_share * s.K * packs * per_b
    return cycles


def pad_copy_cycles(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Cycles of the zero-padded copy of the input, once per call (not per batch entry), before
    the kernel: each thread copies the rows its share reads (about its part; one buffer's worth
    of lines in all), or all of them where every thread reads all of them (a buffer's worth
    each); a load and a store per vector, or the lines read at the bandwidth of the level that
    holds input and buffers, whichever is slower: the input, and each buffer line, which a store
    reads for ownership first (its write-back later takes the write path, which runs beside the
    reads)."""
    if s.pad_copy is None:
        return 0.0
    elems = math.prod(s.pad_copy.shape)
    source, buffer = elems * 4, s.pad_copy.elems * 4
    buffers = share.threads if s.pad_copy_per_thread else 1
    level = _level_holding(source + buffer * buffers, hw, share.threads)
    bandwidth = (  # a core's own path into its caches; DRAM's is shared by the copying threads
        hw.cache(level).bandwidth_bytes_per_cycle
        if level is not None
        else hw.memory.bandwidth_gbs / hw.core.frequency_ghz / share.threads
    )
    cycles = max(elems * 2.0 / s.lanes, (source + buffer) / bandwidth)
    return cycles / (1 if s.pad_copy_per_thread else share.threads)


def epilogue_cycles(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Cycles of the fused epilogue of one batch entry: a few vector operations per output
    vector, once, split over the threads."""
    return s.M * s.N / s.lanes * _epilogue_ops(s) / hw.core.issue_width / share.threads


def _panel_stays_in_l1(s: CpuSchedule, hw: HwSpec) -> bool:
    """Whether the kc x nr B micro-panel survives in L1 from one call to the next.

    Each call also brings new lines of A and C, and rows of both sit a power of two apart often
    enough to land in the panel's sets; with LRU the panel's lines, touched once per call, are then
    the oldest and go first. A panel taking more than PANEL_L1_SHARE of L1 is refetched from L2 on
    every call (seen on Zen 4: a 1 x 192 tile with kc=32, a 24 KiB panel, ran at half the predicted
    speed, L2-bound; with kc=24, an 18 KiB panel, at FMA speed).
    """
    return s.kc * s.nr * 4 <= _panel_l1_room(hw)


PANEL_L1_SHARE = 0.7


def _panel_l1_room(hw: HwSpec) -> float:
    """Bytes of L1 that B's panels keep from one use to the next (``PANEL_L1_SHARE`` of it)."""
    return PANEL_L1_SHARE * hw.cache(1).size_kib * 1024


def _packed_b_block_stays_in_l1(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> bool:
    """Whether the kc x nc block of B a copy writes (the thread's columns, in whole tiles) is
    still in L1 when the tiles after the copy first read each of its panels: the block, with the
    A block and the C tiles the m block's tiles touch before the last panel's turn, fits the
    share of L1 a panel keeps. Zen 4, NCHW depthwise (each panel serves one tile), one thread:
    64-column blocks ran at 0.70x the time of 4096-column ones, the L2 read of B that the old
    price charged both."""
    cols = -(-min(s.nc, share.n_share) // s.nr) * s.nr
    rows = min(s.mc, share.m_share)
    touched = (s.kc * cols + rows * s.kc + rows * cols) * 4
    return s.pack_b and touched <= _panel_l1_room(hw)


def _with_split_loads(mix: KStepMix, s: CpuSchedule, hw: HwSpec) -> KStepMix:
    """Charge an unpacked B's vector loads for their pieces that straddle two cache lines.

    Packed panels and line-aligned rows are read whole, but rows ``b_sk`` elements apart start at
    offsets that cycle through multiples of gcd(row bytes, line) (N = 1000: every other row starts
    mid-line). A load port serves a vector in pieces of its width, and only a piece across a line
    boundary takes a second access (Zen 4, 256-bit ports: 512-bit loads at line offset 0 or 32 ran
    at 0.96 per cycle, at 4, 16, 48 or 60 at 0.60; 256-bit loads at 0-32 at 1.9, at 48 or 60 at
    0.97). Of pieces ``w`` bytes wide at offsets that are multiples of ``g``, (w - g) / line start
    close enough to a line's end to cross it; each costs one piece's access, ``w / vector`` of a
    vector load, and a vector is ``vector / w`` pieces: ``share`` extra vector loads per vector.
    """
    line = hw.cache(1).line_bytes
    if s.pack_b or s.a_shared or s.b_sn != 1 or (s.b_sk * 4) % line == 0:
        return mix
    piece = min(hw.isa.vector_bits, hw.core.load_width_bits) // 8
    share = max(0, piece - math.gcd(s.b_sk * 4, line)) / line
    extra = -(-s.nr // s.lanes) * share
    return dataclasses.replace(mix, vector_loads=mix.vector_loads + extra)


def _strided_pack_cycles_per_elem(
    hw: HwSpec,
    per_elem: float,
    segment: int,
    share_bytes: int,
    packs: int,
    tensor_bytes: int,
    threads: int,
    rows_in_flight: float = 1.0,
) -> float:
    """Cycles per element of a plain packing copy, which walks its source one panel row (``segment``
    contiguous elements) at a time, a whole operand row apart.

    The prefetchers do not follow dozens of short rows a page apart, so each row waits for its
    line from where the source lives: narrow panels pay that latency over few elements (measured
    on Zen 4 from L3: ~3 cycles per element for 16-wide panels, ~1 for 64-wide). A segment
    shorter than a line shares it with the next k block's (or, walked across a transposed
    operand, the next row's), which finds it cached: the wait is per line. Repacked
    blocks come from the level that holds the thread's whole share of the operand (it was all
    swept in between); a block packed once per call comes from where the tensor lives. Where
    that level, or the last where none holds it, does not keep swept lines
    (``CacheSpec.keeps_swept_lines``), the copy waits at least as long as the share of the sweep
    L2 does not keep takes at memory's parallel pace (Emerald Rapids, A's copy timed against A
    read in place, A of 4-16 MiB: 1.8-2.0 cycles an element at 3.94 GHz for kc 16-128, memory's
    292 cycles over 12.4 lines in flight at 2.88; its L3's latency says 0.7).
    """
    source = share_bytes if packs > 1 else tensor_bytes
    level = _level_holding(source, hw, threads if source == tensor_bytes else 1)
    # where no level holds it, the last level's: streamed rows are prefetched, not waited for
    at = level if level is not None else hw.caches[-1].level
    in_flight = max(segment, hw.cache(1).line_bytes // 4) * rows_in_flight  # elements
    wait = hw.cache(at).latency_cycles / in_flight
    if not hw.keeps_swept_lines(at):
        # L2 keeps a capacity's worth of the sweep; the rest comes from memory, lines in flight
        lost = last_level_miss_share(source, _usable_bytes(hw, 2))
        kept = (1 - lost) * hw.cache(2).latency_cycles / in_flight
        wait = max(wait, kept + lost * _memory_parallel_cycles_per_elem(hw))
    return max(per_elem, wait)


def _memory_parallel_cycles_per_elem(hw: HwSpec) -> float:
    """Cycles per element of a copy whose lines come from memory: ``memory.misses_in_flight``
    lines on their way at a time, each over memory's latency."""
    return 4.0 * hw.memory.latency_cycles / (hw.memory.misses_in_flight * hw.cache(1).line_bytes)


def _pack_rows_in_flight(hw: HwSpec, rows: int, stride_bytes: int) -> float:
    """Rows of an A block's packing copy whose line misses overlap: its loads are independent, so
    as many as the core keeps misses in flight (Zen 5, 384 x 16 blocks of rows 3840 B apart:
    1x16 and 4x16 kernels ran 2-34 cycles a call slower packed than in place, where a wait per
    row said 50-200). Rows a page or more apart are left to a wait each: they crowd one L1 set
    and each needs its own translation, and the kept samples disagree with the overlap there."""
    if stride_bytes >= hw.memory.page_bytes:
        return 1.0
    return max(1.0, min(float(rows), hw.memory.misses_in_flight))


def _b_packs(s: CpuSchedule, share: ThreadShare) -> int:
    """Times the thread packs each block of B: once (nkm), else once per m block."""
    return 1 if s.order == "nkm" else -(-share.m_share // s.mc)


def _b_pack_source_bytes(s: CpuSchedule, share: ThreadShare) -> float:
    """Bytes a B pack reads from: the thread's share of B where it packs each block again (it
    swept all of it in between), else the whole tensor."""
    return share.n_share * s.K * 4 if _b_packs(s, share) > 1 else s.K * s.N * 4


def _b_pack_readers(s: CpuSchedule, source_bytes: float, threads: int) -> int:
    """Threads that read a B pack's source: all of them where it is the whole tensor (held once
    in a level they share), else the thread alone."""
    return threads if source_bytes == s.K * s.N * 4 else 1


def b_pack_source_level(s: CpuSchedule, hw: HwSpec) -> int | None:
    """The cache level a vector copy of B's panels reads from, as ``packing_cycles`` prices it
    (None: beyond the last); ``hw calibrate``'s copy probe sizes B by it."""
    share = ThreadShare.of(s)
    source = _b_pack_source_bytes(s, share)
    return _level_holding(source, hw, _b_pack_readers(s, source, share.threads))


def _vector_pack_cycles_per_elem(
    s: CpuSchedule, hw: HwSpec, source_bytes: float, threads: int, share: ThreadShare
) -> float:
    """Cycles per element of a B pack that copies panel rows as vectors (``b_pack_copies_vectors``).

    Few instructions per line keep many lines in flight, so the copy streams at a share of the
    bandwidth of the level its source comes from (DRAM's is shared by the threads, which all pack
    at once), not at one latency per line as the element-wise copy did (Zen 4, B from L3: ~0.25
    cycles per element, 16-wide panels, where the element-wise copy took 0.85-3). A panel row
    needs a translation where it meets a new page (every row a page or more apart; at N = 1000,
    rows 4000 bytes apart, nearly every row: on Zen 4 repacking per 26 rows of A took 1.49x the
    time of packing per 130, 1.24x charged from whole-page strides only), and a panel whose rows
    span more pages than the DTLB holds evicts its own pages before the next panel, over the
    same rows, comes back to them; a shallower block's rows keep theirs to the next pack over
    them only if the pages touched in between fit too (``_pages_between_b_packs``), else each
    pack pays one miss per row (on Zen 3, 2 x 24 tiles over rows 4 KiB apart, kc = 64, 64 DTLB
    entries: packing ~0.3 of the time, 0.15 predicted); where they outrun the second-level TLB
    too, the share it cannot keep walks (``stlb_reach``). Rows a whole number of L1 ways apart
    also crowd the panel's lines into few sets (``_b_copy_set_refill_cycles_per_elem``); the
    bandwidth, that set's refills and a translation per row overlap as waits of the same rows
    (Zen 4, 16-wide panels over rows 8 KiB apart, kc = 320: 0.62 cycles an element, where the
    translation added to the bandwidth said 0.92).
    """
    isz = 4
    readers = _b_pack_readers(s, source_bytes, threads)
    level = _level_holding(source_bytes, hw, readers)
    last = hw.caches[-1]
    if level is None:  # the last level keeps its capacity's worth; the rest from DRAM
        miss = last_level_miss_share(source_bytes, _usable_bytes(hw, last.level, readers))
        dram = hw.memory.bandwidth_gbs / hw.core.frequency_ghz / threads
        per_byte = ((1 - miss) / last.bandwidth_bytes_per_cycle + miss / dram) / (
            last.copy_bandwidth_share
        )
    else:
        per_byte = 1 / (
            hw.cache(level).copy_bandwidth_share * hw.cache(level).bandwidth_bytes_per_cycle
        )
    per_elem = max(1.0 / (hw.core.store_ports * s.lanes), isz * per_byte)
    new_page = new_page_per_row(s.b_sk * isz, hw)
    between = _pages_between_b_packs(s, hw, share)
    row_elems = min(s.nc, share.n_share)  # of a block's row: what one translation serves
    translation = 0.0  # per element, where a panel's rows outrun the DTLB
    if s.kc * new_page > hw.memory.dtlb_entries:
        translation = hw.memory.tlb_miss_cycles * new_page / s.nr
    elif between > hw.memory.dtlb_entries:
        per_elem += hw.memory.tlb_miss_cycles * new_page / row_elems
    # a panel row's lines, its set's refills and its translation are waits of one row: they overlap
    per_elem = _overlapped_terms([per_elem, _b_copy_set_refill_cycles_per_elem(s, hw), translation])
    # as ``_page_walk_cycles`` charges the micro-kernel's rows
    walked = last_level_miss_share(between, stlb_reach(hw, s.b_sk * isz))
    per_elem += walked * hw.memory.page_walk_cycles * new_page / row_elems
    return per_elem


def _b_copy_set_refill_cycles_per_elem(s: CpuSchedule, hw: HwSpec) -> float:
    """Cycles per element at which L1 takes a B copy's source lines where they crowd its sets:
    the copy walks a panel down its kc rows, so rows a whole number of L1 ways apart put every
    line of a panel column in one set, and one set takes its refills ``memory.set_refill_cycles``
    apart, first touches as refetches (Zen 4, rows 4 KiB apart: 9.0 cycles a line for one-line
    panel rows, where rows 4224 bytes apart took 4.4-4.7). A panel row's lines spread over the
    sets they fall in, and a line's refill serves its elements (a row narrower than a line leaves
    the rest to the next panel, not timed)."""
    line, isz = hw.cache(1).line_bytes, 4
    total = _sets(hw.cache(1))
    sets = _panel_sets(s.b_sk * isz, s.kc, s.nr * isz, line, total)
    # the misses in flight reach the next panels, whose lines sit in the next sets
    panel_lines = s.kc * _b_row_lines(s, hw)
    sets = min(total, sets * max(1.0, hw.memory.misses_in_flight / panel_lines))
    return hw.memory.set_refill_cycles / sets * isz / line


def _pages_between_b_packs(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> int:
    """Pages touched from one pack of B's rows (one page each) to the next pack over the same
    rows: mkn and nkm pack the same k block again for the next n block, after the A and C rows
    of an m block (mkn) or of the thread's share (nkm); nmk packs every k block in between."""
    page, isz = hw.memory.page_bytes, 4

    def pages(rows: int, stride: int, row_bytes: int) -> int:
        if stride * isz >= page:
            return rows
        return -(-(rows * stride * isz + row_bytes) // page)

    rows = share.m_share if s.order == "nkm" else min(s.mc, share.m_share)
    b_rows = s.K if s.order == "nmk" else s.kc
    a = -(-rows * s.kc * isz // page) if s.pack_a else pages(rows, s.a_sm, s.kc * isz)
    c = pages(rows, s.c_sm, s.nc * isz)
    return b_rows + a + c + -(-s.kc * s.nc * isz // page)


def _level_holding(nbytes: float, hw: HwSpec, readers: int = 1) -> int | None:
    """The nearest cache level beyond L1 whose usable share per core holds ``nbytes`` (None: none
    does). Data that ``readers`` threads all read sits once in a level they share, so it gets the
    shares of as many of them as share the level (B read whole by both threads of a par=m
    kernel)."""
    for level in range(2, len(hw.caches) + 1):
        if nbytes <= _usable_bytes(hw, level, readers):
            return level
    return None


def _usable_bytes(hw: HwSpec, level: int, readers: int = 1) -> float:
    """Bytes of cache ``level`` that data ``readers`` threads all read may claim: the usable
    share per core, times as many of those threads as share the level."""
    return hw.usable_bytes_per_core(level) * min(readers, hw.cache(level).shared_by_cores)


def _pack_cycles_per_elem(
    gather: Gather | None, run: int, panel: int, hw: HwSpec, plain: float, lanes: int
) -> float:
    """Cycles per packed element: a strided copy, a table gather with bounds checks, or contiguous
    runs of ``run`` elements copied as vectors, ``panel`` elements (nr columns of B, kc of A) at a
    time, so a run that a panel boundary cuts is two runs."""
    if gather is None:
        return plain
    issue = hw.core.issue_width
    if run > 1:
        return 2.0 / lanes + (
            RUN_SETUP_INSTRUCTIONS + 4.0 * len(gather.guarded)
        ) / issue / _effective_run(run, panel)
    return max(plain, (6.0 + 4.0 * len(gather.guarded)) / issue)


# Instructions to start one copied run of a gathered A (a window's channels): offset-table loads,
# the run's bounds, and the entry and exit of LLVM's vectorised copy loop with its remainder.
# Fitted on Zen 4 (~8 cycles per run, NCHW depthwise pixel runs, which no longer use it); not
# re-measured on A's channel runs.
RUN_SETUP_INSTRUCTIONS = 48.0

# Instructions of B's pixel-row copy (``pack_b_runs_fn``), counted in its x86 assembly: per masked
# vector (the tail mask, load, store, loop step), more per vector where the lanes are checked
# against the image's width, per k row of a piece (table loads, pointers, loop), per guard checked
# once per row (table load, add, compare), and per piece (its bounds and its rows' pointers).
ROW_RUN_VECTOR_INSTRUCTIONS = 8.0
ROW_RUN_LANE_GUARD_INSTRUCTIONS = 5.0
ROW_RUN_ROW_INSTRUCTIONS = 7.0
ROW_RUN_GUARD_INSTRUCTIONS = 4.0
ROW_RUN_PIECE_INSTRUCTIONS = 45.0


def _row_run_pack_cycles_per_elem(s: CpuSchedule, hw: HwSpec) -> float:
    """Cycles per element of B's pack when it copies runs of pixels (NCHW, stride 1): each piece
    of a run that a panel holds is copied down the block's k rows as masked vectors, at the issue
    width, and a piece that ends in a partial vector stores it with a mask."""
    g = s.b_gather
    assert g is not None
    elems, vectors, masked = _run_pieces(s.b_pack_run, s.nr, s.lanes)
    lane_guarded = g.lane_guard_dim is not None
    row_guards = len(g.guarded) - lane_guarded
    per_vector = ROW_RUN_VECTOR_INSTRUCTIONS + ROW_RUN_LANE_GUARD_INSTRUCTIONS * lane_guarded
    per_row = (
        vectors * per_vector
        + ROW_RUN_ROW_INSTRUCTIONS
        + ROW_RUN_GUARD_INSTRUCTIONS * row_guards
        + ROW_RUN_PIECE_INSTRUCTIONS / _mean_k_block(s)
    )
    # a piece's last vector, where partial, is a masked store
    return (per_row / hw.core.issue_width + masked * _masked_store_extra_cycles(hw)) / elems


def _mean_k_block(s: CpuSchedule) -> float:
    """k rows per k block on average: K = 9 in blocks of kc = 8 is two blocks, 4.5 rows each, so
    what a block sets up once (a copied piece's bounds) is paid per 4.5 rows, not per 8."""
    return s.K / -(-s.K // s.kc)


@functools.lru_cache(maxsize=512)
def _run_pieces(run: int, panel: int, lanes: int) -> tuple[float, float, float]:
    """(elements, vectors of ``lanes``, partial last vectors) per copied piece, on average, when
    panels of ``panel`` elements, starting at multiples of ``panel``, are cut at multiples of
    ``run``."""
    lengths: list[int] = []
    for start in range(0, run * panel // math.gcd(run, panel), panel):
        pos, end = start, start + panel
        while pos < end:
            cut = min(end, (pos // run + 1) * run)
            lengths.append(cut - pos)
            pos = cut
    n = len(lengths)
    return (
        sum(lengths) / n,
        sum(-(-k // lanes) for k in lengths) / n,
        sum(k % lanes != 0 for k in lengths) / n,
    )


def _effective_run(run: int, panel: int) -> float:
    """Mean elements per copied piece when panels of ``panel`` elements, starting at multiples of
    ``panel``, are cut at multiples of ``run`` (64-wide panels of 112-element rows: ~45)."""
    return _run_pieces(run, panel, 1)[0]


@functools.lru_cache(maxsize=512)
def _distinct_share(gather: Gather, mr: int, kc: int) -> float:
    """Distinct elements per (row, k) pair in the first mr x kc tile of a gathered operand (1 when
    no two pairs read the same element; 1/3 for the rows of a 3-wide window at stride 1)."""
    row_off, k_off, _ = gather.tables()
    tile = row_off[:mr, None] + k_off[None, :kc]
    return np.unique(tile).size / tile.size


def _epilogue_ops(s: CpuSchedule) -> float:
    """Vector instructions per output vector in the fused epilogue, as codegen emits them: exp is
    18 (clamp, range reduction, degree-6 polynomial, 2^n), sigmoid 3 more, gelu 12 more."""
    return (1.0 if s.bias else 0.0) + {"none": 0.0, "relu": 1.0, "sigmoid": 21.0, "gelu": 30.0}[
        s.activation
    ]


def _tile_classes(m_extent: int, n_extent: int, mr: int, nr: int) -> list[tuple[int, int, int]]:
    """(number of tiles, rows, columns) for the full register tiles and the m/n tail tiles.

    Tail tiles run their own micro-kernel variant with fewer accumulators, so they are charged by
    their real size rather than as full tiles.
    """
    m_full, m_tail = divmod(m_extent, mr)
    n_full, n_tail = divmod(n_extent, nr)
    classes = [
        (m_full * n_full, mr, nr),
        (m_full * (n_tail > 0), mr, n_tail),
        ((m_tail > 0) * n_full, m_tail, nr),
        (int(m_tail > 0 and n_tail > 0), m_tail, n_tail),
    ]
    return [cl for cl in classes if cl[0] > 0]


def _tail_mix(mix: KStepMix, s: CpuSchedule, rows: int, cols: int, hw: HwSpec) -> KStepMix:
    """The full tile's k-step mix scaled to a rows x cols tail tile (FMAs by tile, loads by side).

    FMAs and loads are counted in full-vector equivalents: a column tail's narrower last vector
    (``column_vector_widths``) takes fewer pipe slots where the pipes are narrower than a vector.
    Rows that mix full vectors with a narrow one also count their FMA instructions, which
    ``core.mixed_width_fma_cycles`` may make the bound instead.
    """
    if rows == s.mr and cols == s.nr:
        return mix

    def slot_ratio(pipe_bits: int) -> float:
        return _vector_slots(cols, s.lanes, pipe_bits) / _vector_slots(s.nr, s.lanes, pipe_bits)

    fma_ratio, load_ratio = slot_ratio(hw.core.fma_width_bits), slot_ratio(hw.core.load_width_bits)
    widths = column_vector_widths(cols, s.lanes)
    insn_ratio = len(widths) / len(column_vector_widths(s.nr, s.lanes))
    row_ratio = rows / s.mr
    vloads = mix.vector_loads  # scaled to the tail's columns at the end
    sloads = mix.scalar_loads * row_ratio
    if s.a_shared:  # A's vector loads shrink with the rows too, B's do not; the table load stays
        a_part = mix.vector_loads * s.mr / (s.mr + 1)
        vloads = mix.vector_loads - a_part + a_part * row_ratio
        sloads = mix.scalar_loads
    # one prefetch per line of the tail's B row
    lines = b_row_prefetches(s, cols) / max(1, b_row_prefetches(s, s.nr))
    prefetches = mix.prefetches * lines
    loads = mix.vector_loads + mix.scalar_loads + mix.prefetches
    other = max(0.0, mix.instructions - mix.fma - loads)
    instructions = (mix.fma * row_ratio + vloads) * insn_ratio + sloads + prefetches + other
    mixed = mix.fma * row_ratio * insn_ratio if len(widths) > 1 and widths[-1] < s.lanes else 0.0
    return KStepMix(
        mix.fma * row_ratio * fma_ratio,
        vloads * load_ratio,
        sloads,
        mix.stores,
        mix.spills,
        instructions,
        mixed,
        prefetches,
        mix.stack_round_trips,
    )


def _vector_slots(cols: int, lanes: int, pipe_bits: int) -> int:
    """Pipe slots of one operation on each vector across ``cols`` columns (a 512-bit vector takes
    two slots of a 256-bit pipe, a 4-lane tail vector one)."""
    return sum(-(-w * 32 // pipe_bits) for w in column_vector_widths(cols, lanes))


def _conflict_miss_cycles(s: CpuSchedule, hw: HwSpec, m_share: int, mix: KStepMix) -> float:
    """Extra cycles per k step when an unpacked operand's micro-panel is not in L1.

    - B is one strided stream (a new row every k step). A panel swept again by the next mr-row tile,
      in the same order, keeps none of the lines of an L1 set they overflow (LRU), and each such set
      refetches its lines one after another, at its measured pace for one-line rows (else an L2
      round trip apart), the panel's sets side by side (measured on Zen 4 at 2048^3, 7 x 16 tiles,
      kc=24, rows 8 KiB apart, all in one set: met by one call 105-137 GFLOP/s, swept by 10 calls
      62-90). Rows met for the first time, on the first call of each sweep over the mr-row tiles,
      are independent loads many k steps ahead in the reorder window, so their misses overlap (a 9 x
      16 tile that never reuses its panel, at a 2 or 4 KiB stride, ran at FMA speed, 176-206
      GFLOP/s), but no faster than their sets take refills (``memory.set_refill_cycles``, where
      measured), for rows of one line or less: met once by each call, those of one set wait one
      refill apart, first touches and rows evicted by the rows ahead alike (Zen 3 slice, rows 4 and
      8 KiB apart, 1 x 8, 5 x 8, 5 x 16 and 6 x 16 tiles: 8.2-11.7 cycles per k step, the probe 9.8;
      4160 bytes apart 3.3-7.6). A panel in one set swept again by the next tiles refills at the
      same pace, the probe's own sweep; one over several sets keeps its L2 round trip, which it was
      measured nearer to (README, stop 64). Rows of more lines met for the first time wait for a
      refill of each of their sets at least, the sets side by side (two lines took 12.8-13.8 there,
      three 15.8, four 13.5; 2 x 24 to 4 x 24 tiles met by one call, 1.1-1.2x the floor's
      prediction, 1.5-2.1x without it: README, stop 67); evicted by the rows ahead, they wait an L2
      round trip. Strides within ``memory.prefetch_stride_bytes`` are prefetched by the hardware;
      rows the micro-kernel prefetches itself (``b_prefetch_rows``) arrive before their first touch,
      leaving only the transfer (N=1000, 192-row panels met once: 188-208 GFLOP/s prefetched,
      105-155 without). Where the panel's L2 sets cannot keep it with the rows prefetched past it
      (``_b_panel_l2_set_overflow``), that share of its lines comes from L3 at each touch, first or
      swept, or again after the rows ahead evicted it, and one set's pace stretches by L3's latency
      over L2's for them (Emerald Rapids, 8 x 16 tiles, rows 16 KiB apart, kc 128: met once per call
      29.2 ms, swept by 2, 4 and 21 calls 30.3, 30.6 and 26.5; README, stop 109).
    - A is mr sequential streams, which the stream prefetcher follows within a page, so only rows a
      page or more apart pay: per line, or per broadcast when the rows' lines thrash one set. Those
      broadcasts refill one set, one after another; the k steps whose FMAs wait in the schedulers
      overlap theirs (Zen 4, 12 to 28 rows 4 KiB apart, 16 columns, kc = 32: 25, 47, 76, 115 and 161
      cycles per k step measured, 22, 44, 75, 113 and 159 predicted). Rows whose lines fall in
      several sets refill each set in turn, the sets side by side (rows 4.5 pages apart, two sets:
      28 rows ran 2.25x faster than 4 pages apart, stop 102). The refills come an L2 round trip
      apart where the set's pace is not measured, or does not hold for them (Zen 4), at that pace
      where it is: Golden Cove's, at most 4 cycles, ran tall tiles at 0.37-0.45 of the round trips'
      prediction (Emerald Rapids, kept samples of 2026-12-02; tested). Zen 5's (7.7 against a round
      trip of 14) predicts the Zen 5 tiles below at 15.1, 25.0 and 46.6 cycles a k step with B in
      place (round trips: 19.5, 38.3, 77.6), 11.6-46.9 with B packed (16.6-79.2): 0-27% under where
      the round trips were 6-47% over. Where a spec says the pace holds only for refetched B rows
      (``memory.set_refill_beyond_refetches`` false: Zen 4), first touches and A's broadcasts wait
      as on a spec without a pace.
    - The two wait side by side, in their own sets: they overlap as the k step's issue and its
      misses do (``_miss_overlap_power``), not one after the other (Zen 5 slice, 1024^3, one
      thread, kc = 64, A in place: 16 x 16 to 28 x 16 tiles ran 15.1, 26.0 and 64.1 cycles a k
      step with B in place, rows in one set, and 15.6, 30.1 and 63.3 with B packed).
    Packing exists to avoid all of this.
    """
    line, isz, page = hw.cache(1).line_bytes, 4, hw.memory.page_bytes
    l2 = _l1_refill_level(hw)
    b_extra = a_extra = 0.0
    b_stride, a_stride = s.b_sk * isz, s.a_sm * isz
    shared = _shared_set_miss_fraction(s, hw)
    # k steps whose loads the reorder window holds at once: their misses overlap
    rows_in_flight = max(1.0, hw.core.reorder_window / max(mix.instructions, 1.0))
    # k steps whose FMAs the schedulers hold waiting (dispatch stops when they are full)
    held = hw.core.scheduler_entries / max(mix.fma, 1.0)
    # how far apart one L1 set takes its refills (0: not measured): B's one-line rows refetched
    # keep it, first touches and A's broadcasts where the spec says it holds for them too
    refill = hw.memory.set_refill_cycles
    beyond = refill if hw.memory.set_refill_beyond_refetches else 0.0
    if b_rows_fetched_by_the_loop(s, hw):
        row_lines = _b_row_lines(s, hw)
        transfer = row_lines * line / l2.bandwidth_bytes_per_cycle
        sweeps = _sweep_calls(s, m_share)
        if sweeps > 1:
            # swept again call after call in the same order, a panel loses the lines its sets
            # cannot keep beside the call's other lines, and all of them where A's rows join them
            thrash = _swept_thrash_share(s, hw, shared)
        else:
            # met by one call only, rows are evicted only by the rows fetched ahead of them: those
            # of the k steps the schedulers hold
            live = min(s.kc, math.ceil(min(rows_in_flight, held)))
            thrash = _l1_miss_fraction(b_stride, live, s.nr * isz, hw)
        first_touch = (1.0 - thrash) / sweeps
        tlb = hw.memory.tlb_miss_cycles if b_stride >= page else 0
        # a thrashing set refetches its lines one L2 round trip after another; the panel's
        # sets do so side by side, so a k step waits for its row's lines over those sets
        sets = _panel_sets(b_stride, s.kc, s.nr * isz, line, _sets(hw.cache(1)))
        side_by_side = min(sets / row_lines, rows_in_flight)  # rows whose refetches overlap
        # one set refills at its own pace, met once or swept; a swept panel over several sets, and
        # a row of several lines evicted by the rows ahead, refetch an L2 round trip apart
        one_line_pace = refill > 0 and row_lines == 1 and (sweeps == 1 or sets == 1)
        refetch = refill if one_line_pace else l2.latency_cycles
        first_pace = beyond
        if len(hw.caches) >= 3:
            # the lines L2's sets cannot keep either come from L3, as many at once as from L2
            # (the set's pace is its fills in flight: each takes L3's latency then)
            overflow = _b_panel_l2_set_overflow(s, hw)
            # first touches too: rows prefetched into crowded L2 sets are gone when loaded (a
            # spec without a measured pace keeps its L2 floor: none that picks sets lacks one)
            first_pace = beyond * _from_l3_stretch(hw, overflow)
            if thrash > 0:
                # swept, L2's losses fall among L1's misses; evicted by the rows ahead of a
                # panel met once, a line is lost in L2 as any of the panel's is
                lost = min(thrash, overflow) / thrash if sweeps > 1 else overflow
                refetch *= _from_l3_stretch(hw, lost)
        if not _swept_rows_refill_in_l1(s, hw, m_share):
            b_extra += thrash * max(refetch / side_by_side, transfer)
        # prefetched into L1, a row is there at its first touch; into L2, it waits for L2 only
        if s.b_prefetch_rows:
            wait = 0.0 if s.b_prefetch_level == 1 else l2.latency_cycles / rows_in_flight
        else:
            wait = (l2.latency_cycles + tlb) / rows_in_flight
        # each of the panel's sets takes its share of a row's lines at its own pace, whatever
        # the row's length: a floor for first touches
        b_extra += first_touch * max(wait, first_pace / side_by_side, transfer)
    if not s.pack_a and a_stride >= page:
        # mr rows' current lines all in few sets: if they cannot coexist, every broadcast misses;
        # otherwise only the lines beyond the sets' claim are lost across calls. B's set group
        # takes A's lines only where A's rows are a whole number of pages apart too: rows a page
        # and a line apart each fall in a set of their own
        joins_b = a_stride % page == 0
        thrash = max(_l1_miss_fraction(a_stride, s.mr, isz, hw), shared if joins_b else 0.0)
        if thrash > 0:
            # a k step's misses refill each set in turn, at the set's measured pace (else an L2
            # round trip each), the sets side by side; those of the k steps whose FMAs the
            # schedulers hold (and the window reaches) overlap, bound by the lines' transfer
            transfer = s.mr * line / l2.bandwidth_bytes_per_cycle
            steps_waiting = max(1.0, min(rows_in_flight, held))
            pace = beyond if beyond > 0 else l2.latency_cycles
            sets = 1 if joins_b else _overflowing_sets(a_stride, s.mr, isz, hw)
            a_extra = thrash * max(transfer, s.mr / sets * pace / steps_waiting)
        else:
            # swept again, the panel loses only its lines beyond its sets' claim, refetched an L2
            # round trip each (rows a page and a line or two apart, 7-10 x 8 tiles on Zen 3 ran
            # at 0.68-0.92 of a prediction that charged every line: README, stop 123)
            lost = _l1_miss_fraction(a_stride, s.mr, s.kc * isz, hw)
            a_extra = lost * s.mr * isz / line * l2.latency_cycles
    return _overlapped_terms((b_extra, a_extra), _miss_overlap_power(s, hw))


def _swept_rows_refill_in_l1(s: CpuSchedule, hw: HwSpec, m_share: int) -> bool:
    """Whether the unpacked B panel's refills are priced per line (``_swept_row_refill_cycles``):
    swept again by the next calls, rows of two or more lines that the loop alone fetches, each
    column of lines in one L1 set (rows a whole number of ways apart), on a spec that measured
    what such a line costs."""
    if hw.memory.swept_line_refill_cycles <= 0 or not b_rows_fetched_by_the_loop(s, hw):
        return False
    row_lines = _b_row_lines(s, hw)
    if row_lines == 1 or _sweep_calls(s, m_share) == 1:
        return False
    line = hw.cache(1).line_bytes
    return _panel_sets(s.b_sk * 4, s.kc, s.nr * 4, line, _sets(hw.cache(1))) == row_lines


def _swept_row_refill_cycles(s: CpuSchedule, hw: HwSpec, m_share: int) -> float:
    """Cycles a k step adds to its issue for its B row's lines refilled into L1 where
    ``_swept_rows_refill_in_l1``: each line the sweep loses costs
    ``memory.swept_line_refill_cycles``, added, not overlapped (Emerald Rapids, 256 x 1024 x
    1024, one-row tiles 32-128 columns wide, kc 64, swept by 256 calls: rows of 2-8 lines 4 KiB
    apart ran 1.3-1.5 cycles a line more per k step than rows 4160 bytes apart; the probe, 1.48).
    The share of them that L2's crowded sets lose too (``_b_panel_l2_set_overflow``) comes from
    L3, stretched by its latency over L2's, as a set's refill pace is in
    ``_conflict_miss_cycles`` (the two such samples of stop 110: 1.07x and 1.16x their times;
    2.1x and 2.6x with a round trip a row)."""
    if not _swept_rows_refill_in_l1(s, hw, m_share):
        return 0.0
    thrash = _swept_thrash_share(s, hw, _shared_set_miss_fraction(s, hw))
    cost = hw.memory.swept_line_refill_cycles
    if len(hw.caches) >= 3:
        cost *= _from_l3_stretch(hw, min(thrash, _b_panel_l2_set_overflow(s, hw)) / thrash)
    return thrash * _b_row_lines(s, hw) * cost


def _with_swept_refills(step: float, refills: float, hw: HwSpec) -> float:
    """A k step of ``step`` cycles with its swept B row's refills (``_swept_row_refill_cycles``):
    added, less ``memory.swept_line_refill_overlap`` of the shorter of the two, the share the
    core runs them beside the step's other work (Zen 5: 0.98, the set-refill probe's busy rows;
    1 x 224 tiles over rows 16 KiB apart took 31.5-33.8 cycles a k step, about their 14 lines'
    refills alone, where rows spread over the sets took 12.5-13.4: README, stop 125; Emerald
    Rapids' kernels: 0)."""
    return step + refills - hw.memory.swept_line_refill_overlap * min(step, refills)


def _b_row_lines(s: CpuSchedule, hw: HwSpec) -> int:
    """L1 lines one row of a B micro-panel (nr floats) spans."""
    return -(-s.nr * 4 // hw.cache(1).line_bytes)


def _swept_thrash_share(s: CpuSchedule, hw: HwSpec, shared: float) -> float:
    """Share of an unpacked B panel's lines that L1 loses when the next call sweeps it again:
    all of them where A's rows join its sets (``shared``, ``_shared_set_miss_fraction``, above
    0), else those its sets cannot keep."""
    return 1.0 if shared > 0 else _l1_thrash_share(s, hw)


def _from_l3_stretch(hw: HwSpec, lost: float) -> float:
    """How much longer an L1 set's refills take where ``lost`` of their lines come from L3
    (L2's crowded sets lost them): those wait L3's latency where the rest wait L2's."""
    return 1.0 + lost * (hw.cache(3).latency_cycles / hw.cache(2).latency_cycles - 1.0)


def _sweep_calls(s: CpuSchedule, m_share: int) -> int:
    """Calls that read one B micro-panel in turn: the mr-row tiles of an mc block."""
    return -(-min(s.mc, m_share) // s.mr)


def _dtlb_miss_cycles(s: CpuSchedule, hw: HwSpec, m_share: int) -> float:
    """Extra cycles per k step when an unpacked B micro-panel spans more pages than the first-level
    data TLB holds, paid on the first call of each sweep over the mr-row tiles.

    A fresh panel's rows each need a translation from the second-level TLB, one after another,
    and these do not hide under the FMAs the way the rows' cache misses do (measured on Zen 4 at
    N=1000, each row on its own page: panels of 128-192 rows met once per call ran at 70-135
    GFLOP/s where the FMAs allow 175; panels of <= 48 rows, or 96-128 rows reused by 5 or more
    calls, at 150-190). Software prefetches take their translations early too, so a micro-kernel
    that prefetches its B rows pays none of this.
    """
    if s.pack_b or s.a_shared or s.b_prefetch_rows:
        return 0.0
    rows_per_page = max(1, hw.memory.page_bytes // (s.b_sk * 4))
    if -(-s.kc // rows_per_page) <= hw.memory.dtlb_entries:
        return 0.0
    return hw.memory.tlb_miss_cycles / rows_per_page / _sweep_calls(s, m_share)


def _page_walk_cycles(s: CpuSchedule, hw: HwSpec, m_share: int, n_share: int) -> float:
    """Cycles per k step that plain unpacked B rows a page or more apart add where a sweep over
    a panel comes back to its rows after more pages than the second-level TLB holds: the first
    call of each sweep walks the page tables for every row again (``memory.page_walk_cycles``),
    prefetched or not, on top of the k step's issue (the part beyond its wait for the rows'
    refills: ``micro_kernel_cycles``). Between two sweeps come the rows of every
    k block (nmk, mkn) or of the panel's own (nkm), each over the pages its block's columns span
    (mkn: the thread's whole width, its n blocks come in between). Zen 3 slice, 6 x 16 tiles,
    one call per panel over 2048 rows 4032 bytes apart: 10.6-11.1 cycles per k step against 6
    FMA cycles, prefetched 64 rows ahead or not at all. Only the first of the column tiles swept
    back to back over the same k rows to meet a row's page walks for it
    (``_page_meeting_tile_share``); the tiles after it find the translation still in the TLB,
    unless their k rows' pages alone outgrow its reach."""
    page, stride = hw.memory.page_bytes, s.b_sk * 4
    if s.pack_b or s.a_shared or s.b_gather is not None:
        return 0.0
    rows = s.kc if s.order == "nkm" else s.K
    cols = n_share if s.order == "mkn" else min(s.nc, n_share)
    new_page = new_page_per_row(stride, hw)
    row_pages = -(-cols * 4 // page)
    pages = rows * (new_page if stride < page else row_pages)
    # the TLB keeps its reach's worth of a sweep too large for it (as the last cache level does)
    missed = last_level_miss_share(pages, stlb_reach(hw, stride, row_pages))
    walks = missed * hw.memory.page_walk_cycles * new_page / _sweep_calls(s, m_share)
    first = _page_meeting_tile_share(cols, s.nr, page)
    later = last_level_miss_share(s.kc * new_page, stlb_reach(hw, stride))
    return walks * (first + (1.0 - first) * later)


def _page_meeting_tile_share(cols: int, nr: int, page_bytes: int) -> float:
    """Share of the nr-wide tiles over ``cols`` columns of the same k rows (a block's; under
    mkn, the thread's whole width, its n blocks back to back) that each row's page walks fall
    to: the pages a row's columns span, rows starting at any offset in a page, over the tiles;
    at most one a tile, as a panel one tile wide is charged."""
    tiles = -(-cols // nr)
    return min(1.0, (1.0 + (cols * 4 - 4) / page_bytes) / tiles)


def new_page_per_row(stride_bytes: int, hw: HwSpec) -> float:
    """How often a walk down rows ``stride_bytes`` apart meets a new page: every row a page or
    more apart, else once per page's worth of rows (they share pages)."""
    return min(1.0, stride_bytes / hw.memory.page_bytes)


def stlb_reach(hw: HwSpec, stride_bytes: int, row_pages: int = 1) -> float:
    """Pages a walk over rows ``stride_bytes`` apart, ``row_pages`` consecutive pages each,
    keeps in the second-level TLB: its sets are indexed by the page number, so rows a power of
    two pages apart use that share of them, or more where each row spans several pages (Zen 3
    slice: rows 1, 2 and 4 pages apart walked beyond about 2048, 1024 and 512 rows; 8 pages
    apart, 512 rows still did not)."""
    entries = hw.memory.stlb_entries
    apart = max(1, stride_bytes // hw.memory.page_bytes)
    return min(entries, entries / math.gcd(apart, entries) * max(1, row_pages))


def _c_line_pair_sharing(s: CpuSchedule, hw: HwSpec, ranges: Sequence[tuple[int, int]]) -> float:
    """Share of the slowest thread's C lines that sit in a 128-byte line pair another thread also
    writes, when the threads split the rows' contiguous axis (par=n): where a thread's columns, or
    a row, end in the middle of one. The L2 fetches the other line of a pair beside an access that
    missed L1, so such a line moves between the cores on the visits that miss L1, at its own
    price beyond L2 (``shared_pair_shares``). Measured on Zen 4: NHWC depthwise with 32 channels
    split 16 + 16 per thread (every pair shared) ran at 29-36 GFLOP/s where the model without
    this said 46-56; split by pixels, 63-86.
    """
    return _c_granule_sharing(s, ranges, 2 * hw.cache(1).line_bytes, hw.cache(1).line_bytes)


def _c_line_sharing(s: CpuSchedule, hw: HwSpec, ranges: Sequence[tuple[int, int]]) -> float:
    """Share of the slowest thread's C lines another thread also writes (par=n, a thread's
    columns or a row ending mid-line): such a line moves between the cores on every visit, in L2
    or not (Zen 5, 7x7 NCHW convolutions, 49-float rows split by two threads: 35-90 cycles more
    per shared line stored, whatever the tile and the calls in flight)."""
    line = hw.cache(1).line_bytes
    return _c_granule_sharing(s, ranges, line, line)


def _threads_store_shared_lines_at_once(s: CpuSchedule, share: ThreadShare) -> bool:
    """Whether the threads store the C lines they share at the same time (par=n): each covers its
    columns with one call per row block, of as many vectors as the others', so they go down the
    rows together and every shared line moves at each visit, which calls in flight cannot
    overlap. Zen 5, cycles more per shared line stored than the model without sharing said,
    whatever the calls in flight (1.4-10): 7x7 NCHW convolutions, 49-float rows as 32 + 17
    columns, 35-90; NHWC depthwise, 32 channels as 16 + 16, 30-49. That is the price with the
    vCPUs far apart (hand-over 170-190 ns); timed near (35-45 ns) the same lines cost 0-9. The
    placement is decided at run time, so the model prices the far one (README, stop 73); on
    Zen 4 ``hw calibrate``'s probe read 20-91 cycles a line, 51.5 kept
    (``shared_line_store_cycles``)."""
    if s.par != "n" or share.threads < 2:
        return False
    widths = {-(-(hi - lo) // s.lanes) for lo, hi in share.ranges}
    return share.n_tiles == 1 and len(widths) == 1


def shared_lines_contended_share(
    s: CpuSchedule, hw: HwSpec, mix: KStepMix, share: ThreadShare
) -> float:
    """Share of the charged (widest) thread's run during which a thread it shares C lines with
    still runs (par=n): a thread given fewer columns finishes first, and from then on the lines
    they share stay with the slower one. A run is the thread's tiles per row block, each its k
    steps at their own bound, a call and its masked row ends; the neighbours are those in column
    order, the last beside the first through the rows' ends, the longer of the two taken (an
    approximation where three or more threads split the rows). Zen 4 slice, 8 x 48 tiles, kc 8:
    48 columns beside 16 ran 240-320 cycles a call, beside 48 480-590 (README, stop 120)."""
    if s.par != "n" or share.threads < 2:
        return 1.0

    def run_cycles(width: int) -> float:
        full, tail = divmod(width, s.nr)
        cycles = 0.0
        for tiles, cols in ((full, s.nr), (int(tail > 0), tail)):
            if tiles:
                step = _cycles_per_kstep(_tail_mix(mix, s, s.mr, cols, hw), hw, s.kc)[0]
                masked = _row_end_masked(cols, s.lanes)
                call = hw.core.call_cycles + s.mr * _masked_store_extra_cycles(hw) * masked
                cycles += tiles * (s.kc * step + call)
        return cycles

    runs = [run_cycles(hi - lo) for lo, hi in share.ranges]
    threads = len(runs)
    return max(
        min(1.0, max(runs[(i - 1) % threads], runs[(i + 1) % threads]) / runs[i])
        for i, (lo, hi) in enumerate(share.ranges)
        if hi - lo == share.n_share  # the charged thread: par=n's share is the widest range
    )


def _shared_line_wait_cycles(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Cycles per C tile row-line that the lines another thread writes add to a visit: each line
    both write waits ``shared_line_store_cycles`` (``shared_line_share`` of them); each line
    whose pair's other line the other writes (``shared_pair_shares``) waits
    ``shared_pair_store_cycles`` beside a miss beyond L2 it takes anyway, and a shared line's
    price where it comes back from the other core instead of from L2."""
    line_price = shared_line_store_cycles(hw)
    beyond_l2, from_l2 = shared_pair_shares(s, hw, share)
    line = line_price * (shared_line_share(s, hw, share) + from_l2)
    return line + shared_pair_store_cycles(hw) * beyond_l2


def shared_line_share(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Share of a C tile row's lines the other core writes too: such a line comes back for the
    store on every visit. None where the threads meet those lines only at their runs' ends
    (``_threads_meet_shared_lines_once``)."""
    if _threads_meet_shared_lines_once(s, share):
        return 0.0
    return _c_line_sharing(s, hw, share.ranges)


def shared_pair_shares(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> tuple[float, float]:
    """Shares of a C tile row's lines, per visit, whose 128-byte pair's other line the other
    core writes, (on visits whose lines come from beyond L2, on visits that would find them in
    L2): the L2 fetches a pair's other line beside a miss and takes it from the other core,
    whose next visit then misses too. Of the visits from beyond L1
    (``_c_visits_from_beyond_l1``) the first comes from beyond L2, the others from L2 where the
    C block stays there between visits (``_c_block_stays_in_l2``). Zen 4 slice, one-line tiles
    per thread against the rows split, one k block, C beyond L2: the probe's runs read 16.5-17.9
    cycles a line in the slow mode, 1.6-2.0 in the fast one (README, stop 121)."""
    if _threads_meet_shared_lines_once(s, share):
        return 0.0, 0.0
    line_shared = _c_line_sharing(s, hw, share.ranges)
    pair_shared = _c_line_pair_sharing(s, hw, share.ranges) - line_shared
    if pair_shared <= 0.0:
        return 0.0, 0.0
    visits = _c_visits_from_beyond_l1(s, hw, share)
    again = visits - 1.0 / share.k_blocks  # the later visits from beyond L1
    in_l2 = len(hw.caches) >= 2 and _c_block_stays_in_l2(s, hw, share.m_share, share.n_share)
    from_l2 = again if in_l2 else 0.0
    return pair_shared * (visits - from_l2), pair_shared * from_l2


def shared_line_store_cycles(hw: HwSpec) -> float:
    """What a visit's store of a C line the other core wrote since waits: the spec's measured
    ``memory.shared_line_store_cycles`` (``hw calibrate``'s shared-line probe), else the last
    level's latency (stop 73's price, which Zen 5's timings with the vCPUs far apart bore out)."""
    measured = hw.memory.shared_line_store_cycles
    return measured if measured > 0 else float(hw.caches[-1].latency_cycles)


def shared_pair_store_cycles(hw: HwSpec) -> float:
    """What a visit's store of a C line from beyond L2 waits where the other core wrote the
    other line of its pair since: the spec's measured ``memory.shared_pair_store_cycles``
    (``hw calibrate``'s line-pair probe), else what a line both cores write waits (the price
    before stop 121)."""
    measured = hw.memory.shared_pair_store_cycles
    return measured if measured > 0 else shared_line_store_cycles(hw)


def _threads_meet_shared_lines_once(s: CpuSchedule, share: ThreadShare) -> bool:
    """Whether the C lines two threads share (par=n) move between the cores once a run rather
    than on every visit: the column blocks are the outermost loop and every thread has more than
    one, so a thread meets its first columns at the start of its run and its last at the end,
    and the neighbour's shared line is written before or after, never in between. Zen 4 slice,
    128x1000x4032, 4 x 80 tiles, kc = 8, six and seven 80-column blocks (rows and the split
    end mid-line): column blocks outermost, two threads ran 1.87x one thread; row blocks
    outermost (each block sweeps the columns, the neighbours meet on every sweep), 1.32x."""
    narrowest = min(hi - lo for lo, hi in share.ranges)
    return s.par == "n" and share.threads > 1 and s.order[0] == "n" and narrowest > s.nc


def _c_granule_sharing(
    s: CpuSchedule, ranges: Sequence[tuple[int, int]], granule: int, line: int
) -> float:
    """Share of the slowest thread's C lines in a ``granule`` of bytes another thread also writes
    when the threads split the rows' contiguous axis (par=n)."""
    threads = len(ranges)
    if s.par != "n" or threads < 2:
        return 0.0
    isz = 4
    ends = [hi for _, hi in ranges]  # the last one is the row's end
    period = granule // math.gcd(s.N * isz, granule)  # rows after which the offsets repeat
    mid = sum(((r * s.N + end) * isz) % granule != 0 for r in range(period) for end in ends)
    widest = max(hi - lo for lo, hi in ranges)
    return min(1.0, mid / period * 2 / threads / -(-widest * isz // line))


def _c_store_miss_cycles(s: CpuSchedule, hw: HwSpec, rows: int, cols: int) -> float:
    """Extra cycles per call when the C tile's rows evict each other from L1 before they are stored.

    C rows sit c_sm apart; at a power-of-two stride more rows than the L1 ways land in one set, so
    the rows the call loads last evict the first ones before their sums are stored. Each such
    store misses to L2 (which holds what L1 just held, wherever C lived between visits), and
    where its fill must evict one of the tile's dirty lines it first writes that back: two L2
    round trips, in series because stores commit in order, and the next call waits for them
    (measured on Zen 4, packed operands, one thread, 1024 or 4096 columns against 1040 or 4112:
    12, 16-17 and 19 rows cost 86-91, 150-280 and 200-350 cycles a call more, at kc = 8 to 128
    and with the C block in L2 or L3). Unpacked B rows in the same sets give the fills clean
    victims, one round trip each. The tile's rows have all the set's ways (the packed panels
    spread over every set; ``usable_fraction`` is a tile's claim on the whole cache): on Zen 5,
    12 to 24 rows at kc = 8 cost 6-263 cycles a call more, 0-336 predicted that way, 64-396 with
    the claim (README, stop 72). Where a set's fills with dirty victims were measured quicker
    than the two round trips (``memory.dirty_set_refill_cycles``: Emerald Rapids 14.1 against
    32), a dirty line takes that: tiles of 14-30 rows x 16 there were priced 1.1-1.8x their
    times with two round trips, 0.9-1.3x with the pace (README, stop 110).
    """
    if s.K <= s.kc:
        return 0.0  # each tile is visited once; its cold misses are memory traffic
    l1, isz = hw.cache(1), 4
    ways = l1.conflict_slack * l1.associativity
    miss = _l1_miss_fraction(s.c_sm * isz, rows, cols * isz, hw, capacity=ways)
    if miss == 0.0:
        return 0.0
    lines = -(-cols * isz // l1.line_bytes)
    missed = miss * rows  # per line column of the tile
    clean = s.kc if _b_rows_share_c_sets(s, hw) else 0
    dirty = max(0.0, missed - clean)
    trip = _l1_refill_level(hw).latency_cycles
    # a dirty victim's write-back and the refill: two round trips in series at most, the set's
    # measured pace for such fills where quicker (the write-back overlaps the refill)
    return ((missed - dirty) * trip + dirty * min(dirty_fill_cycles(hw), 2.0 * trip)) * lines


def _c_sweep_set_cycles(
    s: CpuSchedule, hw: HwSpec, rows: int, cols: int, share: ThreadShare
) -> float:
    """Cycles a call's C fills wait in line where the calls' sweep down C's rows crowds few L1 sets.

    Rows a power of two apart fall into few sets (one at a 4 KiB stride), so each fill of a call's
    C line must first evict a line that an earlier call stored there: a refill and a write-back
    per line, and the fills of one set in series, of different sets side by side. Per call that
    is its share of lines per swept set at two round trips each; the call's own issue hides it
    where it is longer, and it arises only as far as the window holds the next call, whose C
    loads then issue early (``micro_kernel_cycles``). Measured on Zen 5, packed operands, one
    thread, C in L2 or L3: 4 and 8 rows at kc = 8 took 25-31 cycles a call more per row at a 4 or
    8 KiB stride than one vector further apart, 12 at 2 KiB, none at 1 KiB; at kc = 32 (the window
    holds 1.3 calls) 1-5. Where ``memory.dirty_set_refill_cycles`` is measured, a line takes that
    instead of the two round trips (Golden Cove's took about one: README, stop 92). The first k
    block loads no C.
    """
    if s.K <= s.kc or not _calls_step_down_rows(s):
        return 0.0
    l1, isz = hw.cache(1), 4
    line, sets = l1.line_bytes, _sets(l1)
    block_rows, block_cols = _c_block(s, share.m_share, share.n_share)
    stride, row_bytes = s.c_sm * isz, cols * isz
    if _c_stays_in_l1(s, hw, share.m_share, share.n_share) and (
        _l1_miss_fraction(stride, block_rows, block_cols * isz, hw) == 0.0
    ):
        return 0.0  # the lines are still in L1 when the tile comes back
    swept = _panel_sets(stride, min(block_rows, sets), row_bytes, line, sets)
    lines = rows * -(-row_bytes // line)
    kt = -(-s.K // s.kc)
    return lines / swept * dirty_fill_cycles(hw) * (kt - 1) / kt


def dirty_fill_cycles(hw: HwSpec) -> float:
    """Cycles one L1 set takes per fill that must first write back a dirty line: the measured
    pace, else a refill and a write-back in series, an L2 round trip each."""
    measured = hw.memory.dirty_set_refill_cycles
    return measured if measured > 0 else 2.0 * _l1_refill_level(hw).latency_cycles


def _b_rows_share_c_sets(s: CpuSchedule, hw: HwSpec) -> bool:
    """Whether a call's unpacked B rows fall into the L1 sets of its C tile's rows.

    With both row strides a whole number of L1 ways (size / associativity, at most a page, so
    that the set bits are page-offset bits) and the operands at one offset within a way (large
    buffers start on a page boundary), B[k, j] and C[i, j] fall into the same set.
    """
    if s.pack_b or s.a_shared or s.b_sk <= 0:
        return False
    l1, isz = hw.cache(1), 4
    way = _sets(l1) * l1.line_bytes  # bytes that map onto every set once
    return way <= hw.memory.page_bytes and not (s.b_sk * isz) % way and not (s.c_sm * isz) % way


def _c_evicted_by_b_cycles(s: CpuSchedule, hw: HwSpec, rows: int, cols: int, m_share: int) -> float:
    """Cycles per call a C tile waits when an unpacked B's fresh rows stream through its L1 sets.

    Where B[k, j] and C[i, j] fall into the same set (``_b_rows_share_c_sets``), a call's C
    loads depend on nothing, so they issue early, and the kc B rows that stream through the set
    behind them evict those lines before the call adds and stores them: each store waits
    for its line from L2 (on Zen 4 at N=1024 against N=1008, kc=8, one thread:
    7 x 16 tiles 12.3 against 7.7 cycles per k step, 9 x 16 17.7 against 9.8; 9 x 16 with
    kc = 16, 24, 32: 13.6, 12.1, 12.2 against 9.5-9.6, where B's own misses hide part of it).
    A panel that later calls read again is in L1 already and brings no new lines (4 x 96 tiles
    at kc = 8 swept by 192 calls: no slower than predicted without this term). C's rows beyond
    the set's capacity on their own are ``_c_store_miss_cycles``'; the first k block loads no C.
    """
    if s.K <= s.kc or _sweep_calls(s, m_share) > 1 or not _b_rows_share_c_sets(s, hw):
        return 0.0
    l1, isz = hw.cache(1), 4
    capacity = l1.conflict_slack * l1.associativity  # lines, not a share a tile may claim
    evicted = min(rows, max(0.0, rows + s.kc - capacity)) - max(0.0, rows - capacity)
    lines = -(-cols * isz // l1.line_bytes)
    kt = -(-s.K // s.kc)
    return evicted * lines * _l1_refill_level(hw).latency_cycles / 2 * (kt - 1) / kt


def _store_alias_cycles(s: CpuSchedule, hw: HwSpec, rows: int) -> float:
    """Cycles a call's C loads wait behind the last call's C stores they match in the page-offset
    bits, when the calls step down C's rows: ``core.store_alias_cycles`` per aliasing pair
    (``aliasing_row_pairs``). The first k block loads no C."""
    if s.K <= s.kc or not _calls_step_down_rows(s):
        return 0.0
    pairs = aliasing_row_pairs(rows, s.mr, s.c_sm * 4, hw.memory.page_bytes)
    kt = -(-s.K // s.kc)
    return pairs * hw.core.store_alias_cycles * (kt - 1) / kt


def _b_after_c_store_cycles(s: CpuSchedule, hw: HwSpec, step: float) -> float:
    """Cycles a call waits when its B loads match the last call's C stores in the page-offset
    bits (``_b_loads_alias_c_stores``): a load waits for such a store to commit, so calls no
    longer overlap. The call's FMA chain beyond its issue, and one L2 round trip, are then on
    the path: a sweep's C lines, evicted by B's rows streaming through their sets since the
    last visit, or the fresh B rows of a call that follows the same tile. A floor: tiles of more
    C lines waited more (README, stop 72)."""
    if not _b_loads_alias_c_stores(s, hw):
        return 0.0
    chain = s.kc * hw.core.fma_latency_cycles
    return max(0.0, chain - s.kc * step) + _l1_refill_level(hw).latency_cycles


def _b_loads_alias_c_stores(s: CpuSchedule, hw: HwSpec) -> bool:
    """Whether a call's unpacked B rows match the last call's C stores in the page-offset bits:
    both row strides are whole pages (large buffers start at one offset within a page, so
    B[k, j] and C[i, j] then share those bits) and the call reads the columns the last one
    stored: it steps down C's rows, or follows the same tile into the next k block."""
    page = hw.memory.page_bytes
    if s.pack_b or s.a_shared or s.b_sk <= 0 or (s.b_sk * 4) % page or (s.c_sm * 4) % page:
        return False
    return _calls_step_down_rows(s) or (s.mc <= s.mr and s.nc <= s.nr and s.order[-1] == "k")


def aliasing_row_pairs(rows: int, mr: int, stride_bytes: int, page_bytes: int) -> int:
    """(load row, store row) pairs a whole number of pages apart, between a tile of ``rows`` rows
    and the ``mr``-row tile just above it, rows ``stride_bytes`` apart: the store queue compares
    only the page-offset bits before translation, so each such load waits on each such store
    (rows x mr pairs at a 4 KiB stride, none at 4160 bytes)."""
    period = page_bytes // math.gcd(stride_bytes, page_bytes)  # row distances that alias
    pairs = 0
    for dist in range(period, mr + rows, period):  # load row i, store row l: dist = mr + i - l
        pairs += max(0, min(rows - 1, dist - 1) - max(0, dist - mr) + 1)
    return pairs


def _c_block(s: CpuSchedule, m_share: int, n_share: int) -> tuple[int, int]:
    """Rows and columns of C touched between two visits of one C tile: the loops inside the k-block
    loop."""
    inner = s.order[s.order.index("k") + 1 :]
    return (m_share if "m" in inner else s.mc), (n_share if "n" in inner else s.nc)


def _bytes_between_visits(s: CpuSchedule, m_share: int, n_share: int) -> int:
    """Bytes the calls between two visits of one C tile touch: the C block (``_c_block``) and the
    A rows and B columns of its k block."""
    rows, cols = _c_block(s, m_share, n_share)
    return (rows * cols + rows * s.kc + s.kc * cols) * 4


def _c_stays_in_l1(s: CpuSchedule, hw: HwSpec, m_share: int, n_share: int) -> bool:
    """Whether a C tile is still in L1 when its next k block comes: the C block, A and B lines
    the calls in between touch fit in L1's usable share."""
    between = _bytes_between_visits(s, m_share, n_share)
    return between <= hw.cache(1).size_kib * 1024 * hw.cache(1).usable_fraction


def _l1_refill_level(hw: HwSpec) -> CacheSpec:
    """The level L1 misses refill from: L2, or L1 itself on a spec with one cache level."""
    return hw.caches[min(1, len(hw.caches) - 1)]


def _sets(cache: CacheSpec) -> int:
    """Number of sets of a cache level."""
    return max(1, cache.size_kib * 1024 // (cache.line_bytes * cache.associativity))


def _c_tile_fetch_cycles(s: CpuSchedule, hw: HwSpec, m_share: int, n_share: int) -> float:
    """Extra cycles per call waiting for the C tile when it comes from beyond L2.

    Calls walk down the rows (``_calls_step_down_rows``), so each C load steps ``mr`` rows from the
    last call's; beyond the stride the hardware prefetcher follows, each call's C lines are demand
    misses, and the call's end waits for them (the same whether C is loaded before the k steps or
    added after them: the window does not reach far enough ahead to hide it) (measured on Zen 4,
    2048^3, 7 x 16 tiles, kc=24: a C block of 70 x 672 floats in L2 ran at 62-90 GFLOP/s, one of
    1743 x 672 in L3 at 46-56). The first k block starts from zero and loads no C. The caller
    divides this by the calls in flight: calls of a few k steps each (kc = 8) overlap their waits
    (1 x 32 tiles over a 1024 x 32 C block, 4 KiB rows: ~26 cycles per call in all, measured).
    """
    if (
        s.K <= s.kc
        or not _calls_step_down_rows(s)
        or s.mr * s.c_sm * 4 <= hw.memory.prefetch_stride_bytes
        or len(hw.caches) < 3
    ):
        return 0.0
    if _c_block_stays_in_l2(s, hw, m_share, n_share):
        return 0.0  # mostly in L2, whose latency hides under the call's independent loads
    kt = -(-s.K // s.kc)
    return _c_tile_wait_cycles(s, hw) * (kt - 1) / kt


def _c_block_stays_in_l2(s: CpuSchedule, hw: HwSpec, m_share: int, n_share: int) -> bool:
    """Whether a C tile is still in L2 when its next k block comes: the A and B lines of the
    calls in between pass through L2 too, and so do the panels the packs of the next k block
    write (every order packs between two visits); rows a power of two apart use few L2 sets (by
    page offset where the frames scatter): a block that fits L2 by size may still not stay
    (checked only for blocks that fit by size, which bounds the lines counted)."""
    rows, cols = _c_block(s, m_share, n_share)
    between = _bytes_between_visits(s, m_share, n_share)
    between += (s.pack_a * min(s.mc, m_share) + s.pack_b * min(s.nc, n_share)) * s.kc * 4
    if between > hw.cache_bytes_per_core(2):
        return False
    c_bytes = s.M * s.N * _batch_copies(s, 2) * 4
    return _l2_set_overflow_share(hw, s.c_sm * 4, rows, cols * 4, c_bytes) <= 0.5


def _c_visits_from_beyond_l1(s: CpuSchedule, hw: HwSpec, share: ThreadShare) -> float:
    """Share of a C tile's visits (k blocks) whose lines come from beyond L1: the first, and the
    others unless the C block between two visits stays in L1 (``_c_stays_in_l1``)."""
    kt = share.k_blocks
    later = 0.0 if _c_stays_in_l1(s, hw, share.m_share, share.n_share) else kt - 1.0
    return (1.0 + later) / kt


def _c_tile_wait_cycles(s: CpuSchedule, hw: HwSpec) -> float:
    """What a call waits for a C tile from beyond L2: an L3 hit, or less where a prefetcher
    follows the calls' stride from L3 into L2 (``memory.far_prefetch_*``, measured)."""
    l3 = float(hw.cache(3).latency_cycles)
    if s.mr * s.c_sm * 4 <= hw.memory.far_prefetch_stride_bytes:
        return min(l3, hw.memory.far_prefetch_wait_cycles)
    return l3


def _calls_step_down_rows(s: CpuSchedule) -> bool:
    """Whether consecutive micro-kernel calls move to the next tile down C's rows: the tile loops
    of a block run ir inside jr, so they do when a block holds several row tiles; with one row
    tile and several column tiles they step along the row; with one tile the innermost block
    loop decides."""
    if s.mc > s.mr:
        return True
    if s.nc > s.nr:
        return False
    return s.order[-1] == "m"


def _shared_set_miss_fraction(s: CpuSchedule, hw: HwSpec) -> float:
    """Miss share when unpacked A and B rows a whole number of pages apart share the same L1 sets.

    Large numpy arrays start at a page boundary plus the same small header, so the A rows of a
    tile and the B rows of a k block then compete for one set group during the k loop: each fits
    alone but not together (seen on Zen 4: a 12 x 16 tile with kc=16 and neither input packed ran
    4x slower than predicted).
    """
    isz, page = 4, hw.memory.page_bytes
    a_rows = s.mr if not s.pack_a and not s.a_shared and (s.a_sm * isz) % page == 0 else 0
    b_rows = s.kc if not s.pack_b and (s.b_sk * isz) % page == 0 else 0
    if not a_rows + b_rows:
        return 0.0
    # each B row spans consecutive sets, one line in each, so the kc rows put kc lines in each of
    # those sets (not kc x row lines in one); the A rows' current lines join one of them
    b_sets = _b_row_lines(s, hw) if b_rows else 1
    per_set = np.full(b_sets, float(b_rows))
    per_set[0] += a_rows
    l1 = hw.cache(1)
    capacity = _l1_set_capacity(hw)
    together = float(np.maximum(per_set - capacity, 0.0).sum() / per_set.sum())
    if not (a_rows and b_rows):
        return together
    # The A rows' current lines move on to the next set every line of k, so they meet the B rows'
    # sets only b_sets of the L1's sets' share of the time (counting every step as a meeting had
    # put 10 x 32 tiles that run at 180 GFLOP/s at 57)
    return together * b_sets / _sets(l1)


def _l1_miss_fraction(
    stride_bytes: int, rows: int, row_bytes: int, hw: HwSpec, capacity: float | None = None
) -> float:
    """Share of a panel's lines that miss L1 when ``rows`` rows ``stride_bytes`` apart are swept
    again.

    Rows a power of two apart fall into few L1 sets; each set keeps only as many of the panel's
    lines as its ways hold (``capacity`` lines; by default the tile's claim on a set,
    ``_l1_set_capacity``), and the rest are refetched on every sweep. A row wider than a line
    spreads over consecutive sets (112 floats at a 1 KiB stride: 8 rows cover 28 sets, two lines
    each), so the sets are counted line by line.
    """
    l1 = hw.cache(1)
    held = _l1_set_capacity(hw) if capacity is None else capacity
    return _set_overflow_share(stride_bytes, rows, row_bytes, l1.line_bytes, _sets(l1), held)


def _overflowing_sets(stride_bytes: int, rows: int, row_bytes: int, hw: HwSpec) -> int:
    """L1 sets in which such rows' lines overflow what a tile may keep (at least 1)."""
    l1, held = hw.cache(1), _l1_set_capacity(hw)
    per_set = _lines_per_set(stride_bytes, rows, row_bytes, l1.line_bytes, _sets(l1))
    return max(1, sum(n > held for n in per_set))


def _panel_sets(stride_bytes: int, rows: int, row_bytes: int, line: int, sets: int) -> int:
    """Sets (of ``sets``, ``line`` bytes each) that the lines of such a panel fall into."""
    return len(_lines_per_set(stride_bytes, max(rows, 1), max(row_bytes, 1), line, sets))


def _lines_per_set(
    stride_bytes: int, rows: int, row_bytes: int, line: int, sets: int
) -> tuple[int, ...]:
    """How many distinct lines of ``rows`` rows (``row_bytes`` long, ``stride_bytes`` apart, the
    first on a line boundary) fall into each set they occupy (of ``sets``, ``line`` bytes each)."""
    return tuple(n for n in _lines_in_each_set(stride_bytes, 0, rows, row_bytes, line, sets) if n)


def _set_overflow_share(
    stride_bytes: int, rows: int, row_bytes: int, line: int, sets: int, capacity: float
) -> float:
    """Share of the distinct lines of such rows beyond ``capacity`` lines in their set."""
    per_set = np.array(_lines_per_set(stride_bytes, rows, row_bytes, line, sets), dtype=float)
    return float(np.maximum(per_set - capacity, 0.0).sum() / per_set.sum()) if per_set.size else 0.0


def _l1_thrash_share(s: CpuSchedule, hw: HwSpec) -> float:
    """Share of the unpacked B micro-panel's lines that miss L1 when the next call sweeps it again
    in the same order.

    A set with more panel lines than ways loses them all on every sweep (LRU: each is evicted
    before its reuse). A set whose panel lines fit loses only what the call's other lines push
    beyond its ways: the sweep's loads are independent and issued k steps ahead, so each is read
    before another's refill evicts it. (A dependent chase does cascade: 8 lines of one Zen 4 set
    and one fresh line per sweep took 27.4 cycles per access, the 8 alone 3.8.) The other lines:
    rows prefetched into L1 past the panel's last k step, and C's tile where C's rows are whole
    ways apart, fall in the panel's own sets (counted set by set); A's lines, and C's where they
    move from call to call, spread over the sets (how many land in one is Poisson). On Zen 4,
    1 x 240 tiles at N = 1024, kc = 8 (8 panel lines and 1 C line in each of 15 sets) were
    predicted at 1.35-1.43x their measured time with a refetch of those sets per call, at
    1.10-1.15x with the overflow alone.
    """
    l1, isz = hw.cache(1), 4
    line, sets = l1.line_bytes, _sets(l1)
    return _panel_thrash_share(
        s.b_sk * isz,
        s.kc,
        s.nr * isz,
        s.b_prefetch_rows if s.b_prefetch_level == 1 else 0,
        s.mr,
        (s.c_sm * isz) % (sets * line) == 0,
        line,
        sets,
        l1.conflict_slack * l1.associativity,
    )


@functools.lru_cache(maxsize=4096)
def _panel_thrash_share(
    stride: int,
    kc: int,
    row_bytes: int,
    ahead: int,
    mr: int,
    c_fixed: bool,
    line: int,
    sets: int,
    ways: float,
) -> float:
    """``_l1_thrash_share`` of a panel of ``kc`` rows, ``ahead`` rows prefetched into L1 past it,
    an ``mr``-row C tile whose rows are whole ways apart where ``c_fixed`` (cached: the search
    estimates many configs with one panel, and each estimate asks twice)."""
    isz = 4
    panel = np.array(_lines_in_each_set(stride, 0, kc, row_bytes, line, sets))
    if not panel.any():
        return 0.0
    prefetched = np.array(_lines_in_each_set(stride, kc, ahead, row_bytes, line, sets))
    a_lines = mr * -(-kc * isz // line)
    c_lines = mr * -(-row_bytes // line)
    c_in_sets = np.zeros(sets)
    if c_fixed:
        c_in_sets = mr * np.array(_lines_in_each_set(stride, 0, 1, row_bytes, line, sets))
        c_lines = 0
    per_set_others = (a_lines + c_lines) / sets
    room = ways - panel - prefetched - c_in_sets
    over = np.array([_poisson_overflow(per_set_others, r) for r in room])
    lost = np.where(panel > ways, panel, np.minimum(panel, over))
    return float(lost.sum() / panel.sum())


@functools.lru_cache(maxsize=4096)
def _lines_in_each_set(
    stride_bytes: int, first: int, rows: int, row_bytes: int, line: int, sets: int
) -> tuple[int, ...]:
    """Distinct lines of rows ``first`` .. ``first + rows - 1`` (``row_bytes`` long,
    ``stride_bytes`` apart, row 0 on a line boundary) in each of the ``sets`` sets."""
    if rows <= 0 or row_bytes <= 0:
        return (0,) * sets
    starts = (first + np.arange(rows, dtype=np.int64)) * stride_bytes
    lo, hi = starts // line, (starts + row_bytes - 1) // line
    lines = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi)]))
    return tuple(int(n) for n in np.bincount(lines % sets, minlength=sets))


def _poisson_overflow(mean: float, room: float) -> float:
    """E[max(0, X - room)] for X Poisson with ``mean``: the lines a set cannot keep."""
    if room < 0:
        return -room + mean
    term, below, below_weighted = math.exp(-mean), 0.0, 0.0
    for i in range(int(room) + 1):
        below += term
        below_weighted += i * term
        term *= mean / (i + 1)
    # E[X - room] over X > room = mean - E[X; X <= room] - room * P(X > room)
    return max(0.0, mean - below_weighted - room * (1.0 - below))


def _l1_set_capacity(hw: HwSpec) -> float:
    """Lines of one L1 set a tile's operands may keep: its ways, the slack the set probe found,
    and the share of the cache a tile may claim."""
    l1 = hw.cache(1)
    return l1.conflict_slack * l1.associativity * l1.usable_fraction


class AnalyticalCpuModel:
    """The cost-model interface: a few batch methods over schedules of one target."""

    def __init__(self, hw: HwSpec) -> None:
        self.hw = hw

    def estimate_batch(self, schedules: Sequence[CpuSchedule]) -> list[Prediction]:
        """Tier 1: from the schedules alone."""
        return [cost(s, self.hw, mix_from_schedule(s, self.hw), "estimate") for s in schedules]

    def predict_batch(
        self, schedules: Sequence[CpuSchedule], loops: Sequence[LoopFeatures]
    ) -> list[Prediction]:
        """Tier 2: with the instruction mix read from each kernel's object code."""
        return [
            cost(s, self.hw, mix_from_features(s, f, self.hw), "asm")
            for s, f in zip(schedules, loops)
        ]
