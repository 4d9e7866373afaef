"""Final check on the host: JIT the kernel, run it on numpy arrays across threads, compare, time.

Each thread gets its own packing workspace and its own slice of the parallel loop; the slices run
on native worker threads (``workers.py``) that hand work over without waking a sleeping thread.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.binding as llvm
import numpy as np
from aotune.analysis.features import x86_features_used
from aotune.analysis.workload import ConvParams, Workload
from aotune.codegen.compile import _LLVM_LOCK, Kernel, optimize, target_machine
from aotune.codegen.executions import count_execution
from aotune.codegen.launch import launch_plan, page_rounded
from aotune.codegen.schedule import CpuSchedule
from aotune.codegen.workers import workers
from aotune.errors import FinalCheckError
from aotune.hwspecs.host import available_memory_bytes, detect_host, host_can_run
from aotune.hwspecs.spec import HwSpec
from numpy.lib.stride_tricks import sliding_window_view

_SIG = ctypes.CFUNCTYPE(
    None, *([ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 2)
)


# Operands of a page or more start on a page boundary, so every measurement sees one placement:
# the one the model assumes (large buffers at one offset within a page, as an allocator's mmap
# gives them). At 64 bytes, where the allocator put B one line before C, each call's C stores
# matched the next call's B loads in the page-offset bits, and a 7 x 16 tile at N = 1024 ran
# 2.1x slower than with both at one offset (README, "Operand placement").
PAGE_BYTES = mmap.PAGESIZE


def _aligned(shape: int | tuple[int, ...], align: int | None = None) -> np.ndarray:
    """Zeros of ``shape`` (float32, C order) starting on an ``align``-byte boundary (default: a
    page for arrays of a page or more, a cache line for smaller ones)."""
    n = math.prod(shape) if isinstance(shape, tuple) else shape
    if align is None:
        align = PAGE_BYTES if n * 4 >= PAGE_BYTES else 64
    raw = np.zeros(n + align // 4, dtype=np.float32)
    offset = (-raw.ctypes.data % align) // 4
    return raw[offset : offset + n].reshape(shape)


def own_pages(elems: int, page_bytes: int) -> np.ndarray:
    """Zeros of ``elems`` float32 on whole pages of their own (page-aligned, the size rounded up
    to pages, ``page_rounded``)."""
    return _aligned(page_rounded(elems, page_bytes), page_bytes)[:elems]


def aligned_copy(x: np.ndarray, align: int | None = None) -> np.ndarray:
    """``x`` as a C-contiguous float32 array whose data starts on an ``align``-byte boundary
    (default: ``_aligned``'s, a page for a page or more, else a cache line).

    numpy only promises 16 bytes, so a large array's rows usually start 16 bytes into a cache
    line and every tile row straddles one more line than it needs; how much that costs depends on
    the tile. Measured inputs are at least cache-line aligned, as the model assumes (and as a
    tuned program's allocator gives: PyTorch aligns CPU tensors to 64 bytes).
    """
    out = _aligned(x.shape, align)
    out[...] = x
    return out


@dataclass(frozen=True)
class Measurement:
    """Seconds (the median of the fastest of several interleaved rounds of >= 5 runs, each after a
    warm-up), the runs timed in all, their spread, and correctness."""

    seconds: float
    runs: int
    spread: float  # (max - min) of all timed runs / seconds
    correct: bool
    max_abs_error: float
    tolerance: float


def _address(x: np.ndarray) -> int:
    """Where a C-contiguous array's data starts: through ctypes' buffer view (about 0.5 us), or
    numpy's ``.ctypes.data`` (about 1 us) for a read-only array, which that view refuses."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(x))
    except (TypeError, ValueError):  # read-only; or empty, which no kernel is called on
        return int(x.ctypes.data)


def _checked_out(out: object, shape: tuple[int, ...], inputs: tuple[np.ndarray, ...]) -> int:
    """Where ``out``'s data starts, if the kernel can write its result there: a writeable,
    C-contiguous float32 array of ``shape``, apart from the inputs; a FinalCheckError naming what
    is wrong otherwise (the kernel writes through a raw pointer: a wrong buffer would be corrupted
    or silently wrong)."""
    if not isinstance(out, np.ndarray):
        raise FinalCheckError(f"out must be a numpy array, got {type(out).__name__}")
    if out.dtype != np.float32:
        raise FinalCheckError(f"out must be float32, got {out.dtype}; allocate it as float32")
    if out.shape != shape:
        raise FinalCheckError(f"out must have shape {shape}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise FinalCheckError("out must be C-contiguous; pass np.ascontiguousarray(out) or None")
    if not out.flags.writeable:
        raise FinalCheckError("out is read-only; pass a writeable array")
    address = _address(out)
    if address % out.itemsize:
        raise FinalCheckError("out is not aligned to its 4-byte elements; allocate it with numpy")
    if any(np.may_share_memory(out, x) for x in inputs):
        raise FinalCheckError("out overlaps an input; the kernel needs a separate output buffer")
    return address


def _features_lacking(kernel: Kernel) -> str:
    """The x86 features ``kernel``'s machine code needs and this host lacks, each with an
    instruction that needs it ('' when none, or not x86): run, it would die of SIGILL."""
    if kernel.hw.isa.arch != "x86_64":
        return ""
    host = detect_host()
    have = {f[1:] for f in host.isa.llvm_features.split(",") if f.startswith("+")}
    used = x86_features_used(kernel.object_code)
    return "; ".join(f"{f} ({insn})" for f, insn in used.items() if f not in have)


class HostKernel:
    """A kernel JIT-compiled for this machine, callable on numpy arrays."""

    def __init__(self, kernel: Kernel, hw: HwSpec) -> None:
        ok, why = host_can_run(hw)
        if not ok:
            raise FinalCheckError(
                f"final check skipped: {why}; the kernel was generated but cannot run here"
            )
        lacking = _features_lacking(kernel)
        if lacking:
            raise FinalCheckError(
                f"cannot run the kernel here: for target {hw.name} it uses {lacking}, which this "
                f"CPU lacks (the spec's llvm_cpu '{hw.isa.llvm_cpu}' implies more than its "
                "llvm_features say); give the spec this CPU's llvm_cpu "
                f"('{detect_host().isa.llvm_cpu}'), or use --target host"
            )
        self.kernel, self.hw = kernel, hw
        s = kernel.schedule
        with _LLVM_LOCK:
            tm = target_machine(hw, jit=True)
            mod = optimize(kernel.llvm_ir, tm)
            self._engine = llvm.create_mcjit_compiler(mod, tm)
            self._engine.finalize_object()
            self._addr = self._engine.get_function_address(kernel.entry)
            self._pad_addr = (
                self._engine.get_function_address(f"{kernel.entry}_pad") if s.pad_copy else 0
            )
            self._callable = {addr: _SIG(addr) for addr in (self._addr, self._pad_addr) if addr}
        plan = launch_plan(s)
        self._ranges = list(plan.shares)
        page = hw.memory.page_bytes
        self._ws = [
            (own_pages(plan.ws_a_elems, page), own_pages(plan.ws_b_elems, page))
            for _ in plan.shares
        ]
        # addresses looked up once: each ``.ctypes.data`` costs about a microsecond
        self._ws_addr = [(wa.ctypes.data, wb.ctypes.data) for wa, wb in self._ws]
        # zeroed once: the padded copy's border stays zero, the pad function writes its interior
        self._padded = [own_pages(plan.pad_elems, page) for _ in range(plan.pad_buffers)]
        padded_addr = [p.ctypes.data for p in self._padded]
        self._pad_rows = plan.pad_rows  # the pad function's row table: kept alive with the kernel
        rows_addr = self._pad_rows.ctypes.data
        self._pad_shares = [(padded_addr[i], rows_addr, lo, hi) for i, lo, hi in plan.pad_shares]
        # the padded buffer each thread's kernel share reads
        self._padded_of_share = [padded_addr[i] for i in plan.padded_of_share]

    def __call__(
        self,
        a: np.ndarray,
        b: np.ndarray,
        bias: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """The contraction of row-major float32 A and B (shapes as the schedule says), plus
        epilogue."""
        s = self.kernel.schedule
        if any(isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x) for x in (a, b, bias, out)):
            raise FinalCheckError(
                "a masked array's mask cannot be honoured (every element is read); pass "
                "x.filled(0) or np.asarray(x)"
            )
        a = np.ascontiguousarray(a, dtype=np.float32)
        b = np.ascontiguousarray(b, dtype=np.float32)
        a_shape, b_shape, c_shape = s.shapes
        if a.shape != a_shape or b.shape != b_shape:
            raise FinalCheckError(
                f"kernel was built for A {a_shape}, B {b_shape}; got {a.shape} and {b.shape}"
            )
        if s.bias:
            if bias is None or bias.shape != (c_shape[-1],):
                raise FinalCheckError(
                    f"kernel adds a bias of shape ({c_shape[-1]},); got "
                    f"{None if bias is None else bias.shape}"
                )
            bias = np.ascontiguousarray(bias, dtype=np.float32)
        if out is None:
            c = _aligned(c_shape)
            pc = _address(c)
        else:
            c, pc = out, _checked_out(out, c_shape, (a, b))
        pa, pb = _address(a), _address(b)
        pbias = _address(bias) if s.bias else 0  # checked above: present when the kernel adds it
        operands = [(pa, pb)] * len(self._ranges)
        if (
            s.pad_copy is not None
        ):  # the shares are set in __init__ exactly when there is a padded copy
            src = pa if s.pad_copy.operand == "a" else pb
            self._run(
                self._pad_addr,
                [(src, dst, rows, 0, lo, hi, 0, 0) for dst, rows, lo, hi in self._pad_shares],
            )
            operands = [
                (padded, pb) if s.pad_copy.operand == "a" else (pa, padded)
                for padded in self._padded_of_share
            ]
        self._run(
            self._addr,
            [
                (opa, opb, pc, pbias, lo, hi, wa, wb)
                for (opa, opb), (lo, hi), (wa, wb) in zip(operands, self._ranges, self._ws_addr)
            ],
        )
        return c

    def call_on(
        self,
        a: np.ndarray,
        b: np.ndarray,
        bias: np.ndarray | None = None,
        out: np.ndarray | None = None,
    ) -> Callable[[], np.ndarray]:
        """A no-argument call of this kernel on fixed inputs, for timing: the output buffer (a
        fresh one, page-aligned when a page or more, unless given) is allocated once, not on
        every call."""
        c = out if out is not None else _aligned(self.kernel.schedule.shapes[2])
        return lambda: self(a, b, bias, c)

    def _run(self, addr: int, shares: list[tuple[int, ...]]) -> None:
        """Call a function of the entry's signature once per share: here, or on the worker
        threads."""
        count_execution("host kernel")
        if len(shares) == 1:
            self._callable[addr](*shares[0])
        else:
            workers().run(addr, shares)


def _timed_runs(
    fn: Callable[[], object], min_runs: int, min_seconds: float, warmup_seconds: float
) -> list[float]:
    """Warm up for ``warmup_seconds``, then the seconds of each run until at least ``min_runs`` runs
    and ``min_seconds`` (at most 200 runs).

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
    return times


def _summary(times: list[float], seconds: float) -> tuple[float, int, float]:
    return seconds, len(times), (max(times) - min(times)) / seconds if seconds > 0 else 0.0


MIN_TIMED_RUNS = 5  # timed runs of each function per round, at least

# Each round warms up for longer than a BLAS library keeps its threads spinning after its last
# call (OpenBLAS: ~2^28 cycles, under 0.1 s), so a function never runs against the previous one's
# spinners (seen: our 2-thread 512^3 at 97 GFLOP/s right after numpy, 195 alone).
SWITCH_WARMUP_SECONDS = 0.15


def time_side_by_side(
    fns: list[Callable[[], object]],
    min_runs: int = MIN_TIMED_RUNS,
    min_seconds: float = 0.2,
    rounds: int = 3,
    warmup_seconds: float = SWITCH_WARMUP_SECONDS,
) -> list[tuple[float, int, float]]:
    """Time several functions in interleaved rounds, each round a warm-up and >= ``min_runs`` runs
    of every function; (median of its fastest round, runs, spread over all its runs) of each.

    On a shared machine the background load drifts over seconds; interleaving puts every function
    (our kernels and numpy) under the same drift, so their ratio is what it would be on a quiet
    machine rather than a comparison of two different moments. A burst of other work slows
    whatever runs during it (one config measured 41 and 118 GFLOP/s minutes apart), so each
    function keeps its fastest round: what it does when the machine lets it.
    """
    medians: list[list[float]] = [[] for _ in fns]
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            ran = _timed_runs(fn, min_runs, min_seconds / rounds, warmup_seconds)
            medians[i].append(statistics.median(ran))
            times[i] += ran
    return [_summary(t, min(m)) for t, m in zip(times, medians)]


Operands = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # A, B, bias


def random_operands(s: CpuSchedule, seed: int = 0) -> Operands:
    """Reproducible inputs in [-1, 1) for the kernel of schedule ``s``: (A, B, bias or None), each
    starting on a page (a cache line if smaller)."""
    rng = np.random.default_rng(seed)
    a_shape, b_shape, c_shape = s.shapes

    def uniform(shape: tuple[int, ...]) -> np.ndarray:
        x = _aligned(shape)  # drawn in place as float32: no float64 copy of a large input
        rng.random(out=x.reshape(-1), dtype=np.float32)
        x *= 2.0
        x -= 1.0
        return x

    return uniform(a_shape), uniform(b_shape), (uniform(c_shape[-1:]) if s.bias else None)


def final_check_bytes(w: Workload, kernels: int, threads: int) -> int:
    """Memory the final check of ``kernels`` kernels of ``w`` allocates at its peak, in bytes: the
    float32 inputs and each kernel's outputs, numpy's float64 reference with its error arrays,
    a convolution reference's gathered windows, and the zero-padded copies of a padded input."""
    x, wt = (w.tensor(a.tensor) for a in w.statement.inputs)
    out = w.tensor(w.statement.output.tensor)
    ins, outs = math.prod(x.shape) + math.prod(wt.shape), math.prod(out.shape)
    total = 4 * ins + 4 * outs * (kernels + 2) + 8 * (ins + 3 * outs)
    if w.conv is not None:
        extent = {lp.name: lp.extent for lp in w.loops}
        pixels = extent["n"] * extent["oh"] * extent["ow"]
        taps = extent["c"] * extent["r"] * extent["s"]  # per group: the reference loops over them
        total += 12 * pixels * taps  # the windows, copied as float64 and float32
        if w.conv.pad:
            pad, sizes = w.conv.pad, x.shape
            h, wd = (sizes[2], sizes[3]) if w.conv.layout == "NCHW" else (sizes[1], sizes[2])
            padded = math.prod(sizes) // (h * wd) * (h + 2 * pad) * (wd + 2 * pad)
            total += 4 * padded * max(1, threads) * kernels
    return total


def check_final_check_memory(w: Workload, kernels: int, threads: int) -> None:
    """Refuse, in one line, a final check that would not fit in the memory available now."""
    need = final_check_bytes(w, kernels, threads)
    have = available_memory_bytes()
    if have is not None and need > 0.9 * have:
        raise FinalCheckError(
            f"the final check of {w.op} {'x'.join(str(v) for _, v in w.shape)} needs about "
            f"{need / 2**30:.1f} GiB (inputs, outputs and numpy's float64 reference), and "
            f"{have / 2**30:.1f} GiB is available; pass --no-verify to get the kernel without "
            "running it here"
        )


def tolerance(a: np.ndarray, b: np.ndarray, K: int, ref: np.ndarray | None = None) -> float:
    """fp32 accumulation error bound scaled by the reduction length (plus epilogue rounding)."""
    scale = float(np.abs(a).max(initial=0.0) * np.abs(b).max(initial=0.0))
    tol = 2.0 * K * float(np.finfo(np.float32).eps) * max(scale, 1e-30)
    if ref is not None:  # bias add and activation: a few roundings of the result, slopes <= 1.13
        tol = 1.2 * tol + 8 * float(np.finfo(np.float32).eps) * float(np.abs(ref).max(initial=0.0))
    return tol


def apply_activation(x: np.ndarray, activation: str) -> np.ndarray:
    """The epilogue activations in numpy (the same formulas the kernel uses)."""
    if activation == "relu":
        return np.maximum(x, 0)
    if activation == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if activation == "gelu":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return x


def conv2d_reference(x: np.ndarray, wt: np.ndarray, p: ConvParams) -> np.ndarray:
    """A 2-D convolution by explicit sliding windows and one tensordot per group.

    Written independently of the kernel's GEMM view: pad with zeros, take every (dilated) window,
    step by the stride, contract channels and taps with the group's filters.
    """
    if p.layout == "NHWC":
        x, wt = x.transpose(0, 3, 1, 2), wt.transpose(3, 2, 0, 1)  # -> NCHW and (K, C/groups, R, S)
    n, c, _, _ = x.shape
    k, cg, r, s = wt.shape
    g, kg = p.groups, k // p.groups
    xp = np.pad(x, ((0, 0), (0, 0), (p.pad, p.pad), (p.pad, p.pad)))
    span_r, span_s = p.dilation * (r - 1) + 1, p.dilation * (s - 1) + 1
    win = sliding_window_view(xp, (span_r, span_s), axis=(2, 3))[
        :, :, :: p.stride, :: p.stride, :: p.dilation, :: p.dilation
    ]
    oh, ow = win.shape[2], win.shape[3]
    y = np.empty((n, k, oh, ow), dtype=np.result_type(x, wt))
    for gi in range(g):  # window (n, c, oh, ow, r, s) x filters (k, c, r, s) -> (n, oh, ow, k)
        part = np.tensordot(
            win[:, gi * cg : (gi + 1) * cg],
            wt[gi * kg : (gi + 1) * kg],
            axes=([1, 4, 5], [1, 2, 3]),
        )
        y[:, gi * kg : (gi + 1) * kg] = part.transpose(0, 3, 1, 2)
    return y.transpose(0, 2, 3, 1) if p.layout == "NHWC" else y


def _contract(s: CpuSchedule, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The schedule's contraction of A and B in numpy, in their dtype."""
    if s.conv is not None:
        x, wt = (a, b) if s.a_is_first else (b, a)
        return conv2d_reference(x, wt, s.conv)
    return np.einsum(s.reference, a, b, optimize=True)


def numpy_reference(
    s: CpuSchedule, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, dtype: type = np.float64
) -> np.ndarray:
    """What the kernel must compute, by numpy (float64 for checking, float32 for timing)."""
    out = _contract(s, a.astype(dtype, copy=False), b.astype(dtype, copy=False))
    if s.bias and bias is not None:
        out = out + bias.astype(dtype, copy=False)
    return apply_activation(out, s.activation)


def check_against_numpy(
    hk: HostKernel, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None
) -> tuple[bool, float, float]:
    """(correct, max |error|, tolerance) of the kernel against a float64 numpy reference."""
    s = hk.kernel.schedule
    with np.errstate(over="ignore"):
        ref = numpy_reference(s, a, b, bias)
    got = hk(a, b, bias)
    err = float(np.abs(got - ref).max(initial=0.0))
    tol = tolerance(a, b, s.K, ref if s.has_epilogue else None)
    return bool(np.isfinite(got).all() and err <= tol), err, tol


def final_check(
    kernel: Kernel,
    hw: HwSpec,
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    min_runs: int = MIN_TIMED_RUNS,
    min_seconds: float = 0.2,
    warmup_seconds: float = 0.1,
) -> Measurement:
    """Run on the host, compare with numpy, time with warm-up and a median of >= ``min_runs``
    runs."""
    return final_check_side_by_side(
        [kernel],
        hw,
        a,
        b,
        bias,
        min_runs,
        min_seconds,
        with_numpy=False,
        warmup_seconds=warmup_seconds,
    )[0][0]


# Rounds of a final check against numpy. On a 2-vCPU cloud slice both vCPUs sometimes share one
# physical core for 0.5-3 s at a time, and a 2-thread kernel then runs at ~1.1x one thread (seen:
# 100-110 GFLOP/s in such spells, 165-183 between them); each function keeps its fastest round,
# so its rounds must span more than a spell (3 rounds, ~3 s, left a 384x1024x4096 pick at 131
# GFLOP/s in three bench runs where it ran at 188-203 outside the spells).
FINAL_CHECK_ROUNDS = 8


def final_check_side_by_side(
    kernels: list[Kernel],
    hw: HwSpec,
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    min_runs: int = MIN_TIMED_RUNS,
    min_seconds: float = 0.2,
    with_numpy: bool = True,
    warmup_seconds: float = SWITCH_WARMUP_SECONDS,
) -> tuple[list[Measurement], float | None]:
    """Check each kernel against numpy, then time them all, and numpy's baseline for the same
    computation, in interleaved rounds: (one measurement per kernel, numpy's median seconds)."""
    fns: list[Callable[[], object]] = []
    checks = []
    for kernel in kernels:
        hk = HostKernel(kernel, hw)
        checks.append(check_against_numpy(hk, a, b, bias))
        fns.append(hk.call_on(a, b, bias))
    if with_numpy:
        fns.append(numpy_baseline(kernels[0].schedule, a, b, bias))
    timed = time_side_by_side(
        fns,
        min_runs,
        min_seconds,
        rounds=FINAL_CHECK_ROUNDS if with_numpy else 1,
        warmup_seconds=warmup_seconds,
    )
    measured = [
        Measurement(med, runs, spread, correct, err, tol)
        for (med, runs, spread), (correct, err, tol) in zip(timed, checks)
    ]
    return measured, (timed[-1][0] if with_numpy else None)


def numpy_baseline(
    s: CpuSchedule, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None
) -> Callable[[], object]:
    """The fastest plain-numpy float32 way to compute what the kernel computes (BLAS where it
    applies)."""
    plain = False
    if s.conv is None:
        ins, out_sub = s.reference.split("->")
        a_sub, b_sub = ins.split(",")
        # C[..., m, n] = A[..., m, k] @ B[..., k, n]: np.matmul (BLAS), batched over leading
        # indices; vector and scalar outputs (ij,j->i, i,i->) go through einsum
        lead = out_sub[:-2]
        plain = (
            len(out_sub) >= 2
            and bool(a_sub)
            and a_sub == lead + out_sub[-2] + a_sub[-1]
            and b_sub == lead + a_sub[-1] + out_sub[-1]
        )
    out = _aligned(s.shapes[2])

    def contraction() -> np.ndarray:
        if plain:
            return np.matmul(a, b, out=out)
        return _contract(s, a, b)

    if not s.has_epilogue:
        return contraction

    def with_epilogue() -> np.ndarray:
        r = contraction()
        if bias is not None:
            r += bias
        return apply_activation(r, s.activation)

    return with_epilogue
