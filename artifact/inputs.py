"""What ``aotune build`` builds: named workloads from a TOML list or an ONNX model.

A TOML list has one ``[[kernel]]`` table per function, with ``name``, ``op`` and the keys of
``aotune tune``'s options under their flag names::

    [[kernel]]
    name = "bert_ffn1"
    op = "dense"
    shape = "128x3072x768"
    bias = true
    activation = "gelu"

    [[kernel]]
    name = "attn_scores"
    op = "einsum"
    spec = "bij,bkj->bik"
    dims = "b=12,i=128,j=64,k=128"      # or a table: dims = { b = 12, i = 128, ... }

Every name must be a C identifier (it becomes the function's symbol), unique in the list, and not
in aotune's own namespace (``aotune_``); every op but einsum needs a ``shape`` (no default sizes:
a forgotten shape must not build a 1024^3 kernel). Workloads are checked exactly as ``tune``
checks them; an error names the file, the kernel and the fix. ONNX models go through
:mod:`.onnx_import`. Both are read through ``files.read_user_file``: regular files only, a list
up to 1 MiB, a model up to 2 GiB.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotune.analysis.workload import DEFAULT_SHAPES, OPERATORS, Workload, build_workload
from aotune.artifact.names import DEFAULT_PREFIX
from aotune.errors import AotuneError, BuildError
from aotune.files import MIB, decode_utf8, read_user_file, toml_shown

TOML_LIMIT = MIB  # a kernel list is a few lines per kernel
ONNX_LIMIT = 2 << 30  # protobuf's own limit on one message: a larger model cannot be parsed

C_KEYWORDS = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while _Bool _Complex _Imaginary _Alignas _Alignof _Atomic
    _Generic _Noreturn _Static_assert _Thread_local bool true false alignas alignof nullptr
    static_assert thread_local typeof""".split()
)
# the header declares extern "C" functions for C++ too, where these are keywords
CPP_KEYWORDS = frozenset(
    """and and_eq asm bitand bitor catch char8_t char16_t char32_t class co_await co_return
    co_yield compl concept const_cast consteval constexpr constinit decltype delete dynamic_cast
    explicit export friend mutable namespace new noexcept not not_eq operator or or_eq private
    protected public reinterpret_cast requires static_cast template this throw try typeid
    typename using virtual wchar_t xor xor_eq""".split()
)
# types and macros of the C standard headers a program includes beside the library's header
# (stddef, stdint, stdio, stdlib, errno, math, limits, stdarg, time, signal): a kernel of one of
# these names breaks the compile of such a program (size_t redeclared, NULL expanded)
C_HEADER_NAMES = frozenset(
    """size_t ptrdiff_t max_align_t wint_t FILE fpos_t div_t ldiv_t lldiv_t va_list time_t
    clock_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t
    intptr_t uintptr_t intmax_t uintmax_t ssize_t off_t float_t double_t NULL EOF BUFSIZ
    FILENAME_MAX FOPEN_MAX TMP_MAX L_tmpnam SEEK_SET SEEK_CUR SEEK_END EXIT_SUCCESS EXIT_FAILURE
    RAND_MAX MB_CUR_MAX errno stdin stdout stderr assert offsetof va_start va_arg va_end
    va_copy INFINITY NAN HUGE_VAL HUGE_VALF CHAR_BIT INT_MAX INT_MIN UINT_MAX LONG_MAX LONG_MIN
    ULONG_MAX SIZE_MAX CLOCKS_PER_SEC EDOM ERANGE EILSEQ SIGABRT SIGFPE SIGILL SIGINT SIGSEGV
    SIGTERM SIGKILL SIGHUP SIGQUIT SIGPIPE SIGALRM SIGUSR1 SIGUSR2 SIGCHLD SIGBUS
    linux unix uint ulong ushort u_char u_short u_int u_long alloca fd_set jmp_buf sigjmp_buf
    complex imaginary I isfinite isinf isnan isnormal fpclassify signbit isgreater
    isgreaterequal isless islessequal islessgreater isunordered noreturn once_flag
    ONCE_FLAG_INIT MAXFLOAT std""".split()
)  # the last lines: gcc's GNU mode (linux, unix), POSIX (uint, ...), C11 (complex, ...), C++ (std)
# the families of constants limits.h, stdint.h, float.h, math.h (M_PI), inttypes.h and pthread.h
# define (INT32_MAX, FLT_MAX, M_PI, PRId64, PTHREAD_MUTEX_INITIALIZER): upper case, a prefix, an _
C_HEADER_MACRO = re.compile(
    r"(M|FLT|DBL|LDBL|U?INT(8|16|32|64|PTR|MAX)?|U?INT_(LEAST|FAST)\d+|S?CHAR|UCHAR|U?SHRT"
    r"|U?LONG|U?LLONG|PTRDIFF|SIZE|WCHAR|WINT|SIG_ATOMIC|FP|MATH|PTHREAD|SIG)_[A-Z0-9_]+"
    r"|PRI[diouxX]\w*|SCN[diouxX]\w*|[A-Z][A-Z0-9_]*_(MAX|MIN)"
)
# POSIX reserves names ending in _t for its types (pid_t, pthread_t, mbstate_t)
POSIX_TYPE_NAME = re.compile(r"\w+_t")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# key -> (type(s) TOML may give, the build_workload keyword it feeds)
TOML_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), ""),
    "op": ((str,), ""),
    "shape": ((str, list), "shape"),
    "spec": ((str,), "spec"),
    "dims": ((str, dict), "dims"),
    "bias": ((bool,), "bias"),
    "activation": ((str,), "activation"),
    "layout": ((str,), "layout"),
    "stride": ((int,), "stride"),
    "pad": ((int,), "pad"),
    "dilation": ((int,), "dilation"),
    "groups": ((int,), "groups"),
}


