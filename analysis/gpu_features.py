"""Features of a generated GPU kernel: its instruction mix from the SASS (nvdisasm), or from the
PTX where no disassembler reads the target (nvdisasm 13 and sm_70), and ptxas's resource report.

Roadmap: the mix is what one thread executes per k tile of ``bk``, per FFMA. The code is read as
it runs, not as it is laid out: loops are found from the backward branches, the innermost loop
holding FFMAs (the k loop, or the tile loop itself when LLVM unrolled bk whole) is weighted by
its trips per tile (the tile's ``mwi x nwi x bk`` FFMAs over its own), the loop around it (the
tile loop: staging loads, stores to shared memory, barriers) once per tile, and the code outside
every loop (zeroing the accumulators, the epilogue's stores of C) once per kernel, i.e. one
``k_tiles``-th per tile. From the SASS's registers, for each global load in the k loop, the
instruction that first reads what it loaded (``load_uses``): how much of the memory's latency a
warp waits for is ``exposed_cycles`` of that. ``gpu_features_many`` reads a batch of kernels with
one nvdisasm run.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from aotune.codegen.cuda_tools import Disassembly, disassemble_many
from aotune.codegen.gpu_compile import GpuKernel


@dataclass(frozen=True)
class GpuMix:
    """Warp instructions (and bytes per thread) per FFMA as one k tile executes them, and where
    they were read from."""

    lds_per_ffma: float  # shared-memory load instructions
    lds_bytes_per_ffma: float  # bytes per thread
    sts_per_ffma: float
    ldg_per_ffma: float
    other_per_ffma: float  # everything else a scheduler must issue (index math, branches, ...)
    source: str  # "sass", "ptx", or "schedule" (tier 1)
    bar_per_ffma: float = 0.0  # barriers
    ldg_bytes_per_ffma: float = 0.0
    sts_bytes_per_ffma: float = 0.0
    local_per_ffma: float = 0.0  # local-memory loads and stores: spilled registers
    local_bytes_per_ffma: float = 0.0


@dataclass(frozen=True)
class GpuFeatures:
    """What tier 2 of the model reads from one compiled kernel."""

    mix: GpuMix
    registers: int
    spill_bytes: int
    shared_bytes: int
    # the k loop's global loads as the SASS orders them: (index of the load, index of the first
    # instruction that reads what it loaded; one in the next iteration counts from ``loop_length``)
    load_uses: tuple[tuple[int, int], ...] = ()
    loop_length: int = 0  # instructions in one iteration of the k loop
    loop_trips: float = 0.0  # its iterations per k tile (0: not read from SASS)
    ffma_at: tuple[int, ...] = ()  # where in one iteration of the k loop its FFMAs are


@dataclass(frozen=True)
class Op:
    """One instruction as the mix sees it: its kind and the bytes it moves per thread."""

    kind: str  # FFMA, LDS, STS, LDG, LOCAL, BAR, OTHER, or FREE (issues nothing worth counting)
    bytes: int = 0
    target: int | None = None  # a branch: the index of the instruction it jumps to
    writes: tuple[int, ...] = ()  # a load's destination registers (SASS only)
    reads: tuple[int, ...] = ()  # the registers it reads (SASS only)


def _loops(ops: Sequence[Op]) -> list[tuple[int, int]]:
    return [(op.target, i) for i, op in enumerate(ops) if op.target is not None and op.target <= i]


def _k_loops(
    ops: Sequence[Op], ffma_per_tile: int
) -> tuple[tuple[int, int], tuple[int, int] | None, float] | None:
    """The innermost loop holding FFMAs, the loop around it (or None) and the first's trips per
    k tile; None without a loop holding FFMAs."""
    loops = _loops(ops)

    def ffma_in(lo: int, hi: int) -> int:
        return sum(1 for op in ops[lo : hi + 1] if op.kind == "FFMA")

    holding = [(lo, hi) for lo, hi in loops if ffma_in(lo, hi)]
    if not holding:
        return None
    inner = min(holding, key=lambda lh: (lh[1] - lh[0], -ffma_in(*lh)))
    around = [lh for lh in loops if lh[0] <= inner[0] and inner[1] <= lh[1] and lh != inner]
    tile = min(around, key=lambda lh: lh[1] - lh[0]) if around else None
    f_inner = ffma_in(*inner)
    f_tile_rest = ffma_in(*tile) - f_inner if tile else 0
    return inner, tile, max(1.0, (ffma_per_tile - f_tile_rest) / f_inner)


def load_uses(ops: Sequence[Op], lo: int, hi: int) -> tuple[tuple[int, int], ...]:
    """(load, first use) of each global load in ``ops[lo..hi]``, indices from ``lo``; a use in
    the next iteration is counted from the loop's length."""
    body = ops[lo : hi + 1]
    out = []
    for i, op in enumerate(body):
        if op.kind != "LDG" or not op.writes:
            continue
        dest = set(op.writes)
        order = [(j, j) for j in range(i + 1, len(body))] + [(j, j + len(body)) for j in range(i)]
        for j, at in order:
            if dest & set(body[j].reads):
                out.append((i, at))
                break
    return tuple(out)


