"""Frozen hardware descriptions and their strict TOML loader.

Roadmap: this module owns the CPU schema and the loading of every spec file; a file's ``kind``
picks its schema from ``SPEC_KINDS`` (``cpu`` here, ``gpu`` in :mod:`aotune.hwspecs.gpu_spec`).

The schema *is* the dataclasses below: the loader walks their fields, so a key that is not a field,
a field that is missing, or a value of the wrong type is an error naming the file, the key and the
expected type.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotune.errors import HwSpecError
from aotune.files import (
    decode_utf8,
    first_control_character,
    read_user_file,
    toml_shown,
)

SPEC_DIR = Path(__file__).resolve().parent


def _in(lo: float, hi: float) -> Any:
    """A spec field whose value must lie in [lo, hi]: the loader checks it and names the range."""
    return dataclasses.field(metadata={"range": (lo, hi)})


def _pow2(lo: int, hi: int) -> Any:
    """A spec field that is a power of two in [lo, hi] (sizes that address bits select)."""
    return dataclasses.field(metadata={"range": (lo, hi), "power_of_two": True})


@dataclass(frozen=True)
class IsaSpec:
    """Instruction set facts: what LLVM targets and what the vector unit looks like."""

    arch: str  # "x86_64" or "aarch64": selects the capstone table in analysis/features.py
    triple: str
    llvm_cpu: str
    llvm_features: str
    vector_bits: int = _pow2(128, 512)
    vector_registers: int = _in(3, 64)
    # integer registers the compiler can allocate (x86-64: 16, AArch64: 31)
    general_registers: int = _in(8, 64)


@dataclass(frozen=True)
class CoreSpec:
    """Per-core issue resources; the model's throughput coefficients."""

    cores: int = _in(1, 1024)
    frequency_ghz: float = _in(0.1, 10.0)
    fma_units: int = _in(1, 8)
    fma_width_bits: int = _pow2(64, 1024)
    fma_latency_cycles: int = _in(1, 64)
    # cycles per FMA instruction in a tile row that mixes full vectors with a narrower tail vector
    # (1 / fma_units where a narrow FMA costs just its pipe slot; more where the pipes pair badly)
    mixed_width_fma_cycles: float = _in(0.01, 16.0)
    load_ports: int = _in(1, 8)
    load_width_bits: int = _pow2(64, 1024)
    # software prefetches the core issues per cycle: they return no data, so cores with more
    # address pipes than load data paths issue them beside and faster than loads
    prefetches_per_cycle: float = _in(0.1, 16.0)
    store_ports: int = _in(1, 8)
    issue_width: int = _in(1, 32)
    # instructions in flight: lets independent FMA chains of consecutive tiles overlap
    reorder_window: int = _in(1, 4096)
    # vector instructions waiting for their operands the core holds (schedulers and queues before
    # them) before dispatch stalls: bounds how many FMA chains of consecutive calls overlap
    scheduler_entries: int = _in(1, 4096)
    # cycles a micro-kernel call costs beyond its k steps and the C tile's loads and stores: the
    # call and return, pointer set-up and the k loop's exit branch
    call_cycles: float = _in(0.0, 1000.0)
    # cycles a k step's access to a value the loop keeps on the stack adds (a row's address
    # reloaded every step); a spilled value's store and reload are priced by their chain instead
    spill_cycles: float = _in(0.0, 100.0)
    # cycles from a full-width vector store to a load of its bytes forwarded from the store
    # queue: what a spilled accumulator's chain waits on beside its FMA
    store_forward_cycles: float = _in(0.0, 100.0)
    # cycles a load waits per older store whose address matches it only in the page-offset bits
    # (the bits the store queue compares before translation): "4K aliasing"
    store_alias_cycles: float = _in(0.0, 100.0)
    # cycles one full-width vector store with a lane mask takes (a tile's or a copied run's last,
    # partial vector): about a store slot where the ISA masks stores natively, more where the
    # store is microcoded (AVX2's vmaskmovps on AMD cores) or split into per-lane stores
    masked_store_cycles: float = _in(0.0, 1000.0)


@dataclass(frozen=True)
class CacheSpec:
    """One data-cache level."""

    level: int = _in(1, 4)
    size_kib: int = _in(1, 1 << 20)
    line_bytes: int = _pow2(16, 1024)
    associativity: int = _in(1, 1024)
    latency_cycles: int = _in(1, 2000)  # load-to-use latency of a hit in this level
    shared_by_cores: int = _in(1, 1024)
    # per core, from this level into the one above
    bandwidth_bytes_per_cycle: float = _in(0.01, 4096.0)
    # share of the capacity a tile may claim (the rest is for others)
    usable_fraction: float = _in(0.01, 1.0)
    # how many times its set's ways a group of lines that map to one set may span before it
    # thrashes: above 1 where the next level refills an evicted line before its next use
    conflict_slack: float = _in(1.0, 16.0)
    # share of this level's bandwidth a vector copy out of it (packing) gets while the
    # micro-kernel's own lines compete for the level
    copy_bandwidth_share: float = _in(0.01, 1.0)
    # which line a full set evicts (one of REPLACEMENT_POLICIES): with LRU, lines swept in the
    # same order beyond the set's ways all miss; with random eviction, a share growing with them.
    # Read where the model prices lines swept again through one set of L2 (an A block read in
    # place); L1's set overflow and the last level's capacity share are priced as they are
    replacement: str = "lru"
    # whether a sweep over more than the levels above hold finds its lines here again: false
    # where a level beyond L2 gives swept lines no more than memory does (a last level other
    # tenants share, or one that keeps few clean victims), so a sweep waits on memory
    keeps_swept_lines: bool = True


