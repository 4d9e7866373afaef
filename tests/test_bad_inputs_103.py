"""Bad input found by the stop-102 CLI probe, fixed at stop 103: each test failed before."""

from __future__ import annotations

import pytest
from aotune.cli import main


def _onnx_model(tmp_path, nodes, inputs=("a", "b")):
    """A float32 model of ``nodes`` with 4 x 4 inputs and output y, saved; its path."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def _build(tmp_path, model):
    argv = ["build", str(model), "-o", str(tmp_path / "lib"), "--db", str(tmp_path / "t.db")]
    return main([*argv, "--target", "haswell", "--no-verify", "--objects-only", "--budget", "20"])


def test_an_onnx_constant_without_an_output_is_an_error_not_a_crash(tmp_path, capsys):
    """A Constant node with no output ended in an internal error (IndexError, exit 70)."""
    from onnx import TensorProto, helper

    const = helper.make_node(
        "Constant", [], [], value=helper.make_tensor("v", TensorProto.FLOAT, [4], [0.0] * 4)
    )
    model = _onnx_model(tmp_path, [const, helper.make_node("MatMul", ["a", "b"], ["y"])])
    assert _build(tmp_path, model) == 2
    assert "the Constant node at position 1 has no output" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("op", "attrs", "said"),
    [
        ("Conv", {"group": 2.5}, "group of type FLOAT; ONNX defines it as INT"),
        ("Conv", {"auto_pad": 3}, "auto_pad of type INT; ONNX defines it as STRING"),
        ("Conv", {"auto_pad": "MIDDLE"}, "auto_pad = 'MIDDLE'"),
        ("Gemm", {"transB": 0.5}, "transB of type FLOAT; ONNX defines it as INT"),
        ("Gemm", {"beta": "1"}, "beta of type STRING; ONNX defines it as FLOAT"),
        ("Gemm", {"transA": 2}, "transA = 2, transB = 0: each is 0 or 1"),
    ],
)
def test_an_onnx_attribute_is_read_as_its_schema_types_it(tmp_path, capsys, op, attrs, said):
    """group = 2.5 built a kernel of group 2, transB = 0.5 one of transB 0, auto_pad 'MIDDLE'
    one without padding: each a kernel of another operator than the model's."""
    from onnx import helper

    if op == "Conv":
        node = helper.make_node(op, ["x", "w"], ["y"], **attrs)
        import onnx
        from onnx import TensorProto

        graph = helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4, 3, 3]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        model = tmp_path / "m.onnx"
        onnx.save(helper.make_model(graph), str(model))
    else:
        model = _onnx_model(tmp_path, [helper.make_node(op, ["a", "b"], ["y"], **attrs)])
    assert _build(tmp_path, model) == 2
    err = capsys.readouterr().err
    assert said in err and "internal error" not in err


def test_a_build_input_name_too_long_is_named_not_a_crash(tmp_path, capsys, monkeypatch):
    """A kernel list named with 300 bytes ended in an internal error (ENAMETOOLONG, exit 70)."""
    monkeypatch.chdir(tmp_path)
    assert main(["build", "a" * 300 + ".toml", "--target", "haswell"]) == 2
    err = capsys.readouterr().err
    assert "cannot read TOML kernel list" in err and "File name too long" in err


def _config_column(out: str) -> str:
    """The text of a result table's config column (its second), folds joined."""
    import re

    out = re.sub(r"\x1b\[[0-9;]*m", "", out)
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    return "".join(r[2].strip() for r in rows if len(r) > 2)


def test_a_gpu_config_is_shown_whole_in_the_table(capsys):
    """GPU rows ended at '...,vb=1,unr…' even written to a file: unroll, the pads and the
    prefetch depth never showed."""
    argv = ["tune", "matmul", "--shape", "256x256x256", "--target", "a100", "--no-verify"]
    assert main([*argv, "--no-db", "--top-k", "1"]) == 0
    config = _config_column(capsys.readouterr().out)
    assert config.startswith("bm=") and config.endswith(",ahead=0") and ",unroll=" in config