def issue_times(length: int, ffma_at: Sequence[int], ffma_cycles: float) -> list[float]:
    """When each instruction of two iterations of a loop of ``length`` issues for one warp that
    never waits: one a cycle, and an FFMA no sooner than ``ffma_cycles`` after the warp's last
    one (its partition's FMA pipe takes a warp in that many cycles; other instructions issue in
    between)."""
    fma = set(ffma_at)
    out, t, last = [], -1.0, -math.inf
    for x in range(2 * length):
        t += 1
        if x % length in fma:
            t = max(t, last + ffma_cycles)
            last = t
        out.append(t)
    return out + [t + 1]


def exposed_cycles(
    uses: Sequence[tuple[int, int]],
    length: int,
    latency: float,
    ffma_at: Sequence[int] = (),
    ffma_cycles: float = 1.0,
) -> float:
    """Cycles one warp waits per loop iteration for its global loads (``load_uses``; ``latency``
    cycles each), issuing as ``issue_times`` says: the second of two iterations, so that loads
    the first issues for the second are in flight."""
    events = sorted((u + it * length, i + it * length) for it in (0, 1) for i, u in uses)
    at: list[int] = []  # where each wait happens, in order
    waited = [0.0]  # the waits up to and including each of them
    issued = issue_times(length, ffma_at, ffma_cycles)

    def time(x: int) -> float:  # when instruction x issues, after the waits up to it
        return issued[min(x, 2 * length)] + waited[bisect.bisect_right(at, x)]

    for use, issue in events:
        stall = max(0.0, time(issue) + latency - time(use))
        at.append(use)
        waited.append(waited[-1] + stall)
    return waited[bisect.bisect_left(at, 2 * length)] - waited[bisect.bisect_left(at, length)]


def _weights(ops: Sequence[Op], ffma_per_tile: int, k_tiles: int) -> list[float] | None:
    """How often each instruction runs per k tile (module docstring); None without a loop."""
    found = _k_loops(ops, ffma_per_tile)
    if found is None:
        return None
    inner, tile, trips = found
    loops = _loops(ops)
    out = []
    for i in range(len(ops)):
        if inner[0] <= i <= inner[1]:
            out.append(trips)
        elif tile and tile[0] <= i <= tile[1]:
            out.append(1.0)
        elif any(lo <= i <= hi for lo, hi in loops):
            out.append(0.0)  # another loop (e.g. the padding branch after EXIT)
        else:
            out.append(1.0 / max(1, k_tiles))
    return out


def mix_of(ops: Sequence[Op], ffma_per_tile: int, k_tiles: int, source: str) -> GpuMix | None:
    """The per-FFMA mix of one k tile from a kernel's instructions (None: no FFMA at all)."""
    weights = _weights(ops, ffma_per_tile, k_tiles) or [1.0] * len(ops)
    count: dict[str, float] = {}
    moved: dict[str, float] = {}
    for op, w in zip(ops, weights):
        count[op.kind] = count.get(op.kind, 0.0) + w
        moved[op.kind] = moved.get(op.kind, 0.0) + w * op.bytes
    ffma = count.get("FFMA", 0.0)
    if not ffma:
        return None
    return GpuMix(
        count.get("LDS", 0.0) / ffma,
        moved.get("LDS", 0.0) / ffma,
        count.get("STS", 0.0) / ffma,
        count.get("LDG", 0.0) / ffma,
        count.get("OTHER", 0.0) / ffma,
        source,
        count.get("BAR", 0.0) / ffma,
        moved.get("LDG", 0.0) / ffma,
        moved.get("STS", 0.0) / ffma,
        count.get("LOCAL", 0.0) / ffma,
        moved.get("LOCAL", 0.0) / ffma,
    )


_SASS_WIDTH = re.compile(r"\.(8|16|32|64|128)\b")
_SASS_KINDS = {"FFMA": "FFMA", "LDS": "LDS", "STS": "STS", "LDG": "LDG", "BAR": "BAR",
               "LDL": "LOCAL", "STL": "LOCAL"}  # fmt: skip
_SASS_FREE = ("NOP", "EXIT")
_SASS_REG = re.compile(r"\bR(\d+)(\.64)?")