# the eviction policies a cache level may name (``CacheSpec.replacement``)
REPLACEMENT_POLICIES = ("lru", "random")


@dataclass(frozen=True)
class MemorySpec:
    """Main memory, shared by all cores."""

    bandwidth_gbs: float = _in(0.01, 100_000.0)
    # load-to-use latency of a line that no cache holds (a chase far beyond the last level)
    latency_cycles: int = _in(1, 100_000)
    # demand misses to memory one core keeps outstanding: independent loads of lines no
    # prefetcher fetched complete at most this many per latency
    misses_in_flight: float = _in(1.0, 1024.0)
    # prefetchers stop at page boundaries; each page also needs a TLB entry
    page_bytes: int = _pow2(1024, 1 << 30)
    # largest stride between accesses that the stride prefetcher follows
    prefetch_stride_bytes: int = _in(1, 1 << 20)
    # largest stride between accesses at which a prefetcher still brings lines from the last
    # level into L2 ahead of a walk (the near stride where none farther is), and what a step
    # of such a walk waits, load to use
    far_prefetch_stride_bytes: int = _in(1, 1 << 20)
    far_prefetch_wait_cycles: float = _in(1.0, 100_000.0)
    # cycles between two refills of one L1 set from the next level when independent loads of
    # rows a way apart, a vector each, want more of its lines than it keeps: however many misses
    # are in flight, the set takes its lines about this far apart (0: not measured, none claimed)
    set_refill_cycles: float = _in(0.0, 1000.0)
    # cycles one L1 set takes per fill whose victim is a dirty line, when calls stepping down C
    # rows a page apart crowd it (0: not measured; a refill and a write-back, two round trips to
    # the next level, are charged in series)
    dirty_set_refill_cycles: float = _in(0.0, 1000.0)
    # extra latency of an access whose page misses the first-level data TLB
    tlb_miss_cycles: int = _in(0, 10_000)
    dtlb_entries: int = _in(1, 1 << 20)  # pages the first-level data TLB holds
    # pages the second-level TLB holds: a page met again after more distinct pages than this
    # is walked for again
    stlb_entries: int = _in(1, 1 << 24)
    # cycles each row of a walk over rows on distinct pages adds once the pages outnumber the
    # second-level TLB: a page-table walk per row (on a VM, through the host's tables too),
    # added to the loop's work; prefetching the rows does not shorten it
    page_walk_cycles: float = _in(0.0, 100_000.0)
    # how far ahead software prefetches of strided operand rows are issued
    prefetch_ahead_cycles: int = _in(1, 100_000)
    # whether a software prefetch meant for L2 (x86 prefetcht1) fills L1 too, as on AMD cores
    # before Zen 4: it then evicts L1 lines as a prefetch into L1 does
    l2_prefetch_fills_l1: bool
    # whether a large array's addresses pick its L2 sets beyond the 4 KiB page offset: its frames
    # lie in address order (huge pages the host backs, or free memory handed out in order), so
    # rows a power of two apart crowd few L2 sets; false: the frames scatter, and so do the rows
    addresses_pick_l2_sets: bool = False
    # cycles each line of a B row adds to a k step when a panel swept again call after call
    # refills rows of several lines, each line in a set its column keeps (rows a whole number
    # of L1 ways apart), from L2: the fills take the L1 the loads need (0: not measured; such
    # rows then wait as ``set_refill_cycles`` or an L2 round trip say)
    swept_line_refill_cycles: float = dataclasses.field(
        default=0.0, metadata={"range": (0.0, 1000.0)}
    )
    # the share of the shorter of a k step's other work and those refills that the two overlap:
    # 0, the refills add to the step (Emerald Rapids' kernels); 1, the step takes the longer
    swept_line_refill_overlap: float = dataclasses.field(
        default=0.0, metadata={"range": (0.0, 1.0)}
    )
    # whether ``set_refill_cycles``, which the probe times as one-line rows of one set refetched
    # sweep after sweep (and which B rows refetched so keep), also paces B rows met for the first
    # time and A's broadcasts that thrash a set (false: those wait as on a spec without a pace);
    # a B packing copy's walk down crowded rows takes the pace either way (stop 115)
    set_refill_beyond_refetches: bool = True
    # cycles a C line two cores both write adds to a visit that stores it, where the other core
    # wrote it since: its move between the cores, as far as the stores in flight overlap such
    # moves (0: not measured; the last level's latency is charged, as priced since stop 73)
    shared_line_store_cycles: float = dataclasses.field(
        default=0.0, metadata={"range": (0.0, 1000.0)}
    )
    # cycles a C line adds to a visit that stores it from beyond L2 where the other line of its
    # 128-byte pair is one another core writes: the L2 fetches that line beside the miss and
    # takes it from the other core, which then takes it back (on visits that would find it in
    # L2 it waits ``shared_line_store_cycles``; 0: not measured, that price everywhere)
    shared_pair_store_cycles: float = dataclasses.field(
        default=0.0, metadata={"range": (0.0, 1000.0)}
    )


