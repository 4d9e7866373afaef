"""An ONNX model -> the kernels aotune generates for it, and the ops it leaves to the user.

Shapes come from ONNX shape inference after the model's dynamic input dims are fixed (``--shape
name=dims``; a dim that stays unknown is an error naming the input). Then, node by node:

    MatMul   2-D x 2-D -> matmul; [..., M, K] x [K, N] -> matmul over the flattened rows;
             equal batch dims on both sides -> batch_matmul
    Gemm     alpha = 1; transA/transB become the einsum's layout ("km", "nk"); C of length N with
             beta = 1 is the fused bias
    Conv     2-D, NCHW, equal strides, dilations and symmetric pads (or auto_pad); group = C = K
             is depthwise_conv2d, other groups are grouped conv2d
    then     an Add of a constant vector of length N (the output's last dim) becomes the fused bias
             and a following Relu, Sigmoid or Gelu (tanh form) the fused activation, as long as the
             intermediate has no other reader and is not a model output

Everything else is a :class:`SkippedOp` with the reason, never an error; so is a MatMul, Gemm or
Conv whose tensors are not float32 (aotune generates float32 kernels and converts nothing). A
weight whose shape contradicts the node's input (a Conv's channels, groups or kernel size, a
MatMul's or Gemm's inner size, a bias of the wrong length) is an invalid model: an error naming
the node and both shapes. Nodes with the same workload share one kernel (tuned once), named
after the first of them.

The model is read through ``files.read_user_file`` (a regular file of at most 2 GiB, protobuf's
own limit); weights stored as external data are never read: only their shapes and types matter.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from aotune.analysis.workload import (
    MAX_EXTENT,
    Epilogue,
    Workload,
    batch_matmul,
    conv2d,
    depthwise_conv2d,
    einsum,
    matmul,
)
from aotune.artifact.inputs import (
    MAX_NAME_LENGTH,
    ONNX_LIMIT,
    KernelList,
    KernelRequest,
    SkippedOp,
    reserved_name_reason,
)
from aotune.artifact.names import DEFAULT_PREFIX
from aotune.errors import BuildError, WorkloadError
from aotune.files import read_user_file
from aotune.search.database import workload_key

ACTIVATIONS = {"Relu": "relu", "Sigmoid": "sigmoid"}  # Gelu: only approximate="tanh"
FLOAT = 1  # onnx.TensorProto.FLOAT: the one element type aotune generates kernels for
# onnx.TensorProto element types under the names numpy gives them (others: ONNX's own name)
_DTYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16", 0: "of unknown type"}


def parse_shape_args(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``["input=1x3x224x224", ...]`` -> {"input": (1, 3, 224, 224)}; errors show the form."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, eq, dims = item.partition("=")
        parts = re.split(r"[x,]", dims.strip().lower())
        # ASCII digits only, as for tune's --shape: int() also reads '٨' and '1_6' (as 16)
        ok = all(re.fullmatch(r"\s*[0-9]+\s*", d) for d in parts)
        values = tuple(int(d) for d in parts) if ok else ()
        if not eq or not name.strip() or not values or min(values) < 1:
            raise BuildError(
                f"--shape {item!r} is not name=dims with positive sizes, e.g. input=1x3x224x224"
            )
        name = name.strip()
        if name in out and out[name] != values:  # which one was meant? never pick silently
            shown = " and ".join("x".join(map(str, v)) for v in (out[name], values))
            raise BuildError(
                f"--shape gives input {name!r} twice, as {shown}; give each input's sizes once"
            )
        out[name] = values
    return out


def _dtype(elem_type: int) -> str:
    """An ONNX element type's name for a message: float64, float16, int8, ..."""
    import onnx

    if elem_type in _DTYPES:
        return _DTYPES[elem_type]
    try:
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"of element type {elem_type}"


# the ops aotune generates, and the most inputs ONNX gives each (A, B and Gemm's C or Conv's bias)
GENERATED_INPUTS = {"MatMul": 2, "Gemm": 3, "Conv": 3}


def _label(node: Any) -> str:
    """How errors and the report name a node: its name, else its op and outputs."""
    return node.name or f"{node.op_type}({', '.join(node.output)})"


