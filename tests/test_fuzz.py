"""Fuzzing the command line: every input gets an answer.

Hypothesis draws shapes, configs, einsum strings, flags and hwspec files (the built-in ones mutated
key by key: wrong type, out of range, NaN, huge, missing, extra; and files that are not TOML) and
runs each through the CLI, in-process for speed or as a subprocess where a crash would take the
test runner with it. Every run must end in a result (exit 0, or 1 for ``validate``'s violations)
or in exactly one line ``error: ...`` and exit 2: never a traceback, never aotune's own
"internal error" (exit 70), and within a time limit.

CI runs a sample; ``AOTUNE_FUZZ_EXAMPLES=N`` draws N cases per test (the README reports a long
run). The count of distinct inputs tried is printed at the end of the session.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from aotune.cli import main
from aotune.hwspecs.spec import SPEC_DIR, builtin_names
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("AOTUNE_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
TRIED: set[tuple[str, ...]] = set()  # distinct inputs, reported by conftest's summary hook
IN_PROCESS_SECONDS = 60.0  # an answer within this, or the input hangs something


def run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """``aotune ARGV`` in this process: (exit code, stdout, stderr)."""
    TRIED.add(tuple(argv))
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own exits (--help)
            code = e.code if isinstance(e.code, int) else 2
    assert time.monotonic() - start < IN_PROCESS_SECONDS, f"{argv} took too long"
    return code, out.getvalue(), err.getvalue()


def run_subprocess(argv: list[str], timeout: float = 120.0) -> tuple[int, str, str]:
    """``aotune ARGV`` in a fresh interpreter: crashes and hangs are seen, not suffered."""
    TRIED.add(tuple(argv))
    proc = subprocess.run(
        [sys.executable, "-m", "aotune", *argv], capture_output=True, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout, proc.stderr


def assert_answered(argv: list[str], code: int, err: str, ok: tuple[int, ...] = (0,)) -> None:
    """A result, or one error line and exit 2."""
    assert "Traceback" not in err, f"{argv}: traceback\n{err}"
    assert code != 70, f"{argv}: internal error: {err}"
    assert code >= 0, f"{argv}: killed by signal {-code}: {err[-500:]}"
    if code in ok:
        return
    assert code == 2, f"{argv}: exit {code}: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{argv}: {err!r}"
    assert len(lines[0]) > len("error: ") + 10, f"{argv}: an error that says nothing: {err!r}"


# ---- shapes, einsum strings, configs, flags ------------------------------------------------------

DIGITS = st.sampled_from(
    [
        "0",
        "1",
        "7",
        "64",
        "-3",
        "٣",
        "５",
        "+4",
        "1_0",
        "1e3",
        " 9 ",
        "99999999999",
        "9223372036854775807",
        "2147483648",
        "",
        "x",
        "0x10",
        "3.5",
    ]
)
SEPARATORS = st.sampled_from(["x", "X", ",", "*", " ", "", "xx", ",,"])


@st.composite
def shape_texts(draw: Any) -> str:
    parts = draw(st.lists(DIGITS, min_size=0, max_size=8))
    sep = draw(SEPARATORS)
    return sep.join(parts)


OPS = ["matmul", "batch_matmul", "dense", "conv2d", "depthwise_conv2d"]


@FUZZ
@given(op=st.sampled_from(OPS), shape=shape_texts())
def test_fuzzed_shapes(op, shape):
    argv = ["space", op, "--shape", shape, "--count-seconds", "0.05", "--json"]
    code, _, err = run_in_process(argv)
    assert_answered(argv, code, err)


INDEX = st.sampled_from(list("ijkbmn") + ["", "A", "é", "1", " "])


@st.composite
def einsum_texts(draw: Any) -> tuple[str, str]:
    a = "".join(draw(st.lists(INDEX, max_size=4)))
    b = "".join(draw(st.lists(INDEX, max_size=4)))
    out = "".join(draw(st.lists(INDEX, max_size=3)))
    arrow = draw(st.sampled_from(["->", "-", ">", "=>", "->"]))
    comma = draw(st.sampled_from([",", ",", ";", ""]))
    spec = f"{a}{comma}{b}{arrow}{out}"
    letters = sorted(set(re.sub(r"[^a-zA-Z]", "", spec)))
    sizes = draw(
        st.lists(
            st.sampled_from(["1", "2", "5", "17", "0", "-1", "q", "٣", ""]),
            min_size=len(letters),
            max_size=len(letters),
        )
    )
    dims = ",".join(f"{ch}={v}" for ch, v in zip(letters, sizes))
    return spec, draw(st.sampled_from([dims, dims + ",z=3", dims.replace("=", ":"), ""]))


@FUZZ
@given(spec_dims=einsum_texts())
def test_fuzzed_einsum_strings(spec_dims):
    spec, dims = spec_dims
    argv = ["space", "einsum", spec, "--dims", dims, "--count-seconds", "0.05", "--json"]
    code, _, err = run_in_process(argv)
    assert_answered(argv, code, err)


VALID_CONFIG = "mr=4,nr=16,kc=32,mc=32,nc=64,order=nkm,pack_a=1,pack_b=1,unroll=2,par=m,threads=1"


@st.composite
def config_texts(draw: Any) -> str:
    items = [kv.split("=") for kv in VALID_CONFIG.split(",")]
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(items) - 1))
        action = draw(st.sampled_from(["value", "key", "drop", "dup", "junk"]))
        if action == "value":
            items[i][1] = draw(
                st.sampled_from(
                    [
                        "0",
                        "-1",
                        "3",
                        "1000000",
                        "99999999999999999999",
                        "abc",
                        "",
                        "٣",
                        "mkn",
                        "n",
                        "1.5",
                    ]
                )
            )
        elif action == "key":
            items[i][0] = draw(st.sampled_from(["MR", "nrr", "", "threads ", "pad_copy"]))
        elif action == "drop" and len(items) > 1:
            items.pop(i)
        elif action == "dup":
            items.append(list(items[i]))
        else:
            items.append([draw(st.sampled_from(["=", "==", "x", ",,"])), ""])
    return ",".join("=".join(kv) if kv[1] or kv[0] else kv[0] for kv in items)


@FUZZ
@given(config=config_texts(), command=st.sampled_from(["validate", "predict"]))
def test_fuzzed_configs(config, command):
    argv = [command, "matmul", "--shape", "61x48x37", "--target", "haswell", "--config", config]
    code, _, err = run_in_process(argv)
    assert_answered(argv, code, err, ok=(0, 1) if command == "validate" else (0,))


FLAG_VALUES = {
    "--top-k": ["0", "1", "3", "-2", "1001", "x", "٣"],
    "--seed": ["0", "-1", "4294967296", "18446744073709551616", "1.5", ""],
    "--budget": ["0", "1", "8", "-5", "10000000", "two"],
    "--strategy": ["cga", "random", "anneal", ""],
    "--target": ["host", "haswell", "neoverse-n1", "pentium", "", "/dev/null", "/tmp", "a/b.toml"],
    "--stride": ["0", "1", "2", "-1", "99999999999"],
    "--pad": ["0", "1", "-1", "99999999999"],
    "--layout": ["NCHW", "NHWC", "nhwc", "CHWN", ""],
    "--activation": ["relu", "gelu", "none", "tanh", ""],
    "--emit-asm": ["", "/", "/nonexistent/dir/x.s"],
    "--count-seconds": ["0", "-1", "nan", "inf", "0.05", "1e9"],
}


@st.composite
def flag_sets(draw: Any) -> list[str]:
    command = draw(st.sampled_from(["tune", "space", "validate", "predict", "hw", "bench", "x"]))
    op = draw(st.sampled_from(OPS + ["einsum", "conv3d", ""]))
    argv = [command, op]
    for flag in draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=3, unique=True)):
        argv += [flag, draw(st.sampled_from(FLAG_VALUES[flag]))]
    argv += draw(st.sampled_from([[], ["--bias"], ["--json"], ["--no-verify"], ["--samples", "2"]]))
    return argv


def _bounded(argv: list[str]) -> list[str]:
    """Keep a drawn command short: a small problem, a small search, no final check."""
    if argv[0] == "tune":
        argv = [*argv, "--no-verify"]
        if "--budget" not in argv:
            argv += ["--budget", "16"]
    if argv[0] in ("tune", "space", "validate", "predict") and "--shape" not in argv:
        argv += [
            "--shape",
            {
                "batch_matmul": "2x9x17x5",
                "conv2d": "1,3,9,9,8,3,3",
                "depthwise_conv2d": "1,8,9,9,3,3",
            }.get(argv[1], "9x17x5"),
        ]
    if argv[0] == "space" and "--count-seconds" not in argv:
        argv += ["--count-seconds", "0.05"]
    if argv[0] == "bench":
        argv = [a for a in argv if a not in ("--samples", "2")] + ["--samples", "2"]
    if argv[0] in ("validate", "predict"):
        argv += ["--config", "mr=1"]
    return argv


@FUZZ
@given(argv=flag_sets())
def test_fuzzed_flags(argv, tmp_path_factory):
    argv = _bounded(argv)
    with contextlib.chdir(tmp_path_factory.mktemp("flags")):
        code, _, err = run_in_process(argv)
    assert_answered(argv, code, err, ok=(0, 1) if argv[0] == "validate" else (0,))


# ---- spec files ----------------------------------------------------------------------------------


def toml_text(data: dict[str, Any]) -> str:
    """A small TOML writer for spec-shaped data (scalars, tables, arrays of tables)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return (
                "nan"
                if math.isnan(v)
                else ("inf" if v > 0 else "-inf")
                if math.isinf(v)
                else repr(v)
            )
        if isinstance(v, int):
            return str(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(v)

    lines = [
        f"{json.dumps(k)} = {value(v)}"
        for k, v in data.items()
        if not isinstance(v, dict) and not (isinstance(v, list) and v and isinstance(v[0], dict))
    ]
    for k, v in data.items():
        if isinstance(v, dict):
            lines += ["", f"[{json.dumps(k)}]"] + [
                f"{json.dumps(a)} = {value(b)}" for a, b in v.items()
            ]
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            for item in v:
                lines += ["", f"[[{json.dumps(k)}]]"]
                lines += [f"{json.dumps(a)} = {value(b)}" for a, b in item.items()]
    return "\n".join(lines) + "\n"


BAD_VALUES = [
    0,
    -1,
    1,
    3,
    2**62,
    -(2**62),
    1.5,
    0.0,
    -0.5,
    float("nan"),
    float("inf"),
    float("-inf"),
    1e300,
    "",
    "garbage",
    "x" * 2000,
    True,
    [1, 2],
    {"a": 1},
    "+avx2,garbage",
    "-",
    "+",
    "haswel",
    "x86_64",
    "aarch64",
    "x86_64-unknown-linux-gnu",
    64,
    1000000000,
    7,
    100,
]


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in [prefix + (k,), *_paths(v, prefix + (k,))]]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _paths(v, prefix + (i,))]
    return []


