"""``aotune build`` inputs and bad input: TOML lists, an ONNX model made with onnx.helper, a
cross build for neoverse-n1, and every bad input of issue 24 as one line + exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from aotune.artifact.inputs import read_toml
from aotune.artifact.onnx_import import read_onnx
from aotune.cli import main
from aotune.errors import BuildError
from aotune.hwspecs.spec import SPEC_DIR

from .c_programs import c_program, write_inputs

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to link the library")
FAST = ["--budget", "16", "--top-k", "1", "--no-verify"]


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    rc = main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def small_cnn(path: Path, batch: int | str = "N") -> None:
    """A small model: Conv+Relu, a depthwise Conv, a strided Conv with a bias, Relu, Flatten,
    Gemm (transB, bias C) + Relu. Inputs x [batch, 3, 8, 8], output y [batch, 10]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def init(name, shape):
        return numpy_helper.from_array(rng.uniform(-0.5, 0.5, shape).astype(np.float32), name)

    inits = [
        init("w1", (8, 3, 3, 3)),
        init("wd", (8, 1, 3, 3)),
        init("w2", (8, 8, 3, 3)),
        init("b2", (8,)),
        init("wg", (10, 128)),
        init("bg", (10,)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "wd"], ["d1"], name="dw", pads=[1, 1, 1, 1], group=8),
        helper.make_node(
            "Conv", ["d1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], name="fc", transB=1),
        helper.make_node("Relu", ["g"], ["y"], name="relu3"),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


# ---- TOML lists -------------------------------------------------------------------------------


def test_toml_list_reads_every_tune_option(tmp_path):
    (tmp_path / "k.toml").write_text(
        """
[[kernel]]
name = "attn"
op = "einsum"
spec = "bij,bkj->bik"
dims = { b = 2, i = 5, j = 7, k = 3 }

[[kernel]]
name = "grouped"
op = "conv2d"
shape = [1, 8, 9, 9, 8, 3, 3]
groups = 2
dilation = 2
pad = 2
layout = "nhwc"
"""
    )
    ks = read_toml(tmp_path / "k.toml").kernels
    assert [k.name for k in ks] == ["attn", "grouped"]
    assert ks[0].workload.shape_dict == {"b": 2, "i": 5, "k": 3, "j": 7}
    assert ks[1].workload.conv.groups == 2 and ks[1].workload.conv.layout == "NHWC"


@pytest.mark.parametrize(
    "body, message",
    [
        ('[[kernel]]\nname = "a"\nop = "softmax"\nshape = "2x2x2"', "unknown operator 'softmax'"),
        ('[[kernel]]\nname = "2fast"\nop = "matmul"', "'2fast' is not a C identifier"),
        ('[[kernel]]\nname = "int"\nop = "matmul"', "'int' is a C keyword"),
        (f'[[kernel]]\nname = "{"k" * 300}"\nop = "matmul"', "300 characters long"),
        ('[[kernel]]\nname = "aotune_x"\nop = "matmul"', "reserved"),
        ('[[kernel]]\nname = "kernels"\nop = "matmul"', "an attribute of the library"),
        ('[[kernel]]\nname = "set_num_threads"\nop = "matmul"', "(lib.set_num_threads)"),
        ('[[kernel]]\nname = "expf"\nop = "matmul"', "is defined by the C library"),
        ('[[kernel]]\nname = "environ"\nop = "matmul"', "is defined by the C library"),
        ('[[kernel]]\nname = "sgemm_"\nop = "matmul"', "is a symbol of BLAS or LAPACK"),
        ('[[kernel]]\nname = "cblas_sgemm"\nop = "matmul"', "is a symbol of BLAS or LAPACK"),
        ('[[kernel]]\nname = "LAPACKE_sgesv"\nop = "matmul"', "is a symbol of BLAS or LAPACK"),
        ('[[kernel]]\nname = "_dll"\nop = "matmul"', "'_dll' starts with _"),
        ('[[kernel]]\nname = "__init__"\nop = "matmul"', "starts with _"),
        ('[[kernel]]\nname = "main"\nop = "matmul"', "the entry point of every C program"),
        ('[[kernel]]\nname = "malloc"\nop = "matmul"', "is defined by the C library"),
        ('[[kernel]]\nname = "size_t"\nop = "matmul"', "a type or macro of the C standard"),
        ('[[kernel]]\nname = "NULL"\nop = "matmul"', "a type or macro of the C standard"),
        # the header then failed to compile beside <math.h> and <pthread.h>
        ('[[kernel]]\nname = "M_PI"\nop = "matmul"', "a type or macro of the C standard"),
        (
            '[[kernel]]\nname = "PTHREAD_MUTEX_INITIALIZER"\nop = "matmul"',
            "a type or macro of the C standard",
        ),
        ('[[kernel]]\nname = "INT32_MAX"\nop = "matmul"', "a type or macro of the C standard"),
        ('[[kernel]]\nname = "SIGINT"\nop = "matmul"', "a type or macro of the C standard"),
        ('[[kernel]]\nname = "class"\nop = "matmul"', "is a C++ keyword"),
        (
            '[[kernel]]\nname = "a"\nop = "matmul"\nshape = "2x2x2"\n'
            '[[kernel]]\nname = "a"\nop = "dense"\nshape = "2x2x2"',
            "'a' is used twice",
        ),
        (  # objects/a.o and objects/A.o are one file on macOS
            '[[kernel]]\nname = "a"\nop = "matmul"\nshape = "2x2x2"\n'
            '[[kernel]]\nname = "A"\nop = "matmul"\nshape = "2x2x2"',
            "differ only in case",
        ),
        # no default sizes: a forgotten shape must not build a 1024x1024x1024 kernel
        ('[[kernel]]\nname = "a"\nop = "matmul"', "kernel 1 (a): missing 'shape'"),
        ('[[kernel]]\nname = "c"\nop = "conv2d"\npad = 1', "kernel 1 (c): missing 'shape'"),
        ('[[kernel]]\nname = "a"\nop = "dense"\nshape = " "', "kernel 1 (a): empty 'shape'"),
        ('[[kernel]]\nname = "a"\nop = "matmul"\nshap = "2x2x2"', "unknown key 'shap'"),
        ('[[kernel]]\nop = "matmul"', "missing 'name'"),
        ('[[kernel]]\nname = "a"\nop = "matmul"\nbias = "yes"', "bias must be true/false"),
        # shown as TOML writes them: true, not Python's True; the element that is not a size
        ('[[kernel]]\nname = "c"\nop = "conv2d"\npad = true', "pad must be an integer, got true"),
        ('[[kernel]]\nname = "a"\nop = "matmul"\nshape = [8, 8, 8.5]', "(8.5 is not an integer"),
        ('[[kernel]]\nname = "a"\nop = "matmul"\nshape = "2x2"', "has 2 sizes"),
        ("title = 'x'", "unknown top-level key 'title'"),
        ("", "lists no kernels"),
        ("[[kernel]\nname=", "is not valid TOML"),
        (
            '[[kernel]]\nname = "a"\nop = "matmul"\nshape = "2x2x2"\nstride = 2',
            "kernel 1 (a): stride applies to conv2d",
        ),
        ('[[kernel]]\nname = "a"\nop = "matmul"\nshape = "2x2x2"\n# \xe9', "not UTF-8 text"),
    ],
)
def test_bad_toml_lists_are_one_line_and_exit_2(tmp_path, capsys, body, message):
    (tmp_path / "k.toml").write_bytes(body.encode("latin-1"))  # \xe9: one byte, not UTF-8
    rc, out, err = run_cli(capsys, "build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "o"))
    assert rc == 2 and out == ""
    assert message in one_error_line(err)
    assert not (tmp_path / "o").exists()  # nothing written


# ---- output directory, compiler, database -----------------------------------------------------


def _list(tmp_path: Path) -> Path:
    p = tmp_path / "k.toml"
    p.write_text('[[kernel]]\nname = "mm"\nop = "matmul"\nshape = "13x40x24"\n')
    return p


def test_output_directory_with_foreign_files_needs_force(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(out), *FAST)
    assert rc == 2 and "holds notes.txt, which was not written by aotune" in one_error_line(err)
    assert "--force" in err and (out / "notes.txt").read_text() == "mine"
    # what --force would replace is said before it is given
    assert "replaces the files of the build's own names: aotune_kernels.h" in err
    (tmp_path / "file").write_text("x")
    rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(tmp_path / "file"))
    assert rc == 2 and "is a file" in one_error_line(err)


@needs_cc
def test_rebuild_replaces_only_its_own_files(tmp_path, capsys):
    out = tmp_path / "out"
    db = str(tmp_path / "t.db")
    assert run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(out), "--db", db, *FAST)[0] == 0
    # a second build into the same directory replaces what the first wrote, without --force
    (tmp_path / "k.toml").write_text(
        '[[kernel]]\nname = "mm2"\nop = "matmul"\nshape = "13x40x24"\n'
    )
    rc, out_text, err = run_cli(
        capsys, "build", str(tmp_path / "k.toml"), "-o", str(out), "--db", db, *FAST
    )
    assert rc == 0, err
    assert not (out / "objects" / "mm.o").exists() and (out / "objects" / "mm2.o").exists()
    # a file of aotune's that the user changed is theirs now
    with (out / "aotune_kernels.h").open("a") as f:
        f.write("/* my edit */\n")
    rc, _, err = run_cli(capsys, "build", str(tmp_path / "k.toml"), "-o", str(out), "--db", db)
    assert rc == 2 and "aotune_kernels.h, which was changed since aotune wrote it" in err
    rc, _, err = run_cli(
        capsys, "build", str(tmp_path / "k.toml"), "-o", str(out), "--db", db, "--force", *FAST
    )
    assert rc == 0, err


def test_no_c_compiler_is_one_line_before_any_search(tmp_path):
    import subprocess

    bindir = tmp_path / "bin"  # a PATH with nothing on it
    bindir.mkdir()
    env = {**os.environ, "PATH": str(bindir)}
    done = subprocess.run(
        [sys.executable, "-m", "aotune", "build", str(_list(tmp_path)), "-o",
         str(tmp_path / "o"), "--db", str(tmp_path / "t.db")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert "no C compiler found" in line and "--objects-only" in line
    rc = subprocess.run(
        [sys.executable, "-m", "aotune", "build", str(_list(tmp_path)), "-o",
         str(tmp_path / "o"), "--cc", "no-such-cc"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert rc.returncode == 2 and "--cc no-such-cc: no such compiler" in rc.stderr


@needs_cc
def test_a_compiler_that_writes_nothing_is_named(tmp_path, capsys):
    """A --cc that compiles but exits 0 without writing the shared object is an error naming
    it, and a shared object an earlier build left is not taken for its output (one that writes
    no object at all is refused before any search: tests/test_build_bad_input.py)."""
    fake = tmp_path / "fakecc"
    fake.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) exit 0;; esac\nexec cc "$@"\n')
    fake.chmod(0o755)
    out = tmp_path / "o"
    args = ["build", str(_list(tmp_path)), "-o", str(out), "--db", str(tmp_path / "t.db")]
    assert run_cli(capsys, *args, "--budget", "8")[0] == 0
    rc, _, err = run_cli(capsys, *args, "--budget", "8", "--cc", str(fake))
    assert rc == 2 and "Traceback" not in err
    assert "wrote no libaotune_kernels.so: is it a C compiler" in err.splitlines()[-1]
    assert (out / "libaotune_kernels.so").is_file()  # the failed build left the last one


@needs_cc
def test_a_damaged_stored_object_is_compiled_again_and_replaced(tmp_path, capsys):
    """A build takes a kernel's object from the database; an entry whose metadata or object was
    damaged (not JSON, not an ELF object) is compiled again and stored anew, not a crash."""
    import sqlite3

    db = tmp_path / "t.db"
    args = ["build", str(_list(tmp_path)), "--db", str(db), "--budget", "8"]
    assert run_cli(capsys, *args, "-o", str(tmp_path / "o1"))[0] == 0
    damage = [
        "UPDATE objects SET meta = 'garbage' WHERE key LIKE 'cpu-kernel|%'",
        "UPDATE objects SET object = X'00112233' WHERE key LIKE 'cpu-kernel|%'",
        "UPDATE objects SET meta = '{}' WHERE key LIKE 'cpu-kernel|%'",
        # the right keys holding the wrong things were an internal error in the header's writer
        """UPDATE objects SET meta = '{"config": 5, "params": "zz", "launch": null}'
           WHERE key LIKE 'cpu-kernel|%'""",
        # an object cut short passed the ELF magic: -o got a 64-byte file, the link failed
        "UPDATE objects SET object = substr(object, 1, 64) WHERE key LIKE 'cpu-kernel|%'",
        "UPDATE objects SET object = substr(object, 1, 64) WHERE key LIKE 'cpu-runtime|%'",
    ]
    whole = (tmp_path / "o1" / "objects" / "mm.o").read_bytes()
    for i, sql in enumerate(damage, 2):
        with sqlite3.connect(db) as conn:
            conn.execute(sql)
        rc, _, err = run_cli(capsys, *args, "-o", str(tmp_path / f"o{i}"))
        assert rc == 0, err
        assert (tmp_path / f"o{i}" / "objects" / "mm.o").read_bytes() == whole
        with sqlite3.connect(db) as conn:
            stored = conn.execute("SELECT key, object, meta FROM objects").fetchall()
        for key, obj, meta in stored:
            assert len(obj) > 64 and obj.startswith(b"\x7fELF"), key
            if key.startswith("cpu-kernel|"):
                assert isinstance(json.loads(meta)["params"], list)


def test_database_from_a_newer_aotune_or_not_a_database(tmp_path, capsys):
    import sqlite3

    newer = tmp_path / "newer.db"
    conn = sqlite3.connect(newer)
    conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', '99')")
    conn.commit()
    conn.close()
    for cmd in (["db", "list"], ["build", str(_list(tmp_path)), "-o", str(tmp_path / "o")]):
        rc, _, err = run_cli(capsys, *cmd, "--db", str(newer))
        assert rc == 2 and "written by a newer aotune (database schema 99" in one_error_line(err)
    junk = tmp_path / "junk.db"
    junk.write_bytes(os.urandom(4096))
    rc, _, err = run_cli(capsys, "db", "list", "--db", str(junk))
    assert rc == 2 and "is not an aotune tuning database" in one_error_line(err)


# ---- ONNX -------------------------------------------------------------------------------------


def test_onnx_model_kernels_and_skipped_ops(tmp_path):
    small_cnn(tmp_path / "m.onnx", batch=2)
    kl = read_onnx(tmp_path / "m.onnx", {})
    names = [k.name for k in kl.kernels]
    assert names == ["conv1", "dw", "conv2", "fc"]
    by = {k.name: k.workload for k in kl.kernels}
    assert by["conv1"].epilogue.activation == "relu"  # Relu fused into the convolution
    assert by["dw"].op == "depthwise_conv2d"
    assert by["conv2"].conv.stride == 2 and not by["conv2"].epilogue.active
    assert by["fc"].epilogue.bias and by["fc"].epilogue.activation == "relu"
    assert [(s.node, s.op_type) for s in kl.skipped] == [
        ("conv2", "Conv"),
        ("relu2", "Relu"),
        ("flatten", "Flatten"),
    ]


def test_onnx_duplicate_shapes_make_one_kernel(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((16, 16), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="layer.0"),
        helper.make_node("MatMul", ["h", "w"], ["y"], name="layer.1"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [w],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    (k,) = read_onnx(tmp_path / "m.onnx", {}).kernels
    assert k.name == "layer_0" and k.nodes == ("layer.0", "layer.1")


def test_onnx_bad_input(tmp_path, capsys):
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x01garbage\xff\xfe" * 10)
    rc, _, err = run_cli(capsys, "build", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "o"))
    assert rc == 2 and "is not an ONNX model" in one_error_line(err)
    small_cnn(tmp_path / "dyn.onnx")
    rc, _, err = run_cli(capsys, "build", str(tmp_path / "dyn.onnx"), "-o", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2 and "input 'x'" in line and "dynamic dims (Nx3x8x8)" in line
    assert "--shape x=" in line
    for shape, text in (
        ("y=1x3x8x8", "--shape names 'y', which is not an input"),
        ("x=1x3x8", "has 4 dims, got 3 sizes"),
        ("x=1x3x9x8", "fixes a dim of 'x' to 8, not 9"),
        ("x", "is not name=dims"),
    ):
        rc, _, err = run_cli(
            capsys, "build", str(tmp_path / "dyn.onnx"), "--shape", shape, "-o", str(tmp_path)
        )
        assert rc == 2 and text in one_error_line(err), (shape, err)


def test_invalid_onnx_graphs_are_refused_and_foreign_ops_skipped(tmp_path):
    """Graphs ONNX itself calls invalid (an op with the wrong number of inputs, a tensor written
    twice, a negative dimension) are one-line errors, not internal errors or kernels; an op of
    another domain than ONNX's is skipped, not generated as ONNX's; an input without a shape
    takes the --shape its error asks for."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def value(name: str, shape) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    w4x5 = numpy_helper.from_array(np.zeros((4, 5), np.float32), "w")

    def save(name: str, nodes, inputs, inits=(w4x5,), domains=()) -> Path:
        graph = helper.make_graph(nodes, "g", inputs, [value("y", None)], list(inits))
        opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
        path = tmp_path / name
        path.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
        return path

    mm = helper.make_node
    cases = [
        (save("one.onnx", [mm("MatMul", ["x"], ["y"])], [value("x", [2, 4])]), "takes 2:"),
        (save("three.onnx", [mm("MatMul", ["x", "w", "w"], ["y"])], [value("x", [2, 4])]),
         "has 3 input(s)"),
        (save("twice.onnx", [mm("MatMul", ["x", "w"], ["y"], name="a"),
                             mm("MatMul", ["x", "w"], ["y"], name="b")], [value("x", [2, 4])]),
         "written by node a and by node b"),
        (save("neg.onnx", [mm("MatMul", ["x", "w"], ["y"])], [value("x", [-3, 4])]),
         "negative dimension (-3)"),
    ]  # fmt: skip
    for path, text in cases:
        with pytest.raises(BuildError, match=re.escape(text)):
            read_onnx(path, {})
    dyn = save("dyn.onnx", [mm("MatMul", ["x", "w"], ["y"])], [value("x", ["B", 4])])
    with pytest.raises(BuildError, match="too large"):
        read_onnx(dyn, {"x": (2**40, 4)})
    foreign = save(
        "foreign.onnx", [mm("MatMul", ["x", "w"], ["y"], domain="com.example")],
        [value("x", [2, 4])], domains=["com.example"],
    )  # fmt: skip
    with pytest.raises(BuildError, match="domain 'com.example', not ONNX's"):
        read_onnx(foreign, {})
    shapeless = save(
        "shapeless.onnx", [mm("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
    )  # fmt: skip
    with pytest.raises(BuildError, match="--shape x="):
        read_onnx(shapeless, {})
    (k,) = read_onnx(shapeless, {"x": (2, 4)}).kernels
    assert dict(k.workload.shape) == {"M": 2, "N": 5, "K": 4}


def test_onnx_ops_after_a_gemm_are_fused_only_where_the_result_stays_onnxs(tmp_path):
    """A Relu after a Gemm whose C term is left out would run before C is added, and another
    domain's Add or Relu may mean anything: neither is fused, and each is reported skipped. A node
    named like an attribute of the loaded library gets a name it can be called by."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    def save(name: str, nodes, inits, domains=()) -> Path:
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            inits,
        )
        opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
        path = tmp_path / name
        path.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
        return path

    w = numpy_helper.from_array(np.ones((8, 16), np.float32), "w")
    full_c = numpy_helper.from_array(np.ones((4, 16), np.float32), "c")
    vec_c = numpy_helper.from_array(np.ones(16, np.float32), "c")
    mk = helper.make_node
    unfused = [
        save("c.onnx", [mk("Gemm", ["x", "w", "c"], ["g"], name="fc"),
                        mk("Relu", ["g"], ["y"], name="act")], [w, full_c]),
        save("beta.onnx", [mk("Gemm", ["x", "w", "c"], ["g"], name="fc", beta=0.5),
                           mk("Relu", ["g"], ["y"], name="act")], [w, vec_c]),
    ]  # fmt: skip
    for path in unfused:
        got = read_onnx(path, {})
        (k,) = got.kernels
        assert not k.workload.epilogue.active, path.name
        assert {s.node for s in got.skipped} == {"fc", "act"}
    fused = save("fused.onnx", [mk("Gemm", ["x", "w", "c"], ["g"], name="fc"),
                                mk("Relu", ["g"], ["y"], name="act")], [w, vec_c])  # fmt: skip
    (k,) = read_onnx(fused, {}).kernels
    assert k.workload.epilogue.bias and k.workload.epilogue.activation == "relu"
    foreign = save(
        "foreign.onnx",
        [mk("MatMul", ["x", "w"], ["m"], name="mm"),
         mk("Add", ["m", "c"], ["s"], name="add", domain="com.example"),
         mk("Relu", ["s"], ["y"], name="act", domain="com.example")],
        [w, vec_c], domains=["com.example"],
    )  # fmt: skip
    got = read_onnx(foreign, {})
    assert not got.kernels[0].workload.epilogue.active
    assert {s.node for s in got.skipped} == {"add", "act"}
    for attr in ("kernels", "target", "num_threads", "main"):
        named = save(f"{attr}.onnx", [mk("MatMul", ["x", "w"], ["y"], name=attr)], [w])
        (k,) = read_onnx(named, {}).kernels
        assert k.name == f"k_{attr}"


@needs_cc
def test_onnx_model_builds_and_matches_the_onnx_reference(tmp_path, capsys):
    """The built kernels, composed with numpy for the ops aotune skips, compute what the ONNX
    reference evaluator computes for the whole model."""
    import aotune
    from onnx.reference import ReferenceEvaluator

    small_cnn(tmp_path / "m.onnx")
    rc, out, err = run_cli(
        capsys, "build", str(tmp_path / "m.onnx"), "--shape", "x=2x3x8x8", "-o",
        str(tmp_path / "lib"), "--db", str(tmp_path / "t.db"), "--jobs", "1", *FAST, "--json",
    )  # fmt: skip
    assert rc == 0, err
    report = json.loads(out)
    assert [k["name"] for k in report["kernels"]] == ["conv1", "dw", "conv2", "fc"]
    assert [s["node"] for s in report["skipped"]] == ["conv2", "relu2", "flatten"]
    assert all(k["check"]["correct"] for k in report["kernels"])
    rc, text, _ = run_cli(
        capsys, "build", str(tmp_path / "m.onnx"), "--shape", "x=2x3x8x8", "-o",
        str(tmp_path / "lib"), "--db", str(tmp_path / "t.db"), *FAST,
    )  # fmt: skip
    assert rc == 0 and "not generated by aotune" in text and "Flatten" in text

    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(tmp_path / "m.onnx"))
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x = np.random.default_rng(3).uniform(-1, 1, (2, 3, 8, 8)).astype(np.float32)
    lib = aotune.load(tmp_path / "lib")
    h = lib.conv1(x, w["w1"])  # + relu, fused
    h = lib.dw(h, w["wd"].reshape(8, 1, 3, 3))
    h = lib.conv2(h, w["w2"]) + w["b2"].reshape(1, 8, 1, 1)  # the bias aotune skipped
    h = np.maximum(h, 0).reshape(2, 128)  # Relu and Flatten: skipped
    y = lib.fc(np.ascontiguousarray(h, dtype=np.float32), w["wg"], w["bg"])
    (ref,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(y, ref, atol=1e-4)
    lib.shutdown()


# ---- cross-target ------------------------------------------------------------------------------


def test_neoverse_n1_build_from_x86_gives_aarch64_objects_and_header(tmp_path, capsys):
    rc, out, err = run_cli(
        capsys, "build", str(_list(tmp_path)), "--target", "neoverse-n1", "-o",
        str(tmp_path / "arm"), "--db", str(tmp_path / "t.db"), "--budget", "16", "--json",
    )  # fmt: skip
    assert rc == 0, err
    report = json.loads(out)
    objs = sorted((tmp_path / "arm" / "objects").glob("*.o"))
    assert [o.name for o in objs] == ["aotune_runtime.o", "mm.o"]
    for o in objs:
        head = o.read_bytes()[:20]
        # ELF magic, 64-bit, little-endian, relocatable (1), machine EM_AARCH64 (183)
        assert head[:4] == b"\x7fELF" and head[4] == 2 and head[5] == 1
        assert struct.unpack_from("<HH", head, 16) == (1, 183)
    assert (
        "int mm(const float *a, const float *b, float *c);"
        in (tmp_path / "arm" / "aotune_kernels.h").read_text()
    )
    # the final check ran under qemu where it is installed (correct or not, never timed)
    if report["check_skipped"] is None:
        assert report["kernels"][0]["measured_seconds"] is None
    else:
        assert report["check_skipped"].startswith("target neoverse-n1 is aarch64")
    assert report["library_check"] == "not run: the library is aarch64, this host is x86_64"
    manifest = json.loads((tmp_path / "arm" / "manifest.json").read_text())
    assert manifest["target"]["arch"] == "aarch64"
    if shutil.which("aarch64-linux-gnu-gcc"):  # cross tools installed: the library is linked
        so = (tmp_path / "arm" / "libaotune_kernels.so").read_bytes()[:20]
        assert struct.unpack_from("<H", so, 18) == (183,)
    else:
        assert any("no a C compiler" in n or "cross tools" in n for n in report["notes"])
    import aotune
    from aotune.errors import LibraryError

    with pytest.raises(LibraryError, match="built for neoverse-n1 .aarch64."):
        aotune.load(tmp_path / "arm")


def test_read_input_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(BuildError, match="does not exist"):
        from aotune.artifact.inputs import read_input

        read_input(tmp_path / "missing.toml")


@pytest.mark.skipif(
    not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")),
    reason="needs the aarch64-linux-gnu cross tools and qemu-aarch64",
)
def test_neoverse_n1_library_runs_under_qemu(tmp_path, capsys):
    """Built from x86 for neoverse-n1, linked into a static AArch64 C program, run under qemu:
    every kernel (the runtime's threads included) matches numpy."""
    import subprocess

    from aotune.artifact.backends import numpy_reference

    (tmp_path / "k.toml").write_text(
        '[[kernel]]\nname = "ffn"\nop = "dense"\nshape = "24x40x33"\nbias = true\n'
        'activation = "gelu"\n[[kernel]]\nname = "conv"\nop = "conv2d"\n'
        'shape = "1,8,9,9,16,3,3"\npad = 1\n'
    )
    rc, _, err = run_cli(
        capsys, "build", str(tmp_path / "k.toml"), "--target", "neoverse-n1", "-o",
        str(tmp_path / "arm"), "--db", str(tmp_path / "t.db"), "--budget", "16", "--top-k", "1",
    )  # fmt: skip
    assert rc == 0, err
    out = tmp_path / "arm"
    manifest = json.loads((out / "manifest.json").read_text())
    inputs = write_inputs(tmp_path, manifest)
    (tmp_path / "prog.c").write_text(c_program(manifest))
    subprocess.run(
        ["aarch64-linux-gnu-gcc", "-static", "-std=c99", f"-I{out}", "prog.c", "-o", "prog",
         str(out / "libaotune_kernels.a"), *manifest["link_flags"].split()],
        cwd=tmp_path, check=True,
    )  # fmt: skip
    run = subprocess.run(
        ["qemu-aarch64", "./prog"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "null: 1 a pointer argument is NULL" in run.stdout
    for req in read_toml(tmp_path / "k.toml").kernels:
        got = np.fromfile(tmp_path / f"{req.name}.out.bin", dtype=np.float32)
        ref = numpy_reference(req.workload, inputs[req.name])
        assert np.abs(got.reshape(ref.shape) - ref).max() < 1e-4, req.name


def test_onnx_matmul_and_gemm_forms_mean_what_onnx_means(tmp_path):
    """Each mapped node's workload, evaluated by numpy on the node's inputs, equals the ONNX
    reference evaluator's output for the node and the epilogue fused into it."""
    import onnx
    from aotune.artifact.backends import numpy_reference
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(5)
    cases = [  # (nodes, inputs {name: shape}, initializers {name: shape}, output shape)
        (
            [helper.make_node("Gemm", ["a", "b", "c"], ["g"], transA=1),
             helper.make_node("Sigmoid", ["g"], ["y"])],
            {"a": (7, 5)}, {"b": (7, 6), "c": (6,)}, (5, 6),
        ),
        (
            [helper.make_node("MatMul", ["a", "b"], ["m"]),
             helper.make_node("Add", ["m", "c"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])],
            {"a": (2, 3, 5)}, {"b": (5, 4), "c": (4,)}, (2, 3, 4),
        ),
        (
            [helper.make_node("MatMul", ["a", "b"], ["y"])],
            {"a": (3, 4, 5), "b": (3, 5, 2)}, {}, (3, 4, 2),
        ),
        (
            [helper.make_node("Conv", ["a", "b"], ["c1"], strides=[2, 2], dilations=[1, 1],
                              auto_pad="SAME_UPPER"),
             helper.make_node("Relu", ["c1"], ["y"])],
            {"a": (1, 3, 9, 9)}, {"b": (4, 3, 3, 3)}, (1, 4, 5, 5),
        ),
    ]  # fmt: skip
    for i, (nodes, ins, inits, out_shape) in enumerate(cases):
        values = {n: rng.uniform(-1, 1, s).astype(np.float32) for n, s in {**ins, **inits}.items()}
        graph = helper.make_graph(
            nodes,
            f"g{i}",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in ins.items()],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
            [numpy_helper.from_array(values[n], n) for n in inits],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.save(model, str(tmp_path / f"m{i}.onnx"))
        (k,) = read_onnx(tmp_path / f"m{i}.onnx", {}).kernels
        (ref,) = ReferenceEvaluator(model).run(None, {n: values[n] for n in ins})
        args = [values[n] for n in nodes[0].input[:2]]
        if k.workload.epilogue.bias:
            args.append(values["c"])
        w = k.workload
        shapes = [w.tensor(acc.tensor).shape for acc in w.statement.inputs]
        shapes += [(w.tensor(w.statement.output.tensor).shape[-1],)]  # the bias, if any
        ours = numpy_reference(w, [x.reshape(shape) for x, shape in zip(args, shapes)])
        np.testing.assert_allclose(ours.reshape(ref.shape), ref, atol=1e-5, err_msg=str(i))


def _ptxas() -> bool:
    from aotune.codegen.cuda_tools import tool_path
    from aotune.errors import AotuneError

    try:
        tool_path("ptxas")
    except AotuneError:
        return False
    return True


@pytest.mark.skipif(not _ptxas(), reason="ptxas (NVIDIA's wheel) is not installed")
def test_gpu_build_writes_ptx_cubin_and_a_launch_manifest(tmp_path, capsys):
    rc, out, err = run_cli(
        capsys, "build", str(_list(tmp_path)), "--target", "a100", "-o", str(tmp_path / "g"),
        "--db", str(tmp_path / "t.db"), "--budget", "16", "--top-k", "1", "--json",
    )  # fmt: skip
    assert rc == 0, err
    report = json.loads(out)
    (k,) = report["kernels"]
    assert k["check"]["correct"]  # the written kernel's code, emulated on this CPU
    g = tmp_path / "g"
    manifest = json.loads((g / "manifest.json").read_text())
    assert manifest["target"]["sm"] == "sm_80" and manifest["target"]["kind"] == "gpu"
    (entry,) = manifest["kernels"]
    assert entry["entry"] == "mm" and ".entry mm(" in (g / entry["ptx"]).read_text()
    cubin = (g / entry["cubin"]).read_bytes()
    assert cubin[:4] == b"\x7fELF" and struct.unpack_from("<H", cubin, 18) == (190,)  # EM_CUDA
    launch = entry["launch"]
    assert len(launch["grid"]) == 3 and len(launch["block"]) == 3
    assert launch["registers"] > 0 and "dynamic_shared_bytes" in launch
    assert [p["role"] for p in entry["params"]] == ["in0", "in1", "out"]
    assert sorted(entry["kernel_args"]) == ["bias", "in0", "in1", "out"]
    assert set(manifest["files"]) == {entry["ptx"], entry["cubin"]}
    import aotune
    from aotune.codegen.cuda_device import device_available
    from aotune.errors import LibraryError
    from aotune.hwspecs.spec import load_target

    if not device_available(load_target("a100"))[0]:
        with pytest.raises(LibraryError, match="cannot run here: no"):
            aotune.load(g)
    # the cubin records what it was built for; a manifest edited after the build is refused,
    # here as where a GPU is (a swapped argument order or another grid: silently wrong output)
    from aotune.artifact.load import GPU_INTERFACE_SYMBOL, elf_symbol_bytes, gpu_record_words

    record = elf_symbol_bytes(cubin, GPU_INTERFACE_SYMBOL.format(name="mm"))
    assert record is not None and list(struct.unpack(f"<{len(record) // 8}q", record)) == (
        gpu_record_words(
            [(p["role"], p["shape"]) for p in entry["params"]],
            entry["kernel_args"],
            launch["grid"],
            launch["block"],
            launch["dynamic_shared_bytes"],
        )
    )

    # a cubin built before the record has none: nothing to check, it loads as before
    assert elf_symbol_bytes(cubin, "aotune_interface_other") is None
    assert elf_symbol_bytes(cubin[:100], "aotune_interface_mm") is None
    assert elf_symbol_bytes(b"not an object", "aotune_interface_mm") is None

    def swap_args(e: dict) -> None:
        e["kernel_args"][:2] = e["kernel_args"][1::-1]

    def grow_grid(e: dict) -> None:
        e["launch"]["grid"][0] += 1

    def drop_block(e: dict) -> None:
        del e["launch"]["block"]

    def in1_as_bias(e: dict) -> None:  # B would get a 4-byte device buffer
        next(p for p in e["params"] if p["role"] == "in1")["role"] = "bias"

    def listed_arg(e: dict) -> None:
        e["kernel_args"][0] = ["in0"]

    for name, change, says in [
        ("args", swap_args, "is not what mm.cubin was built for"),
        ("grid", grow_grid, "is not what mm.cubin was built for"),
        ("block", drop_block, "a GPU kernel needs entry and cubin"),
        ("role", in1_as_bias, "is not what mm.cubin was built for"),
        ("arg", listed_arg, "a GPU kernel needs entry and cubin"),
    ]:
        edited = tmp_path / f"edited-{name}"
        shutil.copytree(g, edited)
        m = json.loads((edited / "manifest.json").read_text())
        change(m["kernels"][0])
        (edited / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(LibraryError, match=says):
            aotune.load(edited)
    # every kernel entry removed: refused, not a library of nothing; a hashed cubin no entry
    # names (another kernel's, its entry removed): refused by name
    for name, change, says in [
        ("none", lambda m: m.update(kernels=[]), "lists no kernels"),
        (
            "unlisted",
            lambda m: m["files"].update({"cubin/gone.cubin": "0" * 64}),
            "hashes 'cubin/gone.cubin', a kernel's file, and no kernel entry names it",
        ),
    ]:
        shutil.copytree(g, tmp_path / name)
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        change(m)
        (tmp_path / name / "manifest.json").write_text(json.dumps(m))
        with pytest.raises(LibraryError, match=says):
            aotune.load(tmp_path / name)


# ---- bad input a probe found: one line, exit 2, nothing written, nothing lost -------------------


def test_build_input_is_a_regular_file_of_bounded_size(tmp_path, capsys, monkeypatch):
    from aotune.artifact import inputs

    rc, _, err = run_cli(capsys, "build", "/dev/null", "-o", str(tmp_path / "o"))
    assert rc == 2 and "/dev/null is not a regular file" in one_error_line(err)  # /dev/zero too
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 120_000)  # 1.2 MB: more than a kernel list may have
    rc, _, err = run_cli(capsys, "build", str(big), "-o", str(tmp_path / "o"))
    assert rc == 2 and "is 1200000 bytes, more than the 1048576" in one_error_line(err)
    monkeypatch.setattr(inputs, "ONNX_LIMIT", 1000)  # 2 GiB in the real thing
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07" * 1000)
    rc, _, err = run_cli(capsys, "build", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o"))
    assert rc == 2 and "ONNX model" in err and "more than the 1000" in one_error_line(err)
    assert not (tmp_path / "o").exists()


def test_output_directory_that_cannot_be_written_fails_before_any_search(
    tmp_path, capsys, monkeypatch
):
    import aotune.artifact.build as build_module

    def no_search(*args, **kwargs):
        raise AssertionError("searched before the output directory was checked")

    monkeypatch.setattr(build_module, "run_searches", no_search)
    (tmp_path / "mine.s").write_text("mine")
    cases = [(tmp_path / "mine.s" / "sub", "mine.s is a file, not a directory")]
    if Path("/proc/self").exists():
        cases.append((Path("/proc/aotune-test"), "cannot create it in /proc"))
    if Path("/sys/kernel").is_dir():
        cases.append((Path("/sys/kernel/aotune-test"), "cannot create it in /sys/kernel"))
    for out, text in cases:
        rc, _, err = run_cli(
            capsys, "build", str(_list(tmp_path)), "-o", str(out), "--db",
            str(tmp_path / "t.db"), *FAST,
        )  # fmt: skip
        assert rc == 2 and text in one_error_line(err), (out, err)
    assert (tmp_path / "mine.s").read_text() == "mine"


@needs_cc
def test_failed_build_leaves_the_output_directory_as_it_was(tmp_path, capsys, monkeypatch):
    db = ["--db", str(tmp_path / "t.db"), *FAST]
    # a compiler that compiles but fails to link (a plain `false` is refused before any search)
    false = tmp_path / "linkfails"
    false.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) exit 1;; esac\nexec cc "$@"\n')
    false.chmod(0o755)
    false = str(false)
    # a new directory: not there after a failed link
    new = tmp_path / "x1"
    rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(new), "--cc", false, *db)
    assert rc == 2 and "failed to make libaotune_kernels.so" in err.splitlines()[-1]
    assert not new.exists()
    # the same build done right is not blamed on the user
    rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(new), *db)
    assert rc == 0, err

    def files(d: Path) -> dict[str, bytes]:
        return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}

    before = files(new)
    (tmp_path / "k.toml").write_text('[[kernel]]\nname = "mm2"\nop = "matmul"\nshape = "9x8x7"\n')
    k2 = str(tmp_path / "k.toml")
    rc, _, err = run_cli(capsys, "build", k2, "-o", str(new), "--cc", false, *db)
    assert rc == 2 and files(new) == before  # an earlier build's library: kept whole
    from aotune.artifact.backends import CpuBackend
    from aotune.cli import EXIT_INTERRUPTED

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # Ctrl-C after every file was written, before installing
        m.setattr(CpuBackend, "check", interrupted)
        rc, _, _ = run_cli(capsys, "build", k2, "-o", str(new), *db)
    assert rc == EXIT_INTERRUPTED and files(new) == before
    rc, _, err = run_cli(capsys, "build", k2, "-o", str(new), *db)
    assert rc == 0, err
    assert (new / "objects" / "mm2.o").exists() and not (new / "objects" / "mm.o").exists()
    assert not [p for p in tmp_path.rglob("*") if "aotune-partial" in p.name]  # no staging left


def _onnx_model(path: Path, nodes, inputs, inits, dtype=None) -> None:
    """A model of ``nodes``: ``inputs`` {name: shape} (float32 unless ``dtype`` says), ``inits``
    {name: array}, one output y."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = {n: (dtype or {}).get(n, TensorProto.FLOAT) for n in inputs}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, elem[n], s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in ("y",)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def _ones(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


@pytest.mark.parametrize(
    "attrs, x, inits, message",
    [
        ({}, (1, 5, 8, 8), {"w": _ones(4, 4, 3, 3)},
         "the input has 5 channels, so with group = 1 the weights need 5 per group, not 4"),
        ({"group": 2}, (1, 4, 8, 8), {"w": _ones(4, 4, 3, 3)}, "weights need 2 per group, not 4"),
        ({"group": 3}, (1, 6, 8, 8), {"w": _ones(4, 2, 3, 3)}, "group = 3 must divide"),
        ({"kernel_shape": [5, 5]}, (1, 4, 8, 8), {"w": _ones(4, 4, 3, 3)},
         "kernel_shape [5, 5] differs from the weights' 3x3"),
        ({}, (1, 4, 8, 8), {"w": _ones(4, 4, 3, 3), "b": _ones(5)}, "the bias needs 4 values"),
    ],
)  # fmt: skip
def test_onnx_conv_weights_that_contradict_the_input_are_an_error(
    tmp_path, capsys, attrs, x, inits, message
):
    from onnx import helper

    node = helper.make_node("Conv", ["x", *inits], ["y"], name="conv.7", **attrs)
    _onnx_model(tmp_path / "m.onnx", [node], {"x": x}, inits)
    rc, _, err = run_cli(capsys, "build", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2 and "node conv.7 (Conv)" in line and message in line
    shapes = [x, *(a.shape for a in inits.values())]
    assert sum(f"of shape {s}" in line for s in shapes) == 2  # both shapes that disagree
    assert not (tmp_path / "o").exists()


def test_onnx_gemm_c_that_does_not_broadcast_is_an_error(tmp_path):
    from onnx import helper

    inits = {"w": _ones(8, 3), "c": _ones(2, 3)}
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="fc")
    _onnx_model(tmp_path / "m.onnx", [node], {"x": (4, 8)}, inits)
    with pytest.raises(BuildError, match=r"node fc \(Gemm\).*\(2, 3\).*does not broadcast to 4x3"):
        read_onnx(tmp_path / "m.onnx", {})


def test_onnx_matmul_whose_inner_sizes_differ_names_the_node_and_both_shapes(tmp_path):
    """Strict shape inference refuses the model first, and its message names neither the node
    nor the shapes: the importer's own check, on the lenient inference's shapes, does."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (8, 8))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],  # typed, as exporters do
        [numpy_helper.from_array(_ones(7, 8), "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "m.onnx"))  # fmt: skip
    with pytest.raises(BuildError, match=r"m.onnx: node proj \(MatMul\) reads x of shape \(8, 8\) "
                       r"and w of shape \(7, 8\): inner sizes 8 and 7"):  # fmt: skip
        read_onnx(tmp_path / "m.onnx", {})
    # what only onnx's inference sees is still refused, with the file named
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="c0", strides=[0, 0])
    _onnx_model(tmp_path / "s.onnx", [conv], {"x": (1, 4, 8, 8)}, {"w": _ones(4, 4, 3, 3)})
    with pytest.raises(BuildError, match=r"s.onnx: ONNX shape inference failed: .*strides"):
        read_onnx(tmp_path / "s.onnx", {})
    # a zero stride with SAME padding reaches aotune's pad arithmetic first: refused the same way
    for auto, strides in (("SAME_UPPER", [0, 0]), ("SAME_LOWER", [1, 0])):
        same = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, auto_pad=auto)
        graph = helper.make_graph(
            [same],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 8, 8))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(_ones(4, 4, 3, 3), "w")],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                  str(tmp_path / "z.onnx"))  # fmt: skip
        with pytest.raises(BuildError, match=r"z.onnx: ONNX shape inference failed: .*strides"):
            read_onnx(tmp_path / "z.onnx", {})


def test_onnx_ops_that_are_not_float32_are_skipped_not_converted(tmp_path):
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm32"),
        helper.make_node("MatMul", ["x64", "w64"], ["y64"], name="mm64"),
    ]
    inits = {"w": _ones(8, 3), "w64": np.ones((8, 3), np.float64)}
    inputs = {"x": (4, 8), "x64": (4, 8)}
    _onnx_model(tmp_path / "m.onnx", nodes, inputs, inits, {"x64": TensorProto.DOUBLE})
    kl = read_onnx(tmp_path / "m.onnx", {})
    assert [k.name for k in kl.kernels] == ["mm32"]
    ((node, op, reason),) = [(s.node, s.op_type, s.reason) for s in kl.skipped]
    assert (node, op) == ("mm64", "MatMul")
    assert "x64 is float64" in reason and "aotune generates float32 kernels" in reason
    # nothing float32 at all: the error says why, not a float32 kernel for float64 data
    _onnx_model(tmp_path / "d.onnx", nodes[1:], {"x64": (4, 8)}, {"w64": inits["w64"]},
                {"x64": TensorProto.DOUBLE})  # fmt: skip
    with pytest.raises(BuildError, match="nothing to build") as e:
        read_onnx(tmp_path / "d.onnx", {})
    assert "mm64: not float32 (x64 is float64" in str(e.value)


