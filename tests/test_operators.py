"""Every operator beyond plain matmul: random shapes (1, primes, below a vector or a tile) and
random valid configs from the Space, each kernel checked against numpy."""

from __future__ import annotations

import os

import numpy as np
import pytest
from aotune.analysis.workload import (
    ACTIVATIONS,
    ConvParams,
    batch_matmul,
    conv2d,
    dense,
    depthwise_conv2d,
    einsum,
)
from aotune.codegen.compile import compile_kernel
from aotune.codegen.runner import (
    HostKernel,
    check_against_numpy,
    conv2d_reference,
    numpy_baseline,
    random_operands,
)
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import UnsupportedWorkloadError
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import load_target
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

# AOTUNE_TEST_EXAMPLES raises the number of drawn cases for a long local run (CI keeps the default).
EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "20"))
small = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 37]), st.integers(1, 70))
HOST = load_target("host")
pytestmark = pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")


def check(workload, seed: int) -> None:
    space = build_cpu_space(workload, HOST)
    (cfg,) = space.sample(1, seed=seed)
    sched = schedule_from_config(space, cfg)
    hk = HostKernel(compile_kernel(sched, HOST), HOST)
    a, b, bias = random_operands(sched, seed)
    correct, err, tol = check_against_numpy(hk, a, b, bias)
    assert correct, (
        f"{workload.describe()} with {space.describe_config(cfg)}: max error {err} > {tol}"
    )
    # C is written, not added to: into an output of NaN the kernel gives what it gave into zeros
    dirty = np.full(hk.kernel.schedule.shapes[2], np.nan, np.float32)
    np.testing.assert_array_equal(hk(a, b, bias, out=dirty), hk(a, b, bias))


settings_ = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@settings_
@given(B=st.integers(1, 4), M=small, N=small, K=small, seed=st.integers(0, 1 << 20))
def test_batch_matmul_matches_numpy(B, M, N, K, seed):
    check(batch_matmul(B, M, N, K), seed)


@settings_
@given(
    M=small,
    N=small,
    K=small,
    bias=st.booleans(),
    activation=st.sampled_from(ACTIVATIONS),
    seed=st.integers(0, 1 << 20),
)
def test_dense_with_fused_epilogue_matches_numpy(M, N, K, bias, activation, seed):
    check(dense(M, N, K, bias, activation), seed)


# contractions in other layouts: transposed inputs, batch index in the middle, output order swapped
# and several loops per GEMM dimension: two row indices, two reductions, no reduction at all
LAYOUTS = [
    "mk,kn->mn",
    "km,kn->mn",
    "mk,nk->mn",
    "kn,mk->mn",
    "bmk,bkn->bmn",
    "mbk,bkn->bmn",
    "bkm,bnk->bmn",
    "abmk,abkn->abmn",
    "abk,kn->abn",
    "mka,kan->mn",
    "mb,nb->mnb",
    "ma,na->mn",
    "mkb,kb->mb",
    "bkm,bk->bm",
]


@settings_
@given(
    spec=st.sampled_from(LAYOUTS),
    sizes=st.lists(small, min_size=5, max_size=5),
    seed=st.integers(0, 1 << 20),
)
def test_einsum_layouts_match_numpy(spec, sizes, seed):
    dims = dict(zip("mnkab", sizes))
    dims["a"], dims["b"] = min(dims["a"], 3), min(dims["b"], 3)
    letters = set(spec) - set(",->")
    check(einsum(spec, {ch: dims[ch] for ch in letters}), seed)


def test_einsums_of_more_than_26_indices_are_checked_against_numpy():
    """numpy's einsum takes a-z and A-Z; the reference names loops in that order, so an einsum
    with upper-case indices past z is checked like any other (it named them '{'... and failed)."""
    spec = "abcdefghijklmA,Anopqrstuvwxyz->abcdefghijklmnopqrstuvwxyz"
    w = einsum(spec, {ch: 1 for ch in set(spec) - set(",->")} | {"A": 3, "z": 2, "a": 2})
    assert len(w.loops) == 27 and "A" in w.einsum_spec()
    check(w, 0)