def _load(path: Path, data: bytes | None = None) -> Any:
    """The model in ``path`` (whose bytes ``data`` are, when already read)."""
    import onnx

    if data is None:
        data = read_user_file(path, "ONNX model", BuildError, ONNX_LIMIT)
    try:
        # from the bytes: external data (weights in other files) is not loaded, nor needed
        model = onnx.load_model_from_string(data)
    except Exception as e:  # noqa: BLE001 -- protobuf raises its own DecodeError and others
        raise BuildError(
            f"{path} is not an ONNX model ({type(e).__name__}); give a .onnx file "
            "saved by onnx.save or an exporter, or a TOML kernel list"
        ) from None
    if not model.ir_version and not model.opset_import and not model.HasField("graph"):
        # protobuf reads many non-ONNX bytes as an empty message rather than failing
        raise BuildError(
            f"{path} is not an ONNX model (no ONNX version, opset or graph in it); give a .onnx "
            "file saved by onnx.save or an exporter, or a TOML kernel list"
        )
    if not model.graph.node:
        raise BuildError(f"{path} is an ONNX model with no nodes in its graph: nothing to build")
    g = model.graph
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    writers: dict[str, Any] = {}
    for node in g.node:
        for o in filter(None, node.output):
            if o in defined or o in writers:
                first = f"node {_label(writers[o])}" if o in writers else "an input or initializer"
                raise BuildError(
                    f"{path}: tensor {o!r} is written by {first} and by node {_label(node)}; an "
                    "ONNX graph defines each tensor once: the model is invalid, export it again"
                )
            writers[o] = node
    defined |= set(writers)
    for node in g.node:
        missing = [n for n in node.input if n and n not in defined]
        if missing:
            raise BuildError(
                f"{path}: node {_label(node)} reads {missing[0]!r}, which no input, initializer or "
                "node of the graph defines; the model is incomplete: export it again"
            )
    return model


def _fix_inputs(model: Any, shapes: dict[str, tuple[int, ...]], path: Path) -> None:
    """Write the user's sizes into the dynamic dims of the model's inputs (in place)."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise BuildError(
            f"--shape names {unknown[0]!r}, which is not an input of {path.name}; "
            f"its inputs are {', '.join(inputs) or 'none'}"
        )
    for name, inp in inputs.items():
        kind = inp.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):  # a sequence, map, optional or sparse input
            if name in shapes:  # writing dims would turn it into a tensor input silently
                raise BuildError(
                    f"--shape {name}=...: input {name!r} of {path.name} is a "
                    f"{kind.removesuffix('_type').replace('_', ' ')}, not a tensor; --shape "
                    "gives a tensor input's sizes: leave it out for this input"
                )
            continue  # no sizes to fix; nodes reading it are skipped for unknown shapes
        tensor = inp.type.tensor_type
        dims = tensor.shape.dim
        given = shapes.get(name)
        negative = [d.dim_value for d in dims if d.HasField("dim_value") and d.dim_value < 0]
        if negative:
            raise BuildError(
                f"input {name!r} of {path.name} has a negative dimension ({negative[0]}); the "
                "model is invalid: fix the input's shape in the model or re-export it"
            )
        if given is not None:
            too_large = [v for v in given if v > MAX_EXTENT]
            if too_large:
                raise BuildError(
                    f"--shape {name}=...: size {too_large[0]} is too large; sizes go up to "
                    f"2^31 - 1 = {MAX_EXTENT}"
                )
            if not tensor.HasField("shape"):  # a model that leaves the input's rank open
                for v in given:
                    tensor.shape.dim.add().dim_value = v
                continue
            if len(given) != len(dims):
                raise BuildError(
                    f"--shape {name}=...: input {name!r} has {len(dims)} dims, "
                    f"got {len(given)} sizes"
                )
            for d, v in zip(dims, given):
                if d.HasField("dim_value") and d.dim_value != v:
                    raise BuildError(
                        f"--shape {name}=...: the model fixes a dim of {name!r} to {d.dim_value}, "
                        f"not {v}"
                    )
                d.dim_value = v
            continue
        shown = "x".join(
            str(d.dim_value)
            if d.dim_value > 0
            else (d.dim_param or ("0" if d.HasField("dim_value") else "?"))
            for d in dims
        )
        if any(d.HasField("dim_value") and d.dim_value == 0 and not d.dim_param for d in dims):
            raise BuildError(
                f"input {name!r} of {path.name} has a dimension of size 0 ({shown}); a kernel "
                "needs sizes of 1 or more: fix the input's shape in the model"
            )
        dynamic = [
            (d.dim_param or "?") for d in dims if not d.HasField("dim_value") or d.dim_value < 1
        ]
        if dynamic or not inp.type.tensor_type.HasField("shape"):
            example = "x".join(str(d.dim_value) if d.dim_value > 0 else "1" for d in dims)
            raise BuildError(
                f"input {name!r} of {path.name} has dynamic dims ({shown or 'no shape'}); give "
                f"its sizes with --shape {name}=SIZES, e.g. --shape {name}={example or '1x8'}"
            )


@dataclasses.dataclass(frozen=True)
class _Tensors:
    """What shape inference says of the model's tensors."""

    shapes: dict[str, tuple[int, ...]]  # name -> static shape
    dtypes: dict[str, int]  # name -> onnx element type
    consts: frozenset[str]  # initializers and Constant nodes' outputs


