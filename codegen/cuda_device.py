"""The final check on a real NVIDIA GPU through cuda-python: load the cubin, launch it on the same
inputs the emulation used, compare with numpy, time with CUDA events.

Roadmap: shares everything with the emulated check (schedule, cubin, launch, inputs, reference)
except the launch itself; cuBLAS through cupy as a baseline where cupy is installed. Nothing here
runs on a machine without a driver: ``device_available`` says why, and the caller skips.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
from aotune.codegen.executions import count_execution
from aotune.errors import FinalCheckError


def _driver() -> Any:
    try:
        from cuda.bindings import driver  # cuda-bindings >= 12.6
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python
        except ImportError:
            return None
    return driver


def _check(result: tuple, what: str) -> Any:
    err, *rest = result
    if int(err) != 0:
        raise FinalCheckError(f"CUDA driver call {what} failed: {err}")
    return rest[0] if len(rest) == 1 else rest


def device_available(hw: Any) -> tuple[bool, str]:
    """(True, "") when a GPU of ``hw``'s compute capability and its driver are here."""
    drv = _driver()
    if drv is None:
        return False, "no GPU: cuda-python is not installed (pip install 'aotune[gpu]')"
    try:
        (err,) = drv.cuInit(0)
    except (RuntimeError, OSError) as e:  # no libcuda.so: no driver on this machine
        return False, f"no GPU: the CUDA driver cannot be loaded ({e})"
    if int(err) != 0:
        return False, f"no GPU: the CUDA driver is not usable here ({err})"
    count = _check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    for i in range(count):
        dev = _check(drv.cuDeviceGet(i), "cuDeviceGet")
        attr = drv.CUdevice_attribute
        major = _check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc"
        )
        minor = _check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc"
        )
        if major * 10 + minor == hw.arch.sm:
            return True, ""
    return False, f"no {hw.sm_name} GPU here ({count} other CUDA device(s))"


@dataclass(frozen=True)
class DeviceMeasurement:
    """A kernel run on the GPU: median seconds over CUDA-event-timed runs, and correctness."""

    seconds: float
    runs: int
    spread: float
    correct: bool
    max_abs_error: float


def run_on_device(
    kernel: Any,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    reference: np.ndarray,
    tol: float,
    runs: int = 10,
) -> DeviceMeasurement:
    """Launch ``kernel`` (a GpuKernel) on device 0 with ``inputs``; compare and time it."""
    drv = _driver()
    if drv is None:
        raise FinalCheckError("cuda-python is not installed; pip install 'aotune[gpu]'")
    ok, why = device_available(kernel.hw)
    if not ok:
        raise FinalCheckError(why)
    dev = _check(drv.cuDeviceGet(0), "cuDeviceGet")
    ctx = _check(drv.cuCtxCreate(0, dev), "cuCtxCreate")
    try:
        module = _check(drv.cuModuleLoadData(kernel.cubin), "cuModuleLoadData")
        fn = _check(drv.cuModuleGetFunction(module, kernel.entry.encode()), "cuModuleGetFunction")
        launch = kernel.launch
        if launch.dynamic_shared_bytes:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(drv.cuFuncSetAttribute(fn, attr, launch.dynamic_shared_bytes), "opt-in")
        a, b, bias = inputs
        out = np.zeros(kernel.schedule.shapes[2], np.float32)
        host = [a, b, out, bias if bias is not None else np.zeros(1, np.float32)]
        ptrs = []
        for arr in host:
            p = _check(drv.cuMemAlloc(max(4, arr.nbytes)), "cuMemAlloc")
            _check(drv.cuMemcpyHtoD(p, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")
            ptrs.append(p)
        params = np.array([int(p) for p in ptrs], dtype=np.uint64)
        args = np.array([params[i : i + 1].ctypes.data for i in range(4)], dtype=np.uint64)
        start, stop = (_check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))

        def launch_once() -> None:
            count_execution("GPU kernel on the device")
            _check(
                drv.cuLaunchKernel(fn, *launch.grid, *launch.block, launch.dynamic_shared_bytes,
                                   0, args.ctypes.data, 0),
                "cuLaunchKernel",
            )  # fmt: skip

        launch_once()
        _check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
        _check(drv.cuMemcpyDtoH(out.ctypes.data, ptrs[2], out.nbytes), "cuMemcpyDtoH")
        err = float(np.abs(out.astype(np.float64) - reference).max(initial=0.0))
        times = []
        for _ in range(runs):
            _check(drv.cuEventRecord(start, 0), "cuEventRecord")
            launch_once()
            _check(drv.cuEventRecord(stop, 0), "cuEventRecord")
            _check(drv.cuEventSynchronize(stop), "cuEventSynchronize")
            times.append(_check(drv.cuEventElapsedTime(start, stop), "elapsed") / 1e3)
        for p in ptrs:
            drv.cuMemFree(p)
        med = statistics.median(times)
        return DeviceMeasurement(
            med, runs, (max(times) - min(times)) / med, bool(np.isfinite(out).all() and err <= tol),
            err,
        )  # fmt: skip
    finally:
        drv.cuCtxDestroy(ctx)
