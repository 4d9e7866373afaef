"""Stop 106: an A block read in place whose rows crowd few L2 sets comes back from L3 for every
column tile that sweeps it, and each of A's lines from L3 waits for L3 as a demand miss."""

from __future__ import annotations

import pytest
from aotune.analysis.model import (
    AnalyticalCpuModel,
    ThreadShare,
    _a_block_l2_set_overflow,
    _l2_sweeps,
    a_demand_miss_cycles,
)
from aotune.analysis.workload import matmul
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.spec import load_target
from aotune.hwspecs.spec_toml import with_value

# L2: 2048 sets of 16 ways, 64-byte lines; stop 106's law, all of a set's lines missing once they
# outnumber its ways, is LRU's (stop 107 measured random eviction there: tests/test_model_107.py)
HW = with_value(load_target("emeraldrapids"), "caches.L2.replacement", "lru")
TILE = "mr=8,nr=16,kc=64,order=nkm,pack_b=1,unroll=4,par=n,threads=1"


def sched(k: int, cfg: str):
    space = build_cpu_space(matmul(384, 1024, k), HW)
    return schedule_from_config(space, space.parse_config(cfg))


def test_an_a_block_overflows_its_l2_sets_only_with_more_rows_than_ways_in_a_set():
    """L2's 2048 sets span 128 KiB of addresses, so rows 16 KiB apart start in 8 of them, 4 lines
    a row (kc 64): mc 128 puts 16 lines in each of those 32 sets, its ways; mc 192 puts 24. Rows
    16,320 bytes apart, or A packed, spread. An A under 4 MiB (numpy gives it 4 KiB pages, whose
    frames pick the set bits) is not counted. Under LRU, a crowded set loses all of its lines."""

    def overflow(k: int, mc: int, pack_a: int = 0) -> float:
        s = sched(k, f"{TILE},mc={mc},nc=128,pack_a={pack_a}")
        return _a_block_l2_set_overflow(s, HW, ThreadShare.of(s))

    assert HW.cache(2).associativity == 16
    assert overflow(4096, 48) == overflow(4096, 128) == 0.0
    assert overflow(4096, 192) == overflow(4096, 384) == 1.0
    assert overflow(4080, 384) == 0.0
    assert overflow(4096, 384, pack_a=1) == 0.0
    space = build_cpu_space(matmul(192, 1024, 4096), HW)  # A of 3 MiB
    small = schedule_from_config(space, space.parse_config(f"{TILE},mc=192,nc=128,pack_a=0"))
    assert _a_block_l2_set_overflow(small, HW, ThreadShare.of(small)) == 0.0


@pytest.mark.parametrize("nc", [32, 128, 512])
def test_an_overflowing_a_block_comes_from_l3_for_every_column_tile(nc):
    """Overflowing, A comes into L2 once per call that reads it (1024 / 16 column tiles), whatever
    nc; fitting, once per n block."""
    crowded = sched(4096, f"{TILE},mc=384,nc={nc},pack_a=0")
    fitting = sched(4096, f"{TILE},mc=48,nc={nc},pack_a=0")
    assert _l2_sweeps(crowded, HW, ThreadShare.of(crowded))[0] == 1024 // 16
    assert _l2_sweeps(fitting, HW, ThreadShare.of(fitting))[0] == 1024 // nc


def test_a_lines_from_l3_wait_at_l3_latency_over_the_misses_in_flight():
    """Each line of A the thread's L2 takes from L3 (A of 6 MiB stays in the last level, so none
    from DRAM) costs L3's latency over the misses in flight; the predictions follow the sweeps:
    nc 32 slower than nc 512 where the block fits its sets, and an overflowing block slower than
    both, as timed on Emerald Rapids (README, stop 106; under LRU, as that stop priced it)."""
    per_line = HW.cache(3).latency_cycles / HW.memory.misses_in_flight
    a_lines = 384 * 4096 * 4 / 64
    model = AnalyticalCpuModel(HW)
    seconds = {}
    for mc in (48, 384):
        for nc in (32, 512):
            s = sched(4096, f"{TILE},mc={mc},nc={nc},pack_a=0")
            share = ThreadShare.of(s)
            sweeps = 1024 // 16 if mc == 384 else 1024 // nc  # each column tile, or n block
            assert a_demand_miss_cycles(s, HW, share) == pytest.approx(a_lines * sweeps * per_line)
            seconds[mc, nc] = model.estimate_batch([s])[0].seconds
    assert seconds[48, 512] < seconds[48, 32] < seconds[384, 512]
    assert seconds[384, 32] == pytest.approx(seconds[384, 512], rel=0.05)
