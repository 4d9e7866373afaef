"""GPU spec files: the twelve targets load with their datasheet facts; broken files are refused
with the file, the key and what was expected."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from aotune.analysis.workload import matmul
from aotune.cli import main
from aotune.constraints.gpu import build_gpu_space
from aotune.errors import HardwareLimitError, HwSpecError
from aotune.hwspecs.gpu_spec import GpuSpec
from aotune.hwspecs.spec import SPEC_DIR, HwSpec, builtin_names, load_spec_file, load_target

GPU_TARGETS = {
    # name: (sm, SMs, datasheet fp32 TFLOP/s at boost)
    "v100": (70, 80, 15.7),
    "t4": (75, 40, 8.1),
    "rtx-2080-ti": (75, 68, 13.4),
    "titan-rtx": (75, 72, 16.3),
    "a100": (80, 108, 19.5),
    "a10": (86, 72, 31.2),
    "rtx-3090": (86, 82, 35.6),
    "rtx-3060-laptop": (86, 30, 13.1),
    "rtx-a6000": (86, 84, 38.7),
    "l4": (89, 58, 30.3),
    "rtx-4090": (89, 128, 82.6),
    "h100": (90, 132, 66.9),
    "h200": (90, 132, 66.9),
}


@pytest.mark.parametrize("name", sorted(GPU_TARGETS))
def test_every_gpu_target_loads_with_its_datasheet_peak(name):
    spec = load_target(name)
    sm, sms, tflops = GPU_TARGETS[name]
    assert isinstance(spec, GpuSpec) and spec.kind == "gpu"
    assert spec.arch.sm == sm and spec.compute.sms == sms
    assert spec.peak_flops / 1e12 == pytest.approx(tflops, rel=0.01)
    assert spec.shared.bytes_per_block <= spec.shared.bytes_per_block_optin
    assert spec.shared_bytes_per_cycle == 128


def test_builtin_names_split_by_kind():
    gpus, cpus = builtin_names("gpu"), builtin_names("cpu")
    assert set(gpus) == set(GPU_TARGETS)
    assert {"znver4", "znver5", "haswell", "skylake-avx512", "neoverse-n1"} <= set(cpus)
    assert sorted(gpus + cpus) == builtin_names()
    assert all(isinstance(load_target(n), HwSpec) for n in cpus)


def _a100() -> str:
    return (SPEC_DIR / "a100.toml").read_text()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda t: t.replace("sms = 108\n", ""), "missing key 'sms' (integer)"),
        (lambda t: t.replace("warp_size", "warpsize"), "unknown key 'warpsize'"),
        (lambda t: t.replace("sms = 108", 'sms = "many"'), "compute.sms: expected integer"),
        (lambda t: t.replace("boost_clock_ghz = 1.41", "boost_clock_ghz = nan"), "finite"),
        (lambda t: t.replace("boost_clock_ghz = 1.41", "boost_clock_ghz = inf"), "finite"),
        (
            lambda t: t.replace("sms = 108", "sms = 0"),
            "compute.sms = 0 is out of range; allowed 1..",
        ),
        (
            lambda t: t.replace("reserved_per_block = 1024", "reserved_per_block = -1"),
            "reserved_per_block = -1 is out of range",
        ),
        (lambda t: re.sub(r"\[shared\][^\[]*", "", t), "missing key 'shared' (table)"),
        (
            lambda t: t.replace("bytes_per_block_optin = 166912", "bytes_per_block_optin = 4096"),
            "bytes_per_block (49152) <= bytes_per_block_optin (4096) <= bytes_per_sm",
        ),
        (
            lambda t: t.replace("sm = 80", "sm = 86"),
            "arch.ptx_version = 70 cannot target sm_86, which PTX 7.1 introduced",
        ),
        (  # LLVM ended the process on it (exit 1, nothing said)
            lambda t: t.replace("sm = 80", "sm = 120").replace('"ampere"', '"blackwell"'),
            "arch.ptx_version = 70 cannot target sm_120, which PTX 8.7 introduced",
        ),
        (
            lambda t: t.replace("sm = 80", "sm = 95"),
            "arch.sm = 95 is not a compute capability aotune knows the PTX ISA of",
        ),
        (
            lambda t: re.sub(r"l2_kib = \d+", "l2_kib = 1", t),
            "memory.l2_kib = 1 is smaller than one SM's L1",
        ),
        (lambda t: t.replace('name = "a100"', 'name = ""'), "name '' must be 1-64 letters"),
        (
            lambda t: re.sub(r"l2_latency_cycles = \d+", "l2_latency_cycles = 10", t),
            "memory latencies must grow outwards",
        ),
        (
            lambda t: re.sub(r"l1_kib = \d+", "l1_kib = 1", t),
            "memory.l1_kib = 1 cannot hold shared.bytes_per_sm",
        ),
        (lambda t: t.replace("banks = 32", "banks = 7"), "shared.banks = 7 must be a power of two"),
        (  # occupancy rounded each block's shared memory up to 100-byte steps
            lambda t: re.sub(r"alloc_unit = \d+\n", "alloc_unit = 100\n", t, count=1),
            "shared.alloc_unit = 100 must be a power of two",
        ),
        (
            lambda t: t.replace("sm = 80", "sm = 75"),
            "arch.generation = 'ampere' is not sm_75's, which is 'turing'",
        ),
        (
            lambda t: t.replace("warp_size = 32", "warp_size = 33"),
            "compute.warp_size = 33: every NVIDIA GPU",
        ),
        (
            lambda t: t.replace("max_threads_per_block = 1024", "max_threads_per_block = 1000"),
            "max_threads_per_block (1000) must be a whole number of warps of 32",
        ),
        (lambda t: re.sub(r"dram_gib = .*\n", "", t), "missing key 'dram_gib' (number)"),
        (lambda t: t.replace('kind = "gpu"', 'kind = "tpu"'), "kind: expected one of"),
        (lambda t: t.replace('triple = "nvptx64-nvidia-cuda"', 'triple = "x86_64"'), "NVPTX"),
        (  # ptxas refuses 32-bit addressing for the GPUs aotune targets
            lambda t: t.replace('triple = "nvptx64-nvidia-cuda"', 'triple = "nvptx-nvidia-cuda"'),
            "is not a 64-bit NVPTX triple",
        ),
        (
            lambda t: t.replace("reserved_per_block = 1024", "reserved_per_block = 65536"),
            "shared.reserved_per_block (65536) must be below shared.bytes_per_block (49152)",
        ),
    ],
)
def test_broken_gpu_spec_names_file_key_and_expectation(tmp_path: Path, mutate, expected):
    path = tmp_path / "broken.toml"
    path.write_text(mutate(_a100()))
    with pytest.raises(HwSpecError) as info:
        load_spec_file(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_hw_show_prints_gpu_facts(capsys):
    assert main(["hw", "show", "h100"]) == 0
    out = capsys.readouterr().out
    assert "sm_90" in out and "132 SMs" in out and "227" not in out.split("shared")[0]
    assert "232448 opt-in" in out and "1024 B reserved per block" in out
    assert main(["hw", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in GPU_TARGETS)


def test_a_spec_whose_limits_leave_no_room_is_an_error_not_a_winner(tmp_path: Path, capsys):
    """Registers so few that no block fits an SM: tune and predict say so (they printed an
    infinite time and exit 0), and a grid limit of one block per axis is a constraint of the
    space (it was accepted and never enforced)."""

    text = _a100()
    tight = tmp_path / "regs.toml"
    tight.write_text(
        text.replace("registers_per_sm = 65536", "registers_per_sm = 1024")
        .replace("max_registers_per_block = 65536", "max_registers_per_block = 1024")
        .replace("max_registers_per_thread = 255", "max_registers_per_thread = 16")
    )
    argv = ["tune", "matmul", "--shape", "64x64x64", "--target", str(tight), "--budget", "16",
            "--no-verify", "--no-db"]  # fmt: skip
    assert main(argv) == 2 and "no kernel the search compiled can launch" in capsys.readouterr().err
    one_block = tmp_path / "grid.toml"
    one_block.write_text(
        text.replace("max_grid_x = 2147483647", "max_grid_x = 1").replace(
            "max_grid_yz = 65535", "max_grid_yz = 1"
        )
    )
    assert main([*argv[:5], str(one_block), *argv[6:], "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["top"] and all(t["launch"]["grid"][:2] == [1, 1] for t in doc["top"])


def test_a_workload_whose_tensors_exceed_device_memory_is_refused(tmp_path: Path, capsys):
    """Nothing stopped a 100000^3 matmul (112 GiB of tensors) being tuned for a 40 GiB A100: the
    space now refuses tensors beyond the spec's memory.dram_gib, and takes them up to it."""
    argv = ["tune", "matmul", "--shape", "100000x100000x100000", "--target", "a100", "--no-db"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "device memory of a100" in err and "requires 111.76, the target has 40" in err
    assert "A 37.3, B 37.3, C 37.3" in err and "memory.dram_gib" in err
    small = tmp_path / "small.toml"
    small.write_text(re.sub(r"dram_gib = .*", "dram_gib = 0.25", _a100()))
    hw = load_spec_file(small)
    assert build_gpu_space(matmul(4096, 4096, 4096), hw).variables  # 0.1875 GiB
    with pytest.raises(HardwareLimitError, match="requires 0.32, the target has 0.25"):
        build_gpu_space(matmul(4096, 4096, 8192), hw)  # 0.3125 GiB


def test_json_output_is_strict_json():
    """A kernel that cannot launch is predicted to take forever: JSON has no Infinity (json.dumps
    writes one that strict parsers refuse), so it is null."""
    from aotune.files import json_text

    text = json_text({"seconds": math.inf, "parts": [1.0, math.nan, {"x": -math.inf}]})
    assert json.loads(text, parse_constant=lambda c: 1 / 0) == {
        "seconds": None,
        "parts": [1.0, None, {"x": None}],
    }


def test_real_gpus_the_relations_must_not_refuse(tmp_path: Path):
    """NVIDIA's own name for a generation ("Ada Lovelace", "Ampere GA100") is its generation,
    and before Volta shared memory was apart from L1 (a GTX 1080: 96 KiB shared, 48 KiB L1)."""
    text = _a100()
    cases = [
        text.replace('generation = "ampere"', 'generation = "Ampere GA100"'),
        re.sub(r"l1_kib = \d+", "l1_kib = 48", text)
        .replace("sm = 80", "sm = 61")
        .replace('generation = "ampere"', 'generation = "pascal"'),
        text.replace("sm = 80", "sm = 100")  # a B200: PTX 8.6 introduced sm_100
        .replace("ptx_version = 70", "ptx_version = 86")
        .replace('generation = "ampere"', 'generation = "blackwell"'),
    ]
    for i, case in enumerate(cases):
        path = tmp_path / f"ok{i}.toml"
        path.write_text(case)
        assert load_spec_file(path).name == "a100"
