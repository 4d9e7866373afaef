"""Cross-built AArch64 kernels run under qemu-aarch64 and checked against numpy.

Random valid configs on awkward shapes (1, primes, below a vector or a tile) for every operator on
neoverse-n1, several kernels per emulated program; the threads' shares, workspaces and padded
copies as on x86; the errors a user can meet. Skips with the reason where qemu or the cross
compiler is missing (``.ci/run`` installs them).
"""

from __future__ import annotations

import dataclasses
import json
import os

import llvmlite.ir as ir
import numpy as np
import pytest
from aotune.analysis.workload import (
    ACTIVATIONS,
    batch_matmul,
    conv2d,
    dense,
    depthwise_conv2d,
    einsum,
    matmul,
)
from aotune.cli import main
from aotune.codegen.compile import _LLVM_LOCK, compile_kernel, optimize, target_machine
from aotune.codegen.emulate import (
    EmulatedRun,
    can_emulate,
    check_emulated,
    final_check_emulated,
    find_emulator,
    run_emulated,
)
from aotune.codegen.launch import launch_plan
from aotune.codegen.runner import HostKernel, check_against_numpy, random_operands
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import FinalCheckError, UnsatisfiableError
from aotune.hwspecs.spec import load_target
from aotune.search import driver
from aotune.search.options import SearchOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

N1 = load_target("neoverse-n1")
EMULATES, WHY_NOT = can_emulate(N1)
needs_qemu = pytest.mark.skipif(not EMULATES, reason=f"no emulated check here: {WHY_NOT}")
# AOTUNE_TEST_EXAMPLES raises the number of drawn batches for a long local run (CI: about a minute)
EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "30"))

small = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 37]), st.integers(1, 70))
conv_small = st.sampled_from([1, 2, 3, 5, 7, 8, 11, 17])


def fitting(size: int, taps: int, pad: int, dilation: int) -> int:
    """``size``, grown until the dilated kernel fits the padded input."""
    return max(size, dilation * (taps - 1) + 1 - 2 * pad)


@st.composite
def matmuls(draw):
    return matmul(draw(small), draw(small), draw(small))


@st.composite
def denses(draw):
    return dense(draw(small), draw(small), draw(small), True, draw(st.sampled_from(ACTIVATIONS)))


@st.composite
def convs(draw):
    groups, R, S = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pad, dilation = draw(st.integers(0, 2)), draw(st.integers(1, 2))
    return conv2d(
        draw(st.integers(1, 2)),
        groups * draw(conv_small),
        fitting(draw(conv_small), R, pad, dilation),
        fitting(draw(conv_small), S, pad, dilation),
        groups * draw(conv_small),
        R,
        S,
        stride=draw(st.integers(1, 3)),
        pad=pad,
        dilation=dilation,
        groups=groups,
        layout=draw(st.sampled_from(["NCHW", "NHWC"])),
    )


@st.composite
def depthwises(draw):
    R, S, pad = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 1))
    return depthwise_conv2d(
        draw(st.integers(1, 2)),
        draw(conv_small),
        fitting(draw(conv_small), R, pad, 1),
        fitting(draw(conv_small), S, pad, 1),
        R,
        S,
        stride=draw(st.integers(1, 2)),
        pad=pad,
        layout=draw(st.sampled_from(["NCHW", "NHWC"])),
    )


def sampled_run(workload, seed: int, two_threads: bool) -> tuple[EmulatedRun, str]:
    """A random valid config of ``workload`` on neoverse-n1 (moved to two threads where asked and
    possible), compiled, on reproducible operands; and what it is, for a failure message."""
    space = build_cpu_space(workload, N1)
    (cfg,) = space.sample(1, seed=seed)
    if two_threads:
        try:
            cfg = space.nearest(cfg, {"threads": 2})
        except UnsatisfiableError:
            pass  # too small to split: one thread
    sched = schedule_from_config(space, cfg)
    kernel = compile_kernel(sched, N1)
    return EmulatedRun(kernel, random_operands(sched, seed)), (
        f"{workload.describe()} with {space.describe_config(cfg)}"
    )


@needs_qemu
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workloads=st.tuples(matmuls(), denses(), convs(), depthwises()),
    seeds=st.lists(st.integers(0, 1 << 20), min_size=4, max_size=4),
    two_threads=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_every_cross_built_kernel_matches_numpy_under_emulation(workloads, seeds, two_threads):
    """One emulated program per drawn batch: a matmul, a dense with bias and an activation, a
    conv2d and a depthwise conv, each called twice (the second call reuses the workspaces and the
    padded copy, whose border must still be zero)."""
    cases = [sampled_run(w, s, t) for w, s, t in zip(workloads, seeds, two_threads)]
    checks = check_emulated([run for run, _ in cases], calls=2)
    assert len(checks) == len(cases)
    for (_, what), chk in zip(cases, checks):
        assert chk.correct, f"{what}: max error {chk.max_abs_error} > {chk.tolerance}"
        assert chk.emulated and chk.emulator.startswith("qemu-aarch64")


