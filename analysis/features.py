"""Features of generated machine code: capstone disassembly of the real object file.

The object's ELF symbol table gives each function's bytes; capstone decodes them; backward branches
mark loops; the innermost loop with the most vector FMAs is the micro-kernel's k loop. Its
instruction mix (FMAs, vector loads, broadcasts, stores, stack spills, other) per k step feeds the
model. Per-ISA facts are the small tables in ``ISA_TABLES``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import capstone
from aotune.analysis.elf import elf_sections
from aotune.analysis.loop_chains import stack_traffic
from aotune.analysis.x86_features import x86_features_in_code
from aotune.codegen.compile import Kernel
from aotune.errors import CodegenError


@dataclass(frozen=True)
class IsaTable:
    """How to read one ISA's disassembly."""

    cs_arch: int
    cs_mode: int
    fma_prefixes: tuple[str, ...]
    branch_prefixes: tuple[
        str, ...
    ]  # any mnemonic starting with one is a direct branch (x86 "j...")
    branch_mnemonics: tuple[
        str, ...
    ]  # exact mnemonics, also with a ".cond" suffix (AArch64 "b.ne")
    stack_regs: tuple[str, ...]
    vector_markers: tuple[str, ...]  # operand text that marks a vector register
    memory_from_operands: bool  # x86: a "[...]" destination is a store, a "[...]" source a load
    store_prefixes: tuple[str, ...] = ()  # otherwise stores and loads are their own mnemonics
    load_prefixes: tuple[str, ...] = ()
    broadcast_markers: tuple[str, ...] = ()
    prefetch_prefixes: tuple[str, ...] = ()  # software prefetches: no destination, an AGU slot
    # what ``loop_chains`` needs to follow values through registers and the stack: a vector
    # register's number, a stack slot's base and byte offset, the instructions that read their
    # destination (FMAs), and, where memory operands are operands (x86), the mnemonics whose
    # memory destination they only write (any other reads it first: ``add [rsp + 8], 1``)
    vector_register_pattern: str = ""
    stack_slot_pattern: str = ""
    accumulating_prefixes: tuple[str, ...] = ()
    overwriting_store_prefixes: tuple[str, ...] = ()
    comparing_prefixes: tuple[str, ...] = ()  # read every operand, write none (x86 ``cmp``)

    def is_branch(self, mnemonic: str) -> bool:
        """Whether ``mnemonic`` is a direct (conditional or unconditional) branch."""
        return any(mnemonic.startswith(p) for p in self.branch_prefixes) or any(
            mnemonic == b or mnemonic.startswith(b + ".") for b in self.branch_mnemonics
        )


ISA_TABLES = {
    "x86_64": IsaTable(
        capstone.CS_ARCH_X86,
        capstone.CS_MODE_64,
        ("vfmadd", "vfnmadd", "vfmsub", "vfnmsub"),
        ("j",),
        (),
        ("rsp", "rbp"),
        ("zmm", "ymm", "xmm"),
        memory_from_operands=True,
        broadcast_markers=("vbroadcastss", "vpbroadcastd", "{1to"),
        prefetch_prefixes=("prefetch",),
        vector_register_pattern=r"\b[xyz]mm(\d+)\b",
        stack_slot_pattern=r"\[(?P<base>rsp|rbp)(?: (?P<off>[+-] (?:0x[0-9a-f]+|\d+)))?\]",
        accumulating_prefixes=("vfmadd", "vfnmadd", "vfmsub", "vfnmsub"),
        overwriting_store_prefixes=(
            "mov",
            "vmov",
            "vextract",
            "vpextr",
            "vmaskmov",
            "vpmaskmov",
            "vcompress",
            "vpcompress",
            "vscatter",
            "vpscatter",
        ),
        comparing_prefixes=("cmp", "test", "vptest", "ucomis", "vucomis", "comis", "vcomis"),
    ),
    "aarch64": IsaTable(
        getattr(capstone, "CS_ARCH_ARM64", getattr(capstone, "CS_ARCH_AARCH64", 1)),
        capstone.CS_MODE_ARM,
        ("fmla", "fmadd"),
        (),
        ("b", "cbz", "cbnz", "tbz", "tbnz"),
        ("sp",),
        (".4s", ".2d", ".8h", ".16b", "q"),
        memory_from_operands=False,
        store_prefixes=("st",),
        load_prefixes=("ld",),
        broadcast_markers=("ld1r", "dup"),
        prefetch_prefixes=("prfm",),
        vector_register_pattern=r"\b[vqdsh](\d+)\b",
        stack_slot_pattern=r"\[(?P<base>sp|x29)(?:, #(?P<off>-?(?:0x[0-9a-f]+|\d+)))?\]",
        accumulating_prefixes=("fmla", "fmls"),
    ),
}


