"""Stop 121: a C line whose 128-byte pair's other line another core writes (par=n splits on
line boundaries) has its own price, ``memory.shared_pair_store_cycles``, which ``hw calibrate``'s
line-pair probe measures."""

from __future__ import annotations

import pytest
from aotune.analysis import model
from aotune.analysis.model import (
    AnalyticalCpuModel,
    ThreadShare,
    shared_line_share,
    shared_line_store_cycles,
    shared_pair_shares,
    shared_pair_store_cycles,
)
from aotune.benchmarks import cpu_record
from aotune.hwspecs import probes
from aotune.hwspecs.spec import builtin_names, load_target
from aotune.hwspecs.spec_toml import with_value

from .model_helpers import matmul_schedule

ZEN4 = load_target("znver4")
PAIR = "memory.shared_pair_store_cycles"
DEPTHWISE_NHWC = "depthwise 112x112x32 3x3 p1 NHWC"
ZEN4_OPERATORS = [
    cpu_record.RECORDS_DIR / f"znver4-operators-2026-12-{day}.json.gz"
    for day in ("01", "01-b", "01-c", "04")
]


@pytest.mark.parametrize("target", builtin_names("cpu"))
def test_the_pair_probe_splits_every_pair_against_none_from_beyond_l2(target):
    """Both kernels of the line-pair probe exist for every CPU target: one-line tiles, the
    columns split (every row's pair stored by two cores, no line by both) against the rows split
    (no pair shared), as many calls each, one k block, C past twice a core's share of L2."""
    hw = load_target(target)
    kernels = probes.pair_probe_schedules(hw)
    assert kernels is not None, target
    split, whole = kernels
    line = hw.cache(1).line_bytes
    assert (split.M, split.N, split.K) == (whole.M, whole.N, whole.K)
    assert split.K == split.kc == probes.PAIR_PROBE_KC
    assert split.nr * 4 == line and split.N == hw.core.cores * split.nr
    assert (split.par, whole.par) == ("n", "m")
    assert split.M * line >= probes.PAIR_PROBE_L2_MULTIPLE * hw.cache_bytes_per_core(2)
    s_share, w_share = ThreadShare.of(split), ThreadShare.of(whole)
    assert s_share.calls == w_share.calls
    assert shared_pair_shares(split, hw, s_share) == (1.0, 0.0)
    assert shared_line_share(split, hw, s_share) == 0.0
    assert shared_pair_shares(whole, hw, w_share) == (0.0, 0.0)


def test_the_model_prices_the_probe_kernels_apart_by_their_pair_lines():
    """At any pair price the model's extra per call of the split kernel is its 8 rows' lines at
    that price (nothing else differs), so the probe reads back the price it was given."""
    split, whole = probes.pair_probe_schedules(ZEN4)
    extra = probes.shared_kernels_model_extra(ZEN4, split, whole, PAIR)
    assert extra(2.0) - extra(1.0) == pytest.approx(split.mr)
    assert extra(1.0) - extra(0.5) == pytest.approx(split.mr / 2)
    assert extra(0.5) == pytest.approx(split.mr / 2)  # nothing else differs
    assert probes.shared_line_cycles(16.7 * split.mr, extra) == pytest.approx(16.7)


def test_an_unmeasured_pair_waits_as_a_shared_line_and_a_measured_one_its_own():
    """0 means not measured: a pair's line then waits what a line both cores write does (the
    price before stop 121); a measured value is the pair's, the line's price untouched."""
    unmeasured = with_value(ZEN4, PAIR, 0.0)
    assert shared_pair_store_cycles(unmeasured) == shared_line_store_cycles(unmeasured)
    assert shared_pair_store_cycles(with_value(ZEN4, PAIR, 7.5)) == 7.5


TILE_48 = "mr=8,nr=48,kc=8,mc=256,nc=48,order={},pack_a=0,pack_b=1,unroll=1,par=n"


@pytest.mark.parametrize(
    "tile, shape",
    [
        # stop 120's 8 x 48 tiles, 96 k blocks, the C block in L2 between visits
        (TILE_48.format("nmk"), (256, 96, 768)),
        # the same over 4096 rows: the C block past L2
        (TILE_48.format("nkm"), (4096, 96, 768)),
        # 16-column tiles, one k block (NHWC depthwise's split, as a matmul)
        ("mr=8,nr=16,kc=8,mc=512,nc=16,order=nmk,pack_a=0,pack_b=1,unroll=1,par=n", (4096, 32, 8)),
        # a C block that stays in L1 between visits
        ("mr=8,nr=16,kc=8,mc=16,nc=16,order=nkm,pack_a=0,pack_b=1,unroll=1,par=n", (16, 32, 64)),
    ],
)
def test_an_unmeasured_pair_price_gives_the_wait_of_before(tile, shape):
    """With ``memory.shared_pair_store_cycles`` unmeasured, a line whose pair is shared waits
    the shared-line price on every visit from beyond L1, as before stop 121, whatever the
    visits' split between L2 and beyond."""
    hw = with_value(ZEN4, PAIR, 0.0)
    s = matmul_schedule(hw, tile + ",threads=2", shape)
    share = ThreadShare.of(s)
    line_shared = model._c_line_sharing(s, hw, share.ranges)
    pair_shared = model._c_line_pair_sharing(s, hw, share.ranges) - line_shared
    assert pair_shared > 0.0
    visits = model._c_visits_from_beyond_l1(s, hw, share)
    before = shared_line_store_cycles(hw) * (line_shared + pair_shared * visits)
    assert model._shared_line_wait_cycles(s, hw, share) == pytest.approx(before)