@needs_qemu
def test_other_layouts_and_batches_under_emulation():
    """Transposed and batched contractions, vector outputs, no reduction: two sampled configs each,
    all in one program."""
    workloads = [
        einsum("km,kn->mn", {"k": 9, "m": 17, "n": 31}),
        einsum("abmk,abkn->abmn", {"a": 2, "b": 3, "m": 5, "k": 7, "n": 9}),
        einsum("mkb,kb->mb", {"m": 7, "k": 5, "b": 3}),
        einsum("bkm,bk->bm", {"b": 3, "k": 11, "m": 13}),
        einsum("ma,na->mn", {"m": 3, "a": 2, "n": 5}),
        batch_matmul(3, 17, 13, 11),
    ]
    runs = []
    for w in workloads:
        space = build_cpu_space(w, N1)
        for seed, cfg in enumerate(space.sample(2, seed=7)):
            sched = schedule_from_config(space, cfg)
            runs.append(EmulatedRun(compile_kernel(sched, N1), random_operands(sched, seed)))
    checks = check_emulated(runs, calls=2)
    assert len(checks) == len(runs) == 2 * len(workloads)
    for run, chk in zip(runs, checks):
        assert chk.correct, (run.kernel.schedule, chk)


@needs_qemu
def test_two_threads_pad_the_rows_they_read_into_buffers_of_their_own():
    """The shapes HostKernel's own test uses, emulated: split over output channels (par=m), each
    thread reads and so copies every row; split over pixels (par=n), each copies only the rows
    of its pixels' windows. Each into a buffer of its own, both exact."""
    space = build_cpu_space(conv2d(1, 5, 7, 9, 6, 3, 3, pad=1), N1)
    runs = []
    rows = 5 * 7
    for par, all_rows in (("m", True), ("n", False)):
        cfg = space.parse_config(
            f"mr=2,nr=16,kc=16,mc=4,nc=32,order=mkn,pack_a=0,pack_b=1,unroll=1,par={par},"
            "threads=2,pad_copy=1"
        )
        sched = schedule_from_config(space, cfg)
        plan = launch_plan(sched)
        assert plan.threads == 2 and plan.pad_buffers == 2
        copied = [hi - lo for _, lo, hi in plan.pad_shares]
        assert (copied == [rows, rows]) if all_rows else (max(copied) < rows)
        runs.append(EmulatedRun(compile_kernel(sched, N1), random_operands(sched, 3)))
    checks = check_emulated(runs, calls=2)
    assert len(checks) == 2
    for chk in checks:
        assert chk.correct, chk


@needs_qemu
def test_inputs_need_not_start_on_a_cache_line():
    """The checked operands start on a cache line, as the model assumes; a user's may start
    anywhere a float can, and the AArch64 kernel is as correct there."""
    space = build_cpu_space(matmul(37, 29, 13), N1)
    runs = []
    for cfg in space.sample(3, seed=5):
        sched = schedule_from_config(space, cfg)
        runs.append(EmulatedRun(compile_kernel(sched, N1), random_operands(sched, 1)))
    for offset in (0, 1, 3):
        checks = check_emulated(runs, offset_floats=offset)
        assert len(checks) == len(runs) and all(c.correct for c in checks)


@needs_qemu
def test_wrong_or_non_finite_results_are_caught():
    plain = build_cpu_space(dense(9, 13, 7), N1)
    sched = schedule_from_config(plain, plain.solve())
    kernel = compile_kernel(sched, N1)
    a, b, _ = random_operands(sched, 2)
    nan_a = a.copy()
    nan_a[0, 0] = np.nan
    # the kernel adds no bias, but the check is told it should: its outputs are wrong
    with_bias = schedule_from_config(*_dense_bias_space_and_config())
    claims_bias = dataclasses.replace(kernel, schedule=with_bias)
    runs = [
        EmulatedRun(kernel, (a, b, None)),
        EmulatedRun(kernel, (nan_a, b, None)),
        EmulatedRun(claims_bias, random_operands(with_bias, 2)),
    ]
    right, nan, wrong = check_emulated(runs)
    assert right.correct
    assert not nan.correct
    assert not wrong.correct and wrong.max_abs_error > wrong.tolerance


def _dense_bias_space_and_config():
    space = build_cpu_space(dense(9, 13, 7, True, "relu"), N1)
    return space, space.solve()


