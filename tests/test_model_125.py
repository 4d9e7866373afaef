"""Stop 125: a swept B row's line refills overlap the k step's other work on Zen 5
(``memory.swept_line_refill_overlap``, the set-refill probe's busy rows), where Emerald Rapids'
kernels paid them on top; Zen 5's spec takes the probes that came after its calibration."""

from __future__ import annotations

import pytest
from aotune.analysis import model as M
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import matmul
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.calibrate import PROBES, check_coverage
from aotune.hwspecs.probes import swept_line_overlap_reading
from aotune.hwspecs.spec import load_target
from aotune.hwspecs.spec_toml import with_value

ZEN5 = load_target("znver5")
WIDE = "mr=1,nr=224,kc={kc},mc=384,nc=224,order=mkn,pack_a=0,pack_b=0,unroll=4,par=n,threads=1"


def test_the_overlap_reading_tells_hidden_from_added_refills():
    # Zen 5's readings: busy rows swept as fast as in L1: the refills hid
    assert swept_line_overlap_reading(16.47, 39.97, 39.58) == 1.0
    assert swept_line_overlap_reading(17.3, 37.53, 37.86) == pytest.approx(0.98, abs=0.005)
    # swept busy rows that take both: added
    assert swept_line_overlap_reading(16.0, 40.0, 56.0) == 0.0
    assert swept_line_overlap_reading(16.0, 40.0, 60.0) == 0.0  # slower still: clipped
    assert swept_line_overlap_reading(16.0, 40.0, 48.0) == pytest.approx(0.5)
    assert swept_line_overlap_reading(0.0, 40.0, 40.0) == 0.0


@pytest.mark.parametrize("step, refills", [(14.7, 32.1), (40.0, 10.0), (5.0, 5.0)])
def test_a_k_step_takes_its_refills_less_the_overlapped_share(step, refills):
    added = with_value(ZEN5, "memory.swept_line_refill_overlap", 0.0)
    hidden = with_value(ZEN5, "memory.swept_line_refill_overlap", 1.0)
    half = with_value(ZEN5, "memory.swept_line_refill_overlap", 0.5)
    assert M._with_swept_refills(step, refills, added) == pytest.approx(step + refills)
    assert M._with_swept_refills(step, refills, hidden) == pytest.approx(max(step, refills))
    assert M._with_swept_refills(step, refills, half) == pytest.approx(
        step + refills - 0.5 * min(step, refills)
    )


def _ms(hw, n: int, kc: int) -> float:
    space = build_cpu_space(matmul(384, n, 1024), hw)
    s = schedule_from_config(space, space.parse_config(WIDE.format(kc=kc)))
    (p,) = AnalyticalCpuModel(hw).estimate_batch([s])
    return p.seconds * 1e3


@pytest.mark.parametrize("kc, measured_ms", [(16, 53.9), (32, 53.7)])
def test_zen5_one_row_tiles_over_rows_in_one_set_side_by_side(kc, measured_ms):
    """1 x 224 tiles, B read in place with rows 16 KiB apart (each column of lines in one L1 set),
    one thread, 384 x 4096 x 1024 (Zen 5 slice, stop 125): 53.7-54.0 ms at kc 16-32 against
    21.4-22.1 with rows 16448 bytes apart, 31.7 cycles a k step, the refills' 2.26 a line alone.
    Overlapped, the prediction is within 1.25x; added, 1.5x over; unpriced, under."""
    assert 0.9 < _ms(ZEN5, 4096, kc) / measured_ms < 1.25
    added = with_value(ZEN5, "memory.swept_line_refill_overlap", 0.0)
    assert _ms(added, 4096, kc) / measured_ms > 1.4
    # rows spread over the sets claim no swept-line cost: the overlap changes nothing there
    assert _ms(added, 4112, kc) == pytest.approx(_ms(ZEN5, 4112, kc))


def test_the_set_refill_probe_sets_the_overlap_and_every_spec_has_it():
    (probe,) = [p for p in PROBES if "memory.swept_line_refill_overlap" in p.sets]
    assert "memory.swept_line_refill_cycles" in probe.sets
    for name in ("znver2", "znver3", "znver4", "znver5", "emeraldrapids", "haswell"):
        hw = load_target(name)
        check_coverage(hw)
        assert hw.origin_of("memory.swept_line_refill_overlap") != "not stated"
    assert load_target("emeraldrapids").memory.swept_line_refill_overlap == 0.0


def test_zen5_takes_the_probes_that_came_after_its_calibration():
    """Measured on the Zen 5 slice on 2026-12-08, where the built-in had assumed them."""
    for path in (
        "core.store_forward_cycles",
        "memory.dirty_set_refill_cycles",
        "memory.shared_line_store_cycles",
        "memory.shared_pair_store_cycles",
        "caches.L2.copy_bandwidth_share",
        "caches.L3.copy_bandwidth_share",
    ):
        origin = ZEN5.origin_of(path)
        assert "measured" in origin and "stop 125" in origin, path
    assert ZEN5.core.store_forward_cycles == 10.9
