"""``aotune accuracy``: the Kernel Tuner reader, the Xgemm mapping parameter by parameter, and the
scores against measured times (on a small hand-made cache; the two real files where present)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from aotune.analysis.gpu_model import thread_elements
from aotune.analysis.workload import matmul
from aotune.benchmarks.kernel_tuner import UNKNOWN_DEVICE, read_cache
from aotune.benchmarks.measured import (
    device_looks_like,
    host_accuracy,
    measured_accuracy,
    target_for_device,
)
from aotune.benchmarks.suite import kendall, median_abs_error, spearman
from aotune.codegen.cuda_tools import ToolMissingError
from aotune.constraints.gpu import build_gpu_space
from aotune.constraints.xgemm import check_xgemm_parameters, xgemm_to_config, xgemm_workload
from aotune.errors import CodegenError, ConfigError, MeasurementFileError
from aotune.hwspecs.spec import SPEC_DIR, load_target
from hypothesis import given, settings
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "kernel-tuner"
KEYS = ["MWG", "NWG", "KWG", "MDIMC", "NDIMC", "MDIMA", "NDIMB", "KWI", "VWM", "VWN", "STRM",
        "STRN", "SA", "SB", "PRECISION"]  # fmt: skip
JSON_FIELDS = ["target", "kernel", "configs", "mapped", "rejected_by_space", "scored", "spearman",
               "kendall", "top1", "top5", "top10", "median_abs_error", "seconds"]  # fmt: skip
BASE = dict(MWG=64, NWG=64, KWG=32, MDIMC=16, NDIMC=16, MDIMA=16, NDIMB=16, KWI=2, VWM=2, VWN=2,
            STRM=0, STRN=0, SA=1, SB=1, PRECISION=32)  # fmt: skip
# a small space of real Xgemm configs for a 256^3 problem, with made-up times; the last one breaks
# aotune's space (MWG=16 is not a multiple of MDIMC*VWM=32): it must be counted as rejected
CONFIGS = [
    (dict(BASE), 3.0),
    (dict(BASE, MDIMA=8), 3.1),
    (dict(BASE, SA=0), 2.5),
    (dict(BASE, SA=0, MDIMA=8), 2.6),  # the same kernel as the one before: SA=0 ignores MDIMA
    (dict(BASE, MWG=128, NWG=128, VWM=4, VWN=4), 1.0),
    (dict(BASE, MWG=128, NWG=64, VWM=4), 1.5),
    (dict(BASE, MWG=32, NWG=32, MDIMC=8, NDIMC=8, MDIMA=8, NDIMB=8, VWM=1, VWN=1), 6.0),
    (dict(BASE, MWG=16, NWG=16, MDIMC=8, NDIMC=8, MDIMA=8, NDIMB=8, VWM=1, VWN=1), 9.0),
    (dict(BASE, KWI=8, SB=0), 2.8),
    (dict(BASE, VWM=1, VWN=1), 4.0),
    (dict(BASE, STRM=1, STRN=1), 2.9),
    (dict(BASE, KWG=16, MDIMA=32, NDIMB=32), 3.3),
    (dict(BASE, MWG=16, MDIMC=32, NDIMC=8, MDIMA=8, NDIMB=8, VWM=1), 7.0),
]


def kernel_tuner_text(configs, kernel="Xgemm", closed=True, problem=(256, 256)) -> str:
    """A cache file as Kernel Tuner writes it: the header without its closing braces, then one
    entry and a comma at a time; ``closed`` replaces the last comma with the braces."""
    keys = list(configs[0][0]) if configs else KEYS
    header = OrderedDict(
        device_name="Test GPU",
        kernel_name=kernel,
        problem_size=list(problem),
        tune_params_keys=keys,
        tune_params={k: sorted({c[k] for c, _ in configs}) for k in keys},
        objective="time",
        cache={},
    )
    text = json.dumps(header, indent="")[:-3]  # Kernel Tuner's own cut: no '}\n}'
    for params, ms in configs:
        key = ",".join(str(params[k]) for k in keys)
        entry = {**params, "time": ms, "times": [ms] * 3, "GFLOP/s": 1.0}
        text += "\n" + json.dumps({key: entry})[1:-1] + ","
    return text[:-1] + "}\n}" if closed and configs else text


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kt") / "gemm_test.json"
    path.write_text(kernel_tuner_text(CONFIGS))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "aotune", *args], capture_output=True, text=True, timeout=600
    )


# ---- the reader --------------------------------------------------------------------------------


def test_reader_takes_plain_gzipped_and_unterminated_files_alike(tmp_path: Path, cache_file: Path):
    plain = read_cache(cache_file)
    gz = tmp_path / "c.json.gz"
    gz.write_bytes(gzip.compress(cache_file.read_bytes()))
    open_end = tmp_path / "open.json"  # still tuning: ends in ',' then EOF
    open_end.write_text(kernel_tuner_text(CONFIGS, closed=False))
    assert open_end.read_text().endswith(",")
    for other in (read_cache(gz), read_cache(open_end)):
        assert other.configs == plain.configs
    assert not plain.truncated and read_cache(open_end).truncated
    assert plain.kernel_name == "Xgemm" and plain.problem_size == (256, 256)
    assert len(plain.configs) == len(CONFIGS) and plain.failed == 0
    first = plain.configs[0]
    assert first.as_dict() == CONFIGS[0][0] and first.milliseconds == CONFIGS[0][1]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, len(CONFIGS)), st.booleans())
def test_a_cache_cut_after_any_entry_reads_the_entries_before_the_cut(n: int, gzipped: bool):
    text = kernel_tuner_text(CONFIGS[:n], closed=False)
    raw = gzip.compress(text.encode()) if gzipped else text.encode()
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(raw)
        f.flush()
        c = read_cache(f.name)
    assert [m.milliseconds for m in c.configs] == [ms for _, ms in CONFIGS[:n]]
    assert c.truncated


def test_failed_configs_are_counted_not_scored(tmp_path: Path):
    doc = json.loads(kernel_tuner_text(CONFIGS[:3]))
    first = next(iter(doc["cache"]))
    doc["cache"][first]["time"] = "InvalidConfig"
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(doc))
    c = read_cache(path)
    assert c.failed == 1 and len(c.configs) == 2


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "is empty; pass a Kernel Tuner cache file"),
        (b" \n\n", "is empty; pass a Kernel Tuner cache file"),
        (gzip.compress(b"", mtime=0), "unpacks to no text; pass a Kernel Tuner cache file"),
        (b"not json at all", "not a Kernel Tuner cache file"),
        (b"[1, 2, 3]", "JSON list"),
        (b'{"kernel_name": "Xgemm"}', "lacks tune_params_keys, cache"),
        (
            b'{"metadata": {"timeunit": "milliseconds"}, "schema_version": "1.0.0", '
            b'"results": [{"configuration": {"MWG": 64}, "measurements": []}]}',
            r"is a T4 results file \(schema \"1.0.0\"\).*pass the Kernel Tuner cache file",
        ),
        (b"\x1f\x8b\x08\x00garbage", "gzip stream is damaged"),
        # a stored block whose length and its complement disagree: zlib's own error
        (
            b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + b"\x00\x05\x00\x00\x00" + b"x" * 40,
            "damaged",
        ),
        (gzip.compress(gzip.compress(b'{"cache": {}}', mtime=0), mtime=0), "gzipped twice"),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "cache": {"1": {"A": 1, '
            b'"time": "3.0"}}}',
            "failure markers",
        ),
        (b"\xff\xfe\x00", "not UTF-8"),
        (
            b'{"kernel_name": "Xgemm", "tune_params_keys": ["MWG"], "cache": {"1": {"MWG": 1}}}',
            "lacks time",
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "cache": {"1": {"A": 1, "time": 0}}}',
            "positive number",
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], '
            b'"cache": {"1": {"A": 0.5, "time": 1}}}',
            "integer parameters",
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "tune_params": [1, 2], '
            b'"cache": {"1": {"A": 1, "time": 1}}}',
            "tune_params is a JSON list",
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "problem_size": [4096, "x"], '
            b'"cache": {"1": {"A": 1, "time": 1}}}',
            r"problem_size is \[4096, 'x'\]",
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "problem_size": "4096x4096", '
            b'"cache": {"1": {"A": 1, "time": 1}}}',
            "not a list of positive integers",
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "problem_size": [0, 4096], '
            b'"cache": {"1": {"A": 1, "time": 1}}}',
            "not a list of positive integers",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"cache": ' + b"[" * 100_000, "nested too deeply"),
        (b'{"cache": {"1": {"A": ' + b"1" * 5000 + b"}}}", "a number of thousands of digits"),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "cache": {"1": {"A": NaN, '
            b'"time": 1}}}',
            "A=NaN; aotune maps only integer",
        ),
        (  # shown as the file has it: quoted, so "64" does not read as the integer 64
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "cache": {"1": {"A": "64", '
            b'"time": 1}}}',
            'A="64"; aotune maps only integer',
        ),
        (
            b'{"kernel_name": "X", "tune_params_keys": ["A"], "cache": {"1": {"A": -16, '
            b'"time": 1}}}',
            r"A=-16; a kernel parameter is an integer in 0\.\.",
        ),
    ],
)
def test_a_file_that_is_not_a_cache_is_one_error_naming_it(tmp_path: Path, content, says):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(MeasurementFileError, match=says) as e:
        read_cache(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_missing_files_and_directories_are_errors(tmp_path: Path):
    with pytest.raises(MeasurementFileError, match="No such file"):
        read_cache(tmp_path / "nothing.json")
    with pytest.raises(MeasurementFileError, match="directory"):
        read_cache(tmp_path)


@pytest.mark.parametrize("name", ["gemm_RTX_2080_Ti.json.gz", "gemm_RTX_Titan.json.gz"])
def test_the_real_files_read_whole(name: str):
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} is not beside this checkout")
    c = read_cache(path)
    assert c.kernel_name == "Xgemm" and len(c.configs) == 17956 and c.failed == 0
    assert c.problem_size == (4096, 4096) and not c.truncated
    values: dict[str, set[int]] = {}
    for m in c.configs:
        for k, v in m.params:
            values.setdefault(k, set()).add(v)
    check_xgemm_parameters({k: sorted(v) for k, v in values.items()}, name)  # no error
    fastest = {"gemm_RTX_2080_Ti.json.gz": 11.48, "gemm_RTX_Titan.json.gz": 11.47}  # data README
    assert min(m.milliseconds for m in c.configs) == pytest.approx(fastest[name], abs=0.005)


# ---- the mapping, one parameter at a time ------------------------------------------------------


@pytest.fixture(scope="module")
def space():
    return build_gpu_space(xgemm_workload(4096, 4096, 4096), load_target("rtx-2080-ti"))


BASE_CONFIG = dict(bm=64, bn=64, bk=32, tx=16, ty=16, vm=2, vn=2, strm=0, strn=0, sa=1, sb=1,
                   la=16, lb=16, va=2, vb=2, unroll=2, pad_a=0, pad_b=0, ahead=0)  # fmt: skip


@pytest.mark.parametrize(
    "change, expect",
    [
        ({}, {}),
        ({"MWG": 128}, {"bn": 128}),  # Xgemm's M is aotune's n: C and Xgemm's A contiguous there
        ({"NWG": 32}, {"bm": 32}),
        ({"KWG": 16}, {"bk": 16}),  # newer tuning scripts vary KWG
        ({"MDIMC": 8}, {"ty": 8}),
        ({"NDIMC": 8}, {"tx": 8}),
        ({"MDIMA": 8}, {"lb": 8}),  # Xgemm's A is aotune's B
        ({"NDIMB": 32}, {"la": 32}),
        ({"KWI": 8}, {"unroll": 8}),
        ({"VWM": 4}, {"vn": 4, "vb": 4}),  # registers/loads of Xgemm's A, and its staging loads
        ({"VWN": 1}, {"vm": 1, "va": 1}),
        ({"STRM": 1}, {"strn": 1}),  # newer tuning scripts vary STRM and STRN
        ({"STRN": 1}, {"strm": 1}),
        # not staged: its layout is unused (canonical), and aotune reads it a k step ahead
        ({"SA": 0}, {"sb": 0, "lb": 1, "vb": 1, "ahead": 1}),
        ({"SB": 0}, {"sa": 0, "la": 1, "va": 1, "ahead": 1}),
        ({"SA": 0, "MDIMA": 32}, {"sb": 0, "lb": 1, "vb": 1, "ahead": 1}),  # MDIMA ignored
        ({"GEMMK": 0, "KREG": 1}, {}),  # the only values of this family
    ],
)
def test_each_xgemm_parameter_maps_to_the_decision_with_its_meaning(space, change, expect):
    cfg = xgemm_to_config({**BASE, **change}, space)
    assert cfg.as_dict() == {**BASE_CONFIG, **expect}
    assert space.violations(cfg) == []


def test_values_no_xgemm_can_have_are_named(space):
    """A size, thread count or width below 1, or a switch other than 0 or 1, is a damaged entry,
    not a config aotune's constraints reject."""
    for change, says in (({"MWG": 0}, "MWG=0"), ({"VWN": -2}, "VWN=-2"), ({"SA": 2}, "SA=2")):
        with pytest.raises(ConfigError, match=f"{says} is no value of it"):
            xgemm_to_config({**BASE, **change}, space)


