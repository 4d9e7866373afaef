"""Workloads: loops, tensors and one statement with affine accesses.

``einsum`` covers every contraction ``out[...] += in0[...] * in1[...]`` with one loop per index;
``conv2d`` and ``depthwise_conv2d`` use the same ``AffineIndex`` for ``h*stride + r*dilation - pad``
and grouped channels ``g*Cg + c``. Reads outside an input's bounds are zeros (zero padding).
Roadmap: pooling and other non-contraction statements would add a reduction operator field.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from aotune.errors import WorkloadError

LoopKind = Literal["spatial", "reduction"]
DTYPE_BYTES = {"float32": 4}


@dataclass(frozen=True)
class Loop:
    """One loop of the iteration space: ``0 <= name < extent``."""

    name: str
    extent: int
    kind: LoopKind


@dataclass(frozen=True)
class Tensor:
    """A dense row-major tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class AffineIndex:
    """``sum(coeff * loop) + const`` for one tensor dimension."""

    terms: tuple[tuple[str, int], ...]
    const: int = 0

    def __str__(self) -> str:
        parts = [(f"{c}*{n}" if c != 1 else n) for n, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class Access:
    """``tensor[indices...]``."""

    tensor: str
    indices: tuple[AffineIndex, ...]

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(map(str, self.indices))}]"


@dataclass(frozen=True)
class Statement:
    """``output += product(inputs)`` over the whole iteration domain (output starts at zero).

    An input element read outside its tensor's bounds is zero (a convolution's zero padding).
    """

    output: Access
    inputs: tuple[Access, ...]

    def __str__(self) -> str:
        return f"{self.output} += {' * '.join(map(str, self.inputs))}"


ACTIVATIONS = ("none", "relu", "gelu", "sigmoid")


@dataclass(frozen=True)
class Epilogue:
    """Element-wise work fused into the store of the output: ``out = act(out + bias[last index])``.

    ``gelu`` is the tanh approximation (PyTorch's ``approximate="tanh"``, used by BERT/GPT-2).
    """

    bias: bool = False
    activation: str = "none"

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise WorkloadError(
                f"activation {self.activation!r} is not supported; "
                f"use one of {', '.join(ACTIVATIONS)}"
            )

    @property
    def active(self) -> bool:
        """Whether there is anything to fuse."""
        return self.bias or self.activation != "none"

    def __str__(self) -> str:
        parts = (["+ bias"] if self.bias else []) + (
            [self.activation] if self.activation != "none" else []
        )
        return " then ".join(parts)


LAYOUTS = ("NCHW", "NHWC")


@dataclass(frozen=True)
class ConvParams:
    """What a 2-D convolution was built from: the numpy reference and ``describe`` read it."""

    stride: int = 1
    pad: int = 0
    dilation: int = 1
    groups: int = 1
    layout: str = "NCHW"

    def out_size(self, size: int, kernel: int) -> int:
        """Output extent along one spatial axis."""
        return (size + 2 * self.pad - self.dilation * (kernel - 1) - 1) // self.stride + 1


