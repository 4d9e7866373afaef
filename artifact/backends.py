"""What a build makes for each kind of target: the library backends, keyed by ``HwSpec.kind``.

The build pipeline (``build.py``) never branches on the kind; it calls the backend's three steps:

    preflight(hw, cc, objects_only) -> state
        before any search: the tools the library needs (a missing C compiler fails the build
        here, in a second, not after an hour of tuning)
    emit(chosen, hw, out_dir, state, cache) -> Emitted
        write every file of the library (``cache``: the database, which keeps compiled objects
        so a build from stored records only links); return the manifest entries (one per
        kernel), the library-wide manifest fields and notes for the report
    check(out_dir, chosen) -> ({name: Check}, note)
        each kernel of the written library against numpy, where this machine can (the note says
        how, or why not)

A manifest entry always holds ``name``, ``kind``, ``params`` (name, role in0/in1/bias/out, tensor,
shape, dtype, in the function's order) and ``launch`` (what a launcher needs). The CPU backend
adds ``object``; a GPU backend adds, per kernel, ``ptx`` and ``cubin`` (file names under the
output directory), ``entry`` (the kernel's symbol in them) and a ``launch`` of ``grid``, ``block``
and ``shared_bytes`` (plus any workspace it needs), and registers itself with
an entry in ``BACKENDS`` (``artifact/gpu.py``). ``aotune.load`` reads the same manifest.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from aotune.analysis.elf import x86_code_sections
from aotune.analysis.x86_features import cpu_features_needed
from aotune.artifact.cpu import compile_library_kernel, compile_runtime, params_of
from aotune.artifact.header import header_text
from aotune.artifact.inputs import KernelRequest
from aotune.artifact.link import LINK_LIBS, Linker, find_linker, link
from aotune.artifact.load import elf_symbol_bytes
from aotune.artifact.names import DEFAULT_PREFIX, Names
from aotune.codegen.runner import apply_activation, conv2d_reference, tolerance
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import BuildError
from aotune.hwspecs.host import detect_host
from aotune.hwspecs.spec import HwSpec
from aotune.search.database import (
    CandidateRecord,
    TuneRecord,
    TuningDatabase,
    model_version,
    source_hash,
    spec_hash,
)
from aotune.targets import target_for

LIBRARY = Names().library  # lib<LIBRARY>.so / .a, <LIBRARY>.h, where no --prefix is given


@dataclass(frozen=True)
class Chosen:
    """A kernel of the library: what it computes and the candidate it is built from."""

    request: KernelRequest
    record: TuneRecord
    candidate: CandidateRecord

    def entry_base(self, hw: HwSpec) -> dict[str, Any]:
        """The manifest fields every backend writes for this kernel."""
        w = self.request.workload
        c = self.candidate
        return {
            "name": self.request.name,
            "kind": hw.kind,
            "workload": {
                "op": w.op,
                "shape": w.shape_dict,
                "dtype": w.dtype,
                "flops": w.flops,
                "describe": w.describe(),
            },
            "source": self.request.source,
            "nodes": list(self.request.nodes),
            "target": {"name": hw.name, "triple": target_for(hw).describe()["triple"]},
            "config": c.config,
            "record": self.record.id,
            "predicted_seconds": c.predicted_seconds,
            "measured_seconds": c.measured_seconds,
        }


@dataclass(frozen=True)
class Emitted:
    """What a backend wrote: manifest entries, library-wide manifest fields, report notes."""

    entries: list[dict[str, Any]]
    files: list[Path]
    fields: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Check:
    """A written kernel called on random inputs and compared with numpy (float64)."""

    ok: bool
    max_abs_error: float
    tolerance: float


class Backend(Protocol):
    """The three steps of a target kind (see the module docstring)."""

    def preflight(self, hw: HwSpec, cc: str | None, objects_only: bool) -> Any:
        """Check the tools the build needs before any tuning; the state ``emit`` uses."""
        ...

    def emit(
        self,
        chosen: list[Chosen],
        hw: HwSpec,
        out_dir: Path,
        state: Any,
        cache: TuningDatabase | None = None,
        names: Names = Names(),
    ) -> Emitted:
        """Write the library's files for the chosen kernels into ``out_dir``, its global names
        from ``names``."""
        ...

    def check(self, out_dir: Path, chosen: list[Chosen]) -> tuple[dict[str, Check], str | None]:
        """Run the written kernels against numpy: per kernel a Check, or why none ran."""
        ...


def numpy_reference(w: Any, inputs: list[np.ndarray]) -> np.ndarray:
    """What a workload computes, in float64, from its inputs in the library's order."""
    x, y = (a.astype(np.float64) for a in inputs[:2])
    ref = conv2d_reference(x, y, w.conv) if w.conv else np.einsum(w.einsum_spec(), x, y)
    if w.epilogue.bias:
        ref = ref + inputs[2].astype(np.float64)
    return apply_activation(ref, w.epilogue.activation)


