"""Frozen hardware descriptions and their strict TOML loader.

Roadmap: this module owns the CPU schema and the loading of every spec file; a file's ``kind``
picks its schema from ``SPEC_KINDS`` (``cpu`` here, ``gpu`` in :mod:`aotune.hwspecs.gpu_spec`).

The schema *is* the dataclasses below: the loader walks their fields, so a key that is not a field,
a field that is missing, or a value of the wrong type is an error naming the file, the key and the
expected type.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotune.errors import HwSpecError

SPEC_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class IsaSpec:
    """Instruction set facts: what LLVM targets and what the vector unit looks like."""

    arch: str  # "x86_64" or "aarch64": selects the capstone table in analysis/features.py
    triple: str
    llvm_cpu: str
    llvm_features: str
    vector_bits: int
    vector_registers: int
    general_registers: int  # integer registers the compiler can allocate (x86-64: 16, AArch64: 31)


@dataclass(frozen=True)
class CoreSpec:
    """Per-core issue resources; the model's throughput coefficients."""

    cores: int
    frequency_ghz: float
    fma_units: int
    fma_width_bits: int
    fma_latency_cycles: int
    # cycles per FMA instruction in a tile row that mixes full vectors with a narrower tail vector
    # (1 / fma_units where a narrow FMA costs just its pipe slot; more where the pipes pair badly)
    mixed_width_fma_cycles: float
    load_ports: int
    load_width_bits: int
    store_ports: int
    issue_width: int
    reorder_window: (
        int  # instructions in flight: lets independent FMA chains of consecutive tiles overlap
    )


@dataclass(frozen=True)
class CacheSpec:
    """One data-cache level."""

    level: int
    size_kib: int
    line_bytes: int
    associativity: int
    latency_cycles: int  # load-to-use latency of a hit in this level
    shared_by_cores: int
    bandwidth_bytes_per_cycle: float  # per core, from this level into the one above
    usable_fraction: float  # share of the capacity a tile may claim (the rest is for others)


@dataclass(frozen=True)
class MemorySpec:
    """Main memory, shared by all cores."""

    bandwidth_gbs: float
    page_bytes: int  # prefetchers stop at page boundaries; each page also needs a TLB entry
    prefetch_stride_bytes: int  # largest stride between accesses that the stride prefetcher follows
    tlb_miss_cycles: int  # extra latency of an access whose page misses the first-level data TLB
    dtlb_entries: int  # pages the first-level data TLB holds
    prefetch_ahead_cycles: (
        int  # how far ahead software prefetches of strided operand rows are issued
    )