def test_the_split_kernel_s_price_moves_by_its_pair_lines_and_the_whole_s_not():
    """Through the whole model (tier 2 with the compiled loops): the split kernel's time moves
    by its pair lines times the price's change, per call in step; the rows split do not."""
    from aotune.analysis.features import kernel_features
    from aotune.codegen.compile import compile_kernel

    split, whole = probes.pair_probe_schedules(ZEN4)
    feats = [kernel_features(compile_kernel(s, ZEN4), ZEN4.isa.arch).loop for s in (split, whole)]
    low, high = (with_value(ZEN4, PAIR, v) for v in (5.0, 25.0))
    t_low, t_high = (
        [p.seconds for p in AnalyticalCpuModel(h).predict_batch([split, whole], feats)]
        for h in (low, high)
    )
    assert t_low[1] == t_high[1]
    calls = ThreadShare.of(split).calls
    extra = (t_high[0] - t_low[0]) * ZEN4.core.frequency_ghz * 1e9
    assert extra == pytest.approx(20.0 * split.mr * calls, rel=0.01)


def test_a_pair_line_back_from_the_other_core_instead_of_l2_waits_a_shared_line_s_price():
    """Stop 120's 8 x 48 tiles, 48 columns a thread, kc 8 over 96 k blocks: the C block between
    two visits leaves L1 and fits L2, so after the first visit each pair's line comes back from
    the other core where L2 would have held it, at a shared line's price; the first visit's is
    a miss beyond L2 anyway and waits the pair's price. One k block over C past L2: every visit
    at the pair's."""
    tile = "mr=8,nr=48,kc=8,mc=256,nc=48,order=nmk,pack_a=0,pack_b=1,unroll=1,par=n,threads=2"
    many = matmul_schedule(ZEN4, tile, (256, 96, 768))
    share = ThreadShare.of(many)
    assert share.k_blocks == 96
    assert shared_line_share(many, ZEN4, share) == 0.0
    beyond, from_l2 = shared_pair_shares(many, ZEN4, share)
    assert beyond > 0.0 and from_l2 == pytest.approx(95 * beyond)
    line_price = shared_line_store_cycles(ZEN4)
    wait = model._shared_line_wait_cycles(many, ZEN4, share)
    assert wait == pytest.approx(line_price * from_l2 + shared_pair_store_cycles(ZEN4) * beyond)
    split, _ = probes.pair_probe_schedules(ZEN4)
    split_share = ThreadShare.of(split)
    assert model._shared_line_wait_cycles(split, ZEN4, split_share) == pytest.approx(
        shared_pair_store_cycles(ZEN4)
    )


def test_the_pair_probe_reads_its_timings_through_the_model(monkeypatch):
    """``probe_shared_pairs`` on fake timings: the split kernel 20 cycles a line slower per
    call reads 20; as fast as the other, the floor (0 would mean not measured), both stored as
    measured with their readings."""
    from types import SimpleNamespace

    from aotune.codegen import workers as workers_module

    s = probes.Session.__new__(probes.Session)
    s.host, s.base = ZEN4, ZEN4
    s.found = {"core.frequency_ghz": probes.Finding(3.0, "measured: the clock")}
    s.details = {}
    split, _ = probes.pair_probe_schedules(ZEN4)
    calls = ThreadShare.of(split).calls
    extra = [20.0]

    def readings(runs):
        apart = 1e-3
        return [(apart + extra[0] * split.mr * calls / 3e9, apart)] * probes.SHARED_PROBE_READINGS

    monkeypatch.setattr(probes, "_side_by_side_readings", readings)
    monkeypatch.setattr(probes, "_kernel_runs", lambda *args: lambda: None)
    fake_workers = SimpleNamespace(handoff_seconds=lambda repeats: 4e-8)
    monkeypatch.setattr(workers_module, "workers", lambda: fake_workers)
    found = probes.probe_shared_pairs(s)[PAIR]
    assert found.value == pytest.approx(20.0, abs=0.05)
    assert found.origin.startswith("measured") and "20.0, 20.0" in found.origin
    extra[0] = 0.0
    found = probes.probe_shared_pairs(s)[PAIR]
    assert found.value == probes.PAIR_PROBE_FLOOR and found.origin.startswith("measured")


@pytest.mark.slow
def test_zen4_s_nhwc_depthwise_ranks_its_channel_splits_at_the_measured_pair_price():
    """NHWC depthwise with 32 channels: split 16 + 16 between the threads, every C line's pair
    is shared. Against the median of its four kept Zen 4 timings the model ranks the samples at
    Spearman >= 0.85 with the probe's pair price, about 0.6 with a pair priced as a line both
    cores write (as before stop 121)."""
    docs = [cpu_record.read_record(p) for p in ZEN4_OPERATORS]
    doc = cpu_record.median_record(docs, [p.name for p in ZEN4_OPERATORS])
    doc = {**doc, "rows": [r for r in doc["rows"] if r["workload"] == DEPTHWISE_NHWC]}
    (row,) = cpu_record._compiled_rows(doc, ZEN4, lambda _: None)
    now = row.scores(AnalyticalCpuModel(ZEN4))["spearman"]
    before = row.scores(AnalyticalCpuModel(with_value(ZEN4, PAIR, 0.0)))["spearman"]
    assert ZEN4.memory.shared_pair_store_cycles > 0
    assert now >= 0.85 and before < 0.65 and now - before > 0.2
