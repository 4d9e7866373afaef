"""Measure the CPU aotune runs on, once, and describe it as a complete spec (`hw calibrate`).

Roadmap: this is the one place where aotune runs microbenchmarks. ``PROBES`` is the table of what
is measured: each probe names the spec fields it sets, the function that measures them
(``hwspecs/probes.py``), and how. ``SOURCES`` says where every other field comes from: sysfs and
the OS, LLVM's view of the host CPU, or the closest built-in spec (the rule ``hwspecs/host.py``
uses) for values no probe can reach; ``check_coverage`` fails when a schema field has neither.
``calibrate`` runs the probes in order on a ``Session`` and returns a ``Calibration``: the spec,
each value's origin (field path -> text, as the schema's future ``[origin]`` table will hold it),
and the raw readings; ``spec_text`` / ``write_spec`` turn it into a spec file
(``hwspecs/spec_toml.py``) that is checked to load back as written.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
import tomllib
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aotune.errors import AotuneError, CalibrationError
from aotune.files import (
    check_writable,
    has_control_character,
    refuse_outputs_over_inputs,
    write_new_file,
)
from aotune.hwspecs.probes import (
    CLOCK_CHAIN,
    LOAD_PROBE,
    Effort,
    Finding,
    Session,
    Timing,
    probe_cache_bandwidth,
    probe_cache_latency,
    probe_call_cycles,
    probe_clock,
    probe_copy_share,
    probe_dirty_set_refills,
    probe_far_prefetch,
    probe_fma,
    probe_handover,
    probe_issue,
    probe_l2_set_addressing,
    probe_loads,
    probe_masked_stores,
    probe_memory_bandwidth,
    probe_memory_parallelism,
    probe_mixed_width,
    probe_overhead,
    probe_page_walks,
    probe_prefetch_ahead,
    probe_prefetch_stride,
    probe_scheduler,
    probe_set_capacity,
    probe_set_refills,
    probe_shared_lines,
    probe_shared_pairs,
    probe_store_alias,
    probe_store_forwarding,
    probe_stores,
    probe_swept_lines,
    probe_tlb,
)
from aotune.hwspecs.spec import (
    _NAME,
    ARCHES,
    HwSpec,
    builtin_names,
    builtin_spec_inputs,
    check_llvm_names,
    load_target,
    spec_from_dict,
)
from aotune.hwspecs.spec_toml import field_paths, spec_to_toml, value_at, with_value
from aotune.machine_load import Sharing, cpu_use, sharing

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Probe:
    """One microbenchmark: the spec fields it sets (``*`` stands for every cache level), the
    function that measures them, and what it does."""

    name: str
    sets: tuple[str, ...]
    run: Callable[[Session], dict[str, Finding]]
    how: str


@dataclass(frozen=True)
class Calibration:
    """A calibrated spec, each value's origin (field path -> text), per probe the fields it set,
    what it does and its raw readings, and a few lines about the run (machine, load, duration)
    for the file's header."""

    spec: HwSpec
    origin: Mapping[str, str]
    details: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # also among the notes; the CLI prints them
    sharing: Sharing | None = None  # what others did on this process's CPUs during the probes

    def __post_init__(self) -> None:
        # the spec carries the same origins as data (its [origin] table), whatever it came from
        origin = tuple(sorted(self.origin.items()))
        object.__setattr__(self, "spec", dataclasses.replace(self.spec, origin=origin))

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``hw calibrate --json``)."""
        return {
            "spec": self.spec.to_dict(),
            "origin": dict(self.origin),
            "probes": dict(self.details),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "sharing": self.sharing.as_dict() if self.sharing else None,
        }


PROBES: tuple[Probe, ...] = (
    Probe("clock", ("core.frequency_ghz",), probe_clock, "a dependent chain of integer adds"),
    Probe(
        "FMA pipes",
        ("core.fma_units", "core.fma_width_bits", "core.fma_latency_cycles"),
        probe_fma,
        "one and many FMA chains per vector width",
    ),
    Probe(
        "store forwarding",
        ("core.store_forward_cycles",),
        probe_store_forwarding,
        "an FMA chain through a store and a load of its accumulator",
    ),
    Probe(
        "mixed-width FMAs",
        ("core.mixed_width_fma_cycles",),
        probe_mixed_width,
        "rows of full FMAs plus a narrower tail FMA",
    ),
    Probe(
        LOAD_PROBE,
        ("core.load_ports", "core.load_width_bits", "core.prefetches_per_cycle"),
        probe_loads,
        "independent loads per width, and prefetches",
    ),
    Probe("store ports", ("core.store_ports",), probe_stores, "independent stores per width"),
    Probe(
        "masked stores",
        ("core.masked_store_cycles",),
        probe_masked_stores,
        "independent full-width stores with a lane mask",
    ),
    Probe("issue width", ("core.issue_width",), probe_issue, "mixed independent work"),
    Probe(
        "TLB",
        ("memory.dtlb_entries", "memory.tlb_miss_cycles"),
        probe_tlb,
        "a chase over one line per page",
    ),
    Probe(
        "page walks",
        ("memory.stlb_entries", "memory.page_walk_cycles"),
        probe_page_walks,
        "a row walk over rows on more and more pages",
    ),
    Probe(
        "cache latency",
        ("caches.*.latency_cycles",),
        probe_cache_latency,
        "random-cycle chases sized per level",
    ),
    Probe(
        "set capacity",
        ("caches.*.conflict_slack",),
        probe_set_capacity,
        "a chase over more and more lines of one L1 set",
    ),
    Probe(
        "L2 set addressing",
        ("memory.addresses_pick_l2_sets",),
        probe_l2_set_addressing,
        "a chase over lines one L2 way apart, against lines spread over L2's sets",
    ),
    Probe(
        "set refills",
        (
            "memory.set_refill_cycles",
            "memory.swept_line_refill_cycles",
            "memory.swept_line_refill_overlap",
        ),
        probe_set_refills,
        "a sweep over more rows of one L1 set than it keeps, against fewer; rows of one vector,"
        " of eight lines, and of eight lines with FMAs enough to outlast their refills",
    ),
    Probe(
        "cache bandwidth",
        ("caches.*.bandwidth_bytes_per_cycle",),
        probe_cache_bandwidth,
        "one core streaming vector loads per level",
    ),
    Probe(
        "memory bandwidth",
        ("memory.bandwidth_gbs",),
        probe_memory_bandwidth,
        "every core streaming a buffer far beyond the last cache",
    ),
    Probe(
        "memory parallelism",
        ("memory.latency_cycles", "memory.misses_in_flight"),
        probe_memory_parallelism,
        "one and many independent chases far beyond the last cache",
    ),
    Probe(
        "prefetch stride",
        ("memory.prefetch_stride_bytes",),
        probe_prefetch_stride,
        "fixed-stride walks against random ones",
    ),
    Probe(
        "far prefetch",
        ("memory.far_prefetch_stride_bytes", "memory.far_prefetch_wait_cycles"),
        probe_far_prefetch,
        "fixed-stride walks a page and more apart over lines in the last level",
    ),
    Probe(
        "prefetch distance",
        ("memory.prefetch_ahead_cycles",),
        probe_prefetch_ahead,
        "a row walk with software prefetches at growing distances",
    ),
    Probe("core hand-over", (), probe_handover, "a cache line passed between two cores"),
    Probe(
        "call overhead",
        ("overhead.call_seconds", "overhead.thread_seconds"),
        probe_overhead,
        "an empty kernel through the runner on 1 and on every thread",
    ),
    Probe(
        "micro-kernel call",
        ("core.call_cycles",),
        probe_call_cycles,
        "the real kernel with 8x as many calls over the same k steps",
    ),
    Probe(
        "waiting FMAs",
        ("core.scheduler_entries",),
        probe_scheduler,
        "the real kernel's one-chain calls, overlapped",
    ),
    Probe(
        "store aliasing",
        ("core.store_alias_cycles",),
        probe_store_alias,
        "the real kernel with C rows a page apart and not",
    ),
    Probe(
        "shared lines",
        ("memory.shared_line_store_cycles",),
        probe_shared_lines,
        "the real kernel's threads splitting C's rows mid-line and on line pairs",
    ),
    Probe(
        "shared line pairs",
        ("memory.shared_pair_store_cycles",),
        probe_shared_pairs,
        "the real kernel's threads splitting C's line pairs and its rows, C beyond L2",
    ),
    Probe(
        "copy share",
        ("caches.*.copy_bandwidth_share",),
        probe_copy_share,
        "the real kernel with B repacked per m block from each level and packed once",
    ),
    Probe(
        "swept lines",
        ("caches.*.keeps_swept_lines",),
        probe_swept_lines,
        "the real kernel with A repacked per column block from beyond L2 and read in place",
    ),
    Probe(
        "dirty set refills",
        ("memory.dirty_set_refill_cycles",),
        probe_dirty_set_refills,
        "the real kernel's calls stepping down C rows in one L1 set and not",
    ),
)

# Where each field no probe sets comes from: "os" (sysfs, sysconf), "llvm" (LLVM's host CPU name
# and features, as hwspecs/host.py reads them) or "assumed" (the closest built-in spec), with why.
SOURCES: dict[str, tuple[str, str]] = {
    "isa.arch": ("llvm", "the architecture of LLVM's process triple"),
    "isa.triple": ("llvm", "LLVM's process triple"),
    "isa.llvm_cpu": ("llvm", "LLVM's host CPU name"),
    "isa.llvm_features": ("llvm", "LLVM's host CPU features"),
    "isa.vector_bits": ("llvm", "the widest vector the host CPU features allow"),
    "isa.vector_registers": ("llvm", "the vector registers the host CPU features give"),
    "isa.general_registers": ("assumed", "the ISA's allocatable integer registers"),
    "core.cores": ("os", "the CPUs this process may run on (sched_getaffinity)"),
    "core.reorder_window": (
        "assumed",
        "the reorder window cannot be read from the OS and a probe of it would measure the "
        "scheduler and register files as much as the window",
    ),
    "caches.*.level": ("os", "sysfs: /sys/devices/system/cpu/cpu0/cache/index*/level"),
    "caches.*.size_kib": ("os", "sysfs: cpu0/cache/index*/size"),
    "caches.*.line_bytes": ("os", "sysfs: cpu0/cache/index*/coherency_line_size"),
    "caches.*.associativity": ("os", "sysfs: cpu0/cache/index*/ways_of_associativity"),
    "caches.*.shared_by_cores": (
        "os",
        "sysfs: cpu0/cache/index*/shared_cpu_list, at most the CPUs this process may use",
    ),
    "caches.*.usable_fraction": (
        "assumed",
        "the share of a cache a tile may claim is a policy of the model, not a property of the "
        "cache",
    ),
    "memory.page_bytes": ("os", "sysconf(SC_PAGE_SIZE)"),
    "memory.l2_prefetch_fills_l1": (
        "assumed",
        "where a software prefetch for L2 lands is documented per core family, not probed yet",
    ),
    "core.spill_cycles": (
        "assumed",
        "a k step's access to a value kept on the stack is not probed yet",
    ),
    "memory.set_refill_beyond_refetches": (
        "assumed",
        "whether the set's pace holds beyond refetched rows is read from kernels timed side by "
        "side, not probed",
    ),
    "caches.*.replacement": (
        "assumed",
        "which line a full set evicts is not probed: a chase would need huge pages to address "
        "one L2 set",
    ),
}


def probe_paths(probe: Probe, spec: HwSpec) -> list[str]:
    """The concrete field paths a probe sets on ``spec`` (``*`` expanded to each cache level)."""
    return [q for p in probe.sets for q in _expanded(p, spec)]


def _expanded(path: str, spec: HwSpec) -> list[str]:
    if ".*." not in path:
        return [path]
    head, tail = path.split(".*.")
    return [f"{head}.L{c.level}.{tail}" for c in spec.caches]


def source_paths(spec: HwSpec) -> dict[str, str]:
    """Concrete field path -> SOURCES key, for every field that no probe sets."""
    return {q: key for key in SOURCES for q in _expanded(key, spec)}


def check_coverage(spec: HwSpec) -> None:
    """Every field of the schema is set by exactly one probe or named in SOURCES (a field added
    to the schema needs a probe or a source before calibration can write it)."""
    probed = [q for probe in PROBES for q in probe_paths(probe, spec)]
    sourced = list(source_paths(spec))
    paths = set(field_paths(spec))
    twice = {q for q in probed + sourced if (probed + sourced).count(q) > 1}
    missing = paths - set(probed) - set(sourced)
    unknown = set(probed + sourced) - paths
    if twice or missing or unknown:
        raise CalibrationError(
            "the calibration tables do not cover the spec schema: "
            + "; ".join(
                f"{what}: {', '.join(sorted(items))}"
                for what, items in (
                    ("set twice", twice),
                    ("not set", missing),
                    ("not fields", unknown),
                )
                if items
            )
        )


def _source_origin(key: str, path: str, host: HwSpec, base: HwSpec, sysfs: set[int]) -> str:
    kind, text = SOURCES[key]
    if key.startswith("caches.*.") and kind == "os":
        level = int(path.split(".")[1][1:])
        if level not in sysfs:
            return f"assumed: from built-in spec {base.name}: sysfs lists no L{level} cache"
    if kind == "assumed":
        return f"assumed: from built-in spec {base.name}, the closest to this CPU: {text}"
    return f"{kind}: {text}"


# ---- the run -----------------------------------------------------------------------------------


def check_can_calibrate() -> tuple[HwSpec, HwSpec]:
    """(the host as detected, the built-in spec closest to it), or a CalibrationError saying why
    this machine cannot be calibrated."""
    from aotune.hwspecs.host import available_memory_bytes, closest_builtin, detect_host

    try:
        host = detect_host()
        base = load_target(closest_builtin())
    except AotuneError as e:
        raise CalibrationError(
            f"hw calibrate measures the machine it runs on and cannot measure this one: {e}"
        ) from None
    if host.isa.arch not in ARCHES:
        raise CalibrationError(
            f"hw calibrate supports {', '.join(ARCHES)} hosts; this one is {host.isa.arch}"
        )
    have = available_memory_bytes()
    if have is not None and have < 512 << 20:
        raise CalibrationError(
            f"hw calibrate needs about 512 MiB of free memory for its buffers and "
            f"{have >> 20} MiB is available; free some memory and rerun"
        )
    return host, base


def calibrate(
    progress: Progress | None = None, effort: Effort = Effort(), seed: int = 0
) -> Calibration:
    """Measure this machine (about 2 minutes) and return its spec with every value's origin."""
    from aotune.hwspecs.host import sysfs_caches

    started = time.perf_counter()
    load_before = _load_average()
    use_before = cpu_use()
    host, base = check_can_calibrate()
    host = with_value(host, "memory.page_bytes", os.sysconf("SC_PAGE_SIZE"))
    features, features_origin = spec_features(host.isa.llvm_features)
    host = with_value(host, "isa.llvm_features", features)
    check_coverage(host)
    s = Session(host, base, effort, seed)
    try:
        total = len(PROBES) + 1
        if progress:
            progress("warm-up", 0, total)
        s.warm_up()
        for i, probe in enumerate(PROBES):
            if progress:
                progress(probe.name, i + 1, total)
            found, readings = _settled_run(probe, s)
            s.details[probe.name] = {"sets": sorted(found), "how": probe.how, **readings}
            expected = set(probe_paths(probe, host))
            if set(found) != expected:
                raise CalibrationError(
                    f"probe {probe.name!r} set {sorted(found)}, not its fields {sorted(expected)}"
                )
            s.found.update(found)
        ghz_end, _ = _clock_again(s)
    finally:
        s.close()
    shared = sharing(use_before, cpu_use())
    warning = shared and sharing_warning(shared)
    warnings = (warning,) if warning else ()
    if progress:
        progress("done", total, total)
    spec = s.spec_so_far()
    origin = {path: f.origin for path, f in s.found.items()}
    sysfs = set(sysfs_caches())
    for path, key in source_paths(host).items():
        origin[path] = _source_origin(key, path, host, base, sysfs)
    origin["isa.llvm_features"] = features_origin
    elapsed = time.perf_counter() - started
    origin["core_model"] = (
        f"calibrated by aotune hw calibrate on {time.strftime('%Y-%m-%d')} "
        f"({_cpu_model()}, {host.isa.llvm_cpu})"
    )
    spec = dataclasses.replace(spec, name="calibrated", description=_description(spec))
    drift = ghz_end / s.ghz - 1.0
    notes = [
        f"Calibrated by `aotune hw calibrate` on {time.strftime('%Y-%m-%d %H:%M')} on this "
        f"machine: {_cpu_model()} (LLVM: {host.isa.llvm_cpu}), {host.core.cores} CPUs; "
        f"{elapsed:.0f} s of probes; load average {load_before} before and {_load_average()} "
        f"after; the clock read {s.ghz:.3f} GHz at the start and {ghz_end:.3f} at the end "
        f"({drift:+.1%}).",
        "Origins: 'measured' is a microbenchmark run here (the probe, its sizes, and its runs: "
        "each reading is the fastest of several, with how closely the three fastest agreed and "
        "how far above it the median run was); 'os' was read from the operating system; 'llvm' "
        f"is LLVM's view of this CPU; 'assumed' comes from the built-in spec {base.name}, the "
        "closest to this CPU, for values no probe measures (or a probe read implausibly).",
        *s.notes,
        *(f"Warning: {w}" for w in warnings),
    ]
    return Calibration(spec, origin, dict(s.details), tuple(notes), warnings, shared)