@needs_qemu
def test_outputs_are_the_kernels_own():
    """The same config on two different operand sets gives two different, correct outputs."""
    space = build_cpu_space(matmul(5, 7, 3), N1)
    sched = schedule_from_config(space, space.solve())
    kernel = compile_kernel(sched, N1)
    ops = [random_operands(sched, seed) for seed in (1, 2)]
    (c1,), (c2,) = run_emulated([EmulatedRun(kernel, o) for o in ops])
    for (a, b, _), c in zip(ops, (c1, c2)):
        np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


@needs_qemu
def test_a_crash_a_timeout_and_a_foreign_object_are_one_line_each():
    space = build_cpu_space(matmul(8, 8, 8), N1)
    sched = schedule_from_config(space, space.solve())
    kernel = compile_kernel(sched, N1)
    ops = random_operands(sched)
    # an entry that writes through its bias pointer, which is NULL for a kernel without a bias:
    # the emulated program dies of SIGSEGV
    mod = ir.Module(name="crash")
    fn_ty = ir.FunctionType(ir.VoidType(), [ir.FloatType().as_pointer()] * 4 + [ir.IntType(64)] * 2)
    fn = ir.Function(mod, fn_ty, name=kernel.entry)
    b = ir.IRBuilder(fn.append_basic_block())
    b.store(ir.Constant(ir.FloatType(), 1.0), fn.args[3], align=4)
    b.ret_void()
    with _LLVM_LOCK:
        tm = target_machine(N1)
        crash_obj = bytes(tm.emit_object(optimize(str(mod), tm)))
    crashing = dataclasses.replace(kernel, object_code=crash_obj)
    with pytest.raises(FinalCheckError, match=r"in crashing, call 0: killed by signal 11") as e:
        check_emulated([EmulatedRun(kernel, ops), EmulatedRun(crashing, ops, "crashing")])
    assert "\n" not in str(e.value)
    with pytest.raises(FinalCheckError, match=r"did not finish in 0.001 s under qemu-aarch64"):
        check_emulated([EmulatedRun(kernel, ops)], timeout=0.001)
    # an x86 object cannot be linked into an AArch64 program
    x86 = load_target("haswell")
    x86_kernel = dataclasses.replace(
        kernel,
        object_code=compile_kernel(
            schedule_from_config(*_solved(matmul(8, 8, 8), x86)), x86
        ).object_code,
    )
    with pytest.raises(FinalCheckError, match="objcopy|gcc") as e:
        check_emulated([EmulatedRun(x86_kernel, ops)])
    assert "\n" not in str(e.value)


def _solved(workload, hw):
    space = build_cpu_space(workload, hw)
    return space, space.solve()


