"""Correct without a GPU: run a GPU kernel's per-thread body on this CPU and compare with numpy.

The host module (``llvm_gpu.KernelEmitter.host_module``) holds the same region functions as the
device kernel, wrapped in loops over the block's threads split at its barriers; it is JIT-compiled
for this machine and called once per block. Small grids are emulated whole; large ones on a set of
blocks chosen to exercise every boundary the kernel has (each corner of the grid, so every tail
of M and N, the last batch entry) plus seeded interior blocks, within a FLOP budget. Only the
output tiles of the emulated blocks are compared, and every other element of C must be left
untouched (a write outside a block's tile is caught):

- each tensor lies inside guard zones that reach as far as any address the padded grid can form
  (a row past M, a k past K), so a missing bounds check writes into a guard, never outside the
  allocation, and a read outside A, B or the bias reads a NaN that poisons the result;
- the blocks run in groups, each into an output of its own, so a block's write into another
  emulated block's tile is not hidden by that block running later: each block alone where that is
  cheap, else groups in which no two blocks are neighbours along any grid axis;
- each block starts with NaN in its shared memory and accumulators (a GPU's are undefined), so
  a read of a shared-memory element no thread staged is caught, not read as a lucky zero.
"""

from __future__ import annotations

import ctypes
import functools
import math
import random
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np
from aotune.codegen.compile import _LLVM_LOCK, optimize, target_machine
from aotune.codegen.executions import count_execution
from aotune.codegen.gpu_compile import GpuKernel
from aotune.codegen.gpu_schedule import GpuSchedule, Group, OperandAccess
from aotune.codegen.llvm_gpu import KernelEmitter
from aotune.codegen.runner import apply_activation, numpy_reference, tolerance

# multiply-adds of emulated work per check beyond the grid's corners (about a second here)
EMULATION_FLOP_BUDGET = 4e8
# elements of C cleared and scanned to run every emulated block into an output of its own
ISOLATION_BUDGET = 2e7
# guard zones around each tensor, in elements: at least GUARD_MIN (whole 64-byte lines), at most
# GUARD_MAX (beyond it a stray address would have to be far outside the padded grid)
GUARD_MIN, GUARD_MAX = 1024, 1 << 24
SENTINEL = np.float32(1e30)


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
    """A kernel's host emulation, JIT-compiled: ``run(A, B, C, bias, blocks)``. Each block starts
    with its shared memory and accumulators all NaN, as a GPU's are undefined: a read of shared
    memory no thread staged, or of an accumulator not zeroed, poisons the block's outputs."""

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
            smem.fill(np.nan)
            self._state.fill(np.nan)
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


def _group_reach(op: OperandAccess, group: Group, count: int) -> tuple[int, int]:
    """(lowest, highest) flat-address term of ``group`` for its flat index in [0, count)."""
    lo = hi = 0
    inner = 1
    for pos, (name, extent) in enumerate(reversed(group)):
        top = (count - 1) // inner
        if pos < len(group) - 1:
            top = min(extent - 1, top)
        term = op.flat_coefficient(name) * top
        lo, hi = min(lo, lo + term), max(hi, hi + term)
        inner *= extent
    return lo, hi


