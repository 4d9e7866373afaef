"""The GPU search's fast paths give what the slow ones gave: a complete valid hint is CP-SAT's own
answer, sampling by one-decision replacement stays valid and reproducible, the search's solver
settings reach the same repairs, and one nvdisasm run over many kernels lists each kernel exactly
as nvdisasm lists its cubin alone."""

from __future__ import annotations

import dataclasses
import random

import pytest
from aotune.analysis.workload import conv2d, matmul
from aotune.codegen.cuda_tools import disassemble, disassemble_many, text_section
from aotune.codegen.gpu_compile import compile_gpu_kernel, compile_gpu_kernels
from aotune.codegen.gpu_schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.constraints.gpu import build_gpu_space
from aotune.constraints.space import Space
from aotune.errors import AotuneError, CodegenError
from aotune.hwspecs.spec import load_target
from aotune.search import driver
from aotune.search.options import SearchOptions
from aotune.targets import target_for
from hypothesis import given, settings
from hypothesis import strategies as st


def _spaces() -> list[Space]:
    return [
        build_gpu_space(matmul(4096, 4096, 4096), load_target("a100")),
        build_gpu_space(conv2d(1, 64, 56, 56, 64, 3, 3, pad=1, layout="NHWC"), load_target("t4")),
        build_cpu_space(matmul(96, 80, 64), load_target("skylake-avx512")),
    ]


SPACES = _spaces()


@settings(max_examples=12, deadline=None)
@given(which=st.integers(0, len(SPACES) - 1), seed=st.integers(0, 1 << 20))
def test_a_complete_valid_hint_is_what_cp_sat_returns(which, seed):
    space = SPACES[which]
    cfg, other = space.sample(2, seed=seed)
    allowed = {n: {cfg[n], other[n]} for n in space.names[::2]}
    fast = space.solve(allowed, cfg.as_dict(), seed=seed)
    assert fast == cfg
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Space, "_valid_hint", lambda self, allowed, hints: None)
        assert space.solve(allowed, cfg.as_dict(), seed=seed) == cfg  # the solver's own answer


def test_an_invalid_or_partial_hint_still_goes_to_the_solver():
    space = SPACES[0]
    cfg = space.solve()
    bad = cfg.replaced({"tx": cfg["tx"] * 2 if cfg["tx"] < 512 else 1, "ty": 1})
    assert not space.is_valid(bad)
    got = space.solve(None, bad.as_dict(), seed=3)
    assert space.is_valid(got)
    partial = {n: v for n, v in cfg.items if n != "bk"}
    assert space.is_valid(space.solve(None, partial, seed=3))
    outside = space.solve({"bm": [cfg["bm"] * 2 if cfg["bm"] < 256 else 32]}, cfg.as_dict())
    assert space.is_valid(outside) and outside["bm"] != cfg["bm"]


@pytest.mark.parametrize("target", ["a100", "v100", "rtx-4090"])
def test_gpu_samples_are_valid_distinct_and_reproducible(target):
    space = build_gpu_space(
        conv2d(1, 32, 28, 28, 64, 3, 3, pad=1, layout="NCHW"), load_target(target)
    )
    assert space.sample_by_replacement
    first = space.sample(24, seed=5)
    assert first == space.sample(24, seed=5)
    assert len(set(first)) == len(first) >= 20
    assert all(space.is_valid(c) for c in first)
    # spread over the space: most decisions take more than one value
    varied = [n for n in space.names if len({c[n] for c in first}) > 1]
    assert len(varied) >= len(space.names) - 3, varied


def test_the_search_solver_settings_reach_the_same_nearest_repair(monkeypatch):
    space = SPACES[0]
    rng = random.Random(7)
    starts = space.sample(6, seed=11)
    moves = []
    for cfg in starts:
        for _ in range(4):
            v = rng.choice(space.variables)
            moves.append((cfg, {v.name: rng.choice(v.domain)}))

    def changes(cfg, moved):
        return sum(a != b for (_, a), (_, b) in zip(cfg.items, moved.items))

    def repairs():
        out = []
        for cfg, move in moves:
            try:
                out.append(changes(cfg, space.nearest(cfg, move)))
            except AotuneError as e:  # an infeasible move is an answer to compare
                out.append(type(e).__name__)
        return out

    tuned = repairs()
    monkeypatch.setattr(type(space), "search_solver_parameters", {})
    assert tuned == repairs()  # as few changes as CP-SAT with presolve, LP and probing


def _kernels(target: str, n: int = 4):
    hw = load_target(target)
    space = build_gpu_space(matmul(127, 61, 33), hw)
    return hw, [
        compile_gpu_kernel(schedule_from_config(space, c), hw) for c in space.sample(n, seed=3)
    ]


@pytest.mark.parametrize("target", ["t4", "a100", "rtx-3090", "l4", "h100"])
def test_one_nvdisasm_run_lists_each_kernel_as_its_cubin_alone(target):
    hw, kernels = _kernels(target)
    many = disassemble_many([k.cubin for k in kernels], "aotune_kernel", hw.arch.sm)
    assert len(many) == len(kernels) >= 2
    for k, got in zip(kernels, many):
        alone = disassemble(k.cubin, "aotune_kernel")
        assert got == alone  # opcodes and operands, branch targets included
        assert got.instructions and got.unavailable is None
    assert any(i.base in ("BRA", "CALL") for d in many for i in d.instructions)


