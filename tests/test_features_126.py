"""An activation's polynomial, inlined where the tile is stored, is not read as the k loop."""

from __future__ import annotations

import pytest
from aotune.analysis.features import kernel_features, main_loop_fmas
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import dense
from aotune.codegen.compile import compile_kernel
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.spec import builtin_names, load_target


def _kernel(hw, activation: str, mr: int, vectors: int, kc: int, unroll: int):
    space = build_cpu_space(dense(128, 3072, 768, True, activation), hw)
    nr = vectors * hw.vector_lanes_f32
    cfg = space.solve({"mr": [mr], "nr": [nr], "kc": [kc], "unroll": [unroll]})
    sched = schedule_from_config(space, cfg)
    return sched, kernel_features(compile_kernel(sched, hw), hw.isa.arch).loop


@pytest.mark.parametrize("name", builtin_names("cpu"))
@pytest.mark.parametrize("activation", ["gelu", "sigmoid"])
def test_an_epilogue_polynomial_does_not_hide_the_k_loop(name: str, activation: str):
    """Gelu's and sigmoid's exp put ten times a k step's FMAs outside the k loop of a 4 x
    2-vector tile (twice: once where C is stored, once where it is added to); the features
    still read the k loop, as without the activation, not the whole function."""
    hw = load_target(name)
    _, plain = _kernel(hw, "none", 4, 2, 48, 2)
    _, act = _kernel(hw, activation, 4, 2, 48, 2)
    assert not plain.loop_free and not act.loop_free
    assert act.fma == plain.fma and act.fma % (4 * 2) == 0 and act.fma >= 2 * 4 * 2
    assert (act.spills, act.instructions) == (plain.spills, plain.instructions)


def test_an_activation_costs_its_epilogue_not_a_spilling_k_step():
    """The model prices gelu's dense as the plain one plus its epilogue: a few percent here
    (Zen 5, 6 x 64, kc 48: the whole function read as the loop had priced it 21% above)."""
    hw = load_target("znver5")
    model = AnalyticalCpuModel(hw)
    (ps, pl), (gs, gl) = _kernel(hw, "none", 6, 4, 48, 2), _kernel(hw, "gelu", 6, 4, 48, 2)
    plain, gelu = (p.seconds for p in model.predict_batch([ps, gs], [pl, gl]))
    assert plain < gelu < 1.05 * plain


def test_a_short_k_block_is_still_read_whole():
    """The main loop's FMAs per iteration come from the tile's name and the unroll; a remainder
    loop holds fewer, so the rule for an unrolled-away k loop still applies."""
    assert main_loop_fmas(4, 16, "ukernel_6x64") == 4 * 6 * 4
    assert main_loop_fmas(2, 16, "ukernel_1x49") == 2 * 1 * 4
    assert main_loop_fmas(4, 16, "pack_b") == 0
