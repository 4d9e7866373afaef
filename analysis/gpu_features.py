"""Features of a generated GPU kernel: its instruction mix from the SASS (nvdisasm), or from the
PTX where no disassembler reads the target (nvdisasm 13 and sm_70), and ptxas's resource report.

Roadmap: the mix is what one thread executes per k tile of ``bk``, per FFMA. The code is read as
it runs, not as it is laid out: loops are found from the backward branches, the innermost loop
holding FFMAs (the k loop, or the tile loop itself when LLVM unrolled bk whole) is weighted by
its trips per tile (the tile's ``mwi x nwi x bk`` FFMAs over its own), the loop around it (the
tile loop: staging loads, stores to shared memory, barriers) once per tile, and the code outside
every loop (zeroing the accumulators, the epilogue's stores of C) once per kernel, i.e. one
``k_tiles``-th per tile. ``gpu_features_many`` reads a batch of kernels with one nvdisasm run.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Op:
    """One instruction as the mix sees it: its kind and the bytes it moves per thread."""

    kind: str  # FFMA, LDS, STS, LDG, LOCAL, BAR, OTHER, or FREE (issues nothing worth counting)
    bytes: int = 0
    target: int | None = None  # a branch: the index of the instruction it jumps to


def _weights(ops: Sequence[Op], ffma_per_tile: int, k_tiles: int) -> list[float] | None:
    """How often each instruction runs per k tile (module docstring); None without a loop."""
    loops = [(op.target, i) for i, op in enumerate(ops) if op.target is not None and op.target <= i]

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
    trips = max(1.0, (ffma_per_tile - f_tile_rest) / f_inner)
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
        ops.append(Op(kind, nbytes, target))
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


def _mix(kernel: GpuKernel, sass: Disassembly | None) -> GpuMix:
    s = kernel.schedule
    per_tile, tiles = s.mwi * s.nwi * s.bk, s.k_tiles
    sass = sass if sass is not None else kernel.sass
    mix = None
    if not sass.unavailable and sass.instructions:
        mix = mix_of(sass_ops(sass), per_tile, tiles, "sass")
    if mix is None:
        mix = mix_of(ptx_ops(kernel.ptx), per_tile, tiles, "ptx")
    return mix or GpuMix(0.0, 0.0, 0.0, 0.0, 0.0, "ptx")


def gpu_features(kernel: GpuKernel, sass: Disassembly | None = None) -> GpuFeatures:
    """The instruction mix (SASS, else PTX) and ptxas's resources of ``kernel`` (``sass``: its
    disassembly when the caller already has it)."""
    r = kernel.report
    return GpuFeatures(_mix(kernel, sass), r.registers, r.spill_bytes, kernel.shared_bytes)


def gpu_features_many(kernels: Sequence[GpuKernel]) -> list[GpuFeatures]:
    """``gpu_features`` of many kernels of one target, disassembled by one nvdisasm run."""
    if not kernels:
        return []
    sass = disassemble_many([k.cubin for k in kernels], kernels[0].entry, kernels[0].hw.arch.sm)
    return [gpu_features(k, d) for k, d in zip(kernels, sass)]
