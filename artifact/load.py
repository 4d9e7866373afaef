"""``aotune.load(path)``: a built library as Python callables over numpy arrays (ctypes).

    lib = aotune.load("build/")                 # the directory (or its manifest.json)
    out = lib.bert_ffn1(a, b, bias)             # a new 64-byte-aligned output
    lib.bert_ffn1(a, b, bias, out=c)            # into c
    lib.set_num_threads(1); lib.shutdown()

Arguments are checked before the call: numpy arrays of dtype float32, C-contiguous, exactly the
manifest's shapes, a writeable output; anything else raises a LibraryError that says which
argument and what it must be (no silent conversion: a copy would hide a slow path). The manifest
is checked before anything is loaded, and the shared object (a GPU library's cubins) against the
SHA-256 its build recorded: a changed file would be called with shapes it was not built for.
Each kernel the manifest lists must be a function the shared object defines (not one of libc's,
which the dynamic loader would find too), and an x86 library's code is read for instructions
this CPU lacks, whatever the manifest lists. Only regular files are read (a FIFO would block).
A Library or a kernel pickles as its absolute directory and its files' hashes (loaded again on
the other side, and refused there if the library was built again in between). What a load
describes (``lib.manifest``, ``kernel.inputs``, ``kernel.output``) is read-only: the checks
trust it. Loads of the same shared object in one process share one copy of it, its worker
threads and its thread count.
The call runs in the library's native code with the GIL released. A GPU library's kernels are
launched through cuda-python where a GPU of its kind is present (inputs copied in, the output
copied back); elsewhere loading it raises a LibraryError that says why it cannot run here.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from aotune.analysis.elf import elf_sections, x86_code_sections
from aotune.analysis.x86_features import VECTOR_FEATURES, x86_features_in_code
from aotune.artifact.names import API, DEFAULT_PREFIX, PREFIX_PATTERN, Names, unknown_error_text
from aotune.errors import AotuneError, LibraryError
from aotune.files import read_user_file

# the symbols, beside each kernel, of what it was built for: its parameters' roles and shapes in
# a CPU library's shared object (a dot keeps the name apart from every kernel name, a C
# identifier), and with them the argument order and launch in a GPU library's cubin (PTX names
# take no dot; aotune_* kernel names are reserved)
INTERFACE_SYMBOL = "aotune.interface.{name}"
GPU_INTERFACE_SYMBOL = "aotune_interface_{name}"
ROLE_CODES = {"in0": 0, "in1": 1, "out": 2, "bias": 3}
MAX_RECORD_WORDS = 4096  # far beyond any record aotune writes
# what aotune.load reads at most: a manifest (about 2 KB a kernel) and a library's file (a shared
# object or a cubin; the kernels' buffers take no room in it); a FIFO or /dev/zero never ends
MANIFEST_LIMIT = 64 << 20
LIBRARY_FILE_LIMIT = 1 << 30


def interface_words(params: list[tuple[str, Any]]) -> list[int]:
    """The recorded form of a kernel's parameters, (role, shape) in the function's order: their
    count, then each one's role code, rank and sizes."""
    words = [len(params)]
    for role, shape in params:
        words += [ROLE_CODES.get(role, -1), len(shape), *shape]
    return words


def gpu_record_words(
    params: list[tuple[str, Any]],
    kernel_args: list[str],
    grid: list[int] | tuple[int, ...],
    block: list[int] | tuple[int, ...],
    dynamic_shared_bytes: int,
) -> list[int]:
    """The recorded form of what a GPU kernel was built for: ``interface_words``, then its
    arguments' roles in order, then grid, block and dynamic shared bytes."""
    roles = [ROLE_CODES.get(r, -1) for r in kernel_args]
    return [*interface_words(params), len(roles), *roles, *grid, *block, dynamic_shared_bytes]


def _manifest_params(entry: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(p["role"], p["shape"]) for p in entry["params"]]