@dataclass(frozen=True)
class OverheadSpec:
    """Fixed costs the model adds per kernel call."""

    call_seconds: float = _in(0.0, 1.0)
    thread_seconds: float = _in(0.0, 1.0)


@dataclass(frozen=True)
class HwSpec:
    """A target: everything the constraints and the model need."""

    name: str
    description: str
    kind: str
    isa: IsaSpec
    core: CoreSpec
    caches: tuple[CacheSpec, ...]
    memory: MemorySpec
    overhead: OverheadSpec
    # where the values come from: a field path ("core.frequency_ghz") or a section ("core",
    # "caches") -> "datasheet ...", "measured by hw calibrate on ...", "sysfs", "assumed: ...";
    # "core_model" names the spec the core model came from (the ``[origin]`` table of a file)
    origin: tuple[tuple[str, str], ...] = dataclasses.field(
        default=(), metadata={"string_table": True}
    )

    def origin_of(self, path: str) -> str:
        """Where the value at ``path`` (``core.frequency_ghz``, ``caches.L2.latency_cycles``) came
        from: its own entry, else the same field of every level (``caches.latency_cycles``), else
        its level's or its section's, else "not stated"."""
        table = dict(self.origin)
        parts = path.split(".")
        candidates = [path]
        if len(parts) == 3:  # caches.L2.latency_cycles
            candidates += [f"{parts[0]}.{parts[2]}", f"{parts[0]}.{parts[1]}"]
        candidates.append(parts[0])
        return next((table[c] for c in candidates if c in table), "not stated")

    @property
    def core_model_from(self) -> str:
        """The spec (or calibration) this target's core model came from."""
        return dict(self.origin).get("core_model", self.name)

    @property
    def vector_lanes_f32(self) -> int:
        """fp32 lanes in one vector register."""
        return self.isa.vector_bits // 32

    def cache(self, level: int) -> CacheSpec:
        """The cache at ``level`` (1-based)."""
        for c in self.caches:
            if c.level == level:
                return c
        raise HwSpecError(
            f"target {self.name!r} has no L{level} cache; "
            f"add a [[caches]] entry with level = {level}"
        )

    def cache_bytes_per_core(self, level: int) -> int:
        """Capacity of a cache level available to one core."""
        c = self.cache(level)
        return c.size_kib * 1024 // max(1, c.shared_by_cores)

    def usable_bytes_per_core(self, level: int) -> float:
        """Bytes of a cache level one core's tiles may claim: its share of the level times the
        level's ``usable_fraction``."""
        return self.cache_bytes_per_core(level) * self.cache(level).usable_fraction

    def keeps_swept_lines(self, level: int) -> bool:
        """Whether lines a sweep meets at ``level`` come from there, not from memory
        (``CacheSpec.keeps_swept_lines``)."""
        return self.cache(level).keeps_swept_lines

    def swept_bytes_held(self) -> float:
        """Usable bytes per core of the farthest level that keeps swept lines: a sweep over
        more comes from memory."""
        kept = [c.level for c in self.caches if c.keeps_swept_lines]
        return self.usable_bytes_per_core(max(kept, default=1))

    @property
    def peak_flops_per_core(self) -> float:
        """fp32 FLOP/s of one core at full FMA issue."""
        lanes = self.core.fma_units * self.core.fma_width_bits // 32
        return 2.0 * lanes * self.core.frequency_ghz * 1e9

    @property
    def vector_fmas_per_cycle(self) -> float:
        """FMAs of the widest vector the pipes issue a cycle (a wider vector takes several)."""
        c = self.core
        return c.fma_units * min(1.0, c.fma_width_bits / self.isa.vector_bits)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for JSON and ``aotune hw show``)."""
        data = dataclasses.asdict(self)
        data["origin"] = dict(self.origin)
        data["core_model_from"] = self.core_model_from
        return data

    def field_paths(self) -> list[str]:
        """Every value's path in file order: ``isa.arch``, ..., ``caches.L1.level``, ...,
        ``overhead.thread_seconds`` (the top-level strings and the origin table excluded)."""
        paths = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                paths += [f"{f.name}.{g.name}" for g in dataclasses.fields(value)]
            elif f.name == "caches":
                paths += [
                    f"caches.L{c.level}.{g.name}" for c in value for g in dataclasses.fields(c)
                ]
        return paths

    def origins_by_source(self) -> dict[str, list[str]]:
        """Where the values come from -> the paths of the values that came from there."""
        out: dict[str, list[str]] = {}
        for path in self.field_paths():
            out.setdefault(self.origin_of(path), []).append(path)
        return out

    def summary_lines(self) -> list[str]:
        """What ``aotune hw show`` prints."""
        c = self.core
        lines = [
            f"{self.name}: {self.description}",
            f"  isa      {self.isa.arch} {self.isa.llvm_cpu}, "
            f"{self.isa.vector_registers} x {self.isa.vector_bits}-bit vector registers, "
            f"{self.isa.general_registers} general",
            f"  core     {c.cores} cores @ {c.frequency_ghz} GHz, "
            f"{c.fma_units} FMA x {c.fma_width_bits}-bit (latency {c.fma_latency_cycles}), "
            f"{c.load_ports} loads + {c.store_ports} store/cycle, issue {c.issue_width}",
            f"  peak     {self.peak_flops_per_core / 1e9:.1f} GFLOP/s fp32 per core",
        ]
        for cache in self.caches:
            lines.append(
                f"  L{cache.level}       {cache.size_kib} KiB, {cache.associativity}-way"
                f"{'' if cache.replacement == 'lru' else f' ({cache.replacement} eviction)'}, "
                f"shared by {cache.shared_by_cores}, "
                f"{cache.bandwidth_bytes_per_cycle:g} B/cycle, "
                f"tiles may use {cache.usable_fraction:g}"
                + ("" if cache.keeps_swept_lines else ", swept lines come from memory")
            )
        lines.append(f"  memory   {self.memory.bandwidth_gbs:g} GB/s")
        lines.append(f"  core model: {self.core_model_from}")
        lines.append("  where the values come from:")
        for source, paths in self.origins_by_source().items():
            lines.append(f"    {source}:")
            lines.append(f"      {', '.join(paths)}")
        return lines


_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}
SPEC_FILE_LIMIT_BYTES = 256 * 1024  # a spec is a few KiB; anything far larger is the wrong file
ARCHES = ("x86_64", "aarch64")  # the ISAs analysis/features.py reads
# the registers each ISA names (x86-64: zmm0-31 with AVX-512, rax..r15; AArch64: v0-31, x0-x30):
# a spec promising more makes the model plan tiles whose accumulators the compiler must spill
ARCH_REGISTERS = {"x86_64": {"vector": 32, "general": 16}, "aarch64": {"vector": 32, "general": 31}}
_SSE_ABI = "x86-64 passes and returns floats in SSE registers (LLVM stops on it)"
_APX = "its APX encodings are ones capstone, which reads the kernels' object code, cannot decode"
# Intel's APX: new registers and encodings (REX2, promoted EVEX) that capstone cannot decode yet;
# kept off even where the CPU name implies them (``codegen/compile.py``)
X86_APX_FEATURES = ("egpr", "ndd", "ppx", "push2pop2", "ccmp", "nf", "cf", "zu")
_NEON_ABI = "AArch64 passes floats in its FP/SIMD registers and the kernels compute in NEON vectors"
# LLVM features no kernel can be built or read with, and why: checked before LLVM sees them,
# since some end the process there (soft-float aborts on the kernels' masked loads)
REFUSED_FEATURES = {
    "x86_64": {
        "-sse": _SSE_ABI,
        "-sse2": _SSE_ABI,
        "+soft-float": "soft-float leaves no floating-point registers to compute in",
        **{f"+{feature}": _APX for feature in X86_APX_FEATURES},
    },
    "aarch64": {"-neon": _NEON_ABI, "-fp-armv8": _NEON_ABI},
}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _convert(value: Any, tp: Any, where: str, meta: Mapping[str, Any]) -> Any:
    if meta.get("string_table"):
        if not isinstance(value, dict):
            raise HwSpecError(f"{where}: expected a table of strings, got {type(value).__name__}")
        if len(value) > 500:
            raise HwSpecError(f"{where}: {len(value)} entries; at most 500")
        for key, text in value.items():
            if not isinstance(text, str) or len(text) > 1000:
                raise HwSpecError(
                    f"{where}.{_short(key)}: expected a string of at most 1000 characters, "
                    f"got {_short(text)}"
                )
            # hw show and tune print these: a terminal would act on an escape
            found = first_control_character(key) or first_control_character(text, "\t")
            if found:
                raise HwSpecError(
                    f"{where}.{_short(key)}: holds the control character {found}; write "
                    "printable text"
                )
        return tuple(sorted(value.items()))
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise HwSpecError(f"{where}: expected a table, got {type(value).__name__}")
        return _build(tp, value, where)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise HwSpecError(f"{where}: expected an array of tables, got {type(value).__name__}")
        return tuple(_convert(v, item_tp, f"{where}[{i}]", {}) for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp in _TYPE_NAMES and (type(value) is not tp):
        raise HwSpecError(f"{where}: expected {_TYPE_NAMES[tp]}, got {_short(value)}")
    if tp is float and not math.isfinite(value):
        raise HwSpecError(f"{where}: expected a finite number, got {value}")
    if "range" in meta:
        lo, hi = meta["range"]
        if not lo <= value <= hi:
            raise HwSpecError(
                f"{where} = {_short(value)} is out of range; allowed {_num(lo)}..{_num(hi)}"
            )
        if meta.get("power_of_two") and value & (value - 1):
            raise HwSpecError(
                f"{where} = {value} is not a power of two; allowed {lo}, {2 * lo}, ..., {hi}"
            )
    if tp is str and len(value) > 1000:
        raise HwSpecError(f"{where}: a string of {len(value)} characters; at most 1000")
    return value


def _num(x: float) -> str:
    """A range bound as written: whole numbers in full (1048576, not 1.04858e+06)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _short(value: Any) -> str:
    if isinstance(value, datetime.date | datetime.time):  # a TOML date: as the file writes it
        return toml_shown(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in file_fields(cls)}
    for key in data:
        if key not in fields:
            raise HwSpecError(
                f"{where}: unknown key {_short(key)}; expected one of {', '.join(fields)}"
            )
    kwargs = {}
    for name, f in fields.items():
        tp = hints[name]
        if name not in data and f.default is not dataclasses.MISSING:
            continue  # an optional key (e.g. [origin])
        if name not in data:
            expected = _TYPE_NAMES.get(
                tp, "table" if dataclasses.is_dataclass(tp) else "array of tables"
            )
            raise HwSpecError(
                f"{where}: missing key {name!r} ({expected}); add it (`aotune hw show NAME` "
                "prints a built-in spec with every key and where its values come from); a file "
                "an older `aotune hw calibrate` wrote lacks the keys added since: add them so, "
                "or calibrate again to a new file"
            )
        sub = f"{where}.{name}" if where.count(":") else f"{where}:{name}"
        kwargs[name] = _convert(data[name], tp, sub, f.metadata)
    return cls(**kwargs)


