"""Stop 95: the wording flaws a bad-input probe found (each message names what is wrong)."""

from __future__ import annotations

import pytest
from aotune.analysis.workload import build_workload
from aotune.artifact.onnx_import import read_onnx
from aotune.cli import main
from aotune.errors import AotuneError, BuildError, WorkloadError
from aotune.files import check_writable


def test_a_file_in_place_of_a_folder_is_named_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(AotuneError, match=r"notes\.txt is not a folder") as e:
        check_writable(tmp_path / "notes.txt" / "child.s", False, AotuneError)
    assert "does not exist" not in str(e.value)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with pytest.raises(AotuneError, match=r"missing does not exist; .* create the folder first"):
        check_writable(tmp_path / "missing" / "child.s", False, AotuneError)


@pytest.mark.parametrize("sep", ["×", "*", ";"])
def test_a_shape_with_another_separator_is_told_to_use_x(sep):
    with pytest.raises(WorkloadError, match=f"with 'x' between them, not '\\{sep}'"):
        build_workload("matmul", sep.join(["64"] * 3))


def test_a_shape_with_no_digits_is_not_told_about_separators():
    with pytest.raises(WorkloadError, match="is not sizes; give 3") as e:
        build_workload("matmul", "abc")
    assert "between" not in str(e.value)


def test_hw_list_says_detected_once(capsys):
    assert main(["hw", "list"]) == 0
    (first,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("host")]
    assert first.count("detected") == 1, first


def test_bytes_that_are_not_onnx_are_not_called_a_model(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(BuildError, match="is not an ONNX model .no ONNX version, opset or graph"):
        read_onnx(tmp_path / "empty.onnx", {})


def test_an_onnx_model_with_no_nodes_is_called_one(tmp_path):
    from onnx import helper, save

    save(helper.make_model(helper.make_graph([], "g", [], [])), str(tmp_path / "none.onnx"))
    with pytest.raises(BuildError, match="is an ONNX model with no nodes in its graph"):
        read_onnx(tmp_path / "none.onnx", {})
