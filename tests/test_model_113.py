"""Stop 113: Zen 4's measured set-refill pace (``memory.set_refill_cycles``) prices what its probe
times, one-line B rows of one L1 set refetched (swept again, or evicted by the rows ahead), and
nothing else there (``memory.set_refill_beyond_refetches = false``): rows met for the first time
and A's broadcasts that thrash a set wait as they did without a pace, as kernels timed side by
side measured."""

from __future__ import annotations

import tomllib

import pytest
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import matmul
from aotune.benchmarks import cpu_record
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.calibrate import SOURCES, check_coverage
from aotune.hwspecs.spec import SPEC_DIR, builtin_names, load_target, spec_from_dict
from aotune.hwspecs.spec_toml import with_value

HW = load_target("znver4")
FIELD = "memory.set_refill_beyond_refetches"
RECORD = cpu_record.RECORDS_DIR / "znver4-matmul-2026-12-06.json.gz"
ROW = "matmul 384x4096x1024"


def _swept_one_row_samples() -> list[dict]:
    """The kept timing's 1 x 16 samples that read B in place (rows 16 KiB apart: one L1 set)
    with k blocks of 32 rows or more: each row refetched, swept again by the next calls or (one
    of them, mc = 1) evicted by the rows ahead."""
    doc = cpu_record.read_record(RECORD)
    (row,) = [r for r in doc["rows"] if r["workload"] == ROW]
    space = build_cpu_space(matmul(384, 4096, 1024), HW)
    return [
        s
        for s in row["accuracy"]["samples"]
        if (c := space.parse_config(s["config"]))["mr"] == 1
        and c["nr"] == 16
        and not c["pack_b"]
        and c["kc"] >= 32
    ]


def _predict(hw, configs: list[str]) -> list[float]:
    """Tier-1 seconds of ``configs`` of the row's workload on ``hw``."""
    space = build_cpu_space(matmul(384, 4096, 1024), hw)
    scheds = [schedule_from_config(space, space.parse_config(c)) for c in configs]
    return [p.seconds for p in AnalyticalCpuModel(hw).estimate_batch(scheds)]


def test_one_line_rows_swept_in_one_set_take_the_measured_pace():
    """Bench of 2026-12-06 on the Zen 4 slice: eleven such samples ran 143-311 ms, 11.2 cycles a
    k step one thread; an L2 round trip a row (the spec without a pace) put them at 1.39-1.47x
    their times, the probe's 10.01 at 0.98-1.04."""
    samples = _swept_one_row_samples()
    assert len(samples) >= 10
    without = with_value(HW, "memory.set_refill_cycles", 0.0)
    configs = [s["config"] for s in samples]
    for s, now, before in zip(samples, _predict(HW, configs), _predict(without, configs)):
        assert 0.85 < now / s["measured_s"] < 1.2, s["config"]
        assert before / now > 1.2, s["config"]


def test_first_touches_and_a_broadcasts_keep_their_price_on_zen4():
    """A 24-row tile reading A in place, rows 4 KiB apart (every broadcast misses one set), and an
    8 x 16 tile meeting 32 B rows 8 KiB apart for the first time (M = 8: one call a panel; the
    rows the schedulers hold fit the set) are priced as without a pace; extended to them, the
    pace moves both (kept Zen 4 samples of such A tiles: 0.63-0.67 of their times where the spec
    without a pace had 0.94-0.97; 8 x 16 B rows met by their tile: 8.5-9.8 cycles a k step,
    stop 83)."""
    assert HW.memory.set_refill_cycles > 0 and not HW.memory.set_refill_beyond_refetches
    without = with_value(HW, "memory.set_refill_cycles", 0.0)
    extended = with_value(HW, FIELD, True)
    a_tall = "mr=24,nr=16,kc=24,mc=24,nc=32,order=mkn,pack_a=0,pack_b=1,unroll=8,par=m,threads=2"
    b_once = "mr=8,nr=16,kc=32,mc=8,nc=720,order=nmk,pack_a=1,pack_b=0,unroll=8,par=n,threads=1"
    for shape, cfg in (((4096, 64, 1024), a_tall), ((8, 2048, 2048), b_once)):
        space = build_cpu_space(matmul(*shape), HW)
        sched = schedule_from_config(space, space.parse_config(cfg))
        now, before, wider = (
            AnalyticalCpuModel(hw).estimate_batch([sched])[0].seconds
            for hw in (HW, without, extended)
        )
        # the B copy's own source lines take the set's pace too (stop 115): a hair here
        assert now == pytest.approx(before, rel=1e-4)
        assert abs(wider / now - 1) > 0.05


def test_every_cpu_spec_says_where_the_field_comes_from_and_calibration_keeps_it():
    """Each built-in CPU spec states the field with its own origin; a file without it extends the
    pace (what every spec did before); hw calibrate takes it from the built-in spec."""
    for name in builtin_names("cpu"):
        spec = load_target(name)
        assert FIELD in dict(spec.origin), name
        assert spec.memory.set_refill_beyond_refetches == (name != "znver4")
    data = tomllib.loads((SPEC_DIR / "znver4.toml").read_text())
    del data["memory"]["set_refill_beyond_refetches"]
    assert spec_from_dict(data, "t").memory.set_refill_beyond_refetches
    assert SOURCES[FIELD][0] == "assumed"
    check_coverage(HW)
