"""The final check on a real NVIDIA GPU through cuda-python: load the cubin, launch it on the same
inputs the emulation used, compare with numpy, time with CUDA events.

Roadmap: shares everything with the emulated check (schedule, cubin, launch, inputs, reference)
except the launch itself; cuBLAS through cupy as a baseline where cupy is installed. Nothing here
runs on a machine without a driver: ``device_available`` says why, and the caller skips.

The kernels run in the device's primary context, retained once per process as the CUDA runtime
does: creating a context per kernel costs a tenth of a second or more, and cuCtxCreate's
signature changed between cuda-bindings 12 and 13 while the primary-context calls did not.
"""

from __future__ import annotations

import importlib.util
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aotune.codegen.executions import count_execution
from aotune.errors import FinalCheckError

_CONTEXTS: dict[int, Any] = {}  # sm -> the primary context of its first device
_CONTEXT_LOCK = threading.Lock()


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


def _matching_device(drv: Any, sm: int) -> tuple[int | None, int]:
    """(ordinal of the first device of compute capability ``sm`` or None, number of devices)."""
    count = _check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    attr = drv.CUdevice_attribute
    for i in range(count):
        dev = _check(drv.cuDeviceGet(i), "cuDeviceGet")
        major = _check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc"
        )
        minor = _check(
            drv.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc"
        )
        if major * 10 + minor == sm:
            return i, count
    return None, count


def _find_device(hw: Any) -> tuple[int | None, str]:
    """(ordinal of the first GPU of ``hw``'s compute capability, "") or (None, why there is
    none)."""
    drv = _driver()
    if drv is None:
        return None, "no GPU: cuda-python is not installed (pip install 'aotune[gpu]')"
    try:
        (err,) = drv.cuInit(0)
    except (RuntimeError, OSError) as e:  # no libcuda.so: no driver on this machine
        return None, f"no GPU: the CUDA driver cannot be loaded ({e})"
    if int(err) != 0:
        return None, f"no GPU: the CUDA driver is not usable here ({err})"
    ordinal, count = _matching_device(drv, hw.arch.sm)
    if ordinal is None:
        return None, f"no {hw.sm_name} GPU here ({count} other CUDA device(s))"
    return ordinal, ""


def device_available(hw: Any) -> tuple[bool, str]:
    """(True, "") when a GPU of ``hw``'s compute capability and its driver are here."""
    ordinal, why = _find_device(hw)
    return ordinal is not None, why


def device_context(hw: Any) -> tuple[Any, Any]:
    """(driver, context) for the first GPU of ``hw``'s compute capability: its primary context,
    retained once per process (the devices are looked up then, not on every call) and made
    current on the calling thread."""
    drv = _driver()
    with _CONTEXT_LOCK:
        ctx = _CONTEXTS.get(hw.arch.sm)
        if ctx is None:
            ordinal, why = _find_device(hw)
            if ordinal is None:
                raise FinalCheckError(why)
            dev = _check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
            ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "PrimaryCtxRetain")
            _CONTEXTS[hw.arch.sm] = ctx
    _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return drv, ctx


def device_name(hw: Any) -> str:
    """The name the driver gives the GPU that ``hw``'s kernels run on."""
    drv, _ = device_context(hw)
    dev = _check(drv.cuCtxGetDevice(), "cuCtxGetDevice")
    raw = _check(drv.cuDeviceGetName(64, dev), "cuDeviceGetName")
    return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")


@dataclass(frozen=True)
class DeviceMeasurement:
    """A kernel run on the GPU: median seconds over CUDA-event-timed runs, and correctness."""

    seconds: float
    runs: int
    spread: float
    correct: bool
    max_abs_error: float
    tolerance: float = 0.0


