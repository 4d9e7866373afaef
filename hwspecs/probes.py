"""The probes of ``aotune hw calibrate``: how each reading is taken and what it means.

Roadmap: ``Session`` holds one calibration run's state (the host as detected, the built-in spec it
is closest to, the JIT-compiled kernels of ``codegen/microbench.py``, page-aligned buffers, and
the clock, measured first, so that later probes count cycles). Each ``probe_*`` function measures
some spec fields on a session and returns a ``Finding`` (value and origin) per field; the table of
probes and the run itself are in ``hwspecs/calibrate.py``. The arithmetic that turns readings into
values is in small pure functions, tested on synthetic readings.

How a time is taken (``Session.best``): a warm-up run, then runs sized to ~4 ms each until the
three fastest agree within 0.5% (or a cap on runs or seconds is reached); the fastest, less the cost
of an empty call, is the reading. On a shared machine the fastest run is the one nothing
interrupted; every value's comment says how closely the three fastest agreed and how far above
the fastest the median run was (the machine's load while it was measured). A reading outside
physical bounds is not used: the field falls back to the closest built-in spec, marked so.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from aotune.codegen.microbench import (
    OUT_BYTES,
    SCRATCH_BYTES,
    Chase,
    Kernel,
    MicroBench,
    Mix,
    Rows,
    Stream,
)
from aotune.errors import CalibrationError
from aotune.hwspecs.spec import HwSpec
from aotune.hwspecs.spec_toml import value_at, with_value

if TYPE_CHECKING:
    from aotune.codegen.schedule import CpuSchedule

HUGE_PAGE = 2 << 20  # buffers are aligned to this, so transparent huge pages can back them


@dataclass(frozen=True)
class Effort:
    """How hard each reading tries: run length, and when to stop repeating."""

    run_seconds: float = 0.004  # one run: long against the timer and the call, short against load
    min_runs: int = 11
    max_runs: int = 100
    agree: float = 0.005  # stop once the three fastest runs are this close
    max_seconds: float = 2.0  # per reading
    warmup_seconds: float = 0.3  # spinning before the first probe, so the clock is up


QUICK = Effort(run_seconds=0.001, min_runs=3, max_runs=6, agree=0.05, max_seconds=0.1)


@dataclass(frozen=True)
class Timing:
    """One reading: the fastest run's seconds (less an empty call's), how many runs were made,
    how far the third-fastest run was above the fastest, and how far the median was."""

    seconds: float
    runs: int
    run_seconds: float
    agree: float
    median: float

    def describe(self) -> str:
        """How the reading was taken, for a value's comment."""
        return (
            f"fastest of {self.runs} runs of {_duration(self.run_seconds)} (3 fastest within "
            f"{self.agree:.1%}, median +{self.median:.0%})"
        )


def _timed(run: Callable[[int], object], n: int) -> float:
    t0 = time.perf_counter()
    run(n)
    return time.perf_counter() - t0


def _duration(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} us"


def timing_from_runs(times: Sequence[float], overhead: float = 0.0) -> Timing:
    """The reading of ``times`` (seconds of each run, at least one), less ``overhead`` (the cost of
    calling an empty kernel; never more than half the fastest run is taken off)."""
    ordered = sorted(times)
    fastest = ordered[0]
    third = ordered[min(2, len(ordered) - 1)]
    return Timing(
        seconds=max(fastest - overhead, fastest / 2),
        runs=len(ordered),
        run_seconds=fastest,
        agree=third / fastest - 1.0 if fastest > 0 else 0.0,
        median=statistics.median(ordered) / fastest - 1.0 if fastest > 0 else 0.0,
    )


@dataclass(frozen=True)
class Finding:
    """A field's value and where it came from (``measured: ...``, ``os: ...``, ``llvm: ...``,
    ``assumed: ...``)."""

    value: Any
    origin: str


# ---- the arithmetic of the probes (pure functions, tested on synthetic readings) ----------------


def cycles(seconds: float, ghz: float) -> float:
    """Core cycles in ``seconds`` at ``ghz``."""
    return seconds * ghz * 1e9


POW2_WIDTHS = (64, 128, 256, 512, 1024)  # the schema's range for pipe widths


def fit_pipes(
    rates: Mapping[int, float], max_units: int = 8, widths: Sequence[int] = POW2_WIDTHS
) -> tuple[int, int, float]:
    """(units, width in bits, worst relative error) of the pipes that best explain ``rates``:
    operations per cycle measured per operand width, where ``units`` pipes of ``width`` bits
    issue ``units * min(1, width / w)`` operations of ``w`` bits per cycle (a wider operation
    takes several slots). Best in the squared log ratio; of equally good fits, the fewest
    pipes, then the narrowest (rates at 128 bits alone say nothing about wider operations)."""
    if not rates or any(not (r > 0 and math.isfinite(r)) for r in rates.values()):
        raise CalibrationError(f"pipe rates must be positive numbers, got {dict(rates)}")
    best: tuple[float, int, int] | None = None
    for units in range(1, max_units + 1):
        for width in widths:
            err = sum(math.log(units * min(1.0, width / w) / r) ** 2 for w, r in rates.items())
            key = (round(err, 9), units, width)
            if best is None or key < best:
                best = key
    assert best is not None
    _, units, width = best
    worst = max(abs(units * min(1.0, width / w) / r - 1.0) for w, r in rates.items())
    return units, width, worst


def step_knee(points: Mapping[int, float], base: float, rise: float) -> tuple[int, int] | None:
    """(last n at base, first n above it) of a latency curve that steps up once ``n`` exceeds a
    capacity: ``points`` n -> cycles per access; "above" means more than ``rise`` over ``base``.
    None when the largest n is not above. A reading is the fastest of several runs, so noise
    only ever raises one: a reading at base is trusted wherever it is, and the step is after
    the largest n read at base."""
    ns = sorted(points)
    fast = [n for n in ns if points[n] <= base + rise]
    if not fast or fast[-1] == ns[-1]:
        return None
    return fast[-1], ns[ns.index(fast[-1]) + 1]