def test_an_architecture_without_raw_disassembly_says_why_per_kernel():
    hw, kernels = _kernels("v100", 2)
    many = disassemble_many([k.cubin for k in kernels], "aotune_kernel", hw.arch.sm)
    assert [d.unavailable is not None for d in many] == [True, True]
    assert many == [disassemble(k.cubin, "aotune_kernel") for k in kernels]


def test_a_cubin_that_is_not_elf_is_one_line():
    hw, (kernel, *_) = _kernels("a100", 1)
    assert len(text_section(kernel.cubin, "aotune_kernel")) % 16 == 0
    for bad in (b"not an elf", kernel.cubin[:70]):
        with pytest.raises(CodegenError) as info:
            text_section(bad, "aotune_kernel")
        assert "\n" not in str(info.value)
    with pytest.raises(CodegenError, match="no code section"):
        text_section(kernel.cubin, "another_entry")


def test_batch_compiled_kernels_are_the_kernels_compiled_one_by_one():
    hw = load_target("a100")
    space = build_gpu_space(conv2d(1, 8, 9, 9, 16, 3, 3, pad=1, layout="NHWC"), hw)
    schedules = [schedule_from_config(space, c) for c in space.sample(3, seed=1)]
    done = []
    batch = compile_gpu_kernels(schedules, hw, lambda i, n: done.append((i, n)))
    assert done == [(1, 3), (2, 3), (3, 3)] and len(batch) == len(schedules) == 3
    for s, k in zip(schedules, batch):
        alone = compile_gpu_kernel(s, hw)
        assert k.schedule == s and k.ptx == alone.ptx and k.report == alone.report
        assert k.disassembly is not None and k.sass == alone.sass
    target = target_for(hw)
    pairs = target.compile_and_read_many(schedules)
    assert [f for _, f in pairs] == [target.features(compile_gpu_kernel(s, hw)) for s in schedules]


def test_a_gpu_search_compiles_its_shortlist_and_measures_nothing():
    hw = load_target("rtx-3090")
    result = driver.tune(
        conv2d(1, 16, 14, 14, 32, 3, 3, pad=1, layout="NHWC"),
        hw,
        SearchOptions(budget=96, population=12, compile_top=5, top_k=2),
    )
    assert result.measurements == 0 and result.kernels_compiled == 5
    assert len(result.candidates) == 2
    for c in result.candidates:
        assert c.kernel.disassembly is not None and c.kernel.sass.instructions
        assert dataclasses.replace(c.kernel, disassembly=None).sass == c.kernel.sass


class _SpillsUntil:
    """A GPU target whose kernels count as unusable until the ``usable_from``-th compiled."""

    def __init__(self, hw, usable_from: int) -> None:
        self.inner, self.usable_from, self.compiled = target_for(hw), usable_from, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def compile_and_read_many(self, schedules, progress=None):
        pairs = self.inner.compile_and_read_many(schedules, progress)
        out = []
        for kernel, feats in pairs:
            self.compiled += 1
            spills = 0 if self.compiled >= self.usable_from else 64
            out.append((kernel, dataclasses.replace(feats, spill_bytes=spills)))
        return out


@pytest.mark.parametrize(("usable_from", "compiled"), [(1, 4), (5, 6), (7, 8), (99, 8)])
def test_the_shortlist_grows_until_top_k_kernels_are_usable(usable_from, compiled):
    hw = load_target("a100")
    space = build_gpu_space(matmul(64, 48, 40), hw)
    ranked = space.sample(12, seed=4)
    target = _SpillsUntil(hw, usable_from)
    options = SearchOptions(compile_top=4, top_k=2)
    got = driver.compile_shortlist(target, space, ranked, options)
    configs, schedules, kernels, feats = got
    assert configs == ranked[:compiled] and len(schedules) == len(kernels) == compiled
    usable = sum(1 for f in feats if target.usable(f))
    assert usable >= 2 or compiled == 4 + driver.EXTRA_BATCHES * 2


def test_a_spilling_kernel_never_takes_a_place_a_usable_one_could_have():
    # (name, tile, usable), best predicted first: the second tile's only kernel spills
    ranked = [("a", 1, True), ("s", 2, False), ("b", 1, True), ("c", 1, True), ("t", 3, False)]
    pick = driver.usable_top_k(ranked, 3, lambda c: c[2], lambda c: (c[1],))
    assert [c[0] for c in pick] == ["a", "b", "c"]
    assert [
        c[0] for c in driver.usable_top_k(ranked[:2], 2, lambda c: c[2], lambda c: (c[1],))
    ] == [
        "a",
        "s",
    ]  # no usable kernel left for the second place
    mixed = [("a", 1, True), ("b", 1, True), ("d", 4, True)]
    assert [c[0] for c in driver.usable_top_k(mixed, 2, lambda c: c[2], lambda c: (c[1],))] == [
        "a",
        "d",
    ]  # tiles are still spread among usable kernels
