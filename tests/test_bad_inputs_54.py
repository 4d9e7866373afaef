"""Bad inputs found by the probe of stop 54: ONNX models, --shape sizes and einsum specs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from aotune.analysis.workload import einsum
from aotune.artifact.onnx_import import parse_shape_args, read_onnx
from aotune.errors import BuildError, WorkloadError


def _save(path: Path, nodes, inputs, inits, domains=(("", 17),)) -> Path:
    """A model of ``nodes``: ``inputs`` (value infos), ``inits`` {name: array}, one output y."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in domains]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def _x(shape) -> object:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)


def test_gemm_with_a_scalar_c_and_one_column_is_built_without_c(tmp_path):
    """A 0-d C with N = 1 raised IndexError (exit 70): it is left out, as other C terms are."""
    from onnx import helper

    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc")
    inits = {"w": np.ones((8, 1), np.float32), "c": np.array(0.5, np.float32)}
    kl = read_onnx(_save(tmp_path / "m.onnx", [node], [_x([4, 8])], inits), {})
    (k,) = kl.kernels
    assert not k.workload.epilogue.bias  # C is not fused as a bias, nor dropped silently
    assert [(s.node, s.op_type) for s in kl.skipped] == [("fc", "Gemm")]
    assert "its C term is not fused" in kl.skipped[0].reason


@pytest.mark.parametrize(
    "x, w, message",
    [
        ([4, 8], (8, 0), "m: dimension N must be a positive integer, got 0"),
        ([2**31, 8], (8, 6), "m: dimension M = 2147483648 is too large"),
    ],
)
def test_matmul_sizes_aotune_cannot_generate_name_the_node(tmp_path, x, w, message):
    """An empty weight or a size past 2^31 - 1 said only 'dimension N ...', naming no node."""
    from onnx import helper

    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="m")
    path = _save(tmp_path / "m.onnx", [node], [_x(x)], {"w": np.ones(w, np.float32)})
    with pytest.raises(BuildError, match="nothing to build") as e:
        read_onnx(path, {})
    assert message in str(e.value)


@pytest.mark.parametrize("item", ["x=4x\u0668", "x=4x1_6", "x=\uff14x8", "x=+4x8"])
def test_shape_sizes_are_ascii_digits(item):
    """int() read an Arabic-Indic 8 as 8 and '1_6' as 16; --shape takes ASCII digits only."""
    with pytest.raises(BuildError, match="is not name=dims with positive sizes"):
        parse_shape_args([item])
    assert parse_shape_args([" x = 4 x 8 "]) == {"x": (4, 8)}  # spaces around sizes still do


def test_a_sequence_input_needs_no_shape_and_refuses_one(tmp_path, capsys):
    """A sequence input was asked for --shape, which then made it a tensor and inference failed."""
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("SequenceAt", ["s", "i"], ["x"]),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="m"),
    ]
    inputs = [
        helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [4, 8]),
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
    ]
    path = _save(tmp_path / "m.onnx", nodes, inputs, {"w": np.ones((8, 6), np.float32)})
    kl = read_onnx(path, {})
    assert [k.name for k in kl.kernels] == ["m"]
    with pytest.raises(BuildError, match="input 's' of m.onnx is a sequence, not a tensor"):
        read_onnx(path, {"s": (4, 8)})


def test_a_tensor_of_unknown_type_is_named_with_the_fix(tmp_path):
    """After another domain's op, the skip said 'not float32 (x2 is of unknown type)'."""
    from onnx import helper

    nodes = [
        helper.make_node("FastGelu", ["x"], ["x2"], domain="com.microsoft"),
        helper.make_node("MatMul", ["x2", "w"], ["y"], name="m"),
    ]
    path = _save(
        tmp_path / "m.onnx",
        nodes,
        [_x([4, 8])],
        {"w": np.ones((8, 6), np.float32)},
        (("", 17), ("com.microsoft", 1)),
    )
    with pytest.raises(BuildError, match="nothing to build") as e:
        read_onnx(path, {})
    # the MatMul's reason, not the first skipped op's (the FastGelu)
    assert "m: the type of 'x2' is unknown after ONNX shape inference" in str(e.value)
    assert "value_info" in str(e.value)


