"""Stop 110: a B panel read in place and swept again call after call, its rows of several lines a
whole number of L1 ways apart (each column of lines in one set), refills each line at a measured
cost (``memory.swept_line_refill_cycles``, ``hw calibrate``'s set-refill probe over rows of eight
lines), added to the k step's issue; a spec without the reading keeps the round-trip rule."""

from __future__ import annotations

import pytest
from aotune.analysis import model as M
from aotune.analysis.model import AnalyticalCpuModel, ThreadShare
from aotune.analysis.workload import matmul
from aotune.codegen.schedule import CpuSchedule, schedule_from_config
from aotune.hwspecs.calibrate import PROBES, check_coverage
from aotune.hwspecs.probes import SET_REFILL_SLACK, swept_line_reading
from aotune.hwspecs.spec import HwSpec, load_target
from aotune.hwspecs.spec_toml import with_value

HW = load_target("emeraldrapids")
UNMEASURED = with_value(HW, "memory.swept_line_refill_cycles", 0.0)


def _sched(
    hw: HwSpec, n: int = 1024, nr: int = 64, mc: int = 256, pack_b: int = 0, kc: int = 64
) -> CpuSchedule:
    from aotune.constraints.cpu import build_cpu_space

    space = build_cpu_space(matmul(256, n, 1024), hw)
    cfg = (
        f"mr=1,nr={nr},kc={kc},mc={mc},nc={n // nr * nr},order=nkm,pack_a=1,pack_b={pack_b},"
        "unroll=2,par=m,threads=1"
    )
    return schedule_from_config(space, space.parse_config(cfg))


def _seconds(hw: HwSpec, s: CpuSchedule) -> float:
    return AnalyticalCpuModel(hw).estimate_batch([s])[0].seconds