def build_dataclass(cls: type, data: dict[str, Any], where: str) -> Any:
    """``cls`` built from a parsed TOML table, strictly (the schema walker every kind shares)."""
    return _build(cls, data, where)


def is_spec_name(name: str) -> bool:
    """Whether ``name`` is one a spec may have (``check_spec_texts``' rule)."""
    return bool(_NAME.fullmatch(name))


def check_spec_texts(name: str, description: str, where: str) -> None:
    """A spec's name is a database key and a file-name-like word; its description is printed:
    neither may hold control characters (a terminal would act on them)."""
    if not is_spec_name(name):
        raise HwSpecError(
            f"{where}: name {_short(name)} must be 1-64 letters, digits, '.', '_' or '-'"
        )
    found = first_control_character(description, allowed="\t\n")
    if found:
        raise HwSpecError(
            f"{where}: description holds the control character {found}; write printable text"
        )


_SECTIONS = ("isa", "core", "caches", "memory", "overhead")  # a CPU spec's tables
# a field's metadata key: aotune sets the field itself, a spec file may not (the loader refuses it)
SET_BY_AOTUNE = "set_by_aotune"


def file_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of schema ``cls`` a spec file may set (not those aotune sets itself)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get(SET_BY_AOTUNE)]


def origin_keys(spec: HwSpec) -> set[str]:
    """The keys an ``[origin]`` entry may have (``HwSpec.origin_of`` reads each): a field path,
    a field of every cache level, a level, a section, or ``core_model``."""
    return {
        "core_model",
        *_SECTIONS,
        *spec.field_paths(),
        *(f"caches.{f.name}" for f in dataclasses.fields(CacheSpec)),
        *(f"caches.L{c.level}" for c in spec.caches),
    }