def _tensors(model: Any, source: str) -> tuple[_Tensors, str | None]:
    """Shapes and element types of the model's tensors after shape inference, and what strict
    inference said was wrong (None: nothing); the shapes are then the lenient inference's, for
    the importer's own checks to name the node and its shapes, which onnx's message does not."""
    import onnx

    failed = None
    try:
        # data_prop: shapes computed in the graph (Shape -> Gather -> Concat -> Reshape, as
        # PyTorch exports them) become static
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception as e:  # noqa: BLE001 -- onnx raises InferenceError and friends
        failed = " ".join(str(e).split())
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # noqa: BLE001 -- as above
            inferred = model
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, int] = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if tt.elem_type:  # an output declared without a type keeps the inferred one
            dtypes[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in tt.shape.dim)
    consts = {t.name: t for t in g.initializer}
    for i, node in enumerate(g.node):  # Constant nodes are initializers too
        if node.op_type == "Constant":
            if not (node.output and node.output[0]):
                raise BuildError(
                    f"{source}: the Constant node {node.name or f'at position {i + 1}'} has no "
                    "output: the model is invalid, fix or re-export it"
                )
            for a in node.attribute:
                if a.name == "value":
                    consts[node.output[0]] = a.t
    for name, t in consts.items():  # dims and type only: the data is never needed
        shapes[name] = tuple(int(d) for d in t.dims)
        dtypes[name] = t.data_type
    return _Tensors(shapes, dtypes, frozenset(consts)), failed


