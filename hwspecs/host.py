"""Detect the machine aotune runs on as an :class:`HwSpec`.

Cores and cache sizes come from sysfs, the ISA from llvmlite's host CPU name and features. Issue
rates cannot be read from the OS, so they are taken from the built-in spec whose ``llvm_cpu``
matches the host, or else the closest one by vector ISA.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from aotune.errors import HwSpecError
from aotune.hwspecs.spec import REFUSED_FEATURES, HwSpec, builtin_names, load_target

SYSFS_CPU = Path("/sys/devices/system/cpu")


def _parse_size_kib(text: str) -> int:
    text = text.strip().upper()
    for suffix, mult in (("K", 1), ("M", 1024), ("G", 1024 * 1024)):
        if text.endswith(suffix):
            return int(text[:-1]) * mult
    return int(text) // 1024


def _count_cpus(cpu_list: str) -> int:
    total = 0
    for part in cpu_list.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            total += int(hi) - int(lo) + 1
        elif part:
            total += 1
    return total


def sysfs_caches(cpu_dir: Path = SYSFS_CPU / "cpu0") -> dict[int, tuple[int, int, int, int]]:
    """Data/unified caches of cpu0 from sysfs: level -> (size KiB, line bytes, ways, CPUs sharing
    it)."""
    found: dict[int, tuple[int, int, int, int]] = {}
    for index in sorted((cpu_dir / "cache").glob("index*")):
        try:
            ctype = (index / "type").read_text().strip()
            if ctype not in ("Data", "Unified"):
                continue
            level = int((index / "level").read_text())
            size = _parse_size_kib((index / "size").read_text())
            line_path = index / "coherency_line_size"
            line = int(line_path.read_text()) if line_path.exists() else 64
            ways_path = index / "ways_of_associativity"
            ways = int(ways_path.read_text()) if ways_path.exists() else 8
            shared = _count_cpus((index / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
        found[level] = (size, line, max(1, ways), shared)
    return found


CALIBRATE_HINT = "`aotune hw calibrate -o FILE.toml` measures this CPU's own"


def _base_spec_name(cpu_name: str, features: dict[str, bool], arch: str) -> tuple[str, str]:
    """The built-in spec whose core model the host takes, and why that one."""
    names = builtin_names("cpu")
    if cpu_name in names:
        return cpu_name, f"its built-in spec: LLVM names this CPU {cpu_name}"
    for name in names:  # a spec whose llvm_cpu is the host's
        if load_target(name).isa.llvm_cpu == cpu_name:
            return name, f"the built-in spec for LLVM's CPU name {cpu_name}"
    closest = None
    if arch == "aarch64":
        closest = "neoverse-n1"
    elif features.get("avx512f"):
        closest = "skylake-avx512"
    elif features.get("avx2") and features.get("fma"):
        closest = "haswell"
    if closest is None:
        raise HwSpecError(
            f"host CPU {cpu_name!r} has neither AVX2+FMA nor AVX-512; "
            "write a spec file for it and pass --target FILE.toml"
        )
    return closest, (
        f"no built-in spec for {cpu_name}: another CPU's, the closest by vector ISA "
        f"(clock, pipes, latencies are not this CPU's; {CALIBRATE_HINT})"
    )


def closest_builtin() -> str:
    """The built-in spec whose core model ``detect_host`` uses for this machine (its CPU's own
    spec, one whose ``llvm_cpu`` is the host's, or the closest by vector ISA)."""
    import llvmlite.binding as llvm

    arch = llvm.get_process_triple().split("-")[0]
    arch = {"arm64": "aarch64"}.get(arch, arch)
    features = usable_host_features(dict(llvm.get_host_cpu_features()), arch)
    name, _ = _base_spec_name(llvm.get_host_cpu_name(), features, arch)
    return name


def usable_host_features(features: dict[str, bool], arch: str) -> dict[str, bool]:
    """LLVM's host features, each on or off, with those aotune cannot use (``REFUSED_FEATURES``:
    APX, whose code capstone cannot read) turned off, so a host spec always loads."""
    off = {item[1:] for item in REFUSED_FEATURES.get(arch, {}) if item.startswith("+")}
    return {name: on and name not in off for name, on in features.items()}


@functools.lru_cache(maxsize=1)
def detect_host() -> HwSpec:
    """The host as a spec: sysfs topology and caches over the closest built-in core model."""
    import llvmlite.binding as llvm

    triple = llvm.get_process_triple()
    arch = triple.split("-")[0]
    arch = {"arm64": "aarch64"}.get(arch, arch)
    cpu_name = llvm.get_host_cpu_name()
    features = usable_host_features(dict(llvm.get_host_cpu_features()), arch)
    base_name, why = _base_spec_name(cpu_name, features, arch)
    base = load_target(base_name)
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    detected = sysfs_caches()
    caches = []
    for c in base.caches:
        if c.level in detected:
            size, line, ways, shared = detected[c.level]
            c = dataclasses.replace(
                c,
                size_kib=size,
                line_bytes=line,
                associativity=ways,
                shared_by_cores=max(1, min(shared, cores)),
            )
        caches.append(c)
    feature_str = ",".join(("+" if on else "-") + name for name, on in sorted(features.items()))
    vector_bits = base.isa.vector_bits
    if arch == "x86_64":
        vector_bits = 512 if features.get("avx512f") else 256
    isa = dataclasses.replace(
        base.isa,
        triple=triple,
        llvm_cpu=cpu_name,
        llvm_features=feature_str,
        vector_bits=vector_bits,
        vector_registers=32 if vector_bits == 512 else base.isa.vector_registers,
    )
    core = dataclasses.replace(base.core, cores=cores)
    inherited = dict(base.origin)
    origin = {
        # every value of the base spec keeps its own origin, said to be assumed for this host
        **{k: f"assumed from {base_name}: {v}" for k, v in inherited.items() if k != "core_model"},
        "isa": f"assumed from {base_name}",
        "core": f"assumed from {base_name}"
        + (f": {inherited['core']}" if "core" in inherited else ""),
        "caches": f"assumed from {base_name}",
        "memory": f"assumed from {base_name}",
        "overhead": f"assumed from {base_name}",
        "isa.triple": "LLVM's process triple",
        "isa.llvm_cpu": "LLVM's host CPU name",
        "isa.llvm_features": "LLVM's host CPU features",
        "isa.vector_bits": "LLVM's host CPU features (avx512f: 512, else 256)",
        "isa.vector_registers": "LLVM's host CPU features (32 with AVX-512)",
        "core.cores": "the OS (CPUs this process may run on)",
        "core_model": f"{base_name} ({why})",
    }
    if detected:
        sysfs = f"sysfs ({SYSFS_CPU / 'cpu0' / 'cache'})"
        for key in ("size_kib", "line_bytes", "associativity", "shared_by_cores"):
            origin[f"caches.{key}"] = sysfs
    described = base_name if base_name == cpu_name else f"{base_name}, not this CPU's own"
    return dataclasses.replace(
        base,
        name="host",
        description=f"detected host: {cpu_name}, {cores} cores, core model from {described}",
        isa=isa,
        core=core,
        caches=tuple(caches),
        origin=tuple(sorted(origin.items())),
    )


def host_can_run(spec: HwSpec) -> tuple[bool, str]:
    """Whether code built for ``spec`` runs on this machine, and if not, why."""
    host = detect_host()
    if spec.isa.arch != host.isa.arch:
        return False, f"target {spec.name} is {spec.isa.arch}, this host is {host.isa.arch}"
    host_feats = {f[1:] for f in host.isa.llvm_features.split(",") if f.startswith("+")}
    missing = [
        f[1:]
        for f in spec.isa.llvm_features.split(",")
        if f.startswith("+") and f[1:] not in host_feats
    ]
    if missing:
        return False, f"target {spec.name} needs CPU features this host lacks: {', '.join(missing)}"
    return True, ""


def other_core_warning(spec: HwSpec, timed: str) -> str | None:
    """A warning where ``spec`` models another CPU core than this host's, whose timings ``timed``
    (what was measured here) are then set against that other core's predictions; None where it
    models this one."""
    here = detect_host().isa.llvm_cpu
    if spec.kind != "cpu" or spec.isa.llvm_cpu == here:
        return None
    return (
        f"target {spec.name} models a {spec.isa.llvm_cpu} core and this one is {here}: {timed} "
        "this machine against another CPU's predictions; --target host, or a spec 'aotune hw "
        "calibrate' wrote here, predicts this one"
    )


def available_memory_bytes() -> int | None:
    """Memory this process may still allocate: the OS's MemAvailable, or less where a cgroup
    limit is closer (containers, CI runners); None when neither can be read."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    cgroup = Path("/sys/fs/cgroup")
    for limit_file, usage_file in (
        ("memory.max", "memory.current"),  # cgroup v2
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),  # cgroup v1
    ):
        try:
            limit_text = (cgroup / limit_file).read_text().strip()
            if limit_text != "max" and int(limit_text) < 1 << 60:
                found.append(int(limit_text) - int((cgroup / usage_file).read_text()))
        except (OSError, ValueError):
            continue
    return max(0, min(found)) if found else None
