"""``aotune.load(path)``: a built library as Python callables over numpy arrays (ctypes).

    lib = aotune.load("build/")                 # the directory (or its manifest.json)
    out = lib.bert_ffn1(a, b, bias)             # a new 64-byte-aligned output
    lib.bert_ffn1(a, b, bias, out=c)            # into c
    lib.set_num_threads(1); lib.shutdown()

Arguments are checked before the call: numpy arrays of dtype float32, C-contiguous, exactly the
manifest's shapes, a writeable output; anything else raises a LibraryError that says which
argument and what it must be (no silent conversion: a copy would hide a slow path). The call runs
in the library's native code with the GIL released.
"""

from __future__ import annotations

import ctypes
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from aotune.errors import LibraryError


def _aligned_empty(shape: tuple[int, ...], align: int = 64) -> np.ndarray:
    n = math.prod(shape)
    raw = np.empty(n + align // 4, dtype=np.float32)
    offset = (-raw.ctypes.data % align) // 4
    return raw[offset : offset + n].reshape(shape)


def _dlopen_fresh(path: Path) -> ctypes.CDLL:
    """``path`` loaded as a library of its own, even where this process loaded a library of that
    name before (the dynamic loader would hand back the old one, and a rebuilt library would
    keep the old kernels): a private copy is loaded and its name removed at once."""
    import os
    import shutil
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix="aotune-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as dst, open(path, "rb") as src:
            shutil.copyfileobj(src, dst)
        return ctypes.CDLL(tmp, mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise LibraryError(f"cannot load {path}: {e}") from None
    finally:
        os.unlink(tmp)  # the mapping stays until the process ends


class LibraryKernel:
    """One kernel of a loaded library, callable as ``kernel(in0, in1, [bias], out=None)``."""

    def __init__(self, lib: Library, entry: dict[str, Any], fn: Any) -> None:
        self.library, self.entry, self._fn = lib, entry, fn
        self.name = entry["name"]
        self.inputs = [p for p in entry["params"] if p["role"] != "out"]
        self.output = next(p for p in entry["params"] if p["role"] == "out")
        self._out_shape = tuple(self.output["shape"])

    def __repr__(self) -> str:
        args = ", ".join(f"{p['name']}{tuple(p['shape'])}" for p in self.entry["params"])
        return f"<aotune kernel {self.name}({args})>"

    def _check(self, p: dict[str, Any], x: Any, writable: bool = False) -> int:
        what = f"{self.name}: argument {p['name']} ({p['role']})"
        shape = tuple(p["shape"])
        if not isinstance(x, np.ndarray):
            raise LibraryError(
                f"{what} must be a numpy array of float32 {shape}, got {type(x).__name__}"
            )
        if x.dtype != np.float32:
            raise LibraryError(
                f"{what} has dtype {x.dtype}; the kernel takes float32 (use x.astype(np.float32))"
            )
        if x.shape != shape:
            raise LibraryError(f"{what} has shape {x.shape}; the kernel was built for {shape}")
        if not x.flags.c_contiguous:
            raise LibraryError(
                f"{what} is not C-contiguous; pass np.ascontiguousarray(x) (the kernel reads "
                "row-major arrays)"
            )
        if writable and not x.flags.writeable:
            raise LibraryError(f"{what} is read-only; pass a writeable output array")
        return x.ctypes.data

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Run the kernel; returns ``out`` (a new aligned array when not given)."""
        if len(inputs) != len(self.inputs):
            names = ", ".join(p["name"] for p in self.inputs)
            raise LibraryError(
                f"{self.name} takes {len(self.inputs)} input arrays ({names}) and out=, "
                f"got {len(inputs)}"
            )
        ptrs = [self._check(p, x) for p, x in zip(self.inputs, inputs)]
        if out is None:
            out = _aligned_empty(self._out_shape)
        ptrs.append(self._check(self.output, out, writable=True))
        rc = self._fn(*ptrs)
        if rc != 0:
            raise LibraryError(f"{self.name} returned {rc}: {self.library.strerror(rc)}")
        return out


class Library:
    """A library ``aotune build`` wrote: its manifest and its kernels (attributes by name)."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        manifest = p if p.is_file() else p / "manifest.json"
        if not manifest.exists():
            raise LibraryError(
                f"{p} holds no manifest.json; give the directory 'aotune build -o DIR' wrote"
            )
        try:
            self.manifest = json.loads(manifest.read_text())
            target = self.manifest["target"]
            entries = self.manifest["kernels"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LibraryError(f"{manifest} is not an aotune manifest ({e})") from None
        self.directory = manifest.parent
        self.target = target
        if target.get("kind") != "cpu":
            raise LibraryError(
                f"{self.directory} holds {target.get('kind')} kernels for {target.get('name')}; "
                "aotune.load runs CPU libraries (GPU launching comes with the GPU backend)"
            )
        from aotune.hwspecs.host import detect_host

        host = detect_host()
        if target["arch"] != host.isa.arch:
            raise LibraryError(
                f"{self.directory} was built for {target['name']} ({target['arch']}); this "
                f"machine is {host.isa.arch}: load it on a {target['arch']} machine"
            )
        have = {f[1:] for f in host.isa.llvm_features.split(",") if f.startswith("+")}
        lacking = [f for f in target.get("cpu_features", []) if f not in have]
        if lacking:
            raise LibraryError(
                f"{self.directory} was built for {target['name']}, whose CPU features this "
                f"machine lacks ({', '.join(lacking[:4])}); build with --target host"
            )
        so = self.manifest.get("shared_object")
        if not so:
            raise LibraryError(
                f"{self.directory} has no shared object (the build found no C compiler); "
                "build again where gcc or clang is installed"
            )
        self._dll = _dlopen_fresh(self.directory / so)
        self._dll.aotune_strerror.restype = ctypes.c_char_p
        self._dll.aotune_strerror.argtypes = [ctypes.c_int]
        self._dll.aotune_set_num_threads.argtypes = [ctypes.c_int]
        self.kernels: dict[str, LibraryKernel] = {}
        for e in entries:
            fn = getattr(self._dll, e["name"])
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * len(e["params"])
            self.kernels[e["name"]] = LibraryKernel(self, e, fn)

    def __getattr__(self, name: str) -> LibraryKernel:
        kernels = self.__dict__.get("kernels", {})
        if name in kernels:
            return kernels[name]
        raise AttributeError(
            f"the library has no kernel {name!r}; it has {', '.join(kernels) or 'none'}"
        )

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.kernels))

    def __repr__(self) -> str:
        return f"<aotune library {self.directory} ({', '.join(self.kernels)})>"

    def strerror(self, rc: int) -> str:
        """The library's text for a return code."""
        return self._dll.aotune_strerror(rc).decode()

    def set_num_threads(self, n: int) -> None:
        """Threads each call may use, the caller included."""
        rc = self._dll.aotune_set_num_threads(int(n))
        if rc != 0:
            raise LibraryError(f"set_num_threads({n}): {self.strerror(rc)}")

    @property
    def num_threads(self) -> int:
        """The current thread setting."""
        return int(self._dll.aotune_get_num_threads())

    def shutdown(self) -> None:
        """Stop the library's worker threads (a later call starts them again)."""
        self._dll.aotune_shutdown()


def load(path: str | Path) -> Library:
    """Load the library ``aotune build`` wrote to ``path`` (see the module docstring)."""
    return Library(path)
