"""The native worker pool: every share runs exactly once, whether a worker or the caller takes
it."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from aotune.analysis.workload import matmul
from aotune.codegen.compile import compile_kernel
from aotune.codegen.runner import HostKernel
from aotune.codegen.schedule import schedule_from_config
from aotune.codegen.workers import NAP_MICROSECONDS, workers
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import load_target

HOST = load_target("host")
pytestmark = pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")


def test_every_share_runs_once_when_workers_spin_or_nap():
    M, N, K = 37, 48, 19
    space = build_cpu_space(matmul(M, N, K), HOST)
    cfg = space.parse_config(
        "mr=4,nr=16,kc=8,mc=8,nc=32,order=nkm,pack_a=1,pack_b=1,unroll=2,par=m,threads=1"
    )
    sched = schedule_from_config(space, cfg)
    hk = HostKernel(compile_kernel(sched, HOST), HOST)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    ws = [
        np.zeros(1 << 16, np.float32) for _ in range(10)
    ]  # packing workspaces: A and B, per share
    mr = sched.mr  # shares split the rows at whole register tiles, as thread_ranges does
    cuts = [0, mr, 3 * mr, 3 * mr, 4 * mr, M]  # uneven, one empty, more shares than cores
    assert 4 * mr < M
    for pause in (
        0.0,
        0.0,
        3 * NAP_MICROSECONDS * 1e-6,
    ):  # back to back, then after the workers nap
        time.sleep(pause)
        c = np.full((M, N), np.nan, np.float32)
        shares = [
            (
                a.ctypes.data,
                b.ctypes.data,
                c.ctypes.data,
                0,
                lo,
                hi,
                ws[2 * i].ctypes.data,
                ws[2 * i + 1].ctypes.data,
            )
            for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:]))
        ]
        workers().run(hk._addr, shares)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4 * K)


def test_the_handoff_probe_times_a_line_moving_between_cores():
    """A line moves between two cores in tens to hundreds of nanoseconds; a probe that timed only
    its own call overhead, or ran both roles on one thread, would not land in that range (or would
    fail: one thread cannot finish both roles)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: the two roles cannot run at once")
    seconds = workers().handoff_seconds()
    assert seconds is not None, "four tries in a row could not tell the long run from the short"
    ns = seconds * 1e9
    # tens to hundreds of ns on a quiet machine (no core fetches a line another wrote in under
    # ~10 ns: that is an L3 hit); on a loaded one the two threads may take turns on one CPU, and
    # each hand-over then costs a yield (tens of microseconds)
    assert 10.0 < ns < 1_000_000.0


def test_a_handoff_probe_that_cannot_tell_its_runs_apart_tries_again_then_says_so(monkeypatch):
    """Other work on both CPUs can make the long run no faster than the short one; that difference
    is noise, so the probe measures again, and says None rather than 0 ns when it never clears."""
    from aotune.codegen import workers as workers_module

    pool = workers()
    long = workers_module.PROBE_LONG_STEPS
    per_step = 100e-9

    def noisy_then_clear(steps: int) -> float:
        calls.append(steps)
        noisy = len(calls) <= warmups + 6  # the first try: long runs as fast as short ones
        return 1e-3 if noisy else 1e-4 + 2 * steps * per_step

    monkeypatch.setattr(workers_module, "PROBE_WARMUP_SECONDS", 0.0)
    calls: list[int] = []
    warmups = 0  # no warm-up runs with PROBE_WARMUP_SECONDS at 0
    monkeypatch.setattr(pool, "_pingpong", noisy_then_clear)
    assert pool.handoff_seconds() == pytest.approx(per_step)
    assert calls.count(long) == 6  # two tries of three long runs

    monkeypatch.setattr(pool, "_pingpong", lambda steps: 1e-3)
    assert pool.handoff_seconds() is None


def test_a_handoff_probe_without_its_partner_gives_up_instead_of_hanging():
    """Role 1 alone waits for a count its partner never writes; it returns after its spin limit and
    leaves the flag untouched, so a worker that never answers cannot hang the benchmark."""
    import ctypes

    pool = workers()
    flag = np.zeros(1, np.int64)
    probe = ctypes.CFUNCTYPE(None, *[ctypes.c_uint64] * 8)(pool._pingpong_addr)
    start = time.perf_counter()
    probe(flag.ctypes.data, 1, 1, 0, 0, 0, 0, 0)
    assert flag[0] == 0
    assert time.perf_counter() - start < 30.0