@pytest.mark.parametrize(
    "change, says",
    [({"GEMMK": 1}, "GEMMK=1"), ({"KREG": 4}, "KREG=4"), ({"PRECISION": 64}, "PRECISION=64")],
)
def test_values_outside_the_family_are_named(space, change, says):
    with pytest.raises(ConfigError, match=says):
        xgemm_to_config({**BASE, **change}, space)
    with pytest.raises(ConfigError, match=says):
        check_xgemm_parameters({k: [v] for k, v in {**BASE, **change}.items()}, "f.json")


def test_unknown_and_missing_parameters_are_named():
    with pytest.raises(ConfigError, match="WGD have no aotune meaning"):
        check_xgemm_parameters({**{k: [v] for k, v in BASE.items()}, "WGD": [8]}, "f.json")
    with pytest.raises(ConfigError, match="lack SA"):
        check_xgemm_parameters({k: [v] for k, v in BASE.items() if k != "SA"}, "f.json")


@pytest.mark.parametrize("strm", [0, 1])
@pytest.mark.parametrize("mwg, mdimc, vwm", [(128, 16, 4), (64, 8, 2), (128, 32, 1), (64, 8, 8)])
def test_a_threads_elements_are_xgemms_for_both_strides(space, strm, mwg, mdimc, vwm):
    """CLBlast's LocalToPrivateA / GlobalToPrivateA: vector _mi of thread id0 is at
    _mi + id0*(MWI/VWM) (STRM=0) or id0 + _mi*MDIMC (STRM=1); aotune's runs along its n axis
    (strn, vn, ty) must be the same elements."""
    mwi = mwg // mdimc
    cfg = xgemm_to_config(
        {**BASE, "MWG": mwg, "MDIMC": mdimc, "VWM": vwm, "STRM": strm, "MDIMA": 8}, space
    ).as_dict()
    for id0 in range(mdimc):
        vectors = [(_mi + id0 * (mwi // vwm)) if strm == 0 else (id0 + _mi * mdimc)
                   for _mi in range(mwi // vwm)]  # fmt: skip
        clblast = [v * vwm + e for v in vectors for e in range(vwm)]
        ours = thread_elements(id0, cfg["bn"] // cfg["ty"], cfg["vn"], cfg["ty"], cfg["strn"])
        assert ours == clblast


# ---- the scores ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scored(cache_file: Path):
    return measured_accuracy(cache_file, "rtx-2080-ti", sample=10, candidates=10, seed=3)


def test_every_config_is_mapped_and_the_space_breaker_is_reported(scored):
    assert scored.configs == len(CONFIGS) == scored.mapped
    assert len(scored.rejected) == 1
    key, why = scored.rejected[0]
    assert key.startswith("16,64,32,32,8,8,8,") and "thread tile N" in why
    # configs 2 and 3 are one kernel: scored once, at the mean of their times
    assert scored.scored == len(CONFIGS) - 1 and len(scored.kernels) == len(CONFIGS) - 2
    same = [k for k in scored.kernels if len(k.entries) == 2]
    assert len(same) == 1 and same[0].measured_ms == pytest.approx(2.55)


def test_scores_follow_their_definitions(scored):
    ks = scored.kernels
    measured = np.array([k.measured_ms for k in ks])
    picks = [ks[j].measured_ms for j in scored.picks]
    for k, score in zip((1, 5, 10), scored.top):
        assert score == pytest.approx(measured.min() / min(picks[:k]))
    assert scored.top[0] <= scored.top[1] <= scored.top[2] <= 1.0
    p = np.array([ks[j].tier2_ms for j in scored.sample])
    m = measured[list(scored.sample)]
    assert len(scored.sample) == 10
    assert scored.spearman == pytest.approx(spearman(p, m))
    assert scored.kendall == pytest.approx(kendall(p, m))
    assert scored.median_abs_error == pytest.approx(float(np.median(np.abs(p / m - 1))))
    # the picks are ranked as the search ranks them: tier 2, kernels that spill last
    order = [(ks[j].spills, ks[j].tier2_ms) for j in scored.picks]
    assert order == sorted(order)
    assert list(scored.as_json()) == JSON_FIELDS


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=30), st.floats(0.1, 10.0))
def test_median_abs_error_is_zero_for_exact_and_scales_with_a_uniform_factor(xs, factor):
    x = np.array(xs)
    assert median_abs_error(x, x) == 0.0
    assert median_abs_error(x * factor, x) == pytest.approx(abs(factor - 1.0))


# ---- the command -------------------------------------------------------------------------------


def test_accuracy_command_prints_the_json_fields_and_the_plot(cache_file: Path, tmp_path: Path):
    png = tmp_path / "acc.png"
    args = ("accuracy", "--measured", str(cache_file), "--target", "titan-rtx", "--json")
    proc = run_cli(*args, "--sample", "10", "--candidates", "10", "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    # the file's "Test GPU" is not a TITAN RTX: said on stderr, the JSON on stdout unchanged
    assert "warning: " in proc.stderr and "measured on Test GPU" in proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc) == JSON_FIELDS
    assert doc["target"] == "titan-rtx" and doc["kernel"] == "Xgemm"
    assert doc["configs"] == doc["mapped"] == len(CONFIGS) and doc["rejected_by_space"] == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same times 10^5 times smaller: faster than a TITAN RTX can run them; the ranks stand
    seconds = tmp_path / "small.json"
    seconds.write_text(kernel_tuner_text([(c, ms / 1e5) for c, ms in CONFIGS]))
    proc = run_cli("accuracy", "--measured", str(seconds), "--target", "titan-rtx", "--json",
                   "--sample", "10", "--candidates", "10")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"{len(CONFIGS)} of the file's {len(CONFIGS)} times are too fast" in proc.stderr
    in_seconds = json.loads(proc.stdout)
    assert in_seconds["spearman"] == doc["spearman"] and in_seconds["top1"] == doc["top1"]
    plain = run_cli(*args, "--sample", "10").stderr
    assert "too slow" not in proc.stderr + plain and "times are over" not in proc.stderr + plain
    # and 10^5 times larger (microseconds written as ms, say): slower than any GPU tunes to
    slow = tmp_path / "slow.json"
    slow.write_text(kernel_tuner_text([(c, ms * 1e5) for c, ms in CONFIGS]))
    proc = run_cli("accuracy", "--measured", str(slow), "--target", "titan-rtx", "--json",
                   "--sample", "10", "--candidates", "10")  # fmt: skip
    assert proc.returncode == 0 and "fastest time" in proc.stderr and "too slow" in proc.stderr
    assert json.loads(proc.stdout)["spearman"] == doc["spearman"]
    outlier = tmp_path / "outlier.json"  # one time of 1e20 ms among real ones
    outlier.write_text(kernel_tuner_text([(CONFIGS[0][0], 1e20), *CONFIGS[1:]]))
    proc = run_cli("accuracy", "--measured", str(outlier), "--target", "titan-rtx", "--json",
                   "--sample", "10", "--candidates", "10")  # fmt: skip
    assert proc.returncode == 0 and f"1 of the file's {len(CONFIGS)} times are over" in proc.stderr
    # --force replaces an earlier plot, never the file being scored or the spec
    for victim, flag in ((tmp_path / "m.png", "--measured"), (tmp_path / "t.png", "--target")):
        source = cache_file if flag == "--measured" else SPEC_DIR / "titan-rtx.toml"
        victim.write_bytes(source.read_bytes())
        before = victim.read_bytes()
        argv = ["accuracy", "--measured", str(victim if flag == "--measured" else cache_file),
                "--target", str(victim) if flag == "--target" else "titan-rtx"]  # fmt: skip
        refused = run_cli(*argv, "--plot", str(victim), "--force")
        assert refused.returncode == 2 and f"is the {flag} " in refused.stderr
        assert victim.read_bytes() == before
    again = run_cli(*args, "--plot", str(png))  # refused before any work, the plot kept
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr


@pytest.mark.parametrize(
    "device, target, same",
    [
        ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti", True),  # the two files of the repository
        ("NVIDIA TITAN RTX", "titan-rtx", True),
        ("NVIDIA TITAN RTX", "rtx-2080-ti", False),
        ("NVIDIA GeForce RTX 2080 Ti", "titan-rtx", False),
        ("Tesla V100-SXM2-16GB", "v100", True),  # nvidia-smi's forms: a memory size is no model
        ("NVIDIA A100-SXM4-80GB", "a100", True),
        ("NVIDIA A100-SXM4-80GB", "h100", False),
        ("NVIDIA A10", "a100", False),
        ("NVIDIA A10", "a10", True),
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "rtx-3060-laptop", True),
        ("NVIDIA GeForce RTX 3060", "rtx-3060-laptop", False),  # a variant word differs
        ("NVIDIA GeForce RTX 2080", "rtx-2080-ti", False),
        ("NVIDIA GeForce RTX 3090 Ti", "rtx-3090", False),
        ("NVIDIA A100 80 GB", "h100", False),  # a memory size names no GPU (h100's is 80 GB)
        ("NVIDIA H100 PCIe", "h100", False),  # 114 SMs: not the SXM part of the spec
        ("NVIDIA H100 NVL", "h100", False),
        ("NVIDIA A100 80GB PCIe", "a100", False),
    ],
)
def test_a_file_s_device_is_matched_to_the_target_by_its_model_number(device, target, same):
    assert device_looks_like(device, load_target(target)) is same


@pytest.mark.parametrize(
    "make, args, says",
    [
        (lambda: kernel_tuner_text(CONFIGS[:2], kernel="convolution"), (), "kernel 'convolution'"),
        (lambda: kernel_tuner_text([({**BASE, "GEMMK": 1}, 1.0)]), (), "GEMMK=1"),
        (lambda: kernel_tuner_text([({**BASE, "WGD": 8}, 1.0)]), (), "WGD have no aotune"),
        (lambda: kernel_tuner_text([]), (), "no timed configuration"),
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("--target", "host"), "GPU kernel"),
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("--target", "nope"), "nope"),
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("matmul",), "leave out the workload"),
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("--shape", "128x256x256"), "disagrees"),
        # read as every command reads a matmul shape: commas too, and the same words for a bad one
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("--shape", "128,256,256"), "disagrees"),
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("--shape", "-1x256x256"), "positive integer"),
        (lambda: kernel_tuner_text(CONFIGS[:2]), ("--sample", "3"), "at least 10"),
        (lambda: kernel_tuner_text(CONFIGS[:3]), (), "holds 3 timed configurations"),
        (  # ten timed configs, eight kernels: SA=0 ignores MDIMA
            lambda: kernel_tuner_text([*CONFIGS[:9], (dict(BASE, SA=0, MDIMA=32), 2.7)]),
            ("--json",),
            "are 8 distinct kernels",
        ),
        (
            lambda: kernel_tuner_text([(c, 2.0) for c, _ in CONFIGS]),
            ("--json",),
            "the same time (2 ms)",
        ),
        (
            lambda: kernel_tuner_text([(dict(BASE, MWG=16, KWG=k), 1.0) for k in range(16, 26)]),
            ("--json",),  # no progress lines on stderr
            "refuses every configuration (the first, '16,",
        ),
        (lambda: kernel_tuner_text(CONFIGS), ("--plot", "acc.txt"), "name it *.png"),
    ],
)
def test_accuracy_command_errors_are_one_line_exit_2(tmp_path: Path, make, args, says):
    path = tmp_path / "c.json"
    path.write_text(make())
    target = () if "--target" in args else ("--target", "rtx-2080-ti")
    proc = run_cli("accuracy", *args, "--measured", str(path), *target)
    assert proc.returncode == 2, proc.stdout
    assert says in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_an_empty_measured_file_name_says_so():
    proc = run_cli("accuracy", "--measured", "", "--target", "rtx-2080-ti")
    assert proc.returncode == 2 and "--measured is an empty file name" in proc.stderr