def _elf_symbols(data: bytes) -> Iterator[tuple[bytes, int, int, int, list[tuple[int, ...]]]]:
    """(name, section index, value, size, the file's sections) of each entry of an ELF64
    little-endian file's symbol table and dynamic one (the first of each); nothing where it is
    not such a file. Every table's offsets are checked against the file."""
    import struct

    sections = elf_sections(data)
    if not sections:
        return
    shnum = len(sections)

    def inside(offset: int, size: int) -> bool:
        return 0 <= offset and 0 <= size and offset + size <= len(data)

    for kind in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM: the first of each
        table = next((sec for sec in sections if sec[1] == kind), None)
        if table is None or not inside(table[4], table[5]) or not 0 < table[6] < shnum:
            continue
        strtab = sections[table[6]]
        if not inside(strtab[4], strtab[5]):
            continue
        names = data[strtab[4] : strtab[4] + strtab[5]]
        for off in range(table[4], table[4] + table[5] - 23, 24):
            st_name, _, _, shndx, value, size = struct.unpack_from("<IBBHQQ", data, off)
            end = names.find(b"\0", st_name)
            if end >= 0:
                yield names[st_name:end], shndx, value, size, sections


def elf_symbol_bytes(data: bytes, name: str) -> bytes | None:
    """The bytes an ELF64 little-endian file (a shared object, an object, a cubin) holds for
    symbol ``name`` (its symbol table or dynamic one); None where it has no such symbol in a
    section with file contents, or is not such a file. Every offset is checked against the file."""
    import struct

    want = name.encode()
    try:
        for found, shndx, value, size, sections in _elf_symbols(data):
            if found != want:
                continue
            if not 0 < shndx < len(sections) or sections[shndx][1] == 8:  # SHT_NOBITS: no bytes
                return None
            _, _, _, addr, sec_offset, sec_size, _, _, _, _ = sections[shndx]
            where = value - addr  # a shared object's values are addresses
            start = sec_offset + where
            if not (0 <= where and where + size <= sec_size and 0 <= start <= len(data) - size):
                return None
            return data[start : start + size]
    except (struct.error, ValueError, IndexError, OverflowError):
        return None
    return None


def elf_symbol_names(data: bytes, prefix: str) -> set[str]:
    """The names of an ELF file's symbols that begin with ``prefix`` (none where it is not such a
    file)."""
    import struct

    want = prefix.encode()
    try:
        return {n.decode("utf-8", "replace") for n, *_ in _elf_symbols(data) if n.startswith(want)}
    except (struct.error, ValueError, IndexError, OverflowError):
        return set()


