"""Every operator beyond plain matmul: random shapes (1, primes, below a vector or a tile) and random
valid configs from the Space, each kernel checked against numpy."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from aotune.analysis.workload import ACTIVATIONS, batch_matmul, dense, einsum
from aotune.codegen.compile import compile_kernel
from aotune.codegen.runner import HostKernel, check_against_numpy, numpy_baseline, random_operands
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import UnsupportedWorkloadError
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import load_target

# AOTUNE_TEST_EXAMPLES raises the number of drawn cases for a long local run (CI keeps the default).
EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "20"))
small = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 37]), st.integers(1, 70))
HOST = load_target("host")
pytestmark = pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")


def check(workload, seed: int) -> None:
    space = build_cpu_space(workload, HOST)
    cfg, = space.sample(1, seed=seed)
    sched = schedule_from_config(space, cfg)
    hk = HostKernel(compile_kernel(sched, HOST), HOST)
    a, b, bias = random_operands(sched, seed)
    correct, err, tol = check_against_numpy(hk, a, b, bias)
    assert correct, f"{workload.describe()} with {space.describe_config(cfg)}: max error {err} > {tol}"


settings_ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings_
@given(B=st.integers(1, 4), M=small, N=small, K=small, seed=st.integers(0, 1 << 20))
def test_batch_matmul_matches_numpy(B, M, N, K, seed):
    check(batch_matmul(B, M, N, K), seed)


@settings_
@given(M=small, N=small, K=small, bias=st.booleans(), activation=st.sampled_from(ACTIVATIONS),
       seed=st.integers(0, 1 << 20))
def test_dense_with_fused_epilogue_matches_numpy(M, N, K, bias, activation, seed):
    check(dense(M, N, K, bias, activation), seed)


# contractions in other layouts: transposed inputs, batch index in the middle, output order swapped
LAYOUTS = ["mk,kn->mn", "km,kn->mn", "mk,nk->mn", "kn,mk->mn", "bmk,bkn->bmn", "mbk,bkn->bmn", "bkm,bnk->bmn",
           "abmk,abkn->abmn"]


@settings_
@given(spec=st.sampled_from(LAYOUTS), sizes=st.lists(small, min_size=5, max_size=5), seed=st.integers(0, 1 << 20))
def test_einsum_layouts_match_numpy(spec, sizes, seed):
    dims = dict(zip("mnkab", sizes))
    dims["a"], dims["b"] = min(dims["a"], 3), min(dims["b"], 3)
    letters = set(spec) - set(",->")
    check(einsum(spec, {ch: dims[ch] for ch in letters}), seed)


def test_numpy_baseline_computes_the_same_as_the_reference():
    w = dense(9, 20, 7, True, "gelu")
    space = build_cpu_space(w, HOST)
    sched = schedule_from_config(space, space.solve())
    a, b, bias = random_operands(sched, 3)
    want = 0.5 * (a @ b + bias) * (1 + np.tanh(np.sqrt(2 / np.pi) * ((a @ b + bias) + 0.044715 * (a @ b + bias) ** 3)))
    np.testing.assert_allclose(numpy_baseline(sched, a, b, bias)(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec, dims, needle", [
    ("ij,jk->k", {"i": 4, "j": 4, "k": 4}, "2 other spatial loops"),
    ("ijl,jkl->ik", {"i": 4, "j": 4, "k": 4, "l": 2}, "1 reduction loop"),
    ("ik,jk->ijk", {"i": 4, "j": 4, "k": 4}, "2 other spatial loops"),
])
def test_unsupported_contractions_say_what_is_supported(spec, dims, needle):
    with pytest.raises(UnsupportedWorkloadError, match=needle):
        build_cpu_space(einsum(spec, dims), HOST)
