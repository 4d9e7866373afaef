"""GpuSchedule -> GpuKernel: LLVM IR with NVVM intrinsics -> llvmlite's NVPTX backend -> PTX for
the target's sm and PTX ISA version -> ptxas -> cubin, ptxas's resource report and the SASS.

``compile_gpu_kernels`` compiles a tier-2 shortlist: LLVM in this process (one module at a time,
under LLVM's lock) while ptxas assembles the previous kernel in its own process, then one
disassembly of them all (nvdisasm's start-up is most of the cost of one kernel's SASS).

Roadmap: the host module (the emulation of the same per-thread body) is generated beside the
device one and compiled only when a kernel is checked (``gpu_emulator.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import llvmlite.binding as llvm
from aotune.codegen.compile import _LLVM_LOCK, _init_llvm, optimize
from aotune.codegen.cuda_tools import (
    Disassembly,
    PtxasReport,
    assemble,
    disassemble,
    disassemble_many,
)
from aotune.codegen.gpu_schedule import GpuSchedule
from aotune.codegen.llvm_gpu import KernelEmitter
from aotune.errors import CodegenError
from aotune.hwspecs.gpu_spec import GpuSpec


@dataclass(frozen=True)
class Launch:
    """How to launch a kernel: grid, block, dynamic shared memory and the parameter order."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared_bytes: int
    parameters: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        """JSON form."""
        return {
            "entry": self.entry,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_shared_bytes": self.dynamic_shared_bytes,
            "parameters": list(self.parameters),
        }


@dataclass(frozen=True)
class GpuKernel:
    """A compiled GPU kernel: PTX, cubin, ptxas's report, SASS, launch, and its schedule."""

    target: str
    entry: str
    llvm_ir: str
    ptx: str
    cubin: bytes
    report: PtxasReport
    schedule: GpuSchedule
    launch: Launch
    hw: GpuSpec = field(repr=False, compare=False)
    disassembly: Disassembly | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def sass(self) -> Disassembly:
        """The SASS (nvdisasm): the one read with other kernels (``compile_gpu_kernels``), else
        disassembled on first use."""
        if self.disassembly is not None:
            return self.disassembly
        return disassemble(self.cubin, self.entry)

    @property
    def shared_bytes(self) -> int:
        """Shared memory of one block: static (ptxas) + dynamic, without the runtime's reserve."""
        return self.report.shared_bytes + self.launch.dynamic_shared_bytes


def nvptx_target_machine(hw: GpuSpec) -> llvm.TargetMachine:
    """LLVM's NVPTX target machine for ``hw``'s sm and PTX ISA version."""
    _init_llvm()
    try:
        target = llvm.Target.from_triple(hw.arch.triple)
    except RuntimeError as e:
        raise CodegenError(
            f"LLVM cannot target {hw.arch.triple!r} ({e}); fix arch.triple in the {hw.name} spec"
        ) from None
    with _captured_stderr() as said:
        tm = target.create_target_machine(
            cpu=hw.sm_name, features=f"+ptx{hw.arch.ptx_version}", opt=3
        )
    if "not a recognized" in said.text:
        raise CodegenError(
            f"LLVM's NVPTX backend cannot emit PTX ISA {hw.ptx_isa} or {hw.sm_name} "
            f"({said.text.strip().splitlines()[0]}); fix arch.ptx_version or arch.sm in the "
            f"{hw.name} spec"
        )
    return tm


class _Said:
    text = ""


@contextlib.contextmanager
def _captured_stderr() -> Iterator[_Said]:
    """What native code writes to file descriptor 2 meanwhile (LLVM warns there, not through
    an exception)."""
    said = _Said()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            said.text = tmp.read().decode(errors="replace")


def emit_ptx(ir_text: str, hw: GpuSpec) -> str:
    """Optimise LLVM IR and print it as PTX for ``hw``."""
    with _LLVM_LOCK:
        tm = nvptx_target_machine(hw)
        try:
            ptx = tm.emit_assembly(optimize(ir_text, tm))
        except RuntimeError as e:
            raise CodegenError(f"LLVM's NVPTX backend failed for {hw.sm_name}: {e}") from None
    if f".version {hw.ptx_isa}\n" not in ptx:
        said = next((ln for ln in ptx.splitlines() if ln.startswith(".version")), "no .version")
        raise CodegenError(
            f"LLVM emitted '{said}' for {hw.sm_name}, not PTX ISA {hw.ptx_isa} (the minimum it "
            f"allows for this sm is higher); raise arch.ptx_version in the {hw.name} spec"
        )
    return ptx


def launch_of(s: GpuSchedule, hw: GpuSpec, entry: str) -> Launch:
    """How ``s``'s kernel is launched: its grid, a 1-D block, and its shared memory as dynamic
    where it exceeds a block's static limit."""
    dynamic = s.smem_bytes > hw.shared.bytes_per_block
    return Launch(
        entry,
        s.grid,
        (s.threads, 1, 1),
        s.smem_bytes if dynamic else 0,
        ("A", "B", "C", "bias"),
    )


def compile_gpu_kernel(
    s: GpuSchedule,
    hw: GpuSpec,
    entry: str = "aotune_kernel",
    exported: Mapping[str, Sequence[int]] | None = None,
) -> GpuKernel:
    """Generate, optimise, print as PTX and assemble with ptxas (nothing runs); ``exported``
    names constant 64-bit arrays the cubin defines beside the kernel (a library's record)."""
    launch = launch_of(s, hw, entry)
    ir_text = KernelEmitter(s, entry).device_module(
        hw.arch.triple,
        dynamic_shared=launch.dynamic_shared_bytes > 0,
        max_registers=hw.limits.max_registers_per_thread,
    )
    for name, words in (exported or {}).items():
        values = ", ".join(f"i64 {int(w)}" for w in words)
        ir_text += f"\n@{name} = addrspace(1) constant [{len(words)} x i64] [{values}], align 8\n"
    ptx = emit_ptx(ir_text, hw)
    assembled = assemble(ptx, hw.arch.sm, entry)
    return GpuKernel(hw.name, entry, ir_text, ptx, assembled.cubin, assembled.report, s, launch, hw)


# LLVM runs under one lock in this process; a second thread keeps ptxas busy beside it
COMPILE_THREADS = 2


def compile_gpu_kernels(
    schedules: Sequence[GpuSchedule],
    hw: GpuSpec,
    progress: Callable[[int, int], None] | None = None,
) -> list[GpuKernel]:
    """``compile_gpu_kernel`` for each schedule, in order, with their SASS read in one batch
    (``progress(done, total)`` after each kernel is assembled)."""
    kernels: list[GpuKernel] = []
    with ThreadPoolExecutor(max_workers=COMPILE_THREADS) as pool:
        for kernel in pool.map(lambda s: compile_gpu_kernel(s, hw), schedules):
            kernels.append(kernel)
            if progress:
                progress(len(kernels), len(schedules))
    if not kernels:
        return []
    listings = disassemble_many([k.cubin for k in kernels], kernels[0].entry, hw.arch.sm)
    return [dataclasses.replace(k, disassembly=d) for k, d in zip(kernels, listings, strict=True)]
