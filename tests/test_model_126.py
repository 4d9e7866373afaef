"""A k block's set-up is paid per block, and a short call's own instructions need issue slots."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aotune.analysis import model
from aotune.analysis.model import AnalyticalCpuModel, KStepMix
from aotune.analysis.workload import depthwise_conv2d
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.spec import load_target

ZEN5 = load_target("znver5")


def _depthwise(nr: int, kc: int):
    space = build_cpu_space(depthwise_conv2d(1, 32, 112, 112, 3, 3, pad=1), ZEN5)
    fixed = "mc=1,nc=1792,order=mkn,pack_a=0,pack_b=1,unroll=8,par=m,threads=1,pad_copy=0"
    return schedule_from_config(space, space.parse_config(f"mr=1,nr={nr},kc={kc},{fixed}"))


@pytest.mark.parametrize(
    ("K", "kc", "rows"), [(9, 8, 4.5), (9, 9, 9.0), (9, 16, 9.0), (64, 16, 16)]
)
def test_a_k_block_has_its_mean_rows(K: int, kc: int, rows: float):
    """K = 9 in blocks of 8 is two blocks of 4.5 rows on average, not blocks of 8."""

    assert model._mean_k_block(SimpleNamespace(K=K, kc=kc)) == rows


def test_a_row_pack_piece_is_set_up_once_per_k_block():
    """Depthwise NCHW, K = 9: in blocks of 8 and 1 each panel's pixel pieces are set up twice,
    so B's pack costs more per element than in one block of 9 (it was priced as blocks of 8)."""
    split, whole = _depthwise(16, 8), _depthwise(16, 9)
    per_split = model._row_run_pack_cycles_per_elem(split, ZEN5)
    per_whole = model._row_run_pack_cycles_per_elem(whole, ZEN5)
    piece = model.ROW_RUN_PIECE_INSTRUCTIONS / ZEN5.core.issue_width
    elems = model._run_pieces(split.b_pack_run, split.nr, split.lanes)[0]
    assert per_split - per_whole == pytest.approx(piece * (2 / 9 - 1 / 9) / elems)


def test_a_call_with_idle_issue_slots_adds_nothing():
    """An FMA-bound call of 8 k steps (the calls ``core.call_cycles`` is measured on) leaves
    room for its set-up and C tile: nothing is added."""
    mix = KStepMix(fma=8, vector_loads=1, scalar_loads=8, stores=0, spills=0, instructions=18)
    assert model._call_issue_cycles(mix, 8, 8, 4.0, ZEN5) == 0.0


def test_a_one_step_call_pays_for_its_instructions():
    """A call of one k step of a one-vector tile has about no idle slot: its set-up and C
    tile's load and store take their issue cycles."""
    issue = ZEN5.core.issue_width
    mix = KStepMix(fma=1, vector_loads=1, scalar_loads=1, stores=0, spills=0, instructions=4)
    extra = model._call_issue_cycles(mix, 1, 1, 4.0 / issue, ZEN5)
    assert extra == pytest.approx((model.CALL_INSTRUCTIONS + 2) / issue)


def test_a_k_split_costs_its_second_blocks_calls():
    """Zen 5, depthwise NCHW 1 x 16 tiles, K = 9: blocks of 8 and 1 ran 115 us slower than one
    block of 9 side by side (577 against 462 us, one thread); the model now prices them at least
    70 us apart (26 before: the pieces priced as blocks of 8, the calls' issue not at all)."""
    m = AnalyticalCpuModel(ZEN5)
    split, whole = (
        m.estimate_batch([s])[0].seconds for s in (_depthwise(16, 8), _depthwise(16, 9))
    )
    assert split - whole > 70e-6
