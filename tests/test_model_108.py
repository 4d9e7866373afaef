"""Stop 108: a B micro-panel read in place whose lines, with the rows the micro-kernel prefetches
past it, outnumber the ways of the few L2 sets its addresses pick is refetched from L3 on each
sweep, on a machine whose frames lie in address order (``memory.addresses_pick_l2_sets``)."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from aotune.analysis.model import (
    AnalyticalCpuModel,
    ThreadShare,
    _a_block_l2_set_overflow,
    _b_panel_l2_set_overflow,
)
from aotune.analysis.workload import matmul
from aotune.codegen.schedule import CpuSchedule, schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.calibrate import PROBES, SOURCES, check_coverage
from aotune.hwspecs.probes import addresses_pick_sets
from aotune.hwspecs.spec import SPEC_DIR, HwSpec, load_target, spec_from_dict
from aotune.hwspecs.spec_toml import with_value

HW = load_target("emeraldrapids")
SCATTERED = with_value(HW, "memory.addresses_pick_l2_sets", False)
TILE = "mr=1,nr=16,mc=96,nc=1024,order=nmk,pack_a=1,pack_b=0,unroll=4,par=m,threads=1"

# Timed side by side on the Emerald Rapids slice (README, stop 108), one thread, 96 x N x 1024:
# cycles per k step at 2.95 GHz. B's rows are 4 N bytes apart, all in one L1 set; 128 KiB of
# addresses spans its 2048 L2 sets, so they fall in 2 to 32 of them.
TIMED = {
    (2048, 128): 4.3, (2048, 192): 4.8, (2048, 256): 9.6, (2048, 512): 15.1,
    (3072, 384): 5.2, (3072, 512): 9.0,
    (4096, 48): 4.7, (4096, 64): 5.1, (4096, 96): 18.9, (4096, 512): 22.1,
    (5120, 384): 4.8, (5120, 512): 8.8,
    (6144, 128): 5.3, (6144, 192): 5.7, (6144, 256): 8.9, (6144, 384): 15.5,
    (8192, 64): 25.1,
    (12288, 64): 5.0, (12288, 96): 20.9,
    (16384, 16): 4.0, (16384, 24): 10.3, (16384, 64): 36.2,
}  # fmt: skip


def sched(n: int, kc: int, k: int = 1024, hw: HwSpec = HW) -> CpuSchedule:
    space = build_cpu_space(matmul(96, n, k), hw)
    return schedule_from_config(space, space.parse_config(f"kc={kc},{TILE}"))


@pytest.mark.parametrize("n,kc", sorted(TIMED))
def test_the_panel_misses_l2_exactly_where_it_ran_slow(n, kc):
    """Every timed panel that ran at the pace of one that fits (under 6 cycles a k step) keeps
    nearly all its lines in L2; every one that ran 1.7x slower or more loses a fifth or more."""
    share = _b_panel_l2_set_overflow(sched(n, kc), HW)
    if TIMED[n, kc] < 6.0:
        assert share < 0.1
    else:
        assert share > 0.2


def test_the_rows_prefetched_past_the_panel_crowd_its_sets():
    """Rows 16 KiB apart fill 8 L2 sets: kc 96 alone puts 12 lines in each, under the 16 ways;
    with the 75 rows the kernel prefetches into L2 past it, 21, and it ran 3.7x slower."""
    s = sched(4096, 96)
    assert s.b_prefetch_rows == 75
    assert _b_panel_l2_set_overflow(s, HW) > 0.3
    assert _b_panel_l2_set_overflow(dataclasses.replace(s, b_prefetch_rows=0), HW) == 0.0


def test_no_row_past_b_is_counted_as_prefetched():
    """Rows 20 KiB apart fill 32 L2 sets: a 512-row panel puts 16 lines in each, as many as the
    ways. With K = 1024 the 75 rows prefetched past it join them (it ran 1.8x slower: TIMED);
    with kc = K = 512 those prefetches run off B's end."""
    alone = sched(5120, 512, k=512)
    assert alone.K == alone.kc and alone.b_prefetch_rows > 0
    assert _b_panel_l2_set_overflow(alone, HW) == 0.0
    assert _b_panel_l2_set_overflow(sched(5120, 512), HW) > 0.2