@dataclass(frozen=True)
class LoopFeatures:
    """Instruction mix of the micro-kernel's innermost loop (one iteration)."""

    function: str
    instructions: int
    fma: int
    vector_loads: int
    scalar_loads: int
    broadcasts: int
    stores: int
    spills: int
    other: int
    loop_bytes: int
    loop_free: bool = False  # no k loop: the counts are the whole micro-kernel's, every k step
    prefetches: int = 0  # software prefetches (counted in no load class: they return no data)
    # stack stores reloaded in the next pass on the loop-carried chain through the most of them,
    # per iteration (``stack_round_trips``): a spilled accumulator waits on each store's forwarding
    stack_round_trips: float = 0.0
    # of ``spills``, the stack accesses to slots the loop does not both store and reload (a value
    # kept on the stack and reloaded every pass, as a row's address; every one with no k loop)
    unpaired_spills: int = 0


@dataclass(frozen=True)
class KernelFeatures:
    """What the disassembly says about a kernel."""

    isa: str
    text_bytes: int
    functions: tuple[str, ...]
    loop: LoopFeatures


def elf_functions(obj: bytes) -> dict[str, bytes]:
    """Function name -> machine code, from an ELF64 little-endian relocatable object."""
    if obj[:4] != b"\x7fELF" or obj[4] != 2 or obj[5] != 1:
        raise CodegenError("object code is not ELF64 little-endian")
    sections = elf_sections(obj)

    def data(i: int) -> bytes:
        sec = sections[i]
        return obj[sec[4] : sec[4] + sec[5]]

    out: dict[str, bytes] = {}
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        syms, strtab = obj[sec[4] : sec[4] + sec[5]], data(sec[6])
        for off in range(0, len(syms), 24):
            st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", syms, off
            )
            if (
                st_info & 0xF != 2 or st_size == 0 or st_shndx == 0 or st_shndx >= len(sections)
            ):  # STT_FUNC
                continue
            name = strtab[st_name : strtab.index(b"\0", st_name)].decode()
            out[name] = data(st_shndx)[st_value : st_value + st_size]
    return out


def x86_features_used(obj: bytes) -> dict[str, str]:
    """The LLVM CPU features the x86 machine code of ``obj`` needs, each with its first
    instruction that needs it (what a spec's ``llvm_cpu`` implies shows here, beside its
    ``llvm_features``)."""
    return x86_features_in_code(elf_functions(obj).values())


def _classify(insn: capstone.CsInsn, t: IsaTable) -> str:
    m, ops = insn.mnemonic, insn.op_str
    if any(m.startswith(p) for p in t.fma_prefixes):
        return "fma"
    if any(m.startswith(p) for p in t.prefetch_prefixes):
        return "prefetch"
    if t.memory_from_operands:
        if "[" not in ops:
            return "other"
        return "store" if "[" in ops.split(",")[0] else "load"
    if any(m.startswith(p) for p in t.store_prefixes):
        return "store"
    if any(m.startswith(p) for p in t.load_prefixes):
        return "load"
    return "other"


def _loops(insns: list[capstone.CsInsn], t: IsaTable) -> list[tuple[int, int]]:
    """(first, last address) of every backward direct branch's range: the function's loops."""
    loops = []
    for insn in insns:
        if t.is_branch(insn.mnemonic):
            target = insn.op_str.split(",")[-1].strip().lstrip("#")
            try:
                addr = int(target, 16) if target.startswith("0x") else int(target)
            except ValueError:
                continue
            if addr <= insn.address:
                loops.append((addr, insn.address))
    return loops


def _mix(name: str, body: list[capstone.CsInsn], t: IsaTable, loop_free: bool) -> LoopFeatures:
    """Count the instruction classes of ``body``."""
    counts = dict.fromkeys(
        ("fma", "vload", "sload", "bcast", "store", "spill", "unpaired", "prefetch", "other"), 0
    )
    traffic = None if loop_free else stack_traffic(body, t)
    for index, i in enumerate(body):
        kind = _classify(i, t)
        text = f"{i.mnemonic} {i.op_str}"
        if any(mk in text for mk in t.broadcast_markers):
            counts["bcast"] += 1
        if any(f"[{r}" in i.op_str for r in t.stack_regs) and kind in ("load", "store"):
            counts["spill"] += 1
            counts["unpaired"] += traffic is None or traffic.keeps_on_stack(index)
        if kind == "fma":
            counts["fma"] += 1
            if "[" in i.op_str:  # folded memory operand: a load too
                counts["vload" if "{1to" not in i.op_str else "sload"] += 1
        elif kind == "load":
            n = 2 if i.mnemonic.startswith("ldp") else 1
            counts[
                "vload"
                if any(v in i.op_str for v in t.vector_markers)
                and "broadcast" not in i.mnemonic
                and "ld1r" not in i.mnemonic
                else "sload"
            ] += n
        elif kind == "store":
            counts["store"] += 2 if i.mnemonic.startswith("stp") else 1
        elif kind == "prefetch":
            counts["prefetch"] += 1
        else:
            counts["other"] += 1
    return LoopFeatures(
        name,
        len(body),
        counts["fma"],
        counts["vload"],
        counts["sload"],
        counts["bcast"],
        counts["store"],
        counts["spill"],
        counts["other"],
        body[-1].address - body[0].address,
        loop_free,
        counts["prefetch"],
        0.0 if traffic is None else traffic.round_trips,
        counts["unpaired"],
    )


