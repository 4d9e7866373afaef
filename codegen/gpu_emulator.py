"""Correct without a GPU: run a GPU kernel's per-thread body on this CPU and compare with numpy.

The host module (``llvm_gpu.KernelEmitter.host_module``) holds the same region functions as the
device kernel, wrapped in loops over the block's threads split at its barriers; it is JIT-compiled
for this machine and called once per block. Small grids are emulated whole; large ones on a set of
blocks chosen to exercise every boundary the kernel has (each corner of the grid, so every tail
of M and N, the last batch entry) plus seeded interior blocks, within a FLOP budget. Only the
output tiles of the emulated blocks are compared, and every other element of C must be left
untouched (a write outside a block's tile is caught).
"""

from __future__ import annotations

import ctypes
import functools
import random
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np
from aotune.codegen.compile import _LLVM_LOCK, optimize, target_machine
from aotune.codegen.executions import count_execution
from aotune.codegen.gpu_compile import GpuKernel
from aotune.codegen.gpu_schedule import GpuSchedule, OperandAccess
from aotune.codegen.llvm_gpu import KernelEmitter
from aotune.codegen.runner import apply_activation, numpy_reference, tolerance

# multiply-adds of emulated work per check beyond the grid's corners (about a second here)
EMULATION_FLOP_BUDGET = 4e8


@dataclass(frozen=True)
class Emulated:
    """The outcome of emulating a kernel on the host."""

    correct: bool
    max_abs_error: float
    tolerance: float
    blocks_checked: int
    blocks_total: int

    def as_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "correct": self.correct,
            "max_abs_error": self.max_abs_error,
            "blocks_checked": self.blocks_checked,
            "blocks_total": self.blocks_total,
        }