def test_launch_plan_gives_each_share_its_own_buffer_and_the_rows_it_reads():
    """Without running anything: each kernel share reads a padded buffer of its own, filled by
    its own pad share with each row it reads once; where the parallel loop splits the padded
    operand, the shares together copy far fewer rows than a copy per thread of all of them."""
    space = build_cpu_space(conv2d(1, 6, 11, 7, 8, 3, 3, pad=1, stride=2), N1)

    def window_rows(lo: int, hi: int) -> list[int]:
        """Input rows (channel, ih) that output pixels [lo, hi) of a 6 x 4 output read, from the
        convolution's geometry: ih = 2 oh - 1 + r."""
        ihs = {2 * (p // 4) - 1 + r for p in range(lo, hi) for r in range(3)}
        return sorted(c * 11 + ih for c in range(6) for ih in ihs if 0 <= ih < 11)

    seen = split = 0
    for cfg in space.sample(40, seed=3):
        s = schedule_from_config(space, cfg)
        plan = launch_plan(s)
        assert plan.shares == tuple(s.thread_ranges())
        if s.pad_copy is None:
            assert plan.pad_buffers == 0 and not plan.pad_shares and not plan.padded_of_share
            continue
        seen += 1
        rows = int(np.prod(s.pad_copy.shape[:-1]))
        assert plan.pad_buffers == plan.threads
        assert plan.padded_of_share == tuple(range(plan.threads))
        copied = 0
        for t, ((buf, lo, hi), (klo, khi)) in enumerate(zip(plan.pad_shares, plan.shares)):
            own = plan.pad_rows[lo:hi].tolist()
            assert buf == t
            if s.pad_copy_per_thread or plan.threads == 1:
                assert own == list(range(rows))
            else:  # pixels [klo, khi) split over the threads: the rows of their windows
                assert s.par == "n" and own == window_rows(klo, khi)
            copied += len(own)
        if plan.threads > 1 and not s.pad_copy_per_thread:
            split += 1
            assert copied < 1.5 * rows
    assert seen > 0 and split > 0


@pytest.mark.parametrize(
    "workload",
    [
        depthwise_conv2d(2, 4, 12, 9, 3, 3, pad=1),
        conv2d(1, 3, 11, 7, 4, 3, 3, pad=1, stride=2),
        conv2d(2, 3, 9, 10, 5, 3, 3, pad=1, layout="NHWC"),
        depthwise_conv2d(1, 5, 9, 6, 3, 3, pad=2, dilation=2, layout="NHWC"),
    ],
    ids=["depthwise-nchw", "conv-stride2", "conv-nhwc", "depthwise-nhwc-dilated"],
)
def test_a_kernel_reads_no_padded_row_its_share_did_not_copy(workload):
    """Run on this host, into padded buffers whose interior starts NaN: a share's pad function
    fills only the rows ``padded_rows_read`` names, so a row the kernel reads beyond them would
    turn the output NaN. The output matches numpy instead."""
    hw = load_target("host")
    space = build_cpu_space(workload, hw)
    runs = {True: 0, False: 0}  # kernels run whose threads copy all rows / their own rows
    for cfg in space.sample(120, seed=2):
        s = schedule_from_config(space, cfg)
        if s.pad_copy is None or s.threads < 2 or runs[s.pad_copy_per_thread] == 4:
            continue
        runs[s.pad_copy_per_thread] += 1
        hk = HostKernel(compile_kernel(s, hw), hw)
        for padded in hk._padded:
            interior = padded[: s.pad_copy.elems].reshape(s.pad_copy.padded)[
                tuple(slice(lo, lo + n) for lo, n in zip(s.pad_copy.lo, s.pad_copy.shape))
            ]
            interior[...] = np.nan  # a view: the buffer's own interior
        a, b, bias = random_operands(s, 0)
        correct, err, tol = check_against_numpy(hk, a, b, bias)
        assert correct, (space.describe_config(cfg), err, tol)
    assert runs[False] > 0  # the split plans, which copy only some rows, were run


def test_missing_tools_name_the_packages_to_install(monkeypatch, capsys, tmp_path):
    """No qemu or cross compiler on the PATH: the final check is skipped, saying what to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    ok, why = can_emulate(N1)
    assert not ok and "qemu-aarch64" in why and "gcc-aarch64-linux-gnu" in why
    with pytest.raises(FinalCheckError, match="apt-get install"):
        find_emulator(N1)
    argv = ["tune", "matmul", "--shape", "64x64x64", "--target", "neoverse-n1", "--json"]
    assert main([*argv, "--budget", "48"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verify"] == [] and "qemu-user gcc-aarch64-linux-gnu" in doc["verify_skipped"]
    assert doc["verify_note"] is None and doc["chosen"] is None


@needs_qemu
def test_tune_checks_the_cross_built_top_k_under_emulation(capsys):
    argv = ["tune", "matmul", "--shape", "97x61x53", "--target", "neoverse-n1", "--json"]
    assert main([*argv, "--budget", "96"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verify_skipped"] is None and len(doc["verify"]) == 3
    for v in doc["verify"]:
        assert v["correct"] is True and v["emulated"] is True
        assert 0 <= v["max_abs_error"] <= v["tolerance"]
        assert "measured_seconds" not in v and "gflops" not in v  # an emulated time means nothing
    assert "emulat" in doc["verify_note"] and "predicted only" in doc["verify_note"]
    assert doc["numpy_gflops"] is None and doc["chosen"]["rank"] == 1
    # the table says the same
    argv = ["tune", "conv2d", "--shape", "1,16,15,15,24,3,3", "--pad", "1", "--target"]
    assert main([*argv, "neoverse-n1", "--budget", "96"]) == 0
    text = capsys.readouterr().out
    assert "final check under qemu-aarch64" in text and "3 of 3 correct" in text
    assert "emulated" in text and "predicted only" in text


@needs_qemu
def test_driver_verify_dispatches_a_foreign_target_to_emulation():
    result = driver.tune(matmul(23, 19, 11), N1, SearchOptions(budget=64, top_k=2))
    assert driver.can_verify(N1) == (True, "")
    verified, numpy_gflops = driver.verify(result)
    assert numpy_gflops is None and len(verified) == 2
    assert all(v.emulated and v.gflops is None and v.measurement.correct for v in verified)
    assert driver.chosen(verified) is verified[0]  # the best predicted of the correct ones
    a, b, bias = random_operands(result.best.schedule)
    again = final_check_emulated([result.best.kernel], a, b, bias)
    assert again[0].max_abs_error == verified[0].measurement.max_abs_error