def loop_features(name: str, code: bytes, isa: str, main_loop_fmas: int = 0) -> LoopFeatures | None:
    """Features of the innermost loop with the most FMAs in one function (None if it has no
    loop).

    When more FMAs sit outside every loop than in that loop, LLVM unrolled the k loop away
    (a short k block) and kept only the remainder loop rolled: the function is read whole.
    A loop holding ``main_loop_fmas`` or more (one iteration of the schedule's main k loop; 0 if
    unknown) is that main loop whatever sits outside it: an activation's polynomial, inlined in
    the tile's stores, outnumbers a k step's FMAs (gelu 6 x 64: 504 outside, 48 in the loop).
    """
    t = ISA_TABLES[isa]
    insns = list(capstone.Cs(t.cs_arch, t.cs_mode).disasm(code, 0))
    loops = _loops(insns, t)
    best: tuple[int, int, list[capstone.CsInsn]] | None = None
    for lo, hi in loops:
        body = [i for i in insns if lo <= i.address <= hi]
        fmas = sum(1 for i in body if _classify(i, t) == "fma")
        if fmas and (best is None or fmas > best[0] or (fmas == best[0] and hi - lo < best[1])):
            best = (fmas, hi - lo, body)
    if best is None:
        return None
    if main_loop_fmas and best[0] >= main_loop_fmas:
        return _mix(name, best[2], t, loop_free=False)
    outside = sum(
        1
        for i in insns
        if _classify(i, t) == "fma" and not any(lo <= i.address <= hi for lo, hi in loops)
    )
    if outside > best[0]:
        return _mix(name, insns, t, loop_free=True)
    return _mix(name, best[2], t, loop_free=False)


def straight_line_features(name: str, code: bytes, isa: str) -> LoopFeatures | None:
    """Features of a whole function whose FMAs sit in no loop (None if it has no FMA).

    A short reduction (K <= 8) lets LLVM unroll the micro-kernel's k loop completely: the body
    then holds every k step once, besides the C tile's loads and stores.
    """
    t = ISA_TABLES[isa]
    insns = list(capstone.Cs(t.cs_arch, t.cs_mode).disasm(code, 0))
    if not insns or not any(_classify(i, t) == "fma" for i in insns):
        return None
    return _mix(name, insns, t, loop_free=True)


# codegen names each register tile's function after its shape: ukernel_<rows>x<cols>
_TILE_FUNCTION = re.compile(r"ukernel_(\d+)x(\d+)$")


def tile_of_function(name: str) -> tuple[int, int] | None:
    """(rows, columns) of the register tile a micro-kernel function computes; None for others."""
    tile = _TILE_FUNCTION.match(name)
    return (int(tile[1]), int(tile[2])) if tile else None


def main_loop_fmas(unroll: int, lanes: int, function: str) -> int:
    """FMAs in one iteration of a micro-kernel function's main k loop: ``unroll`` k steps of its
    tile's rows by vectors (0 for a function that is not a register tile's)."""
    tile = tile_of_function(function)
    return unroll * tile[0] * -(-tile[1] // lanes) if tile else 0


def kernel_features(kernel: Kernel, isa: str) -> KernelFeatures:
    """Disassemble ``kernel``'s object code and describe its micro-kernel loop."""
    funcs = elf_functions(kernel.object_code)
    s = kernel.schedule
    main = f"ukernel_{s.mr}x{s.nr}"
    order = [f for f in [main, *funcs] if f in funcs]
    order = list(dict.fromkeys(order))
    text_bytes = sum(map(len, funcs.values()))
    readers = (
        lambda f: loop_features(f, funcs[f], isa, main_loop_fmas(s.unroll, s.lanes, f)),
        lambda f: straight_line_features(f, funcs[f], isa),
    )
    for read in readers:
        for fname in order:
            lf = read(fname)
            if lf is not None:
                return KernelFeatures(isa, text_bytes, tuple(funcs), lf)
    raise CodegenError(
        f"no FMA instruction found in the object code of {kernel.entry} "
        f"(functions: {', '.join(funcs)}); the kernel computes nothing the model can rank: "
        "check that the target spec's isa.llvm_features enable the FMA instructions and the "
        "vector width of its isa.vector_bits"
    )