def test_accuracy_of_a_workload_needs_a_machine_that_runs_it():
    proc = run_cli("accuracy", "matmul", "--shape", "8x8x8", "--sample", "10")
    assert proc.returncode == 2 and "give at least 20" in proc.stderr  # top-10 of 10 is 1.0
    proc = run_cli("accuracy", "matmul", "--shape", "64x64x64", "--target", "t4")
    assert proc.returncode == 2 and "--measured" in proc.stderr
    proc = run_cli("accuracy", "--target", "t4", "--plot", "x.png")
    assert proc.returncode == 2 and "--measured FILE only" in proc.stderr


def test_accuracy_of_a_workload_on_this_host_has_the_same_fields(host):
    doc = host_accuracy(matmul(48, 40, 24), host, samples=20, seed=1, timing_seconds=(0.0, 0.0))
    assert list(doc) == JSON_FIELDS
    assert doc["configs"] == doc["scored"] == 20 and doc["rejected_by_space"] == 0
    assert 0.0 < doc["top1"] <= doc["top5"] <= doc["top10"] <= 1.0


def test_bench_rows_say_where_a_missing_file_was_looked_for(tmp_path: Path):
    import io

    from aotune.benchmarks.measured import bench_rows, print_bench_rows
    from rich.console import Console

    rows = bench_rows(data_dir=tmp_path)
    assert [r["target"] for r in rows] == ["rtx-2080-ti", "titan-rtx"]
    assert all(str(tmp_path) in r["skipped"] for r in rows)
    scored = {"file": "f.json.gz", **dict.fromkeys(JSON_FIELDS, 0.5), "target": "t4"}
    out = io.StringIO()
    print_bench_rows([*rows, scored], Console(file=out, width=400))  # no wrapped cell
    assert "not found" in out.getvalue() and "t4" in out.getvalue()


