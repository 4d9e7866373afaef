"""How near the default search comes to the model's best, and the CPU samples it starts from.

Stop 112: with 960 estimates, half the search's time went to CP-SAT solves drawing the islands'
first populations, and seeds 0 and 1 of eight ended 4% and 12% behind the best basin on
384x4096x1024. Samples now take a one-decision change without a solve where it stays valid, and
the budget spent on estimates is doubled in the same time (README, stop 112)."""

from __future__ import annotations

import pytest
from aotune.analysis.workload import conv2d, matmul
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.spec import load_target
from aotune.search import cga
from aotune.search.options import SearchOptions
from aotune.targets import target_for
from hypothesis import given, settings
from hypothesis import strategies as st


def _estimate(target, space):
    return lambda cfg: target.estimate([target.schedule(space, cfg)])[0].seconds


@pytest.fixture(scope="module")
def bert_ffn():
    """384x4096x1024 on emeraldrapids: its space, its estimate, and a long search's best."""
    target = target_for(load_target("emeraldrapids"))
    space = target.build_space(matmul(384, 4096, 1024))
    score = _estimate(target, space)
    return space, score, cga.tune(space, score, SearchOptions(seed=7, budget=6000))[0][0]


@pytest.mark.parametrize("seed", [0, 1])
def test_default_search_lands_within_two_percent_of_a_long_search(bert_ffn, seed: int) -> None:
    """Seeds 0 and 1 ended 4% and 12% behind before (960 estimates, every sample solved)."""
    space, score, best_long = bert_ffn
    # the long search's best is no worse than 11 x 32 with A in place, the basin that ran fastest
    # side by side (README, stop 111), so a weak reference cannot make the test pass
    in_place = (
        "mr=11,nr=32,kc=96,mc=11,nc=2048,order=nkm,pack_a=0,pack_b=1,unroll=2,par=n,threads=2"
    )
    assert best_long <= score(space.parse_config(in_place))
    best = cga.tune(space, score, SearchOptions(seed=seed))[0][0]
    assert best <= best_long * 1.02


@settings(max_examples=12, deadline=None)
@given(
    st.integers(1, 97),
    st.integers(1, 300),
    st.integers(1, 130),
    st.sampled_from(["emeraldrapids", "znver4", "neoverse-n1"]),
    st.integers(0, 2**16),
)
def test_cpu_samples_are_valid_and_reproducible(
    m: int, n: int, k: int, spec: str, seed: int
) -> None:
    space = build_cpu_space(matmul(m, n, k), load_target(spec))
    assert space.sample_by_replacement
    drawn = space.sample(20, seed=seed)
    assert drawn
    assert all(space.violations(cfg) == [] for cfg in drawn)
    assert drawn == space.sample(20, seed=seed)


def test_cpu_samples_draw_most_values_without_a_solve(monkeypatch) -> None:
    """Each sample drew every decision's value with a solve, and began with one: 714 solves for
    these 64 before (0.9 ms each), 371 now."""
    from aotune.constraints.space import Space

    space = build_cpu_space(matmul(384, 4096, 1024), load_target("emeraldrapids"))
    solves = []
    real_solve = Space.solve
    monkeypatch.setattr(
        Space, "solve", lambda self, *a, **k: solves.append(1) or real_solve(self, *a, **k)
    )
    drawn = space.sample(64, seed=0)
    assert len(drawn) == 64 and all(space.is_valid(cfg) for cfg in drawn)
    assert len(solves) < 0.7 * 64 * (1 + len(space.variables))
    # still spread over the space: every decision takes more than one value
    assert all(len({cfg[n] for cfg in drawn}) > 1 for n in space.names)


def test_conv_samples_by_replacement_are_valid() -> None:
    hw = load_target("znver4")
    space = build_cpu_space(conv2d(2, 24, 13, 13, 40, 3, 3, pad=1, layout="NHWC"), hw)
    drawn = space.sample(40, seed=3)
    assert len(drawn) == 40 and all(space.is_valid(cfg) for cfg in drawn)