def _mutated(data: Any, path: tuple, action: str, value: Any) -> Any:
    if not path:
        return data
    head, rest = path[0], path[1:]
    copy = list(data) if isinstance(data, list) else dict(data)
    if rest:
        copy[head] = _mutated(copy[head], rest, action, value)
    elif action == "delete":
        copy.pop(head)
    elif action == "extra" and isinstance(copy, dict):
        copy[f"{head}_extra"] = value
    else:
        copy[head] = value
    return copy


@st.composite
def spec_mutations(draw: Any) -> tuple[str, str]:
    name = draw(st.sampled_from(builtin_names()))
    data = tomllib.loads((SPEC_DIR / f"{name}.toml").read_text())
    path = draw(st.sampled_from(_paths(data)))
    action = draw(st.sampled_from(["set", "set", "set", "delete", "extra"]))
    return name, toml_text(_mutated(data, path, action, draw(st.sampled_from(BAD_VALUES))))


@FUZZ
@given(mutation=spec_mutations())
def test_fuzzed_spec_files(mutation, tmp_path_factory):
    """A mutated spec either loads (and then a search on it answers too) or is refused in one
    line that names the key; in a subprocess, since LLVM may abort on what reaches it."""
    base, text = mutation
    path = tmp_path_factory.mktemp("spec") / f"{base}-mutated.toml"
    path.write_text(text)
    argv = [
        "tune",
        "matmul",
        "--shape",
        "37x40x29",
        "--budget",
        "12",
        "--no-verify",
        "--target",
        str(path),
    ]
    code, _, err = run_subprocess(argv)
    assert_answered(argv, code, err)
    if code == 2:
        assert str(path) in err or "LLVM" in err or "config" in err, err


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_files_that_are_not_specs(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("junk") / "junk.toml"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    argv = ["hw", "show", str(path)]
    code, _, err = run_in_process(argv)
    assert_answered(argv, code, err)
    assert code == 2


@pytest.mark.parametrize(
    "target",
    [
        "/dev/zero",
        "/dev/null",
        "/proc/self/mem",
        "/tmp",
        "fifo",
        "deep",
        "huge",
        "x" * 5000 + ".toml",
        "nonexistent.toml",
    ],
)
def test_special_files_as_specs(target, tmp_path):
    """Device files, directories, FIFOs, deeply nested and very large files, names too long:
    one line each, in seconds (a FIFO used to block forever, /dev/zero to read for 50 s)."""
    if target == "fifo":
        target = str(tmp_path / "spec.toml")
        os.mkfifo(target)
    elif target == "deep":
        target = str(tmp_path / "deep.toml")
        Path(target).write_text("a = " + "[" * 50_000 + "]" * 50_000 + "\n")
    elif target == "huge":
        target = str(tmp_path / "huge.toml")
        Path(target).write_text("# padding\n" * 200_000)
    start = time.monotonic()
    code, _, err = run_subprocess(["hw", "show", target], timeout=30)
    assert_answered(["hw", "show", target], code, err)
    assert code == 2 and time.monotonic() - start < 20


# ---- resources and interrupts ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["tune", "matmul", "--shape", "100000x100000x100000"], "--no-verify"),
        (["tune", "matmul", "--shape", "50000x16x50000"], "GiB"),
        (
            ["tune", "conv2d", "--shape", "1,3,8,8,8,3,3", "--pad", "100000", "--no-verify"],
            "offset tables",
        ),
    ],
)
def test_work_too_large_for_this_machine_is_refused_before_it_starts(argv, needle):
    start = time.monotonic()
    code, _, err = run_in_process(argv)
    assert_answered(argv, code, err)
    assert code == 2 and needle in err and time.monotonic() - start < 20