def test_a_bare_problem_size_and_a_null_device_name_read(tmp_path: Path):
    doc = json.loads(kernel_tuner_text(CONFIGS[:3]))
    doc["problem_size"], doc["device_name"] = 4096, None
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    c = read_cache(path)
    assert c.problem_size == (4096,) and c.device_name == "unknown device"


def test_accuracy_on_this_host_warns_when_others_shared_its_timing(host, monkeypatch):
    from aotune import machine_load

    busy = machine_load.Sharing(seconds=3.0, cpus=2, others_cpus=0.9, stolen_share=0.15)
    monkeypatch.setattr(machine_load, "sharing", lambda before, after: busy)
    said: list[str] = []
    doc = host_accuracy(
        matmul(48, 40, 24), host, 20, seed=1, timing_seconds=(0.0, 0.0), warn=said.append
    )
    assert list(doc) == JSON_FIELDS  # the fields of --measured, unchanged
    assert len(said) == 1 and "other processes kept 0.9 of the 2 CPUs busy" in said[0]
    assert "hypervisor gave 15%" in said[0] and "while the samples were timed" in said[0]


def test_a_sample_larger_than_the_space_says_so(host):
    """A 1 x 1 x 1 matmul's space holds 24 configs: --sample 30 scores all of them and says
    that it found no more (the JSON's configs field counts them), rather than nothing."""
    said: list[str] = []
    doc = host_accuracy(
        matmul(1, 1, 1), host, 30, seed=1, timing_seconds=(0.0, 0.0), warn=said.append
    )
    assert doc["configs"] == doc["scored"] < 30
    assert [s for s in said if "--sample 30: the sampler's draws found only" in s]


