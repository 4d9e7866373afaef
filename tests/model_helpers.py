"""Helpers the model tests share: a schedule from a config string, and the model's price of it
from its compiled object code (as the search ranks)."""

from __future__ import annotations

import functools

from aotune.analysis.features import kernel_features
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import matmul
from aotune.codegen.compile import compile_kernel
from aotune.codegen.schedule import CpuSchedule, schedule_from_config
from aotune.constraints.cpu import CpuSpace, build_cpu_space
from aotune.hwspecs.spec import HwSpec


@functools.cache
def matmul_space(hw: HwSpec, shape: tuple[int, int, int]) -> CpuSpace:
    """The CPU space of an M x N x K matmul on ``hw``, built once per (spec, shape)."""
    return build_cpu_space(matmul(*shape), hw)


def matmul_schedule(hw: HwSpec, text: str, shape: tuple[int, int, int]) -> CpuSchedule:
    """The schedule of config ``text`` in the matmul space of ``shape``."""
    space = matmul_space(hw, shape)
    return schedule_from_config(space, space.parse_config(text))


def predicted_ms(hw: HwSpec, s: CpuSchedule) -> float:
    """The model's price of ``s`` in ms, from its compiled kernel's loop features."""
    loop = kernel_features(compile_kernel(s, hw), hw.isa.arch).loop
    (p,) = AnalyticalCpuModel(hw).predict_batch([s], [loop])
    return p.seconds * 1e3