@dataclass(frozen=True)
class KernelRequest:
    """One function of the library: its C name, what it computes, and where it came from."""

    name: str
    workload: Workload
    source: str  # e.g. "kernels.toml, kernel 3" or the ONNX nodes it computes
    nodes: tuple[str, ...] = ()  # ONNX: the nodes (op fused into the epilogue included)


@dataclass(frozen=True)
class SkippedOp:
    """An ONNX node aotune does not generate (the model still builds; the report lists it)."""

    node: str
    op_type: str
    reason: str


@dataclass(frozen=True)
class KernelList:
    """Everything a build makes, from one input file."""

    source: str
    kernels: tuple[KernelRequest, ...]
    skipped: tuple[SkippedOp, ...] = ()


@functools.lru_cache(maxsize=1)
def _c_libraries() -> tuple[Any, ...]:
    import ctypes

    found = []
    for soname in ("libc.so.6", "libm.so.6"):
        try:
            found.append(ctypes.CDLL(soname))
        except OSError:  # not glibc: nothing to compare against
            continue
    return tuple(found)


@functools.lru_cache(maxsize=1)
def _posix_macro_names() -> frozenset[str]:
    """The upper-case constants of the C and POSIX headers this platform has, as Python's mirrors
    of them name them (errno's EINVAL, signal's SIGTRAP, os's WNOHANG and O_RDONLY, time's
    CLOCK_MONOTONIC, locale's LC_ALL): macros a program including those headers would expand."""
    import errno
    import locale
    import os
    import signal
    import time

    names = set(errno.errorcode.values())
    for module in (os, signal, time, locale):
        names |= {n for n in dir(module) if n.isupper() and isinstance(getattr(module, n), int)}
    return frozenset(names)


def c_library_defines(name: str) -> bool:
    """Whether the C library (libc, libm) defines ``name`` (malloc, expf, sysconf, ...)."""
    return any(hasattr(lib, name) for lib in _c_libraries())


# BLAS's Fortran names (sgemm_, idamax_), and the C interfaces' prefixes (cblas_sgemm, LAPACKE_)
BLAS_SYMBOL = re.compile(
    r"(?:[sdcz](?:gemm|gemv|gbmv|symm|hemm|syrk|herk|syr2k|her2k|trmm|trsm|ger|geru|gerc|symv|"
    r"hemv|sbmv|hbmv|spmv|hpmv|trmv|trsv|tbmv|tbsv|tpmv|tpsv|syr|her|syr2|her2|spr|hpr|spr2|"
    r"hpr2|axpy|dot|dotu|dotc|scal|copy|swap|nrm2|asum|rot|rotg|rotm|rotmg)|sc(?:nrm2|asum)|"
    r"dz(?:nrm2|asum)|cs(?:scal|rot)|zd(?:scal|rot)|i[sdcz]amax|xerbla|lsame)_|"
    r"(?:cblas|lapacke?|openblas)_\w*",
    re.IGNORECASE,
)

# the runtimes a numerical program links beside a library: OpenMP (omp_, kmp_), MPI, MKL
RUNTIME_SYMBOL = re.compile(r"(?:omp|kmp|mpi|pmpi|mkl)_\w*", re.IGNORECASE)

# a kernel's files are named after it (NAME.o, NAME.ptx, NAME.cubin) and file names stop at 255
# bytes on Linux and macOS; C compilers take longer identifiers
MAX_NAME_LENGTH = 200