def test_a_sample_past_the_files_kernels_says_tier_2_compiles_them_all(tmp_path: Path):
    """``--sample`` (or ``--candidates``) above a large file's distinct kernels compiles every
    one of them in tier 2: a warning says so, and how much longer than the defaults, before the
    compiling starts; the defaults say nothing."""
    import itertools

    class Stop(Exception):
        pass

    def stop_at_tier_2(text: str) -> None:
        if text.startswith("tier 2: compiling"):
            raise Stop

    configs = []
    for mwg, nwg, kwg, mdc, ndc, vwm, vwn, sa, sb in itertools.product(
        (32, 64, 128),
        (32, 64, 128),
        (16, 32),
        (8, 16),
        (8, 16),
        (1, 2, 4),
        (1, 2, 4),
        (0, 1),
        (0, 1),
    ):
        if mwg % (mdc * vwm) == 0 and nwg % (ndc * vwn) == 0:
            ab = dict(MDIMC=mdc, NDIMC=ndc, MDIMA=mdc, NDIMB=ndc, SA=sa, SB=sb)
            params = dict(BASE, MWG=mwg, NWG=nwg, KWG=kwg, VWM=vwm, VWN=vwn, **ab)
            configs.append((params, 1.0 + 1e-3 * len(configs)))
    path = tmp_path / "gemm_big.json"
    path.write_text(kernel_tuner_text(configs))
    for sample, candidates, expected in ((5000, 320, "--sample 5000"), (1000, 320, None),
                                         (1000, 3000, "--candidates 3000")):  # fmt: skip
        said: list[str] = []
        with pytest.raises(Stop):
            measured_accuracy(
                path, "rtx-2080-ti", sample, candidates, log=stop_at_tier_2, warn=said.append
            )
        everything = [s for s in said if "distinct kernels" in s]
        if expected is None:
            assert not everything
        else:
            assert len(everything) == 1 and everything[0].startswith(f"{expected}: the file has ")
            assert "kernels, so tier 2 compiles every one, about 2x as long" in everything[0]


