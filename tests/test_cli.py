from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from aotune.cli import main
from aotune.hwspecs.spec import SPEC_DIR


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """The real entry point in a fresh interpreter, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "aotune", *args], capture_output=True, text=True, timeout=300
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert len(lines[0]) <= 600, lines[0][:200]  # what the user typed at length is shown cut
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture(scope="module")
def broken_spec(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("specs") / "typo.toml"
    path.write_text((SPEC_DIR / "haswell.toml").read_text().replace("fma_units", "fma_unit"))
    return path


@pytest.fixture(scope="module")
def tiny_l1_spec(tmp_path_factory) -> Path:
    """A valid spec whose L1 leaves a tile 10 bytes: no register tile fits."""
    path = tmp_path_factory.mktemp("specs") / "tinyl1.toml"
    text = (SPEC_DIR / "haswell.toml").read_text()
    text = re.sub(r"size_kib = 32\n", "size_kib = 1\n", text, count=1)
    path.write_text(re.sub(r"usable_fraction = [0-9.]+", "usable_fraction = 0.01", text, count=1))
    return path


@pytest.mark.parametrize(
    "args, needles",
    [
        (["tune", "matmul", "--shape", "0x5x5"], ["dimension M", "got 0"]),
        (["tune", "matmul", "--shape", "-3x4x4"], ["got -3"]),
        # a missing value does not take the next option as its own
        (["space", "matmul", "--shape", "--target", "znver3"], ["--shape: expected one argument"]),
        (
            ["validate", "matmul", "--config", "--shape", "8x8x8"],
            ["--config: expected one argument"],
        ),
        (["tune", "matmul", "--shape", "abc"], ["is not sizes; give 3"]),
        (["tune", "conv9d", "--shape", "4x4x4"], ["unknown operator 'conv9d'"]),
        (
            ["tune", "matmul", "--shape", "8x8x8", "--target", "pentium"],
            ["unknown target 'pentium'"],
        ),
        (
            ["space", "matmul", "--shape", "8x8x8", "--target", "nonexistent/file.toml"],
            ["no spec file nonexistent/file.toml (no such file); check the path"],
        ),
        (["tune", "--top-k", "0"], ["--top-k must be in 1..1000", "got 0"]),
        (["tune", "--top-k", "1000000000"], ["--top-k must be in 1..1000"]),
        # a long seed is named by its own range, not by a digit count it never had
        (["tune", "--seed", "1" * 25], ["--seed must be in 0..4294967295"]),
        (["tune", "--budget", "7" * 5000], ["77777777... (5000 digits) is too large"]),
        # all digits but longer than any size: too large, not misspelt, and not echoed whole
        (["tune", "matmul", "--shape", "9" * 40 + "x4x4"], ["M = 99999999... (40 digits) is too"]),
        (["tune", "matmul", "--shape", "-" + "9" * 40 + "x4x4"], ["must be a positive"]),
        (
            ["tune", "einsum", "ij,jk->ik", "--dims", "i=4,j=" + "7" * 99999 + ",k=4"],
            ["dimension j = 77777777... (99999 digits) is too large", "2^31 - 1"],
        ),
        (
            ["validate", "matmul", "--shape", "8x8x8", "--config", "mr=" + "9" * 23],
            ["config value mr=999999999999... (23 characters) is outside mr's values"],
        ),
        (["tune", "m" * 100000, "--shape", "4x4x4"], ["(100003 characters) known: matmul"]),
        (["tune", "--shape", "8x8x8", "--no-db", "--retune"], ["--retune", "with --no-db"]),
        (["build", "k.toml", "--no-db"], ["unrecognized arguments: --no-db"]),
        (
            ["accuracy", "matmul", "--shape", "8x8x8", "--seed", "-1"],
            ["--seed -1", "0..4294967295"],
        ),
        (
            ["space", "matmul", "--shape", "4x8x8", "--shape", "5x8x8"],
            ["--shape given twice (4x8x8 and 5x8x8)"],
        ),
        (
            ["space", "conv2d", "--shape", "1,3,8,8,4,3,3", "--pad=1", "--pad", "0"],
            ["--pad given twice (1 and 0)"],
        ),
        (
            ["hw", "calibrate", "-o", "x.toml", "-o", "y.toml"],
            ["-o given twice (x.toml and y.toml)"],
        ),
        (["build", "k.toml", "-oa", "--out", "b"], ["--out given twice (a and b)"]),
        (["frobnicate"], ["invalid choice"]),
        (["bench", "--quick", "--samples", "2"], ["--samples 2", "at least 5"]),
        (["bench", "--samples", "5000"], ["--samples 5000", "at most 1024"]),
        (["bench", "--target", "h100"], ["h100 is a GPU", "--gpu-only"]),
        (["bench", "--gpu-only", "--only", "matmul"], ["--only matmul", "give one of them"]),
        (["bench", "--library", "--only", "gpu"], ["leave out --only and --samples"]),
        (["bench", "--library", "--samples", "3"], ["leave out --only and --samples"]),
        (["bench", "--gpu-only", "--samples", "8"], ["gpu group measures nothing"]),
        (["tune", "matmul", "--shape", "8x8x8", "--force"], ["--force", "none is given"]),
        (["hw", "calibrate", "--force"], ["--force", "no -o FILE is given"]),
        (["accuracy", "matmul", "--shape", "8x8x8", "--force"], ["no --plot FILE is given"]),
        (["tune", "matmul", "--shape", "8x8x8", "--target", "z" * 300], ["unknown target"]),
        (["tune", "matmul", "--shape", "0" * 40 + "8x0x4"], ["dimension N", "got 0"]),
        (["bench", "--gpu-only", "--target", "znver4"], ["--target znver4", "leave it out"]),
        (["accuracy", "matmul", "--shape", "9x9x9", "--sample", "9999"], ["at most 1024"]),
        (
            ["tune", "einsum", "bij,bjk->bik", "--dims", "b=2,i=4,j=4"],
            ["index 'k' has no size", "add k=N"],
        ),
        (
            ["tune", "einsum", "ij,jk->iz", "--dims", "i=4,j=4,k=4,z=2"],
            ["output index 'z' appears in no input"],
        ),
        (["tune", "einsum", "ij,jk->ik", "--dims", "i=4,j=4,k=4,q=3"], ["does not use", "q"]),
        (["tune", "einsum", "ij,jk->ik", "--dims", "i=4,j=four,k=4"], ["'four' is not an integer"]),
        (["tune", "einsum", "ij,jk->ik", "--dims", "i=4,j=0,k=4"], ["dimension j", "got 0"]),
        (["tune", "einsum", "ij+jk", "--dims", "i=4,j=4,k=4"], ["not of the form"]),
        (["tune", "einsum", "--dims", "i=4"], ["einsum needs a spec, e.g."]),
        (["tune", "batch_matmul", "--shape", "8x8x8"], ["expected 4", "BxMxNxK"]),
        (["tune", "matmul", "--shape", "8x8x8", "--bias"], ["apply to dense"]),
        (
            ["tune", "dense", "--shape", "8x8x8", "--activation", "swish"],
            ["activation 'swish'", "relu"],
        ),
        # convolutions: each parameter that breaks its rule is named, with the rule
        (
            ["tune", "conv2d", "--shape", "1,3,4,4,8,7,7"],
            ["kernel R=7", "larger than the padded input", "H+2*pad=4"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,3,4,4,8,3,3", "--dilation", "3"],
            ["dilated span 7", "padded input"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,3,8,8,8,3,3", "--stride", "0"],
            ["stride must be an integer >= 1"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,3,8,8,8,3,3", "--dilation", "0"],
            ["dilation must be an integer >= 1"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,3,8,8,8,3,3", "--pad", "-1"],
            ["pad must be an integer >= 0"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,6,8,8,8,3,3", "--groups", "4"],
            ["groups=4 does not divide C=6"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,8,8,8,6,3,3", "--groups", "4"],
            ["groups=4 does not divide K=6"],
        ),
        (
            ["tune", "conv2d", "--shape", "1,3,8,8,8,3,3", "--layout", "NWHC"],
            ["layout 'NWHC'", "NCHW, NHWC"],
        ),
        (["tune", "conv2d", "--shape", "1,3,8,8,8,3"], ["expected 7", "N,C,H,W,K,R,S"]),
        (["tune", "conv2d", "--shape", "1,3,0,8,8,3,3"], ["dimension H", "got 0"]),
        (
            ["tune", "matmul", "--shape", "8x8x8", "--layout", "NHWC"],
            ["--layout applies to conv2d"],
        ),
        (
            ["tune", "depthwise_conv2d", "--shape", "1,8,8,8,3,3", "--groups", "2"],
            ["one group per channel"],
        ),
        (  # not depthwise_conv2d, which has one group per channel
            ["tune", "matmul", "--shape", "8x8x8", "--groups", "2"],
            ["--groups applies to conv2d, not matmul"],
        ),
        (
            ["tune", "matmul", "--shape", "8x8x8", "--stride", "2", "--groups", "2"],
            ["--stride/--groups apply to conv2d and depthwise_conv2d (--groups: conv2d only)"],
        ),
    ],
)
def test_bad_input_gets_one_line_error(args, needles):
    assert_one_line_error(run_cli(*args), *needles)


def test_a_control_character_in_a_path_is_shown_escaped_not_sent_to_the_terminal(tmp_path):
    path = str(tmp_path / "\x1b[31mred.toml")
    proc = run_cli("space", "matmul", "--shape", "8x8x8", "--target", path)
    assert_one_line_error(proc, "\\x1b[31mred.toml", "(no such file)")
    assert "\x1b" not in proc.stderr


def test_misspelled_hwspec_key(broken_spec):
    assert_one_line_error(
        run_cli("space", "matmul", "--shape", "8x8x8", "--target", str(broken_spec)),
        "unknown key 'fma_unit'",
        str(broken_spec),
    )


def test_unsatisfiable_request_names_the_conflicting_constraint(tiny_l1_spec):
    assert_one_line_error(
        run_cli("tune", "matmul", "--shape", "8x8x8", "--target", str(tiny_l1_spec)),
        "no config satisfies L1 footprint",
        "0.01 * 1 KiB",
    )


def test_space_of_an_unsatisfiable_request_counts_0_and_names_the_conflict(tiny_l1_spec):
    """space reports, so 0 configs is an answer (exit 0), with the constraints that leave none."""
    args = ("space", "matmul", "--shape", "8x8x8", "--target", str(tiny_l1_spec))
    text = run_cli(*args)
    assert text.returncode == 0 and "valid configs: exactly 0" in text.stdout
    assert "why none:" in text.stdout and "no config satisfies L1 footprint" in text.stdout
    as_json = run_cli(*args, "--json")
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 0 and doc["count"] == 0
    assert "L1 footprint" in doc["empty_because"]


def test_a_spec_whose_features_leave_out_the_fma_names_the_key_to_fix(tmp_path: Path):
    text = (SPEC_DIR / "haswell.toml").read_text()
    spec = tmp_path / "noavx.toml"
    spec.write_text(re.sub(r'llvm_features = ".*"', 'llvm_features = "-avx2,-fma,-avx"', text))
    # no 256-bit vectors at all: refused on load, before any compile
    assert_one_line_error(run_cli("hw", "show", str(spec)), "does not give +avx", "vector_bits")
    spec.write_text(re.sub(r'llvm_features = ".*"', 'llvm_features = "+avx,-avx2,-fma"', text))
    assert_one_line_error(
        run_cli(
            "tune",
            "matmul",
            "--shape",
            "32x32x32",
            "--target",
            str(spec),
            "--no-db",
            "--budget",
            "32",
        ),
        "no FMA instruction",
        "isa.llvm_features",
    )


def test_validate_lists_every_violation_and_exits_1(capsys):
    code = main(
        [
            "validate",
            "matmul",
            "--shape",
            "1024x1024x1024",
            "--target",
            "skylake-avx512",
            "--config",
            "mr=16,nr=64,kc=512,mc=100,nc=64,order=nkm,pack_a=1,pack_b=1,unroll=4,par=m,threads=2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "registers" in out and "required 69, available 32" in out and "reduce mr or nr" in out
    assert "L1 footprint" in out and "100 is not a multiple of 16" in out


def test_validate_accepts_a_valid_config(capsys):
    code = main(
        [
            "validate",
            "matmul",
            "--shape",
            "1024x1024x1024",
            "--target",
            "skylake-avx512",
            "--config",
            "mr=8,nr=32,kc=128,mc=96,nc=1024,order=nkm,pack_a=1,pack_b=1,unroll=4,par=m,threads=2",
        ]
    )
    assert code == 0 and "valid" in capsys.readouterr().out


def test_space_prints_variables_constraints_and_count(capsys):
    assert (
        main(
            [
                "space",
                "matmul",
                "--shape",
                "64x64x64",
                "--target",
                "skylake-avx512",
                "--count-seconds",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "accumulators mr*nr/16 + operand regs (nr/16 + 1) <= 32 vector registers" in out
    assert "L1 footprint(mr, nr, kc) = (4*mr*kc + 4*kc*nr) B <= 0.8 * 32 KiB" in out
    assert "valid configs:" in out


def test_space_of_a_convolution_shows_isl_window_footprints_and_the_padding_decision(capsys):
    assert (
        main(
            [
                "space",
                "conv2d",
                "--shape",
                "1,8,9,9,16,3,3",
                "--stride",
                "2",
                "--pad",
                "1",
                "--layout",
                "NHWC",
                "--count-seconds",
                "0.5",
                "--json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    x = next(a for a in doc["accesses"] if a["tensor"] == "X")
    assert x["tile_footprint"] == "T_n x (2*T_oh + T_r - 2) x (2*T_ow + T_s - 2) x T_c"
    assert x["halo"] == [[0, 0], [1, 1], [1, 1], [0, 0]]
    assert "pad_copy" in {v["name"] for v in doc["variables"]}
    assert "X must be packed" in {c["name"] for c in doc["constraints"]}


def test_predict_names_the_bottleneck(capsys):
    assert (
        main(
            [
                "predict",
                "matmul",
                "--shape",
                "256x256x256",
                "--target",
                "skylake-avx512",
                "--config",
                "mr=6,nr=32,kc=128,mc=48,nc=256,order=nkm,pack_a=1,pack_b=1,unroll=4,par=m,threads=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "bottleneck:" in out
    for part in ("compute", "L1", "L2", "L3", "memory", "overhead"):
        assert part in out


def test_tune_json_contract(capsys):
    assert (
        main(
            [
                "tune",
                "matmul",
                "--shape",
                "96x80x40",
                "--target",
                "host",
                "--json",
                "--budget",
                "64",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"] == {
        "op": "matmul",
        "shape": {"M": 96, "N": 80, "K": 40},
        "dtype": "float32",
        "flops": 2 * 96 * 80 * 40,
        # inputs in statement order, then the output: the order a built library's function takes
        "tensors": [
            {"name": "A", "shape": [96, 40], "dtype": "float32"},
            {"name": "B", "shape": [40, 80], "dtype": "float32"},
            {"name": "C", "shape": [96, 80], "dtype": "float32"},
        ],
    }
    assert doc["target"]["kind"] == "cpu" and isinstance(doc["target"]["isa"], str)
    assert doc["search"]["measurements"] == 0 and doc["search"]["candidates_scored"] > 0
    assert doc["best"]["predicted_seconds"] > 0 and doc["best"]["config"]
    assert len(doc["verify"]) == 3
    for v in doc["verify"]:
        assert (
            v["correct"] is True
            and v["gflops"] > 0
            and v["measured_seconds"] > 0
            and 0 <= v["max_abs_error"] <= v["tolerance"] < 1e-3
        )
    assert doc["numpy_gflops"] > 0
    chosen = doc["chosen"]
    assert chosen["gflops"] == max(v["gflops"] for v in doc["verify"])
    assert chosen["ratio_vs_numpy"] == pytest.approx(chosen["gflops"] / doc["numpy_gflops"])


def test_cross_target_emits_aarch64_asm_and_skips_the_final_check(tmp_path, capsys, monkeypatch):
    # no qemu-aarch64 or cross compiler on the PATH: the emulated check (test_emulate.py) is skipped
    monkeypatch.setenv("PATH", str(tmp_path))
    out_s = tmp_path / "out.s"
    assert (
        main(
            [
                "tune",
                "matmul",
                "--shape",
                "64x64x64",
                "--target",
                "neoverse-n1",
                "--budget",
                "48",
                "--emit-asm",
                str(out_s),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "final check skipped" in text and "aarch64" in text and "apt-get install" in text
    assert "fmla" in out_s.read_text()
    # an existing file is never overwritten without --force
    out_s.write_text("mine")
    assert (
        main(
            [
                "tune",
                "matmul",
                "--shape",
                "64x64x64",
                "--target",
                "neoverse-n1",
                "--budget",
                "48",
                "--emit-asm",
                str(out_s),
            ]
        )
        == 2
    )
    assert out_s.read_text() == "mine"


def test_hw_list_and_show(capsys):
    assert main(["hw", "list"]) == 0
    out = capsys.readouterr().out
    assert "skylake-avx512" in out and "neoverse-n1" in out and "host" in out
    assert main(["hw", "show", "neoverse-n1"]) == 0
    assert "aarch64" in capsys.readouterr().out


def test_output_cut_short_by_the_reader_is_not_a_traceback():
    """``aotune hw show NAME | head -1`` where the reader has gone before the first write: the
    closed pipe ends the command quietly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "aotune", "hw", "show", "znver4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_progress_lines_print_their_brackets_as_text(capsys) -> None:
    """bench's "[bench] warning: ..." lines and install hints like 'aotune[gpu]' are not markup."""
    from aotune.cli import _progress_log

    _progress_log()("[bench] warning: pip install 'aotune[gpu]'")
    assert "[bench] warning: pip install 'aotune[gpu]'" in capsys.readouterr().err