@pytest.mark.parametrize(
    "spec, reason",
    [
        ("ii->i", "it has 1 input operand(s)"),
        ("ij,jk,kl->il", "it has 3 input operand(s)"),
        ("...ij,jk->...ik", "ellipsis ('...') is not supported"),
        ("...ij,jk", "ellipsis ('...') is not supported"),
        ("ij,j-k", "its output is implicit and it holds more than letters"),
        (" , ", "it names no indices"),
        ("ij jk->ik", "separate the two inputs with ','"),  # numpy reads one operand 'ijjk'
        ("ij,jk->i-k", "not '-'"),
        ("ij,jk->->ik", "more than one '->'"),
        ("ij,jk->ik,", "the output after '->' is one operand"),
        ("i,->i", "an input operand has no indices"),
    ],
)
def test_einsum_specs_out_of_form_say_what_is_wrong(spec, reason):
    """Every such spec said only "is not of the form 'ab,bc->ac'"."""
    with pytest.raises(WorkloadError, match="is not of the form 'ab,bc->ac'") as e:
        einsum(spec, {"i": 4, "j": 4, "k": 4, "l": 4})
    assert reason in str(e.value)


def test_loading_the_shared_object_instead_of_its_directory_says_which_to_give(tmp_path):
    import aotune
    from aotune.errors import LibraryError

    (tmp_path / "manifest.json").write_text("{}")
    so = tmp_path / "libaotune_kernels.so"
    so.write_bytes(b"\x7fELF\x02\x01\x01\xff\xfe")
    with pytest.raises(LibraryError, match=r"not an aotune manifest .*give its directory"):
        aotune.load(so)
    (tmp_path / "manifest.json").write_bytes(b"\xff{")  # the manifest itself, damaged
    with pytest.raises(LibraryError, match="not an aotune manifest") as e:
        aotune.load(tmp_path / "manifest.json")
    assert "give its directory" not in str(e.value)  # its directory holds the same file
    (tmp_path / "manifest.json").unlink()  # a lone non-manifest file: no directory to point to
    with pytest.raises(LibraryError, match="not an aotune manifest") as e:
        aotune.load(so)
    assert "give its directory" not in str(e.value)


def test_a_reshape_to_a_shape_computed_in_the_graph_is_followed(tmp_path):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as PyTorch exports a flatten: the
    MatMul after it has static sizes once inference propagates the computed shape (data_prop)."""
    from onnx import helper

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        helper.make_node("Concat", ["b1", "rest"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["x2"]),
        helper.make_node("MatMul", ["x2", "w"], ["y"], name="mm"),
    ]
    inits = {
        "w": np.ones((64, 32), np.float32),
        "i0": np.array(0, np.int64),
        "ax": np.array([0], np.int64),
        "rest": np.array([-1, 64], np.int64),
    }
    kl = read_onnx(_save(tmp_path / "m.onnx", nodes, [_x([2, 3, 64])], inits), {})
    (k,) = kl.kernels
    # (2, 3, 64) x (64, 32): the batch folds into the rows
    assert k.workload.op == "matmul" and dict(k.workload.shape) == {"M": 6, "N": 32, "K": 64}


@pytest.mark.parametrize(
    "spec, explicit",
    [
        ("ij,jk", "ij,jk->ik"),  # numpy's implicit output: the indices that appear once, sorted
        ("ji,kj", "ji,kj->ik"),
        ("Bj,ja", "Bj,ja->Ba"),  # upper case first, as numpy orders them
        (" i j , j k -> i k ", "ij,jk->ik"),  # numpy drops the spaces
        ("bij,bjk->bik", "bij,bjk->bik"),
    ],
)
def test_einsum_specs_are_read_as_numpy_reads_them(spec, explicit):
    import numpy as np

    dims = {c: 2 + i for i, c in enumerate("abijkB")}
    used = {c: n for c, n in dims.items() if c in explicit}
    assert einsum(spec, used) == einsum(explicit, used)
    ins = explicit.split("->")[0].split(",")
    a, b = (np.ones([used[c] for c in part]) for part in ins)
    assert np.einsum(spec, a, b).shape == tuple(used[c] for c in explicit.split("->")[1])