def _description(spec: HwSpec) -> str:
    """A calibrated spec's description: the CPU, its CPU count and its clock under load."""
    return (
        f"calibrated on this host: {_cpu_model()} ({spec.isa.llvm_cpu}), "
        f"{spec.core.cores} CPUs, {spec.core.frequency_ghz:g} GHz under load"
    )


REPEAT_LIMIT = 9  # `hw calibrate --repeat`: at most this many runs (about 2 minutes each)
MEASURED = "measured:"


def median_of_runs(runs: Sequence[Calibration]) -> Calibration:
    """One calibration from several runs on this machine: each value a probe measured is the
    median of the runs that measured it (the lower middle one of an even count: a value a run
    read, of the field's own type), its origin that run's with every run's reading after it;
    values no run measured (read from the OS or LLVM, or assumed) are the first run's.

    On a shared machine one run's probe can catch a neighbour's burst (two runs minutes apart on
    a Zen 3 slice read 65 and 96 waiting FMAs, 15.4 and 20.6 cycles per call): the median of
    three keeps a single burst out of the spec. Each value is taken on its own; where runs rank
    the levels' values alike (L1 under L2 under L3), their medians keep that order."""
    if not runs:
        raise CalibrationError("no calibration runs to take medians of")
    first = runs[0]
    spec, origin = first.spec, dict(first.origin)
    spread = []
    for path in field_paths(first.spec):
        read = [(value_at(c.spec, path), c.origin[path]) for c in runs]
        measured = sorted((r for r in read if r[1].startswith(MEASURED)), key=lambda r: r[0])
        if not measured:
            continue
        in_run_order = [v for v, o in read if o.startswith(MEASURED)]
        spread += spread_warning(path, in_run_order)
        value, how = measured[(len(measured) - 1) // 2]
        of = f"{len(runs)}" if len(measured) == len(runs) else f"{len(measured)} of {len(runs)}"
        readings = ", ".join(_shown(v) for v in in_run_order)
        spec = with_value(spec, path, value)
        origin[path] = f"{how} (the median of {of} runs' readings: {readings})"
    spec = dataclasses.replace(spec, description=_description(spec))
    notes = [
        f"{len(runs)} runs of `aotune hw calibrate`: each measured value is the median of the "
        "runs' readings, which its comment lists; the rest is the first run's.",
        *(f"Run {i + 1}: {c.notes[0]}" for i, c in enumerate(runs) if c.notes),
        *dict.fromkeys(n for c in runs for n in c.notes[1:]),
        *(f"Warning: {w}" for w in spread),
    ]
    warnings = tuple(dict.fromkeys([*(w for c in runs for w in c.warnings), *spread]))
    shared = [c.sharing for c in runs if c.sharing is not None]
    busiest = max(shared, key=lambda x: x.others_cpus + x.stolen_share * x.cpus, default=None)
    details = {"runs": [dict(c.details) for c in runs]}
    return Calibration(spec, origin, details, tuple(notes), warnings, busiest)


SPREAD_LIMIT = 2.0  # a median that one run more or less moves further than this is not settled


def spread_warning(path: str, readings: Sequence[Any]) -> list[str]:
    """A warning where one run more or less would move the median of a measured number by more
    than SPREAD_LIMIT: the readings next to it disagree that much (a Zen 3 slice once read 66,
    24 and 26 waiting FMAs: the median was a neighbour's). One outlier among five does not."""
    numbers = sorted(v for v in readings if isinstance(v, int | float) and not isinstance(v, bool))
    if len(numbers) < 2:
        return []
    middle = (len(numbers) - 1) // 2
    low, high = numbers[max(0, middle - 1)], numbers[min(len(numbers) - 1, middle + 1)]
    if low <= 0 or high <= SPREAD_LIMIT * low:
        return []
    shown = ", ".join(_shown(v) for v in readings)
    return [
        f"{path}: the runs read {shown}, and one run more or less would move the median "
        f"more than {SPREAD_LIMIT:g}x, so a neighbour's load may have decided it; check it, or "
        "calibrate again with more runs when the machine is quieter"
    ]


def _shown(value: Any) -> str:
    """A reading as a comment lists it."""
    return f"{value:g}" if isinstance(value, float) else str(value)


FEATURES_LIMIT = 1000  # the spec loader's longest string


def spec_features(features: str) -> tuple[str, str]:
    """(LLVM host features as the spec holds them, their origin): every feature LLVM reports on
    or off, or, where that list is longer than a spec string may be, only those on (LLVM takes
    the rest from the CPU name)."""
    if len(features) <= FEATURES_LIMIT:
        return features, "llvm: LLVM's host CPU features, each on or off"
    on = ",".join(f for f in features.split(",") if f.startswith("+"))
    if len(on) > FEATURES_LIMIT:
        raise CalibrationError(
            f"LLVM reports {len(on)} characters of host CPU features that are on, more than the "
            f"{FEATURES_LIMIT} a spec string may hold; the spec loader's limit must grow first"
        )
    return on, (
        "llvm: LLVM's host CPU features that are on (the full on/off list is longer than a "
        "spec string may be; the rest follow from llvm_cpu)"
    )


UNSETTLED = 0.05  # three fastest runs further apart than this: the reading did not settle
ATTEMPTS = 3
RETRY_PAUSE_SECONDS = 0.5


def _settled_run(probe: Probe, s: Session) -> tuple[dict[str, Finding], dict[str, Any]]:
    """(findings, raw readings) of ``probe``: run again, after a pause, while one of its readings
    did not settle (a burst of other work can outlast a reading's runs), at most ATTEMPTS times;
    the attempt whose readings agreed best is kept, and a note says when none settled."""
    kept: tuple[float, dict[str, Finding], dict[str, Any]] | None = None
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(RETRY_PAUSE_SECONDS)
        before = set(s.details)
        s.worst_agree = 0.0
        found = probe.run(s)
        readings = {k: s.details.pop(k) for k in set(s.details) - before}
        if kept is None or s.worst_agree < kept[0]:
            kept = (s.worst_agree, found, readings)
        if s.worst_agree <= UNSETTLED:
            break
    assert kept is not None
    worst, found, readings = kept
    if worst > UNSETTLED:
        s.notes.append(
            f"The {probe.name} probe did not settle in {ATTEMPTS} attempts (the three fastest "
            f"runs of one of its readings stayed {worst:.0%} apart): its values are the least "
            "certain here."
        )
    return found, {**readings, "attempts": attempt + 1, "worst_agreement": worst}


def _clock_again(s: Session) -> tuple[float, Timing]:
    t, n = s.best_sized(lambda n: s.mix(CLOCK_CHAIN, n))
    return n * CLOCK_CHAIN.unroll / t.seconds / 1e9, t


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def sharing_warning(shared: Sharing) -> str | None:
    """The run's warning when other processes or guests shared this process's CPUs while the
    probes ran (``machine_load.Sharing``); None when they did not enough to say so."""
    return shared.warning(
        f"while the probes ran ({shared.seconds:.0f} s)",
        "bandwidths may read low and latencies high; rerun `aotune hw calibrate` when the "
        "machine is idle",
    )


def _cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, or 'unknown CPU'."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model")):
                    name = " ".join(line.split(":", 1)[1].split())
                    # the spec's description holds it, and a spec refuses control characters
                    return "".join(ch for ch in name if not has_control_character(ch))
    except OSError:
        pass
    return "unknown CPU"