def test_two_emit_options_naming_one_file_are_refused_before_the_search(
    tmp_path, capsys, monkeypatch
):
    """``--emit-asm F --emit-ir ./F`` (or a symlink to F) is one file: refused at once, before
    a search whose second write would fail on, or with --force replace, the first one's file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(tmp_path / "F")
    (tmp_path / "G").write_text("mine")
    (tmp_path / "hard").hardlink_to(tmp_path / "G")
    argv = ["tune", "matmul", "--shape", "8x8x8", "--no-db", "--emit-asm", "G", "--emit-ir",
            "hard", "--force"]  # fmt: skip
    assert main(argv) == 2 and "same file" in capsys.readouterr().err
    assert (tmp_path / "G").read_text() == "mine"  # a hard link to it is the same file
    for other in ("./F", str(tmp_path / "F"), "link"):
        for force in ([], ["--force"]):
            argv = ["tune", "matmul", "--shape", "8x8x8", "--no-db", "--emit-asm", "F",
                    "--emit-ir", other, *force]  # fmt: skip
            assert main(argv) == 2
            assert "same file" in capsys.readouterr().err
            assert not (tmp_path / "F").exists()


def test_emit_files_never_replace_what_the_command_reads(tmp_path, capsys, monkeypatch):
    """--force replaces an earlier --emit-* output, never the tuning database or the --target
    spec the same command reads; "-" is not taken for a file name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.toml").write_text((SPEC_DIR / "znver4.toml").read_text())
    (tmp_path / "my.db").write_bytes(b"")
    base = ["tune", "matmul", "--shape", "8x8x8", "--force"]
    cases = [
        (["--db", "my.db", "--emit-ir", "./my.db"], "is the tuning database this command reads"),
        (["--no-db", "--target", "spec.toml", "--emit-asm", str(tmp_path / "spec.toml")],
         "is the --target spec this command reads"),
        (["--no-db", "--emit-asm", "-"], "give a file name"),
    ]  # fmt: skip
    for extra, says in cases:
        assert main([*base, *extra]) == 2
        assert says in capsys.readouterr().err
    assert (tmp_path / "spec.toml").read_text() == (SPEC_DIR / "znver4.toml").read_text()
    assert (tmp_path / "my.db").read_bytes() == b"" and not (tmp_path / "-").exists()


