"""Stop 107: Emerald Rapids' L2 evicts at random. An A block read in place whose lines outnumber an
L2 set's ways loses a share of them on each sweep that grows with how far they outnumber the ways,
not all of them as under LRU (stop 106's law, which LRU specs keep)."""

from __future__ import annotations

import random
import tomllib

import numpy as np
import pytest
from aotune.analysis.model import (
    AnalyticalCpuModel,
    ThreadShare,
    _a_block_l2_set_overflow,
    cyclic_sweep_miss_share,
)
from aotune.analysis.workload import matmul
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import HwSpecError
from aotune.hwspecs.spec import REPLACEMENT_POLICIES, SPEC_DIR, load_target, spec_from_dict
from aotune.hwspecs.spec_toml import with_value
from hypothesis import given
from hypothesis import strategies as st

HW = load_target("emeraldrapids")
RANDOM_L2 = HW.cache(2)
LRU_L2 = with_value(HW, "caches.L2.replacement", "lru").cache(2)


def simulated_random_miss_share(lines: int, ways: int, sweeps: int = 600, seed: int = 0) -> float:
    """Misses per access of ``lines`` lines swept in the same order through one set of ``ways``
    ways that evicts a line chosen at random, after the first quarter of the sweeps."""
    rng = random.Random(seed)
    held: list[int] = []
    misses = accesses = 0
    for sweep in range(sweeps):
        for line in range(lines):
            hit = line in held
            if sweep >= sweeps // 4:
                accesses += 1
                misses += not hit
            if not hit:
                if len(held) == ways:
                    held.pop(rng.randrange(ways))
                held.append(line)
    return misses / accesses


@pytest.mark.parametrize(
    "ways,lines", [(16, 17), (16, 18), (16, 20), (16, 24), (16, 32), (16, 48), (8, 10), (8, 16)]
)
def test_random_eviction_share_matches_a_simulation_of_the_policy(ways, lines):
    """The closed form (m = 1 - (1 - 1/ways)^(m (n - 1/2))) against the policy itself, run."""
    simulated = np.mean([simulated_random_miss_share(lines, ways, seed=k) for k in range(3)])
    (share,) = cyclic_sweep_miss_share(np.array([lines]), float(ways), RANDOM_L2)
    assert share == pytest.approx(simulated, abs=0.015)


def test_lru_loses_every_line_of_a_crowded_set_and_random_eviction_a_share():
    lines = np.array([8, 16, 17, 24, 32])
    assert list(cyclic_sweep_miss_share(lines, 16.0, LRU_L2)) == [0, 0, 1, 1, 1]
    share = cyclic_sweep_miss_share(lines, 16.0, RANDOM_L2)
    assert list(share[:2]) == [0, 0]
    assert 0.05 < share[2] < 0.2 and 0.5 < share[3] < 0.7 and 0.75 < share[4] < 0.85


@given(st.integers(1, 64), st.integers(1, 200))
def test_random_eviction_share_is_a_share_that_grows_with_the_lines(ways, lines):
    """In [0, 1], no more than LRU's, 0 while the lines fit, and not smaller for one line more."""
    n = np.array([lines, lines + 1])
    share = cyclic_sweep_miss_share(n, float(ways), RANDOM_L2)
    assert 0.0 <= share[0] <= share[1] <= 1.0
    assert share[0] <= cyclic_sweep_miss_share(n, float(ways), LRU_L2)[0]
    if lines <= ways:
        assert share[0] == 0.0


TILE = "mr=10,nr=16,kc=64,nc=688,order=nkm,pack_a=0,pack_b=1,unroll=4,par=m,threads=1"


def sched(mc: int):
    space = build_cpu_space(matmul(1024, 1024, 1024), HW)
    return schedule_from_config(space, space.parse_config(f"{TILE},mc={mc}"))


def test_an_a_block_costs_more_the_more_it_crowds_its_l2_sets_as_timed():
    """1024^3 on one thread, A's rows 4 KiB apart (32 groups of 4 L2 sets): mc 260 puts 8 lines in
    each set, 510 about 16, 550 to 1020 17 to 32. Timed side by side (README, stop 107), the time
    beyond mc 260's grew 0.06, 0.21, 0.28, 0.41, 0.61 and 1 of mc 1020's at mc 510, 550, 580, 640,
    760 and 1020; LRU would have put every mc from 550 at 1."""
    model = AnalyticalCpuModel(HW)
    seconds = {mc: model.estimate_batch([sched(mc)])[0].seconds for mc in (260, 510, 550, 640, 760)}
    seconds[1020] = model.estimate_batch([sched(1020)])[0].seconds
    grown = [(seconds[mc] - seconds[260]) / (seconds[1020] - seconds[260]) for mc in seconds]
    assert grown[1] == pytest.approx(0.0, abs=0.01)  # mc 510: the block fits its sets
    assert 0.1 < grown[2] < 0.3 and 0.3 < grown[3] < 0.55 and 0.5 < grown[4] < 0.75
    s = sched(550)
    assert 0.1 < _a_block_l2_set_overflow(s, HW, ThreadShare.of(s)) < 0.2


def test_a_spec_names_its_replacement_policy_or_gets_lru():
    assert REPLACEMENT_POLICIES == ("lru", "random")
    assert [c.replacement for c in HW.caches] == ["lru", "random", "lru"]
    assert {c.replacement for c in load_target("znver4").caches} == {"lru"}
    assert HW.origin_of("caches.L2.replacement").startswith("L1 and L3: LRU")
    shown = "\n".join(HW.summary_lines())  # as hw show says it
    assert "2048 KiB, 16-way (random eviction), shared" in shown
    assert "48 KiB, 12-way, shared" in shown
    text = (SPEC_DIR / "emeraldrapids.toml").read_text()
    assert 'replacement = "random"' in text
    with pytest.raises(HwSpecError, match=r"caches\.L2\.replacement 'fifo'.*'lru', 'random'"):
        spec_from_dict(tomllib.loads(text.replace('"random"', '"fifo"', 1)), "t")
    data = tomllib.loads(text)
    del data["caches"][1]["replacement"]
    assert spec_from_dict(data, "t").cache(2).replacement == "lru"