def reserved_name_reason(name: str) -> str | None:
    """Why the identifier ``name`` cannot name a kernel of a library (None: it can): the one list
    both a TOML kernel's name and a name made from an ONNX node are checked against."""
    from aotune.artifact.load import LIBRARY_ATTRIBUTES

    if name.startswith("_"):
        return (
            "starts with _; C reserves such names for its implementation, and the library "
            "object's own attributes start with one"
        )
    if name in C_KEYWORDS:
        return "is a C keyword"
    if name in CPP_KEYWORDS:
        return "is a C++ keyword, and the header is included from C++ too"
    if name in C_HEADER_NAMES or C_HEADER_MACRO.fullmatch(name) or name in _posix_macro_names():
        return (
            "is a type or macro of the C standard headers, which a program includes beside the "
            "library's header"
        )
    if POSIX_TYPE_NAME.fullmatch(name):
        return (
            "ends in _t, which POSIX reserves for the types of its headers (pid_t, pthread_t), "
            "which a program includes beside the library's header"
        )
    if name == "main":
        return "is the entry point of every C program the library is linked into"
    if c_library_defines(name):
        return (
            "is defined by the C library (libc or libm: a function or variable); a library "
            "exporting it would replace it in every program it is linked into"
        )
    if BLAS_SYMBOL.fullmatch(name):
        return (
            "is a symbol of BLAS or LAPACK (its Fortran or C interface); a library exporting it "
            "would replace BLAS's in every program linked with both (numpy's, for one)"
        )
    if RUNTIME_SYMBOL.fullmatch(name):
        return (
            "is in the namespace of OpenMP, MPI or MKL; a library exporting it would replace "
            "theirs in every program linked with both"
        )
    if name in LIBRARY_ATTRIBUTES:
        return (
            f"is an attribute of the library aotune.load returns (lib.{name}), so the kernel "
            "could not be called by it"
        )
    if name.lower().startswith("aotune_"):
        return "is reserved (aotune_* are the library's own symbols)"
    return None


