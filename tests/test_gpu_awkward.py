"""The GPU emulator is a real check: deliberately broken kernels (made here by subclassing the
emitter, never in the product) are caught, whichever block the stray access comes from, and
special inputs (NaN, infinities) are compared as numpy has them, not refused."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np
import pytest
from aotune.analysis.workload import batch_matmul, dense, matmul
from aotune.codegen import gpu_emulator
from aotune.codegen.gpu_schedule import GpuSchedule, schedule_from_config
from aotune.codegen.llvm_gpu import KernelEmitter
from aotune.constraints.gpu import build_gpu_space
from aotune.hwspecs.spec import load_target


@dataclass(frozen=True)
class _Kernel:
    """What the emulator reads of a GpuKernel (no ptxas needed for a broken host module)."""

    schedule: GpuSchedule
    entry: str
    label: str


class _StrayStore(KernelEmitter):
    """Every store of C also writes 0.5 ``shift`` elements further on, where that is inside C
    (so the stray write lands in another block's tile, never outside the allocation)."""

    shift = 0
    storing = False

    def store_floats(self, b, base, flat, vals, align) -> None:
        super().store_floats(b, base, flat, vals, align)
        if self.storing:
            other = b.add(flat, self.c(self.shift))
            size = self.c(math.prod(self.s.c.shape))
            inside = b.and_(b.icmp_signed(">=", other, self.c(0)), b.icmp_signed("<", other, size))
            with b.if_then(inside):
                super().store_floats(b, base, other, [ir.Constant(ir.FloatType(), 0.5)], 4)

    def region_store(self, m: ir.Module) -> ir.Function:
        self.storing = True
        try:
            return super().region_store(m)
        finally:
            self.storing = False


class _TileBoundsOnly(KernelEmitter):
    """The store checks ``flat < size(C)`` instead of the row and column bounds: a row past M
    writes into the next batch entry's C."""

    def region_store(self, m: ir.Module) -> ir.Function:
        below, store = self.below, self.store_floats
        size = self.c(math.prod(self.s.c.shape))

        def inside_c(b, base, flat, vals, align) -> None:
            with b.if_then(b.icmp_signed("<", flat, size)):
                store(b, base, flat, vals, 4)

        self.below, self.store_floats = (lambda *_: None), inside_c
        try:
            return super().region_store(m)
        finally:
            self.below, self.store_floats = below, store


class _NoStoreBounds(KernelEmitter):
    """The store has no bounds check at all: tails write past C's last element."""

    def region_store(self, m: ir.Module) -> ir.Function:
        below = self.below
        self.below = lambda *_: None
        try:
            return super().region_store(m)
        finally:
            self.below = below


class _NanToZeroRelu(KernelEmitter):
    """relu as ``v > 0 ? v : 0``: a NaN becomes 0, where numpy's maximum keeps it."""

    def epilogue(self, b, m, v, pbias, coords, inside=None) -> ir.Value:
        s, self.s = self.s, dataclasses.replace(self.s, activation="none")
        try:
            v = super().epilogue(b, m, v, pbias, coords, inside)  # the bias alone
        finally:
            self.s = s
        zero = ir.Constant(ir.FloatType(), 0.0)
        return b.select(b.fcmp_ordered(">", v, zero), v, zero)


class _StageSkipsLastK(KernelEmitter):
    """Staging leaves the last k row of A's shared-memory tile unwritten (as if the zeros past K
    were taken for granted): on a GPU that row is whatever shared memory held."""

    staging = False

    def store_floats(self, b, base, flat, vals, align) -> None:
        if not self.staging:
            return super().store_floats(b, base, flat, vals, align)
        s = self.s
        last_row = self.c((s.bk - 1) * (s.bm + s.pad_a))
        keep = b.or_(
            b.icmp_signed("<", flat, last_row),
            b.icmp_signed(">=", flat, self.c(s.smem_a_elems)),
        )
        with b.if_then(keep):
            super().store_floats(b, base, flat, vals, align)

    def region_stage(self, m: ir.Module) -> ir.Function:
        self.staging = True
        try:
            return super().region_stage(m)
        finally:
            self.staging = False


@pytest.fixture
def emulate_with(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """``emulate_with(emitter, workload, fixed, **attributes)``: the emulator's verdict on the
    kernel that emitter subclass makes of the config CP-SAT picks within ``fixed``."""

    def run(emitter: type, w, fixed: dict, inputs=None, reference=None, **attributes):
        hw = load_target("t4")
        space = build_gpu_space(w, hw)
        s = schedule_from_config(space, space.solve(fixed))
        monkeypatch.setattr(gpu_emulator, "KernelEmitter", type("E", (emitter,), attributes))
        gpu_emulator._host_blocks.cache_clear()
        kernel = _Kernel(s, "aotune_kernel", f"{emitter.__name__} {attributes}")
        return s, gpu_emulator.check_emulated(kernel, 1, inputs=inputs, reference=reference)

    yield run
    gpu_emulator._host_blocks.cache_clear()


TILES = {"bm": [32], "bn": [32]}


@pytest.mark.parametrize("isolation", [True, False])
@pytest.mark.parametrize(
    "emitter, w, shift",
    [
        (_StrayStore, matmul(64, 64, 19), 32 * 64),  # into the next block along M
        (_StrayStore, matmul(64, 64, 19), 32),  # into the next block along N
        (_StrayStore, matmul(64, 64, 19), -32),  # into the previous block along N
        (_TileBoundsOnly, batch_matmul(3, 40, 32, 19), 0),  # M tail into the next batch entry
    ],
)
def test_a_write_into_another_emulated_blocks_tile_is_caught(
    emulate_with, monkeypatch, emitter, w, shift, isolation
):
    """Run in one output in grid order, a block emulated after the stray writer overwrote the
    stray value: the old emulator passed the M and batch cases. Each block now runs into an
    output of its own (or, past the isolation budget, with no neighbour in its group)."""
    if not isolation:
        monkeypatch.setattr(gpu_emulator, "ISOLATION_BUDGET", 0, raising=False)
    s, result = emulate_with(emitter, w, TILES, shift=shift)
    assert s.grid[0] * s.grid[1] * s.grid[2] == result.blocks_checked > 1
    assert not result.correct, result
    assert len(gpu_emulator.block_groups(s, gpu_emulator.choose_blocks(s))) == (
        result.blocks_checked if isolation else 4
    )
    _, honest = emulate_with(KernelEmitter, w, TILES)
    assert honest.correct, honest


def test_a_write_past_the_end_of_c_lands_in_a_guard(emulate_with):
    """The M tail's rows past C's end: the old emulator wrote them over the heap (glibc aborted
    the process, or nothing noticed); the guard zones hold every address of the padded grid."""
    w = matmul(40, 24, 19)
    s, result = emulate_with(_NoStoreBounds, w, TILES)
    reach = (s.grid[0] * s.bm - 1) * s.N + s.grid[1] * s.bn  # the padded grid's last address
    assert reach - s.M * s.N <= gpu_emulator.guard_elements(s, "c")
    assert not result.correct and result.blocks_checked == result.blocks_total == 2


@pytest.mark.parametrize("grid", [1, 2])
def test_shared_memory_no_thread_staged_is_caught(emulate_with, grid):
    """K = 5 in a k tile of 8: the unstaged row is past K, where the old emulator's shared memory
    held zeros (a fresh buffer, or the same zeros from the previous block), so the kernel passed;
    a block now starts with its shared memory NaN, as undefined as on the GPU."""
    w = matmul(13, 17 * grid, 5)
    fixed = {"bk": [8], "sa": [1], "bm": [16], "bn": [32]}
    s, result = emulate_with(_StageSkipsLastK, w, fixed)
    assert s.K < s.bk and s.grid == (1, grid, 1) and s.smem_a_elems
    assert not result.correct, result
    _, honest = emulate_with(KernelEmitter, w, fixed)
    assert honest.correct, honest


def _special_inputs(s: GpuSchedule) -> tuple[tuple, np.ndarray]:
    """Dense inputs with a NaN, an infinity and a NaN bias, and their float64 reference."""
    a, b, bias = gpu_emulator.random_inputs(s, 4)
    a[0, 0], a[-1, 1], bias[-1] = np.nan, np.inf, np.nan
    with np.errstate(invalid="ignore", over="ignore"):
        ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)
    return (a, b, bias), ref


@pytest.mark.parametrize("fixed", [{"sa": [0], "sb": [0]}, {"sa": [1], "sb": [1]}])
def test_nan_and_inf_inputs_are_compared_not_refused(emulate_with, fixed):
    """A correct relu kernel on inputs with NaN and inf agrees with numpy element by element (the
    old check refused any non-finite output); one that turns a NaN into 0 is caught."""
    w = dense(33, 17, 5, bias=True, activation="relu")
    s, _ = emulate_with(KernelEmitter, w, fixed)
    inputs, ref = _special_inputs(s)
    assert np.isnan(ref).any() and np.isinf(ref).any() and np.isfinite(ref).any()
    _, good = emulate_with(KernelEmitter, w, fixed, inputs=inputs, reference=ref)
    assert good.correct and math.isfinite(good.tolerance), good
    _, bad = emulate_with(_NanToZeroRelu, w, fixed, inputs=inputs, reference=ref)
    assert not bad.correct, bad
