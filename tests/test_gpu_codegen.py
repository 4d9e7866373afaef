"""GPU kernels without a GPU: every generated kernel is accepted by ptxas for its target's sm and,
run on this CPU through the same per-thread body, matches numpy on awkward shapes."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from aotune.analysis.workload import (
    batch_matmul,
    conv2d,
    dense,
    depthwise_conv2d,
    einsum,
    matmul,
)
from aotune.codegen.cuda_tools import parse_ptxas_log, tool_path
from aotune.codegen.gpu_compile import compile_gpu_kernel
from aotune.codegen.gpu_emulator import (
    HostBlocks,
    check_emulated,
    choose_blocks,
    random_inputs,
    tile_offsets,
)
from aotune.codegen.gpu_schedule import schedule_from_config
from aotune.codegen.llvm_gpu import REGIONS, KernelEmitter, region_text
from aotune.constraints.gpu import build_gpu_space
from aotune.errors import CodegenError
from aotune.hwspecs.spec import builtin_names, load_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# AOTUNE_TEST_EXAMPLES raises the number of drawn cases for a long local run (CI keeps the default).
EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "10"))
awkward = st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 61])
GPUS = builtin_names("gpu")


def workloads(draw) -> object:
    op = draw(st.sampled_from(["matmul", "einsum", "batch", "dense", "conv", "depthwise"]))
    d = [draw(awkward) for _ in range(3)]
    if op == "matmul":
        return matmul(*d)
    if op == "einsum":
        spec = draw(st.sampled_from(["km,kn->mn", "mk,nk->mn", "km,kn->nm", "bij,bjk->bik"]))
        dims = {ch: min(v, 24) for ch, v in zip("mnk", d)} | {"b": 2, "i": d[0], "j": 5, "k": 3}
        return einsum(spec, {ch: dims[ch] for ch in dict.fromkeys(spec.replace(",", "")
                                                                 .replace("->", ""))})  # fmt: skip
    if op == "batch":
        return batch_matmul(draw(st.integers(1, 3)), *d)
    if op == "dense":
        act = draw(st.sampled_from(["none", "relu", "gelu", "sigmoid"]))
        return dense(*d, bias=draw(st.booleans()), activation=act)
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    hw_ = draw(st.integers(3, 9))
    stride, pad, dil = draw(st.integers(1, 2)), draw(st.integers(0, 1)), draw(st.integers(1, 2))
    if 2 * dil + 1 > hw_ + 2 * pad:
        dil = 1
    if op == "depthwise":
        return depthwise_conv2d(1, draw(st.integers(1, 6)), hw_, hw_, 3, 3, stride=stride,
                                pad=pad, dilation=dil, layout=layout)  # fmt: skip
    groups = draw(st.sampled_from([1, 2]))
    return conv2d(draw(st.integers(1, 2)), 2 * draw(st.integers(1, 3)), hw_, hw_ + 1,
                  2 * draw(st.integers(1, 3)), 3, 2, stride=stride, pad=pad, dilation=dil,
                  groups=groups, layout=layout)  # fmt: skip


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), target=st.sampled_from(GPUS), seed=st.integers(0, 1 << 16))
def test_every_generated_gpu_kernel_assembles_and_emulates_correctly(data, target, seed):
    hw = load_target(target)
    w = data.draw(st.builds(lambda: None).flatmap(lambda _: st.composite(workloads)()))
    space = build_gpu_space(w, hw)
    (cfg,) = space.sample(1, seed=seed)
    kernel = compile_gpu_kernel(schedule_from_config(space, cfg), hw)
    assert f".target {hw.sm_name}" in kernel.ptx and f".version {hw.ptx_isa}" in kernel.ptx
    assert kernel.report.registers <= hw.limits.max_registers_per_thread
    result = check_emulated(kernel, seed=seed)
    assert result.correct, (w.describe(), space.describe_config(cfg), result)
    assert result.blocks_checked == result.blocks_total  # small grids are emulated whole


def test_the_body_is_emitted_once_for_device_and_host():
    hw = load_target("a100")
    space = build_gpu_space(conv2d(1, 4, 7, 7, 8, 3, 3, pad=1, layout="NHWC"), hw)
    cfg = space.solve({"sa": [1], "sb": [1]})
    em = KernelEmitter(schedule_from_config(space, cfg), "k")
    device, host = em.device_module(hw.arch.triple), em.host_module("x86_64-unknown-linux-gnu")
    for region in REGIONS:
        assert region_text(device, region) == region_text(host, region)
    assert "llvm.nvvm.barrier0" in device and "barrier" not in host


def test_a_nan_stays_nan_through_the_relu_epilogue():
    """As numpy's ``np.maximum(nan, 0)``: a relu that compares ``v > 0`` wrote 0 for a NaN."""
    hw = load_target("a100")
    space = build_gpu_space(dense(4, 13, 5, bias=True, activation="relu"), hw)
    kernel = compile_gpu_kernel(schedule_from_config(space, space.solve()), hw)
    a, b, bias = random_inputs(kernel.schedule, 1)
    a[1, 2] = np.nan
    c = np.zeros(kernel.schedule.shapes[2], np.float32)
    HostBlocks(kernel).run(a, b, c, bias, choose_blocks(kernel.schedule))  # a small grid: all
    assert np.isnan(c[1]).all() and not np.isnan(np.delete(c, 1, 0)).any()
    ref = np.maximum(np.delete(a, 1, 0).astype(np.float64) @ b + bias, 0)
    np.testing.assert_allclose(np.delete(c, 1, 0), ref, rtol=1e-5, atol=1e-6)


