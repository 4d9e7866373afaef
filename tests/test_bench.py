"""The benchmark's accuracy statistics and its measurement of sampled configs."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from aotune import machine_load
from aotune.analysis.workload import matmul
from aotune.benchmarks.suite import (
    _timed,
    kendall,
    median_abs_error,
    model_accuracy,
    spearman,
    topk_score,
)
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import load_target
from hypothesis import given, settings
from hypothesis import strategies as st

HOST = load_target("host")
values = st.lists(st.integers(0, 6), min_size=3, max_size=12)


def _tau_b(x: list[int], y: list[int]) -> float:
    """Kendall's tau-b from its definition, pair by pair."""
    conc = disc = tie_x = tie_y = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        sx, sy = np.sign(x[j] - x[i]), np.sign(y[j] - y[i])
        conc += sx * sy > 0
        disc += sx * sy < 0
        tie_x += sx == 0 and sy != 0
        tie_y += sy == 0 and sx != 0
    denom = ((conc + disc + tie_x) * (conc + disc + tie_y)) ** 0.5
    return (conc - disc) / denom if denom else 0.0


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_kendall_matches_the_pairwise_definition_with_ties(data: st.DataObject) -> None:
    x = data.draw(values)
    y = data.draw(st.lists(st.integers(0, 6), min_size=len(x), max_size=len(x)))
    assert kendall(np.array(x, float), np.array(y, float)) == pytest.approx(_tau_b(x, y))


@settings(max_examples=200, deadline=None)
@given(values)
def test_spearman_is_one_for_any_increasing_map_and_minus_one_reversed(x: list[int]) -> None:
    a = np.array(x, float)
    if len(set(x)) < 2:
        assert spearman(a, a) == 0.0  # no ranking to compare
        return
    assert spearman(a, np.exp(a)) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)


def test_spearman_and_kendall_by_hand_with_a_tie() -> None:
    # y ranks 1, 2, 3.5, 5, 3.5: Pearson of the ranks is 8 / sqrt(10 * 9.5); of the ten pairs 8
    # are concordant, 1 discordant and 1 tied in y only, so tau-b = 7 / sqrt(10 * 9)
    x, y = np.array([1.0, 2, 3, 4, 5]), np.array([5.0, 6, 7, 8, 7])
    assert spearman(x, y) == pytest.approx(8 / np.sqrt(95))
    assert kendall(x, y) == pytest.approx(7 / np.sqrt(90))
    assert median_abs_error(np.array([1.1, 0.8, 2.0]), np.array([1.0, 1.0, 1.0])) == (
        pytest.approx(0.2)
    )


def test_topk_score_is_the_best_time_over_the_best_of_the_models_k_picks() -> None:
    predicted = np.array([1.0, 2.0, 3.0, 4.0])
    measured = np.array([2.0, 4.0, 1.0, 8.0])  # the model's first pick takes twice the best time
    assert topk_score(predicted, measured, 1) == pytest.approx(0.5)
    assert topk_score(predicted, measured, 3) == pytest.approx(1.0)


@pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")
def test_the_fma_reading_counts_every_fma_of_a_run_at_the_clock_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run of ``steps`` steps issues one FMA per chain a step: at a fixed run time the reading
    is those FMAs over the cycles of that time at the clock given (halved at twice the clock)."""
    from aotune.hwspecs import probes

    monkeypatch.setattr(probes, "_timed", lambda run, n: 1e-3)
    steps = 1 << 12
    got = probes.fma_rate_now(HOST, 2.0, runs=2, steps=steps)
    assert got == pytest.approx(steps * probes.fma_chains(HOST) / (1e-3 * 2.0e9))
    assert probes.fma_rate_now(HOST, 4.0, runs=2, steps=steps) == pytest.approx(got / 2)
    assert 8 <= probes.fma_chains(HOST) <= HOST.isa.vector_registers - 4


@pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")
def test_model_accuracy_measures_every_sampled_config_and_records_the_core_handoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the probe itself is tested in test_workers.py; here, that the row asks it at its three
    # moments and keeps the readings it got (on a loaded machine a probe may get none: None)
    from aotune.benchmarks import suite

    readings = iter([40.0, None, 170.0])
    monkeypatch.setattr(suite, "_handoff_ns", lambda hw: next(readings))
    acc = model_accuracy(
        matmul(24, 33, 17), HOST, samples=6, sweep_seconds=0.0, finalist_seconds=0.0
    )
    assert acc["n"] == 6 and acc["incorrect"] == 0
    assert acc["rounds"] == {"sweep": 3, "finalists": 6}  # the minimums, with no time to go on
    assert -1.0 <= acc["spearman"] <= 1.0 and 0.0 < acc["top1"] <= acc["top5"] <= 1.0
    # every sampled config with its prediction and time, consistent with the scores
    samples = acc["samples"]
    assert len({r["config"] for r in samples}) == 6
    p = np.array([r["predicted_s"] for r in samples])
    t = np.array([r["measured_s"] for r in samples])
    assert (p > 0).all() and (t > 0).all()
    assert acc["median_abs_error"] == pytest.approx(median_abs_error(p, t))
    assert acc["spearman"] == pytest.approx(spearman(p, t))
    # a probe before the sweep, after it, and after the finalists' rounds; no reading is left out
    assert acc["core_to_core_ns"] == [40.0, 170.0] and next(readings, "done") == "done"
    # the clock read at the same three moments, each a clock some CPU runs at
    assert len(acc["clock_ghz"]) == 3 and all(0.2 < g < 7.0 for g in acc["clock_ghz"])
    # and the FMAs a cycle the core issued then: fewer than its pipes take where another guest
    # shares the core; never more than any core's pipes
    assert len(acc["fma_per_cycle"]) == 3 and all(0 < r < 16 for r in acc["fma_per_cycle"])
    # and the median error again with the predicted cycles at the clock it read
    at_clock = p * HOST.core.frequency_ghz / np.mean(acc["clock_ghz"])
    assert acc["median_abs_error_at_read_clock"] == pytest.approx(median_abs_error(at_clock, t))
    # what others used of the machine over the timing, where /proc/stat says (Linux)
    shared = acc["sharing"]
    if machine_load.cpu_use() is None:
        assert shared is None
    else:
        assert shared["seconds"] > 0 and shared["cpus"] == len(os.sched_getaffinity(0))
        assert set(shared) == {"seconds", "cpus", "others_cpus", "stolen_share"}


def test_timed_runs_the_minimum_rounds_then_goes_on_for_the_time_given_up_to_the_cap() -> None:
    calls = [0, 0]

    def run(i: int) -> None:
        calls[i] += 1

    seconds, rounds = _timed([lambda: run(0), lambda: run(1)], min_rounds=2, until_seconds=0.0)
    assert rounds == 2 and min(calls) >= 2 * 6  # a warm-up call and >= 5 runs a round, each
    assert len(seconds) == 2 and all(0.0 <= s < 1.0 for s in seconds)
    before = calls[0]
    _, rounds = _timed(
        [lambda: run(0), lambda: run(1)], min_rounds=2, until_seconds=3600.0, max_rounds=5
    )
    assert rounds == 5 and calls[0] - before >= 5 * 6  # an hour to go on: the cap stops it
    # a round warms each function up for 0.03 s, so half a second ends it well before the cap
    _, rounds = _timed(
        [lambda: run(0), lambda: run(1)], min_rounds=2, until_seconds=0.5, max_rounds=16
    )
    assert 2 <= rounds <= 10


def test_median_abs_error_is_the_median_relative_miss():
    from aotune.benchmarks.suite import median_abs_error

    assert median_abs_error(np.array([2.0, 1.0, 0.5]), np.array([1.0, 1.0, 1.0])) == 0.5
    assert median_abs_error(np.array([1.0, 3.0]), np.array([1.0, 3.0])) == 0.0


def test_numpy_blas_warns_only_when_the_environment_forced_a_narrower_kernel():
    from aotune.codegen.numpy_blas import NumpyBlas, numpy_blas

    forced = NumpyBlas("openblas", "Haswell", 2, True, (("OPENBLAS_CORETYPE", "Haswell"),))
    warning = forced.warning(512)
    assert warning and "Haswell" in warning and "env -u OPENBLAS_CORETYPE" in warning
    assert forced.warning(256) is None  # the CPU has nothing wider
    assert NumpyBlas("openblas", "Haswell", 2, False, ()).warning(512) is None
    here = numpy_blas().as_dict()
    assert set(here) == {"library", "kernel", "threads", "forced_by_env", "env"}
    assert here["threads"] >= 1


@pytest.mark.skipif(
    not host_can_run(HOST)[0] or not __import__("shutil").which("cc"),
    reason="needs a C compiler and a host the kernels run on",
)
def test_library_row_times_the_built_kernel_beside_the_runner(monkeypatch):
    from aotune.analysis.workload import dense
    from aotune.benchmarks import library
    from aotune.benchmarks.library import library_row
    from aotune.search.options import SearchOptions

    # the probe gives no reading while other work holds both CPUs: its readings are fixed here,
    # one of them missing, to check what the row keeps of them
    readings = iter([41.0, None])
    monkeypatch.setattr(library, "_handoff_ns", lambda hw: next(readings))

    row = library_row(
        "dense 24x40x33 gelu",
        dense(24, 40, 33, bias=True, activation="gelu"),
        HOST,
        options=SearchOptions(budget=16, top_k=1),
        rounds=1,
        seconds=0.02,
    )
    assert row["runner_gflops"] > 0 and row["library_gflops"] > 0
    assert row["ratio"] == pytest.approx(row["library_gflops"] / row["runner_gflops"])
    assert row["core_to_core_ns"] == [41.0]  # before the timing and after it, where there was one


def test_gpu_rows_are_predictions_with_their_checks_and_quick_keeps_one() -> None:
    from aotune.analysis.workload import conv2d
    from aotune.benchmarks.gpu import TARGETS, gpu_row, print_gpu_table, row_specs
    from aotune.benchmarks.suite import RESNET
    from aotune.search.options import SearchOptions
    from rich.console import Console

    specs = row_specs()
    assert {t for t, _, _ in specs} == set(TARGETS) == {"a100", "h100"}
    assert len(specs) == len(TARGETS) * (1 + 2 * len(RESNET))
    assert [name for _, name, _ in row_specs(quick=True)] == ["matmul 4096x4096x4096"]
    w = conv2d(1, 16, 14, 14, 32, 3, 3, pad=1, layout="NHWC")
    options = SearchOptions(budget=64, population=8, compile_top=4, top_k=2)
    row = gpu_row("h100", "conv2d small NHWC", w, options)
    assert row["measured"] is False and row["measurements"] == 0
    assert row["top_k"] == 2 and row["kernels_compiled"] == 4
    assert row["ptxas_accepted"] <= 2 and row["emulated_correct"] == 2
    assert row["predicted_tflops"] == pytest.approx(w.flops / row["predicted_seconds"] / 1e12)
    assert 0.0 < row["peak_fraction"] == pytest.approx(row["predicted_tflops"] / row["peak_tflops"])
    console = Console(record=True, width=200)
    print_gpu_table([row], console)
    text = console.export_text()
    assert "predicted by the model, not measured" in text and "conv2d small NHWC" in text


def test_the_whole_suite_leaves_gpu_rows_out_when_ptxas_is_missing(monkeypatch) -> None:
    """A plain install has no ptxas: the GPU rows say so instead of failing after the host rows."""
    from aotune.benchmarks import gpu
    from aotune.benchmarks.suite import print_table
    from aotune.codegen.cuda_tools import ToolMissingError
    from rich.console import Console

    def missing(tool: str):
        raise ToolMissingError(f"{tool} is not installed; pip install 'aotune[gpu]'")

    monkeypatch.setattr(gpu, "tool_path", missing)
    why = gpu.missing_gpu_tools()
    assert why is not None and "ptxas is not installed" in why and "aotune[gpu]" in why
    monkeypatch.setattr(gpu, "tool_path", lambda tool: tool)
    assert gpu.missing_gpu_tools() is None
    console = Console(record=True, width=200)
    print_table({"rows": [], "gpu_rows": [], "gpu_rows_skipped": why}, console)
    # the install hint's brackets are printed, not taken for markup
    assert f"GPU rows skipped: {why}" in console.export_text()
