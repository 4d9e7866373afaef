"""The final check on a real GPU: skipped cleanly on every machine without one and its driver."""

from __future__ import annotations

import pytest
from aotune.analysis.workload import conv2d, matmul
from aotune.codegen.cuda_device import device_available, run_on_device
from aotune.codegen.gpu_compile import compile_gpu_kernel
from aotune.codegen.gpu_emulator import _reference, check_emulated, random_inputs
from aotune.codegen.gpu_schedule import schedule_from_config
from aotune.codegen.runner import tolerance
from aotune.constraints.gpu import build_gpu_space
from aotune.hwspecs.spec import builtin_names, load_target

PRESENT = [t for t in builtin_names("gpu") if device_available(load_target(t))[0]]


def test_no_driver_is_a_reason_not_an_error():
    ok, why = device_available(load_target("a100"))
    assert ok or why.startswith("no ")


@pytest.mark.skipif(not PRESENT, reason="no GPU of any built-in target's kind, or no driver")
@pytest.mark.parametrize(
    "workload", [matmul(257, 129, 67), conv2d(2, 16, 9, 9, 8, 3, 3, pad=1, layout="NHWC")]
)
def test_device_agrees_with_numpy_and_with_the_emulation(workload):
    hw = load_target(PRESENT[0])
    space = build_gpu_space(workload, hw)
    for cfg in space.sample(3, seed=7):
        kernel = compile_gpu_kernel(schedule_from_config(space, cfg), hw)
        inputs = random_inputs(kernel.schedule, 3)
        ref = _reference(kernel.schedule, *inputs)
        measured = run_on_device(kernel, inputs, ref, tolerance(inputs[0], inputs[1],
                                                                kernel.schedule.K))  # fmt: skip
        assert measured.correct and measured.seconds > 0
        assert check_emulated(kernel, inputs=inputs, reference=ref).correct