def test_a_wrong_result_is_caught():
    hw = load_target("t4")
    space = build_gpu_space(matmul(40, 24, 19), hw)
    kernel = compile_gpu_kernel(schedule_from_config(space, space.solve()), hw)
    a, b, _ = random_inputs(kernel.schedule, 1)
    ref = a.astype(np.float64) @ b
    assert check_emulated(kernel, inputs=(a, b, None), reference=ref).correct
    bad = a.copy()
    bad[39, 18] += 0.5  # the last row's last k: only the M-tail block sees it
    assert not check_emulated(kernel, inputs=(bad, b, None), reference=ref).correct


def test_large_grids_check_every_corner_block():
    hw = load_target("a100")
    space = build_gpu_space(matmul(4096, 4096, 4096), hw)
    cfg = space.solve({"bm": [128], "bn": [128], "bk": [16], "tx": [16], "ty": [16]})
    kernel = compile_gpu_kernel(schedule_from_config(space, cfg), hw)
    result = check_emulated(kernel, budget=1)
    assert result.correct and result.blocks_checked == 4 and result.blocks_total == 32 * 32
    offsets = tile_offsets(kernel.schedule, (31, 31, 0))
    assert offsets.max() == 4096 * 4096 - 1 and offsets.size == 128 * 128


def test_ptxas_report_is_parsed_and_failures_are_one_line(monkeypatch):
    log = (
        "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
        "ptxas info    : Function properties for k\n"
        "    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 384 bytes cmem[0]\n"
    )
    r = parse_ptxas_log(log, "k")
    assert (r.registers, r.spill_bytes, r.stack_bytes, r.shared_bytes, r.barriers) == (
        255, 28, 8, 4096, 1,
    )  # fmt: skip
    assert tool_path("ptxas").name == "ptxas"
    hw = load_target("a100")
    space = build_gpu_space(matmul(8, 8, 8), hw)
    sched = schedule_from_config(space, space.solve())
    import dataclasses

    for version, needle in ((99, "cannot emit PTX ISA 9.9"), (90, "cannot take PTX ISA 9.0")):
        future = dataclasses.replace(hw, arch=dataclasses.replace(hw.arch, ptx_version=version))
        with pytest.raises(CodegenError) as info:
            compile_gpu_kernel(sched, future)
        assert "\n" not in str(info.value) and needle in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "w, fixed",
    [
        (matmul(13, 17, 5), {"sa": [0], "sb": [0]}),  # K smaller than a step of most tiles
        (matmul(33, 31, 61), {"sa": [0], "sb": [1]}),
        (matmul(7, 40, 1), {"sa": [1], "sb": [0]}),  # K = 1: the one step reads nothing ahead
        (dense(5, 33, 17, bias=True, activation="gelu"), {"sa": [0]}),
        (depthwise_conv2d(1, 3, 7, 7, 3, 3, pad=1, layout="NHWC"), {"sb": [0]}),  # A per output
        (conv2d(1, 4, 7, 8, 6, 3, 2, stride=2, pad=1, layout="NCHW"), {"sb": [0]}),
    ],
)
def test_reading_ahead_keeps_every_result(w, fixed):
    """A k loop that reads its operands in place a k step ahead (carried across iterations, the
    last step's reads skipped) matches numpy on awkward shapes, tails and padding included."""
    hw = load_target("rtx-2080-ti")
    space = build_gpu_space(w, hw)
    cfg = space.solve({**fixed, "ahead": [1]})
    kernel = compile_gpu_kernel(schedule_from_config(space, cfg), hw)
    result = check_emulated(kernel, seed=3)
    assert result.correct, (w.describe(), space.describe_config(cfg), result)