@pytest.mark.parametrize("delay", [1.0, 3.0])
def test_sigterm_unwinds_as_ctrl_c_does_and_exits_143(delay, tmp_path):
    """``kill`` (SIGTERM) while searching or checking: one line, exit 143 (128 + 15), and no
    partial --emit-asm file or temporary file left behind."""
    out = tmp_path / "k.s"
    cmd = [sys.executable, "-m", "aotune", "tune", "matmul", "--shape", "256x256x256"]
    proc = subprocess.Popen(
        [*cmd, "--emit-asm", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # it finished first: then the file is whole
        assert out.read_text().strip() and not err.strip()
    else:
        assert proc.returncode == 143, err
        assert err.strip().splitlines() == ["error: terminated"], err
        assert not out.exists() or out.read_text().strip()
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


# a command whose signal lands inside a __del__ (Python cannot raise it there), and whose
# unwinding then drops an object cut off in its constructor (llvmlite's PassBuilder was one)
SIGNAL_IN_A_FINALIZER = """
import os, signal, sys, time
from aotune import cli

class SignalledWhileFreed:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGNUM)
        for _ in range(1000):  # the handler runs here, inside __del__
            pass

class CutOffInItsConstructor:
    def __del__(self):
        self.handle.close()  # never set: AttributeError

def command(args):
    half_made = CutOffInItsConstructor()
    SignalledWhileFreed()
    time.sleep(20)
    print("the interrupt was lost", file=sys.stderr)
    return 0

cli.COMMANDS["hw"] = command
sys.argv = ["aotune", "hw", "list"]
from aotune.entry import run
run()
"""


@pytest.mark.parametrize("signum, code, line", [(2, 130, "interrupted"), (15, 143, "terminated")])
def test_a_signal_that_lands_in_a_finalizer_still_stops_the_command_in_one_line(signum, code, line):
    """At stop 68 a SIGTERM that landed in islpy's C code was swallowed there (printed as a
    traceback, the command going on), and an llvmlite object cut off in its constructor printed
    "Exception ignored in" as the process ended: the interrupt is now sent again, to be raised
    where it stops the command, and what the unwinding leaves half made is not printed."""
    script = SIGNAL_IN_A_FINALIZER.replace("SIGNUM", signal.Signals(signum).name)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {line}"], done.stderr
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("delay", [0.5, 1.0, 2.0, 3.0, 4.5])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(delay, tmp_path):
    """SIGINT while importing, building the space, searching, compiling or checking: one line,
    exit 130, and no partial --emit-asm file (or the whole one, if the run had finished)."""
    out = tmp_path / "k.s"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aotune",
            "tune",
            "matmul",
            "--shape",
            "256x256x256",
            "--emit-asm",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    TRIED.add(("SIGINT", str(delay)))
    if proc.returncode == 0:  # it finished first: then the file is whole
        assert out.read_text().strip() and not err.strip()
    else:
        assert proc.returncode == 130, err
        assert err.strip().splitlines() == ["error: interrupted"], err
        assert not out.exists() or out.read_text().strip()
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"