def timed_launches(
    drv: Any, launch_once: Callable[[], None], runs: int, budget_seconds: float
) -> list[float]:
    """Seconds of each of up to ``runs`` launches, each between two CUDA events, stopping once
    ``budget_seconds`` of device time is spent (3 launches at least)."""
    start, stop = (_check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2))
    times: list[float] = []
    try:
        while len(times) < runs and (len(times) < 3 or sum(times) < budget_seconds):
            _check(drv.cuEventRecord(start, 0), "cuEventRecord")
            launch_once()
            _check(drv.cuEventRecord(stop, 0), "cuEventRecord")
            _check(drv.cuEventSynchronize(stop), "cuEventSynchronize")
            times.append(_check(drv.cuEventElapsedTime(start, stop), "elapsed") / 1e3)
    finally:
        drv.cuEventDestroy(start)
        drv.cuEventDestroy(stop)
    return times


def run_on_device(
    kernel: Any,
    inputs: tuple[np.ndarray, np.ndarray, np.ndarray | None],
    reference: np.ndarray,
    tol: float,
    runs: int = 10,
    budget_seconds: float = 1.0,
) -> DeviceMeasurement:
    """Launch ``kernel`` (a GpuKernel) on a GPU of its target with ``inputs``; compare every
    output with ``reference`` (C starts as NaN, so an element no thread wrote fails), then time
    up to ``runs`` launches within ``budget_seconds`` (at least 3)."""
    drv, _ = device_context(kernel.hw)
    module = _check(drv.cuModuleLoadData(kernel.cubin), "cuModuleLoadData")
    ptrs: list[Any] = []
    try:
        fn = _check(drv.cuModuleGetFunction(module, kernel.entry.encode()), "cuModuleGetFunction")
        launch = kernel.launch
        if launch.dynamic_shared_bytes:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(drv.cuFuncSetAttribute(fn, attr, launch.dynamic_shared_bytes), "opt-in")
        a, b, bias = inputs
        out = np.full(kernel.schedule.shapes[2], np.nan, np.float32)
        host = [a, b, out, bias if bias is not None else np.zeros(1, np.float32)]
        for arr in host:
            arr = np.ascontiguousarray(arr, dtype=np.float32)
            p = _check(drv.cuMemAlloc(max(4, arr.nbytes)), "cuMemAlloc")
            ptrs.append(p)
            _check(drv.cuMemcpyHtoD(p, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")
        params = np.array([int(p) for p in ptrs], dtype=np.uint64)
        args = np.array([params[i : i + 1].ctypes.data for i in range(4)], dtype=np.uint64)

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
        with np.errstate(invalid="ignore"):
            err = float(np.abs(out.astype(np.float64) - reference).max(initial=0.0))
        correct = bool(np.isfinite(out).all() and err <= tol)
        times = timed_launches(drv, launch_once, runs, budget_seconds)
    finally:
        for p in ptrs:
            drv.cuMemFree(p)
        drv.cuModuleUnload(module)
    med = statistics.median(times)
    return DeviceMeasurement(med, len(times), (max(times) - min(times)) / med, correct, err, tol)


def cublas_sgemm_seconds(
    hw: Any, m: int, n: int, k: int, runs: int = 10, budget_seconds: float = 1.0
) -> float | None:
    """Median seconds of cuBLAS's FP32 SGEMM (no TF32) of the same size through cupy, on the same
    device; None where cupy is not installed."""
    if importlib.util.find_spec("cupy") is None:
        return None
    import cupy as cp

    drv, _ = device_context(hw)
    rng = cp.random.default_rng(0)
    a = rng.random((m, k), dtype=cp.float32)
    b = rng.random((k, n), dtype=cp.float32)
    c = cp.matmul(a, b)  # warm-up: handle creation and the heuristic's choice
    cp.cuda.Device().synchronize()
    # cupy launches on the legacy default stream, the one timed_launches records its events on
    times = timed_launches(drv, lambda: cp.matmul(a, b, out=c), runs, budget_seconds)
    return statistics.median(times)