def _attrs(node: Any, source: str, opsets: dict[str, int]) -> dict[str, Any]:
    """A node's attributes, each of the type the ONNX operator's schema gives it in the model's
    opset (``opsets``: domain -> version): onnx reads a float ``group`` or a text ``beta`` as
    written, and a cast would build another kernel."""
    import onnx

    try:
        schema = onnx.defs.get_schema(node.op_type, opsets.get(node.domain, 1), node.domain)
    except onnx.defs.SchemaError:  # another domain's op, or one its opset does not have
        schema = None
    for a in node.attribute:
        want = schema.attributes.get(a.name) if schema is not None else None
        if want is not None and a.type != want.type:
            got, need = (onnx.AttributeProto.AttributeType.Name(t) for t in (a.type, want.type))
            raise BuildError(
                f"{source}: node {_label(node)} ({node.op_type}) has {a.name} of type {got}; "
                f"ONNX defines it as {need}: the model is invalid, fix or re-export it"
            )
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def c_name(text: str, taken: set[str], prefix: str = DEFAULT_PREFIX) -> str:
    """A C identifier made from an ONNX node name, unique among ``taken`` and outside the
    library's ``prefix``_* names (its runtime's)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text).strip("_")[: MAX_NAME_LENGTH - 8] or "kernel"
    if (
        name[0].isdigit()
        or reserved_name_reason(name) is not None
        or name.lower().startswith(f"{prefix}_")
    ):
        name = f"k_{name}"
    base, i = name, 2
    # unique ignoring case too: the kernels' files (FC.o, fc.o) would clash on macOS's disks
    lowered = {t.lower() for t in taken}
    while name.lower() in lowered:
        name = f"{base}_{i}"
        i += 1
    taken.add(name)
    return name


class _Importer:
    def __init__(self, model: Any, tensors: _Tensors, source: str):
        self.graph = model.graph
        self.shapes, self.dtypes, self.consts = tensors.shapes, tensors.dtypes, tensors.consts
        self.source = source  # the model's file name, for errors
        self.outputs = {o.name for o in model.graph.output}
        # domain -> opset version ('ai.onnx' is the default domain's other name)
        self.opsets = {
            ("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import
        }
        self.readers: dict[str, list[Any]] = {}
        for node in self.graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.producers = {name: node for node in self.graph.node for name in node.output if name}
        self.skipped: list[SkippedOp] = []
        self.consumed: set[int] = set()  # ids of nodes fused into an earlier kernel

    def label(self, node: Any) -> str:
        return _label(node)

    def skip(self, node: Any, reason: str) -> None:
        self.skipped.append(SkippedOp(self.label(node), node.op_type, reason))

    def only_reader(self, tensor: str) -> Any | None:
        """The node that alone reads ``tensor``, when nothing else (no model output) does."""
        readers = self.readers.get(tensor, [])
        if len(readers) != 1 or tensor in self.outputs:
            return None
        return readers[0]

    def onnx_reader(self, tensor: str) -> Any | None:
        """The only reader of ``tensor`` when it is an op of ONNX's own domain (another domain's
        Add or Relu may mean anything)."""
        nxt = self.only_reader(tensor)
        return nxt if nxt is not None and nxt.domain in ("", "ai.onnx") else None

    def fuse(self, node: Any, out_dim: int, bias_ok: bool, bias: bool) -> tuple[Epilogue, list]:
        """The epilogue that follows ``node`` (Add of a length-N constant, then an activation)."""
        fused = []
        tensor = node.output[0]
        nxt = self.onnx_reader(tensor)
        if nxt is not None and nxt.op_type == "Add" and bias_ok and not bias:
            other = [n for n in nxt.input if n != tensor]
            if len(other) == 1 and other[0] in self.consts and self.dtypes.get(other[0]) == FLOAT:
                vec = self.shapes[other[0]]
                if len(vec) >= 1 and vec[-1] == out_dim and math.prod(vec) == out_dim:
                    bias = True
                    fused.append(nxt)
                    tensor = nxt.output[0]
                    nxt = self.onnx_reader(tensor)
        activation = "none"
        if nxt is not None:
            # only a Gelu's attribute is read: another node after the kernel (of an older opset,
            # or another domain) is none of the build's business
            a = _attrs(nxt, self.source, self.opsets) if nxt.op_type == "Gelu" else {}
            if nxt.op_type in ACTIVATIONS:
                activation = ACTIVATIONS[nxt.op_type]
            elif nxt.op_type == "Gelu" and a.get("approximate", b"none") in (b"tanh", "tanh"):
                activation = "gelu"
            if activation != "none":
                fused.append(nxt)
        return Epilogue(bias, activation), fused

    def unfused_reason(self, node: Any) -> str:
        """Why an Add or an activation the build did not fuse was left out, for the report."""
        after = [
            (t, p)
            for t in node.input
            if (p := self.producers.get(t)) is not None
            and (p.op_type in GENERATED_INPUTS or id(p) in self.consumed)
        ]
        if not after:
            return "fused only right after a MatMul, Gemm or Conv (and its fused bias)"
        tensor, kernel = after[0]
        approximate = next((a.s for a in node.attribute if a.name == "approximate"), b"none")
        if node.op_type == "Gelu" and approximate != b"tanh":
            return (
                "a Gelu of the exact (erf) form is not fused: the fused gelu is the tanh form "
                "(approximate = 'tanh')"
            )
        if tensor in self.outputs or len({id(n) for n in self.readers.get(tensor, [])}) > 1:
            what = "a model output" if tensor in self.outputs else "read by another node too"
            return f"not fused: its input {tensor!r} is {what}, so the kernel writes it as it is"
        if node.op_type == "Add":
            return (
                f"an Add after {self.label(kernel)} is fused only as its bias: a float32 constant "
                "with one value per output column (and no bias fused before it)"
            )
        return f"not fused: {self.label(kernel)} before it is generated without an epilogue"

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)

    def unknown_shape(self, node: Any, name: str | None = None, what: str = "shape") -> str:
        """Why ``node`` is skipped when shape inference left an input's shape (or type) open."""
        if name is None:
            name = next((n for n in node.input[:2] if self.shape(n) is None), node.input[0])
        return (
            f"the {what} of {name!r} is unknown after ONNX shape inference (an op before it "
            "whose output it cannot fix, e.g. another domain's or a data-dependent one); record "
            "its type and shape in the model's value_info to build this node"
        )

    def not_float32(self, node: Any) -> str | None:
        """Why ``node`` is not generated when a tensor it reads or writes is not float32 (or
        inference left an input's type unknown)."""
        names = [n for n in node.input if n] + [n for n in node.output[:1] if n]
        untyped = [n for n in names[:2] if n not in self.dtypes]
        if untyped:  # not a wrong type: one inference could not follow
            return self.unknown_shape(node, untyped[0], "type")
        bad = [n for n in names if self.dtypes.get(n) != FLOAT]
        if not bad:
            return None
        shown = ", ".join(f"{n} is {_dtype(self.dtypes.get(n, 0))}" for n in bad[:3])
        return f"not float32 ({shown}); aotune generates float32 kernels only and converts nothing"

    def mismatch(self, node: Any, names: tuple[str, str], why: str) -> BuildError:
        """The error for a node whose weights contradict its input: the node, both shapes."""
        a, b = names
        return BuildError(
            f"{self.source}: node {self.label(node)} ({node.op_type}) reads {a} of shape "
            f"{self.shape(a)} and {b} of shape {self.shape(b)}: {why}; the model is invalid, "
            "fix or re-export it"
        )

    def matmul(self, node: Any) -> Workload | str:
        a, b = (self.shape(n) for n in node.input[:2])
        if a is None or b is None:
            return self.unknown_shape(node)
        if len(a) < 2 or len(b) < 2:
            return f"a 1-D operand ({a} x {b}) is not generated"
        M, K = a[-2], a[-1]
        K2, N = b[-2], b[-1]
        if K != K2:
            raise self.mismatch(node, (node.input[0], node.input[1]), f"inner sizes {K} and {K2}")
        if len(b) == 2:
            return matmul(math.prod(a[:-1]), N, K)
        if a[:-2] == b[:-2]:
            return batch_matmul(math.prod(a[:-2]), M, N, K)
        return f"broadcast batch dims ({a} x {b}) are not generated"

    def gemm(self, node: Any) -> tuple[Workload, bool, bool] | str:
        """(workload, C fused as the bias, C left out) of a Gemm, or why it is not generated."""
        at = _attrs(node, self.source, self.opsets)
        a, b = (self.shape(n) for n in node.input[:2])
        if a is None or b is None:
            return self.unknown_shape(node)
        pair = (node.input[0], node.input[1])
        if len(a) != 2 or len(b) != 2:
            raise self.mismatch(node, pair, "Gemm multiplies two 2-D matrices")
        if float(at.get("alpha", 1.0)) != 1.0:
            return f"alpha = {at['alpha']} (only alpha = 1 is generated)"
        ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
        if {ta, tb} - {0, 1}:
            raise ValueError(f"transA = {ta}, transB = {tb}: each is 0 or 1")
        M, K = (a[1], a[0]) if ta else a
        N, K2 = b if tb else (b[1], b[0])
        if K != K2:
            raise self.mismatch(node, pair, f"inner sizes {K} and {K2} (transA={ta}, transB={tb})")
        w = einsum(
            ("km" if ta else "mk") + "," + ("nk" if tb else "kn") + "->mn",
            {"m": M, "n": N, "k": K},
            op="gemm",
            shape=(("M", M), ("N", N), ("K", K)),
        )
        bias = left_out = False
        if len(node.input) > 2 and node.input[2]:
            c = self.shape(node.input[2])
            # C broadcasts to M x N (ONNX's unidirectional broadcasting), or the model is invalid
            if c is not None and (
                len(c) > 2 or any(d not in (1, full) for d, full in zip(c[::-1], (N, M)))
            ):
                raise self.mismatch(
                    node, (node.input[2], node.output[0]), f"C does not broadcast to {M}x{N}"
                )
            if (
                node.input[2] not in self.consts
                or c is None
                or math.prod(c) != N
                or not c  # a scalar C (0-d) has no last dim: not a bias of length N
                or c[-1] != N
                or float(at.get("beta", 1.0)) != 1.0
            ):
                self.skipped.append(
                    SkippedOp(
                        self.label(node),
                        "Gemm",
                        "its C term is not fused (only a constant bias of length N with beta = 1 "
                        "is); the kernel computes A x B, and no op after the Gemm is fused",
                    )
                )
                left_out = True
            else:
                bias = True
        return w, bias, left_out

    def conv(self, node: Any) -> Workload | str:
        at = _attrs(node, self.source, self.opsets)
        x, wt = (self.shape(n) for n in node.input[:2])
        if x is None or wt is None:
            return self.unknown_shape(node)
        if len(x) != 4:
            return f"only 2-D convolutions are generated (input {x})"
        pair = (node.input[0], node.input[1])
        if len(wt) != 4:
            raise self.mismatch(node, pair, "a 2-D convolution's weights are K x C/group x R x S")
        N, C, H, W = x
        K, Cg, R, S = wt
        group = int(at.get("group", 1))
        # shape inference checks none of these: a wrong weight would build a wrong kernel
        if group < 1 or C % group or K % group:
            raise self.mismatch(
                node, pair, f"group = {group} must divide the {C} input and {K} output channels"
            )
        if Cg * group != C:
            raise self.mismatch(
                node,
                pair,
                f"the input has {C} channels, so with group = {group} the weights need "
                f"{C // group} per group, not {Cg}",
            )
        kernel = tuple(at.get("kernel_shape", (R, S)))
        if kernel != (R, S):
            raise self.mismatch(
                node, pair, f"kernel_shape {list(kernel)} differs from the weights' {R}x{S}"
            )
        if len(node.input) > 2 and node.input[2]:
            bias = self.shape(node.input[2])
            if bias is not None and bias != (K,):
                raise self.mismatch(
                    node,
                    (node.input[1], node.input[2]),
                    f"the bias needs {K} values, one per output channel",
                )
        strides = list(at.get("strides", [1, 1]))
        dil = list(at.get("dilations", [1, 1]))
        pads = list(at.get("pads", [0, 0, 0, 0]))
        auto = at.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
            raise ValueError(f"auto_pad = {auto!r}: NOTSET, VALID, SAME_UPPER or SAME_LOWER")
        if auto == "VALID":
            pads = [0, 0, 0, 0]
        elif auto in ("SAME_UPPER", "SAME_LOWER") and min(strides, default=1) > 0:
            # (a stride of 0 or below keeps the pads: conv2d's own check names it)
            pads = []
            for size, k, s, d in zip((H, W), (R, S), strides, dil):
                total = max(0, (-(-size // s) - 1) * s + d * (k - 1) + 1 - size)
                pads.append((total // 2, total - total // 2))
            pads = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
        if len(set(strides)) != 1 or len(set(dil)) != 1 or len(set(pads)) != 1:
            return f"strides {strides}, dilations {dil}, pads {pads} must each be one value"
        kw = {"stride": strides[0], "pad": pads[0], "dilation": dil[0]}
        try:
            if group == C and K == C and Cg == 1:
                return depthwise_conv2d(N, C, H, W, R, S, **kw)
            return conv2d(N, C, H, W, K, R, S, groups=group, **kw)
        except WorkloadError as e:
            return str(e)

    def run(self) -> list[tuple[Any, Workload, list[Any]]]:
        found = []
        for node in self.graph.node:
            if id(node) in self.consumed or node.op_type == "Constant":
                continue
            op = node.op_type
            if node.domain not in ("", "ai.onnx"):
                self.skip(node, f"an op of domain {node.domain!r}, not ONNX's: not generated")
                continue
            if op in GENERATED_INPUTS and not (
                len([n for n in node.input[:2] if n]) == 2
                and len(node.input) <= GENERATED_INPUTS[op]
            ):
                raise BuildError(
                    f"{self.source}: node {self.label(node)} ({op}) has {len(node.input)} "
                    f"input(s), and {op} takes "
                    f"{'2' if GENERATED_INPUTS[op] == 2 else f'2 or {GENERATED_INPUTS[op]}'}: the "
                    "model is invalid, fix or re-export it"
                )
            if op in GENERATED_INPUTS and not (node.output and node.output[0]):
                raise BuildError(
                    f"{self.source}: node {self.label(node)} ({op}) has no output: the model is "
                    "invalid, fix or re-export it"
                )
            if op not in ("MatMul", "Gemm", "Conv"):
                self.skip(
                    node,
                    self.unfused_reason(node)
                    if op in ("Relu", "Sigmoid", "Gelu", "Add")
                    else "not an op aotune generates",
                )
                continue
            why = self.not_float32(node)
            if why is not None:  # a float32 kernel for float64 data would be silently wrong
                self.skip(node, why)
                continue
            bias, fusable = False, True
            try:
                if op == "MatMul":
                    got = self.matmul(node)
                elif op == "Gemm":
                    got = self.gemm(node)
                    if not isinstance(got, str):
                        # an activation fused after a C left out would apply before C is added
                        got, bias, c_left_out = got
                        fusable = not c_left_out
                else:
                    got = self.conv(node)
            except WorkloadError as e:  # a size of 0 (an empty weight) or past 2^31 - 1
                got = str(e)
            except (TypeError, ValueError, IndexError) as e:  # an attribute of the wrong type
                raise BuildError(
                    f"{self.source}: node {self.label(node)} ({op}) has an attribute of the wrong "
                    f"type or form ({e}); the model is invalid, fix or re-export it"
                ) from None
            if op == "Conv" and not isinstance(got, str):
                if len(node.input) > 2 and node.input[2]:
                    fusable = False  # the bias comes before any activation: neither is fused
                    self.skip(
                        node,
                        "its per-channel bias is not fused (the NCHW output's last dim is a "
                        "pixel, not a channel); the kernel computes the convolution alone",
                    )
            if isinstance(got, str):
                self.skip(node, got)
                continue
            w, fused = got, []
            if fusable:
                out = self.shape(node.output[0]) or (0,)
                # a bias is fused along the output's last dim, which is a channel only for GEMMs
                ep, fused = self.fuse(node, out[-1], op != "Conv", bias)
                if ep.active:
                    w = dataclasses.replace(w, epilogue=ep)
            for n in fused:
                self.consumed.add(id(n))
            found.append((node, w, fused))
        return found


def read_onnx(
    path: Path,
    shapes: dict[str, tuple[int, ...]],
    data: bytes | None = None,
    prefix: str = DEFAULT_PREFIX,
) -> KernelList:
    """The kernels of an ONNX model and the ops it skips, named outside the library's
    ``prefix`` (``data``: the file's bytes, when
    :func:`~aotune.artifact.inputs.read_input` has read them already)."""
    model = _load(path, data)
    _fix_inputs(model, shapes, path)
    tensors, inference_failed = _tensors(model, path.name)
    imp = _Importer(model, tensors, path.name)
    found = imp.run()  # names the node and both shapes where it sees what is wrong
    if inference_failed:
        raise BuildError(
            f"{path.name}: ONNX shape inference failed: {inference_failed[:300]}; the model is "
            "invalid, fix or re-export it"
        )
    by_key: dict[str, int] = {}
    kernels: list[KernelRequest] = []
    taken: set[str] = set()
    for node, w, fused in found:
        names = tuple(imp.label(n) for n in [node, *fused])
        key = workload_key(w)
        if key in by_key:  # the same computation again: one kernel serves both nodes
            i = by_key[key]
            k = kernels[i]
            kernels[i] = dataclasses.replace(
                k, nodes=k.nodes + names, source=f"{k.source}; {', '.join(names)}"
            )
            continue
        name = c_name(node.name or f"{node.op_type.lower()}_{len(kernels)}", taken, prefix)
        by_key[key] = len(kernels)
        kernels.append(KernelRequest(name, w, f"{path.name}: {', '.join(names)}", names))
    if not kernels:
        # the reason a MatMul, Gemm or Conv was skipped says more than the first op's
        why = [s for s in imp.skipped if s.op_type in GENERATED_INPUTS] or imp.skipped
        first = f"; {why[0].node}: {why[0].reason}" if why else ""
        raise BuildError(
            f"{path.name} has no MatMul, Gemm or Conv that aotune generates "
            f"({len(imp.skipped)} ops skipped{first}); nothing to build"
        )
    return KernelList(str(path), tuple(kernels), tuple(imp.skipped))