def validate_spec(spec: HwSpec, where: str) -> HwSpec:
    """Semantic checks that span fields (each field's own type and range were checked while
    loading); returns the spec unchanged."""
    check_spec_texts(spec.name, spec.description, where)
    if spec.kind != "cpu":
        raise HwSpecError(f'{where}: kind {_short(spec.kind)} is not supported; use kind = "cpu"')
    isa = spec.isa
    if isa.arch not in ARCHES:
        raise HwSpecError(
            f"{where}: isa.arch {_short(isa.arch)} unknown; use one of {', '.join(ARCHES)}"
        )
    keys = origin_keys(spec)
    for key, _ in spec.origin:
        if key not in keys:
            raise HwSpecError(
                f"{where}: [origin] key {_short(key)} names no value of the spec, so the value it "
                "was meant for has no origin; use a field path (core.frequency_ghz, "
                "caches.L2.latency_cycles), a field of every cache level (caches.latency_cycles), "
                "a level (caches.L2), a section (core) or core_model"
            )
    for kind, have in (("vector", isa.vector_registers), ("general", isa.general_registers)):
        named = ARCH_REGISTERS[isa.arch][kind]
        if have > named:
            raise HwSpecError(
                f"{where}: isa.{kind}_registers = {have}, but {isa.arch} names only {named}; "
                f"set at most {named}"
            )
    triple_arch = isa.triple.split("-")[0]
    if {"arm64": "aarch64"}.get(triple_arch, triple_arch) != isa.arch:
        raise HwSpecError(
            f"{where}: isa.triple {_short(isa.triple)} is not an {isa.arch} triple; "
            f"use e.g. {isa.arch}-unknown-linux-gnu"
        )
    parts = isa.triple.split("-")
    if "linux" not in parts[1:] or {"gnux32", "gnu_ilp32"} & set(parts):
        raise HwSpecError(
            f"{where}: isa.triple {_short(isa.triple)} is not a 64-bit Linux triple: aotune "
            f"builds and reads ELF64 object code; use e.g. {isa.arch}-unknown-linux-gnu"
        )
    _check_feature_syntax(isa.llvm_features, where)
    _check_refused_features(isa, where)
    levels = sorted(c.level for c in spec.caches)
    if levels != list(range(1, len(levels) + 1)) or not levels:
        raise HwSpecError(f"{where}: caches must list levels 1..n once each, got {levels}")
    for c in spec.caches:
        if c.level <= 2 and not c.keeps_swept_lines:
            raise HwSpecError(
                f"{where}: caches.L{c.level}.keeps_swept_lines = false, but the model takes what "
                "L1 and L2 hold from there; set it only on a level beyond L2 (or remove it)"
            )
        if c.replacement not in REPLACEMENT_POLICIES:
            raise HwSpecError(
                f"{where}: caches.L{c.level}.replacement {_short(c.replacement)} is not a policy "
                f"aotune models; use one of {', '.join(map(repr, REPLACEMENT_POLICIES))} (or leave "
                "the key out for 'lru')"
            )
        sets = c.size_kib * 1024 / (c.line_bytes * c.associativity)
        if sets < 1 or sets != int(sets):
            raise HwSpecError(
                f"{where}: cache L{c.level} of {c.size_kib} KiB cannot hold {c.associativity} "
                f"ways of {c.line_bytes}-byte lines in whole sets; fix size_kib, line_bytes "
                "or associativity"
            )
        if c.shared_by_cores > spec.core.cores:
            # the spec's cores are those a kernel may use; a cache's sharers are counted among them
            raise HwSpecError(
                f"{where}: cache L{c.level} is shared by {c.shared_by_cores} cores, more than the "
                f"{spec.core.cores} the spec has; count only the cores a kernel may use"
            )
    if spec.core.fma_width_bits > isa.vector_bits:
        raise HwSpecError(
            f"{where}: core.fma_width_bits = {spec.core.fma_width_bits} is wider than "
            f"isa.vector_bits = {isa.vector_bits}; an FMA pipe is at most as wide as the "
            "vectors the ISA has: fix one of them"
        )
    _check_vector_features(isa, where)
    by_level = sorted(spec.caches, key=lambda c: c.level)
    for inner, outer in zip(by_level, by_level[1:]):
        if outer.size_kib < inner.size_kib:  # a level further out is never the smaller one
            raise HwSpecError(
                f"{where}: cache L{outer.level} ({outer.size_kib} KiB) is smaller than "
                f"L{inner.level} ({inner.size_kib} KiB); check the size_kib of both"
            )
        if outer.latency_cycles < inner.latency_cycles:  # nor the faster one
            raise HwSpecError(
                f"{where}: cache L{outer.level}'s latency ({outer.latency_cycles} cycles) is below "
                f"L{inner.level}'s ({inner.latency_cycles}); a level further out is never faster: "
                "check the latency_cycles of both (aotune hw calibrate measures them)"
            )
    last = by_level[-1]
    if spec.memory.latency_cycles < last.latency_cycles:
        raise HwSpecError(
            f"{where}: memory.latency_cycles ({spec.memory.latency_cycles}) is below cache "
            f"L{last.level}'s latency ({last.latency_cycles}); memory is never faster than a "
            "cache: check both (aotune hw calibrate measures them)"
        )
    if spec.memory.prefetch_stride_bytes > spec.memory.page_bytes:
        raise HwSpecError(
            f"{where}: memory.prefetch_stride_bytes = {spec.memory.prefetch_stride_bytes} is "
            f"beyond a page ({spec.memory.page_bytes} bytes); prefetchers stop at page boundaries"
        )
    return spec