def test_a_crowded_panel_is_priced_as_refetched_from_l3():
    """kc 128 against kc 64 at 16 KiB rows ran 3.6-3.9x slower; the model said 1.01x before."""
    model = AnalyticalCpuModel(HW)
    fits, crowded = (model.estimate_batch([sched(4096, kc)])[0].seconds for kc in (64, 128))
    assert crowded / fits > 2.5
    scattered = AnalyticalCpuModel(SCATTERED)
    fits, crowded = (scattered.estimate_batch([sched(4096, kc, hw=SCATTERED)])[0].seconds
                     for kc in (64, 128))  # fmt: skip
    assert crowded / fits < 1.1


def test_set_conflicts_beyond_l1_need_frames_in_address_order():
    """Where the frames scatter, neither B's panel nor A's block crowds L2 sets: the Zen slices'
    kept timings ran such B panels at the pace of ones L2 keeps."""
    assert HW.memory.addresses_pick_l2_sets
    assert not load_target("znver4").memory.addresses_pick_l2_sets
    s = sched(4096, 256)
    assert _b_panel_l2_set_overflow(s, HW) > 0.5
    assert _b_panel_l2_set_overflow(s, SCATTERED) == 0.0
    space = build_cpu_space(matmul(1024, 1024, 1024), HW)
    a = schedule_from_config(
        space,
        space.parse_config(
            "mr=10,nr=16,kc=64,mc=1020,nc=688,order=nkm,pack_a=0,pack_b=1,unroll=4,par=m,threads=1"
        ),
    )
    assert _a_block_l2_set_overflow(a, HW, ThreadShare.of(a)) > 0.5
    assert _a_block_l2_set_overflow(a, SCATTERED, ThreadShare.of(a)) == 0.0


def test_a_b_under_the_huge_page_threshold_or_packed_keeps_its_lines():
    """numpy advises huge pages from 4 MiB on; a packed B is read from its contiguous panel."""
    assert _b_panel_l2_set_overflow(sched(4096, 128, k=128), HW) == 0.0  # B of 2 MiB
    packed = dataclasses.replace(sched(4096, 256), pack_b=True)
    assert _b_panel_l2_set_overflow(packed, HW) == 0.0


def test_the_spec_field_defaults_to_scattered_and_every_cpu_spec_says_where_it_comes_from():
    """A spec file without the field claims no set conflicts beyond L1's."""
    text = (SPEC_DIR / "emeraldrapids.toml").read_text()
    data = tomllib.loads(text)
    del data["memory"]["addresses_pick_l2_sets"]
    assert not spec_from_dict(data, "t").memory.addresses_pick_l2_sets
    for name in ("emeraldrapids", "haswell", "skylake-avx512", "neoverse-n1", "znver2", "znver3",
                 "znver4", "znver5"):  # fmt: skip
        assert load_target(name).origin_of("memory.addresses_pick_l2_sets")
    assert "memory.addresses_pick_l2_sets" not in SOURCES  # hw calibrate measures it


def test_hw_calibrate_measures_whether_addresses_pick_l2_sets():
    """The probe's reading: lines one L2 way apart, chased, against lines spread over L2's sets
    (Emerald Rapids slice, numpy-like private memory: 108-118 cycles against 16; shared memory,
    whose frames scatter: 23 against 16)."""
    (probe,) = [p for p in PROBES if "memory.addresses_pick_l2_sets" in p.sets]
    assert probe.sets == ("memory.addresses_pick_l2_sets",)
    check_coverage(HW)
    assert addresses_pick_sets(108.0, 16.0, 16.0, 72.0)
    assert not addresses_pick_sets(23.0, 16.0, 16.0, 72.0)
    assert not addresses_pick_sets(16.0, 16.0, 16.0, 72.0)
    assert addresses_pick_sets(44.0, 16.0, 16.0, 72.0)  # half-way: a level's worth of misses