def test_given_configs_are_timed_side_by_side_with_their_predictions(host):
    """``accuracy WORKLOAD --config C ...``: each config checked, predicted and timed, in order,
    with the model's terms; the runs go through the counted path."""
    from aotune.benchmarks.measured import config_lines, host_configs
    from aotune.codegen.executions import executions
    from aotune.constraints.cpu import build_cpu_space

    w = matmul(37, 24, 29)  # primes and a size under a tile
    space = build_cpu_space(w, host)
    texts = [space.describe_config(c) for c in space.sample(2, seed=3)]
    before = executions()
    doc = host_configs(w, host, texts, seed=1, seconds=0.0)
    assert executions() > before
    assert [c["config"] for c in doc["configs"]] == texts
    for c in doc["configs"]:
        assert c["correct"] and c["measured_s"] > 0 and c["predicted_s"] > 0
        assert c["measured_over_predicted"] == pytest.approx(c["measured_s"] / c["predicted_s"])
        assert c["bottleneck"] in c["breakdown_s"]
    assert len(doc["clock_ghz"]) == 2 and doc["spec_clock_ghz"] == host.core.frequency_ghz
    # the FMAs a cycle the core issued beside them: some, and no more than any core's pipes
    assert len(doc["fma_per_cycle"]) == 2 and all(0 < r < 16 for r in doc["fma_per_cycle"])
    assert doc["spec_fma_per_cycle"] == host.vector_fmas_per_cycle
    lines = config_lines(doc)
    assert "FMAs a cycle (the spec's pipes" in lines[0]
    assert len(lines) == 1 + 2 * len(texts) and texts[0] in lines[1]