@dataclass(frozen=True)
class Workload:
    """A tensor computation: the unit aotune tunes."""

    op: str
    loops: tuple[Loop, ...]
    tensors: tuple[Tensor, ...]
    statement: Statement
    shape: tuple[tuple[str, int], ...]  # the user-facing named sizes, e.g. (("M", 1024), ...)
    dtype: str = "float32"
    epilogue: Epilogue = Epilogue()
    conv: ConvParams | None = None  # set for convolutions: their reference is not an einsum

    def __post_init__(self) -> None:
        for t in self.tensors:
            elems = math.prod(t.shape)
            if elems > MAX_TENSOR_ELEMENTS:
                raise WorkloadError(
                    f"tensor {t.name} of shape {'x'.join(map(str, t.shape))} would hold {elems} "
                    f"elements ({elems * t.itemsize / 2**40:.0f} TiB); at most 2^42 are supported"
                )

    def loop(self, name: str) -> Loop:
        """The loop called ``name``."""
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise WorkloadError(f"workload {self.op} has no loop {name!r}")

    def tensor(self, name: str) -> Tensor:
        """The tensor called ``name``."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise WorkloadError(f"workload {self.op} has no tensor {name!r}")

    @property
    def flops(self) -> int:
        """Floating-point operations: a multiply per extra input and an add, at every point."""
        return len(self.statement.inputs) * math.prod(lp.extent for lp in self.loops)

    @property
    def shape_dict(self) -> dict[str, int]:
        """The named sizes as a dict."""
        return dict(self.shape)

    def label(self) -> str:
        """Short: op and sizes, then what else sets the kernel (a convolution's layout, stride,
        pad, dilation and groups where not the default; a dense layer's epilogue)."""
        sizes = "x".join(str(v) for _, v in self.shape)
        extra = [str(self.epilogue)] if self.epilogue.active else []
        if self.conv:
            default = ConvParams()
            extra += [
                f"{name} {value}"
                for name in ("stride", "pad", "dilation", "groups")
                if (value := getattr(self.conv, name)) != getattr(default, name)
                and not (name == "groups" and self.op == "depthwise_conv2d")  # always C there
            ]
            if self.conv.layout != default.layout:
                extra.append(self.conv.layout)
        return f"{self.op} {sizes}" + (f" ({', '.join(extra)})" if extra else "")

    def describe(self) -> str:
        """One line: op, sizes and the statement."""
        sizes = "x".join(str(v) for _, v in self.shape)
        tail = f", then {self.epilogue}" if self.epilogue.active else ""
        if self.conv:
            c = self.conv
            tail += (
                f" ({c.layout}, stride {c.stride}, pad {c.pad}, dilation {c.dilation}, "
                f"groups {c.groups}; reads outside X are 0)"
            )
        return f"{self.op} {sizes} {self.dtype}: {self.statement}{tail}"

    def einsum_spec(self, letters: Mapping[str, str] | None = None) -> str:
        """The statement as an einsum string (one letter per loop, a-z then A-Z in loop order
        unless ``letters`` maps the loop names), for numpy references."""
        if letters is None and len(self.loops) > len(string.ascii_letters):
            raise WorkloadError(
                f"{self.op} has {len(self.loops)} loops; an einsum names at most "
                f"{len(string.ascii_letters)} (a-z, A-Z): use fewer indices"
            )
        if letters is None:
            letters = {lp.name: string.ascii_letters[i] for i, lp in enumerate(self.loops)}

        def sub(acc: Access) -> str:
            out = []
            for idx in acc.indices:
                if len(idx.terms) != 1 or idx.terms[0][1] != 1 or idx.const:
                    raise WorkloadError(
                        f"{self.op}: access {acc} is not a plain index; no einsum form"
                    )
                out.append(letters[idx.terms[0][0]])
            return "".join(out)

        return ",".join(sub(a) for a in self.statement.inputs) + "->" + sub(self.statement.output)


def workload_from_definition(d: Any) -> Workload:
    """The workload whose ``dataclasses.asdict`` is ``d`` (a tuning record's stored
    ``definition``), rebuilt, and only if it is the one aotune makes of its operator and sizes: a
    WorkloadError says what is wrong with any other (a zero extent, another dtype, an index over a
    loop it lacks, labels that contradict the loops), before anything analyses it."""

    def index(x: Any) -> AffineIndex:
        return AffineIndex(tuple((str(n), int(c)) for n, c in x["terms"]), int(x["const"]))

    def access(a: Any) -> Access:
        return Access(str(a["tensor"]), tuple(index(x) for x in a["indices"]))

    try:
        st = d["statement"]
        w = Workload(
            op=str(d["op"]),
            loops=tuple(Loop(str(x["name"]), int(x["extent"]), x["kind"]) for x in d["loops"]),
            tensors=tuple(
                Tensor(str(t["name"]), tuple(int(n) for n in t["shape"]), str(t["dtype"]))
                for t in d["tensors"]
            ),
            statement=Statement(access(st["output"]), tuple(access(a) for a in st["inputs"])),
            shape=tuple((str(n), int(v)) for n, v in d["shape"]),
            dtype=str(d["dtype"]),
            epilogue=Epilogue(**d["epilogue"]),
            conv=None if d["conv"] is None else ConvParams(**d["conv"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise WorkloadError(f"not a stored workload definition ({type(e).__name__}: {e})") from None
    made = _remade(w)
    if made != w:
        raise WorkloadError(f"aotune makes another of its sizes ({made.describe()})")
    return made


def _remade(w: Workload) -> Workload:
    """The workload aotune's own constructors make of ``w``'s operator, sizes and parameters."""
    loops = {lp.name for lp in w.loops}
    accesses = (w.statement.output, *w.statement.inputs)
    for acc in accesses:
        for idx in acc.indices:
            for name, _ in idx.terms:
                if name not in loops:
                    raise WorkloadError(f"an index of {acc.tensor} names no loop ({name!r})")
    if w.op == "einsum":  # its loops are named by the spec's letters
        spec = w.einsum_spec({name: name for name in loops})
        return einsum(spec, {lp.name: lp.extent for lp in w.loops}, dtype=w.dtype)
    if w.op not in OPERATORS:
        raise WorkloadError(f"unknown operator {w.op!r}; known: {', '.join(OPERATORS)}")
    conv: dict[str, Any] = {}
    if w.conv is not None:
        conv = dataclasses.asdict(w.conv)
        if w.op == "depthwise_conv2d":
            conv.pop("groups")
    shape = "x".join(str(v) for _, v in w.shape)
    return build_workload(
        w.op, shape, bias=w.epilogue.bias, activation=w.epilogue.activation, **conv
    )


# A loop or tensor dimension: 64-bit indexing holds any product of these, and CP-SAT's domains
# (64-bit) hold every expression the spaces build from them.
MAX_EXTENT = 2**31 - 1
MAX_TENSOR_ELEMENTS = 2**42  # 16 TiB of fp32: beyond any machine this runs on


def check_extent(name: str, value: object) -> int:
    """A positive integer dimension, or a WorkloadError that says how to fix it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"dimension {name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise WorkloadError(
            f"dimension {name} must be a positive integer, got {value}; every size must be >= 1"
        )
    if value > MAX_EXTENT:
        raise WorkloadError(
            f"dimension {name} = {value} is too large; sizes go up to 2^31 - 1 = {MAX_EXTENT}"
        )
    return value


def size_from_digits(name: str, text: str, not_digits: str) -> int:
    """Dimension ``name`` written in ASCII digits (with an optional minus sign), checked by
    ``check_extent``; WorkloadError ``not_digits`` where it is not such digits (Arabic-Indic and
    full-width digits, separators). A number too long for any size is too large, not misspelt."""
    text = text.strip()
    if not re.fullmatch(r"-?[0-9]+", text):
        raise WorkloadError(not_digits)
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("-").lstrip("0") or "0"
    if len(digits) > 30:  # int() of thousands of digits is slow, and refused past 4300
        shown = f"{sign}{digits[:8]}... ({len(digits)} digits)"
        if sign:
            raise WorkloadError(f"dimension {name} = {shown} must be a positive integer")
        raise WorkloadError(
            f"dimension {name} = {shown} is too large; sizes go up to 2^31 - 1 = {MAX_EXTENT}"
        )
    return check_extent(name, int(sign + digits))


_EINSUM = re.compile(r"^\s*([a-zA-Z]+)\s*,\s*([a-zA-Z]+)\s*->\s*([a-zA-Z]*)\s*$")


def _einsum_form_problem(spec: str, given: str) -> str:
    """What keeps ``spec`` (``given`` as numpy reads it) from the form 'ab,bc->ac' (numpy takes
    more than aotune generates)."""
    if "." in spec:
        return "ellipsis ('...') is not supported: name every index with a letter"
    if "->" not in spec:  # numpy's implicit output of a spec that is not letters and commas
        if not any(c.isalpha() for c in spec):
            return "it names no indices, e.g. 'ij,jk->ik'"
        return "its output is implicit and it holds more than letters and ','"
    if spec.count("->") > 1:
        return "it has more than one '->'"
    ins, out = spec.split("->")
    if "," in out:
        return "the output after '->' is one operand (no ',')"
    if len(ins.split(",")) == 1 and len(given.split("->")[0].split()) == 2:
        return "separate the two inputs with ',' (numpy drops spaces: this reads as one operand)"
    if len(ins.split(",")) != 2:
        return (
            f"it has {len(ins.split(','))} input operand(s); aotune generates contractions of "
            "exactly two"
        )
    other = sorted({c for c in ins + out if not (c.isascii() and c.isalpha())} - {","})
    if other:
        shown = ", ".join(repr(c) for c in other[:3])
        return f"indices are ASCII letters a-z and A-Z, not {shown}"
    return "an input operand has no indices"


def numpy_einsum_spec(spec: str) -> str:
    """``spec`` as numpy reads it, in the explicit form aotune takes: whitespace dropped, and
    numpy's implicit output (no '->': the indices that appear once, in ASCII order, so upper case
    first) written out: ``" ij , jk"`` -> ``"ij,jk->ik"``. A spec that is not letters and commas
    is returned without its whitespace, for the form check to explain."""
    compact = "".join(spec.split())
    if "->" in compact:
        return compact
    letters = compact.replace(",", "")
    if not letters or not all(c.isascii() and c.isalpha() for c in letters):
        return compact
    once = sorted(c for c in set(letters) if letters.count(c) == 1)
    return f"{compact}->{''.join(once)}"


def einsum(
    spec: str,
    dims: Mapping[str, int],
    *,
    op: str = "einsum",
    names: tuple[str, str, str] | None = None,
    shape: tuple[tuple[str, int], ...] | None = None,
    dtype: str = "float32",
) -> Workload:
    """A two-input contraction such as ``"mk,kn->mn"``: one loop per index letter.

    Letters of the output are spatial loops, the others are reductions. Loop order follows first
    appearance in the output, then in the inputs. The spec is read as numpy reads it
    (``numpy_einsum_spec``: spaces, and an implicit output). The tensors are A, B and C unless
    ``names`` says otherwise, or in0, in1 and out where the spec uses one of those letters as an
    index (``C[A, C]`` would read as a tensor indexed by itself).
    """
    if dtype not in DTYPE_BYTES:
        raise WorkloadError(f"dtype {dtype!r} not supported; use one of {', '.join(DTYPE_BYTES)}")
    given, spec = spec, numpy_einsum_spec(spec)
    m = _EINSUM.match(spec)
    if not m:
        raise WorkloadError(
            f"einsum spec {given!r} is not of the form 'ab,bc->ac': "
            f"{_einsum_form_problem(spec, given)}"
        )
    in0, in1, out = m.groups()
    for part in (in0, in1, out):
        if len(set(part)) != len(part):
            raise WorkloadError(
                f"einsum spec {spec!r}: an index repeats within one operand ({part!r})"
            )
    for ch in out:
        if ch not in in0 and ch not in in1:
            raise WorkloadError(f"einsum spec {spec!r}: output index {ch!r} appears in no input")
    order: list[str] = []
    for ch in out + in0 + in1:
        if ch not in order:
            order.append(ch)
    for ch in order:
        if ch not in dims:
            raise WorkloadError(
                f"einsum spec {spec!r}: index {ch!r} has no size; add {ch}=N to the dims"
            )
        check_extent(ch, dims[ch])
    unused = sorted(set(dims) - set(order))
    if unused:
        raise WorkloadError(
            f"einsum spec {spec!r}: dims give {', '.join(unused)}, which the spec does not use; "
            f"drop {'them' if len(unused) > 1 else 'it'} or fix the spec"
        )
    loops = tuple(Loop(ch, dims[ch], "spatial" if ch in out else "reduction") for ch in order)

    def access(tname: str, idx: str) -> Access:
        return Access(tname, tuple(AffineIndex(((ch, 1),)) for ch in idx))

    if names is None:
        names = ("in0", "in1", "out") if set("ABC") & set(order) else ("A", "B", "C")
    a, b, c = names
    tensors = (
        Tensor(a, tuple(dims[ch] for ch in in0), dtype),
        Tensor(b, tuple(dims[ch] for ch in in1), dtype),
        Tensor(c, tuple(dims[ch] for ch in out), dtype),
    )
    stmt = Statement(access(c, out), (access(a, in0), access(b, in1)))
    return Workload(op, loops, tensors, stmt, shape or tuple((ch, dims[ch]) for ch in order), dtype)


def matmul(M: int, N: int, K: int, dtype: str = "float32") -> Workload:
    """``C[m, n] += A[m, k] * B[k, n]`` with A: MxK, B: KxN, C: MxN (row-major)."""
    for name, v in (("M", M), ("N", N), ("K", K)):
        check_extent(name, v)
    return einsum(
        "mk,kn->mn",
        {"m": M, "n": N, "k": K},
        op="matmul",
        shape=(("M", M), ("N", N), ("K", K)),
        dtype=dtype,
    )


def batch_matmul(B: int, M: int, N: int, K: int, dtype: str = "float32") -> Workload:
    """``C[b, m, n] += A[b, m, k] * B[b, k, n]``: B independent matmuls."""
    for name, v in (("B", B), ("M", M), ("N", N), ("K", K)):
        check_extent(name, v)
    return einsum(
        "bmk,bkn->bmn",
        {"b": B, "m": M, "n": N, "k": K},
        op="batch_matmul",
        shape=(("B", B), ("M", M), ("N", N), ("K", K)),
        dtype=dtype,
    )


def dense(
    M: int, N: int, K: int, bias: bool = False, activation: str = "none", dtype: str = "float32"
) -> Workload:
    """A matmul with a fused epilogue: ``C = act(A @ B + bias)``, bias of length N."""
    w = matmul(M, N, K, dtype)
    return Workload(
        "dense", w.loops, w.tensors, w.statement, w.shape, dtype, Epilogue(bias, activation)
    )


def _conv_param(name: str, value: object, minimum: int, rule: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise WorkloadError(f"{name} must be an integer >= {minimum} ({rule}), got {value!r}")
    if value > MAX_EXTENT:
        raise WorkloadError(f"{name} = {value} is too large ({rule}); at most {MAX_EXTENT}")
    return value


def conv2d(
    N: int,
    C: int,
    H: int,
    W: int,
    K: int,
    R: int,
    S: int,
    *,
    stride: int = 1,
    pad: int = 0,
    dilation: int = 1,
    groups: int = 1,
    layout: str = "NCHW",
    op: str = "conv2d",
    dtype: str = "float32",
) -> Workload:
    """A direct 2-D convolution ``Y = conv(X, W)`` with zero padding.

    NCHW: X (N,C,H,W), weights (K, C/groups, R, S), Y (N,K,OH,OW). NHWC: X (N,H,W,C), weights
    (R, S, C/groups, K), Y (N,OH,OW,K). Output channel ``g*K/groups + ko`` reads input channels
    ``g*C/groups + c``. Loops: n, g, output pixels and ``ko`` are spatial; ``r, s, c`` reduce.
    """
    for name, v in (("N", N), ("C", C), ("H", H), ("W", W), ("K", K), ("R", R), ("S", S)):
        check_extent(name, v)
    stride = _conv_param("stride", stride, 1, "the step between output pixels")
    dilation = _conv_param("dilation", dilation, 1, "the step between kernel taps; 1 is dense")
    pad = _conv_param("pad", pad, 0, "zeros added on each side of H and W")
    groups = _conv_param("groups", groups, 1, "channel groups")
    if layout not in LAYOUTS:
        raise WorkloadError(
            f"layout {layout!r} is not supported; use one of {', '.join(LAYOUTS)} "
            f"(input, weights and output all follow it)"
        )
    for name, ch in (("C", C), ("K", K)):
        if ch % groups:
            raise WorkloadError(
                f"groups={groups} does not divide {name}={ch}; channels split evenly into groups, "
                f"so pick groups dividing both C={C} and K={K}"
            )
    for axis, size, kname, kernel in (("H", H, "R", R), ("W", W, "S", S)):
        span = dilation * (kernel - 1) + 1
        if size + 2 * pad > MAX_EXTENT or span > MAX_EXTENT:
            raise WorkloadError(
                f"the padded input {axis}+2*pad = {size + 2 * pad} or the dilated kernel span "
                f"{span} is beyond {MAX_EXTENT}; use a smaller pad or dilation"
            )
        if span > size + 2 * pad:
            raise WorkloadError(
                f"kernel {kname}={kernel} (dilated span {span}) is larger than the padded input "
                f"{axis}+2*pad={size + 2 * pad}; use a smaller kernel or dilation, or more padding"
            )
    cp = ConvParams(stride, pad, dilation, groups, layout)
    OH, OW = cp.out_size(H, R), cp.out_size(W, S)
    Cg, Kg = C // groups, K // groups
    h = AffineIndex((("oh", stride), ("r", dilation)), -pad)
    w = AffineIndex((("ow", stride), ("s", dilation)), -pad)
    # a g loop only with several groups, so an ordinary convolution's accesses stay plain
    ci = AffineIndex((("g", Cg), ("c", 1))) if groups > 1 else AffineIndex((("c", 1),))
    ko = AffineIndex((("g", Kg), ("ko", 1))) if groups > 1 else AffineIndex((("ko", 1),))

    def ix(name: str) -> AffineIndex:
        return AffineIndex(((name, 1),))

    sp = {"n": N, "g": groups, "oh": OH, "ow": OW, "ko": Kg}
    red = {"r": R, "s": S, "c": Cg}
    if layout == "NHWC":
        spatial, reduction = (
            ("n", "g", "oh", "ow", "ko"),
            ("r", "s", "c"),
        )  # c innermost: contiguous in X
        x = Access("X", (ix("n"), h, w, ci))
        wt = Access("Wt", (ix("r"), ix("s"), ix("c"), ko))
        y = Access("Y", (ix("n"), ix("oh"), ix("ow"), ko))
        shapes = ((N, H, W, C), (R, S, Cg, K), (N, OH, OW, K))
    else:
        spatial, reduction = ("n", "g", "ko", "oh", "ow"), ("c", "r", "s")
        x = Access("X", (ix("n"), ci, h, w))
        wt = Access("Wt", (ko, ix("c"), ix("r"), ix("s")))
        y = Access("Y", (ix("n"), ko, ix("oh"), ix("ow")))
        shapes = ((N, C, H, W), (K, Cg, R, S), (N, K, OH, OW))
    spatial = tuple(n for n in spatial if n != "g" or groups > 1)
    loops = tuple(Loop(n, sp[n], "spatial") for n in spatial) + tuple(
        Loop(n, red[n], "reduction") for n in reduction
    )
    tensors = tuple(Tensor(name, shape, dtype) for name, shape in zip(("X", "Wt", "Y"), shapes))
    shape = (
        (("N", N), ("C", C), ("H", H), ("W", W))
        + ((("K", K),) if op == "conv2d" else ())
        + (("R", R), ("S", S))
    )
    return Workload(op, loops, tensors, Statement(y, (x, wt)), shape, dtype, conv=cp)


def depthwise_conv2d(
    N: int,
    C: int,
    H: int,
    W: int,
    R: int,
    S: int,
    *,
    stride: int = 1,
    pad: int = 0,
    dilation: int = 1,
    layout: str = "NCHW",
    dtype: str = "float32",
) -> Workload:
    """A depthwise convolution: one R x S filter per channel (conv2d with groups = K = C)."""
    check_extent("C", C)
    return conv2d(
        N,
        C,
        H,
        W,
        C,
        R,
        S,
        stride=stride,
        pad=pad,
        dilation=dilation,
        groups=C,
        layout=layout,
        op="depthwise_conv2d",
        dtype=dtype,
    )


# op -> (shape pattern shown to users, size names in order)
OPERATORS = {
    "matmul": ("MxNxK", ("M", "N", "K")),
    "batch_matmul": ("BxMxNxK", ("B", "M", "N", "K")),
    "dense": ("MxNxK", ("M", "N", "K")),
    "conv2d": ("N,C,H,W,K,R,S", ("N", "C", "H", "W", "K", "R", "S")),
    "depthwise_conv2d": ("N,C,H,W,R,S", ("N", "C", "H", "W", "R", "S")),
    "einsum": ("--dims a=N,b=N,...", ()),
}
DEFAULT_SHAPES = {
    "matmul": "1024x1024x1024",
    "batch_matmul": "8x256x256x256",
    "dense": "128x3072x768",
    "conv2d": "1,64,56,56,64,3,3",
    "depthwise_conv2d": "1,32,112,112,3,3",
}
CONV_OPS = ("conv2d", "depthwise_conv2d")


def parse_shape(text: str, names: tuple[str, ...]) -> dict[str, int]:
    """``"512x2048x256"`` -> {"M": 512, ...}; errors say which part is wrong."""
    parts = [p.strip() for p in text.lower().replace(",", "x").split("x")]
    sep = "," if len(names) > 4 else "x"
    example = (
        "x".join(str(v) for v in (8, 512, 512, 512)[-len(names) :])
        if len(names) <= 4
        else ",".join(str(v) for v in (1, 64, 56, 56, 64, 3, 3)[: len(names) - 2] + (3, 3))
    )
    if len(parts) == 1 and not parts[0].lstrip("-").isdigit():
        joined = re.search(r"\d\s*([^\w\s,-])\s*\d", text)  # 512×512, 512*512: not our 'x'
        between = f" with {sep!r} between them, not {joined.group(1)!r}" if joined else ""
        raise WorkloadError(
            f"shape {text!r} is not sizes; give {len(names)} ({sep.join(names)}){between}, "
            f"e.g. {example}"
        )
    if len(parts) != len(names):
        raise WorkloadError(
            f"shape {text!r} has {len(parts)} sizes, expected {len(names)} ({sep.join(names)}), "
            f"e.g. {example}"
        )
    sizes = {}
    for name, part in zip(names, parts):
        sizes[name] = size_from_digits(
            name,
            part,
            f"shape {text!r}: {name}={part!r} is not an integer in digits 0-9; "
            f"write it as {sep.join(names)}, e.g. {example}",
        )
    return sizes


def parse_dims(text: str) -> dict[str, int]:
    """``"b=8,i=256"`` -> {"b": 8, "i": 256}; errors name the malformed entry."""
    dims: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",")):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or not re.fullmatch(r"[a-zA-Z]", name):
            raise WorkloadError(
                f"--dims entry {item!r} is not of the form letter=size with an ASCII letter "
                "a-z or A-Z, e.g. b=8,i=256"
            )
        size = size_from_digits(
            name,
            value,
            f"--dims entry {item!r}: size {value.strip()!r} is not an integer in digits 0-9",
        )
        if name in dims:
            raise WorkloadError(f"--dims gives index {name!r} twice")
        dims[name] = size
    return dims


def build_workload(
    op: str,
    shape: str | None,
    *,
    spec: str | None = None,
    dims: str | None = None,
    bias: bool = False,
    activation: str = "none",
    stride: int | None = None,
    pad: int | None = None,
    dilation: int | None = None,
    groups: int | None = None,
    layout: str | None = None,
) -> Workload:
    """A named operator from CLI-style arguments (the CLI's entry point).

    Convolution parameters left as None take their defaults (stride 1, pad 0, dilation 1, groups 1,
    NCHW); giving one to an operator that is not a convolution is an error, not silently ignored.
    """
    if op not in OPERATORS:
        raise WorkloadError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    # names are case-blind here, as the layout is (--activation GELU, --layout nhwc)
    activation = activation.lower() if isinstance(activation, str) else activation
    if (bias or activation != "none") and op != "dense":
        raise WorkloadError(
            f"--bias/--activation apply to dense, not {op}; use 'aotune tune dense ...'"
        )
    conv_args = {
        "stride": stride,
        "pad": pad,
        "dilation": dilation,
        "groups": groups,
        "layout": layout.upper() if layout is not None else None,
    }
    given = [f"--{k}" for k, v in conv_args.items() if v is not None]
    if given and op not in CONV_OPS:
        verb = "applies" if len(given) == 1 else "apply"
        ops = "conv2d and depthwise_conv2d"
        if "--groups" in given:  # depthwise_conv2d has one group per channel
            ops = "conv2d" if given == ["--groups"] else f"{ops} (--groups: conv2d only)"
        raise WorkloadError(f"{'/'.join(given)} {verb} to {ops}, not {op}")
    if groups is not None and op == "depthwise_conv2d":
        raise WorkloadError(
            "depthwise_conv2d has one group per channel; drop --groups "
            "(or use conv2d --groups G for grouped convolution)"
        )
    if op == "einsum":
        if not spec or not dims:
            missing = " and ".join(
                what for what, v in (("a spec", spec), ("its sizes (--dims)", dims)) if not v
            )
            raise WorkloadError(
                f'einsum needs {missing}, e.g. aotune tune einsum "bij,bjk->bik" '
                "--dims b=8,i=256,j=256,k=256"
            )
        if shape is not None:
            raise WorkloadError("einsum takes its sizes from --dims, not --shape")
        return einsum(spec, parse_dims(dims))
    if spec and not dims:  # ``tune -- matmul --shape 8x8x8``: '--shape' came as a second word
        raise WorkloadError(
            f"{op} takes no second argument ({spec[:40]!r}): only einsum takes a spec"
            + ("; options go before '--', which ends them" if spec.startswith("-") else "")
        )
    if spec or dims:
        raise WorkloadError(f"an einsum spec and --dims apply to einsum, not {op}")
    _, names = OPERATORS[op]
    if shape is not None and not shape.strip():
        raise WorkloadError(
            f"--shape is empty; give {OPERATORS[op][0]} (e.g. {DEFAULT_SHAPES[op]}), or leave "
            "--shape out for that default"
        )
    sizes = parse_shape(DEFAULT_SHAPES[op] if shape is None else shape, names)
    if op == "batch_matmul":
        return batch_matmul(sizes["B"], sizes["M"], sizes["N"], sizes["K"])
    if op == "dense":
        return dense(sizes["M"], sizes["N"], sizes["K"], bias, activation)
    conv_kw = {k: v for k, v in conv_args.items() if v is not None}
    if op == "conv2d":
        return conv2d(*(sizes[n] for n in names), **conv_kw)  # type: ignore[arg-type]
    if op == "depthwise_conv2d":
        return depthwise_conv2d(*(sizes[n] for n in names), **conv_kw)  # type: ignore[arg-type]
    return matmul(sizes["M"], sizes["N"], sizes["K"])