def sass_ops(sass: Disassembly) -> list[Op]:
    """The SASS as Ops (every instruction from sm_70 on is 16 bytes: a branch's target offset
    over 16 is the index it jumps to)."""
    ops = []
    for ins in sass.instructions:
        base = ins.base
        kind = _SASS_KINDS.get(base, "FREE" if base in _SASS_FREE else "OTHER")
        nbytes = 0
        if kind in ("LDS", "STS", "LDG", "LOCAL"):
            width = _SASS_WIDTH.search(ins.opcode)
            nbytes = int(width.group(1)) // 8 if width else 4
        target = None
        if base == "BRA" and ins.operands.startswith("0x"):
            target = int(ins.operands.split(",")[0], 16) // 16
        writes: tuple[int, ...] = ()
        operands = ins.operands.split(",")
        if kind == "LDG" and (first := _SASS_REG.match(operands[0])):
            writes = tuple(range(int(first.group(1)), int(first.group(1)) + max(1, nbytes // 4)))
        sources = operands if base.startswith("ST") or base in ("BAR", "BRA") else operands[1:]
        reads = tuple(
            r for o in sources for m in _SASS_REG.finditer(o)
            for r in ((int(m.group(1)), int(m.group(1)) + 1) if m.group(2) else (int(m.group(1)),))
        )  # fmt: skip
        ops.append(Op(kind, nbytes, target, writes, reads))
    return ops


_PTX_LINE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.]*)\s*([^;]*);?|^\s*(\$?[\w$]+):", re.M)


def ptx_ops(ptx: str) -> list[Op]:
    """The PTX body as Ops (virtual instructions: the fallback where nvdisasm cannot read the
    target's SASS)."""
    ops: list[Op] = []
    labels: dict[str, int] = {}
    branches: list[tuple[int, str]] = []
    body = ptx[ptx.find("{") :] if "{" in ptx else ptx
    for m in _PTX_LINE.finditer(body):
        if m.group(3):
            labels[m.group(3)] = len(ops)
            continue
        op, args = m.group(1), m.group(2)
        if op.startswith(("ld.param", "ret", ".reg", ".shared", ".local")) or op.startswith("."):
            continue
        width = 16 if ".v4" in op else 8 if ".v2" in op else 4
        if op.startswith("fma.rn.f32"):
            ops.append(Op("FFMA"))
        elif op.startswith("ld.shared"):
            ops.append(Op("LDS", width))
        elif op.startswith("st.shared"):
            ops.append(Op("STS", width))
        elif op.startswith("ld.global"):
            ops.append(Op("LDG", width))
        elif op.startswith(("ld.local", "st.local")):
            ops.append(Op("LOCAL", width))
        elif op.startswith("bar.sync") or op.startswith("barrier"):
            ops.append(Op("BAR"))
        elif op.startswith("bra"):
            branches.append((len(ops), args.strip()))
            ops.append(Op("OTHER"))
        else:
            ops.append(Op("OTHER"))
    for i, label in branches:
        if label in labels:
            ops[i] = Op("OTHER", 0, labels[label])
    return ops


def _mix(kernel: GpuKernel, sass: Disassembly | None) -> tuple[GpuMix, list[Op]]:
    s = kernel.schedule
    per_tile, tiles = s.mwi * s.nwi * s.bk, s.k_tiles
    sass = sass if sass is not None else kernel.sass
    mix = None
    ops: list[Op] = []
    if not sass.unavailable and sass.instructions:
        ops = sass_ops(sass)
        mix = mix_of(ops, per_tile, tiles, "sass")
    if mix is None:
        ops = []
        mix = mix_of(ptx_ops(kernel.ptx), per_tile, tiles, "ptx")
    return mix or GpuMix(0.0, 0.0, 0.0, 0.0, 0.0, "ptx"), ops


def gpu_features(kernel: GpuKernel, sass: Disassembly | None = None) -> GpuFeatures:
    """The instruction mix (SASS, else PTX), ptxas's resources and, from the SASS, where the k
    loop's global loads are used of ``kernel`` (``sass``: its disassembly when the caller
    already has it)."""
    r = kernel.report
    mix, ops = _mix(kernel, sass)
    s = kernel.schedule
    found = _k_loops(ops, s.mwi * s.nwi * s.bk) if ops else None
    if found is None:
        return GpuFeatures(mix, r.registers, r.spill_bytes, kernel.shared_bytes)
    (lo, hi), _, trips = found
    ffma_at = tuple(i - lo for i in range(lo, hi + 1) if ops[i].kind == "FFMA")
    return GpuFeatures(mix, r.registers, r.spill_bytes, kernel.shared_bytes,
                       load_uses(ops, lo, hi), hi - lo + 1, trips, ffma_at)  # fmt: skip


def gpu_features_many(kernels: Sequence[GpuKernel]) -> list[GpuFeatures]:
    """``gpu_features`` of many kernels of one target, disassembled by one nvdisasm run."""
    if not kernels:
        return []
    sass = disassemble_many([k.cubin for k in kernels], kernels[0].entry, kernels[0].hw.arch.sm)
    return [gpu_features(k, d) for k, d in zip(kernels, sass)]