def test_a_narrow_terminal_still_shows_the_configs(capsys, monkeypatch):
    """At COLUMNS=20 every cell of the table was empty; at 100 the config was cut."""
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes stdout for a terminal
    monkeypatch.setenv("COLUMNS", "20")
    argv = ["tune", "matmul", "--shape", "64x64x64", "--target", "haswell", "--no-verify"]
    assert main([*argv, "--no-db", "--top-k", "1"]) == 0
    config = _config_column(capsys.readouterr().out)
    assert config.startswith("mr=") and ",threads=" in config


@pytest.mark.parametrize("damage", ["free block", "records lost"])
def test_a_database_damaged_inside_is_called_damaged_not_unwritable(tmp_path, capsys, damage):
    """tune said 'cannot write to t.db: database disk image is malformed; make the file and its
    folder writable', which would not help: the file is damaged."""
    db = tmp_path / "t.db"
    argv = ["tune", "matmul", "--target", "haswell", "--no-verify", "--db", str(db), "--shape"]
    assert main([*argv, "32x32x32"]) == 0
    data = bytearray(db.read_bytes())
    if damage == "free block":  # the records table's page (4): its first free block past the end
        data[4096 * 3 + 1] = 0xFF
    else:  # the records page emptied: a new record takes the id of one whose candidates stay
        data[4096 * 3 + 8 : 4096 * 4] = bytes(4096 - 8)
    db.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*argv, "48x32x32"]) == 2
    err = capsys.readouterr().err
    assert "the database is damaged" in err and "writable" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["hw", "calibrate", "-o", "-"], "without -o, calibrate prints the spec"),
        (["build", "k.toml", "-o", "-"], "a build writes a folder"),
    ],
)
def test_dash_as_an_output_is_not_taken_for_a_file_named_dash(tmp_path, monkeypatch, capsys,
                                                               argv, said):  # fmt: skip
    """'-o -' wrote a spec file (or a library folder) named '-' in the current folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k.toml").write_text('[[kernel]]\nname = "a"\nop = "matmul"\nshape = [4, 4, 4]\n')
    assert main(argv) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "-").exists()


def test_a_reader_that_goes_away_ends_the_command_quietly(monkeypatch, capsys):
    """'aotune space ... | head -1' exited 1: rich turned the closed pipe into SystemExit(1)."""
    import io
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = io.TextIOWrapper(os.fdopen(write_end, "wb"), write_through=True)
    monkeypatch.setattr("sys.stdout", closed)
    assert main(["space", "matmul", "--shape", "64x64x64", "--target", "haswell"]) == 0


def test_a_build_whose_terminal_hangs_up_leaves_no_staging_folder(tmp_path):
    """A SIGHUP (the terminal closed) killed the build where it stood: its staging folder
    '.lib.aotune-partial-*' stayed beside the output for good."""
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "k.toml").write_text(
        '[[kernel]]\nname = "a"\nop = "matmul"\nshape = [512, 512, 512]\n'
    )
    argv = ["build", "k.toml", "-o", "lib", "--target", "haswell", "--no-verify",
            "--objects-only", "--db", "t.db", "--budget", "5000"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "aotune", *argv],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".lib.aotune-partial-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".lib.aotune-partial-*")), "the build made no staging folder"
    proc.send_signal(signal.SIGHUP)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert "hung up" in err and "Traceback" not in err
    assert not list(tmp_path.glob(".lib.aotune-partial-*")) and not (tmp_path / "lib").exists()


def test_a_staging_folder_no_build_holds_is_cleared_by_the_next_build(tmp_path):
    """A build killed outright (SIGKILL, the machine down) left '.aotune-partial-*' in the
    output folder, and every later build left it there too."""
    import os

    from aotune.artifact.build import discard_staging, stage_output_dir

    out = tmp_path / "lib"
    out.mkdir()
    running = stage_output_dir(out)
    abandoned = stage_output_dir(out)
    os.close(abandoned.held)  # as the kernel does for a process that is gone
    older = out / ".aotune-partial-older"  # an older aotune's: no lock to tell, so kept
    older.mkdir()
    beside = stage_output_dir(tmp_path / "new")
    os.close(beside.held)
    latest = stage_output_dir(out)
    assert running.dir.exists() and older.exists() and latest.dir.exists()
    assert not abandoned.dir.exists()
    stage_output_dir(tmp_path / "new")
    assert not beside.dir.exists()
    for s in (running, latest):
        discard_staging(s)
    assert sorted(p.name for p in out.iterdir()) == [older.name]


@pytest.mark.parametrize(
    ("seconds", "said"), [(float("inf"), "give the best (rank 1) a finite time"), (1e30, "1e+12")]
)
def test_an_imported_record_whose_best_cannot_run_is_refused(tmp_path, capsys, seconds, said):
    """A record whose rank 1 predicts infinity (or 1e30 s) was imported, and tune then showed it
    as the best of a search, ahead of a rank 2 of 0.007 ms."""
    import json

    db = tmp_path / "t.db"
    argv = ["tune", "matmul", "--shape", "32x32x32", "--target", "haswell", "--no-verify"]
    assert main([*argv, "--db", str(db)]) == 0
    export = tmp_path / "x.jsonl"
    assert main(["db", "export", str(export), "--db", str(db)]) == 0
    record = json.loads(export.read_text())
    best = next(c for c in record["candidates"] if c["rank"] == 1)
    best["predicted_seconds"] = seconds
    export.write_text(json.dumps(record) + "\n")
    capsys.readouterr()
    assert main(["db", "import", str(export), "--db", str(tmp_path / "other.db")]) == 2
    assert said in capsys.readouterr().err


def test_a_file_marked_immutable_is_refused_before_the_work(tmp_path):
    """As root, --force over an immutable file (chattr +i) failed only after the work was done
    (a calibration of minutes): os.access says yes to root."""
    import shutil
    import subprocess

    from aotune.errors import ConfigError
    from aotune.files import check_writable

    path = tmp_path / "imm.s"
    path.write_text("mine")
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode:
        pytest.skip("chattr +i needs root and a file system with the flag")
    try:
        with pytest.raises(ConfigError, match="immutable or append-only"):
            check_writable(path, True, ConfigError)
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)
    check_writable(path, True, ConfigError)  # without the flag: nothing to say
    assert path.read_text() == "mine"


def test_an_earlier_builds_immutable_file_is_refused_before_the_search(tmp_path, capsys):
    """The install failed on it only after every search and check ('cannot move the built
    library into lib ... is a file there read-only?')."""
    import shutil
    import subprocess

    (tmp_path / "k.toml").write_text('[[kernel]]\nname = "a"\nop = "matmul"\nshape = [8, 8, 8]\n')
    argv = ["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "lib"), "--target",
            "haswell", "--no-verify", "--objects-only", "--db", str(tmp_path / "t.db")]  # fmt: skip
    assert main(argv) == 0
    header = tmp_path / "lib" / "aotune_kernels.h"
    chattr = shutil.which("chattr")
    if (
        chattr is None
        or subprocess.run([chattr, "+i", str(header)], capture_output=True).returncode
    ):
        pytest.skip("chattr +i needs root and a file system with the flag")
    capsys.readouterr()
    try:
        assert main([*argv, "--retune"]) == 2
    finally:
        subprocess.run([chattr, "-i", str(header)], check=True)
    err = capsys.readouterr().err
    assert "marked immutable or append-only" in err and "search" not in err


def test_a_gpu_kernel_mostly_launch_names_the_launch_as_its_bottleneck(capsys):
    """A 16^3 matmul on the A100 is predicted 3.5 us, 3 of them the launch; its bottleneck
    was called 'lsu' or 'latency', which no config could change."""
    import json

    argv = ["tune", "matmul", "--shape", "16x16x16", "--target", "a100", "--no-verify"]
    assert main([*argv, "--no-db", "--top-k", "1", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    launch = dict(best["breakdown"])["launch"]
    assert launch > best["predicted_seconds"] / 2 and best["bottleneck"] == "launch"
    assert main(["tune", "matmul", "--shape", "1024x1024x1024", "--target", "a100",
                 "--no-verify", "--no-db", "--top-k", "1", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["best"]["bottleneck"] != "launch"


def test_one_record_is_counted_in_the_singular(tmp_path, capsys):
    """'imported 1 records', 'exported 1 records', 't.db: 1 records'."""
    db, export = tmp_path / "t.db", tmp_path / "x.jsonl"
    argv = ["tune", "matmul", "--shape", "16x16x16", "--target", "haswell", "--no-verify"]
    assert main([*argv, "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["db", "list", "--db", str(db)]) == 0
    assert main(["db", "export", str(export), "--db", str(db)]) == 0
    assert main(["db", "import", str(export), "--db", str(tmp_path / "new.db")]) == 0
    out = capsys.readouterr().out
    assert "1 records" not in out and out.count("1 record") == 3


def test_a_cache_share_under_a_kib_is_not_shown_as_0_kib(tmp_path, capsys):
    """An L3 of 1 KiB shared by 4 cores showed its share as '0 KiB per core'."""
    import re

    from aotune.hwspecs.spec import SPEC_DIR

    text = (SPEC_DIR / "haswell.toml").read_text()  # every cache 1 KiB, direct-mapped
    text = re.sub(r"size_kib = \d+", "size_kib = 1", text)
    text = re.sub(r"associativity = \d+", "associativity = 1", text)
    spec = tmp_path / "tiny.toml"
    spec.write_text(text)
    argv = ["tune", "matmul", "--shape", "64x64x64", "--target", str(spec), "--no-verify"]
    assert main([*argv, "--no-db"]) == 2
    err = capsys.readouterr().err
    assert "0.25 KiB per core" in err and " 0 KiB" not in err


def test_a_toml_date_is_shown_as_toml_writes_it(tmp_path, capsys):
    """'name datetime.date(1979, 5, 27) is not a C identifier': Python's repr, not the file's."""
    (tmp_path / "k.toml").write_text('[[kernel]]\nname = 1979-05-27\nop = "matmul"\n')
    assert main(["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "lib")]) == 2
    err = capsys.readouterr().err
    assert "name 1979-05-27 (a TOML date" in err and "datetime" not in err


def test_a_virtual_file_as_the_database_is_not_called_empty(capsys):
    """'/proc/self/status holds no tuning database (an empty file): nothing is stored there
    yet'."""
    assert main(["db", "list", "--db", "/proc/self/status"]) == 2
    err = capsys.readouterr().err
    assert "a virtual file" in err and "empty" not in err


def test_count_seconds_takes_ascii_digits_only(capsys):
    """--count-seconds took Arabic-Indic digits, which every integer option refuses."""
    with pytest.raises(SystemExit):
        main(["space", "matmul", "--shape", "4x4x4", "--count-seconds", "\u0661"])
    assert "is not a number of seconds" in capsys.readouterr().err


def test_an_objects_only_header_says_to_link_the_objects(tmp_path):
    """A --objects-only build's header said to link -laotune_kernels, which it did not write."""
    (tmp_path / "k.toml").write_text('[[kernel]]\nname = "a"\nop = "matmul"\nshape = [8, 8, 8]\n')
    argv = ["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "lib"), "--target",
            "haswell", "--no-verify", "--objects-only", "--db", str(tmp_path / "t.db")]  # fmt: skip
    assert main(argv) == 0
    header = (tmp_path / "lib" / "aotune_kernels.h").read_text()
    assert "-laotune_kernels" not in header and "aotune_runtime.o) with -lpthread" in header


def test_options_after_a_double_dash_are_not_taken_for_an_einsum_spec(capsys):
    """'aotune tune -- matmul --shape 8x8x8' said 'an einsum spec and --dims apply to einsum'."""
    assert main(["tune", "--", "matmul", "--shape", "8x8x8"]) == 2
    err = capsys.readouterr().err
    assert "matmul takes no second argument" in err and "go before '--'" in err


def test_a_library_error_shows_no_control_characters():
    """A folder named with an escape sequence printed it raw in the LibraryError (a traceback on
    a terminal acts on it)."""
    import aotune

    with pytest.raises(aotune.LibraryError) as e:
        aotune.load("/nonexistent/\x1b[31mred")
    assert "\x1b" not in str(e.value) and "?[31mred" in str(e.value)


def test_a_database_name_too_long_is_named_so(tmp_path, capsys, monkeypatch):
    """--db with a 304-byte name said 'cannot create the directory of ...'."""
    monkeypatch.chdir(tmp_path)
    assert main(["db", "list", "--db", "a" * 304 + ".db"]) == 2
    err = capsys.readouterr().err
    assert "File name too long (a name may have 255 bytes" in err and "directory" not in err


def test_a_child_forked_during_a_kernel_call_can_call_kernels(tmp_path):
    """A fork while another thread was inside a kernel gave the child the lock taken and
    workers that do not exist there: its first call hung for good (about 16 of 20 forks here)."""
    import os
    import shutil
    import threading
    import time

    import aotune
    import numpy as np

    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        pytest.skip("no C compiler to link the library")
    (tmp_path / "k.toml").write_text(
        '[[kernel]]\nname = "mm"\nop = "matmul"\nshape = [384, 384, 384]\n'
    )
    argv = ["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "lib"), "--no-verify",
            "--db", str(tmp_path / "t.db"), "--budget", "100"]  # fmt: skip
    assert main(argv) == 0
    lib = aotune.load(tmp_path / "lib")
    lib.set_num_threads(2)
    rng = np.random.default_rng(0)
    a, b = rng.random((384, 384), np.float32), rng.random((384, 384), np.float32)
    stop = threading.Event()

    def calls() -> None:  # the lock is taken for most of each moment
        while not stop.is_set():
            lib.mm(a, b)

    busy = threading.Thread(target=calls)
    busy.start()
    hung = []
    try:
        for i in range(20):
            time.sleep(0.02)
            pid = os.fork()
            if pid == 0:  # the child: one call, checked, and out without Python's exit
                os._exit(0 if np.allclose(lib.mm(a, b), a @ b, rtol=1e-4) else 1)
            deadline = time.monotonic() + 10
            while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    hung.append(i)
                    break
                time.sleep(0.01)
            else:
                assert os.waitstatus_to_exitcode(done[1]) == 0, f"fork {i}: a wrong result"
    finally:
        stop.set()
        busy.join()
        lib.shutdown()
    assert not hung, f"forks {hung} hung in their first kernel call"


def test_a_node_after_a_kernel_is_not_held_to_todays_schema(tmp_path):
    """Only the nodes the build reads are checked against the ONNX schema: a Cast of opset 1
    after a MatMul (its 'to' a string then, an int since opset 6) was refused."""
    import onnx
    from aotune.artifact.onnx_import import read_onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["m"]),
        helper.make_node("Cast", ["m"], ["y"], to="FLOAT"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 1)])
    model.ir_version = 3
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    assert [k.name for k in read_onnx(path, {}).kernels] == ["matmul_0"]


def test_a_signal_while_the_staging_folder_takes_its_lock_leaves_no_folder(tmp_path, monkeypatch):
    """A SIGHUP between the staging folder's creation and its lock (before the build's own
    clean-up is in place) left '.lib.aotune-partial-*' behind (CI, stop 113)."""
    from aotune.artifact import build

    def stopped(_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "_hold", stopped)
    for out in (tmp_path / "lib", tmp_path):  # a new output folder, and an existing one
        with pytest.raises(KeyboardInterrupt):
            build.stage_output_dir(out)
        assert not [p for p in tmp_path.rglob("*") if build.STAGING in p.name]
