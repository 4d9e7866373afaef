"""isl proves every global and shared-memory access of a generated GPU kernel in bounds (or
guarded): the device IR is executed symbolically over the launch's threads and blocks and the
kernel's loops, and isl places each access inside its buffer. The proof is shown to fail when a
guard is taken out of the generated code."""

from __future__ import annotations

import os

import pytest
from aotune.analysis.gpu_bounds import (
    Int,
    Lin,
    UnprovableKernelError,
    _Interpreter,
    prove_in_bounds,
)
from aotune.analysis.polyhedral import range_violation
from aotune.analysis.workload import batch_matmul, conv2d, dense, depthwise_conv2d, einsum, matmul
from aotune.codegen import llvm_gpu
from aotune.codegen.gpu_compile import compile_gpu_kernel
from aotune.codegen.gpu_schedule import schedule_from_config
from aotune.constraints.gpu import build_gpu_space
from aotune.hwspecs.spec import builtin_names, load_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# AOTUNE_TEST_EXAMPLES raises the number of drawn cases for a long local run (CI keeps the default).
EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "8"))
awkward = st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31, 33, 61])


@st.composite
def workloads(draw):
    op = draw(st.sampled_from(["matmul", "einsum", "batch", "dense", "conv", "depthwise"]))
    m, n, k = (draw(awkward) for _ in range(3))
    if op == "matmul":
        return matmul(m, n, k)
    if op == "einsum":
        spec = draw(st.sampled_from(["km,kn->mn", "mk,nk->mn", "km,kn->nm"]))
        return einsum(spec, {"m": m, "n": n, "k": min(k, 24)})
    if op == "batch":
        return batch_matmul(draw(st.integers(1, 3)), m, n, k)
    if op == "dense":
        act = draw(st.sampled_from(["none", "relu", "gelu"]))
        return dense(m, n, k, bias=draw(st.booleans()), activation=act)
    layout = draw(st.sampled_from(["NCHW", "NHWC"]))
    size = draw(st.integers(3, 9))
    stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 2))
    if op == "depthwise":
        return depthwise_conv2d(
            1, draw(st.integers(1, 6)), size, size, 3, 3, stride=stride, pad=pad, layout=layout
        )
    return conv2d(
        draw(st.integers(1, 2)), 2 * draw(st.integers(1, 3)), size, size + 1,
        2 * draw(st.integers(1, 3)), 3, 2, stride=stride, pad=pad,
        groups=draw(st.sampled_from([1, 2])), layout=layout,
    )  # fmt: skip


def _kernel(w, target: str, seed: int, **fixed):
    hw = load_target(target)
    space = build_gpu_space(w, hw)
    cfg = space.solve({k: [v] for k, v in fixed.items()}, seed=seed) if fixed else None
    cfg = cfg or space.sample(1, seed=seed)[0]
    return compile_gpu_kernel(schedule_from_config(space, cfg), hw), space.describe_config(cfg)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), target=st.sampled_from(builtin_names("gpu")), seed=st.integers(0, 1 << 16))
def test_every_access_of_a_generated_kernel_is_proven_in_bounds(w, target, seed):
    kernel, cfg = _kernel(w, target, seed)
    report = prove_in_bounds(kernel)
    assert report.ok, (w.describe(), target, cfg, [str(v) for v in report.violations])
    s = kernel.schedule
    assert report.count("A", "load") and report.count("B", "load") and report.count("C", "store")
    if s.sa or s.sb:
        assert report.count("shared", "store") and report.count("shared", "load")
        assert report.sizes["shared"] == s.smem_a_elems + s.smem_b_elems
    assert (report.count("bias", "load") > 0) == s.bias
    assert not any(a.buffer == "null" for a in report.accesses)