@dataclass(frozen=True)
class OverheadSpec:
    """Fixed costs the model adds per kernel call."""

    call_seconds: float
    thread_seconds: float


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

    @property
    def peak_flops_per_core(self) -> float:
        """fp32 FLOP/s of one core at full FMA issue."""
        lanes = self.core.fma_units * self.core.fma_width_bits // 32
        return 2.0 * lanes * self.core.frequency_ghz * 1e9

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for JSON and ``aotune hw show``)."""
        return dataclasses.asdict(self)

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
                f"  L{cache.level}       {cache.size_kib} KiB, {cache.associativity}-way, "
                f"shared by {cache.shared_by_cores}, "
                f"{cache.bandwidth_bytes_per_cycle:g} B/cycle, "
                f"tiles may use {cache.usable_fraction:g}"
            )
        lines.append(f"  memory   {self.memory.bandwidth_gbs:g} GB/s")
        return lines


_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise HwSpecError(f"{where}: expected a table, got {type(value).__name__}")
        return _build(tp, value, where)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise HwSpecError(f"{where}: expected an array of tables, got {type(value).__name__}")
        return tuple(_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in _TYPE_NAMES and (type(value) is not tp):
        raise HwSpecError(f"{where}: expected {_TYPE_NAMES[tp]}, got {value!r}")
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in hints:
            raise HwSpecError(f"{where}: unknown key {key!r}; expected one of {', '.join(names)}")
    kwargs = {}
    for name in names:
        tp = hints[name]
        if name not in data:
            expected = _TYPE_NAMES.get(
                tp, "table" if dataclasses.is_dataclass(tp) else "array of tables"
            )
            raise HwSpecError(f"{where}: missing key {name!r} ({expected})")
        kwargs[name] = _convert(
            data[name], tp, f"{where}.{name}" if where.count(":") else f"{where}:{name}"
        )
    return cls(**kwargs)


def build_dataclass(cls: type, data: dict[str, Any], where: str) -> Any:
    """``cls`` built from a parsed TOML table, strictly (the schema walker every kind shares)."""
    return _build(cls, data, where)


def validate_spec(spec: HwSpec, where: str) -> HwSpec:
    """Semantic checks the types cannot express; returns the spec unchanged."""
    positive = {
        "isa.vector_bits": spec.isa.vector_bits,
        "isa.vector_registers": spec.isa.vector_registers,
        "isa.general_registers": spec.isa.general_registers,
        "core.cores": spec.core.cores,
        "core.frequency_ghz": spec.core.frequency_ghz,
        "core.fma_units": spec.core.fma_units,
        "core.fma_width_bits": spec.core.fma_width_bits,
        "core.fma_latency_cycles": spec.core.fma_latency_cycles,
        "core.load_ports": spec.core.load_ports,
        "core.mixed_width_fma_cycles": spec.core.mixed_width_fma_cycles,
        "core.load_width_bits": spec.core.load_width_bits,
        "core.store_ports": spec.core.store_ports,
        "core.issue_width": spec.core.issue_width,
        "core.reorder_window": spec.core.reorder_window,
        "memory.bandwidth_gbs": spec.memory.bandwidth_gbs,
        "memory.page_bytes": spec.memory.page_bytes,
        "memory.prefetch_stride_bytes": spec.memory.prefetch_stride_bytes,
        "memory.tlb_miss_cycles": spec.memory.tlb_miss_cycles,
        "memory.dtlb_entries": spec.memory.dtlb_entries,
        "memory.prefetch_ahead_cycles": spec.memory.prefetch_ahead_cycles,
    }
    for key, value in positive.items():
        if value <= 0:
            raise HwSpecError(f"{where}: {key} must be > 0, got {value}")
    if spec.kind != "cpu":
        raise HwSpecError(f'{where}: kind {spec.kind!r} is not supported yet; use kind = "cpu"')
    if spec.isa.arch not in ("x86_64", "aarch64"):
        raise HwSpecError(f'{where}: isa.arch {spec.isa.arch!r} unknown; use "x86_64" or "aarch64"')
    if spec.isa.vector_bits % 32:
        raise HwSpecError(
            f"{where}: isa.vector_bits must be a multiple of 32, got {spec.isa.vector_bits}"
        )
    levels = sorted(c.level for c in spec.caches)
    if levels != list(range(1, len(levels) + 1)) or not levels:
        raise HwSpecError(f"{where}: caches must list levels 1..n once each, got {levels}")
    for c in spec.caches:
        if (
            c.size_kib <= 0
            or c.line_bytes <= 0
            or c.associativity <= 0
            or c.latency_cycles <= 0
            or c.shared_by_cores <= 0
            or c.bandwidth_bytes_per_cycle <= 0
        ):
            raise HwSpecError(f"{where}: cache L{c.level} sizes and bandwidth must be > 0")
        if not 0.0 < c.usable_fraction <= 1.0:
            raise HwSpecError(
                f"{where}: cache L{c.level} usable_fraction must be in (0, 1], "
                f"got {c.usable_fraction}"
            )
    return spec


def spec_from_dict(data: dict[str, Any], where: str) -> HwSpec:
    """Build and validate a spec from parsed TOML."""
    spec = _build(HwSpec, data, where)
    spec = dataclasses.replace(spec, caches=tuple(sorted(spec.caches, key=lambda c: c.level)))
    return validate_spec(spec, where)


# a spec file's ``kind`` -> "module:function" building it from parsed TOML (imported on use, so the
# GPU schema module is not loaded for CPU work)
SPEC_KINDS = {
    "cpu": "aotune.hwspecs.spec:spec_from_dict",
    "gpu": "aotune.hwspecs.gpu_spec:gpu_spec_from_dict",
}


def spec_from_data(data: dict[str, Any], where: str) -> Any:
    """A spec of whichever kind the parsed TOML says it is (``HwSpec`` or ``GpuSpec``)."""
    import importlib

    kind = data.get("kind")
    if kind not in SPEC_KINDS:
        raise HwSpecError(
            f"{where}:kind: expected one of {', '.join(map(repr, SPEC_KINDS))}, got {kind!r}"
        )
    module, func = SPEC_KINDS[kind].split(":")
    return getattr(importlib.import_module(module), func)(data, where)


def load_spec_file(path: str | Path) -> Any:
    """Load and validate one TOML spec file (a CPU ``HwSpec`` or a ``GpuSpec``, by its kind)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise HwSpecError(f"cannot read hwspec {p}: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HwSpecError(f"{p}: not valid TOML ({e})") from None
    return spec_from_data(data, str(p))


def builtin_names(kind: str | None = None) -> list[str]:
    """Names of the spec files shipped with aotune (only those of ``kind`` if given)."""
    names = sorted(p.stem for p in SPEC_DIR.glob("*.toml"))
    if kind is None:
        return names
    return [n for n in names if _file_kind(SPEC_DIR / f"{n}.toml") == kind]


def _file_kind(path: Path) -> str | None:
    try:
        return tomllib.loads(path.read_text()).get("kind")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def load_target(name: str) -> Any:
    """A target by name (``host``, a built-in name) or by path to a ``.toml`` file: an ``HwSpec``
    for a CPU, a ``GpuSpec`` for a GPU."""
    if name == "host":
        from aotune.hwspecs.host import detect_host

        return detect_host()
    if name.endswith(".toml") or "/" in name:
        return load_spec_file(name)
    path = SPEC_DIR / f"{name}.toml"
    if not path.exists():
        raise HwSpecError(
            f"unknown target {name!r}; known: host, {', '.join(builtin_names())} "
            "(or pass a path to a .toml spec)"
        )
    return load_spec_file(path)