# ---- the spec file -----------------------------------------------------------------------------


def spec_name_for(path: str | None, name: str | None) -> str:
    """The name a calibrated spec gets: ``name`` if given, else the output file's name without
    ``.toml``, made a valid spec name (``my cpu ü.toml``: ``my-cpu-u``), else ``calibrated``."""
    taken = {*builtin_names(), "host"}  # a record made with the spec shows under its name
    if name is not None:
        if not _NAME.fullmatch(name):
            raise CalibrationError(
                f"--name {name!r}: a spec name is 1-64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if name in taken:
            raise CalibrationError(
                f"--name {name}: a built-in target is called that, and records made with this "
                f"spec would show as it in 'aotune db list'; pick another, e.g. {name}-here"
            )
        return name
    if path:
        stem = os.path.basename(path)
        stem = stem[: -len(".toml")] if stem.endswith(".toml") else stem
        # letters with marks as their base letter, every other run of characters as one '-'
        ascii_stem = unicodedata.normalize("NFKD", stem).encode("ascii", "ignore").decode()
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_stem).lstrip("._-")[:64].rstrip("-")
        if stem in taken:
            stem += "-calibrated"
        if _NAME.fullmatch(stem):
            return stem
    return "calibrated"


def named(cal: Calibration, name: str) -> Calibration:
    """``cal`` with its spec renamed."""
    return dataclasses.replace(cal, spec=dataclasses.replace(cal.spec, name=name))


