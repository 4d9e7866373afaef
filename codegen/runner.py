"""Final check on the host: JIT the kernel, run it on numpy arrays across threads, compare, time.

ctypes releases the GIL during the foreign call, so Python threads give real parallelism; each
thread gets its own packing workspace and its own slice of the parallel loop.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import llvmlite.binding as llvm
import numpy as np

from aotune.codegen.compile import _LLVM_LOCK, Kernel, optimize, target_machine
from aotune.errors import FinalCheckError
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import HwSpec

_SIG = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2))
_POOL: ThreadPoolExecutor | None = None


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < n:  # noqa: SLF001 - grow the shared pool when needed
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="aotune")
    return _POOL


def _aligned(n: int, align: int = 64) -> np.ndarray:
    raw = np.zeros(n + align // 4, dtype=np.float32)
    offset = (-raw.ctypes.data % align) // 4
    return raw[offset:offset + n]


@dataclass(frozen=True)
class Measurement:
    """Median seconds over ``runs`` timed runs (after warm-up), spread, and correctness."""

    seconds: float
    runs: int
    spread: float  # (max - min) / median of the timed runs
    correct: bool
    max_abs_error: float
    tolerance: float


class HostKernel:
    """A kernel JIT-compiled for this machine, callable on numpy arrays."""

    def __init__(self, kernel: Kernel, hw: HwSpec) -> None:
        ok, why = host_can_run(hw)
        if not ok:
            raise FinalCheckError(f"final check skipped: {why}; the kernel was generated but cannot run here")
        self.kernel, self.hw = kernel, hw
        s = kernel.schedule
        with _LLVM_LOCK:
            tm = target_machine(hw, jit=True)
            mod = optimize(kernel.llvm_ir, tm)
            self._engine = llvm.create_mcjit_compiler(mod, tm)
            self._engine.finalize_object()
            self._fn = _SIG(self._engine.get_function_address(kernel.entry))
        ranges = kernel.launch
        self._ranges = ranges
        self._ws = [(_aligned(s.pack_a_elems), _aligned(s.pack_b_elems)) for _ in ranges]

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """C = A @ B for row-major float32 A (M x K) and B (K x N)."""
        s = self.kernel.schedule
        a = np.ascontiguousarray(a, dtype=np.float32)
        b = np.ascontiguousarray(b, dtype=np.float32)
        if a.shape != (s.M, s.K) or b.shape != (s.K, s.N):
            raise FinalCheckError(f"kernel was built for A {s.M}x{s.K}, B {s.K}x{s.N}; got {a.shape} and {b.shape}")
        c = out if out is not None else np.empty((s.M, s.N), dtype=np.float32)
        pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
        calls = [(pa, pb, pc, lo, hi, wa.ctypes.data, wb.ctypes.data) for (lo, hi), (wa, wb) in zip(self._ranges, self._ws)]
        if len(calls) == 1:
            self._fn(*calls[0])
        else:
            futures = [_pool(len(calls)).submit(self._fn, *args) for args in calls[1:]]
            self._fn(*calls[0])
            for f in futures:
                f.result()
        return c


def time_call(fn: Callable[[], object], min_runs: int = 5, min_seconds: float = 0.2,
              warmup_seconds: float = 0.1) -> tuple[float, int, float]:
    """Warm up, then time until at least ``min_runs`` runs and ``min_seconds``: (median, runs, spread).

    The warm-up runs for a fixed time, not a fixed count: after compilation the core is often at a
    low clock, and a single warm-up call of a short kernel leaves it there (seen: 62 vs 109 GFLOP/s
    for the same kernel).
    """
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < warmup_seconds:
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or (time.perf_counter() - start < min_seconds and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return med, len(times), (max(times) - min(times)) / med if med > 0 else 0.0


def random_operands(M: int, N: int, K: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Reproducible inputs in [-1, 1)."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32))


def tolerance(a: np.ndarray, b: np.ndarray, K: int) -> float:
    """fp32 accumulation error bound scaled by the reduction length."""
    scale = float(np.abs(a).max(initial=0.0) * np.abs(b).max(initial=0.0))
    return 2.0 * K * float(np.finfo(np.float32).eps) * max(scale, 1e-30)


def check_against_numpy(hk: HostKernel, a: np.ndarray, b: np.ndarray) -> tuple[bool, float, float]:
    """(correct, max |error|, tolerance) of the kernel against a float64 numpy reference."""
    ref = a.astype(np.float64) @ b.astype(np.float64)
    got = hk(a, b)
    err = float(np.abs(got - ref).max(initial=0.0))
    tol = tolerance(a, b, a.shape[1])
    return bool(np.isfinite(got).all() and err <= tol), err, tol


def final_check(kernel: Kernel, hw: HwSpec, a: np.ndarray, b: np.ndarray, min_runs: int = 5,
                min_seconds: float = 0.2) -> Measurement:
    """Run on the host, compare with numpy, time with warm-up and a median of >= ``min_runs`` runs."""
    hk = HostKernel(kernel, hw)
    correct, err, tol = check_against_numpy(hk, a, b)
    out = np.empty((kernel.schedule.M, kernel.schedule.N), dtype=np.float32)
    med, runs, spread = time_call(lambda: hk(a, b, out), min_runs, min_seconds)
    return Measurement(med, runs, spread, correct, err, tol)


def time_numpy(a: np.ndarray, b: np.ndarray, min_runs: int = 5, min_seconds: float = 0.2) -> float:
    """numpy's median seconds for a @ b, timed the same way."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)
    med, _, _ = time_call(lambda: np.matmul(a, b, out=out), min_runs, min_seconds)
    return med
