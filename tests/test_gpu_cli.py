"""The GPU commands as a user runs them: tune (JSON contract), validate, predict, space, emits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aotune", *args], capture_output=True, text=True, timeout=600
    )


def test_tune_json_contract_on_a_gpu_without_a_gpu(tmp_path: Path):
    ptx, cubin = tmp_path / "k.ptx", tmp_path / "k.cubin"
    proc = run_cli(
        *("tune", "matmul", "--shape", "67x33x29", "--target", "t4", "--json", "--budget", "64"),
        *("--emit-ptx", str(ptx), "--emit-cubin", str(cubin)),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["target"]["kind"] == "gpu" and doc["target"]["sm"] == "sm_75"
    assert doc["search"]["measurements"] == 0 and doc["verify"] == []
    assert doc["verify_skipped"].startswith("no ")
    assert {"workload", "search", "best", "top"} <= set(doc)
    assert len(doc["top"]) == 3  # the default top_k
    for rank, t in enumerate(doc["top"], 1):
        assert t["rank"] == rank and t["ptxas_ok"] and t["emulated"]["correct"]
        assert set(t["resources"]) == {"registers", "spill_bytes", "shared_bytes",
                                       "threads_per_block", "blocks_per_sm", "occupancy",
                                       "waves"}  # fmt: skip
        assert t["resources"]["spill_bytes"] == 0 and 0 < t["peak_fraction"] <= 1.0
        assert t["launch"]["entry"] == "aotune_kernel" and len(t["launch"]["grid"]) == 3
    assert ".target sm_75" in ptx.read_text() and cubin.read_bytes()[:4] == b"\x7fELF"
    again = run_cli("tune", "matmul", "--shape", "8x8x8", "--target", "t4", "--emit-ptx", str(ptx))
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr


def test_validate_names_shared_memory_with_required_and_available_bytes():
    cfg = ("bm=256,bn=256,bk=64,tx=16,ty=16,vm=4,vn=4,strm=0,strn=0,sa=1,sb=1,la=16,lb=16,"
           "va=4,vb=4,unroll=4,pad_a=0,pad_b=0")  # fmt: skip
    proc = run_cli("validate", "matmul", "--shape", "4096x4096x4096", "--target", "t4",
                   "--config", cfg)  # fmt: skip
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if "shared memory/block" in ln)
    assert "required 131072, available 65536" in line


def test_validate_reports_spills_from_ptxas():
    cfg = ("bm=128,bn=128,bk=8,tx=8,ty=8,vm=1,vn=1,strm=0,strn=0,sa=0,sb=0,la=1,lb=1,"
           "va=1,vb=1,unroll=1,pad_a=0,pad_b=0")  # fmt: skip
    proc = run_cli("validate", "matmul", "--shape", "512x512x512", "--target", "a100",
                   "--config", cfg)  # fmt: skip
    assert proc.returncode == 1 and "ptxas spills" in proc.stdout, proc.stdout


def test_a_spilling_kernel_names_the_register_limit_its_block_size_set_in_validate_and_predict():
    """1024 threads a block leave each thread 64 of an SM's 65536 registers, not the 255 a
    thread may have: the message names that limit, and predict, which prices the kernel, warns."""
    cfg = ("bm=256,bn=256,bk=64,tx=32,ty=32,vm=8,vn=8,strm=0,strn=0,sa=1,sb=1,la=16,lb=16,"
           "va=1,vb=4,unroll=4,pad_a=0,pad_b=0,ahead=0")  # fmt: skip
    problem = "the most each of a block's 1024 threads may have (65536 per SM / 1024)"
    args = ("matmul", "--shape", "256x256x256", "--target", "h200", "--config", cfg)
    proc = run_cli("validate", *args)
    assert proc.returncode == 1 and "at 64 registers, " + problem in proc.stdout, proc.stdout
    assert "fewer threads per block" in proc.stdout
    proc = run_cli("predict", *args)
    assert proc.returncode == 0 and "warning: registers/thread: ptxas spills" in proc.stdout
    assert problem in proc.stdout and "validate rejects this config" in proc.stdout
    doc = json.loads(run_cli("predict", *args, "--json").stdout)
    assert doc["features"]["spill_bytes"] > 0 and problem in doc["toolchain"][0]


def test_predict_and_space_on_a_gpu():
    cfg = ("bm=64,bn=64,bk=16,tx=8,ty=8,vm=4,vn=4,strm=0,strn=0,sa=1,sb=1,la=16,lb=16,"
           "va=1,vb=4,unroll=2,pad_a=0,pad_b=0")  # fmt: skip
    proc = run_cli("predict", "matmul", "--shape", "1024x1024x1024", "--target", "rtx-3090",
                   "--config", cfg, "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["features"]["spill_bytes"] == 0 and doc["features"]["mix"]["source"] == "sass"
    assert doc["bottleneck"] in dict(doc["breakdown"])
    space = run_cli("space", "conv2d", "--shape", "1,64,56,56,64,3,3", "--pad", "1",
                    "--layout", "NHWC", "--target", "h100", "--count-seconds", "1")  # fmt: skip
    assert space.returncode == 0 and "shared memory/block" in space.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["tune", "matmul", "--shape", "8x8x8", "--target", "a100", "--emit-asm", "x.s"],
         "--emit-asm does not apply to gpu targets"),
        (["validate", "matmul", "--shape", "8x8x8", "--target", "a100", "--config", "bm=8"],
         "config is missing"),
    ],
)  # fmt: skip
def test_gpu_bad_input_is_one_line(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_no_verify_computes_nothing_on_this_cpu(monkeypatch, capsys):
    """--no-verify skips the emulated check too: no inputs drawn, no numpy reference (a large
    shape's reference took a minute and gigabytes for a check the user turned off)."""
    from aotune.cli import main
    from aotune.codegen import gpu_emulator

    def refuse(*args, **kwargs):
        raise AssertionError("numpy work despite --no-verify")

    monkeypatch.setattr(gpu_emulator, "random_inputs", refuse)
    monkeypatch.setattr(gpu_emulator, "_reference", refuse)
    argv = ["tune", "matmul", "--shape", "67x33x29", "--target", "t4", "--budget", "64"]
    assert main([*argv, "--json", "--no-verify", "--no-db"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verify_skipped"] == "--no-verify given" and doc["top"]
    assert all(t["emulated"] is None and t["ptxas_ok"] for t in doc["top"])
    assert main([*argv, "--no-verify", "--no-db"]) == 0  # the table too
    assert "final check skipped: --no-verify given" in capsys.readouterr().out