def _gives_vectors(feature: str, bits: int) -> bool:
    """Whether the x86 LLVM feature ``feature`` gives (or implies) vectors of ``bits``: every
    AVX-512 and AVX10 feature implies avx512f, and FMA, F16C and every AVX feature imply AVX."""
    if bits == 512:
        return feature.startswith(("avx512", "avx10"))
    return feature.startswith("avx") or feature in ("fma", "f16c", "fma4", "xop")


def feature_items(features: str) -> list[str]:
    """The +name / -name items of an LLVM feature string, blanks dropped."""
    return [item for item in (f.strip() for f in features.split(",")) if item]


def _check_vector_features(isa: IsaSpec, where: str) -> None:
    """On x86-64, a spec whose features disable the vectors of its width, or enable ISA
    extensions of which none gives them (an AVX2 CPU said to have 512-bit vectors gets ymm code
    the model mis-times), is refused; a list with no extension leaves it to the CPU name."""
    if isa.arch != "x86_64" or isa.vector_bits < 256:
        return
    listed = feature_items(isa.llvm_features)
    needed = "avx512f" if isa.vector_bits == 512 else "avx"
    enabled = [f[1:] for f in listed if f.startswith("+")]
    if f"-{needed}" in listed or (
        enabled and not any(_gives_vectors(f, isa.vector_bits) for f in enabled)
    ):
        raise HwSpecError(
            f"{where}: isa.vector_bits = {isa.vector_bits}, but isa.llvm_features "
            f"({isa.llvm_features}) does not give +{needed}; add it, or give the vector width "
            "the CPU has"
        )


def _check_feature_syntax(features: str, where: str) -> None:
    """LLVM aborts the whole process on a feature item without a sign: check before it sees one."""
    for item in feature_items(features):
        if not re.fullmatch(r"[+-][A-Za-z0-9_.-]+", item):
            raise HwSpecError(
                f"{where}: isa.llvm_features item {_short(item)} is not +name or -name; "
                'write e.g. "+avx2,+fma"'
            )