def test_shape_given_twice_with_different_sizes_is_an_error(tmp_path, capsys):
    from aotune.artifact.onnx_import import parse_shape_args

    assert parse_shape_args(["x=4x8", "x=4,8"]) == {"x": (4, 8)}  # the same sizes: no doubt
    small_cnn(tmp_path / "dyn.onnx")
    rc, _, err = run_cli(
        capsys, "build", str(tmp_path / "dyn.onnx"), "--shape", "x=1x3x8x8", "--shape",
        "x=2x3x8x8", "-o", str(tmp_path / "o"),
    )  # fmt: skip
    line = one_error_line(err)
    assert rc == 2 and "input 'x' twice, as 1x3x8x8 and 2x3x8x8" in line


def test_a_long_onnx_node_name_makes_a_name_that_fits_a_file_name():
    from aotune.artifact.inputs import MAX_NAME_LENGTH, check_c_name
    from aotune.artifact.onnx_import import c_name

    taken: set[str] = set()
    names = [c_name("n" * 400, taken) for _ in range(3)]
    assert len(set(names)) == 3
    assert all(len(n) <= MAX_NAME_LENGTH and check_c_name(n, "x") == n for n in names)


def test_onnx_zero_dims_and_undefined_tensors_are_named(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")

    def save(name, x_shape, reads):
        node = helper.make_node("MatMul", [reads, "w"], ["y"], name="mm")
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [w],
        )
        onnx.save(helper.make_model(graph), str(tmp_path / name))
        return str(tmp_path / name)

    rc, _, err = run_cli(capsys, "build", save("zero.onnx", [0, 8], "x"), "-o", str(tmp_path / "o"))
    line = one_error_line(err)
    assert rc == 2 and "has a dimension of size 0 (0x8)" in line and "dynamic" not in line
    rc, _, err = run_cli(capsys, "build", save("hole.onnx", [4, 8], "nowhere"), "-o", str(tmp_path))
    line = one_error_line(err)
    assert rc == 2 and "node mm reads 'nowhere', which no input" in line


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--objects-only", "--cc", "gcc"], ["--cc gcc", "--objects-only links nothing"]),
        (["--target", "h100", "--cc", "gcc"], ["--cc applies to CPU libraries", "leave out --cc"]),
        (["--target", "h100", "--objects-only"], ["--objects-only applies to CPU libraries"]),
    ],
)
def test_library_options_that_would_be_ignored_are_refused_before_any_search(
    tmp_path, capsys, flags, needles
):
    out = tmp_path / "o"
    db = ["--db", str(tmp_path / "t.db")]
    rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(out), *flags, *db)
    assert rc == 2 and all(n in one_error_line(err) for n in needles)
    assert not out.exists()


