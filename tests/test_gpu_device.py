"""The GPU final check's plumbing, tested without a GPU: ``tune`` on a machine with a GPU of the
target checks its top-k on the device (here the device's launch is replaced by the host emulation
of the same kernel, the one step this machine cannot do); the device bundle's prepare and score
steps (``benchmarks/gpu_device.py``) around the measure step that runs where the GPU is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aotune import cli
from aotune.analysis.workload import matmul
from aotune.benchmarks import gpu_device
from aotune.codegen import cuda_device
from aotune.codegen.gpu_emulator import check_emulated

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def emulated_device(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """A GPU of every target 'present': each launch is the kernel emulated on this CPU against the
    final check's own inputs, reference and tolerance; cuBLAS 'takes' 2 ms."""
    launches: list[tuple] = []

    def run(kernel, inputs, reference, tol, runs=10, budget_seconds=1.0):
        e = check_emulated(kernel, inputs=inputs, reference=reference)
        launches.append((kernel.entry, inputs[0].shape, tol, runs))
        return cuda_device.DeviceMeasurement(1e-3, runs, 0.0, e.correct, e.max_abs_error, tol)

    monkeypatch.setattr(cuda_device, "device_available", lambda hw: (True, ""))
    monkeypatch.setattr(cuda_device, "run_on_device", run)
    monkeypatch.setattr(cuda_device, "cublas_sgemm_seconds", lambda hw, m, n, k, runs=10: 2e-3)
    return launches