def _check_refused_features(isa: IsaSpec, where: str) -> None:
    """Refuse a feature of ``REFUSED_FEATURES``: one that takes away the registers every kernel
    computes in, or gives code aotune cannot read back."""
    refused = REFUSED_FEATURES[isa.arch]
    for item in feature_items(isa.llvm_features):
        if item in refused:
            raise HwSpecError(
                f"{where}: isa.llvm_features has {item}, which aotune cannot use: {refused[item]}; "
                "remove it from the list"
            )


def check_llvm_names(spec: HwSpec, where: str) -> HwSpec:
    """Check that LLVM knows the spec's CPU and every feature it names (an unknown CPU or feature
    reaching LLVM is a fatal error or silently ignored there); returns the spec unchanged."""
    from aotune.codegen.compile import llvm_target_names

    cpus, features = llvm_target_names(spec.isa.triple)
    if spec.isa.llvm_cpu not in cpus:
        close = difflib.get_close_matches(spec.isa.llvm_cpu, sorted(cpus), n=3)
        hint = (
            f"; did you mean {', '.join(close)}?"
            if close
            else f"; 'aotune hw show host' names this machine's ({len(cpus)} are known)"
        )
        raise HwSpecError(
            f"{where}: isa.llvm_cpu {_short(spec.isa.llvm_cpu)} is not a CPU LLVM knows for "
            f"{spec.isa.arch}{hint}"
        )
    for item in feature_items(spec.isa.llvm_features):
        if item[1:] not in features:
            close = difflib.get_close_matches(item[1:], sorted(features), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise HwSpecError(
                f"{where}: isa.llvm_features names {_short(item[1:])}, which LLVM does not know "
                f"for {spec.isa.arch}{hint}"
            )
    _check_cpu_gives_vectors(spec, where)
    return spec


def _check_cpu_gives_vectors(spec: HwSpec, where: str) -> None:
    """Where an x86 spec's features name no extension giving its vector width (the case
    ``_check_vector_features`` leaves to the CPU name), ask LLVM what the CPU gives: a Haswell
    said to have 512-bit vectors gets ymm code the model would time as zmm code."""
    from aotune.codegen.compile import x86_vector_register_bits

    isa = spec.isa
    enabled = [f[1:] for f in feature_items(isa.llvm_features) if f.startswith("+")]
    if isa.arch != "x86_64" or any(_gives_vectors(f, isa.vector_bits) for f in enabled):
        return
    have = x86_vector_register_bits(spec)
    if have < isa.vector_bits:
        needed = "+avx512f" if isa.vector_bits == 512 else "+avx2,+fma"
        raise HwSpecError(
            f"{where}: isa.vector_bits = {isa.vector_bits}, but LLVM's code for isa.llvm_cpu "
            f"{_short(isa.llvm_cpu)} with isa.llvm_features {_short(isa.llvm_features)} uses "
            f"{have}-bit vectors; set vector_bits = {have} (and the registers that CPU has), or "
            f"add {needed} to llvm_features if the CPU has it"
        )


def spec_from_dict(data: dict[str, Any], where: str) -> HwSpec:
    """Build and validate a spec from parsed TOML."""
    spec = _build(HwSpec, data, where)
    spec = dataclasses.replace(spec, caches=tuple(sorted(spec.caches, key=lambda c: c.level)))
    return validate_spec(spec, where)


# a spec file's ``kind`` -> (module, the function building it from parsed TOML, its dataclass),
# imported on use, so the GPU schema module is not loaded for CPU work
SPEC_KINDS = {
    "cpu": ("aotune.hwspecs.spec", "spec_from_dict", "HwSpec"),
    "gpu": ("aotune.hwspecs.gpu_spec", "gpu_spec_from_dict", "GpuSpec"),
}


def spec_from_data(data: dict[str, Any], where: str) -> Any:
    """A spec of whichever kind the parsed TOML says it is (``HwSpec`` or ``GpuSpec``)."""
    import importlib

    kind = data.get("kind")
    if kind is None:
        raise HwSpecError(
            f"{where}: missing key 'kind' ({' or '.join(map(repr, SPEC_KINDS))}); is this an "
            "aotune spec file? 'aotune hw calibrate -o FILE' writes a complete one"
        )
    if not isinstance(kind, str) or kind not in SPEC_KINDS:
        raise HwSpecError(
            f"{where}:kind: expected one of {', '.join(map(repr, SPEC_KINDS))}, got {_short(kind)}"
        )
    unknown = set(data) - _sections(kind)
    for other in SPEC_KINDS if unknown else ():
        if other != kind and unknown <= _sections(other):
            raise HwSpecError(
                f"{where}: kind = {kind!r}, but its {', '.join(sorted(unknown))} belong to a "
                f"{other} spec; set kind = {other!r} (or write a {kind} spec: see the built-in "
                f"ones, aotune hw show NAME)"
            )
    module, build, _ = SPEC_KINDS[kind]
    return getattr(importlib.import_module(module), build)(data, where)


def _sections(kind: str) -> set[str]:
    """The top-level keys a spec of ``kind`` has (its dataclass's fields)."""
    import importlib

    module, _, schema = SPEC_KINDS[kind]
    return {f.name for f in file_fields(getattr(importlib.import_module(module), schema))}


def load_spec_file(path: str | Path, check_llvm: bool = True) -> Any:
    """Load and validate one TOML spec file (a CPU ``HwSpec`` or a ``GpuSpec``, by its kind);
    ``check_llvm``: also ask LLVM whether it knows a CPU spec's CPU and features (the built-in
    specs are checked by the tests instead)."""
    p = Path(path)
    text = decode_utf8(
        read_user_file(p, "hwspec", HwSpecError, SPEC_FILE_LIMIT_BYTES), p, "hwspec", HwSpecError
    )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HwSpecError(f"{p}: not valid TOML ({e})") from None
    except RecursionError:
        raise HwSpecError(f"{p}: not valid TOML (nested too deeply)") from None
    spec = spec_from_data(data, str(p))
    return check_llvm_names(spec, str(p)) if check_llvm and isinstance(spec, HwSpec) else spec


def builtin_names(kind: str | None = None) -> list[str]:
    """Names of the spec files shipped with aotune (only those of ``kind`` if given)."""
    names = sorted(p.stem for p in SPEC_DIR.glob("*.toml"))
    if kind is None:
        return names
    return [n for n in names if _file_kind(SPEC_DIR / f"{n}.toml") == kind]


def builtin_spec_inputs() -> dict[str, str]:
    """The spec files shipped with aotune, as inputs are named in messages (``aotune's built-in
    spec NAME, a file`` -> path): files no command's output may replace."""
    return {
        f"aotune's built-in spec {p.stem}, a file": str(p) for p in sorted(SPEC_DIR.glob("*.toml"))
    }


def _file_kind(path: Path) -> str | None:
    try:
        return tomllib.loads(path.read_text()).get("kind")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def _user_spec_file(path: str) -> Any:
    """A spec file the user gave; one that keeps a built-in's name but changes its values says
    which (a CPU spec in its origins, ``spec_toml.mark_builtin_copy``; a GPU spec in its
    ``spec_from``, ``gpu_spec.mark_builtin_gpu_copy``), and one named ``host`` says it is not the
    detected host, so its output is not taken for theirs."""
    if not os.path.lexists(path):
        raise HwSpecError(
            f"no spec file {path} (no such file); check the path, or give --target host "
            "or a built-in name ('aotune hw list' lists them)"
        )
    spec = load_spec_file(path)
    if not isinstance(spec, HwSpec) and spec.name == "host":  # a GPU file named like the CPU
        return dataclasses.replace(spec, spec_from="the spec file, not the detected host")
    if isinstance(spec, HwSpec) and spec.name == "host":  # what --target host detects
        origin = dict(spec.origin)
        own = origin.get("core_model")
        origin["core_model"] = "the spec file, not the detected host" + (f": {own}" if own else "")
        return dataclasses.replace(spec, origin=tuple(origin.items()))
    if spec.name not in builtin_names():
        return spec
    builtin = load_spec_file(SPEC_DIR / f"{spec.name}.toml", False)
    if not isinstance(spec, HwSpec):
        from aotune.hwspecs.gpu_spec import mark_builtin_gpu_copy

        return mark_builtin_gpu_copy(spec, builtin)
    from aotune.hwspecs.spec_toml import mark_builtin_copy

    return mark_builtin_copy(spec, builtin)


def shadowed_file_note(name: str) -> str | None:
    """A warning when ``name`` is both a target name (``host`` or a built-in) and a file here:
    the name wins, and the user may have meant the file."""
    if name != "host" and name not in builtin_names():
        return None
    if not os.path.isfile(name):
        return None
    return (
        f"target {name} is the built-in name, not the file {name} in this folder; give ./{name} "
        "to use the file"
    )


def load_target(name: str) -> Any:
    """A target by name (``host``, a built-in name) or by path to a ``.toml`` file: an ``HwSpec``
    for a CPU, a ``GpuSpec`` for a GPU."""
    if name == "host":
        from aotune.hwspecs.host import detect_host

        return detect_host()
    if not name:
        raise HwSpecError("an empty target name; pass host, a built-in name or a .toml path")
    stem = Path(name).stem
    if name == f"{stem}.toml" and not os.path.exists(name) and stem in builtin_names():
        raise HwSpecError(  # a built-in's name typed as its file's
            f"no spec file {_short(name)} here; the built-in spec is named {stem}, without "
            f".toml (or give the path of your own {name})"
        )
    if name.endswith(".toml") or "/" in name:
        return _user_spec_file(name)
    if name in builtin_names():
        return load_spec_file(SPEC_DIR / f"{name}.toml", check_llvm=False)
    if os.path.isfile(name):  # a spec file saved under another suffix (my-cpu.txt)
        return _user_spec_file(name)
    if os.path.isdir(name):
        raise HwSpecError(
            f"target {_short(name)} is a directory, not a built-in name or a spec file; pass a "
            ".toml spec inside it (or host, or a built-in name)"
        )
    if name.lower() in builtin_names() or name.lower() == "host":  # names are lower case
        raise HwSpecError(f"unknown target {_short(name)}; did you mean {name.lower()}?")
    raise HwSpecError(
        f"unknown target {_short(name)}; known: host, {', '.join(builtin_names())} "
        "(or pass a path to a .toml spec)"
    )