@needs_cc
def test_inputs_inside_the_output_directory_are_never_replaced(tmp_path, capsys):
    """build --force replaced the kernel list, the database or the spec when they sat in -o
    under the name of a file it writes; and a --db inside a new -o was made there, then the
    folder refused for holding it. Without --force an input in -o is refused before anything
    is made; with it, the install stops (nothing moved) where a file would replace an input."""
    new = tmp_path / "new"
    rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(new), "--db",
                         str(new / "x.db"))  # fmt: skip
    assert rc == 2 and f"the tuning database {new / 'x.db'} is inside -o" in one_error_line(err)
    assert not new.exists()
    out = tmp_path / "out"
    out.mkdir()
    inside = out / "manifest.json"
    inside.write_text(_list(tmp_path).read_text())
    db = ["--db", str(tmp_path / "t.db")]
    rc, _, err = run_cli(capsys, "build", str(inside), "-o", str(out), "--force", *db, *FAST)
    assert rc == 2 and "would replace the kernel list" in err.splitlines()[-1]
    assert inside.read_text() == _list(tmp_path).read_text() and len(list(out.iterdir())) == 1
    spec = out / "aotune_kernels.h"
    spec.write_text((SPEC_DIR / "haswell.toml").read_text())
    inside.unlink()
    args = ["build", str(_list(tmp_path)), "-o", str(out), "--force", *db, *FAST]
    rc, _, err = run_cli(capsys, *args, "--target", str(spec))
    assert rc == 2 and "would replace the --target spec" in err.splitlines()[-1]
    assert spec.read_text() == (SPEC_DIR / "haswell.toml").read_text()
    # an input in -o that the build does not write stays, with --force, as before
    keep = out / "kernels.toml"
    keep.write_text(_list(tmp_path).read_text())
    spec.unlink()
    rc, _, err = run_cli(capsys, "build", str(keep), "-o", str(out), "--force", *db, *FAST)
    assert rc == 0, err
    for argv, what in (
        (["build", "", "-o", str(new)], "the kernel list is an empty name"),
        (["build", str(_list(tmp_path)), "-o", ""], "-o is an empty name"),
        (["build", str(_list(tmp_path)), "-o", str(new), "--cluster", " "], "empty address"),
        # refused before any search, even where every kernel would come from the database
        (["build", str(_list(tmp_path)), "-o", str(new), "--cluster", "bogus"], "tcp://HOST:PORT"),
        (["build", str(_list(tmp_path)), "-o", str(new), "--cluster", "tcp://h:x"], "HOST:PORT"),
        # urlsplit's own ValueError, and schemes Dask cannot open from a bare address, were
        # internal errors
        (
            ["build", str(_list(tmp_path)), "-o", str(new), "--cluster", "tcp://[::1:8786"],
            "give the scheduler as tcp://HOST:PORT",
        ),
        (
            ["build", str(_list(tmp_path)), "-o", str(new), "--cluster", "tls://127.0.0.1:1"],
            "only a tcp:// scheduler",
        ),
        (
            ["build", str(_list(tmp_path)), "-o", str(new), "--cluster", "ucx://127.0.0.1:1"],
            "a ucx:// one needs",
        ),
    ):
        rc, _, err = run_cli(capsys, *argv)
        assert rc == 2 and what in one_error_line(err)