def check_c_name(name: object, where: str) -> str:
    """``name`` if it can be a C function's name in the library, else a BuildError saying why."""
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        shown = repr(name) if isinstance(name, str) else toml_shown(name)
        raise BuildError(
            f"{where}: name {shown} is not a C identifier; use letters, digits and _, "
            "not starting with a digit (e.g. bert_ffn1)"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise BuildError(
            f"{where}: name {name[:24]}... is {len(name)} characters long; the kernel's files "
            f"are named after it: use at most {MAX_NAME_LENGTH}"
        )
    why = reserved_name_reason(name)
    if why is not None:
        raise BuildError(f"{where}: name {name!r} {why}; choose another name")
    return name


def check_unique(kernels: list[KernelRequest], source: str) -> None:
    """A BuildError naming the first name given twice, or two names that differ only in case:
    their objects (``objects/a.o``, ``objects/A.o``) are one file where file names ignore case
    (macOS, Windows)."""
    seen: dict[str, tuple[str, str]] = {}
    for k in kernels:
        first = seen.get(k.name.lower())
        if first is not None and first[0] == k.name:
            raise BuildError(
                f"{source}: the name {k.name!r} is used twice ({first[1]} and {k.source}); "
                "every kernel needs a name of its own"
            )
        if first is not None:
            raise BuildError(
                f"{source}: the names {first[0]!r} ({first[1]}) and {k.name!r} ({k.source}) "
                "differ only in case, and name one object file where file names ignore case; "
                "give them names that differ otherwise"
            )
        seen[k.name.lower()] = (k.name, k.source)


def _shape_text(value: str | list, where: str) -> str:
    if isinstance(value, str):
        return value
    bad = [v for v in value if not isinstance(v, int) or isinstance(v, bool)]
    if not value or bad:
        which = f" ({toml_shown(bad[0])} is not an integer size)" if bad else ""
        raise BuildError(f'{where}: shape must be a string like "128x768x3072" or integers{which}')
    return ",".join(str(v) for v in value)


def _dims_text(value: str | dict, where: str) -> str:
    if isinstance(value, str):
        return value
    bad = [k for k, v in value.items() if isinstance(v, bool) or not isinstance(v, int)]
    if bad:
        raise BuildError(f"{where}: dims.{bad[0]} must be an integer size")
    return ",".join(f"{k}={v}" for k, v in value.items())


def kernel_from_table(table: Any, where: str) -> KernelRequest:
    """One ``[[kernel]]`` table as a request; errors name ``where`` and the key."""
    if not isinstance(table, dict):
        raise BuildError(f"{where} is not a table; write each kernel as a [[kernel]] table")
    unknown = [k for k in table if k not in TOML_KEYS]
    if unknown:
        raise BuildError(
            f"{where}: unknown key {unknown[0]!r}; a kernel takes {', '.join(TOML_KEYS)}"
        )
    for key in ("name", "op"):
        if key not in table:
            raise BuildError(f"{where}: missing {key!r}; every [[kernel]] needs a name and an op")
    name = check_c_name(table["name"], where)
    op = table["op"]
    where = f"{where} ({name})"
    for key, value in table.items():
        types, _ = TOML_KEYS[key]
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            wanted = " or ".join(
                {str: "a string", list: "an array", dict: "a table", bool: "true/false"}.get(
                    t, "an integer"
                )
                for t in types
            )
            raise BuildError(f"{where}: {key} must be {wanted}, got {toml_shown(value)}")
    # tune's default sizes are for trying aotune out, never what a library was meant to hold
    shape_text = table.get("shape")
    if (
        op in OPERATORS
        and op != "einsum"
        and (shape_text is None or isinstance(shape_text, str) and not shape_text.strip())
    ):
        raise BuildError(
            f"{where}: {'missing' if shape_text is None else 'empty'} 'shape'; a {op} kernel "
            f'needs its sizes ({OPERATORS[op][0]}), e.g. shape = "{DEFAULT_SHAPES[op]}"'
        )
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        kw = TOML_KEYS[key][1]
        if not kw:
            continue
        if key == "shape":
            value = _shape_text(value, where)
        elif key == "dims":
            value = _dims_text(value, where)
        kwargs[kw] = value
    shape = kwargs.pop("shape", None)
    try:
        workload = build_workload(op, shape, **kwargs)
    except AotuneError as e:
        # the checks are tune's, worded for its flags; a TOML list spells them as keys
        keys = re.sub(r"(?<![\w-])--([a-z_]+)", r"\1", str(e))
        raise BuildError(f"{where}: {keys}") from None
    return KernelRequest(name, workload, where)


def read_toml(path: Path, raw: bytes | None = None) -> KernelList:
    """The kernels of a TOML list (see the module docstring for the format); ``raw``: the file's
    bytes, when :func:`read_input` has read them already."""
    if raw is None:
        raw = read_user_file(path, "TOML kernel list", BuildError, TOML_LIMIT)
    if len(raw) > TOML_LIMIT:
        raise BuildError(
            f"{path} is {len(raw)} bytes, more than the {TOML_LIMIT} a TOML kernel list may "
            "have; is it the right file? (an ONNX model needs the .onnx suffix)"
        )
    text = decode_utf8(raw, path, "TOML kernel list", BuildError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BuildError(f"{path} is not valid TOML ({e}); fix the line it names") from None
    other = [k for k in data if k != "kernel"]
    if other:
        raise BuildError(
            f"{path}: unknown top-level key {other[0]!r}; the file holds [[kernel]] tables only"
        )
    tables = data.get("kernel")
    if not tables:
        raise BuildError(f"{path} lists no kernels; add [[kernel]] tables with name, op and shape")
    if not isinstance(tables, list):
        raise BuildError(f"{path}: write kernels as [[kernel]] (an array of tables)")
    kernels = [kernel_from_table(t, f"{path.name}, kernel {i}") for i, t in enumerate(tables, 1)]
    check_unique(kernels, str(path))
    return KernelList(str(path), tuple(kernels))


def read_input(
    path: Path, shapes: dict[str, tuple[int, ...]] | None = None, prefix: str = DEFAULT_PREFIX
) -> KernelList:
    """A TOML kernel list or an ONNX model, by suffix, else by content (``shapes``: ONNX dynamic
    inputs); read once, as a regular file of at most the size its kind may have."""
    try:
        path.lstat()
    except FileNotFoundError:
        raise BuildError(
            f"{path} does not exist; give a TOML kernel list or an ONNX model"
        ) from None
    except OSError:  # a name too long, a folder not searchable: the read below names it
        pass
    suffix = path.suffix.lower()
    if suffix == ".toml":
        raw = read_user_file(path, "TOML kernel list", BuildError, TOML_LIMIT)
    else:  # an .onnx, or either kind: the larger limit, the content decides (read_toml checks)
        what = "ONNX model" if suffix == ".onnx" else "build input"
        raw = read_user_file(path, what, BuildError, ONNX_LIMIT)
    if suffix == ".onnx" or (suffix != ".toml" and b"\0" in raw[:4096]):
        from aotune.artifact.onnx_import import read_onnx

        return read_onnx(path, shapes or {}, raw, prefix)  # its names: outside prefix_*
    if shapes:
        raise BuildError("--shape name=dims applies to ONNX models, not to a TOML kernel list")
    return read_toml(path, raw)