def guard_elements(s: GpuSchedule, which: str) -> int:
    """Guard elements on each side of operand ``which`` ("a", "b" or "c"): enough to hold every
    address the padded grid can form (rows up to grid x * bm, columns up to grid y * bn, k up to
    k_tiles * bk), so no missing bounds check reaches past the guards."""
    gx, gy, _ = s.grid
    m, n, k = (s.m_loops, gx * s.bm), (s.n_loops, gy * s.bn), (s.k_loops, s.k_tiles * s.bk)
    batch = (s.batch_loops, s.batch)
    spans = {"a": [m, k, batch] + ([n] if s.shared_n else []), "b": [n, k, batch]}
    op = {"a": s.a, "b": s.b, "c": s.c}[which]
    lo = hi = op.flat_offset
    for group, count in spans.get(which, [m, n, batch]):
        glo, ghi = _group_reach(op, group, count)
        lo, hi = lo + glo, hi + ghi
    need = max(GUARD_MIN, -lo, hi + 1 - math.prod(op.shape))
    return min(GUARD_MAX, -(-need // 16) * 16)


def guarded(x: np.ndarray, guard: int, fill: float) -> tuple[np.ndarray, np.ndarray]:
    """(buffer, view): ``x`` copied into a 64-byte aligned buffer with ``guard`` elements of
    ``fill`` on each side (``guard`` a multiple of 16, so the view keeps the alignment)."""
    total = x.size + 2 * guard
    raw = np.empty(total + 16, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    buf = raw[start : start + total]
    buf.fill(fill)
    view = buf[guard : guard + x.size].reshape(x.shape)
    view[...] = x
    return buf, view


def block_groups(
    s: GpuSchedule, blocks: list[tuple[int, int, int]], budget: float | None = None
) -> list[list[tuple[int, int, int]]]:
    """``blocks`` split into groups to emulate each into an output of its own: one block a group
    where clearing and scanning C that often is within ``budget`` elements, else by the parity of
    each grid index (at most 8 groups; no two blocks of a group are neighbours, diagonals too);
    ``budget`` defaults to ISOLATION_BUDGET."""
    budget = ISOLATION_BUDGET if budget is None else budget
    if len(blocks) * math.prod(s.shapes[2]) <= budget:
        return [[blk] for blk in blocks]
    groups: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    for blk in blocks:
        groups.setdefault((blk[0] % 2, blk[1] % 2, blk[2] % 2), []).append(blk)
    return list(groups.values())


def _finite(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN and infinities as 0 (for an error bound from special inputs)."""
    return np.where(np.isfinite(x), x, 0)


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
    """Emulate ``kernel`` on this CPU and compare its output tiles with numpy (a NaN must be NaN
    and an infinity the same infinity where the reference has one, as with special inputs)."""
    s = kernel.schedule
    a, b, bias = inputs if inputs is not None else random_inputs(s, seed)
    ref = reference if reference is not None else _reference(s, a, b, bias)
    want_all = np.asarray(ref, dtype=np.float64).ravel()
    blocks = choose_blocks(s, seed, budget)
    # reads outside a tensor land on NaN guards; writes outside C on sentinel ones
    _, ga = guarded(np.asarray(a, np.float32), guard_elements(s, "a"), np.nan)
    _, gb = guarded(np.asarray(b, np.float32), guard_elements(s, "b"), np.nan)
    gbias = None if bias is None else guarded(np.asarray(bias, np.float32), GUARD_MIN, np.nan)[1]
    cbuf, c = guarded(np.empty(s.shapes[2], np.float32), guard_elements(s, "c"), SENTINEL)
    host = _host_blocks(kernel)
    errors: list[float] = []
    clean = True
    for group in block_groups(s, blocks):
        cbuf.fill(SENTINEL)
        host.run(ga, gb, c, gbias, group)
        covered = np.unique(np.concatenate([tile_offsets(s, blk) for blk in group]))
        got = c.ravel()[covered].astype(np.float64)
        want = want_all[covered]
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(got - want))  # NaN where one side alone is NaN
        errors.append(float(diff.max(initial=0.0)) if not np.isnan(diff).any() else math.nan)
        c.ravel()[covered] = SENTINEL  # then every element of the buffer must be the sentinel
        clean = clean and bool((cbuf == SENTINEL).all())
    err = max(errors, default=0.0) if not any(map(math.isnan, errors)) else math.nan
    tol = tolerance(_finite(a), _finite(b), s.K, _finite(want_all) if s.has_epilogue else None)
    ok = bool(err <= tol and clean)
    return Emulated(ok, err, tol, len(blocks), s.grid[0] * s.grid[1] * s.grid[2])


__all__ = [
    "Emulated",
    "HostBlocks",
    "OperandAccess",
    "apply_activation",
    "check_emulated",
    "block_groups",
    "choose_blocks",
    "guard_elements",
    "guarded",
    "random_inputs",
    "tile_offsets",
]