class HostBlocks:
    """A kernel's host emulation, JIT-compiled: ``run(A, B, C, bias, blocks)``."""

    def __init__(self, kernel: GpuKernel) -> None:
        from aotune.hwspecs.spec import load_target

        s = kernel.schedule
        self.s = s
        emitter = KernelEmitter(s, kernel.entry)
        host = load_target("host")
        with _LLVM_LOCK:
            tm = target_machine(host, jit=True)
            mod = optimize(emitter.host_module(tm.triple), tm)
            self._engine = llvm.create_mcjit_compiler(mod, tm)
            self._engine.finalize_object()
            addr = self._engine.get_function_address(f"{kernel.entry}_host_block")
        ity = ctypes.c_int32 if emitter.ity.width == 32 else ctypes.c_int64
        sig = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 4 + [ity] * 3 + [ctypes.c_void_p] * 2))
        self._fn = sig(addr)
        self._smem = np.zeros(max(1, s.smem_a_elems + s.smem_b_elems) + 16, np.float32)
        self._state = np.zeros(s.threads * s.mwi * s.nwi, np.float32)

    def run(
        self,
        a: np.ndarray,
        b: np.ndarray,
        c: np.ndarray,
        bias: np.ndarray | None,
        blocks: list[tuple[int, int, int]],
    ) -> None:
        """Run the listed blocks (bx, by, bz), writing into ``c``."""
        for arr in (a, b, c):
            assert arr.dtype == np.float32 and arr.flags.c_contiguous
        smem = self._smem[(-self._smem.ctypes.data % 16) // 4 :]
        pbias = bias.ctypes.data if bias is not None else 0
        count_execution("GPU kernel emulated on the host")
        for bx, by, bz in blocks:
            self._fn(a.ctypes.data, b.ctypes.data, c.ctypes.data, pbias, bx, by, bz,
                     smem.ctypes.data, self._state.ctypes.data)  # fmt: skip


@functools.lru_cache(maxsize=64)
def _host_blocks(kernel: GpuKernel) -> HostBlocks:
    return HostBlocks(kernel)


def choose_blocks(
    s: GpuSchedule, seed: int = 0, budget: float = EMULATION_FLOP_BUDGET
) -> list[tuple[int, int, int]]:
    """The blocks to emulate: all of a small grid; else every grid corner (all tails of M and N,
    first and last batch entry) and seeded others while within ``budget`` multiply-adds."""
    gx, gy, gz = s.grid
    per_block = s.bm * s.bn * s.K
    total = gx * gy * gz
    if total * per_block <= budget:
        return [(x, y, z) for z in range(gz) for y in range(gy) for x in range(gx)]
    chosen = {(x, y, z) for x in {0, gx - 1} for y in {0, gy - 1} for z in {0, gz - 1}}
    rng = random.Random(seed)
    while len(chosen) * per_block < budget and len(chosen) < total:
        chosen.add((rng.randrange(gx), rng.randrange(gy), rng.randrange(gz)))
    return sorted(chosen, key=lambda t: (t[2], t[1], t[0]))


def tile_offsets(s: GpuSchedule, block: tuple[int, int, int]) -> np.ndarray:
    """Flat offsets into C of the outputs one block computes (numpy, from C's index map)."""
    bx, by, bz = block
    rows = np.arange(bx * s.bm, min(s.M, (bx + 1) * s.bm))
    cols = np.arange(by * s.bn, min(s.N, (by + 1) * s.bn))
    flat = np.full((len(rows), len(cols)), s.c.flat_offset, dtype=np.int64)
    for group, values, axis in ((s.m_loops, rows, 0), (s.n_loops, cols, 1)):
        rest = values.copy()
        for name, extent in reversed(group):
            digit = rest % extent
            rest //= extent
            term = digit * s.c.flat_coefficient(name)
            flat += term[:, None] if axis == 0 else term[None, :]
    rest_z = bz
    for name, extent in reversed(s.batch_loops):
        flat += (rest_z % extent) * s.c.flat_coefficient(name)
        rest_z //= extent
    return flat.ravel()


def random_inputs(
    s: GpuSchedule, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Reproducible A, B (and bias) in [-1, 1) for schedule ``s``."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, s.shapes[0]).astype(np.float32)
    b = rng.uniform(-1, 1, s.shapes[1]).astype(np.float32)
    bias = rng.uniform(-1, 1, s.shapes[2][-1]).astype(np.float32) if s.bias else None
    return a, b, bias


def _reference(s: GpuSchedule, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None):
    small = s.flops < 2e9
    with np.errstate(over="ignore"):
        return numpy_reference(s, a, b, bias, np.float64 if small else np.float32)


def check_emulated(
    kernel: GpuKernel,
    seed: int = 0,
    budget: float = EMULATION_FLOP_BUDGET,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None = None,
    reference: np.ndarray | None = None,
) -> Emulated:
    """Emulate ``kernel`` on this CPU and compare its output tiles with numpy."""
    s = kernel.schedule
    a, b, bias = inputs if inputs is not None else random_inputs(s, seed)
    ref = reference if reference is not None else _reference(s, a, b, bias)
    blocks = choose_blocks(s, seed, budget)
    sentinel = np.float32(1e30)
    c = np.full(s.shapes[2], sentinel, np.float32)
    _host_blocks(kernel).run(a, b, c, bias, blocks)
    covered = np.unique(np.concatenate([tile_offsets(s, blk) for blk in blocks]))
    got = c.ravel()[covered].astype(np.float64)
    want = np.asarray(ref, dtype=np.float64).ravel()[covered]
    err = float(np.abs(got - want).max(initial=0.0)) if covered.size else 0.0
    tol = tolerance(a, b, s.K, np.asarray(ref) if s.has_epilogue else None)
    untouched = np.ones(c.size, bool)
    untouched[covered] = False
    clean = bool((c.ravel()[untouched] == sentinel).all())
    ok = bool(np.isfinite(got).all() and err <= tol and clean)
    return Emulated(ok, err, tol, len(blocks), s.grid[0] * s.grid[1] * s.grid[2])


__all__ = [
    "Emulated",
    "HostBlocks",
    "OperandAccess",
    "apply_activation",
    "check_emulated",
    "choose_blocks",
    "random_inputs",
    "tile_offsets",
]