def _prefixed(names: Names) -> tuple[str, ...]:
    """A cache key's part for a library's prefix: none for the default, so that objects cached
    before --prefix existed are still found."""
    return () if names.prefix == DEFAULT_PREFIX else (f"prefix={names.prefix}",)


def _object_key(ch: Chosen, hw: HwSpec, names: Names) -> str:
    """Everything a kernel's object is made from: its name, workload, config, the target and
    the code generators' sources."""
    return "|".join(
        (
            "cpu-kernel",
            ch.request.name,
            ch.record.workload_key,
            ",".join(f"{k}={v}" for k, v in sorted(ch.candidate.config.items())),
            spec_hash(hw),
            hw.isa.triple,
            hw.isa.llvm_cpu,
            hw.isa.llvm_features,
            model_version(),
            source_hash("artifact/cpu.py", "artifact/runtime.py"),
            *_prefixed(names),
        )
    )


def _cached_kernel_is_whole(cached: tuple[bytes, dict[str, Any]], ch: Chosen) -> bool:
    """Whether a kernel's stored object and metadata are what ``emit`` wrote: an object whose
    function the symbol table finds with all its bytes (a cut-short file fails), the workload's
    parameters, a config of names and values and a launch record. A stored entry is a file a
    user can damage, and a header or library made from it must not be."""
    data, meta = cached
    config, launch = meta.get("config"), meta.get("launch")
    return (
        elf_symbol_bytes(data, ch.request.name) is not None
        and meta.get("params") == [p.as_dict() for p in params_of(ch.request.workload)]
        and isinstance(config, dict)
        and all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in config.values())
        and isinstance(launch, dict)
    )


def _runtime_key(hw: HwSpec, names: Names) -> str:
    return "|".join(
        (
            "cpu-runtime",
            hw.isa.triple,
            hw.isa.llvm_cpu,
            hw.isa.llvm_features,
            source_hash("artifact/runtime.py", "artifact/cpu.py", "codegen/compile.py"),
            *_prefixed(names),
        )
    )


class CpuBackend:
    """Objects, a header, ``lib*.so`` and ``lib*.a`` for a CPU target."""

    def preflight(self, hw: HwSpec, cc: str | None, objects_only: bool) -> Linker | None:
        """The linker for ``hw``; a native build without a C compiler is an error (unless
        ``objects_only``), a cross build without cross tools makes objects and the header."""
        if objects_only:
            if cc is not None:
                raise BuildError(
                    f"--cc {cc} names the compiler that links the shared object, and "
                    "--objects-only links nothing; leave out one of them"
                )
            return None
        linker = find_linker(hw.isa.arch, detect_host().isa.arch, cc)
        if linker.native and not linker.cc:
            raise BuildError(
                "no C compiler found (cc, gcc or clang) to link the shared object; install one "
                "(apt-get install gcc), name one with --cc, or pass --objects-only"
            )
        return linker

    def emit(
        self,
        chosen: list[Chosen],
        hw: HwSpec,
        out_dir: Path,
        state: Linker | None,
        cache: TuningDatabase | None = None,
        names: Names = Names(),
    ) -> Emitted:
        """Compile every kernel's object and the runtime (or take them from ``cache``, where an
        earlier build compiled the same ones), write the header, link."""
        objects_dir = out_dir / "objects"
        objects_dir.mkdir(parents=True, exist_ok=True)
        entries, objects = [], []
        spaces: dict[str, Any] = {}
        for ch in chosen:
            path = objects_dir / f"{ch.request.name}.o"
            key = _object_key(ch, hw, names)
            cached = cache.get_object(key) if cache is not None else None
            if cached is not None and not _cached_kernel_is_whole(cached, ch):
                cached = None  # a damaged entry: compiled again and replaced
            if cached is None:
                w = ch.request.workload
                if ch.record.workload_key not in spaces:
                    spaces[ch.record.workload_key] = build_cpu_space(w, hw)
                space = spaces[ch.record.workload_key]
                sched = schedule_from_config(space, space.config(ch.candidate.config))
                obj = compile_library_kernel(ch.request.name, w, sched, hw, names)
                values = ch.candidate.config
                meta = {
                    # in the space's order (the database keeps configs sorted by name)
                    "config": {
                        n: (space.var(n).label(values[n]) if space.var(n).labels else values[n])
                        for n in space.names
                    },
                    "params": [p.as_dict() for p in obj.params],
                    "launch": obj.launch,
                }
                cached = (obj.object_code, meta)
                if cache is not None:
                    cache.put_object(key, *cached)
            data, meta = cached
            path.write_bytes(data)
            objects.append(path)
            entry = ch.entry_base(hw)
            entry.update(
                config=meta["config"],
                symbol=ch.request.name,
                object=str(path.relative_to(out_dir)),
                params=meta["params"],
                launch=meta["launch"],
            )
            entries.append(entry)
        rt = out_dir / names.runtime_object
        rt_key = _runtime_key(hw, names)
        rt_cached = cache.get_object(rt_key) if cache is not None else None
        if rt_cached is not None and elf_symbol_bytes(rt_cached[0], names.api("strerror")) is None:
            rt_cached = None  # cut short or damaged: compiled again and replaced
        if rt_cached is None:
            rt_cached = (compile_runtime(hw, names), {})
            if cache is not None:
                cache.put_object(rt_key, *rt_cached)
        rt.write_bytes(rt_cached[0])
        objects.append(rt)
        target = {"name": hw.name, "triple": hw.isa.triple}
        header = out_dir / f"{names.library}.h"
        header.write_text(header_text(entries, target, names, linked=state is not None))
        files = [*objects, header]
        notes: list[str] = []
        linked: list[Path] = []
        if state is None:
            notes.append("--objects-only: wrote the objects and the header; no library linked")
        else:
            note = state.note(hw.isa.arch)
            if note:
                notes.append(note)
            linked = link(state, objects, out_dir, names.library)
        files += linked
        so = next((p.name for p in linked if p.suffix == ".so"), None)
        ar = next((p.name for p in linked if p.suffix == ".a"), None)
        fields = {
            "target": {
                "arch": hw.isa.arch,
                "cpu": hw.isa.llvm_cpu,
                "cpu_features": library_cpu_features(objects, hw),
            },
            "header": header.name,
            "shared_object": so,
            "archive": ar,
            "runtime_object": str(rt.relative_to(out_dir)),
            "link_flags": " ".join(LINK_LIBS),
            "prefix": names.prefix,
        }
        return Emitted(entries, files, fields, notes)

    def check(self, out_dir: Path, chosen: list[Chosen]) -> tuple[dict[str, Check], str | None]:
        """The written shared object's kernels against numpy, where this host runs them."""
        manifest = json.loads((out_dir / "manifest.json").read_text())
        target = manifest["target"]
        host = detect_host()
        if target["arch"] != host.isa.arch:
            return {}, f"not run: the library is {target['arch']}, this host is {host.isa.arch}"
        ok, why = host_can_run_features(target.get("cpu_features", []))
        if not ok:
            return {}, f"not run: {why}"
        if not manifest.get("shared_object"):
            return {}, "not run: no shared object to load"
        return check_library(out_dir, chosen), None