@pytest.mark.parametrize(
    "args, says",
    [
        (("--config", "mr=1"), "config is missing nr"),
        (("--config", "mr=1", "--sample", "20"), "--sample does something else"),
        (("--config", "mr=1", "--target", "t4"), "--measured FILE"),
        (
            (
                "--config",
                "mr=1,nr=8,kc=8,mc=1,nc=8,order=nkm,pack_a=0,pack_b=0,unroll=1,par=m,"
                "threads=1,nope=2",
            ),
            "unknown decision 'nope'",
        ),
        (
            (
                "--config",
                "mr=99,nr=8,kc=8,mc=1,nc=8,order=nkm,pack_a=0,pack_b=0,unroll=1,par=m,threads=1",
            ),
            "is not valid for matmul 16x16x16",
        ),
        (
            (
                "--config",
                "mr=1,nr=16,kc=8,mc=1,nc=16,order=nkm,pack_a=0,pack_b=0,unroll=1,par=m,threads=1",
                "--config",
                "nr=16,mr=1,kc=8,mc=1,nc=16,order=nkm,pack_a=0,pack_b=0,unroll=1,par=m,threads=1",
            ),
            "is given twice",
        ),
    ],
)
def test_given_configs_that_cannot_be_timed_are_one_line_errors(args, says):
    proc = run_cli("accuracy", "matmul", "--shape", "16x16x16", *args)
    assert proc.returncode == 2, proc.stdout
    assert says in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_a_device_name_a_terminal_would_act_on_is_shown_as_text(tmp_path: Path):
    """A file's device and kernel names are printed (accuracy's progress line, its warnings):
    escape sequences and bidirectional overrides were printed raw; they read as '?', and a
    name of thousands of characters is cut."""
    doc = json.loads(kernel_tuner_text(CONFIGS[:3]))
    doc["device_name"] = "NVIDIA \x1b[2J GeForce \u202eRTX" + "x" * 5000
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    c = read_cache(path)
    assert c.device_name.startswith("NVIDIA ?[2J GeForce ?RTX") and len(c.device_name) == 120
    assert all(ch.isprintable() for ch in c.device_name)


