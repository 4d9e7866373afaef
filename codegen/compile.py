"""LLVM IR -> optimised module -> assembly text and object bytes (any target), via llvmlite.

Roadmap: a PTX path (NVPTX target + ptxas resource usage) will sit beside ``compile_kernel``.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import llvmlite.binding as llvm
from aotune.codegen.llvm_cpu import generate_ir
from aotune.codegen.schedule import CpuSchedule
from aotune.errors import CodegenError, HwSpecError
from aotune.hwspecs.spec import X86_APX_FEATURES, HwSpec

_LLVM_LOCK = threading.Lock()  # LLVM's global state is not thread-safe during init/compile


@functools.lru_cache(maxsize=1)
def _init_llvm() -> None:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


@dataclass(frozen=True)
class Kernel:
    """A compiled kernel: everything needed to analyse, run or ship it."""

    target: str
    triple: str
    entry: str
    llvm_ir: str
    object_code: bytes
    schedule: CpuSchedule
    hw: HwSpec = field(repr=False, compare=False)

    @functools.cached_property
    def asm(self) -> str:
        """The assembly text, emitted from the IR again on first use: the search reads only the
        object code, and emitting text for every candidate cost a third of each compile."""
        with _LLVM_LOCK:
            tm = target_machine(self.hw)
            return tm.emit_assembly(optimize(self.llvm_ir, tm))

    @property
    def launch(self) -> list[tuple[int, int]]:
        """Per-thread [lo, hi) ranges of the parallel loop: the launch parameters."""
        return self.schedule.thread_ranges()


_LIST_TARGET_NAMES = (
    "import sys, llvmlite.binding as llvm; llvm.initialize_all_targets(); "
    "llvm.initialize_all_asmprinters(); "
    "llvm.Target.from_triple(sys.argv[1]).create_target_machine(cpu='help', features='')"
)


@functools.lru_cache(maxsize=8)
def llvm_target_names(triple: str) -> tuple[frozenset[str], frozenset[str]]:
    """(CPU names, feature names) that LLVM knows for ``triple``.

    LLVM prints them when asked for the CPU "help"; it does so in a child process, because it
    writes to the process's own stdout and aborts the process on some malformed inputs.
    """
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _LIST_TARGET_NAMES, triple],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CodegenError(f"cannot ask LLVM which CPUs it knows: {e}") from None
    if proc.returncode != 0:
        raise HwSpecError(f"LLVM cannot target {triple!r}; fix isa.triple in the spec")
    sections: dict[str, set[str]] = {"cpus": set(), "features": set()}
    current = None
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("Available CPUs"):
            current = "cpus"
        elif line.startswith("Available features"):
            current = "features"
        elif current and line.startswith("  ") and " - " in line:
            sections[current].add(line.split()[0])
        elif line.startswith("Use +feature"):
            current = None
    return frozenset(sections["cpus"]), frozenset(sections["features"])


# a 512-bit float add: which registers LLVM gives it says how wide the CPU's vectors are
_WIDE_ADD_IR = (
    "define void @f(ptr %p, ptr %q) {\n  %a = load <16 x float>, ptr %p\n"
    "  %b = load <16 x float>, ptr %q\n  %c = fadd <16 x float> %a, %b\n"
    "  store <16 x float> %c, ptr %p\n  ret void\n}\n"
)


def x86_vector_register_bits(hw: HwSpec) -> int:
    """The widest x86 vector register (512, 256 or 128 bits) in LLVM's code for ``hw``'s CPU and
    features: what a CPU name implies where the feature list names no vector extension."""
    with _LLVM_LOCK:
        tm = target_machine(hw)
        asm = tm.emit_assembly(optimize(_WIDE_ADD_IR, tm))
    return next((bits for bits, reg in ((512, "zmm"), (256, "ymm")) if reg in asm), 128)


def target_machine(hw: HwSpec, jit: bool = False) -> llvm.TargetMachine:
    """An LLVM target machine for ``hw`` (object-file settings unless ``jit``)."""
    _init_llvm()
    try:
        target = llvm.Target.from_triple(hw.isa.triple)
    except RuntimeError as e:
        raise CodegenError(
            f"LLVM cannot target {hw.isa.triple!r} ({e}); fix isa.triple in the {hw.name} spec"
        ) from None
    features = _usable_features(hw)
    if jit:
        return target.create_target_machine(cpu=hw.isa.llvm_cpu, features=features, opt=3)
    return target.create_target_machine(
        cpu=hw.isa.llvm_cpu, features=features, opt=3, reloc="pic", codemodel="small"
    )


def _usable_features(hw: HwSpec) -> str:
    """The spec's LLVM features, with x86's APX switched off where this LLVM knows it: a CPU name
    such as diamondrapids turns it on, and capstone cannot read the code it gives."""
    if hw.isa.arch != "x86_64":
        return hw.isa.llvm_features
    known = llvm_target_names(hw.isa.triple)[1]
    off = [f"-{feature}" for feature in X86_APX_FEATURES if feature in known]
    return ",".join(filter(None, [hw.isa.llvm_features, *off]))


def optimize(ir_text: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    """Parse, verify and run the O3 pipeline."""
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"generated LLVM IR is invalid: {e}") from None
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


def compile_kernel(schedule: CpuSchedule, hw: HwSpec, entry: str = "aotune_kernel") -> Kernel:
    """Generate, optimise and assemble the kernel for ``hw`` (no execution)."""
    ir_text = generate_ir(schedule, entry, hw.isa.triple)
    with _LLVM_LOCK:
        tm = target_machine(hw)
        obj = tm.emit_object(optimize(ir_text, tm))
    return Kernel(hw.name, hw.isa.triple, entry, ir_text, bytes(obj), schedule, hw)