@needs_cc
def test_a_directory_or_file_in_the_way_of_the_library_moves_nothing(tmp_path, capsys):
    """With --force a user's directory named manifest.json (or a file named objects) stays in
    -o; the library's files are then not moved in one by one up to the one that fails."""
    db = ["--db", str(tmp_path / "t.db"), *FAST]
    for blocker, message in (("manifest.json", "holds a directory manifest.json"),
                             ("objects", "holds a file objects")):  # fmt: skip
        out = tmp_path / f"out-{blocker}"
        out.mkdir()
        (out / blocker).mkdir() if blocker.endswith(".json") else (out / blocker).write_text("x")
        rc, _, err = run_cli(capsys, "build", str(_list(tmp_path)), "-o", str(out), "--force", *db)
        assert rc == 2 and message in err.splitlines()[-1]
        assert sorted(p.name for p in out.iterdir()) == [blocker]


@needs_cc
def test_a_relative_cc_is_found_and_a_cross_compiler_is_named(tmp_path, capsys, monkeypatch):
    """--cc ./wrapper passed the check and then ran in the output directory, where it is not;
    a compiler for another architecture failed only at the link, after the search."""
    cc = shutil.which("cc") or shutil.which("gcc")
    wrapper = tmp_path / "mycc"
    wrapper.write_text(f'#!/bin/sh\nexec {cc} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    _list(tmp_path)
    rc, _, err = run_cli(capsys, "build", "k.toml", "-o", "o", "--cc", "./mycc",
                         "--db", "t.db", *FAST)  # fmt: skip
    assert rc == 0, err
    other = tmp_path / "armcc"
    other.write_text('#!/bin/sh\n[ "$1" = -dumpmachine ] && echo aarch64-linux-gnu\nexit 1\n')
    other.chmod(0o755)
    rc, _, err = run_cli(capsys, "build", "k.toml", "-o", "o2", "--cc", str(other), *FAST)
    assert rc == 2 and "makes aarch64 code" in one_error_line(err) and not Path("o2").exists()


@needs_cc
def test_a_compiler_given_with_its_flags_is_told_to_come_alone():
    """``--cc 'gcc -O3'`` is no file on PATH, yet gcc is there: the message says what --cc takes
    rather than that no such compiler exists."""
    import platform

    from aotune.artifact.link import find_linker

    arch = platform.machine()
    with pytest.raises(BuildError, match=rf"not its flags; give --cc {re.escape(CC)}$"):
        find_linker(arch, arch, f"{CC} -O3")
    with pytest.raises(BuildError, match="no such compiler on PATH"):
        find_linker(arch, arch, "no-such-cc -O3")


def test_a_cc_that_is_a_file_but_cannot_run_is_named_so(tmp_path):
    """``--cc /etc/passwd`` said 'no such compiler on PATH' of a file that is there."""
    import platform

    from aotune.artifact.link import find_linker

    arch = platform.machine()
    plain = tmp_path / "mycc"
    plain.write_text('#!/bin/sh\nexec cc "$@"\n')  # a wrapper left without its x bit
    with pytest.raises(BuildError, match="the file is not executable"):
        find_linker(arch, arch, str(plain))