def test_reading_ahead_moves_each_read_a_k_step_before_its_use():
    """The fastest measured Xgemm config on Turing, mapped: without reading ahead ptxas reads the
    first k step's A loads about ten instructions after issuing them; reading ahead, about a k
    step's work (an 8 x 16 thread tile: 128 FFMAs) later."""
    from aotune.analysis.gpu_features import gpu_features
    from aotune.constraints.xgemm import xgemm_workload

    hw = load_target("rtx-2080-ti")
    space = build_gpu_space(xgemm_workload(4096, 4096, 4096), hw)
    text = "bm=128,bn=128,bk=32,tx=8,ty=16,vm=4,vn=8,strm=0,strn=0,sa=1,sb=0,la=32,lb=1,va=4,vb=1,"
    gap = {}
    for ahead in (0, 1):
        cfg = space.parse_config(f"{text}unroll=2,pad_a=0,pad_b=0,ahead={ahead}")
        f = gpu_features(compile_gpu_kernel(schedule_from_config(space, cfg), hw))
        gap[ahead] = min(use - load for load, use in f.load_uses)
    assert gap[0] < 32 and gap[1] > 128


def test_a_spec_with_fewer_registers_per_thread_binds_ptxas():
    """A GPU spec allowing 32 registers a thread: the kernel is assembled within them (spilling,
    which validate then reports), not at the 128 ptxas would choose for 64 threads."""
    hw = load_target("h100")
    few = dataclasses.replace(
        hw, limits=dataclasses.replace(hw.limits, max_registers_per_thread=32)
    )
    w = matmul(4096, 4096, 4096)
    text = ("bm=128,bn=32,bk=16,tx=2,ty=32,vm=2,vn=1,strm=0,strn=0,sa=1,sb=1,la=16,lb=8,va=1,"
            "vb=1,unroll=1,pad_a=2,pad_b=4,ahead=0")  # fmt: skip
    roomy, tight = (
        compile_gpu_kernel(schedule_from_config(space, space.parse_config(text)), h)
        for h, space in ((hw, build_gpu_space(w, hw)), (few, build_gpu_space(w, few)))
    )
    assert roomy.report.registers > 32 and roomy.report.spill_bytes == 0
    assert tight.report.registers <= 32 and tight.report.spill_bytes > 0
    assert ".maxnreg 32" in tight.ptx and ".maxnreg" not in roomy.ptx