def test_tune_on_a_machine_with_the_gpu_checks_the_top_k_on_the_device(emulated_device, capsys):
    argv = ["tune", "matmul", "--shape", "67x33x29", "--target", "t4", "--budget", "64", "--no-db"]
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(emulated_device) == len(doc["verify"]) == len(doc["top"]) >= 1
    assert all(shape == (67, 29) and runs >= 10 for _, shape, _, runs in emulated_device)
    assert doc["verify_skipped"] is None and doc["search"]["measurements"] == 0
    for v in doc["verify"]:
        assert v["correct"] and v["measured_seconds"] == 1e-3 and "emulated" not in v
    flops = 2 * 67 * 33 * 29
    assert doc["numpy_gflops"] is None and doc["numpy_blas"] is None
    assert doc["baseline"] == {
        "name": "cuBLAS SGEMM (FP32, through cupy)",
        "gflops": flops / 2e-3 / 1e9,
    }
    assert doc["chosen"]["ratio_vs_baseline"] == pytest.approx(2.0)
    assert "ratio_vs_numpy" not in doc["chosen"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert f"final check on the GPU: {len(doc['top'])} of {len(doc['top'])} correct" in text
    assert "2.00x" in text and "TFLOP/s meas." in text


def test_the_device_check_of_a_fused_epilogue_has_no_cublas_baseline(emulated_device, capsys):
    argv = ["tune", "dense", "--shape", "20x24x16", "--bias", "--activation", "relu",
            "--target", "a100", "--budget", "32", "--no-db"]  # fmt: skip
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["baseline"]["gflops"] is None and doc["chosen"]["ratio_vs_baseline"] is None
    assert len(doc["verify"]) == len(doc["top"]) >= 1
    assert all(v["correct"] for v in doc["verify"])
    assert cli.main(argv) == 0
    assert "no cuBLAS SGEMM (FP32, through cupy) baseline" in capsys.readouterr().out


def test_a_wrong_kernel_on_the_device_is_reported_not_chosen(monkeypatch, emulated_device):
    from aotune.hwspecs.spec import load_target
    from aotune.search import driver
    from aotune.search.options import SearchOptions

    def wrong(kernel, inputs, reference, tol, runs=10, budget_seconds=1.0):
        return cuda_device.DeviceMeasurement(1e-4, runs, 0.0, False, 1.0, tol)

    monkeypatch.setattr(cuda_device, "run_on_device", wrong)
    result = driver.tune(matmul(33, 17, 9), load_target("a100"), SearchOptions(budget=32))
    verified, baseline = driver.verify(result)
    assert baseline == pytest.approx(2 * 33 * 17 * 9 / 2e-3 / 1e9)
    assert len(verified) == len(result.candidates) >= 1
    assert not any(v.measurement.correct for v in verified) and driver.chosen(verified) is None


def _fake_measured(bundle: dict, slower: float) -> dict:
    """Times as a GPU would report them: the prediction times ``slower`` plus a rank-keeping
    spread, every kernel correct but the last, which failed its numpy check."""
    rows = []
    for row in bundle["rows"]:
        ks = row["kernels"]
        kernels = [
            {"id": k["id"], "seconds": k["predicted_seconds"] * slower * (1 + 0.01 * i),
             "runs": 10, "spread": 0.01, "correct": True, "max_abs_error": 0.0,
             "tolerance": row["tolerance"]}
            for i, k in enumerate(sorted(ks, key=lambda k: k["predicted_seconds"]))
        ]  # fmt: skip
        kernels[-1]["correct"] = False
        rows.append({"name": row["name"], "kernels": kernels, "cupy_cublas_seconds": 1e-5,
                     "torch": None, "seconds": 1.0})  # fmt: skip
    return {"device": "a test double", "target": bundle["target"], "rows": rows}


def test_prepare_writes_a_bundle_the_device_step_can_run_and_score_reads(tmp_path: Path):
    rows = [("matmul 40x24x33", matmul(40, 24, 33), 5)]
    bundle = gpu_device.prepare(tmp_path, "a100", rows=rows, library=False, log=lambda _: None)
    on_disk = json.loads((tmp_path / gpu_device.BUNDLE).read_text())
    assert on_disk == json.loads(json.dumps(bundle)) and on_disk["sm"] == 80
    (row,) = on_disk["rows"]
    shipped = [k for k in row["kernels"] if k["shipped_rank"] is not None]
    assert [k["shipped_rank"] for k in shipped] == list(range(1, len(shipped) + 1))
    assert len(row["kernels"]) - len(shipped) <= 5 and len(row["kernels"]) > len(shipped)
    for k in row["kernels"]:
        assert (tmp_path / k["cubin"]).read_bytes()[:4] == b"\x7fELF"
        assert k["spill_bytes"] == 0 or k["shipped_rank"] is None
        assert k["predicted_seconds"] > 0 and len(k["launch"]["grid"]) == 3
    (a, b, bias), ref = gpu_device._inputs(tmp_path, row)
    assert bias is None and a.shape == (40, 33) and b.shape == (33, 24)
    assert np.allclose(ref, a.astype(np.float64) @ b.astype(np.float64))
    # the device step's output, as a GPU would write it, scored back here
    (tmp_path / gpu_device.MEASURED).write_text(json.dumps(_fake_measured(on_disk, 1.5)))
    (scored,) = gpu_device.score(tmp_path)["rows"]
    sample = len(row["kernels"]) - len(shipped)
    assert scored["correct"] == len(row["kernels"]) - 1 and len(scored["failed"]) == 1
    assert scored["sample"] in (sample, sample - 1)
    assert scored["median_abs_error"] == pytest.approx(1 - 1 / 1.5, abs=0.1)  # |p/m - 1|
    assert scored["median_measured_over_predicted"] == pytest.approx(1.5, abs=0.1)
    if scored["sample"] >= 3:
        assert scored["spearman"] == pytest.approx(1.0) and scored["top1"] == pytest.approx(1.0)
    assert scored["cupy_cublas_tflops"] == pytest.approx(2 * 40 * 24 * 33 / 1e-5 / 1e12)


def test_large_inputs_are_drawn_again_where_they_are_timed(tmp_path: Path):
    rows = [("matmul 24x16x40", matmul(24, 16, 40), 1)]
    gpu_device.prepare(tmp_path, "t4", rows=rows, library=False, carry_limit=0, log=print)
    row = json.loads((tmp_path / gpu_device.BUNDLE).read_text())["rows"][0]
    assert "draw" in row["inputs"] and not list(tmp_path.glob("*.npz"))
    (a, b, _), ref = gpu_device._inputs(tmp_path, row)
    assert np.allclose(ref, a @ b, rtol=1e-5, atol=1e-5)  # einsum sums in its own order
    row["inputs"]["a_sum"] += 1.0  # another numpy's generator would give other inputs: refused
    with pytest.raises(RuntimeError, match="differ"):
        gpu_device._inputs(tmp_path, row)


def test_measure_without_a_gpu_says_why_in_one_line(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "aotune.benchmarks.gpu_device", "measure", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("error: ") and "bundle.json" in proc.stderr


@pytest.mark.parametrize(
    "record, device, target",
    [
        ("h100-2026-11-26.json.gz", "NVIDIA H100 80GB HBM3", "h100"),
        ("h200-2026-11-30.json.gz", "NVIDIA H200", "h200"),
    ],
)
def test_a_gpu_record_in_the_repository_is_rescored_by_todays_model(record, device, target):
    """The H100 and H200 measurements kept in benchmarks/data are read and re-predicted (compiled
    again) without a GPU; the scores come from the times measured then."""
    import gzip

    path = ROOT / "benchmarks" / "data" / record
    rec = json.loads(gzip.decompress(path.read_bytes()))
    assert rec["device"] == device and rec["target"] == target
    assert sum(len(r["kernels"]) for r in rec["rows"]) == 373
    assert all(k["correct"] for r in rec["rows"] for k in r["kernels"])
    small = {**rec, "rows": rec["rows"][:1]}  # matmul 257x129x67: 7 kernels
    (row,) = gpu_device.rescore(small, log=lambda _: None)["rows"]
    times = [k["measured_seconds"] for k in rec["rows"][0]["kernels"]]
    shipped = [k for k in rec["rows"][0]["kernels"] if k["shipped_rank"] == 1]
    assert row["correct"] == 7 and row["sample"] == 4
    assert row["pick_tflops"] == pytest.approx(4442502 / shipped[0]["measured_seconds"] / 1e12)
    assert row["best_sampled_tflops"] <= 4442502 / min(times) / 1e12 + 1e-9
    assert 0 <= row["median_abs_error"] < 1 and -1 <= row["spearman"] <= 1


def _xgemm_cache(path: Path, n: int) -> Path:
    """A Kernel Tuner cache of Xgemm at 64^3: a few configs, times made up (slowest first)."""
    base = dict(MWG=32, NWG=32, KWG=16, MDIMC=8, NDIMC=8, MDIMA=8, NDIMB=8, KWI=2, VWM=1, VWN=1,
                STRM=0, STRN=0, SA=1, SB=1, PRECISION=32)  # fmt: skip
    variants = [dict(base, VWM=v, VWN=w, SA=sa) for v in (1, 2, 4) for w in (1, 2) for sa in (0, 1)]
    keys = list(base)
    cache = {}
    for i, params in enumerate(variants[:n]):
        key = ",".join(str(params[k]) for k in keys)
        cache[key] = {**params, "time": 20.0 - i, "times": [20.0 - i] * 3}
    doc = {"device_name": "Test GPU", "kernel_name": "Xgemm", "problem_size": [64, 64],
           "tune_params_keys": keys, "tune_params": {k: sorted({v[k] for v in variants[:n]})
                                                     for k in keys}, "cache": cache}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_an_xgemm_row_times_a_kernel_tuner_file_s_configs_as_aotune_kernels(tmp_path: Path):
    """``prepare --xgemm FILE``: the file's fastest configs, the model's first and a seeded draw,
    each once, in Xgemm's column-major layout; inputs drawn again where they are timed reproduce
    numpy's einsum of that layout; a record of them is rescored by its row's name."""
    from aotune.codegen.gpu_emulator import _reference
    from aotune.constraints.xgemm import xgemm_workload
    from aotune.hwspecs.spec import load_target
    from aotune.targets import target_for

    path = _xgemm_cache(tmp_path / "gemm.json", 12)
    name, w, _, configs = gpu_device.xgemm_row(path, "t4", best=2, model_best=1, drawn=2)
    assert name == "xgemm 64x64x64 (Test GPU's configs)" and w == xgemm_workload(64, 64, 64)
    assert len(configs) == len(set(configs)) and 3 <= len(configs) <= 5
    fastest = [c.as_dict() for c in configs[:2]]
    assert {(c["vm"], c["vn"], c["sb"]) for c in fastest} == {(2, 4, 1), (2, 4, 0)}  # VWN, VWM, SA
    out = tmp_path / "bundle"
    gpu_device.prepare(out, "t4", rows=[(name, w, 0, configs)], library=False, carry_limit=0,
                       log=lambda _: None)  # fmt: skip
    row = json.loads((out / gpu_device.BUNDLE).read_text())["rows"][0]
    ids = {k["config"] for k in row["kernels"] if k["shipped_rank"] is None}
    assert gpu_device._row_workload(name) == w and len(ids) <= len(configs)
    (a, b, _), ref = gpu_device._inputs(out, row)
    tgt = target_for(load_target("t4"))
    space = tgt.build_space(w)
    s = tgt.schedule(space, configs[0])
    assert row["inputs"]["einsum"] == s.reference  # C[n, m] = sum_k A[k, m] B[k, n]
    assert np.allclose(ref, _reference(s, a, b, None), rtol=1e-5, atol=1e-5)
    rec = {
        "device": "a test double",
        "target": "t4",
        "rows": [
            {
                "name": name,
                "flops": row["flops"],
                "torch": None,
                "cupy_cublas_seconds": None,
                "kernels": [
                    {
                        "config": k["config"],
                        "shipped_rank": k["shipped_rank"],
                        "predicted_seconds": k["predicted_seconds"],
                        "correct": True,
                        "measured_seconds": 2 * k["predicted_seconds"],
                    }
                    for k in row["kernels"]
                ],
            }
        ],
    }
    (scored,) = gpu_device.rescore(rec, log=lambda _: None)["rows"]
    assert scored["row"] == name and scored["median_measured_over_predicted"] == pytest.approx(2)


def test_a_bad_xgemm_file_or_kernel_id_is_one_error_line(tmp_path: Path):
    for args in (["prepare", str(tmp_path), "--xgemm", str(tmp_path / "missing.json")],
                 ["measure", str(tmp_path), "--only", "a,b"]):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "aotune.benchmarks.gpu_device", *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "error: " in last and ("missing.json" in last or "kernel ids" in last)
