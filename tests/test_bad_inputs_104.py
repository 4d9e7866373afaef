"""Bad input fixed at stop 104 (left open at stop 103): each test failed before."""

from __future__ import annotations

import pytest
from aotune.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # a line break in a path was joined as a space: 'a b.toml' is another file
        (["tune", "--target", "a\nb.toml"], "no spec file a\\nb.toml (no such file)"),
        (["tune", "--target=a\tb.toml"], "no spec file a\\tb.toml (no such file)"),
        # and so was the folder of one
        (["tune", "--emit-asm", "/no\nsuch/x.s"], "/no\\nsuch does not exist"),
        # a non-UTF-8 byte showed as Python's surrogate escape, \udcff
        (["tune", "--target", "a\udcffb.toml"], "no spec file a\\xffb.toml"),
    ],
)
def test_a_path_is_shown_as_typed_with_its_breaks_escaped(capsys, argv, said):
    """The message names the file the user gave, not one with a space where its break was."""
    assert main([*argv, "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "\udcff" not in err and err.count("\n") == 1


def test_a_line_break_in_an_llvm_or_os_message_is_still_joined():
    """Only a value the command line gave is escaped; a message's own lines join as before."""
    from aotune import cli

    cli._given_arguments = ("--target", "x.toml")
    assert cli._one_line("line one\nline two") == "line one line two"


def _reasons(tmp_path, nodes, outputs=("y",)):
    """The build's reason for each ONNX node it skips, by node name: a model of ``nodes`` over a
    4 x 4 input x and a 4 x 4 constant w."""
    import numpy as np
    import onnx
    from aotune.artifact.onnx_import import read_onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in outputs],
        [numpy_helper.from_array(np.eye(4, dtype=np.float32), "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return {s.node: s.reason for s in read_onnx(path, {}).skipped}


def test_an_activation_right_after_a_matmul_says_why_it_was_not_fused(tmp_path):
    """An erf Gelu, a Relu over a model output and an Add of the output to itself, each right
    after a MatMul, were all 'fused only right after a MatMul, Gemm or Conv'."""
    from onnx import helper

    mm = helper.make_node("MatMul", ["x", "w"], ["t"], name="mm")
    gelu = helper.make_node("Gelu", ["t"], ["y"], name="act")
    assert "exact (erf) form" in _reasons(tmp_path, [mm, gelu])["act"]
    relu = helper.make_node("Relu", ["t"], ["y"], name="act")
    said = _reasons(tmp_path, [mm, relu], outputs=("t", "y"))["act"]
    assert "its input 't' is a model output" in said
    twice = helper.make_node("Add", ["t", "t"], ["y"], name="add")
    assert "fused only as its bias" in _reasons(tmp_path, [mm, twice])["add"]
    # an activation after anything else keeps the general reason
    alone = helper.make_node("Relu", ["x"], ["r"], name="act")
    said = _reasons(tmp_path, [alone, mm, helper.make_node("Add", ["t", "r"], ["y"])])["act"]
    assert "fused only right after a MatMul" in said


def test_a_non_utf8_path_reads_the_same_in_a_table_as_in_an_error(tmp_path, capsys):
    """`db list` showed a database in folder b'd\\xffx' as 'd?x', where errors showed it as
    'd\\udcffx': two names for one folder, neither the bytes. Both say 'd\\xffx' now."""
    import os

    folder = os.fsdecode(os.fsencode(str(tmp_path)) + b"/d\xffx")
    os.mkdir(folder)
    db = f"{folder}/t.db"
    argv = ["tune", "matmul", "--shape", "8x8x8", "--target", "haswell", "--budget", "20"]
    assert main([*argv, "--no-verify", "--db", db]) == 0
    capsys.readouterr()
    assert main(["db", "list", "--db", db]) == 0
    assert "d\\xffx/t.db: 1 record" in capsys.readouterr().out
    assert main(["db", "list", "--db", f"{folder}/none.db"]) == 2
    assert "d\\xffx/none.db" in capsys.readouterr().err
