"""Valid workloads at the edges: short reductions and vector or scalar outputs.

A reduction of 8 or fewer lets LLVM unroll the micro-kernel's k loop away: such a kernel has no
loop for the features to find, and it must still be analysed, predicted and checked. An einsum
whose output is a vector (``ij,j->i``) or a scalar (``i,i->``) must go through the whole tune,
the final check and its numpy baseline.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from aotune.analysis.features import kernel_features
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import ACTIVATIONS, conv2d, dense, einsum, matmul
from aotune.codegen.compile import compile_kernel
from aotune.codegen.runner import HostKernel, check_against_numpy, random_operands
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import builtin_names, load_target
from aotune.search import driver
from aotune.search.options import SearchOptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "20"))
HOST = load_target("host")
pytestmark = pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")
few = st.integers(1, 8)
rows = st.one_of(st.sampled_from([1, 2, 3, 7, 13, 17, 31]), st.integers(1, 70))
settings_ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def short_reductions(draw):
    kind = draw(st.sampled_from(["matmul", "dense", "conv1x1", "conv1xs", "outer"]))
    M, N, K = draw(rows), draw(few), draw(few)
    if kind == "matmul":
        return matmul(M, N, K)
    if kind == "dense":
        return dense(M, N, K, draw(st.booleans()), draw(st.sampled_from(ACTIVATIONS)))
    if kind == "conv1x1":  # the reduction is the input channels
        return conv2d(1, K, 5, 7, N, 1, 1, layout=draw(st.sampled_from(["NCHW", "NHWC"])))
    if kind == "conv1xs":  # one input channel and a 1 x S filter: the reduction is S taps
        return conv2d(1, 1, 6, 5, N, 1, draw(st.integers(1, 3)), layout="NHWC")
    return einsum("i,j->ij", {"i": M, "j": N})  # no reduction at all


@settings_
@given(workload=short_reductions(), seed=st.integers(0, 1 << 20))
def test_short_reductions_are_analysed_predicted_and_correct(workload, seed):
    """Every sampled kernel of a K <= 8 workload has features (a loop or a straight-line body),
    a finite positive prediction, and matches numpy."""
    space = build_cpu_space(workload, HOST)
    (cfg,) = space.sample(1, seed=seed)
    sched = schedule_from_config(space, cfg)
    kernel = compile_kernel(sched, HOST)
    loop = kernel_features(kernel, HOST.isa.arch).loop
    assert loop.fma > 0
    (pred,) = AnalyticalCpuModel(HOST).predict_batch([sched], [loop])
    assert math.isfinite(pred.seconds) and pred.seconds > 0
    a, b, bias = random_operands(sched, seed)
    hk = HostKernel(kernel, HOST)
    correct, err, tol = check_against_numpy(hk, a, b, bias)
    assert correct, f"{workload.describe()} {space.describe_config(cfg)}: {err} > {tol}"
    # the first k block (often the only one here) stores C, it does not add to what was there
    dirty = np.full(sched.shapes[2], np.nan, np.float32)
    np.testing.assert_array_equal(hk(a, b, bias, out=dirty), hk(a, b, bias))


def test_a_loop_free_micro_kernel_is_read_from_its_whole_body():
    """K = 4 with kc = 4: LLVM unrolls the k loop away; the features say so and count its FMAs."""
    space = build_cpu_space(matmul(64, 48, 4), HOST)
    cfg = space.solve({"kc": [4], "unroll": [4], "mr": [4], "nr": [16]})
    kernel = compile_kernel(schedule_from_config(space, cfg), HOST)
    loop = kernel_features(kernel, HOST.isa.arch).loop
    assert loop.loop_free and loop.function == "ukernel_4x16"
    assert loop.fma >= 4 * 4 * (16 // HOST.vector_lanes_f32)  # every k step's FMAs, once


@pytest.mark.parametrize("name", builtin_names("cpu"))
def test_every_cpu_reads_a_short_k_block_as_one_body(name: str):
    """K = kc = 4 = unroll: LLVM may unroll the k loop away and leave the remainder loop rolled
    (its tuning for znver2 does); that loop runs no step here, so the whole body is read."""
    hw = load_target(name)
    nr = 2 * hw.vector_lanes_f32
    space = build_cpu_space(matmul(64, 48, 4), hw)
    cfg = space.solve({"kc": [4], "unroll": [4], "mr": [4], "nr": [nr]})
    loop = kernel_features(compile_kernel(schedule_from_config(space, cfg), hw), hw.isa.arch).loop
    assert loop.loop_free and loop.function == f"ukernel_4x{nr}"
    assert loop.fma >= 4 * 4 * 2  # every k step's FMAs: 4 steps of 4 rows by 2 vectors


VECTOR_AND_SCALAR_OUTPUTS = [
    "ij,j->i",
    "j,jk->k",
    "i,i->",
    "ij,ij->",
    "bi,bi->b",
    "ji,j->i",
    "ij,i->j",
    "bij,bj->bi",
]


@settings(
    max_examples=max(4, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    spec=st.sampled_from(VECTOR_AND_SCALAR_OUTPUTS), sizes=st.lists(rows, min_size=3, max_size=3)
)
def test_vector_and_scalar_outputs_tune_and_verify(spec, sizes):
    """The whole path of ``aotune tune``: search, compile, final check with its numpy baseline."""
    letters = sorted(set(spec) - set(",->"))
    w = einsum(spec, dict(zip(letters, sizes)))
    result = driver.tune(w, HOST, SearchOptions(budget=24, population=8, compile_top=3, top_k=2))
    verified, numpy_gflops = driver.verify(result, min_runs=2)
    assert verified and all(v.measurement.correct for v in verified)
    assert math.isfinite(numpy_gflops) and numpy_gflops > 0
    out_shape = result.best.schedule.shapes[2]
    assert len(out_shape) == len(spec.split("->")[1])


def test_scalar_output_kernel_writes_one_number():
    w = einsum("i,i->", {"i": 37})
    space = build_cpu_space(w, HOST)
    sched = schedule_from_config(space, space.solve())
    hk = HostKernel(compile_kernel(sched, HOST), HOST)
    a = np.arange(37, dtype=np.float32)
    got = hk(a, a)
    assert got.shape == () and got == pytest.approx(float(a @ a), rel=1e-6)