def recorded_words(data: bytes, symbol: str) -> list[int] | None:
    """The 64-bit words ``symbol`` holds in the ELF file ``data`` (``elf_symbol_bytes``), or None
    for a file built before aotune recorded them."""
    raw = elf_symbol_bytes(data, symbol)
    if raw is None:
        return None
    return np.frombuffer(raw[: min(len(raw), 8 * MAX_RECORD_WORDS) // 8 * 8], dtype="<i8").tolist()


def _words_text(words: list[int]) -> str:
    """A record's parameters as text (``in0 24x16, ...``); its raw words where it is not one."""
    names = {code: role for role, code in ROLE_CODES.items()}
    try:
        parts, at = [], 1
        for _ in range(words[0]):
            role, rank = names[words[at]], words[at + 1]
            parts.append(f"{role} {'x'.join(map(str, words[at + 2 : at + 2 + rank]))}")
            at += 2 + rank
        rest = words[at:]
        return ", ".join(parts) + (f" (then {rest})" if rest else "")
    except (IndexError, KeyError, TypeError):
        return str(words[:24])


def _aligned_empty(shape: tuple[int, ...], align: int = 64) -> np.ndarray:
    n = math.prod(shape)
    raw = np.empty(n + align // 4, dtype=np.float32)
    offset = (-raw.ctypes.data % align) // 4
    return raw[offset : offset + n].reshape(shape)


# the private copies loaded in this process, by their bytes' SHA-256 (ctypes never unloads one)
_COPIES: dict[str, ctypes.CDLL] = {}
_COPIES_LOCK = threading.Lock()


def _dlopen_fresh(path: Path, data: bytes) -> ctypes.CDLL:
    """The shared object at ``path`` (whose bytes ``data`` are) loaded as a library of its own,
    even where this process loaded a library of that name before (the dynamic loader would hand
    back the old one, and a rebuilt library would keep the old kernels): a private copy is
    loaded and its name removed at once. Loads of the same bytes share one copy, so a process
    that loads (or unpickles) a library again and again maps it once."""
    key = hashlib.sha256(data).hexdigest()
    with _COPIES_LOCK:
        if key not in _COPIES:
            _COPIES[key] = _dlopen_copy(path, data)
        return _COPIES[key]


def _dlopen_copy(path: Path, data: bytes) -> ctypes.CDLL:
    import tempfile

    folder = tempfile.gettempdir()
    try:
        fd, tmp = tempfile.mkstemp(prefix="aotune-", suffix=".so")
    except OSError as e:
        raise LibraryError(
            f"cannot load {path}: no private copy can be made in the temporary folder {folder} "
            f"({e.strerror}); set TMPDIR to a folder you can write"
        ) from None
    try:
        try:
            with os.fdopen(fd, "wb") as dst:
                dst.write(data)
        except OSError as e:
            raise LibraryError(
                f"cannot load {path}: its private copy could not be written to the temporary "
                f"folder {folder} ({e.strerror}); set TMPDIR to a folder with room"
            ) from None
        try:
            return ctypes.CDLL(tmp, mode=ctypes.RTLD_LOCAL)
        except OSError as e:
            if _mounted_noexec(folder):
                raise LibraryError(
                    f"cannot load {path}: the temporary folder {folder} is mounted noexec, so "
                    "the private copy loaded from there cannot run; set TMPDIR to a folder on "
                    "a file system that allows it"
                ) from None
            why = str(e).replace(f"{tmp}: ", "")  # the private copy's name means nothing to a user
            raise LibraryError(
                f"cannot load {path}: the dynamic loader refuses it ({why}); rebuild the library"
            ) from None
    finally:
        os.unlink(tmp)  # the mapping stays until the process ends


def _mounted_noexec(folder: str) -> bool:
    """Whether ``folder`` is on a file system mounted noexec (False where it cannot be told)."""
    try:
        return bool(os.statvfs(folder).f_flag & getattr(os, "ST_NOEXEC", 0))
    except OSError:
        return False


# a kernel's name: a C identifier of at most 200 characters (artifact/inputs.py's limit)
_C_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
# the manifest format this aotune reads (``artifact/build.py`` writes it)
READ_FORMAT = 1
# names of the Library object's own attributes: a kernel by one of these names would be hidden
LIBRARY_ATTRIBUTES = (
    "directory",
    "kernels",
    "manifest",
    "num_threads",
    "set_num_threads",
    "shutdown",
    "strerror",
    "target",
)


def _manifest_problem(m: Any) -> str | None:
    """What makes ``m`` (parsed manifest.json) not a manifest this aotune can load, or None."""
    if not isinstance(m, dict):
        return "it is not a JSON object"
    fmt = m.get("aotune", {}).get("format") if isinstance(m.get("aotune"), dict) else None
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        return "aotune.format is missing"
    if fmt > READ_FORMAT:
        return f"format {fmt} is newer than this aotune reads ({READ_FORMAT}); upgrade aotune"
    target = m.get("target")
    if not isinstance(target, dict) or not all(
        isinstance(target.get(k), str) for k in ("name", "kind")
    ):
        return "target must be an object with a name and a kind"
    if target["kind"] == "cpu" and not (
        isinstance(target.get("arch"), str)
        and isinstance(target.get("cpu_features", []), list)
        and all(isinstance(f, str) for f in target.get("cpu_features", []))
    ):
        return "a CPU target needs arch (text) and cpu_features (a list of names)"
    files = m.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return "files (each file's SHA-256) is missing"
    prefix = m.get("prefix", DEFAULT_PREFIX)  # (a library built before --prefix: aotune's)
    if not isinstance(prefix, str) or not PREFIX_PATTERN.fullmatch(prefix):
        return "prefix must be the library's symbol prefix (lower-case letters, digits and _)"
    kernels = m.get("kernels")
    if not isinstance(kernels, list):
        return "kernels must be a list"
    if not kernels:  # a build writes one kernel at least
        return "it lists no kernels (a build lists every kernel it writes)"
    names: set[str] = set()
    for i, e in enumerate(kernels, 1):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            return f"kernel {i} has no name"
        if not _C_NAME.fullmatch(e["name"]):
            return f"kernel {i}'s name {e['name'][:60]!r} is not a C identifier of 200 at most"
        if e["name"] in names:
            return f"kernel {e['name']!r} is listed twice"
        if (
            e["name"] in LIBRARY_ATTRIBUTES
            or e["name"].startswith("__")
            or e["name"].lower().startswith("aotune_")  # the runtime's own functions
            or e["name"].lower().startswith(f"{prefix}_")  # those of a --prefix library
        ):
            return f"kernel name {e['name']!r} is not one aotune build writes"
        names.add(e["name"])
        params = e.get("params")
        if not isinstance(params, list) or not all(
            isinstance(p, dict)
            and isinstance(p.get("name"), str)
            and p.get("role") in ROLE_CODES
            and p.get("dtype") == "float32"
            and isinstance(p.get("shape"), list)
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in p["shape"])
            for p in params
        ):
            return f"kernel {e['name']!r}: params must name, role, float32 dtype and shape each"
        if [p["role"] for p in params].count("out") != 1:
            return f"kernel {e['name']!r} needs exactly one output parameter"
        if target["kind"] == "gpu" and not _gpu_entry_ok(e):
            return (
                f"kernel {e['name']!r}: a GPU kernel needs entry and cubin (text), kernel_args "
                "(roles) and launch (grid and block of 3 counts, dynamic_shared_bytes)"
            )
    for e in kernels:
        named = [k for k in _KERNEL_FILE_KEYS if k in e and not isinstance(e[k], str)]
        if named:
            return f"kernel {e['name']!r}: {named[0]} must name a file of the library (text)"
    # a kernel's own files the build hashed, of a kernel no longer listed: an entry was removed
    listed = {e[k] for e in kernels for k in _KERNEL_FILE_KEYS if k in e}
    unlisted = [
        name
        for name in files
        if name.startswith(_KERNEL_FILE_DIRS)
        and name != Names(prefix).runtime_object
        and name not in listed
    ]
    if unlisted:
        return (
            f"it hashes {unlisted[0]!r}, a kernel's file, and no kernel entry names it (the "
            "manifest was changed after the build)"
        )
    return None


# the manifest entry's keys that name a kernel's own files, and the folders the build puts them in
_KERNEL_FILE_KEYS = ("object", "cubin", "ptx")
_KERNEL_FILE_DIRS = ("objects/", "cubin/", "ptx/")


def _gpu_entry_ok(e: dict[str, Any]) -> bool:
    """Whether a GPU manifest entry has the fields its launch reads, of their types."""

    def counts(x: Any, n: int) -> bool:
        return isinstance(x, list) and len(x) == n and all(_is_count(v) for v in x)

    launch = e.get("launch")
    return (
        all(isinstance(e.get(k), str) for k in ("entry", "cubin"))
        and isinstance(e.get("kernel_args"), list)
        and all(isinstance(r, str) and r in ROLE_CODES for r in e["kernel_args"])
        and isinstance(launch, dict)
        and counts(launch.get("grid"), 3)
        and counts(launch.get("block"), 3)
        and _is_count(launch.get("dynamic_shared_bytes"), zero=True)
    )


def _is_count(x: Any, zero: bool = False) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and (x >= 0 if zero else x > 0)


def _file_of(directory: Path, manifest: dict[str, Any], name: Any, what: str) -> tuple[Path, bytes]:
    """``name`` (a file the manifest lists) under ``directory`` and its bytes, as the build wrote
    it: inside the directory, and with the SHA-256 the manifest recorded (a truncated or replaced
    file is refused here rather than loaded: its kernels would read and write the wrong bytes)."""
    if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
        raise LibraryError(f"{directory}: the manifest's {what} {name!r} is not a file of it")
    path = directory / name
    want = manifest["files"].get(name)
    try:  # a regular file of bounded size: a FIFO would block for ever, /dev/zero never end
        data = read_user_file(path, f"the library's {what}", LibraryError, LIBRARY_FILE_LIMIT)
    except LibraryError as e:
        raise LibraryError(f"{e}; rebuild the library") from None
    if hashlib.sha256(data).hexdigest() != want:
        raise LibraryError(
            f"{path} is not the file the build wrote (its SHA-256 differs from the manifest's): "
            "it was changed or replaced since; rebuild the library with 'aotune build'"
        )
    return path, data


def _out_fix(shape: tuple[int, ...]) -> str:
    """The fix for an output array the kernel cannot write: a copy made of it would take the
    results, not the caller's array."""
    return (
        f"pass np.empty({shape}, np.float32) and copy it into yours, or leave out out= and use "
        "the array returned"
    )


class LibraryKernel:
    """One kernel of a loaded library, callable as ``kernel(in0, in1, [bias], out=None)``."""

    def __init__(self, lib: Library, entry: dict[str, Any], fn: Any) -> None:
        self.library, self.entry, self._fn = lib, entry, fn
        self.name = entry["name"]
        self.inputs = tuple(p for p in entry["params"] if p["role"] != "out")
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
        if np.ma.is_masked(x):  # the kernel reads every element, masked or not
            raise LibraryError(
                f"{what} is a masked array, whose mask the kernel cannot honour; pass "
                "x.filled(0) (masked elements as zeros) or np.asarray(x) (their stored values)"
            )
        if x.dtype != np.float32:
            fix = _out_fix(shape) if writable else "use x.astype(np.float32)"
            raise LibraryError(f"{what} has dtype {x.dtype}; the kernel takes float32 ({fix})")
        if x.shape != shape:
            raise LibraryError(f"{what} has shape {x.shape}; the kernel was built for {shape}")
        if not x.flags.c_contiguous:
            fix = _out_fix(shape) if writable else "pass np.ascontiguousarray(x)"
            does = "writes" if writable else "reads"
            raise LibraryError(
                f"{what} is not C-contiguous; {fix} (the kernel {does} row-major arrays)"
            )
        if writable and not x.flags.writeable:
            raise LibraryError(f"{what} is read-only; pass a writeable output array")
        return x.ctypes.data

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to another process, by copy) as its library's kernel of its name: the
        library is loaded again there from its directory (a ctypes function cannot travel)."""
        return getattr, (self.library, self.name)

    def __call__(
        self, *inputs: np.ndarray, out: np.ndarray | None = None, **unknown: Any
    ) -> np.ndarray:
        """Run the kernel; returns ``out`` (a new aligned array when not given)."""
        if unknown:
            names = ", ".join(p["name"] for p in self.inputs)
            raise LibraryError(
                f"{self.name} takes its input arrays ({names}) by position and out=, not "
                f"{', '.join(f'{k}=' for k in unknown)}"
            )
        if len(inputs) != len(self.inputs):
            names = ", ".join(p["name"] for p in self.inputs)
            extra = len(inputs) == len(self.inputs) + 1 and out is None
            raise LibraryError(
                f"{self.name} takes {len(self.inputs)} input arrays ({names}) and out=, "
                f"got {len(inputs)}" + ("; pass the output as out=" if extra else "")
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
        if not isinstance(path, (str, os.PathLike)):
            raise LibraryError(
                f"aotune.load takes the directory 'aotune build -o DIR' wrote, got "
                f"{type(path).__name__}"
            )
        p = Path(path)
        try:
            manifest = p if p.is_file() else p / "manifest.json"
            found = manifest.exists()
        except (OSError, ValueError) as e:  # a name too long for the file system, a NUL byte
            why = e.strerror if isinstance(e, OSError) else str(e)
            raise LibraryError(
                f"cannot look at {str(p)[:80]!r} ({why}); give the directory 'aotune build -o "
                "DIR' wrote"
            ) from None
        if not str(path):
            raise LibraryError(
                "aotune.load was given an empty path; give the directory "
                "'aotune build -o DIR' wrote"
            )
        if not found:
            what = "holds no manifest.json" if p.exists() else "does not exist"
            raise LibraryError(f"{p} {what}; give the directory 'aotune build -o DIR' wrote")
        try:  # a regular file of bounded size: a FIFO would block for ever, /dev/zero never end
            self.manifest = json.loads(
                read_user_file(manifest, "library manifest", LibraryError, MANIFEST_LIMIT)
            )
        except (OSError, ValueError) as e:
            # a file beside the manifest (the .so, the header) given instead of the directory
            beside = p.is_file() and p.name != "manifest.json"
            beside = beside and (p.parent / "manifest.json").is_file()
            hint = f"; give its directory, {str(p.parent)!r}" if beside else ""
            raise LibraryError(f"{manifest} is not an aotune manifest ({e}){hint}") from None
        except RecursionError:
            raise LibraryError(
                f"{manifest} is not an aotune manifest (JSON nested too deeply)"
            ) from None
        problem = _manifest_problem(self.manifest)
        if problem:
            raise LibraryError(
                f"{manifest} is not a manifest this aotune can load: {problem}; rebuild the "
                "library with 'aotune build'"
            )
        # read-only from here: the calls trust its shapes with raw pointers
        self.manifest = _frozen(self.manifest)
        target, entries = self.manifest["target"], self.manifest["kernels"]
        # absolute: a pickled library is loaded again from here whatever the folder of the load
        self.directory = Path(os.path.abspath(manifest.parent))
        self.target = target
        self.kernels: dict[str, LibraryKernel] = {}
        if target.get("kind") == "gpu":
            for e in entries:  # here, where no GPU is, as well: an edited manifest is refused
                _check_gpu_record(self.directory, self.manifest, e)
            self._gpu = GpuLauncher(self.directory, self.manifest)
            for e in entries:
                self.kernels[e["name"]] = LibraryKernel(self, e, self._gpu.function(e))
            return
        if target.get("kind") != "cpu":
            raise LibraryError(
                f"{self.directory} holds kernels of unknown kind {target.get('kind')}"
            )
        self._gpu = None
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
                f"{self.directory} has no shared object (built with --objects-only, or cross-built "
                "without the target's C compiler): link its objects into your program, or build "
                "it again where it can be linked to load it here"
            )
        so_path, so_bytes = _file_of(self.directory, self.manifest, so, "shared_object")
        if target["arch"] == "x86_64":  # the code itself, whatever the manifest says of it
            unknown = set(VECTOR_FEATURES) - have
            code = x86_code_sections(so_bytes) if unknown else []
            needs = x86_features_in_code(code, unknown) if code else {}
            if needs:
                insn = next(iter(needs.values()))
                raise LibraryError(
                    f"{so_path} needs CPU features this machine lacks ({', '.join(needs)}: "
                    f"'{insn}'), which its manifest does not list; calling it would end the "
                    "process (SIGILL): build it again with --target host"
                )
        for e in entries:
            if elf_symbol_bytes(so_bytes, e["name"]) is None:
                # dlsym would find a function of libc (printf, free) as well: called with the
                # kernel's arrays, it would read or free them as what they are not
                raise LibraryError(
                    f"{so_path} defines no kernel {e['name']!r}, which the manifest lists: the "
                    "manifest was changed after the build; restore it or rebuild the library"
                )
        self._dll = _dlopen_fresh(so_path, so_bytes)
        # loads of these bytes share the copy and its workers, and ctypes never unloads it: a
        # dropped library stops them (the runtime's lock lets a running call finish first), and
        # the next call through another load starts them again
        names = Names(self.manifest.get("prefix", DEFAULT_PREFIX))
        try:
            self._api = {what: getattr(self._dll, names.api(what)) for what in API}
        except AttributeError:
            raise LibraryError(
                f"{so_path} is not an aotune library (it has no {names.prefix}_* runtime)"
            ) from None
        weakref.finalize(self, self._api["shutdown"]).atexit = False  # exit ends them anyway
        self._api["strerror"].restype = ctypes.c_char_p
        self._api["strerror"].argtypes = [ctypes.c_int]
        self._api["set_num_threads"].argtypes = [ctypes.c_int]
        for e in entries:
            try:
                fn = getattr(self._dll, e["name"])
            except AttributeError:
                raise LibraryError(
                    f"{so_path} has no kernel {e['name']!r}, which the manifest lists; rebuild "
                    "the library"
                ) from None
            built = recorded_words(so_bytes, INTERFACE_SYMBOL.format(name=e["name"]))
            listed = interface_words(_manifest_params(e))
            if built is not None and built != listed:
                raise LibraryError(
                    f"{manifest} gives kernel {e['name']!r} the parameters "
                    f"{_words_text(listed)}, and {so_path.name} was built for "
                    f"{_words_text(built)}: the manifest was changed after the build; restore it "
                    "or rebuild the library"
                )
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * len(e["params"])
            self.kernels[e["name"]] = LibraryKernel(self, e, fn)
        # kernels the shared object records being built (each its interface symbol) that the
        # manifest no longer lists: entries removed with their objects' hashes
        prefix = INTERFACE_SYMBOL.format(name="")
        recorded = {n[len(prefix) :] for n in elf_symbol_names(so_bytes, prefix)}
        dropped = sorted(recorded - {e["name"] for e in entries})
        if dropped:
            raise LibraryError(
                f"{so_path} holds kernel {dropped[0]!r}, which the manifest does not list: the "
                "manifest was changed after the build; restore it or rebuild the library"
            )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (to another process, by copy) as its directory and the files' hashes: loaded
        again from there, with every check (a loaded shared object cannot travel), and refused
        where the library there is no longer the one pickled."""
        return _load_again, (str(self.directory), dict(self.manifest["files"]))

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
        if not _is_c_int(rc):
            raise LibraryError(f"strerror({rc!r}): a return code is a C int")
        if self._gpu is not None:  # GPU calls raise on failure: no return code but 0
            prefix = Names(self.manifest.get("prefix", DEFAULT_PREFIX))
            return "success" if rc == 0 else unknown_error_text(prefix)
        return self._api["strerror"](rc).decode()

    def set_num_threads(self, n: int) -> None:
        """Threads each call may use, the caller included (CPU libraries)."""
        if self._gpu is not None:
            raise LibraryError("set_num_threads applies to CPU libraries; this one runs on a GPU")
        if not _is_c_int(n):
            raise LibraryError(f"set_num_threads({n!r}): give a whole number of threads, 1 or more")
        rc = self._api["set_num_threads"](n)
        if rc != 0:
            raise LibraryError(f"set_num_threads({n}): {self.strerror(rc)}")

    @property
    def num_threads(self) -> int:
        """The current thread setting (CPU libraries; 1 for a GPU library's host side)."""
        return 1 if self._gpu is not None else int(self._api["get_num_threads"]())

    def shutdown(self) -> None:
        """Stop the library's worker threads (a later call starts them again), or release a GPU
        library's context."""
        if self._gpu is not None:
            self._gpu.close()
        else:
            self._api["shutdown"]()


def _check_gpu_record(directory: Path, manifest: dict[str, Any], entry: dict[str, Any]) -> None:
    """Refuse a GPU kernel whose manifest entry is not what its cubin records it was built for
    (a cubin built before the record: nothing to check)."""
    path, data = _file_of(directory, manifest, entry["cubin"], "cubin")
    built = recorded_words(data, GPU_INTERFACE_SYMBOL.format(name=entry["entry"]))
    if built is None:
        return
    launch = entry["launch"]
    listed = gpu_record_words(
        _manifest_params(entry),
        entry["kernel_args"],
        launch["grid"],
        launch["block"],
        launch["dynamic_shared_bytes"],
    )
    if built != listed:
        raise LibraryError(
            f"the manifest's kernel {entry['name']!r} (parameters, argument order or launch: "
            f"{_words_text(listed)}) is not what {path.name} was built for "
            f"({_words_text(built)}): the manifest was changed after the build; restore it or "
            "rebuild the library"
        )


def _is_c_int(n: Any) -> bool:
    """Whether ``n`` is an integer (not a bool) a C int holds, as the runtime's calls take."""
    return isinstance(n, (int, np.integer)) and not isinstance(n, bool) and -(2**31) <= n < 2**31


class GpuLauncher:
    """A GPU library's cubins on device 0, launched through cuda-python's driver API: each call
    copies the inputs in, launches with the manifest's grid, block and shared memory, and copies
    the output back. Made only where a GPU of the library's sm and its driver are present."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        from aotune.codegen.cuda_device import _check, _driver, device_available
        from aotune.hwspecs.spec import load_target

        self._check = _check
        self.drv = _driver()
        try:
            hw = load_target(manifest["target"]["name"])
        except AotuneError:
            hw = None
        ok, why = device_available(hw) if hw is not None and self.drv is not None else (
            False,
            "no GPU: cuda-python is not installed (pip install 'aotune[gpu]')"
            if self.drv is None
            else f"target {manifest['target']['name']} is not a known GPU spec",
        )  # fmt: skip
        if not ok:
            raise LibraryError(
                f"{directory} holds {manifest['target'].get('sm', 'GPU')} kernels for "
                f"{manifest['target']['name']}, and they cannot run here: {why}"
            )
        self.hw = hw
        self.drv, self.ctx = self._current()
        self.modules: dict[str, tuple[Any, Any]] = {}  # entry name -> (module, function)
        self.directory, self.manifest = directory, manifest

    def _current(self) -> tuple[Any, Any]:
        """(driver, context), the context made current on the calling thread."""
        from aotune.codegen.cuda_device import device_context

        return device_context(self.hw)

    def _function(self, entry: dict[str, Any]) -> Any:
        """``entry``'s kernel in this thread's context, its module loaded on first use (again
        after ``close``, as a CPU library restarts its threads)."""
        drv, check = self.drv, self._check
        self._current()  # the caller's thread may not be the one that loaded the library
        if entry["entry"] not in self.modules:
            module = check(
                drv.cuModuleLoadData(
                    _file_of(self.directory, self.manifest, entry["cubin"], "cubin")[1]
                ),
                "load cubin",
            )
            fn = check(drv.cuModuleGetFunction(module, entry["entry"].encode()), "get function")
            dynamic = entry["launch"]["dynamic_shared_bytes"]
            if dynamic:
                attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                check(drv.cuFuncSetAttribute(fn, attr, dynamic), "opt-in")
            self.modules[entry["entry"]] = (module, fn)
        return self.modules[entry["entry"]][1]

    def function(self, entry: dict[str, Any]) -> Any:
        """A callable ``fn(*pointers) -> 0`` launching ``entry`` on host arrays' addresses."""
        drv, check = self.drv, self._check
        self._function(entry)  # a cubin the driver refuses fails at load, not at the first call
        launch = entry["launch"]
        sizes = {p["role"]: 4 * math.prod(p["shape"]) for p in entry["params"]}
        roles = [p["role"] for p in entry["params"]]

        def call(*pointers: int) -> int:
            host = dict(zip(roles, pointers))
            dev = {}
            fn = self._function(entry)
            try:
                for role in entry["kernel_args"]:
                    nbytes = sizes.get(role, 4)
                    dev[role] = check(drv.cuMemAlloc(nbytes), "cuMemAlloc")
                    if role in host and role != "out":
                        check(drv.cuMemcpyHtoD(dev[role], host[role], nbytes), "copy in")
                params = np.array([int(dev[r]) for r in entry["kernel_args"]], dtype=np.uint64)
                args = np.array(
                    [params[i : i + 1].ctypes.data for i in range(len(params))], dtype=np.uint64
                )
                check(
                    drv.cuLaunchKernel(fn, *launch["grid"], *launch["block"],
                                       launch["dynamic_shared_bytes"], 0, args.ctypes.data, 0),
                    "cuLaunchKernel",
                )  # fmt: skip
                check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
                check(drv.cuMemcpyDtoH(host["out"], dev["out"], sizes["out"]), "copy out")
            finally:
                for p in dev.values():
                    drv.cuMemFree(p)
            return 0

        return call

    def close(self) -> None:
        """Unload the library's modules; the next call loads its own again. The device's primary
        context stays, as the CUDA runtime keeps it, for other users in this process."""
        self.drv.cuCtxSetCurrent(self.ctx)
        for module, _ in self.modules.values():
            self.drv.cuModuleUnload(module)
        self.modules = {}


def load(path: str | Path) -> Library:
    """Load the library ``aotune build`` wrote to ``path`` (see the module docstring)."""
    return Library(path)


def _load_again(directory: str, files: dict[str, str]) -> Library:
    """A pickled library loaded again: the one at ``directory``, if its files are still those
    the pickled one was loaded from (their SHA-256s, ``files``)."""
    lib = Library(directory)
    if dict(lib.manifest["files"]) != files:
        raise LibraryError(
            f"{directory} was built again since this library was pickled; its kernels may differ "
            "from the pickled ones: load it afresh with aotune.load"
        )
    return lib


def _frozen(value: Any) -> Any:
    """``value`` (parsed JSON) read-only: objects as mapping proxies, lists as tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value