def test_a_damaged_time_is_left_out_of_the_plot_not_the_plot_out(tmp_path: Path):
    """One entry of 1e308 ms (warned of as over 1000x the median) stretched the log axes past
    what matplotlib draws: an empty PNG and its overflow warning on stderr. The plot now leaves
    such points out and says so."""
    damaged = tmp_path / "damaged.json"
    damaged.write_text(kernel_tuner_text([(CONFIGS[0][0], 1e308), *CONFIGS[1:]]))
    png = tmp_path / "damaged.png"
    proc = run_cli("accuracy", "--measured", str(damaged), "--target", "titan-rtx",
                   "--sample", "10", "--candidates", "10", "--plot", str(png))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "times are over 1000x its median" in proc.stderr and "Warning" not in proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_problem_size_out_of_range_names_the_file_s_problem_size(tmp_path: Path):
    path = tmp_path / "big.json"
    path.write_text(kernel_tuner_text(CONFIGS, problem=(10**12, 10**12)))
    proc = run_cli("accuracy", "--measured", str(path), "--target", "titan-rtx")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "big.json's problem_size (M=1000000000000" in proc.stderr and "too large" in proc.stderr


def test_plot_without_matplotlib_is_refused_first(cache_file, tmp_path, monkeypatch, capsys):
    """The run takes minutes on a real file: a missing matplotlib is said before it, not after."""
    from aotune.benchmarks import measured
    from aotune.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError

    def never(*args, **kwargs):
        raise AssertionError("scored before --plot was checked")

    monkeypatch.setattr(measured, "measured_accuracy", never)
    png = tmp_path / "acc.png"
    argv = ["accuracy", "--measured", str(cache_file), "--target", "titan-rtx", "--plot", str(png)]
    assert main(argv) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err and not png.exists()


@pytest.mark.parametrize(
    "device, target",
    [
        ("NVIDIA GeForce RTX 2080 Ti", "rtx-2080-ti"),
        ("NVIDIA TITAN RTX", "titan-rtx"),
        ("NVIDIA GeForce RTX 3060 Laptop GPU", "rtx-3060-laptop"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
    ],
)
def test_without_target_a_file_is_scored_with_the_spec_of_the_gpu_it_names(device, target):
    assert target_for_device(device, "gpu", "f.json") == target


@pytest.mark.parametrize(
    "device, says",
    [
        ("NVIDIA GeForce GTX 480", r"f.json was timed on NVIDIA GeForce GTX 480, and no built-in "),
        # no model number: every spec's words hold it
        (
            "NVIDIA GeForce",
            r"several built-in specs may be it \(a10, a100, .*\); give --target "
            r"with the one it is",
        ),
        (UNKNOWN_DEVICE, r"f.json names no device .*give --target \(built-in: a10, "),
    ],
)
def test_without_target_a_file_of_no_known_gpu_asks_for_one(device, says):
    with pytest.raises(ConfigError, match=says):
        target_for_device(device, "gpu", "f.json")


def test_accuracy_without_target_refuses_a_file_of_an_unknown_gpu(cache_file, tmp_path, capsys):
    from aotune.cli import main

    doc = json.loads(cache_file.read_text())
    doc["device_name"] = "NVIDIA GeForce GTX 480"  # no built-in spec: refused before any compile
    path = tmp_path / "gtx480.json"
    path.write_text(json.dumps(doc))
    assert main(["accuracy", "--measured", str(path)]) == 2
    assert "GTX 480, and no built-in spec is it" in capsys.readouterr().err


def test_accuracy_without_target_takes_the_spec_of_the_gpu_the_file_names(
    cache_file, tmp_path, monkeypatch
):
    from aotune.benchmarks import measured

    doc = json.loads(cache_file.read_text())
    doc["device_name"] = "NVIDIA TITAN RTX"
    path = tmp_path / "titan.json"
    path.write_text(json.dumps(doc))
    taken = []

    def recorded(hw):  # stop before minutes of compiling: the spec's name is the point
        taken.append(hw.name)
        raise ConfigError("stop")

    monkeypatch.setattr(measured, "target_for", recorded)
    said = []
    with pytest.raises(ConfigError, match="stop"):
        measured_accuracy(path, None, sample=10, candidates=10, log=said.append)
    assert taken == ["titan-rtx"]
    assert said[0] == "--target titan-rtx: the built-in spec of NVIDIA TITAN RTX"


class _FailingCompiles:
    """A target whose tier-2 compile fails with ``error``; everything else is the real one's."""

    def __init__(self, real, error):
        self._real, self._error = real, error

    def __getattr__(self, name):
        return getattr(self._real, name)

    def compile(self, schedule):
        raise self._error


@pytest.mark.parametrize(
    "error, says",
    [  # a missing ptxas is said once, not scored as NaN from kernels that all failed
        (ToolMissingError("ptxas is not installed"), "ptxas is not installed"),
        (CodegenError("ptxas refused it"), r"tier 2 compiled none of its \d+ kernels .*refused"),
    ],
)
def test_tier_2_that_compiles_nothing_is_an_error_not_nan_scores(
    cache_file, monkeypatch, error, says
):
    from aotune.benchmarks import measured

    real = measured.target_for
    monkeypatch.setattr(measured, "target_for", lambda hw: _FailingCompiles(real(hw), error))
    with pytest.raises(CodegenError, match=says):
        measured_accuracy(cache_file, "rtx-2080-ti", sample=10, candidates=10)
