"""Features of a generated GPU kernel: its instruction mix from the SASS (nvdisasm), or from the
PTX where no disassembler reads the target (nvdisasm 13 and sm_70), and ptxas's resource report.

The kernel's main loop dominates its static code (LLVM unrolls the bk step), so the mix is read
per FFMA: how many shared-memory loads and bytes, global loads, stores and other instructions
accompany each FFMA. The model scales those ratios by the FFMAs the schedule must execute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aotune.codegen.gpu_compile import GpuKernel


@dataclass(frozen=True)
class GpuMix:
    """Instructions per FFMA, and where they were read from."""

    lds_per_ffma: float  # shared-memory load instructions
    lds_bytes_per_ffma: float  # bytes per thread
    sts_per_ffma: float
    ldg_per_ffma: float
    other_per_ffma: float  # everything else a scheduler must issue (index math, branches, ...)
    source: str  # "sass" or "ptx"


@dataclass(frozen=True)
class GpuFeatures:
    """What tier 2 of the model reads from one compiled kernel."""

    mix: GpuMix
    registers: int
    spill_bytes: int
    shared_bytes: int


_SASS_WIDTH = re.compile(r"\.(32|64|128)\b")


def _sass_mix(kernel: GpuKernel) -> GpuMix | None:
    sass = kernel.sass
    if sass.unavailable or not sass.instructions:
        return None
    ffma = lds = lds_bytes = sts = ldg = other = 0
    for ins in sass.instructions:
        base = ins.base
        if base == "FFMA":
            ffma += 1
        elif base == "LDS":
            lds += 1
            width = _SASS_WIDTH.search(ins.opcode)
            lds_bytes += int(width.group(1)) // 8 if width else 4
        elif base == "STS":
            sts += 1
        elif base == "LDG":
            ldg += 1
        elif base not in ("NOP", "EXIT", "BRA") or base == "BRA":
            other += 1
    if not ffma:
        return None
    return GpuMix(lds / ffma, lds_bytes / ffma, sts / ffma, ldg / ffma, other / ffma, "sass")


_PTX_OP = re.compile(r"^\s+([a-z][\w.]*)", re.M)


def _ptx_mix(kernel: GpuKernel) -> GpuMix:
    ffma = lds = lds_bytes = sts = ldg = other = 0
    for op in _PTX_OP.findall(kernel.ptx):
        if op.startswith("fma.rn.f32"):
            ffma += 1
        elif op.startswith("ld.shared"):
            lds += 1
            lds_bytes += 16 if ".v4" in op else 8 if ".v2" in op else 4
        elif op.startswith("st.shared"):
            sts += 1
        elif op.startswith("ld.global"):
            ldg += 1
        elif not op.startswith(("ld.param", "ret", "mov.u32")):
            other += 1
    ffma = max(ffma, 1)
    return GpuMix(lds / ffma, lds_bytes / ffma, sts / ffma, ldg / ffma, other / ffma, "ptx")


def gpu_features(kernel: GpuKernel) -> GpuFeatures:
    """The instruction mix (SASS, else PTX) and ptxas's resources of ``kernel``."""
    mix = _sass_mix(kernel) or _ptx_mix(kernel)
    r = kernel.report
    return GpuFeatures(mix, r.registers, r.spill_bytes, kernel.shared_bytes)