def library_cpu_features(objects: list[Path], hw: HwSpec) -> list[str]:
    """The CPU features a library of ``objects`` needs: on x86-64 what its code uses (with the
    spec's features the code cannot show, and what its llvm_cpu implies where the code shows
    it), so a ``host`` build loads on any CPU with those; elsewhere the spec's features."""
    listed = [f[1:] for f in hw.isa.llvm_features.split(",") if f.startswith("+")]
    if hw.isa.arch != "x86_64":
        return sorted(set(listed))
    code = [chunk for path in objects for chunk in x86_code_sections(path.read_bytes())]
    return cpu_features_needed(listed, code)


def host_can_run_features(features: list[str]) -> tuple[bool, str]:
    """Whether this host has every CPU feature in ``features``."""
    host = detect_host()
    have = {f[1:] for f in host.isa.llvm_features.split(",") if f.startswith("+")}
    lacking = [f for f in features if f not in have]
    return (not lacking, f"this CPU lacks {', '.join(lacking[:4])}" if lacking else "")


def check_library(out_dir: Path, chosen: list[Chosen]) -> dict[str, Check]:
    """Each kernel of the written library, loaded with ``aotune.load``, against numpy on random
    inputs, the output poisoned (NaN) first so a skipped element cannot pass."""
    from aotune.artifact.load import load

    lib = load(out_dir)
    rng = np.random.default_rng(0)
    out: dict[str, Check] = {}
    try:
        for ch in chosen:
            k = lib.kernels[ch.request.name]
            w = ch.request.workload
            inputs = [rng.uniform(-1, 1, tuple(p["shape"])).astype(np.float32) for p in k.inputs]
            result = np.full(tuple(k.output["shape"]), np.nan, dtype=np.float32)
            k(*inputs, out=result)
            ref = numpy_reference(w, inputs)
            red = math.prod(lp.extent for lp in w.loops if lp.kind == "reduction")
            tol = tolerance(inputs[0], inputs[1], red, ref if w.epilogue.active else None)
            err = float(np.abs(result - ref).max(initial=0.0))
            out[ch.request.name] = Check(bool(np.isfinite(result).all() and err <= tol), err, tol)
    finally:
        lib.shutdown()  # its worker threads (or GPU context) are not needed after the check
    return out


# a target kind -> "module:class" of its library backend (imported on use)
BACKENDS: dict[str, str] = {
    "cpu": "aotune.artifact.backends:CpuBackend",
    "gpu": "aotune.artifact.gpu:GpuBackend",
}


def backend_for(hw: Any) -> Backend:
    """The library backend of ``hw``'s kind."""
    import importlib

    where = BACKENDS.get(hw.kind)
    if where is None:
        raise BuildError(
            f"target {hw.name} is a {hw.kind} target, and this aotune has no {hw.kind} library "
            f"backend yet; build for a CPU target ({', '.join(BACKENDS)} kinds are supported)"
        )
    module, name = where.split(":")
    return getattr(importlib.import_module(module), name)()