def test_tails_and_padding_are_guarded_and_the_guards_are_what_the_proof_rests_on(monkeypatch):
    tails, _ = _kernel(matmul(127, 61, 33), "a100", 2, sa=1, sb=1)
    padded, _ = _kernel(conv2d(2, 8, 9, 9, 16, 3, 3, pad=1, layout="NHWC"), "t4", 2)
    for kernel in (tails, padded):
        report = prove_in_bounds(kernel)
        assert report.ok and report.guarded > 0

    # without the tail checks (row < M, k < K, col < N) blocks at the edge read and write outside
    monkeypatch.setattr(llvm_gpu.KernelEmitter, "below", lambda self, b, v, extent, tile: None)
    report = prove_in_bounds(tails)
    assert not report.ok
    assert {v.what.split()[0] for v in report.violations} == {"load", "store"}
    witness = report.violations[0].witness
    assert set(witness) >= {"tid", "bx", "by", "bz", "kt"}
    monkeypatch.undo()

    # without the padding checks a convolution's window reads before and after its input
    original = llvm_gpu.KernelEmitter.address
    monkeypatch.setattr(
        llvm_gpu.KernelEmitter,
        "address",
        lambda self, b, op, coords: (original(self, b, op, coords)[0], None),
    )
    report = prove_in_bounds(padded)
    assert not report.ok and all(" from A[" in v.what for v in report.violations)


def test_a_shared_tile_one_row_short_is_caught(monkeypatch):
    kernel, _ = _kernel(matmul(64, 64, 64), "a100", 1, sa=1, sb=1, bm=32, bn=32, bk=8)
    s = kernel.schedule
    original = llvm_gpu.KernelEmitter.device_ir

    def short_tile(self, triple, dynamic_shared=False):
        m = original(self, triple, dynamic_shared)
        tile = m.get_global("tile")
        tile.value_type.count -= s.bm + s.pad_a  # drop one k row of A's buffer
        return m

    assert prove_in_bounds(kernel).ok
    monkeypatch.setattr(llvm_gpu.KernelEmitter, "device_ir", short_tile)
    report = prove_in_bounds(kernel)
    assert not report.ok and all("shared[" in v.what for v in report.violations)


def test_isl_answers_range_questions_with_a_witness():
    v = ("t", "b")
    domain = "0 <= t < 32 and 0 <= b < 3"
    form = "4*b + (t mod 4) + 8*floor(t/4)"  # at most 4*2 + 3 + 8*7 = 67
    assert range_violation(v, domain, form, 0, 67) is None
    witness = range_violation(v, domain, form, 0, 66)
    assert witness == {"t": 31, "b": 2}
    assert range_violation(v, domain, "t - 1", 0, None)["t"] == 0
    assert range_violation(v, f"{domain} and t >= 1", "t - 1", 0, None) is None


def test_forms_the_proof_cannot_read_are_errors_not_passes():
    interp = _Interpreter((32, 1, 1), (1, 1, 1))
    with pytest.raises(UnprovableKernelError):
        interp.multiply(Int.of("tid"), Int.of("bx"))
    with pytest.raises(UnprovableKernelError):
        interp.divide(Int.of("tid"), Int.of("bx"), "udiv", "0 <= 0")
    assert str(Lin.of("t").scaled(3) + Lin.of(4) + Lin.of("t")) == "4*t + 4"
    assert str(Lin.of(7).floor_div(2)) == "3" and str(Lin.of(-1).modulo(4)) == "3"


def test_reads_a_k_step_ahead_are_proven_in_bounds():
    """The k loop that reads ahead carries loaded values across iterations (data phis beside the
    counter) and skips the last step's reads in a block of its own: every read is still proven,
    tails included, and none reaches past K."""
    hw = load_target("rtx-2080-ti")
    for w in (matmul(33, 31, 61), matmul(13, 17, 5), conv2d(1, 4, 7, 8, 6, 3, 2, pad=1)):
        space = build_gpu_space(w, hw)
        cfg = space.solve({"sa": [0], "sb": [0], "ahead": [1]})
        kernel = compile_gpu_kernel(schedule_from_config(space, cfg), hw)
        report = prove_in_bounds(kernel)
        assert report.ok, (w.describe(), space.describe_config(cfg), report.violations)
        assert report.count("A", "load") and report.count("B", "load")