def test_outputs_never_replace_aotunes_own_spec_files(tmp_path, capsys, monkeypatch):
    """A target given by name (or ``host``) reads aotune's spec files: --emit-* --force and
    ``hw calibrate -o --force`` refuse to write over one, however the path is spelt (checked on
    a copy of the spec folder, so a regression replaces only the copy)."""
    import shutil

    import aotune.hwspecs.spec as spec_module
    from aotune.errors import CalibrationError
    from aotune.hwspecs.calibrate import check_output

    specs = tmp_path / "specs"
    shutil.copytree(SPEC_DIR, specs, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(spec_module, "SPEC_DIR", specs)
    monkeypatch.chdir(tmp_path)
    before = {p.name: p.read_bytes() for p in specs.glob("*.toml")}
    base = ["tune", "matmul", "--shape", "8x8x8", "--no-db", "--no-verify", "--force"]
    cases = [
        ["--target", "skylake-avx512", "--emit-asm", "specs/skylake-avx512.toml"],
        ["--target", "host", "--emit-ir", str(specs / "znver4.toml")],
        ["--target", "znver4", "--emit-asm", "./specs/../specs/haswell.toml"],
    ]
    for extra in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert "is aotune's built-in spec" in err and "give another file" in err, err
    with pytest.raises(CalibrationError, match="is aotune's built-in spec znver5"):
        check_output(str(specs / "znver5.toml"), True)
    # db export --force too (it replaced h200.toml with JSON lines)
    assert (
        main(
            [
                "tune",
                "matmul",
                "--shape",
                "8x8x8",
                "--target",
                "haswell",
                "--no-verify",
                "--db",
                "t.db",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["db", "export", "specs/h200.toml", "--db", "t.db", "--force"]) == 2
    err = capsys.readouterr().err
    assert "specs/h200.toml is aotune's built-in spec h200" in err and "another file" in err
    assert {p.name: p.read_bytes() for p in specs.glob("*.toml")} == before


def test_a_target_that_is_a_directory_says_so(tmp_path, capsys):
    (tmp_path / "specs").mkdir()
    assert main(["hw", "show", str(tmp_path / "specs")]) == 2  # a path: read as a file
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        assert main(["hw", "show", "specs"]) == 2
    assert "'specs' is a directory" in capsys.readouterr().err


def test_an_overlong_word_of_a_message_keeps_both_ends():
    """A deep path keeps where it starts and the file it names; an operator name typed at length
    is cut to its ends and length."""
    from aotune.cli import _one_line

    path = "/tmp/" + "/".join(["deeply_nested_build_directory"] * 12) + "/kernels.toml"
    shown = _one_line(f"error: {path} is not valid TOML")
    assert shown.startswith("error: /tmp/deeply_nested") and "/kernels.toml (" in shown
    assert len(shown) < 250 and shown.endswith("is not valid TOML")
    assert _one_line("a  b\n c") == "a b c"


def test_version_prints_the_version_and_runs_nothing():
    from aotune import __version__

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"aotune {__version__}"


def test_tune_off_a_terminal_announces_a_final_check_of_seconds(capsys, monkeypatch):
    """Piped stderr gets no progress bar: a final check whose kernels the model expects to run
    for seconds says so in one line first. A quick one, and --json, keep stderr free of it."""
    import aotune.cli as cli

    args = ["tune", "matmul", "--shape", "16x8x4", "--target", "host", "--budget", "32", "--no-db"]
    assert main(args) == 0
    assert "[tune]" not in capsys.readouterr().err  # microseconds of runs: nothing to announce
    monkeypatch.setattr(cli, "SLOW_CHECK_SECONDS", 0.0)  # as if each run took seconds
    assert main(args) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "[tune]" in line]
    assert len(notes) == 1 and notes[0].startswith("[tune] final check: running 3 kernels")
    assert main([*args, "--json"]) == 0
    assert "[tune]" not in capsys.readouterr().err


def test_tune_says_why_it_gives_fewer_candidates_than_top_k(capsys):
    """A budget of one config gives one candidate of the three asked for, and a 1 x 1 x 1 matmul's
    space a handful: each says so, in the text and in the JSON; a full top-k says nothing."""
    base = ["tune", "matmul", "--target", "haswell", "--no-db", "--no-verify"]
    assert main([*base, "--shape", "64x64x64", "--budget", "1", "--json"]) == 0
    search = json.loads(capsys.readouterr().out)["search"]
    assert search["top_k"] == 3 and search["top_k_shortfall"].startswith(
        "1 of the 3 candidates asked for (--top-k 3): --budget 1 estimated 1 config(s)"
    )
    assert main([*base, "--shape", "1x1x1", "--top-k", "16"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("top-k:"))
    assert "distinct config(s) before its draws stopped" in line and "of the 16 candidates" in line
    assert main([*base, "--shape", "64x64x64", "--budget", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["search"]["top_k_shortfall"] is None


def test_rates_below_one_gflops_keep_three_significant_digits():
    """A 1 x 1 x 1 matmul runs at ~0.0003 GFLOP/s, which one decimal shows as 0.0 for both the
    kernel and numpy, hiding the ratio the line states."""
    from aotune.cli import _gflops_text

    assert [_gflops_text(x) for x in (188.74, 1.0, 0.000296, 0.01234)] == [
        "188.7",
        "1.0",
        "0.000296",
        "0.0123",
    ]


@pytest.mark.parametrize(
    "args, title",
    [
        (
            ["conv2d", "--shape", "1,4,6,6,8,3,3", "--stride", "2", "--pad", "1", "--groups", "2",
             "--dilation", "2", "--layout", "NHWC"],
            "conv2d 1x4x6x6x8x3x3 (stride 2, pad 1, dilation 2, groups 2, NHWC) on znver4",
        ),
        (["conv2d", "--shape", "1,4,6,6,8,3,3"], "conv2d 1x4x6x6x8x3x3 on znver4"),
        (  # its groups are its channels, always
            ["depthwise_conv2d", "--shape", "1,8,6,6,3,3", "--pad", "1"],
            "depthwise_conv2d 1x8x6x6x3x3 (pad 1) on znver4",
        ),
        (
            ["dense", "--shape", "8x16x8", "--bias", "--activation", "relu"],
            "dense 8x16x8 (+ bias then relu) on znver4",
        ),
    ],
)  # fmt: skip
def test_a_space_is_named_with_what_sets_its_kernel_beyond_the_sizes(args, title, capsys):
    """Two convolutions of one shape but another stride or layout are other kernels: the title
    that space, validate, predict and their errors print says which."""
    assert main(["space", *args, "--target", "znver4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["space"] == title


def test_tune_json_says_the_convolution_and_epilogue_its_kernel_was_made_for(capsys):
    fast = ["--budget", "16", "--top-k", "1", "--no-verify", "--no-db", "--json"]
    conv = ["conv2d", "--shape", "1,2,5,5,2,3,3", "--stride", "2", "--layout", "NHWC"]
    assert main(["tune", *conv, *fast]) == 0
    w = json.loads(capsys.readouterr().out)["workload"]
    assert w["conv"] == {"stride": 2, "pad": 0, "dilation": 1, "groups": 1, "layout": "NHWC"}
    assert "epilogue" not in w
    dense = ["dense", "--shape", "4x16x8", "--bias", "--activation", "gelu"]
    assert main(["tune", *dense, *fast]) == 0
    w = json.loads(capsys.readouterr().out)["workload"]
    assert w["epilogue"] == {"bias": True, "activation": "gelu"} and "conv" not in w


def test_validate_json_says_what_each_violation_s_numbers_are(capsys):
    """For a divisibility rule the two numbers are a value and its divisor, not a requirement and
    a limit: each violation carries the line that says which."""
    cfg = "mr=13,nr=16,kc=32,mc=12,nc=64,order=nkm,unroll=1,par=n,pack_a=1,pack_b=1,threads=1"
    argv = ["validate", "matmul", "--shape", "127x61x33", "--target", "znver4", "--json"]
    assert main([*argv, "--config", cfg]) == 1  # invalid: exit 1, as without --json
    (v,) = json.loads(capsys.readouterr().out)["violations"]
    assert v["relation"] == "divides" and (v["required"], v["available"]) == (12, 13)
    assert "12 is not a multiple of 13" in v["message"]