def test_each_line_of_a_swept_row_a_way_apart_adds_the_measured_cost():
    s = _sched(HW)
    m_share = ThreadShare.of(s).m_share
    assert M._swept_rows_refill_in_l1(s, HW, m_share)
    lines = 64 * 4 // HW.cache(1).line_bytes
    assert M._swept_row_refill_cycles(s, HW, m_share) == pytest.approx(
        lines * HW.memory.swept_line_refill_cycles
    )
    # added, not overlapped: twice the cost adds the same again to every k step of every tile
    share = ThreadShare.of(s)

    def kernel_cycles(cost: float) -> float:
        hw = with_value(HW, "memory.swept_line_refill_cycles", cost)
        return M.micro_kernel_cycles(s, hw, M.mix_from_schedule(s, hw), share)[0]

    k_steps = 256 * (1024 // 64) * 1024
    added = kernel_cycles(2 * 1.48) - kernel_cycles(1.48)
    assert added == pytest.approx(lines * 1.48 * k_steps, rel=1e-6)


@pytest.mark.parametrize(
    "why,kwargs",
    [
        ("rows a way and a line apart: each line in sets of its own", {"n": 1040, "nr": 80}),
        ("rows of one line keep the set's refill pace", {"nr": 16}),
        ("met by one call only", {"mc": 1}),
        ("B packed", {"pack_b": 1}),
    ],
)
def test_the_per_line_cost_applies_only_to_swept_multi_line_rows_in_one_set_each(why, kwargs):
    s = _sched(HW, **kwargs)
    m_share = ThreadShare.of(s).m_share
    assert not M._swept_rows_refill_in_l1(s, HW, m_share), why
    assert M._swept_row_refill_cycles(s, HW, m_share) == 0.0, why


def test_without_the_reading_a_swept_row_still_waits_a_round_trip():
    s = _sched(UNMEASURED)
    assert not M._swept_rows_refill_in_l1(s, UNMEASURED, ThreadShare.of(s).m_share)
    # the round-trip rule prices the 1 x 64 sweep far above the per-line cost (the timings of
    # stop 110: 1.9-2.3x the in-place panel 4160 bytes apart, the round trips' 3.4x)
    assert _seconds(UNMEASURED, s) > 1.3 * _seconds(HW, s)


def test_the_per_line_reading_is_the_swept_row_over_its_lines_where_it_stands_out():
    assert swept_line_reading(5.4, 11.84, 8) == (pytest.approx(1.48), True)
    assert swept_line_reading(5.4, 5.4 * SET_REFILL_SLACK, 8) == (0.0, False)
    assert swept_line_reading(5.4, 5.0, 8) == (0.0, False)


def test_calibration_writes_the_per_line_cost_from_the_set_refill_probe():
    (probe,) = [p for p in PROBES if "memory.swept_line_refill_cycles" in p.sets]
    assert "memory.set_refill_cycles" in probe.sets
    check_coverage(HW)


def test_the_round_trip_charge_is_skipped_exactly_where_the_lines_are_priced():
    """The conflict term drops B's swept refetches for such a panel (an L2 round trip a row
    without the reading), and leaves every other panel's as it was."""

    def conflict(hw: HwSpec, **kwargs: int) -> float:
        s = _sched(hw, **kwargs)
        return M._conflict_miss_cycles(s, hw, ThreadShare.of(s).m_share, M.mix_from_schedule(s, hw))

    assert conflict(HW) == pytest.approx(0.0, abs=1e-9)
    assert conflict(UNMEASURED) >= HW.cache(2).latency_cycles
    for kwargs in ({"n": 1040, "nr": 80}, {"nr": 16}, {"mc": 1}):
        assert conflict(HW, **kwargs) == conflict(UNMEASURED, **kwargs)


def test_lines_the_crowded_l2_sets_lose_too_come_from_l3():
    """Rows 16 KiB apart (N = 4096) crowd their L2 sets: the lines lost there cost L3's
    latency over L2's as much (the two such samples of stop 110: 1.07x and 1.16x their times)."""
    s = _sched(HW, n=4096, nr=64, kc=128)
    m_share = ThreadShare.of(s).m_share
    lost = M._b_panel_l2_set_overflow(s, HW)
    assert 0.0 < lost < 1.0
    stretch = HW.cache(3).latency_cycles / HW.cache(2).latency_cycles
    cost = HW.memory.swept_line_refill_cycles * (1.0 + lost * (stretch - 1.0))
    assert M._swept_row_refill_cycles(s, HW, m_share) == pytest.approx(4 * cost)


@pytest.mark.parametrize("target", ["emeraldrapids", "haswell", "znver3", "neoverse-n1"])
def test_the_probe_kernel_of_wide_rows_loads_each_vector_once(target):
    from aotune.codegen.microbench import MicroBench, Rows, module_ir

    hw = load_target(target)
    v = hw.isa.vector_bits
    vectors = 8 * hw.cache(1).line_bytes * 8 // v
    wide = Rows(v, 1, vectors)
    assert wide.name == f"rows_{v}_f1_v{vectors}" and Rows(v, 1).name == f"rows_{v}_f1"
    assert wide.accumulators == min(vectors, Rows.WIDE_ACCUMULATORS)
    ir_text = module_ir([wide], hw.isa.triple)
    assert ir_text.count(f"load <{v // 32} x float>") == vectors
    assert MicroBench  # built for the host only in calibration, not here


@pytest.mark.parametrize(
    "name", ["znver2", "znver3", "znver4", "haswell", "skylake-avx512", "neoverse-n1"]
)
def test_specs_that_did_not_measure_it_claim_nothing(name):
    hw = load_target(name)
    assert hw.memory.swept_line_refill_cycles == 0.0
    assert hw.memory.swept_line_refill_overlap == 0.0


def test_zen5_measured_the_cost_and_its_overlap():
    """Zen 5's probe (stop 125): 2.16 cycles a line, and the busy rows swept as fast as in L1."""
    hw = load_target("znver5")
    assert hw.memory.swept_line_refill_cycles == 2.16
    assert hw.memory.swept_line_refill_overlap == 0.98
    for path in ("memory.swept_line_refill_cycles", "memory.swept_line_refill_overlap"):
        assert "measured:" in hw.origin_of(path) and "2026-12-08" in hw.origin_of(path)


def test_a_spec_file_from_before_the_field_still_loads(tmp_path):
    from aotune.hwspecs.spec import SPEC_DIR, load_spec_file

    text = (SPEC_DIR / "emeraldrapids.toml").read_text()
    old = "\n".join(line for line in text.splitlines() if "swept_line_refill_cycles" not in line)
    assert old != text
    path = tmp_path / "old.toml"
    path.write_text(old + "\n")
    assert load_spec_file(path, check_llvm=False).memory.swept_line_refill_cycles == 0.0


def _tall_tile(hw: HwSpec) -> CpuSchedule:
    from aotune.constraints.cpu import build_cpu_space

    space = build_cpu_space(matmul(384, 1024, 1024), hw)
    cfg = "mr=30,nr=16,kc=24,mc=30,nc=256,order=nkm,pack_a=1,pack_b=1,unroll=1,par=m,threads=2"
    return schedule_from_config(space, space.parse_config(cfg))


@pytest.mark.parametrize("pace", [0.0, 14.1, 20.0, 32.0, 54.8])
def test_a_c_store_with_a_dirty_victim_takes_the_measured_pace_where_quicker(pace):
    """30 C rows 4 KiB apart overflow their 12-way set: the 18 lines it cannot keep miss at their
    stores and evict dirty ones (packed B gives no clean victims). Each costs two L2 round trips
    in series, or the set's measured pace for fills with dirty victims where that is quicker."""
    hw = with_value(HW, "memory.dirty_set_refill_cycles", pace)
    s = _tall_tile(hw)
    trip = hw.cache(2).latency_cycles
    per_line = min(pace, 2 * trip) if pace > 0 else 2 * trip
    assert M._c_store_miss_cycles(s, hw, 30, 16) == pytest.approx(18 * per_line)