def spec_text(cal: Calibration) -> str:
    """The spec file's text: the run's notes as a header, every value with its origin above it.
    Checked before it is returned: it must load (strictly, LLVM names included) into exactly
    ``cal.spec``, so a written file always works with ``--target FILE``."""
    text = spec_to_toml(cal.spec, cal.origin, header="\n\n".join(cal.notes))
    try:
        loaded = spec_from_dict(tomllib.loads(text), "the calibrated spec")
        check_llvm_names(loaded, "the calibrated spec")
    except AotuneError as e:
        raise CalibrationError(f"the calibration is not a valid spec: {e}") from None
    if loaded != cal.spec:
        raise CalibrationError("the calibrated spec does not read back as written; a bug")
    return text


def check_output(path: str, force: bool) -> None:
    """Fail now, before a minute of measuring, if the spec could not be written to ``path`` or
    would replace one of aotune's own specs (which the calibration starts from)."""
    if path == "-":
        raise CalibrationError(
            "-o -: without -o, calibrate prints the spec on standard output; -o names a file "
            "(./- for one named '-')"
        )
    refuse_outputs_over_inputs({"-o": path}, builtin_spec_inputs(), CalibrationError)
    check_writable(path, force, CalibrationError)


def write_spec(cal: Calibration, path: str, force: bool) -> None:
    """Write the spec file (atomically; an existing file only with ``force``). Where that fails
    after the measuring (a file made at ``path`` meanwhile, a full disk, a folder gone), the
    minutes of measurements are not lost: the spec goes to a new file in the temporary folder,
    which the error names."""
    text = spec_text(cal)
    try:
        write_new_file(path, text, force, CalibrationError)
    except CalibrationError as e:
        kept = _keep_elsewhere(text)
        where = (
            f"; the calibrated spec is kept in {kept}: move it where you want it"
            if kept
            else "; run the calibration again"
        )
        raise CalibrationError(f"{e}{where}") from None


def _keep_elsewhere(text: str) -> str | None:
    """``text`` in a new file of the temporary folder (its path), or None where that fails too."""
    try:
        fd, kept = tempfile.mkstemp(prefix="aotune-calibrated-", suffix=".toml")
    except OSError:
        return None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except OSError:
        os.unlink(kept)  # no partial spec left behind
        return None
    return kept