def tlb_from_curve(points: Mapping[int, float]) -> tuple[int, float, float] | None:
    """(first-level DTLB entries, extra cycles of a miss, base cycles) from a chase over one line
    per page: ``points`` pages -> cycles per access. A cyclic chase keeps every page in an LRU
    TLB up to its capacity and none beyond, so the curve is a step; the entries are the last
    page count on the low side, the miss cost the step's height (median of the high side).
    None when the curve never steps up (the TLB holds every count tried)."""
    ns = sorted(points)
    base = min(points[n] for n in ns[: max(2, len(ns) // 4)])
    knee = step_knee(points, base, max(1.0, 0.15 * base))
    if knee is None:
        return None
    last_fast, first_slow = knee
    high = [points[n] for n in ns if n >= first_slow]
    return last_fast, statistics.median(high) - base, base


def followed_strides(
    strided: Mapping[int, float], scattered: Mapping[int, float], hit: float, miss: float
) -> int | None:
    """The largest stride the prefetcher follows: a dependent walk at a fixed stride that takes
    less than half-way from a hit (``hit`` cycles) to a miss is being prefetched. A miss is the
    walk's lines fetched one by one: ``miss`` cycles (the next level's latency: the lines live
    there), or the same lines in random order (``scattered``) where that is less. The random order
    alone is no reference at wide strides: it adds page walks that no prefetcher removes, which
    once put a 4 KiB walk at an L2 round trip and more (26.5 cycles) on the followed side. Strides
    count from the smallest up; the first one not followed ends the run. None when even the
    smallest is not followed."""
    best = None
    for stride in sorted(strided):
        reference = min(scattered[stride], miss)
        if strided[stride] < hit + 0.5 * (reference - hit):
            best = stride
        else:
            break
    return best


def far_followed_stride(
    walk: Mapping[int, float], l2_hit: float, last_hit: float
) -> tuple[int, float] | None:
    """(largest stride, cycles per step over the followed strides) at which a prefetcher brings
    a walk's lines from beyond L2 ahead of it: a dependent walk at a fixed stride (``walk``: bytes
    -> cycles per step) whose lines live in the last level is followed where a step takes less
    than half-way from an L2 hit (``l2_hit``) to a last-level hit (``last_hit``), both with
    whatever the walk pays for its pages. Strides count from the smallest up; the first one not
    followed ends the run. None when even the smallest is not followed."""
    followed = []
    for stride in sorted(walk):
        if walk[stride] >= l2_hit + 0.5 * (last_hit - l2_hit):
            break
        followed.append(stride)
    if not followed:
        return None
    return followed[-1], statistics.median(walk[st] for st in followed)


def lead_needed(per_row: Mapping[int, float], reference: float, slack: float = 0.1) -> int | None:
    """The fewest rows ahead a software prefetch must be issued for a row walk to run within
    ``slack`` of ``reference`` (cycles per row when every row hits): ``per_row`` rows ahead ->
    cycles per row. None when no distance gets there."""
    for distance in sorted(per_row):
        if per_row[distance] <= reference * (1.0 + slack):
            return distance
    return None


def per_thread_cost(one: float, many: float, threads: int) -> float:
    """Seconds each thread beyond the first adds to a call: (``many``-thread call - one-thread
    call) / (threads - 1), never below zero."""
    if threads < 2:
        raise CalibrationError("a per-thread cost needs calls on at least two threads")
    return max(0.0, (many - one) / (threads - 1))


def cycles_per_extra_call(short: float, long: float, ghz: float, extra_calls: int) -> float:
    """Cycles each extra call adds: seconds of the run with more calls (``short`` k blocks) less
    the run with fewer (``long``), over the extra calls."""
    if extra_calls < 1:
        raise CalibrationError("a per-call cost needs a run with more calls than the other")
    return cycles(short - long, ghz) / extra_calls


def chains_in_flight(
    seconds: float,
    overhead: float,
    ghz: float,
    calls: int,
    call_cycles: float,
    steps: int,
    latency: float,
) -> float:
    """How many one-chain calls overlap: ``calls`` calls of ``steps`` dependent FMAs each took
    ``seconds`` (``overhead`` of it the call into the kernel, ``call_cycles`` per call their own),
    so a k step took the FMA ``latency`` over the chains in flight."""
    per_step = (cycles(seconds - overhead, ghz) - calls * call_cycles) / (calls * steps)
    return latency / max(per_step, 1e-9)


def misses_in_flight(per_access_by_chains: Mapping[int, float]) -> float:
    """Misses to memory that overlap, from chases of 1, 2, ... independent chains (cycles per
    access by chain count): one chain's latency over the fewest cycles per access reached."""
    fewest = min(per_access_by_chains.values())
    return per_access_by_chains[1] / max(fewest, 1e-9)


def chase_order(
    points_per_page: int, pages: int, window_pages: int, rng: np.random.Generator
) -> np.ndarray:
    """A visiting order of ``pages * points_per_page`` points: windows of ``window_pages``
    consecutive pages in random order, the points of each window in random order. Each point is
    visited once per cycle (so no cache holding fewer points than the buffer keeps any of them
    with LRU), with no stride for a prefetcher to follow, while the pages in use at a time fit
    the TLB."""
    window_pages = max(1, min(window_pages, pages))
    per_window = window_pages * points_per_page
    windows = -(-pages // window_pages)
    parts = []
    total = pages * points_per_page
    for w in rng.permutation(windows):
        start = w * per_window
        count = min(per_window, total - start)
        parts.append(start + rng.permutation(count))
    return np.concatenate(parts)


def geometric_sizes(lo: int, hi: int, factor: int = 2) -> list[int]:
    """lo, lo * factor, ... up to hi (empty when lo > hi)."""
    sizes = []
    size = lo
    while size <= hi:
        sizes.append(size)
        size *= factor
    return sizes


# ---- buffers -----------------------------------------------------------------------------------


class _Buffer:
    """Anonymous memory aligned to 2 MiB, with transparent huge pages asked for or refused, and
    written once (untouched anonymous pages all read from one shared zero page). Shared unless
    ``private``: only private memory, as numpy's arrays have, takes huge pages by that advice
    where the kernel gives them on advice alone."""

    def __init__(self, nbytes: int, huge: bool, private: bool = False) -> None:
        if private:
            self._map = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE)
        else:
            self._map = mmap.mmap(-1, nbytes + HUGE_PAGE)
        advice = getattr(mmap, "MADV_HUGEPAGE" if huge else "MADV_NOHUGEPAGE", None)
        if advice is not None:
            try:
                self._map.madvise(advice)
            except OSError:
                pass  # no THP in this kernel: 4 KiB pages either way
        raw = np.frombuffer(self._map, dtype=np.uint8)
        skip = -raw.ctypes.data % HUGE_PAGE
        self.bytes = raw[skip : skip + nbytes]
        self.bytes.fill(1)
        self.addr = self.bytes.ctypes.data

    def links(self) -> np.ndarray:
        """The buffer as 64-bit words (chase links)."""
        return self.bytes.view(np.uint64)

    def close(self) -> None:
        """Give the memory back."""
        del self.bytes
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive: the collector frees it with the view


# ---- a calibration run -------------------------------------------------------------------------


# the clock's chain: one dependent add per step, 64 steps a loop iteration (warm-up, probe_clock,
# clock_now_ghz and calibrate's reading at the end all run it)
CLOCK_CHAIN = Mix(adds=1, unroll=64)


class Session:
    """The state of one calibration run: the host as detected, the built-in spec it is closest
    to, compiled kernels, buffers, the clock once measured, and what each probe found."""

    def __init__(self, host: HwSpec, base: HwSpec, effort: Effort, seed: int = 0) -> None:
        self.host, self.base, self.effort = host, base, effort
        self.rng = np.random.default_rng(seed)
        self.worst_agree = 0.0  # of the readings since the caller last reset it
        self.found: dict[str, Finding] = {}
        self.details: dict[str, Any] = {}
        self.notes: list[str] = []
        self._benches: dict[str, MicroBench] = {}
        self._buffers: list[_Buffer] = []
        self._scratch = self.buffer(SCRATCH_BYTES + OUT_BYTES * 128, huge=False)
        self._params = np.array([0.999, 0.001, 1.0, 0.0], dtype=np.float32)
        self._overhead = 0.0

    # -- kernels
    def compile(self, kernels: Sequence[Kernel]) -> None:
        """JIT-compile those of ``kernels`` not compiled yet, in one module."""
        new = [k for k in dict.fromkeys(kernels) if k.name not in self._benches]
        if new:
            bench = MicroBench(new, self.host)
            for k in new:
                self._benches[k.name] = bench

    def bench_of(self, kernel: Kernel) -> MicroBench:
        """The compiled module holding ``kernel``."""
        self.compile([kernel])
        return self._benches[kernel.name]

    def mix(self, kernel: Mix, iters: int) -> None:
        """Run a ``Mix`` kernel for ``iters`` iterations on this thread."""
        scratch = self._scratch.addr
        self.bench_of(kernel).call(
            kernel, iters, self._params.ctypes.data, scratch, scratch + SCRATCH_BYTES
        )

    def chase(self, start: int, steps: int) -> None:
        """Follow ``steps`` links from address ``start`` (a multiple of 16)."""
        k = Chase(16)
        self.bench_of(k).call(k, steps // 16, start, self._scratch.addr + SCRATCH_BYTES)

    def cycles_per_link(self, start: int) -> tuple[float, Timing]:
        """(cycles per link, reading) of following the chain from address ``start``, each run
        starting there again: for cycles a run goes round (``cycles_per_link_going_on`` for
        longer ones)."""
        return self.cycles_per(lambda n: self.chase(start, 16 * n), 16)

    def cycles_per_link_going_on(self, start: int) -> tuple[float, Timing]:
        """(cycles per link, reading) of following the chain from address ``start``, each run
        going on from the link the last one stopped at: a cycle longer than a run would
        otherwise have its first links re-read from whatever cache the last run left them in."""
        head = np.array([start], dtype=np.uint64)
        return self.cycles_per(
            lambda n: self.chases(head.ctypes.data, 1, PARALLEL_UNROLL * n), PARALLEL_UNROLL
        )

    def chases(self, heads: int, chains: int, steps: int) -> None:
        """Follow ``steps`` links on each of ``chains`` chains whose current links are the 64-bit
        words at address ``heads``, and leave each chain's last link there: the next call goes on
        from it rather than reading again lines the last one left in the caches."""
        k = Chase(PARALLEL_UNROLL, chains, heads=True)
        self.bench_of(k).call(k, steps // PARALLEL_UNROLL, heads, heads)

    def buffer(self, nbytes: int, huge: bool = True, private: bool = False) -> _Buffer:
        """A written, 2 MiB-aligned buffer that lives until the session ends."""
        try:
            buf = _Buffer(nbytes, huge, private)
        except (OSError, ValueError, MemoryError) as e:
            raise CalibrationError(
                f"cannot allocate {nbytes >> 20} MiB for a probe ({e}); free some memory and rerun"
            ) from None
        self._buffers.append(buf)
        return buf

    def release(self, buf: _Buffer) -> None:
        """Give a buffer back before the session ends."""
        self._buffers.remove(buf)
        buf.close()

    def close(self) -> None:
        """Give every buffer back."""
        for buf in self._buffers:
            buf.close()
        self._buffers.clear()

    # -- timing
    def warm_up(self) -> None:
        """Spin for a while so the core reaches its sustained clock, and measure what an empty
        kernel call costs (taken off every reading)."""
        k = CLOCK_CHAIN
        start = time.perf_counter()
        while time.perf_counter() - start < self.effort.warmup_seconds:
            self.mix(k, 2000)
        self._overhead = self.best(lambda: self.mix(k, 0), subtract=False).run_seconds

    def best(self, call: Callable[[], object], subtract: bool = True) -> Timing:
        """The reading of ``call``: repeated until the three fastest runs agree (see the module
        docstring)."""
        e = self.effort
        call()
        times: list[float] = []
        start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
            if len(times) >= e.min_runs:
                if timing_from_runs(times).agree <= e.agree or len(times) >= e.max_runs:
                    break
                if time.perf_counter() - start > e.max_seconds:
                    break
        timing = timing_from_runs(times, self._overhead if subtract else 0.0)
        self.worst_agree = max(self.worst_agree, timing.agree)
        return timing

    def best_sized(self, run: Callable[[int], object], start: int = 1) -> tuple[Timing, int]:
        """(reading, n) of ``run(n)``, with n grown until one run takes ``run_seconds``.

        Sizing trusts the fastest of a few tries at each n (one try may be interrupted), and a
        reading whose fastest run came out far shorter than planned is sized again."""
        target = self.effort.run_seconds
        n = max(1, start)
        for _attempt in range(3):
            while True:
                took = min(_timed(run, n) for _ in range(3))
                if took >= target / 8 or n >= 1 << 40:
                    break
                n *= 8
            n = max(1, round(n * target / max(took, 1e-7)))
            t = self.best(lambda n=n: run(n))
            if t.run_seconds >= target / 3:
                break
        return t, n

    def cycles_per(self, run: Callable[[int], object], ops_per_unit: float) -> tuple[float, Timing]:
        """(cycles per operation, reading) of ``run(n)``, which does ``n * ops_per_unit``
        operations."""
        t, n = self.best_sized(run)
        return cycles(t.seconds, self.ghz) / (n * ops_per_unit), t

    # -- values
    @property
    def ghz(self) -> float:
        """The clock, once the clock probe has found it (cycles are counted at it)."""
        if "core.frequency_ghz" not in self.found:
            raise CalibrationError("a probe counted cycles before the clock was measured")
        return float(self.found["core.frequency_ghz"].value)

    def spec_so_far(self) -> HwSpec:
        """The host's spec with every value found so far in place of the detected one."""
        spec = self.host
        for path, finding in self.found.items():
            spec = with_value(spec, path, finding.value)
        return spec

    @property
    def vector_fmas_per_cycle(self) -> float:
        """FMAs of the widest vector a cycle, from the pipes found so far."""
        return self.spec_so_far().vector_fmas_per_cycle

    def value(self, path: str) -> Any:
        """A field's value as found so far (measured, or the host's as detected)."""
        if path in self.found:
            return self.found[path].value
        return value_at(self.host, path)

    def assumed(self, path: str, why: str) -> Finding:
        """The closest built-in spec's value for ``path``, marked as assumed and why."""
        return Finding(
            value_at(self.base, path), f"assumed: from built-in spec {self.base.name}: {why}"
        )

    def checked(self, path: str, value: Any, lo: float, hi: float, how: str) -> Finding:
        """``value`` measured as ``how`` says, or, outside the physical bounds [lo, hi], the closest
        built-in spec's value, marked as a fallback."""
        if lo <= value <= hi:
            return Finding(value, f"measured: {how}")
        return self.assumed(
            path, f"the probe read {value}, outside the plausible {lo:g}..{hi:g} ({how})"
        )

    @property
    def vector_bits(self) -> int:
        """The widest vector the host has."""
        return self.host.isa.vector_bits

    @property
    def vector_widths(self) -> list[int]:
        """Every vector width the host has: 128 bits up to its widest."""
        return [w for w in (128, 256, 512, 1024) if w <= self.vector_bits]


_clock_benches: dict[HwSpec, MicroBench] = {}


def clock_now_ghz(hw: HwSpec, runs: int = 7, adds: int = 1 << 20) -> float:
    """The core's clock right now, read as ``probe_clock`` reads it (a dependent chain of adds,
    one per cycle), the fastest of ``runs`` runs of ``adds`` adds (about 0.5 ms each at 2 GHz).

    A few milliseconds: the bench reads it beside its timings, since a cloud CPU's clock moves
    with its neighbours' load and every prediction is cycles at the spec's clock."""
    if hw not in _clock_benches:
        _clock_benches[hw] = MicroBench([CLOCK_CHAIN], hw)
    bench = _clock_benches[hw]
    params = np.zeros(4, np.float32)
    out = np.zeros(OUT_BYTES // 8, np.int64)
    iters = max(1, adds // CLOCK_CHAIN.unroll)

    def run(n: int) -> None:
        bench.call(CLOCK_CHAIN, n, params.ctypes.data, 0, out.ctypes.data)

    run(iters)  # warm-up
    best = min(_timed(run, iters) for _ in range(max(1, runs)))
    return iters * CLOCK_CHAIN.unroll / best / 1e9


def fma_chains(hw: HwSpec) -> int:
    """Independent FMA chains that keep every FMA pipe busy, leaving registers for the rest."""
    return max(8, min(24, hw.isa.vector_registers - 4))


_fma_benches: dict[HwSpec, tuple[MicroBench, Mix]] = {}


def fma_rate_now(hw: HwSpec, ghz: float, runs: int = 5, steps: int = 1 << 17) -> float:
    """Vector FMAs a cycle the core issues right now at its widest width, read as ``probe_fma``
    reads the throughput (independent chains), the fastest of ``runs`` runs of ``steps`` steps,
    at the clock ``ghz`` read beside it (about 5 ms in all; shorter runs read low: the call and
    the wide pipes' warm-up, 1.1 at 2^12 steps against 1.87 at 2^17 on an idle core).

    The bench reads it beside its timings: a cloud core another guest shares (its other
    hyperthread, most likely) issues fewer FMAs than the pipes allow, while the clock chain, one
    add a cycle, reads as before (Emerald Rapids slice, README stop 89: 1.19-1.96 a second
    apart, a packed kernel's time partly following it). On cores whose clock drops under wide
    FMAs (Skylake-SP's AVX-512 licences) a low reading may be that drop instead: ``ghz`` is
    read on integer adds."""
    if hw not in _fma_benches:
        kernel = Mix(fmas=(hw.isa.vector_bits,) * fma_chains(hw), unroll=2)
        _fma_benches[hw] = (MicroBench([kernel], hw), kernel)
    bench, kernel = _fma_benches[hw]
    params = np.zeros(4, np.float32)
    out = np.zeros(OUT_BYTES * len(kernel.fmas) // 8, np.int64)
    iters = max(1, steps // kernel.unroll)

    def run(n: int) -> None:
        bench.call(kernel, n, params.ctypes.data, 0, out.ctypes.data)

    run(iters)  # warm-up
    best = min(_timed(run, iters) for _ in range(max(1, runs)))
    return iters * kernel.unroll * len(kernel.fmas) / best / (ghz * 1e9)


# ---- the probes --------------------------------------------------------------------------------


def probe_clock(s: Session) -> dict[str, Finding]:
    """Cycles per second: a dependent chain of 1-cycle integer adds runs one add per cycle."""
    k = CLOCK_CHAIN
    s.compile([k])
    # three readings, the fastest kept: the clock every later reading is converted with must not
    # be one that a burst of other work slowed
    readings = [s.best_sized(lambda n: s.mix(k, n)) for _ in range(3)]
    t, n = min(readings, key=lambda r: r[0].seconds / r[1])
    ghz = n * k.unroll / t.seconds / 1e9
    if not 0.2 <= ghz <= 7.0:
        raise CalibrationError(
            f"the clock probe read {ghz:.2f} GHz, which no CPU runs at; is the machine "
            "overloaded or throttled? rerun hw calibrate when it is quieter"
        )
    s.details["clock"] = {"ghz": ghz, "runs": t.runs, "agree": t.agree}
    return {
        "core.frequency_ghz": Finding(
            round(ghz, 3),
            f"measured: a dependent chain of 1-cycle integer adds ({n * k.unroll:,} per run), the "
            f"fastest of 3 readings, {t.describe()}: {ghz:.3f} billion adds per second",
        )
    }


def probe_fma(s: Session) -> dict[str, Finding]:
    """FMA latency (one dependent chain) and throughput (many chains) per vector width; the pipes
    that explain the throughputs."""
    chains = fma_chains(s.host)
    lat_k = {w: Mix(fmas=(w,), unroll=32) for w in s.vector_widths}
    thr_k = {w: Mix(fmas=(w,) * chains, unroll=2) for w in s.vector_widths}
    s.compile([*lat_k.values(), *thr_k.values()])
    latency, rate, runs = {}, {}, []
    for w in s.vector_widths:
        lat, t1 = s.cycles_per(lambda n, k=lat_k[w]: s.mix(k, n), 32)
        per_fma, t2 = s.cycles_per(lambda n, k=thr_k[w]: s.mix(k, n), 2 * chains)
        latency[w], rate[w] = lat, 1.0 / per_fma
        runs += [t1, t2]
    units, width, err = fit_pipes(rate)
    s.details["fma"] = {"latency_cycles": latency, "per_cycle": rate, "fit_error": err}
    v = s.vector_bits
    rates = ", ".join(f"{w}-bit {r:.2f}" for w, r in rate.items())
    lats = ", ".join(f"{w}-bit {x:.2f}" for w, x in latency.items())
    how = (
        f"{chains} independent FMA chains, {rates} FMAs per cycle; {_spread(runs)}; "
        f"{units} pipes x {width} bits fit every width within {err:.0%}"
    )
    out = {
        "core.fma_units": s.checked("core.fma_units", units, 1, 8, how),
        "core.fma_width_bits": s.checked("core.fma_width_bits", width, 64, 1024, how),
        "core.fma_latency_cycles": s.checked(
            "core.fma_latency_cycles",
            round(latency[v]),
            2,
            16,
            f"one dependent chain of {v}-bit FMAs: {lats} cycles per FMA; {_spread(runs)}",
        ),
    }
    if err > 0.25:
        for path in ("core.fma_units", "core.fma_width_bits"):
            out[path] = s.assumed(path, f"no pipe count and width fit the rates ({how})")
    return out


FORWARD_UNROLLS = (4, 8, 16, 32)  # loop layouts the forwarding chain is timed in


def probe_store_forwarding(s: Session) -> dict[str, Finding]:
    """Cycles a store of a full-width vector takes to reach a load of it: one FMA chain whose
    accumulator goes to a stack slot and back after every FMA, less the same chain in a register
    (a spilled accumulator's chain waits on both). It is timed in four loop layouts and the
    fastest taken: on a 2-vCPU slice shared with other busy processes some layouts read twice the
    idle cycles (Zen 3: 28-29 a step against 13.6-14.1 idle; README, stop 124)."""
    v = s.vector_bits
    plain = Mix(fmas=(v,), unroll=32)
    spilled = {u: Mix(fmas=(v,), unroll=u, through_memory=1) for u in FORWARD_UNROLLS}
    s.compile([plain, *spilled.values()])
    fma, t = s.cycles_per(lambda n: s.mix(plain, n), 32)
    chain, runs = {}, [t]
    for u, k in spilled.items():
        chain[u], t = s.cycles_per(lambda n, k=k: s.mix(k, n), u)
        runs.append(t)
    s.details["store_forwarding"] = {"chain_cycles": chain, "fma_cycles": fma}
    fast, slow = min(chain.values()), max(chain.values())
    layouts = ", ".join(f"{c:.2f}" for c in chain.values())
    return {
        "core.store_forward_cycles": s.checked(
            "core.store_forward_cycles",
            round(fast - fma, 1),
            1.0,
            40.0,
            f"one chain of {v}-bit FMAs, its accumulator stored to the stack and loaded back "
            f"after each, unrolled {', '.join(map(str, FORWARD_UNROLLS))} deep: {layouts} cycles "
            f"a step (the fastest taken; the slowest is {slow - fma:.1f} cycles of forwarding), "
            f"{fma:.2f} in a register; {_spread(runs)}",
        )
    }


def probe_mixed_width(s: Session) -> dict[str, Finding]:
    """Cycles per FMA instruction in rows of full-width FMAs plus one narrower tail FMA."""
    v = s.vector_bits
    tails = [t for t in (v // 2, v // 4) if t >= 64] + [32]
    mixes = dict.fromkeys([(1, tails[0]), (1, tails[min(1, len(tails) - 1)]), (2, tails[0])])
    mixes[(3, 32)] = None
    regs = s.host.isa.vector_registers - 4
    kernels = {}
    for full, tail in mixes:
        rows = max(1, regs // (full + 1))
        kernels[(full, tail)] = (Mix(fmas=((v,) * full + (tail,)) * rows, unroll=2), rows)
    s.compile([k for k, _ in kernels.values()])
    per_insn: dict[str, float] = {}
    runs = []
    for (full, tail), (k, rows) in kernels.items():
        lanes = f"{v // 32 * full}+{tail // 32}"
        c, t = s.cycles_per(lambda n, k=k: s.mix(k, n), 2 * rows * (full + 1))
        per_insn[lanes] = c
        runs.append(t)
    value = round(statistics.median(per_insn.values()), 2)
    s.details["mixed_width_fma"] = {"cycles_per_fma": per_insn}
    mixes_text = ", ".join(f"{k} columns {x:.2f}" for k, x in per_insn.items())
    return {
        "core.mixed_width_fma_cycles": s.checked(
            "core.mixed_width_fma_cycles",
            value,
            0.05,
            4.0,
            f"rows of full {v}-bit FMAs plus one narrower tail FMA, independent rows filling "
            f"the registers: {mixes_text} cycles per FMA instruction (median taken); "
            f"{_spread(runs)}",
        )
    }


def probe_loads(s: Session) -> dict[str, Finding]:
    """Loads per cycle per width (scalar float, as the micro-kernel's broadcasts, and each vector
    width) from an L1-resident buffer; the ports and width that explain them."""
    widths = [32, *s.vector_widths]
    kernels = {w: Mix(loads=32, mem_bits=w, unroll=2) for w in widths}
    s.compile(list(kernels.values()))
    rate, runs = {}, []
    for w, k in kernels.items():
        c, t = s.cycles_per(lambda n, k=k: s.mix(k, n), 64)
        rate[w] = 1.0 / c
        runs.append(t)
    ports, width, err = fit_pipes(rate)
    s.details["loads"] = {"per_cycle": rate, "fit_error": err}
    how = (
        "independent loads from a 2 KiB buffer: "
        + ", ".join(f"{w}-bit {r:.2f}" for w, r in rate.items())
        + f" per cycle; {_spread(runs)}; {ports} ports x {width} bits fit every width within "
        f"{err:.0%}"
    )
    out = {
        "core.load_ports": s.checked("core.load_ports", ports, 1, 8, how),
        "core.load_width_bits": s.checked("core.load_width_bits", width, 64, 1024, how),
    }
    if err > 0.25:
        for path in out:
            out[path] = s.assumed(path, f"no port count and width fit the rates ({how})")
    return out | probe_prefetches(s)


def probe_prefetches(s: Session) -> dict[str, Finding]:
    """Software prefetches (into L1, of lines already there) per cycle: they return no data, so
    a core with more address pipes than load data paths issues them faster than loads."""
    kernel = Mix(prefetches=32, unroll=2)
    s.compile([kernel])
    per_prefetch, t = s.cycles_per(lambda n: s.mix(kernel, n), 64)
    rate = 1.0 / per_prefetch
    s.details["prefetches"] = {"per_cycle": rate}
    path = "core.prefetches_per_cycle"
    return {
        path: s.checked(
            path,
            round(rate, 2),
            0.1,
            16.0,
            f"independent prefetches of lines in a 2 KiB buffer: {rate:.2f} per cycle; "
            f"{_spread([t])}",
        )
    }


def probe_stores(s: Session) -> dict[str, Finding]:
    """Stores per cycle per width into an L1-resident buffer."""
    widths = [32, *s.vector_widths]
    kernels = {w: Mix(stores=32, mem_bits=w, unroll=2) for w in widths}
    s.compile(list(kernels.values()))
    rate, runs = {}, []
    for w, k in kernels.items():
        c, t = s.cycles_per(lambda n, k=k: s.mix(k, n), 64)
        rate[w] = 1.0 / c
        runs.append(t)
    s.details["stores"] = {"per_cycle": rate}
    ports = max(1, round(max(rate.values())))
    return {
        "core.store_ports": s.checked(
            "core.store_ports",
            ports,
            1,
            8,
            "independent stores to a 2 KiB buffer: "
            + ", ".join(f"{w}-bit {r:.2f}" for w, r in rate.items())
            + f" per cycle, the best rounded; {_spread(runs)}",
        )
    }


def probe_masked_stores(s: Session) -> dict[str, Finding]:
    """Cycles per full-width store with a lane mask into an L1-resident buffer (AVX2's
    ``vmaskmovps``, AVX-512's masked ``vmovups``, the per-lane stores of an ISA without one)."""
    w = s.vector_bits
    kernel = Mix(masked_stores=16, mem_bits=w, unroll=2)
    s.compile([kernel])
    per_store, t = s.cycles_per(lambda n: s.mix(kernel, n), 32)
    s.details["masked stores"] = {"cycles": per_store}
    path = "core.masked_store_cycles"
    return {
        path: s.checked(
            path,
            round(per_store, 2),
            0.1,
            1000.0,
            f"independent {w}-bit stores with a lane mask (all lanes but the last) to a 2 KiB "
            f"buffer: {per_store:.2f} cycles each; {_spread([t])}",
        )
    }


def issue_mixes(s: Session) -> list[Mix]:
    """Loops of independent work for several kinds of unit at once (integer adds, FMAs at a width
    every FMA pipe takes whole, scalar float loads and stores), each kind below what its units
    take, so that the core's issue is the limit: each step gives every FMA chain one FMA, so a
    step lasts at least an FMA latency, and the other work fills it."""
    narrow = 128 if s.vector_bits >= 128 else s.vector_bits
    return [
        Mix(adds=4, loads=2, mem_bits=32, unroll=8),
        Mix(adds=8, fmas=(narrow,) * 8, loads=8, mem_bits=32, unroll=2),
        Mix(adds=8, fmas=(narrow,) * 6, loads=6, mem_bits=32, unroll=2),
        Mix(adds=6, fmas=(narrow,) * 6, loads=4, stores=2, mem_bits=32, unroll=2),
    ]


def probe_issue(s: Session) -> dict[str, Finding]:
    """Instructions per cycle of loops that keep several kinds of unit busy at once; the loop's
    instructions are counted in its machine code."""
    mixes = issue_mixes(s)
    s.compile(mixes)
    ipc: dict[str, float] = {}
    runs = []
    for k in mixes:
        insns = s.bench_of(k).loop_instructions(k)
        c, t = s.cycles_per(lambda n, k=k: s.mix(k, n), insns)
        mix = f"{k.adds} adds + {len(k.fmas)} FMAs + {k.loads} loads + {k.stores} stores"
        ipc[mix] = 1.0 / c
        runs.append(t)
    s.details["issue"] = {"instructions_per_cycle": ipc}
    best = max(ipc.values())
    return {
        "core.issue_width": s.checked(
            "core.issue_width",
            max(1, round(best)),
            1,
            16,
            "loops of independent integer adds, FMAs, loads and stores (instructions counted "
            "in the loop's machine code), per step: "
            + ", ".join(f"{k}: {x:.2f}" for k, x in ipc.items())
            + f" per cycle, the best rounded; {_spread(runs)}",
        )
    }


TLB_PAGE_COUNTS = (8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256, 384, 512)


def probe_tlb(s: Session) -> dict[str, Finding]:
    """First-level DTLB entries and miss cost: a cyclic chase over one line per page (4 KiB pages,
    each line in its own L1 set so the data stays in L1), over growing page counts."""
    page = os.sysconf("SC_PAGE_SIZE")
    l1 = s.host.cache(1)
    lines_per_page = max(1, page // l1.line_bytes)
    limit = max(16, (l1.size_kib * 1024 // l1.line_bytes) // 2)  # the chased lines stay in L1
    grid = [n for n in TLB_PAGE_COUNTS if n <= limit]
    buf = s.buffer(max(grid) * page, huge=False)

    def cycles_at(pages: int) -> float:
        order = s.rng.permutation(pages)
        offsets = order * page + (order % lines_per_page) * l1.line_bytes
        start = _link(buf, offsets)
        c, t = s.cycles_per_link(start)
        timings.append(t)
        return c

    timings: list[Timing] = []
    points = {n: cycles_at(n) for n in grid}
    curve = tlb_from_curve(points)
    if curve is not None:  # refine between the last page count at base and the first above
        lo, hi = step_knee(points, curve[2], max(1.0, 0.15 * curve[2])) or (0, 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            points[mid] = cycles_at(mid)
            curve = tlb_from_curve(points)
            if curve is None:
                break
            lo, hi = step_knee(points, curve[2], max(1.0, 0.15 * curve[2])) or (lo, hi)
    s.release(buf)
    s.details["tlb"] = {"cycles_per_access": dict(sorted(points.items()))}
    shown = ", ".join(f"{n}: {points[n]:.1f}" for n in sorted(points))
    how = (
        f"a cyclic chase over one line per {page}-byte page in random page order, the lines in "
        f"distinct L1 sets; cycles per access by pages: {shown}; {_spread(timings)}"
    )
    if curve is None:
        why = f"the TLB held every page count tried (up to {max(points)}: {how})"
        return {p: s.assumed(p, why) for p in ("memory.dtlb_entries", "memory.tlb_miss_cycles")}
    entries, miss, base = curve
    s.details["tlb"].update({"entries": entries, "miss_cycles": miss, "hit_cycles": base})
    return {
        "memory.dtlb_entries": s.checked(
            "memory.dtlb_entries",
            entries,
            4,
            1 << 16,
            f"the last page count at {base:.1f} cycles per access, {how}",
        ),
        "memory.tlb_miss_cycles": s.checked(
            "memory.tlb_miss_cycles", round(miss), 1, 1000, f"the step's height: {how}"
        ),
    }


class RowSweep:
    """The ``Rows`` kernel (``vectors`` adjacent vectors per row, ``fmas`` FMAs on each) over rows
    ``stride`` bytes apart in one buffer of up to ``max_rows`` rows: ``per_row(n)`` times a sweep
    over the first n, in cycles per row, and keeps each reading's timing in ``timings``."""

    def __init__(self, s: Session, fmas: int, stride: int, max_rows: int, vectors: int = 1) -> None:
        self.s, self.stride = s, stride
        self.kernel = Rows(s.vector_bits, fmas, vectors)
        s.compile([self.kernel])
        self.buf = s.buffer(max_rows * stride + stride)
        self.out = s.buffer(OUT_BYTES * Rows.ACCUMULATORS, huge=False)
        self.params = np.array([0.999, 0.001], dtype=np.float32)
        self.timings: list[Timing] = []

    def per_row(self, rows: int) -> float:
        """Cycles per row of sweeps over the first ``rows`` rows."""
        s, k = self.s, self.kernel

        def run(passes: int) -> None:
            s.bench_of(k).call(
                k,
                passes,
                self.buf.addr,
                self.stride,
                0,
                rows,
                1,
                self.params.ctypes.data,
                self.out.addr,
            )

        c, t = s.cycles_per(run, rows)
        self.timings.append(t)
        return c

    def release(self) -> None:
        """Give the buffers back."""
        self.s.release(self.buf)
        self.s.release(self.out)


# rows a page and a line apart walked over by the page-walk probe: around every second-level TLB
WALK_ROW_COUNTS = (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
WALK_BISECTIONS = 3  # readings between the last count in the TLB and the first beyond it
WALK_MIN_STEP_CYCLES = 1.0  # a step smaller than this is noise, not walks


def probe_page_walks(s: Session) -> dict[str, Finding]:
    """The second-level TLB's reach and what a page walk adds to a walk over operand rows: the
    micro-kernel-like row walk of ``Rows`` (one vector per row, no FMAs) over rows a page and a
    line apart (each on its own page, their lines in distinct L1 sets, all in L2 or nearer),
    repeated over the same rows, for growing row counts. While the pages fit the TLB a row
    costs its load; beyond, each row waits for a walk. The entries are the most rows read at
    the fast speed; the walk, how much slower the largest counts read. The buffer asks for huge
    pages, as large arrays get them (numpy advises it): where they are huge and the TLB keeps
    them, no count slows and the walk is measured at 0."""
    from aotune.hwspecs.host import available_memory_bytes

    paths = ("memory.stlb_entries", "memory.page_walk_cycles")
    page, line = int(s.value("memory.page_bytes")), s.host.cache(1).line_bytes
    stride = page + line
    counts = list(WALK_ROW_COUNTS)
    have = available_memory_bytes()
    if have is not None:
        counts = [n for n in counts if n * stride <= have // 4]
    if len(counts) < 3:
        return {p: s.assumed(p, "the rows' memory cannot be spared for the probe") for p in paths}
    sweep = RowSweep(s, 0, stride, max(counts))
    per_row, timings = sweep.per_row, sweep.timings
    points = {n: per_row(n) for n in counts}
    base = min(points[n] for n in counts[:2])
    walked = statistics.median(points[n] for n in counts[-2:])
    kept = lines_a_set_keeps(points, base, walked)  # the same half-way rule, over pages
    if kept is not None and kept < max(counts):  # refine up to the next count read
        lo, hi = kept, min(n for n in points if n > kept)
        for _ in range(WALK_BISECTIONS):
            if hi - lo <= max(1, lo // 16):
                break
            mid = (lo + hi) // 2
            points[mid] = per_row(mid)
            lo, hi = (mid, hi) if points[mid] < base + (walked - base) / 2 else (lo, mid)
        kept = lo
    sweep.release()
    s.details["page_walks"] = {"cycles_per_row": dict(sorted(points.items()))}
    shown = ", ".join(f"{n}: {points[n]:.1f}" for n in sorted(points))
    how = (
        f"a walk reading one {s.vector_bits}-bit vector per row from rows {stride} bytes apart, "
        f"repeated; cycles per row by rows: {shown}; {_spread(timings)}"
    )
    if kept is None or kept >= max(counts) or walked - base < WALK_MIN_STEP_CYCLES:
        return {
            "memory.stlb_entries": s.assumed(
                "memory.stlb_entries", f"no count read slower than the fewest rows ({how})"
            ),
            "memory.page_walk_cycles": Finding(
                0.0, f"measured: no count read slower than the fewest rows, so no walks: {how}"
            ),
        }
    return {
        "memory.stlb_entries": s.checked(
            "memory.stlb_entries",
            kept,
            int(s.value("memory.dtlb_entries")),
            1 << 24,
            f"the most rows read at {base:.1f} cycles per row (under half-way to {walked:.1f}): "
            f"{how}",
        ),
        "memory.page_walk_cycles": s.checked(
            "memory.page_walk_cycles",
            round(walked - base, 1),
            0.0,
            100_000.0,
            f"the largest counts' {walked:.1f} cycles per row less the fewest rows' {base:.1f}: "
            f"{how}",
        ),
    }


def _link(buf: _Buffer, offsets: np.ndarray) -> int:
    """Write a cyclic chain through ``offsets`` (bytes into ``buf``, in visiting order, multiples
    of 8); the address of its first link."""
    words = buf.links()
    nxt = np.roll(offsets, -1)
    words[offsets // 8] = np.uint64(buf.addr) + nxt.astype(np.uint64)
    return buf.addr + int(offsets[0])


def _tlb_window(s: Session) -> int:
    """Pages a chase may use at once without missing the first-level TLB: half its entries, at
    most 32."""
    return max(1, min(32, int(s.value("memory.dtlb_entries")) // 2))


def level_sizes(s: Session, level: int) -> list[int]:
    """Buffer sizes (bytes) whose data lives in cache ``level`` for this core
    (``level_sizes_of`` the host)."""
    return level_sizes_of(s.host, level)


def level_sizes_of(spec: HwSpec, level: int) -> list[int]:
    """Buffer sizes (bytes) whose data lives in cache ``level`` of ``spec``'s core: half of L1 or
    L2; for an outer level, 4x the level inside it and on by doubling up to 3/4 of its size."""
    c = spec.cache(level)
    own = c.size_kib * 1024
    if level == 1:
        return [own // 2]
    inner = spec.cache_bytes_per_core(level - 1)
    if level == 2:
        return [max(own // 2, min(2 * inner, own * 3 // 4))]
    sizes = geometric_sizes(4 * inner, own * 3 // 4)
    return sizes or [(inner + own) // 2]


def probe_cache_latency(s: Session) -> dict[str, Finding]:
    """Load-to-use latency per cache level: a chase through a random cycle over points two lines
    apart, in windows of pages that fit the TLB; the buffer sized for the level. The last level's
    is kept only where it is clearly below the same chase over memory (``steps_to_memory``): on a
    shared machine other tenants can hold it (this slice once read 451 cycles in L3's sizes, where
    kernels ran as if it answered in 55), and a spec with memory's latency as L3's mispredicts
    every kernel that misses L2."""
    out: dict[str, Finding] = {}
    window = _tlb_window(s)
    page = os.sysconf("SC_PAGE_SIZE")
    previous = 0.0
    s.details["cache_latency"] = {}
    for c in s.host.caches:
        spacing = 2 * c.line_bytes  # one line per pair: the adjacent-line prefetch finds nothing
        readings: dict[int, float] = {}
        timings = []
        for size in level_sizes(s, c.level):
            size = max(page, size // page * page)
            readings[size], t = _chase_cycles(s, size, spacing, window)
            timings.append(t)
        best = min(readings.values())
        s.details["cache_latency"][f"L{c.level}"] = {"cycles_by_bytes": readings}
        shown = ", ".join(f"{_size(b)}: {x:.1f}" for b, x in readings.items())
        how = (
            f"a chase through a random cycle over points {spacing} bytes apart, {window}-page "
            f"windows; cycles per access by buffer size: {shown} (the least taken); "
            f"{_spread(timings)}"
        )
        path = f"caches.L{c.level}.latency_cycles"
        if c.level > 1 and c.level == len(s.host.caches):
            beyond, t = _chase_cycles(s, MEMORY_CHASE_FACTOR * c.size_kib * 1024, spacing, window)
            timings.append(t)
            s.details["cache_latency"][f"L{c.level}"]["beyond_cycles"] = beyond
            if not steps_to_memory(best, beyond):
                why = (
                    f"the chase read {best:.0f} cycles per access in this level's sizes and "
                    f"{beyond:.0f} at {MEMORY_CHASE_FACTOR}x its size: no step from it to memory, "
                    "so other tenants hold it now or the chase misses the TLB; rerun later"
                )
                out[path] = s.assumed(path, why)
                s.notes.append(f"L{c.level} latency not measured: {why}.")
                previous = float(out[path].value)
                continue
            how += f"; {beyond:.1f} at {MEMORY_CHASE_FACTOR}x its size (memory)"
        out[path] = s.checked(path, round(best), max(1.0, previous + 0.5), 2000, how)
        previous = float(out[path].value)
    out, notes = latencies_in_order(out, list(out), s.assumed)  # out holds the levels in order
    s.notes.extend(notes)
    return out


def latencies_in_order(
    found: Mapping[str, Finding], paths: Sequence[str], assumed: Callable[[str, str], Finding]
) -> tuple[dict[str, Finding], list[str]]:
    """``found`` with each level's latency (``paths``, inner to outer) below the next level's: a
    level read no faster than the one beyond it was read while other tenants held it (a slice read
    L2 at 101 cycles where L3's was assumed at 72), so it takes the ``assumed`` (closest built-in)
    value, and so does the level beyond where even that is not below it (a spec out of order is
    refused, and the minutes of probes with it). Also returns a note for each level taken so."""
    out, notes = dict(found), []
    for inner, outer in reversed(list(zip(paths, paths[1:]))):
        read, beyond = out[inner].value, out[outer].value
        if read < beyond:
            continue
        why = f"the probe read {read} cycles, no less than {outer}'s {beyond}: read while busy"
        out[inner] = assumed(inner, why)
        if out[inner].value >= beyond:
            out[outer] = assumed(outer, f"below {inner}'s assumed {out[inner].value}")
        notes.append(f"{inner} not measured: {why}; rerun on an idle machine.")
    return out, notes


# a chase this many times the last level's size reads memory's latency, to compare that level's
# with; a level that is there takes well under (Zen 4: L3 55 cycles, memory 330-535)
MEMORY_CHASE_FACTOR = 4
LEVEL_SHARE_OF_MEMORY = 0.6


def steps_to_memory(level_cycles: float, memory_cycles: float) -> bool:
    """Whether a cache level's chase is clearly faster than memory's: at most
    ``LEVEL_SHARE_OF_MEMORY`` of its cycles per access."""
    return level_cycles <= LEVEL_SHARE_OF_MEMORY * memory_cycles


def _chase_cycles(s: Session, size: int, spacing: int, window: int) -> tuple[float, Timing]:
    """Cycles per access of the latency probe's chase over a buffer of ``size`` bytes, each run
    going on from the link the last one stopped at: a run walks far fewer links than a buffer
    beyond the last cache holds (a few MiB of lines in 4 ms at memory's latency), so runs that
    each started over would time the cache, not memory (Zen 4 slice: 45-47 cycles over 128 MiB
    that way in two calibrations, 543-571 going on)."""
    page = os.sysconf("SC_PAGE_SIZE")
    size = max(page, size // page * page)
    buf = s.buffer(size)
    order = chase_order(page // spacing, size // page, window, s.rng)
    reading = s.cycles_per_link_going_on(_link(buf, order * spacing))
    s.release(buf)
    return reading


def lines_a_set_keeps(points: Mapping[int, float], hit: float, miss: float) -> int | None:
    """The most lines of one set that a cyclic sweep still finds in the cache: the largest count
    whose cycles per access stay under half-way from a hit (``hit``) to a miss (``miss``), with
    every smaller count under it too; None where even the fewest lines miss."""
    mark = hit + (miss - hit) / 2
    kept = None
    for lines in sorted(points):
        if points[lines] >= mark:
            break
        kept = lines
    return kept


def probe_set_capacity(s: Session) -> dict[str, Finding]:
    """How many lines one L1 set keeps while a panel sweeps it again and again, as the model's
    ``conflict_slack`` counts them (slack x ways: the lines a set keeps; a tile's own panel may
    claim the usable share of those).

    A chase in a random but fixed cyclic order over R lines one way-size apart (all in one set:
    L1 is indexed by address bits within a page) for growing R: with LRU the sweep hits while
    the set holds all R and misses every time past that. Each access waits for the last, so no
    refill lands ahead of its use: a core whose next level does that for a kernel's independent
    loads would run such panels past this count (the spec's slack above 1), which this does not
    see. Deeper levels are indexed by physical address bits the probe cannot choose, so their
    slack stays assumed."""
    out: dict[str, Finding] = {}
    l1 = s.host.cache(1)
    page = int(s.value("memory.page_bytes"))
    way_bytes = l1.size_kib * 1024 // l1.associativity
    for c in s.host.caches[1:]:
        path = f"caches.L{c.level}.conflict_slack"
        out[path] = s.assumed(
            path, "a set of this level is picked by physical address bits a probe cannot choose"
        )
    path = "caches.L1.conflict_slack"
    if way_bytes > page:
        out[path] = s.assumed(path, f"one L1 way ({way_bytes} B) spans more than a page")
        return out
    ways = l1.associativity
    hit = float(s.value("caches.L1.latency_cycles"))
    miss = float(s.value("caches.L2.latency_cycles")) if len(s.host.caches) > 1 else 4 * hit
    buf = s.buffer((3 * ways + 1) * way_bytes, huge=False)
    readings: dict[int, float] = {}
    timings = []
    for lines in range(max(2, ways // 2), 3 * ways + 1):
        order = s.rng.permutation(lines) * way_bytes
        start = _link(buf, order)
        readings[lines], t = s.cycles_per_link(start)
        timings.append(t)
        if readings[lines] >= miss and lines > ways:
            break  # past the knee: every access misses
    s.release(buf)
    s.details["set capacity"] = {"cycles_by_lines": readings, "way_bytes": way_bytes}
    kept = lines_a_set_keeps(readings, hit, miss)
    shown = ", ".join(f"{n}: {x:.1f}" for n, x in readings.items())
    how = (
        f"a chase in a fixed random cycle over lines {way_bytes} B apart (one L1 set): cycles per "
        f"access by lines: {shown}; {kept} lines stay under half-way from an L1 hit ({hit:g}) to "
        f"an L2 hit ({miss:g}), over {ways} ways; {_spread(timings)}"
    )
    if kept is None:
        out[path] = s.assumed(path, f"even the fewest lines missed ({how})")
        return out
    slack = round(kept / ways, 3)
    out[path] = s.checked(path, slack, 1.0, 16.0, how)
    return out


def addresses_pick_sets(crowded: float, spread: float, near: float, far: float) -> bool:
    """Whether a chase over lines one L2 way apart (``crowded`` cycles per access) read the next
    level where the same chase over lines a way and an L1 way apart (``spread``) read L2: it is
    past half-way from ``near`` (L2's latency) to ``far`` (L3's) above the spread chase."""
    return crowded - spread >= (far - near) / 2


def probe_l2_set_addressing(s: Session) -> dict[str, Finding]:
    """Whether a large array's addresses pick its L2 sets beyond the page offset: a chase in a
    fixed random cycle over twice as many lines as L2 has ways, one L2 way apart (one L2 set
    where the frames lie in address order), against lines a way and an L1 way apart (as many L2
    sets as lines); both in one L1 set, so both miss it on every access. The buffer is private
    memory that asks for huge pages, as numpy's large arrays are (shared memory, as the other
    probes' buffers are, read 23 cycles where numpy's arrays read 97-125 on the Emerald Rapids
    slice)."""
    path = "memory.addresses_pick_l2_sets"
    if len(s.host.caches) < 3:
        return {path: s.assumed(path, "no level beyond L2 for a crowded L2 set to miss to")}
    l1, l2 = s.host.cache(1), s.host.cache(2)
    l1_way = l1.size_kib * 1024 // l1.associativity
    l2_way = l2.size_kib * 1024 // l2.associativity
    if l2_way % l1_way:
        return {path: s.assumed(path, f"an L2 way ({l2_way} B) is not a whole number of L1 ways")}
    near = float(s.value("caches.L2.latency_cycles"))
    far = float(s.value("caches.L3.latency_cycles"))
    if far <= near:
        return {path: s.assumed(path, f"L3's latency ({far:g}) is not above L2's ({near:g})")}
    lines = 2 * l2.associativity
    buf = s.buffer(lines * (l2_way + l1_way), private=True)
    readings, timings = [], []
    for stride in (l2_way, l2_way + l1_way):
        reading, timing = s.cycles_per_link(_link(buf, s.rng.permutation(lines) * stride))
        readings.append(reading)
        timings.append(timing)
    s.release(buf)
    crowded, spread = readings
    picked = addresses_pick_sets(crowded, spread, near, far)
    s.details["L2 set addressing"] = {"crowded": crowded, "spread": spread, "lines": lines}
    how = (
        f"a chase in a fixed random cycle over {lines} lines {l2_way} B apart (one L2 set if the "
        f"addresses pick it), {crowded:.1f} cycles per access, against {l2_way + l1_way} B apart "
        f"({lines} sets), {spread:.1f}; L2 {near:g}, L3 {far:g}: "
        + ("past half-way to L3, so they do" if picked else "not half-way to L3, so they do not")
        + f"; {_spread(timings)}"
    )
    return {path: Finding(picked, f"measured: {how}")}


SET_REFILL_SLACK = 1.25  # a sweep this much slower than its lines in L1 waits on the refills


def set_refill_reading(in_l1: float, swept: float) -> tuple[float, bool]:
    """(cycles between refills of one set, whether the sweep showed them) from cycles per row of a
    sweep whose rows one set keeps (``in_l1``) and of one over more rows than it keeps
    (``swept``): the swept rows' cost where it stands out, else the in-L1 step, which the
    refills then kept pace with (so at most that)."""
    if swept > in_l1 * SET_REFILL_SLACK:
        return swept, True
    return in_l1, False


SWEPT_ROW_LINES = 8  # lines per row of the per-line sweep: their refills outlast its FMA chains


def swept_line_reading(in_l1: float, swept: float, lines: int) -> tuple[float, bool]:
    """(cycles per line, whether the sweep showed them) from cycles per row of sweeps over rows of
    ``lines`` lines, one set each, that L1 keeps (``in_l1``) and that it refills on every sweep
    (``swept``): the swept row's whole cost over its lines where it stands out, else 0. Whole, not
    its excess over ``in_l1``: the probe's row in L1 waits on its FMA chains, which its refills
    overlap, where a micro-kernel's k step, bound by its loads, pays them on top (Emerald Rapids:
    1.48 a line whole, 0.8 in excess; the kernel's rows 1.3-1.5 a line over its k step)."""
    if swept > in_l1 * SET_REFILL_SLACK:
        return swept / lines, True
    return 0.0, False


HIDING_ROW_SPAN = 2.0  # the busy rows' FMAs outlast the swept rows' refills this many times


def swept_line_overlap_reading(refills: float, busy_in_l1: float, busy_swept: float) -> float:
    """The share of the shorter of a row's other work and its refills that the two overlap, from
    cycles per row of rows of several lines swept beyond their set (``refills``, the whole cost a
    refilled row takes) and of the same rows with more FMAs on each vector, kept in L1
    (``busy_in_l1``) and swept (``busy_swept``): 0 where the refills add to the work (the swept
    busy row takes both), 1 where the row takes only the longer, clipped to [0, 1]."""
    shorter = min(refills, busy_in_l1)
    if shorter <= 0.0:
        return 0.0
    return min(1.0, max(0.0, (refills + busy_in_l1 - busy_swept) / shorter))


def probe_set_refills(s: Session) -> dict[str, Finding]:
    """How far apart one L1 set takes its refills, and what each line of a longer row costs:
    independent vector loads sweeping rows one way-size apart (one set per line of a row), one
    FMA each, half as many rows as the set has ways (all hits) against six times as many (each
    row refilled from L2 on every sweep; no more rows than the first-level TLB holds, so no row
    waits for a translation); rows of one vector, then of ``SWEPT_ROW_LINES`` lines, then, where
    those rows' refills stand out, the same rows with FMAs enough to outlast them (busy rows):
    whether the refills run beside other work or after it."""
    path, line_path = "memory.set_refill_cycles", "memory.swept_line_refill_cycles"
    overlap_path = "memory.swept_line_refill_overlap"
    l1 = s.host.cache(1)
    way_bytes = l1.size_kib * 1024 // l1.associativity

    def assumed(why: str) -> dict[str, Finding]:
        return {p: s.assumed(p, why) for p in (path, line_path, overlap_path)}

    if way_bytes > int(s.value("memory.page_bytes")):
        return assumed(f"one L1 way ({way_bytes} B) spans more than a page")
    ways = l1.associativity
    few = max(2, ways // 2)
    many = min(6 * ways, int(s.value("memory.dtlb_entries")))
    if many <= ways:
        return assumed(
            f"the first-level TLB holds no more rows ({many}) than a set has ways ({ways})"
        )
    sweep = RowSweep(s, 1, way_bytes, many)
    in_l1, swept = sweep.per_row(few), sweep.per_row(many)
    sweep.release()
    value, shown = set_refill_reading(in_l1, swept)
    vectors = SWEPT_ROW_LINES * l1.line_bytes * 8 // s.vector_bits
    wide = RowSweep(s, 1, way_bytes, many, vectors=vectors)
    wide_in_l1, wide_swept = wide.per_row(few), wide.per_row(many)
    wide.release()
    per_line, line_shown = swept_line_reading(wide_in_l1, wide_swept, SWEPT_ROW_LINES)
    s.details["set refills"] = {
        "in_l1": in_l1,
        "swept": swept,
        "rows": [few, many],
        "wide_in_l1": wide_in_l1,
        "wide_swept": wide_swept,
    }
    found_overlap = Finding(
        0.0, "measured: the rows' refills did not stand out: none to overlap, 0"
    )
    if line_shown:
        found_overlap = _swept_line_overlap(s, way_bytes, many, few, vectors, wide_swept)
    line_how = (
        f"the same sweeps over rows of {SWEPT_ROW_LINES} lines ({vectors} {s.vector_bits}-bit "
        f"loads, one FMA each): {wide_in_l1:.2f} cycles per row over {few} rows, "
        f"{wide_swept:.2f} over {many}; {_spread(wide.timings)}; "
    )
    if line_shown:
        found_line = s.checked(
            line_path, round(per_line, 2), 0.05, 1000.0, line_how + "the swept row's cost a line"
        )
    else:
        found_line = Finding(
            0.0,
            f"measured: {line_how}the refills did not stand out (within {SET_REFILL_SLACK}x): "
            "0, none claimed",
        )
    how = (
        f"a sweep of independent {s.vector_bits}-bit loads, one FMA each, over rows {way_bytes} B "
        f"apart (one L1 set of {ways} ways): {in_l1:.2f} cycles per row over {few} rows, "
        f"{swept:.2f} over {many}; {_spread(sweep.timings)}; "
    )
    if shown:
        how += "the swept rows' cost: one refill per row"
    else:
        how += (
            f"the refills kept pace with the in-L1 step (within {SET_REFILL_SLACK}x): at most "
            f"that far apart"
        )
    return {
        path: s.checked(path, round(value, 2), 0.5, 1000.0, how),
        line_path: found_line,
        overlap_path: found_overlap,
    }


def _swept_line_overlap(
    s: Session, way_bytes: int, many: int, few: int, vectors: int, refilled: float
) -> Finding:
    """The set-refill probe's busy rows: its rows of several lines with FMAs enough to outlast
    their refills (``refilled`` cycles a row), kept in L1 and swept beyond their set; what the
    two readings say of how much of the refills the rows' other work hides."""
    fmas = max(2, math.ceil(HIDING_ROW_SPAN * refilled * s.vector_fmas_per_cycle / vectors))
    busy = RowSweep(s, fmas, way_bytes, many, vectors=vectors)
    in_l1, swept = busy.per_row(few), busy.per_row(many)
    busy.release()
    s.details["set refills"].update(busy_fmas=fmas, busy_in_l1=in_l1, busy_swept=swept)
    overlap = swept_line_overlap_reading(refilled, in_l1, swept)
    return Finding(
        round(overlap, 2),
        f"measured: the same rows with {fmas} FMAs on each vector: {in_l1:.2f} cycles per row "
        f"over {few} rows, {swept:.2f} over {many}, against {refilled:.2f} for the refilled row "
        f"alone; {_spread(busy.timings)}; the share of the shorter of the row's work and its "
        "refills that the two overlap",
    )


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


LOAD_PROBE = "load ports"  # the name calibrate files the load probe's readings under


def measured_load_rates(details: Mapping[str, Any]) -> Mapping[int, float]:
    """The load probe's rates per width in a session's ``details``: under its own key while it
    runs, under its probe's name once calibrate has kept its settled attempt ({} if it has not
    run)."""
    loads = details.get("loads") or details.get(LOAD_PROBE, {}).get("loads") or {}
    return loads.get("per_cycle", {})


def stream_ceiling_bytes(
    loads_per_cycle: Mapping[int, float], vector_bits: int, ports: int, port_bits: int
) -> float:
    """The most bytes per cycle a stream of ``vector_bits`` loads may plausibly read from L1:
    1.25x the faster of the load rate measured at that width and what the fitted ports take.
    The fit can miss the widest loads (Golden Cove: three ports of 256 bits for narrow loads,
    two 512-bit loads a cycle), and a cap from it alone refused a true reading."""
    rate = ports * min(1.0, port_bits / vector_bits)
    measured = loads_per_cycle.get(vector_bits)
    if measured is not None and measured > 0 and math.isfinite(measured):
        rate = max(rate, measured)
    return 1.25 * rate * vector_bits / 8


def probe_cache_bandwidth(s: Session) -> dict[str, Finding]:
    """Bytes per cycle one core loads from each cache level: volatile vector loads streaming a
    buffer sized for the level."""
    k = Stream(s.vector_bits, 8)
    s.compile([k])
    out: dict[str, Finding] = {}
    s.details["cache_bandwidth"] = {}
    ceiling = stream_ceiling_bytes(
        measured_load_rates(s.details),
        s.vector_bits,
        s.value("core.load_ports"),
        s.value("core.load_width_bits"),
    )
    for c in s.host.caches:
        readings: dict[int, float] = {}
        timings = []
        for size in level_sizes(s, c.level):
            size = max(k.chunk_bytes, size // k.chunk_bytes * k.chunk_bytes)
            buf = s.buffer(size)
            c_per_byte, t = s.cycles_per(
                lambda n, a=buf.addr, b=size: s.bench_of(k).call(k, n, a, b), size
            )
            readings[size] = 1.0 / c_per_byte
            timings.append(t)
            s.release(buf)
        best = max(readings.values())
        s.details["cache_bandwidth"][f"L{c.level}"] = {"bytes_per_cycle_by_bytes": readings}
        shown = ", ".join(f"{_size(b)}: {x:.1f}" for b, x in readings.items())
        how = (
            f"one core streaming {s.vector_bits}-bit loads over a buffer: bytes per cycle by "
            f"buffer size: {shown} (the most taken); {_spread(timings)}"
        )
        path = f"caches.L{c.level}.bandwidth_bytes_per_cycle"
        out[path] = s.checked(path, round(best, 1), 0.1, ceiling, how)
        ceiling = min(ceiling, float(out[path].value) * 1.1)
    return out


def probe_memory_bandwidth(s: Session) -> dict[str, Finding]:
    """GB/s from DRAM with every core streaming its own part of a buffer far beyond the last
    cache."""
    from aotune.codegen.workers import workers
    from aotune.hwspecs.host import available_memory_bytes

    k = Stream(s.vector_bits, 8)
    s.compile([k])
    threads = s.host.core.cores
    llc = s.host.caches[-1].size_kib * 1024
    want = max(256 << 20, 8 * llc)
    have = available_memory_bytes()
    if have is not None:
        want = min(want, have // 4)
    step = k.chunk_bytes * threads
    size = want // step * step
    if size < 4 * llc:
        return {
            "memory.bandwidth_gbs": s.assumed(
                "memory.bandwidth_gbs",
                f"only {size >> 20} MiB could be spared for the probe, under 4x the last cache",
            )
        }
    buf = s.buffer(size)
    share = size // threads
    addr = s.bench_of(k).addresses[k.name]
    shares = [(1, buf.addr + i * share, share, 0, 0, 0, 0, 0) for i in range(threads)]
    t = s.best(lambda: workers().run(addr, shares))
    s.release(buf)
    gbs = size / t.seconds / 1e9
    s.details["memory_bandwidth"] = {"gbs": gbs, "bytes": size, "threads": threads}
    return {
        "memory.bandwidth_gbs": s.checked(
            "memory.bandwidth_gbs",
            round(gbs, 1),
            0.5,
            10_000,
            f"{threads} threads (every core) streaming {s.vector_bits}-bit loads over their "
            f"shares of {_size(size)}: {gbs:.1f} GB/s, {t.describe()}",
        )
    }


# chains the memory-parallelism probe runs side by side; past the 16 integer registers of x86-64
# the chains spill, which adds L1 loads only (Zen 4: 24 chains 25.6 cycles an access, 32: 26.1)
PARALLEL_CHAINS = (1, 2, 4, 8, 12, 16, 20, 24, 32)
PARALLEL_UNROLL = 4  # links per chain per loop iteration
MEMORY_PROBE_MIN_BYTES = 64 << 20  # past any last cache sysfs may under-report


def probe_memory_parallelism(s: Session) -> dict[str, Finding]:
    """Memory's latency and how many of one core's demand misses to it overlap: a chase through a
    random cycle over a buffer far beyond the last cache (as the latency probe's), one chain and
    then several spread evenly around the cycle, each count going on from where the last one
    left off; the most misses in flight is the latency over the fewest cycles per access any
    count of chains reached. Both are assumed, together, where one chain does not read clearly
    slower than the last cache (``steps_to_memory``): the buffer did not reach memory."""
    from aotune.hwspecs.host import available_memory_bytes

    paths = ("memory.latency_cycles", "memory.misses_in_flight")
    llc = s.host.caches[-1]
    page = os.sysconf("SC_PAGE_SIZE")
    size = max(MEMORY_PROBE_MIN_BYTES, MEMORY_CHASE_FACTOR * llc.size_kib * 1024) // page * page
    have = available_memory_bytes()
    if have is not None and size > have // 4:
        return {p: s.assumed(p, f"{_size(size)} cannot be spared for the probe") for p in paths}
    spacing = 2 * llc.line_bytes  # one line per pair, as the latency probe's
    window = _tlb_window(s)
    buf = s.buffer(size)
    order = chase_order(page // spacing, size // page, window, s.rng) * spacing
    _link(buf, order)
    position = np.empty(len(order), dtype=np.int64)  # where each point is in the cycle
    position[order // spacing] = np.arange(len(order))
    heads = np.zeros(max(PARALLEL_CHAINS), dtype=np.uint64)
    readings: dict[int, float] = {}
    timings = []
    at = 0
    for chains in PARALLEL_CHAINS:
        heads[:chains] = [
            buf.addr + int(order[(at + j * len(order) // chains) % len(order)])
            for j in range(chains)
        ]
        readings[chains], t = s.cycles_per(
            lambda n, c=chains: s.chases(heads.ctypes.data, c, PARALLEL_UNROLL * n),
            PARALLEL_UNROLL * chains,
        )
        timings.append(t)
        at = int(position[(int(heads[0]) - buf.addr) // spacing])  # the first chain's last point
    s.release(buf)
    latency = readings[1]
    fewest = min(readings.values())
    s.details["memory_parallelism"] = {"cycles_per_access_by_chains": readings, "bytes": size}
    shown = ", ".join(f"{c}: {x:.1f}" for c, x in readings.items())
    how = (
        f"chases through a random cycle over points {spacing} bytes apart in {_size(size)} "
        f"(every other line), {window}-page windows; cycles per access by chains side by side: "
        f"{shown}; {_spread(timings)}"
    )
    last = float(s.value(f"caches.L{llc.level}.latency_cycles"))
    if not steps_to_memory(last, latency) or latency > 100_000:
        why = (
            f"one chain read {latency:.0f} cycles per access, not clearly beyond the last "
            f"cache's {last:g}, so the buffer did not reach memory ({how})"
        )
        return {p: s.assumed(p, why) for p in paths}
    return {
        "memory.latency_cycles": Finding(round(latency), f"measured: one chain: {how}"),
        "memory.misses_in_flight": s.checked(
            "memory.misses_in_flight",
            round(misses_in_flight(readings), 1),
            1.0,
            1024.0,
            f"one chain's {latency:.1f} cycles over the fewest per access ({fewest:.2f}): {how}",
        ),
    }


def probe_prefetch_stride(s: Session) -> dict[str, Finding]:
    """The largest stride the hardware prefetcher follows: a dependent walk at a fixed stride
    against the same lines in random order, over lines that live in L2 (4x L1 of them)."""
    page = int(s.value("memory.page_bytes"))
    l1 = s.host.cache(1)
    lines = 4 * l1.size_kib * 1024 // l1.line_bytes
    strides = geometric_sizes(l1.line_bytes, page)
    hit = float(s.value("caches.L1.latency_cycles"))
    miss = float(s.value("caches.L2.latency_cycles"))  # the lines live in L2: 4x L1 of them
    buf = s.buffer(lines * max(strides), huge=False)
    window = _tlb_window(s)
    strided, scattered, timings = {}, {}, []
    for stride in strides:
        offsets = np.arange(lines, dtype=np.int64) * stride
        # the same lines in random order, a window of pages at a time: as many TLB misses as the
        # strided walk has, so the two differ only in what the prefetcher can do
        per_page = max(1, page // stride)
        shuffled = offsets[chase_order(per_page, lines // per_page, window, s.rng)]
        for order, into in ((offsets, strided), (shuffled, scattered)):
            start = _link(buf, order)
            into[stride], t = s.cycles_per_link(start)
            timings.append(t)
    s.release(buf)
    s.details["prefetch_stride"] = {
        "strided": strided,
        "random": scattered,
        "hit": hit,
        "miss": miss,
    }
    shown = ", ".join(f"{st}: {strided[st]:.1f} vs {scattered[st]:.1f}" for st in strides)
    how = (
        f"a dependent walk over {lines} lines at a fixed stride against the same lines in "
        f"random order ({window}-page windows); cycles per access by stride in bytes: "
        f"{shown}; followed where the walk takes less than half-way from an L1 hit "
        f"({hit:g}) to an L2 hit ({miss:g}), or to the random order where that is less; "
        f"{_spread(timings)}"
    )
    stride = followed_strides(strided, scattered, hit, miss)
    if stride is None:
        return {
            "memory.prefetch_stride_bytes": s.assumed(
                "memory.prefetch_stride_bytes", f"no stride was followed ({how})"
            )
        }
    return {
        "memory.prefetch_stride_bytes": s.checked(
            "memory.prefetch_stride_bytes", stride, l1.line_bytes, page, how
        )
    }


FAR_STRIDE_PAGES = (1, 2, 3, 4, 6, 8, 12, 16)  # strides of the far-prefetch walk, in pages


def far_walk_shape(page: int, l2_bytes: int, last_bytes: int, stlb: int) -> tuple[int, list[int]]:
    """(lines, strides in bytes) of the far-prefetch walk: twice the lines L2 holds at a page's
    stride (its few sets cannot keep them), on fewer pages than half the second-level TLB, and
    only strides at which the last level keeps twice those lines whatever its set mapping."""
    lines = max(64, min(2 * l2_bytes // page, stlb // 2))
    return lines, [n * page for n in FAR_STRIDE_PAGES if n * page * 2 * lines <= last_bytes]


def probe_far_prefetch(s: Session) -> dict[str, Finding]:
    """How far apart accesses may be and still have a prefetcher bring their lines from the last
    level into L2 ahead of a walk: a dependent walk at fixed strides of a page and more over lines
    that live in the last level (``far_walk_shape``), each on its own page, so that every step
    pays the same first-level TLB miss. Followed where a step costs less than half-way from an L2
    hit to a last-level hit, each plus that miss (``far_followed_stride``); the wait is the
    followed steps' median."""
    paths = ("memory.far_prefetch_stride_bytes", "memory.far_prefetch_wait_cycles")
    if len(s.host.caches) < 3:
        return {p: s.assumed(p, "no level beyond L2 for a walk to come from") for p in paths}
    page = int(s.value("memory.page_bytes"))
    lines, strides = far_walk_shape(
        page,
        s.host.cache_bytes_per_core(2),
        s.host.caches[-1].size_kib * 1024,
        int(s.value("memory.stlb_entries")),
    )
    if not strides:
        return {p: s.assumed(p, "the last level is too small for the walk") for p in paths}
    buf = s.buffer(lines * max(strides), huge=False)
    walk, timings = {}, []
    for stride in strides:
        start = _link(buf, np.arange(lines, dtype=np.int64) * stride)
        walk[stride], t = s.cycles_per_link(start)
        timings.append(t)
    s.release(buf)
    tlb = float(s.value("memory.tlb_miss_cycles"))
    l2_hit = float(s.value("caches.L2.latency_cycles")) + tlb
    last_hit = float(s.value(f"caches.L{len(s.host.caches)}.latency_cycles")) + tlb
    s.details["far_prefetch"] = {"walk": walk, "l2_hit": l2_hit, "last_hit": last_hit}
    shown = ", ".join(f"{st}: {walk[st]:.1f}" for st in strides)
    how = (
        f"a dependent walk over {lines} lines at a fixed stride, each on its own page; cycles "
        f"per step by stride in bytes: {shown}; followed where a step takes less than half-way "
        f"from an L2 hit ({l2_hit:g}) to a last-level hit ({last_hit:g}), each with a "
        f"first-level TLB miss; {_spread(timings)}"
    )
    found = far_followed_stride(walk, l2_hit, last_hit)
    if found is None:
        near = int(s.value("memory.prefetch_stride_bytes"))
        return {
            "memory.far_prefetch_stride_bytes": Finding(
                near, f"measured: no stride of a page or more followed, so the near one: {how}"
            ),
            "memory.far_prefetch_wait_cycles": Finding(
                last_hit, f"measured: not followed, so a last-level hit: {how}"
            ),
        }
    stride, wait = found
    return {
        "memory.far_prefetch_stride_bytes": s.checked(
            "memory.far_prefetch_stride_bytes", stride, page, 1 << 20, how
        ),
        "memory.far_prefetch_wait_cycles": s.checked(
            "memory.far_prefetch_wait_cycles",
            round(wait, 1),
            1.0,
            100_000.0,
            f"the median step of the followed strides: {how}",
        ),
    }


AHEAD_DISTANCES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
ROW_FMAS = (12, 24, 48, 96, 192, 384)  # FMAs per row the distance probe may do


def row_fmas(row_bytes: float, ghz: float, gbs_per_core: float, fma_per_cycle: float) -> int:
    """FMAs per row that keep a row walk's demand on memory (``row_bytes`` per row) at a quarter
    of one core's share of the memory bandwidth, so that the walk waits on latency, not
    bandwidth (the largest of ROW_FMAS when none does)."""
    for fmas in ROW_FMAS:
        cycles_per_row = fmas / fma_per_cycle
        if row_bytes * ghz / cycles_per_row <= 0.25 * gbs_per_core:
            return fmas
    return ROW_FMAS[-1]


def probe_prefetch_ahead(s: Session) -> dict[str, Finding]:
    """How far ahead a software prefetch must go: a micro-kernel-like walk over rows a page apart
    (a stride no hardware prefetcher follows) that come from memory, beyond the last cache, with
    FMA work per row, prefetching each row some rows ahead; the fewest rows that keep it within
    10% of the same walk over rows that all hit, in cycles."""
    page = int(s.value("memory.page_bytes"))
    stride = max(page, 2 * Rows.SLOT_BYTES)
    slots = stride // Rows.SLOT_BYTES
    llc = s.host.caches[-1].size_kib * 1024
    rows = max(1024, 4 * llc // stride)
    fma_rate = s.vector_fmas_per_cycle
    per_core = s.value("memory.bandwidth_gbs") / s.host.core.cores
    fmas = row_fmas(2 * s.host.cache(1).line_bytes, s.ghz, per_core, fma_rate)
    k = Rows(s.vector_bits, fmas)
    s.compile([k])
    buf = s.buffer(rows * stride + stride)
    out_addr = buf.addr + rows * stride  # the accumulators land past the rows
    params = np.array([0.999, 0.001], dtype=np.float32)

    def per_row(row_stride: int, distance: int, n_slots: int) -> tuple[float, Timing]:
        def run(passes: int) -> None:
            s.bench_of(k).call(
                k,
                passes,
                buf.addr,
                row_stride,
                distance,
                rows,
                n_slots,
                params.ctypes.data,
                out_addr,
            )

        return s.cycles_per(run, rows)

    reference, t_ref = per_row(0, 0, 1)
    readings, timings = {}, [t_ref]
    for distance in AHEAD_DISTANCES:
        readings[distance], t = per_row(stride, distance, slots)
        timings.append(t)
        if readings[distance] <= reference * 1.1:
            break
    s.release(buf)
    s.details["prefetch_ahead"] = {
        "reference": reference,
        "cycles_per_row": readings,
        "fmas_per_row": fmas,
    }
    shown = ", ".join(f"{d}: {x:.1f}" for d, x in readings.items())
    how = (
        f"{rows} rows {stride} bytes apart ({_size(rows * stride)}, beyond the last cache) read "
        f"one {s.vector_bits}-bit vector each, {fmas} FMAs per row (a quarter of a core's share "
        f"of the memory bandwidth); cycles per row by rows prefetched ahead: {shown}, "
        f"{reference:.1f} when every row hits; {_spread(timings)}"
    )
    need = lead_needed(readings, reference)
    if need is None:
        return {
            "memory.prefetch_ahead_cycles": s.assumed(
                "memory.prefetch_ahead_cycles", f"no distance reached the hit speed ({how})"
            )
        }
    ahead = max(1, round(max(1, need) * reference))
    lead = (
        f"{need} rows ahead at {reference:.1f} cycles per row"
        if need
        else f"no prefetch was needed at {reference:.1f} cycles per row (the reorder window "
        "covered the wait), so one row's cycles are the lead: an upper bound"
    )
    return {
        "memory.prefetch_ahead_cycles": s.checked(
            "memory.prefetch_ahead_cycles", ahead, 1, 100_000, f"{lead}: {how}"
        )
    }


def probe_handover(s: Session) -> dict[str, Finding]:
    """How long a cache line takes to move between two cores (``codegen/workers.py``'s probe);
    no spec field holds it yet, so it is reported only."""
    from aotune.codegen.workers import workers

    if s.host.core.cores < 2:
        s.notes.append("core-to-core hand-over: not measured (one CPU)")
        return {}
    readings = [workers().handoff_seconds(repeats=5) for _ in range(3)]
    seconds = [r for r in readings if r is not None]
    if not seconds:
        s.notes.append(
            "core-to-core hand-over: not measured (other work on the CPUs hid it; "
            "calibrate again on a quiet machine to see it)"
        )
        return {}
    ns = min(seconds) * 1e9
    s.details["handover"] = {"ns": ns}
    s.notes.append(
        f"Core-to-core hand-over of a cache line (codegen/workers.py's probe, fastest of "
        f"{len(seconds)}): "
        f"{ns:.0f} ns; on a VM it changes with the host's placement of the virtual CPUs."
    )
    return {}


def probe_overhead(s: Session) -> dict[str, Finding]:
    """What a call costs as the runner makes it: a 1 x 16 x 1 matmul (an empty kernel) through
    ``HostKernel``, on one thread and on every core."""
    from aotune.analysis.workload import matmul
    from aotune.codegen.schedule import schedule_from_config
    from aotune.constraints.cpu import build_cpu_space

    cores = s.host.core.cores
    calls_per_run = 100

    def seconds_per_call(threads: int) -> tuple[float, Timing]:
        space = build_cpu_space(matmul(threads, 16, 1), s.host)
        sched = schedule_from_config(space, space.solve(allowed={"threads": [threads]}))
        return _kernel_call_seconds(s, sched, calls_per_run)

    one, t1 = seconds_per_call(1)
    out = {
        "overhead.call_seconds": s.checked(
            "overhead.call_seconds",
            float(f"{one:.3g}"),
            1e-8,
            1e-3,
            f"a 1 x 16 x 1 matmul through codegen/runner.py's HostKernel call path, "
            f"{calls_per_run} calls per run, {t1.describe()}: {one * 1e6:.2f} us per call",
        )
    }
    s.details["overhead"] = {"call_seconds": one}
    if cores < 2:
        out["overhead.thread_seconds"] = s.assumed(
            "overhead.thread_seconds", "one CPU: no second thread to measure"
        )
        return out
    many, tn = seconds_per_call(cores)
    per = per_thread_cost(one, many, cores)
    s.details["overhead"].update({"all_threads_call_seconds": many, "thread_seconds": per})
    out["overhead.thread_seconds"] = s.checked(
        "overhead.thread_seconds",
        float(f"{per:.3g}"),
        0.0,
        1e-3,
        f"the same call split over {cores} threads (codegen/workers.py's pool), "
        f"{tn.describe()}: {many * 1e6:.2f} us per call, {per * 1e6:.2f} us per thread beyond "
        "the first",
    )
    return out


# (rows, vectors) of the call probe's tiles: enough accumulators to keep every target's FMA pipes
# busy, so that each call's C tile loads and stores fit in the ports' idle cycles
CALL_PROBE_TILES = ((8, 1), (6, 2))
CALL_PROBE_K = 64


def call_probe_schedule(spec: HwSpec, rows: int, vectors: int, kc: int) -> CpuSchedule | None:
    """The schedule the call probes time: a matmul with K = ``CALL_PROBE_K`` and A in half of a
    core's L2, unpacked, one ``rows`` x ``vectors`` tile per m block with the k blocks inside
    (mkn), so the C tile stays in L1 from one call to the next; None where the target's tile space
    has no such tile."""
    n = vectors * spec.isa.vector_bits // 32
    l2 = spec.cache_bytes_per_core(2)
    m = max(48, min(2048, l2 // 2 // (CALL_PROBE_K * 4))) // rows * rows
    fixed = {"mr": rows, "nr": n, "kc": kc, "mc": rows, "nc": n, "pack_a": 0, "pack_b": 0}
    fixed |= {"threads": 1, "unroll": 1, "order": "mkn"}
    return _fixed_matmul_schedule(spec, (m, n, CALL_PROBE_K), fixed)


def _fixed_matmul_schedule(
    spec: HwSpec, shape: tuple[int, int, int], fixed: Mapping[str, int | str]
) -> CpuSchedule | None:
    """The schedule of an M x N x K matmul with the decisions ``fixed`` (``order`` and ``par``
    by name), solved by CP-SAT for the rest; None where the target's tile space has none."""
    from aotune.analysis.workload import matmul
    from aotune.codegen.schedule import schedule_from_config
    from aotune.constraints.cpu import ORDERS, PAR_LOOPS, build_cpu_space
    from aotune.errors import AotuneError

    names = {"order": ORDERS, "par": PAR_LOOPS}
    allowed = {key: [names[key].index(v) if key in names else v] for key, v in fixed.items()}
    try:
        space = build_cpu_space(matmul(*shape), spec)
        return schedule_from_config(space, space.solve(allowed=allowed))
    except AotuneError:
        return None


def _kernel_call_seconds(
    s: Session, sched: CpuSchedule, calls_per_run: int = 20
) -> tuple[float, Timing]:
    """(seconds per call, reading) of the kernel built from ``sched``, through the runner."""
    t = s.best(_kernel_runs(s, sched, calls_per_run), subtract=False)
    return t.seconds / calls_per_run, t


def _kernel_runs(s: Session, sched: CpuSchedule, calls: int) -> Callable[[], None]:
    """A run of ``calls`` calls of the kernel built from ``sched``, through the runner, on fixed
    inputs (compiled once, timed as often as needed)."""
    from aotune.codegen.compile import compile_kernel
    from aotune.codegen.runner import HostKernel, random_operands

    call = HostKernel(compile_kernel(sched, s.host), s.host).call_on(*random_operands(sched))

    def run() -> None:
        for _ in range(calls):
            call()

    return run


def probe_call_cycles(s: Session) -> dict[str, Finding]:
    """The cycles a micro-kernel call costs beyond its k steps, C tile loads and stores.

    The real generated kernel of ``call_probe_schedule`` runs with kc = 8 and with kc = 64: the
    first makes 7 more calls per tile over the same k steps. The tiles keep the FMA pipes busy,
    so the C tile's loads and stores go in the ports' idle cycles (what the model charges for
    them then: nothing); the time per extra call is the call's own. The mean over
    ``CALL_PROBE_TILES``.
    """
    from aotune.analysis.model import c_tile_port_cycles

    path = "core.call_cycles"
    per_tile: list[tuple[str, float]] = []
    timings: list[Timing] = []
    skipped: list[str] = []
    core = s.spec_so_far()
    for rows, vectors in CALL_PROBE_TILES:
        short = call_probe_schedule(s.host, rows, vectors, 8)
        long = call_probe_schedule(s.host, rows, vectors, CALL_PROBE_K)
        if short is None or long is None:
            continue  # this target's space has no such tile: the other tile measures
        if c_tile_port_cycles(short, core) > 0:
            # load-bound on this core (e.g. 2 load ports beside issue 5): its C tile's loads
            # would be timed with the call
            skipped.append(f"{rows} x {short.N}")
            continue
        (t_short, r_short), (t_long, r_long) = (_kernel_call_seconds(s, x) for x in (short, long))
        timings += [r_short, r_long]
        extra_calls = short.M // rows * (CALL_PROBE_K // 8 - 1)
        per_call = cycles_per_extra_call(t_short, t_long, s.ghz, extra_calls)
        per_tile.append((f"{rows} x {short.N}", per_call))
    if not per_tile:
        why = "no probe tile fits this target's tile space" + (
            f" with its C tile's loads in the ports' idle cycles ({', '.join(skipped)} left out)"
            if skipped
            else ""
        )
        return {path: s.assumed(path, why)}
    value = statistics.mean(c for _, c in per_tile)
    s.details["call cycles"] = dict(per_tile)
    left_out = (
        f" ({', '.join(skipped)} left out: its C tile's loads do not fit in this core's idle "
        "load-port cycles)"
        if skipped
        else ""
    )
    how = (
        f"the real kernel of a matmul with K = {CALL_PROBE_K} (C tiles in L1, FMA-bound tiles), "
        f"kc = 8 against kc = {CALL_PROBE_K}, 7 more calls per tile: "
        + ", ".join(f"{name} tiles {c:.1f}" for name, c in per_tile)
        + f" cycles per extra call (mean taken){left_out}; {_spread(timings)}"
    )
    return {path: s.checked(path, round(value, 1), 0.0, 1000.0, how)}


def probe_scheduler(s: Session) -> dict[str, Finding]:
    """How many FMAs waiting on their chains the core holds: consecutive calls of a 1-accumulator
    tile (one dependent chain of kc = 64 FMAs each) overlap as far as the schedulers let them.

    The real kernel of ``call_probe_schedule``'s 1 x one-vector tile: its k steps take the FMA
    latency over the calls in flight; beside the running call, the later ones' (calls in flight
    - 1) x kc FMAs wait in the schedulers. Needs the clock, the FMA latency, the call overhead and
    the call cycles measured before it.
    """
    path, kc = "core.scheduler_entries", CALL_PROBE_K
    sched = call_probe_schedule(s.host, 1, 1, kc)
    if sched is None:
        return {path: s.assumed(path, "no 1-row tile in this target's tile space")}
    seconds, t = _kernel_call_seconds(s, sched)
    latency = s.value("core.fma_latency_cycles")
    in_flight = chains_in_flight(
        seconds,
        s.value("overhead.call_seconds"),
        s.ghz,
        sched.M,
        s.value("core.call_cycles"),
        kc,
        latency,
    )
    per_step = latency / in_flight
    s.details["scheduler"] = {"cycles_per_step": per_step, "calls_in_flight": in_flight}
    how = (
        f"the real kernel of a 1 x {sched.N} tile, one chain of kc = {kc} FMAs per call, "
        f"{sched.M} calls (C tiles in L1): {per_step:.2f} cycles per k step against the FMA "
        f"latency {latency}, so {in_flight:.2f} calls' chains in flight; {t.describe()}"
    )
    waiting = round((in_flight - 1.0) * kc)  # the running call's chain holds no entries
    return {path: s.checked(path, waiting, 1, 4096, how)}


# The alias probe's kernel: 8 x one-vector tiles stepping down 9 tiles of rows, kc = 24 (short
# calls, where the wait shows), 32 k blocks (a reading long beside the threads' hand-over)
ALIAS_PROBE_ROWS, ALIAS_PROBE_TILES, ALIAS_PROBE_KC, ALIAS_PROBE_BLOCKS = 8, 9, 24, 32
# the two kernels differ by ~20% a call: single pairs of readings read 0.4-1.9 cycles a pair over
# runs here, five interleaved pairs agree within a run (their median is the value)
ALIAS_PROBE_READINGS = 5


def alias_probe_schedule(spec: HwSpec, n: int) -> CpuSchedule | None:
    """The schedule the store-alias probe times: a matmul with N = ``n`` (C rows ``4 n`` bytes
    apart), one block of all ``ALIAS_PROBE_TILES`` row tiles and all columns, the k blocks
    outside it (nmk), so each call steps down C's rows from the last one and adds C to its tile
    from L2, as a tuned kernel's calls do; B packed (unpacked, its rows a page apart would crowd
    one L1 set); the columns split over every core, as tuned kernels run (the wait measured 0.6
    cycles a pair on one Zen 4 core, 1.0 with both busy). None where the target's tile space has
    no such tile."""
    rows, lanes = ALIAS_PROBE_ROWS, spec.isa.vector_bits // 32
    m, k = rows * ALIAS_PROBE_TILES, ALIAS_PROBE_KC * ALIAS_PROBE_BLOCKS
    fixed = {"mr": rows, "nr": lanes, "kc": ALIAS_PROBE_KC, "mc": m, "nc": n, "pack_a": 0}
    fixed |= {"pack_b": 1, "threads": spec.core.cores, "unroll": 1, "order": "nmk", "par": "n"}
    return _fixed_matmul_schedule(spec, (m, n, k), fixed)


def per_call_difference_cycles(
    seconds: Sequence[float], per_run: int, overhead: float, calls: Sequence[int], ghz: float
) -> float:
    """Cycles the first kernel's micro-kernel calls take beyond the second's, each: runs of
    ``per_run`` kernel calls of ``seconds`` each (the first, the second), less the kernel
    call's ``overhead``, over each kernel's micro-kernel ``calls``."""
    if per_run < 1 or min(calls) < 1:
        raise CalibrationError("a difference per call needs runs of calls on both sides")
    first, second = ((t / per_run - overhead) / n for t, n in zip(seconds, calls))
    return cycles(first - second, ghz)


def alias_wait_cycles(
    aliased: float, clear: float, ghz: float, calls: tuple[int, int], pairs: float
) -> float:
    """Cycles per aliasing (load, store) pair: the seconds per call of the kernel whose C rows
    alias (``aliased``, ``calls[0]`` calls) less those of the one whose rows do not (``clear``,
    ``calls[1]``), over the aliasing pairs per call."""
    if pairs <= 0 or min(calls) < 1:
        raise CalibrationError("an alias reading needs aliasing pairs and calls on both sides")
    return max(0.0, per_call_difference_cycles((aliased, clear), 1, 0.0, calls, ghz)) / pairs


def probe_store_alias(s: Session) -> dict[str, Finding]:
    """How long a load waits per older store it matches only in the page-offset bits.

    The real kernel of ``alias_probe_schedule`` with C rows one page apart (every row of a call's
    tile aliases every row of the last call's: 8 x 8 pairs) and one vector further apart (none);
    the difference per call, over the pairs, is the wait. Needs the clock and the call overhead
    measured before it."""
    from aotune.analysis.model import ThreadShare, aliasing_row_pairs

    path = "core.store_alias_cycles"
    page, lanes = s.host.memory.page_bytes, s.host.isa.vector_bits // 32
    scheds = [alias_probe_schedule(s.host, n) for n in (page // 4, page // 4 + lanes)]
    if scheds[0] is None or scheds[1] is None:
        return {path: s.assumed(path, "no 8-row one-vector tile in this target's tile space")}
    overhead = s.value("overhead.call_seconds")
    per_run = 20
    runs = [_kernel_runs(s, x, per_run) for x in scheds]
    calls = (ThreadShare.of(scheds[0]).calls, ThreadShare.of(scheds[1]).calls)
    rows = ALIAS_PROBE_ROWS
    pairs = aliasing_row_pairs(rows, rows, page, page) * (1 - 1 / ALIAS_PROBE_BLOCKS)
    readings: list[Timing] = []
    waits = []
    for _ in range(ALIAS_PROBE_READINGS):  # interleaved: both kernels under the same drift
        aliased, clear = (s.best(run, subtract=False) for run in runs)
        readings += [aliased, clear]
        waits.append(
            alias_wait_cycles(
                aliased.seconds / per_run - overhead,
                clear.seconds / per_run - overhead,
                s.ghz,
                calls,
                pairs,
            )
        )
    wait = statistics.median(waits)
    s.details["store alias"] = {"cycles_per_pair": wait, "readings": waits}
    how = (
        f"the real kernel of {rows} x {lanes} tiles on {scheds[0].threads} threads stepping "
        f"down C rows {page} bytes apart "
        f"(each call's {rows} C loads alias the last call's {rows} stores) against "
        f"{page + 4 * lanes} bytes apart (none alias), kc = {ALIAS_PROBE_KC}: the difference per "
        f"call over {pairs:.0f} pairs, the median of "
        + ", ".join(f"{w:.2f}" for w in waits)
        + f" from {ALIAS_PROBE_READINGS} interleaved pairs of readings; {_spread(readings)}"
    )
    return {path: s.checked(path, round(wait, 2), 0.0, 100.0, how)}


# The shared-line probe's kernel: one register tile per thread across C's columns (the threads
# split them, par=n), 32 row tiles, kc = 8 (short calls, where the wait shows), 96 k blocks
SHARED_PROBE_TILES, SHARED_PROBE_KC, SHARED_PROBE_BLOCKS = 32, 8, 96
# readings of interleaved rounds; each kernel keeps its fastest round of all, as the bench's do
SHARED_PROBE_READINGS, SHARED_PROBE_ROUNDS = 5, 8
SHARED_PROBE_ROWS = (8, 4, 2, 1)  # the tallest tile the target's space has


def shared_probe_schedules(spec: HwSpec) -> tuple[CpuSchedule, CpuSchedule] | None:
    """The shared-line probe's two kernels: a matmul whose columns two or more threads split
    (par=n) as one tile each, ``nr`` columns wide and a whole number of L1 line pairs, down the
    same rows at once; N = threads x nr (every thread's columns start a line pair: no line is
    shared) against one column fewer (the last thread's tile ends a column short, still as many
    vectors, and the splits fall mid-line on most rows: 15 of 16 at 64-byte lines). B packed, A
    in place, nmk. None where the target has one core or no such tile."""
    if spec.core.cores < 2:
        return None
    lanes, pair = spec.isa.vector_bits // 32, 2 * spec.cache(1).line_bytes
    nr = lanes * (pair // math.gcd(pair, 4 * lanes))  # whole vectors, whole line pairs
    k = SHARED_PROBE_KC * SHARED_PROBE_BLOCKS
    for mr in SHARED_PROBE_ROWS:
        m, n = mr * SHARED_PROBE_TILES, nr * spec.core.cores
        fixed: dict[str, int | str] = {"mr": mr, "nr": nr, "kc": SHARED_PROBE_KC, "mc": m}
        fixed |= {"nc": n, "pack_a": 0, "pack_b": 1, "threads": spec.core.cores, "unroll": 1}
        fixed |= {"order": "nmk", "par": "n"}
        shared = _fixed_matmul_schedule(spec, (m, n - 1, k), fixed)
        clear = _fixed_matmul_schedule(spec, (m, n, k), fixed)
        if shared is not None and clear is not None:
            return shared, clear
    return None


def shared_line_cycles(
    extra_cycles_per_call: float, model_extra: Callable[[float], float]
) -> float:
    """The price of a shared C line at which the model's extra cycles per call of the shared
    kernel over the clear one (``model_extra``, linear in the price) match the measured ones:
    read through the model, so whatever else it charges one kernel and not the other (a masked
    row end, rows a page apart on a many-core host) is not taken for the lines' wait."""
    at_one = model_extra(1.0)
    slope = model_extra(2.0) - at_one
    if slope <= 0:
        raise CalibrationError("a shared-line reading needs the model to charge the lines")
    return max(0.0, (extra_cycles_per_call - (at_one - slope)) / slope)


def shared_kernels_model_extra(
    spec: HwSpec,
    shared: CpuSchedule,
    clear: CpuSchedule,
    path: str = "memory.shared_line_store_cycles",
) -> Callable[[float], float]:
    """The model's extra micro-kernel cycles per call of ``shared`` over ``clear`` on ``spec``
    with the price at ``path`` (a shared C line's, or a shared pair's) set to the argument
    (tier 1: the kernels' k steps from their schedules, as both run the same loop); each price
    is priced once."""
    from aotune.analysis.model import ThreadShare, micro_kernel_cycles, mix_from_schedule

    def per_call(h: HwSpec, x: CpuSchedule) -> float:
        share = ThreadShare.of(x)
        return micro_kernel_cycles(x, h, mix_from_schedule(x, h), share)[0] / share.calls

    @functools.cache
    def extra(price: float) -> float:
        h = with_value(spec, path, price)
        return per_call(h, shared) - per_call(h, clear)

    return extra


def _side_by_side_readings(runs: Sequence[Callable[[], None]]) -> list[tuple[float, ...]]:
    """``SHARED_PROBE_READINGS`` readings of the kernels ``runs`` timed as the bench's accuracy
    rows time kernels: interleaved rounds of a short warm-up and a few calls, each kernel's
    fastest round (``codegen.runner.time_side_by_side``); seconds per run, in ``runs``' order."""
    from aotune.benchmarks.suite import ACCURACY_ROUND_SECONDS, ACCURACY_WARMUP_SECONDS
    from aotune.codegen.runner import time_side_by_side

    readings = []
    for _ in range(SHARED_PROBE_READINGS):
        timed = time_side_by_side(
            runs,
            min_runs=5,
            min_seconds=ACCURACY_ROUND_SECONDS * SHARED_PROBE_ROUNDS,
            rounds=SHARED_PROBE_ROUNDS,
            warmup_seconds=ACCURACY_WARMUP_SECONDS,
        )
        readings.append(tuple(seconds for seconds, _, _ in timed))
    return readings


def _shared_price_readings(
    s: Session,
    kernels: tuple[CpuSchedule, CpuSchedule],
    model_extra: Callable[[float], float],
) -> tuple[float, list[float], str]:
    """(price, each reading's price, the core hand-over read beside them) of a shared-line or
    line-pair probe: its two kernels (the one sharing, the one not) timed side by side
    (``_side_by_side_readings``), each difference per call read through the model's price of
    the two (``shared_line_cycles``); the price from each kernel's fastest round of all, as the
    bench keeps a kernel's fastest round."""
    from aotune.analysis.model import ThreadShare
    from aotune.codegen.workers import workers

    calls = [_kernel_runs(s, x, 1) for x in kernels]
    handover = workers().handoff_seconds(repeats=5)
    call_counts = tuple(ThreadShare.of(x).calls for x in kernels)

    def price_of(both: float, apart: float) -> float:
        extra = per_call_difference_cycles((both, apart), 1, 0.0, call_counts, s.ghz)
        return shared_line_cycles(extra, model_extra)

    readings = _side_by_side_readings(calls)
    prices = [price_of(*r) for r in readings]
    price = price_of(*(min(r[i] for r in readings) for i in range(2)))
    near = f"{handover * 1e9:.0f} ns" if handover is not None else "not read"
    return price, prices, near


def probe_shared_lines(s: Session) -> dict[str, Finding]:
    """What a store of a C line another core wrote since adds to a visit, as the threads of a
    par=n kernel meet such lines on every row: ``shared_probe_schedules``' two kernels timed as
    the bench's accuracy rows time kernels (interleaved rounds of a short warm-up and a few
    calls, each kernel's fastest round: ``codegen.runner.time_side_by_side``); the difference per
    call read through the model's own price of the two kernels (``shared_line_cycles``): what
    else it charges one and not the other is not the lines' wait, and the lines count as it
    counts them. Timed as one long run instead (``best``),
    the shared kernel slowed to 1.5-5x its rounds' time on the Zen 4 slice while the other kept
    its own (README, stop 119): the price is that of the kernels the model ranks, not of a
    sustained tug of war. The hand-over read beside it says where the VM placed the CPUs (the
    wait follows it: README, stop 73). Needs the clock and the masked-store cost first (an empty
    call's overhead cancels: both kernels make as many calls). A reading under half a cycle (the
    vCPUs near, on Zen 5) is not stored: 0 means not measured, so the spec's stays."""

    path = "memory.shared_line_store_cycles"
    scheds = shared_probe_schedules(s.host)
    if scheds is None:
        return {path: s.assumed(path, "one core, or no tile for the probe in the tile space")}
    shared, clear = scheds
    model_extra = shared_kernels_model_extra(s.spec_so_far(), shared, clear)
    lines = model_extra(2.0) - model_extra(1.0)  # shared lines a call, as the model charges
    wait, waits, near = _shared_price_readings(s, scheds, model_extra)
    s.details["shared lines"] = {"cycles_per_line": wait, "readings": waits}
    how = (
        f"the real kernel of {shared.mr} x {shared.nr} tiles, one per thread on "
        f"{shared.threads} threads, kc = {SHARED_PROBE_KC}, N = {shared.N} (splits mid-line on "
        f"most rows: {lines:.1f} shared lines a call) against N = {clear.N} (none), timed as the "
        f"bench times kernels (interleaved rounds, each kernel's fastest of "
        f"{SHARED_PROBE_READINGS * SHARED_PROBE_ROUNDS} kept): the difference per call over "
        f"those lines; {SHARED_PROBE_READINGS} readings of {SHARED_PROBE_ROUNDS} rounds read "
        + ", ".join(f"{w:.1f}" for w in waits)
        + f"; core hand-over {near} beside it"
    )
    return {path: s.checked(path, round(wait, 1), 0.5, 1000.0, how)}


# The pair probe's kernels: one-line tiles per thread, one k block of kc = 8 (every visit's C
# lines from beyond L2), C rows at least twice the L2 a core has, in m blocks of 64 row tiles
PAIR_PROBE_KC, PAIR_PROBE_BLOCK_TILES, PAIR_PROBE_L2_MULTIPLE = 8, 64, 2
PAIR_PROBE_FLOOR = 0.1  # cycles: 0 would read as not measured


def pair_probe_schedules(spec: HwSpec) -> tuple[CpuSchedule, CpuSchedule] | None:
    """The line-pair probe's two kernels: C rows of one L1 line per thread, ``nr`` = a line's
    floats, the columns split between the threads (par=n: each 128-byte pair's two lines
    stored by two cores) against the same matmul with the rows split (par=m: each pair stored
    by one core); K = kc, so each C tile is visited once, its lines from beyond L2 (C sized
    past each core's share of L2). B packed, A in place, nmk. None where the target has one
    core, lines that are not whole vectors, no second cache level or no such tile."""
    if spec.core.cores < 2 or len(spec.caches) < 2:
        return None
    lanes, line = spec.isa.vector_bits // 32, spec.cache(1).line_bytes
    nr = line // 4
    if line % 4 or nr % lanes:
        return None
    n = nr * spec.core.cores
    for mr in SHARED_PROBE_ROWS:
        mc = mr * PAIR_PROBE_BLOCK_TILES
        rows = PAIR_PROBE_L2_MULTIPLE * spec.cache_bytes_per_core(2) // line
        m = mc * -(-rows // mc)
        fixed: dict[str, int | str] = {"mr": mr, "nr": nr, "kc": PAIR_PROBE_KC, "mc": mc}
        fixed |= {"pack_a": 0, "pack_b": 1, "threads": spec.core.cores, "unroll": 1}
        fixed |= {"order": "nmk"}
        split = _fixed_matmul_schedule(spec, (m, n, PAIR_PROBE_KC), fixed | {"nc": nr, "par": "n"})
        whole = _fixed_matmul_schedule(spec, (m, n, PAIR_PROBE_KC), fixed | {"nc": n, "par": "m"})
        if split is not None and whole is not None:
            return split, whole
    return None


def probe_shared_pairs(s: Session) -> dict[str, Finding]:
    """What a store of a C line that missed waits where another core writes the other line of
    its 128-byte pair: ``pair_probe_schedules``' two kernels timed side by side as the
    shared-line probe times its own (``_side_by_side_readings``, each kernel's fastest round of
    all), the difference per call read through the model's price of the two kernels. C is sized
    past L2: one visit a run to lines a warm L2 holds misses nowhere, and on the Zen 4 slice it
    cost 0-2.6 cycles a line where C past L2 cost 17-20 (README, stop 121). Needs the clock
    first. A reading under ``PAIR_PROBE_FLOOR`` is stored as that: 0 means not measured."""

    path = "memory.shared_pair_store_cycles"
    scheds = pair_probe_schedules(s.host)
    if scheds is None:
        why = "one core, one cache level, lines not whole vectors, or no one-line tile"
        return {path: s.assumed(path, why)}
    split, whole = scheds
    model_extra = shared_kernels_model_extra(s.spec_so_far(), split, whole, path)
    lines = model_extra(2.0) - model_extra(1.0)  # pair-shared lines a call, as the model counts
    wait, waits, near = _shared_price_readings(s, scheds, model_extra)
    wait = max(PAIR_PROBE_FLOOR, wait)
    s.details["shared pairs"] = {"cycles_per_line": wait, "readings": waits}
    how = (
        f"the real kernel of {split.mr} x {split.nr} tiles (one line), one k block, "
        f"{split.M} rows of C ({split.M * split.N * 4 >> 20} MiB), its {split.N} columns split "
        f"between {split.threads} threads ({lines:.0f} lines a call in pairs the threads share) "
        f"against its rows split (none), timed as the bench times kernels (interleaved rounds, "
        f"each kernel's fastest of {SHARED_PROBE_READINGS * SHARED_PROBE_ROUNDS} kept): the "
        f"difference per call over those lines; {SHARED_PROBE_READINGS} readings of "
        f"{SHARED_PROBE_ROUNDS} rounds read "
        + ", ".join(f"{w:.1f}" for w in waits)
        + f"; core hand-over {near} beside it"
    )
    return {path: s.checked(path, round(wait, 1), PAIR_PROBE_FLOOR, 1000.0, how)}


# The copy probe's kernels: 4 x two-vector tiles over B's rows in 33 panels (rows off a page
# multiple apart), kc = 64, A in place, one thread; B packed once per m block of one tile, 8
# blocks, against once per call
COPY_PROBE_ROWS, COPY_PROBE_BLOCKS, COPY_PROBE_KC, COPY_PROBE_PANELS = 4, 8, 64, 33
COPY_PROBE_READINGS = 3  # interleaved pairs
COPY_PROBE_RUN_SECONDS = 2e-3  # calls per run: about this long for the repacking kernel


def copy_probe_schedules(spec: HwSpec, level: int) -> tuple[CpuSchedule, CpuSchedule] | None:
    """The copy probe's kernels for a B sized for cache ``level`` (``level_sizes_of``' first
    size in whole k blocks, at least one): B repacked for each of ``COPY_PROBE_BLOCKS`` m blocks
    of one tile, and packed once per call; order mkn, so every pack of a k block comes after all
    of B was packed since. None where the tile space has no such kernels or the model takes that
    B from another level, or the level cannot hold B beside its packed block."""
    from aotune.analysis.model import b_pack_source_level

    lanes = spec.isa.vector_bits // 32
    nr = 2 * lanes
    n, m = nr * COPY_PROBE_PANELS, COPY_PROBE_ROWS * COPY_PROBE_BLOCKS
    k = max(1, level_sizes_of(spec, level)[0] // (4 * n) // COPY_PROBE_KC) * COPY_PROBE_KC
    # B and its packed block must both stay in the level between two packs of a k block
    if (k + COPY_PROBE_KC) * n * 4 > spec.cache_bytes_per_core(level):
        return None
    fixed: dict[str, int | str] = {"mr": COPY_PROBE_ROWS, "nr": nr, "kc": COPY_PROBE_KC, "nc": n}
    fixed |= {"pack_a": 0, "pack_b": 1, "threads": 1, "unroll": 1, "order": "mkn", "par": "m"}
    repack = _fixed_matmul_schedule(spec, (m, n, k), fixed | {"mc": COPY_PROBE_ROWS})
    once = _fixed_matmul_schedule(spec, (m, n, k), fixed | {"mc": m})
    if repack is None or once is None or not repack.b_pack_copies_vectors:
        return None
    if b_pack_source_level(repack, spec) != level:
        return None
    return repack, once


def share_matching(
    predicted_extra: Callable[[float], float], measured: float, lo: float, hi: float
) -> float | None:
    """The smallest share in [``lo``, ``hi``] whose predicted extra cycles (``predicted_extra``,
    non-increasing in the share) do not exceed ``measured``: ``hi`` where even its exceed it (the
    copy outran the model's fastest), None where ``lo``'s do not reach it (slower than any share
    says)."""
    if predicted_extra(hi) >= measured:
        return hi
    if predicted_extra(lo) < measured:
        return None
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if predicted_extra(mid) <= measured else (mid, hi)
    return hi


def probe_copy_share(s: Session) -> dict[str, Finding]:
    """The share of each cache level's bandwidth that a packing copy of B moves from it.

    Per level from L2 out, the real kernels of ``copy_probe_schedules``: B sized for the level,
    repacked for every m block against packed once. The difference per call is the extra
    copies; the value is the share at which the model's packing cost of the two kernels differs
    by as much (its pages and walks priced as calibrated). L1 is assumed: the model takes a
    copy's source from L2 out. Needs the clock, the TLB and the levels' bandwidth first."""
    out: dict[str, Finding] = {}
    spec = s.spec_so_far()
    s.details["copy share"] = {}
    for c in spec.caches:
        path = f"caches.L{c.level}.copy_bandwidth_share"
        if c.level == 1:
            out[path] = s.assumed(path, "the model takes a packing copy's source from L2 out")
            continue
        scheds = copy_probe_schedules(spec, c.level)
        if scheds is None:
            out[path] = s.assumed(path, f"no copy probe kernels whose B lives in L{c.level}")
            continue
        out[path] = _copy_share_finding(s, spec, c.level, scheds)
    return out


def _interleaved_extra_cycles(
    s: Session, spec: HwSpec, scheds: tuple[CpuSchedule, CpuSchedule], pairs: int
) -> tuple[list[float], list[Timing]]:
    """(cycles per call of the first kernel beyond the second's, one per pair; every reading):
    the two real kernels timed in ``pairs`` interleaved pairs, so both run under the same drift,
    each run about ``COPY_PROBE_RUN_SECONDS`` of the first."""
    from aotune.analysis.model import AnalyticalCpuModel

    guess = AnalyticalCpuModel(spec).estimate_batch([scheds[0]])[0].seconds
    per_run = max(1, round(COPY_PROBE_RUN_SECONDS / max(guess, 1e-6)))
    runs = [_kernel_runs(s, x, per_run) for x in scheds]
    readings: list[Timing] = []
    extras = []
    for _ in range(pairs):
        times = [s.best(run, subtract=False) for run in runs]
        readings += times
        extras.append(cycles((times[0].seconds - times[1].seconds) / per_run, s.ghz))
    return extras, readings


def _copy_share_finding(
    s: Session, spec: HwSpec, level: int, scheds: tuple[CpuSchedule, CpuSchedule]
) -> Finding:
    """``probe_copy_share``'s reading for one level: the two kernels timed in interleaved pairs,
    and the share that makes the model's packing differ by the median difference."""
    from aotune.analysis.model import ThreadShare, packing_cycles

    path = f"caches.L{level}.copy_bandwidth_share"
    extras, readings = _interleaved_extra_cycles(s, spec, scheds, COPY_PROBE_READINGS)
    extra = statistics.median(extras)
    if extra <= 0.0:
        return s.assumed(path, f"the repacking kernel was no slower ({extra:.0f} cycles a call)")

    def predicted(share: float) -> float:
        hw = with_value(spec, path, share)
        repack, once = (packing_cycles(x, hw, ThreadShare.of(x)) for x in scheds)
        return repack - once

    share = share_matching(predicted, extra, 0.01, 1.0)
    repack = scheds[0]
    b_bytes = repack.K * repack.N * 4
    copied = (-(-repack.M // repack.mc) - 1) * b_bytes
    s.details["copy share"][f"L{level}"] = {"extra_cycles": extra, "readings": extras}
    how = (
        f"the real kernel, {COPY_PROBE_ROWS} x {repack.nr} tiles, kc = {COPY_PROBE_KC}, one "
        f"thread, B of {b_bytes / 2**20:.2f} MiB (rows {repack.N * 4} B apart) packed for each of "
        f"{COPY_PROBE_BLOCKS} m blocks against once: {extra:.0f} cycles more per call, "
        f"{copied / extra:.1f} bytes a cycle against the level's "
        f"{spec.cache(level).bandwidth_bytes_per_cycle:g}, the median of "
        + ", ".join(f"{x:.0f}" for x in extras)
        + f" from {COPY_PROBE_READINGS} interleaved pairs of readings; {_spread(readings)}"
    )
    if share is None:
        return s.assumed(path, f"slower than 1% of the level's bandwidth ({how})")
    if share >= 1.0:
        how += "; faster than the model's copy at the level's whole bandwidth: taken as 1"
    else:
        how += "; the share at which the model's packing differs by as much"
    return s.checked(path, round(share, 2), 0.01, 1.0, how)


# The dirty-refill probe's kernel: 8 x one-vector tiles stepping down 24 tiles of rows, kc = 8
# (calls short enough that the window holds the next one, whose C loads then issue early), 16 k
# blocks, packed operands, one thread: the case ``_c_sweep_set_cycles`` prices
DIRTY_PROBE_ROWS, DIRTY_PROBE_TILES, DIRTY_PROBE_KC, DIRTY_PROBE_BLOCKS = 8, 24, 8, 16
DIRTY_PROBE_READINGS = 5  # interleaved pairs, as the alias probe's


def dirty_probe_schedule(spec: HwSpec, n: int) -> CpuSchedule | None:
    """The schedule the dirty-refill probe times: a matmul with N = ``n`` (C rows ``4 n`` bytes
    apart), one block of all ``DIRTY_PROBE_TILES`` row tiles and all columns, the k blocks outside
    it (nmk), so each call steps down C's rows and adds to its tile what the last k block stored;
    A and B packed, one thread. None where the target's tile space has no such tile."""
    rows, lanes = DIRTY_PROBE_ROWS, spec.isa.vector_bits // 32
    m, k = rows * DIRTY_PROBE_TILES, DIRTY_PROBE_KC * DIRTY_PROBE_BLOCKS
    fixed = {"mr": rows, "nr": lanes, "kc": DIRTY_PROBE_KC, "mc": m, "nc": n, "pack_a": 1}
    fixed |= {"pack_b": 1, "threads": 1, "unroll": 1, "order": "nmk"}
    return _fixed_matmul_schedule(spec, (m, n, k), fixed)


def pace_matching(
    predicted_extra: Callable[[float], float], measured: float, lo: float, hi: float
) -> float:
    """The largest pace in [``lo``, ``hi``] whose predicted extra cycles (``predicted_extra``,
    non-decreasing in the pace) do not exceed ``measured``: ``lo`` where even its exceed it,
    ``hi`` where its do not."""
    if predicted_extra(lo) > measured:
        return lo
    if predicted_extra(hi) <= measured:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted_extra(mid) <= measured else (lo, mid)
    return lo


# A prediction this close to the kernel's floor is the floor: the calls' issue hides the fills
FLAT_CYCLES = 0.5


@dataclass(frozen=True)
class PaceReading:
    """What a difference per call says of a pace: ``matched`` (the model's own difference
    matches it at ``pace``), ``bound`` (the calls' issue hid the fills: at most ``pace``),
    ``insensitive`` (the model's price of the kernels does not depend on the pace on this core)
    or ``beyond`` (more than any pace up to the ceiling explains); ``pace`` is None for the last
    two."""

    kind: str
    pace: float | None


def dirty_pace_reading(
    predicted_extra: Callable[[float], float],
    measured: float,
    lo: float,
    hi: float,
    fallback: float,
) -> PaceReading:
    """The pace a measured difference per call gives, through the model's own difference
    (``predicted_extra``, non-decreasing in the pace) between ``lo`` and ``hi``. A reading the
    calls' issue hides gives the largest pace they hide, or ``fallback`` (the pace charged when
    none is measured) where that is less: a bound, not a reading."""
    floor, top = predicted_extra(lo), predicted_extra(hi)
    if top - floor < 2 * FLAT_CYCLES:
        return PaceReading("insensitive", None)
    if measured > top:
        return PaceReading("beyond", None)
    edge = pace_matching(predicted_extra, floor + FLAT_CYCLES, lo, hi)
    pace = pace_matching(predicted_extra, measured, lo, hi)
    if pace <= edge:
        return PaceReading("bound", min(edge, fallback))
    return PaceReading("matched", pace)


def probe_dirty_set_refills(s: Session) -> dict[str, Finding]:
    """How far apart one L1 set takes fills whose victims are dirty lines.

    The real kernel of ``dirty_probe_schedule`` with C rows one page apart (a call's C lines in
    few sets, one where a way is a page, each fill evicting a line an earlier call stored) and
    one vector further apart (spread over the sets): the difference per call is the queue. The
    value is the pace at which the model's own difference between the two kernels matches it
    (``dirty_pace_reading``); the calls' issue hides a fast enough pace, and the reading is then
    a bound. Assumed where the model's price of the kernels does not depend on the pace, or the
    reading is beyond any pace. Needs every value the model prices those kernels with (run
    last)."""
    from aotune.analysis.features import kernel_features
    from aotune.analysis.model import AnalyticalCpuModel, ThreadShare, dirty_fill_cycles
    from aotune.codegen.compile import compile_kernel

    path = "memory.dirty_set_refill_cycles"
    page, lanes = s.host.memory.page_bytes, s.host.isa.vector_bits // 32
    crowded, clear = (dirty_probe_schedule(s.host, n) for n in (page // 4, page // 4 + lanes))
    if crowded is None or clear is None:
        return {path: s.assumed(path, "no 8-row one-vector tile in this target's tile space")}
    scheds = [crowded, clear]
    overhead, per_run = s.value("overhead.call_seconds"), 20
    runs = [_kernel_runs(s, x, per_run) for x in scheds]
    calls = [ThreadShare.of(x).calls for x in scheds]
    readings: list[Timing] = []
    extras = []
    for _ in range(DIRTY_PROBE_READINGS):  # interleaved: both kernels under the same drift
        times = [s.best(run, subtract=False) for run in runs]
        readings += times
        extras.append(
            per_call_difference_cycles([x.seconds for x in times], per_run, overhead, calls, s.ghz)
        )
    extra = statistics.median(extras)
    spec = s.spec_so_far()
    loops = [kernel_features(compile_kernel(x, spec), spec.isa.arch).loop for x in scheds]

    def predicted(pace: float) -> float:
        priced = AnalyticalCpuModel(with_value(spec, path, pace)).predict_batch(scheds, loops)
        return per_call_difference_cycles(
            [p.seconds for p in priced], 1, overhead, calls, spec.core.frequency_ghz
        )

    lo, hi = 0.5, 1000.0
    unmeasured = dirty_fill_cycles(with_value(spec, path, 0.0))  # what the model then charges
    reading = dirty_pace_reading(predicted, extra, lo, hi, unmeasured)
    s.details["dirty set refills"] = {"cycles_per_call": extra, "readings": extras}
    how = (
        f"the real kernel of {DIRTY_PROBE_ROWS} x {lanes} tiles, kc = {DIRTY_PROBE_KC}, packed, "
        f"one thread, stepping down C rows {page} bytes apart (few L1 sets) against "
        f"{page + 4 * lanes} (spread over them): {extra:.1f} cycles more per call, the median of "
        + ", ".join(f"{x:.1f}" for x in extras)
        + f" from {DIRTY_PROBE_READINGS} interleaved pairs of readings; {_spread(readings)}"
    )
    if reading.pace is None:
        why = {
            "insensitive": "the model's price of these kernels does not depend on the pace on "
            "this core (its window never holds the next call)",
            "beyond": f"more than a pace of {hi:.0f} cycles a line explains",
        }[reading.kind]
        return {path: s.assumed(path, f"{why} ({how})")}
    if reading.kind == "bound":
        how += "; the calls' issue hid the fills: at most that far apart"
    else:
        how += "; the pace per line at which the model's difference per call matches it"
    return {path: s.checked(path, round(reading.pace, 1), lo, hi, how)}


def _spread(timings: Sequence[Timing]) -> str:
    """The worst agreement and median excess of several readings, for a comment."""
    if not timings:
        return "no runs"
    runs = sum(t.runs for t in timings)
    return (
        f"{len(timings)} readings of {runs} runs in all, each the fastest run (3 fastest within "
        f"{max(t.agree for t in timings):.1%}, median at most "
        f"+{max(t.median for t in timings):.0%})"
    )


# The swept-lines probe's kernels: 8 x one-vector tiles, kc = 256 (rows long enough that a
# wait for the level a row costs less than the copy's own issue, a wait for memory more), one
# thread, A of this many times L2's usable share (beyond L2, within the level probed) and
# K = 2048 (rows 8 KiB apart, a page each), packed for each of 8 one-tile column blocks
# against read in place
SWEPT_PROBE_ROWS, SWEPT_PROBE_KC, SWEPT_PROBE_BLOCKS, SWEPT_PROBE_K = 8, 256, 8, 2048
SWEPT_PROBE_L2S = 4
SWEPT_PROBE_READINGS = 3  # interleaved pairs, as the copy probe's


def swept_probe_schedules(spec: HwSpec, level: int) -> tuple[CpuSchedule, CpuSchedule] | None:
    """The swept-lines probe's kernels for cache ``level``: A (``SWEPT_PROBE_L2S`` times L2's
    usable share) packed for each of ``SWEPT_PROBE_BLOCKS`` column blocks (nkm: the whole of A
    swept between two packs of a k block), its copy not prefetching its rows; and the same with
    A read in place, one tile a block. None where the level's usable share cannot hold that A
    or the tile space has no such kernels."""
    nr, k = spec.isa.vector_bits // 32, SWEPT_PROBE_K
    a_bytes = SWEPT_PROBE_L2S * spec.usable_bytes_per_core(2)
    if a_bytes > spec.usable_bytes_per_core(level):
        return None
    m = max(1, int(a_bytes) // (4 * k) // SWEPT_PROBE_ROWS) * SWEPT_PROBE_ROWS
    shape = (m, nr * SWEPT_PROBE_BLOCKS, k)
    fixed: dict[str, int | str] = {"mr": SWEPT_PROBE_ROWS, "nr": nr, "kc": SWEPT_PROBE_KC}
    fixed |= {"nc": nr, "pack_b": 1, "threads": 1, "unroll": 1, "order": "nkm", "par": "m"}
    packed = _fixed_matmul_schedule(spec, shape, fixed | {"mc": m, "pack_a": 1})
    in_place = _fixed_matmul_schedule(spec, shape, fixed | {"mc": SWEPT_PROBE_ROWS, "pack_a": 0})
    if packed is None or in_place is None:
        return None
    return dataclasses.replace(packed, a_pack_prefetch_rows=0), in_place


def swept_lines_kept(measured: float, if_kept: float, if_not: float) -> bool:
    """Whether a level keeps swept lines, from the extra cycles a call of the probe's packing
    kernel measured over the in-place one (``measured``) and what the model charges if the level
    keeps them (``if_kept``) and if memory serves them (``if_not``): the nearer by ratio. A
    reading at or below zero, or a model that charges no more without the level, says kept."""
    if measured <= 0.0 or if_not <= if_kept or if_kept <= 0.0:
        return True
    return abs(math.log(measured / if_kept)) <= abs(math.log(measured / if_not))


def _predicted_extra_cycles(hw: HwSpec, scheds: tuple[CpuSchedule, CpuSchedule]) -> float:
    """The model's cycles for the first kernel beyond the second's, per call."""
    from aotune.analysis.model import AnalyticalCpuModel

    first, second = AnalyticalCpuModel(hw).estimate_batch(list(scheds))
    return (first.seconds - second.seconds) * hw.core.frequency_ghz * 1e9


def probe_swept_lines(s: Session) -> dict[str, Finding]:
    """Whether each level beyond L2 serves the lines a sweep meets there, or memory does: the
    real kernels of ``swept_probe_schedules`` timed in interleaved pairs, and the extra cycles
    per call of the packing one against what the model charges either way (its A copy waiting
    for the level's latency a row, or for memory's lines ``misses_in_flight`` at a time). L1 and
    L2 are taken to keep them: the model prices what they hold as theirs."""
    out: dict[str, Finding] = {}
    spec = s.spec_so_far()
    s.details["swept lines"] = {}
    for c in spec.caches:
        path = f"caches.L{c.level}.keeps_swept_lines"
        if c.level <= 2:
            out[path] = s.assumed(path, "the model prices what L1 and L2 hold as theirs")
            continue
        scheds = swept_probe_schedules(spec, c.level)
        if scheds is None:
            out[path] = s.assumed(path, f"no probe kernels whose A lives in L{c.level}")
            continue
        out[path] = _swept_lines_finding(s, spec, c.level, scheds)
    return out


def _swept_lines_finding(
    s: Session, spec: HwSpec, level: int, scheds: tuple[CpuSchedule, CpuSchedule]
) -> Finding:
    """``probe_swept_lines``' reading for one level beyond L2."""
    path = f"caches.L{level}.keeps_swept_lines"
    packed = scheds[0]
    kept, not_kept = (
        _predicted_extra_cycles(with_value(spec, path, v), scheds) for v in (True, False)
    )
    extras, readings = _interleaved_extra_cycles(s, spec, scheds, SWEPT_PROBE_READINGS)
    measured = statistics.median(extras)
    keeps = swept_lines_kept(measured, kept, not_kept)
    copied = -(-packed.N // packed.nc) * packed.M * packed.K
    s.details["swept lines"][f"L{level}"] = {
        "extra_cycles": extras,
        "if_kept": kept,
        "if_not": not_kept,
    }
    how = (
        f"the real kernel, {packed.mr} x {packed.nr} tiles, kc = {packed.kc}, one thread, A of "
        f"{packed.M * packed.K * 4 / 2**20:.1f} MiB packed for each of "
        f"{-(-packed.N // packed.nc)} column blocks against read in place: "
        f"{measured / copied:.2f} cycles an element copied (the median of "
        + ", ".join(f"{x / copied:.2f}" for x in extras)
        + f"), where the model charges {kept / copied:.2f} from L{level} and "
        f"{not_kept / copied:.2f} from memory: "
        + ("kept" if keeps else "memory's pace")
        + f"; {_spread(readings)}"
    )
    return Finding(keeps, f"measured: {how}")
