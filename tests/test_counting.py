"""'0 measurements' is counted, not asserted: every run of generated code goes through one counter,
and a search's count is the difference before and after it."""

from __future__ import annotations

import pytest
from aotune.analysis.workload import matmul
from aotune.codegen.compile import compile_kernel
from aotune.codegen.executions import executions, executions_by_kind
from aotune.codegen.runner import HostKernel, random_operands
from aotune.codegen.schedule import schedule_from_config
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import load_target
from aotune.search import driver
from aotune.search.options import SearchOptions

HOST = load_target("host")
pytestmark = pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")
SMALL = SearchOptions(strategy="random", budget=6, compile_top=2, top_k=1)


def test_a_strategy_that_runs_a_kernel_is_counted(monkeypatch):
    def measuring_strategy(space, score, options, progress=None):
        cfg = space.solve()
        sched = schedule_from_config(space, cfg)
        hk = HostKernel(compile_kernel(sched, HOST), HOST)
        a, b, bias = random_operands(sched)
        hk(a, b, bias)
        hk(a, b, bias)
        return [(score(cfg), cfg)]

    monkeypatch.setitem(driver.STRATEGIES, "random", measuring_strategy)
    result = driver.tune(matmul(16, 24, 8), HOST, SMALL)
    assert result.measurements == 2


def test_aotune_s_own_search_runs_nothing_and_its_final_check_is_counted():
    before = executions()
    result = driver.tune(matmul(16, 24, 8), HOST, SMALL)
    assert result.measurements == 0 and executions() == before
    driver.verify(result, min_runs=2)
    assert executions() > before
    assert executions_by_kind().get("host kernel", 0) > 0