def test_einsum_tensors_are_not_named_after_its_indices():
    """An index named A, B or C would print as ``C[A, C] += A[A, B] * B[B, C]``: such a spec's
    tensors are in0, in1 and out; any other keeps A, B and C. Both compute what numpy does."""
    clash = einsum("AB,BC->AC", {"A": 5, "B": 3, "C": 2})
    assert [t.name for t in clash.tensors] == ["in0", "in1", "out"]
    assert str(clash.statement) == "out[A, C] += in0[A, B] * in1[B, C]"
    plain = einsum("mk,kn->mn", {"m": 5, "n": 2, "k": 3})
    assert [t.name for t in plain.tensors] == ["A", "B", "C"]
    check(clash, 0)


def test_numpy_baseline_computes_the_same_as_the_reference():
    w = dense(9, 20, 7, True, "gelu")
    space = build_cpu_space(w, HOST)
    sched = schedule_from_config(space, space.solve())
    a, b, bias = random_operands(sched, 3)
    want = (
        0.5
        * (a @ b + bias)
        * (1 + np.tanh(np.sqrt(2 / np.pi) * ((a @ b + bias) + 0.044715 * (a @ b + bias) ** 3)))
    )
    np.testing.assert_allclose(numpy_baseline(sched, a, b, bias)(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "spec, dims, needle",
    [
        ("ij,jk->k", {"i": 4, "j": 4, "k": 4}, "reduction index i appears in only one input"),
        (
            "ijl,jk->ik",
            {"i": 4, "j": 4, "k": 4, "l": 2},
            "reduction index l appears in only one input",
        ),
    ],
)
def test_unsupported_contractions_say_what_is_supported(spec, dims, needle):
    with pytest.raises(UnsupportedWorkloadError, match=needle):
        build_cpu_space(einsum(spec, dims), HOST)


# Convolutions: small images (1, primes, below a vector), every layout, stride, dilation and
# padding, grouped channels; shapes whose kernel does not fit the padded input are skipped here
# (they are bad input, tested in test_cli).
conv_small = st.sampled_from([1, 2, 3, 5, 7, 8, 11, 17])


def conv_fits(H: int, W: int, R: int, S: int, pad: int, dilation: int) -> bool:
    return dilation * (R - 1) + 1 <= H + 2 * pad and dilation * (S - 1) + 1 <= W + 2 * pad


@settings_
@given(
    N=st.integers(1, 2),
    groups=st.integers(1, 3),
    cg=conv_small,
    kg=conv_small,
    H=conv_small,
    W=conv_small,
    R=st.integers(1, 3),
    S=st.integers(1, 3),
    stride=st.integers(1, 3),
    pad=st.integers(0, 2),
    dilation=st.integers(1, 2),
    layout=st.sampled_from(["NCHW", "NHWC"]),
    seed=st.integers(0, 1 << 20),
)
def test_conv2d_matches_numpy(N, groups, cg, kg, H, W, R, S, stride, pad, dilation, layout, seed):
    assume(conv_fits(H, W, R, S, pad, dilation))  # a drawn shape with no output is redrawn
    check(
        conv2d(
            N,
            groups * cg,
            H,
            W,
            groups * kg,
            R,
            S,
            stride=stride,
            pad=pad,
            dilation=dilation,
            groups=groups,
            layout=layout,
        ),
        seed,
    )


@settings_
@given(
    N=st.integers(1, 2),
    C=conv_small,
    H=conv_small,
    W=conv_small,
    R=st.integers(1, 3),
    S=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 1),
    layout=st.sampled_from(["NCHW", "NHWC"]),
    seed=st.integers(0, 1 << 20),
)
def test_depthwise_conv2d_matches_numpy(N, C, H, W, R, S, stride, pad, layout, seed):
    assume(conv_fits(H, W, R, S, pad, 1))
    check(depthwise_conv2d(N, C, H, W, R, S, stride=stride, pad=pad, layout=layout), seed)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "stride, pad, dilation, groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (3, 1, 2, 4)]
)
def test_conv_reference_equals_the_definition(layout, stride, pad, dilation, groups):
    """The numpy reference (windows + tensordot) against the convolution's definition, loop by
    loop."""
    rng = np.random.default_rng(0)
    N, C, H, W, K, R, S = 2, 8, 7, 6, 4, 3, 2
    p = ConvParams(stride, pad, dilation, groups, layout)
    x = rng.standard_normal((N, C, H, W))
    wt = rng.standard_normal((K, C // groups, R, S))
    OH, OW = p.out_size(H, R), p.out_size(W, S)
    want = np.zeros((N, K, OH, OW))
    cg, kg = C // groups, K // groups
    for n in range(N):
        for k in range(K):
            g = k // kg
            for oh in range(OH):
                for ow in range(OW):
                    for c in range(cg):
                        for r in range(R):
                            for s in range(S):
                                h, w_ = (
                                    oh * stride + r * dilation - pad,
                                    ow * stride + s * dilation - pad,
                                )
                                if 0 <= h < H and 0 <= w_ < W:
                                    want[n, k, oh, ow] += x[n, g * cg + c, h, w_] * wt[k, c, r, s]
    if layout == "NHWC":
        got = conv2d_reference(x.transpose(0, 2, 3, 1), wt.transpose(2, 3, 1, 0), p).transpose(
            0, 3, 1, 2
        )
    else:
        got = conv2d_reference(x, wt, p)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_depthwise_nhwc_vectorises_over_channels():
    """NHWC depthwise: the channels index every tensor and are contiguous, so they are the columns,
    with X read in place as vectors (no packing, its padding from the padded copy)."""
    space = build_cpu_space(depthwise_conv2d(1, 32, 112, 112, 3, 3, pad=1, layout="NHWC"), HOST)
    r = space.roles
    assert (r.m, r.n, r.k, r.a, r.b, r.shared_n) == (
        ("oh", "ow"),
        ("g",),
        ("r", "s"),
        "X",
        "Wt",
        True,
    )
    for cfg in space.sample(8, seed=1):
        sched = schedule_from_config(space, cfg)
        assert sched.a_shared and not sched.pack_a and sched.pad_copy is not None
    # NCHW: the contiguous loop (ow) is X's own, so it stays a GEMM per channel
    assert not build_cpu_space(depthwise_conv2d(1, 32, 112, 112, 3, 3, pad=1), HOST).roles.shared_n


def test_conv_is_a_gemm_with_the_window_packed():
    """NHWC 3x3: rows are output pixels, columns output channels, the window is gathered by
    packing."""
    space = build_cpu_space(conv2d(1, 64, 56, 56, 64, 3, 3, pad=1, layout="NHWC"), HOST)
    r = space.roles
    assert (r.m, r.n, r.k, r.a, r.b) == (("oh", "ow"), ("ko",), ("r", "s", "c"), "X", "Wt")
    assert "X must be packed" in {c.name for c in space.constraints}
    assert space.var("pad_copy").domain == (0, 1)
    # 1x1 without padding: every operand is one stride per group, so packing is a free choice
    plain = build_cpu_space(conv2d(1, 64, 56, 56, 256, 1, 1, layout="NHWC"), HOST)
    assert not {c.name for c in plain.constraints} & {"X must be packed", "Wt must be packed"}
    assert "pad_copy" not in {v.name for v in plain.variables}


@pytest.mark.parametrize(
    "C, H, W, pad, dilation, depthwise",
    [
        (3, 5, 3, 1, 1, False),
        (2, 6, 17, 2, 1, False),
        (3, 4, 40, 1, 2, False),
        (4, 9, 33, 1, 1, True),
    ],
)
def test_nchw_read_in_place_copies_pixel_rows_masked_at_the_padding(
    C: int, H: int, W: int, pad: int, dilation: int, depthwise: bool
) -> None:
    """NCHW without the padded copy: packing copies each output row's pixels as vectors, the
    lanes left or right of the image (the width's padding) masked to zero, and the result is the
    convolution's, rows narrower and wider than a vector alike."""
    w = (
        depthwise_conv2d(1, C, H, W, 3, 3, pad=pad)
        if depthwise
        else conv2d(1, C, H, W, 5, 3, 3, pad=pad, dilation=dilation)
    )
    space = build_cpu_space(w, HOST)
    picked = []
    for cfg in space.sample(60, seed=5):
        sched = schedule_from_config(space, cfg)
        if sched.pad_copy is None and sched.pack_b:
            picked.append(sched)
    assert picked, "no in-place, packed-X config drawn"
    for sched in picked[:4]:
        assert sched.b_gather is not None and sched.b_gather.lane_guard_dim == 3
        assert sched.b_pack_run == (W + 2 * pad - dilation * 2)
        hk = HostKernel(compile_kernel(sched, HOST), HOST)
        a, b, bias = random_operands(sched, 7)
        correct, err, tol = check_against_numpy(hk, a, b, bias)
        assert correct, f"{w.describe()}: max error {err} > {tol}"
    # at stride 2 an output row's pixels are not contiguous: element by element, no lane guard
    strided = build_cpu_space(conv2d(1, C, H, W, 5, 3, 3, stride=2, pad=pad), HOST)
    for cfg in strided.sample(20, seed=5):
        sched = schedule_from_config(strided, cfg)
        if sched.pack_b and sched.b_gather is not None:
            assert sched.b_pack_run == 1 and sched.b_gather.lane_guard_dim is None


@pytest.mark.parametrize("par, own_copies", [("m", True), ("n", False)])
def test_threads_pad_the_input_they_read_into_buffers_of_their_own(
    par: str, own_copies: bool
) -> None:
    """NCHW split over output channels: every thread reads every pixel, so each copies the whole
    padded input; split over pixels, each copies its pixels' rows. Each into a buffer of its own
    (no line written by one core and read by the other); both compute the convolution exactly,
    on a second call too."""
    w = conv2d(1, 5, 7, 9, 6, 3, 3, pad=1)
    space = build_cpu_space(w, HOST)
    cfg = space.parse_config(
        f"mr=2,nr=16,kc=16,mc=4,nc=32,order=mkn,pack_a=0,pack_b=1,unroll=1,par={par},"
        "threads=2,pad_copy=1"
    )
    sched = schedule_from_config(space, cfg)
    assert sched.pad_copy_per_thread == own_copies and len(compile_kernel(sched, HOST).launch) == 2
    host = HostKernel(compile_kernel(sched, HOST), HOST)
    assert len(host._padded) == 2
    a, b, bias = random_operands(sched, 3)
    for _ in range(2):  # the second call finds its buffers' borders still zero
        assert check_against_numpy(host, a, b, bias)[0]


@pytest.mark.parametrize("W", [5, 8, 13, 17])
@pytest.mark.parametrize("threads", [1, 2])
def test_pixel_runs_of_a_length_known_only_at_run_time_copy_exactly(W: int, threads: int) -> None:
    """Split over pixels (par=n), a packed run's length is a run-time value: whole vectors are
    plain stores, the last partial one a masked store (AVX2's masked store is microcoded on AMD
    cores). Rows shorter than, equal to and longer than a vector all give the convolution."""
    w = depthwise_conv2d(2, 3, 6, W, 3, 3, pad=1)
    space = build_cpu_space(w, HOST)
    picked = []
    for cfg in space.sample(80, seed=11):
        sched = schedule_from_config(space, cfg)
        if sched.pad_copy is None and sched.pack_b and sched.par == "n":
            if sched.threads == threads:
                picked.append(sched)
    assert picked, "no in-place, packed, pixel-split config drawn"
    for sched in picked[:3]:
        hk = HostKernel(compile_kernel(sched, HOST), HOST)
        a, b, bias = random_operands(sched, 3)
        correct, err, tol = check_against_numpy(hk, a, b, bias)
        assert correct, f"{w.describe()}: max error {err} > {tol}"
