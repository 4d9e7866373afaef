"""NVIDIA's compiler tools from their Python wheels: ptxas (PTX -> cubin, and the resource report
that is the truth about registers, spills and shared memory) and nvdisasm (cubin -> SASS).

Roadmap: both run as subprocesses of the binaries the wheels install, found through the installed
distribution's file list, never by guessing PATH. ptxas comes from ``nvidia-cuda-nvcc-cu12`` (12.x:
the 13.x ptxas no longer assembles sm_70); nvdisasm from ``nvidia-cuda-nvdisasm`` (only 13.x is on
the package index, and it refuses sm_70 cubins: V100 kernels are then read from PTX alone, which
``disassemble`` reports rather than hides).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aotune.errors import CodegenError

# distribution names that carry each tool, newest packaging first
TOOL_DISTRIBUTIONS = {
    "ptxas": ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc"),
    "nvdisasm": ("nvidia-cuda-nvdisasm", "nvidia-cuda-nvdisasm-cu12"),
}
INSTALL_HINT = (
    "pip install 'aotune[gpu]' (or: pip install 'nvidia-cuda-nvcc-cu12>=12.4,<13' "
    "nvidia-cuda-nvdisasm)"
)
TOOL_SECONDS = 120


class ToolMissingError(CodegenError):
    """An NVIDIA tool's wheel is not installed."""


@functools.cache
def tool_path(tool: str) -> Path:
    """The executable ``tool`` (``ptxas`` or ``nvdisasm``) from its installed wheel."""
    for dist_name in TOOL_DISTRIBUTIONS[tool]:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name == tool and f.parent.name == "bin":
                path = Path(str(dist.locate_file(f)))
                if path.is_file():
                    if not path.stat().st_mode & 0o111:
                        path.chmod(path.stat().st_mode | 0o755)  # some installers drop the x bit
                    return path
    raise ToolMissingError(
        f"{tool} is not installed (it comes from {' or '.join(TOOL_DISTRIBUTIONS[tool])}); "
        f"{INSTALL_HINT}"
    )


@functools.cache
def tool_version(tool: str) -> str:
    """``12.9`` from ``<tool> --version``."""
    out = _run([str(tool_path(tool)), "--version"], tool).stdout
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else "unknown"


def _run(cmd: list[str], tool: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=stdin is None, timeout=TOOL_SECONDS, check=False
        )
    except OSError as e:
        raise CodegenError(
            f"{tool} could not be run ({e.strerror}); reinstall it: {INSTALL_HINT}"
        ) from None
    except subprocess.TimeoutExpired:
        raise CodegenError(f"{tool} ran past {TOOL_SECONDS} s on a generated kernel") from None


@dataclass(frozen=True)
class PtxasReport:
    """What ``ptxas -v`` says about one entry function: the resource truth."""

    registers: int
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int  # static shared memory (the kernel's own; dynamic is added at launch)
    constant_bytes: int
    barriers: int

    @property
    def spill_bytes(self) -> int:
        """Bytes spilled to local memory (stores + loads, per thread)."""
        return self.spill_store_bytes + self.spill_load_bytes


@dataclass(frozen=True)
class Assembled:
    """A cubin and ptxas's report on its entry."""

    cubin: bytes
    report: PtxasReport
    log: str


_USED = re.compile(r"Used (\d+) registers")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")
_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas_log(log: str, entry: str) -> PtxasReport:
    """The resource lines of ``ptxas -v`` for ``entry``."""
    start = log.find(f"Compiling entry function '{entry}'")
    if start < 0:
        raise CodegenError(f"ptxas reported nothing for entry {entry!r}: {log.strip()[:200]}")
    part = log[start:]
    used, stack = _USED.search(part), _STACK.search(part)
    if used is None or stack is None:
        raise CodegenError(f"ptxas -v output not understood: {part.strip()[:200]}")

    def num(rx: re.Pattern[str]) -> int:
        found = rx.search(part)
        return int(found.group(1)) if found else 0

    return PtxasReport(
        registers=int(used.group(1)),
        spill_store_bytes=int(stack.group(2)),
        spill_load_bytes=int(stack.group(3)),
        stack_bytes=int(stack.group(1)),
        shared_bytes=num(_SMEM),
        constant_bytes=num(_CMEM),
        barriers=num(_BARRIERS),
    )


def assemble(ptx: str, sm: int, entry: str) -> Assembled:
    """ptxas ``ptx`` for ``sm_<sm>``; a one-line CodegenError naming the fix if ptxas refuses."""
    exe = tool_path("ptxas")
    with tempfile.TemporaryDirectory(prefix="aotune-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        proc = _run([str(exe), "-v", "-O3", f"-arch=sm_{sm}", str(src), "-o", str(out)], "ptxas")
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise CodegenError(_ptxas_failure(log, sm))
        return Assembled(out.read_bytes(), parse_ptxas_log(log, entry), log)


def _ptxas_failure(log: str, sm: int) -> str:
    """One line for a ptxas error, with the fix where the cause is known."""
    version = re.search(r"Unsupported \.version (\S+); current version is '([^']+)'", log)
    if version:
        return (
            f"ptxas {tool_version('ptxas')} cannot take PTX ISA {version.group(1)} (it reads up to "
            f"{version.group(2)}); lower arch.ptx_version in the target's spec or install a newer "
            f"nvidia-cuda-nvcc-cu12"
        )
    if re.search(r"Value 'sm_\d+' is not defined|not defined for option 'gpu-name'", log):
        return (
            f"ptxas {tool_version('ptxas')} does not know sm_{sm}; install the "
            f"nvidia-cuda-nvcc-cu12 release that supports it (13.x dropped sm_70)"
        )
    first = next((ln for ln in log.splitlines() if "error" in ln.lower()), log.strip()[:200])
    return f"ptxas rejected the generated PTX for sm_{sm}: {first.strip()}"


@dataclass(frozen=True)
class SassInstruction:
    """One SASS instruction: opcode with its modifiers (``LDS.U.128``) and operand text."""

    opcode: str
    operands: str

    @property
    def base(self) -> str:
        """The opcode without modifiers (``LDS``)."""
        return self.opcode.split(".")[0]


@dataclass(frozen=True)
class Disassembly:
    """SASS of one function, or why there is none (the tool cannot read this sm)."""

    instructions: tuple[SassInstruction, ...]
    unavailable: str | None = None


def disassemble(cubin: bytes, entry: str) -> Disassembly:
    """The SASS of ``entry`` in ``cubin`` via ``nvdisasm -json``.

    An nvdisasm that refuses the architecture (13.x and sm_70) gives an empty Disassembly whose
    ``unavailable`` says so; a missing nvdisasm is an error like a missing ptxas.
    """
    exe = tool_path("nvdisasm")
    with tempfile.TemporaryDirectory(prefix="aotune-nvdisasm-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = _run([str(exe), "-json", str(path)], "nvdisasm")
    if proc.returncode != 0:
        reason = next(
            (ln.strip() for ln in proc.stderr.splitlines() if "fatal" in ln or "error" in ln),
            proc.stderr.strip()[:200],
        )
        if "deprecated" in reason or "not supported" in reason:
            return Disassembly((), f"nvdisasm {tool_version('nvdisasm')}: {reason}")
        raise CodegenError(f"nvdisasm failed on a cubin ptxas produced: {reason}")
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise CodegenError(f"nvdisasm -json printed no JSON ({e})") from None
    for fn in doc[1] if len(doc) > 1 else ():
        if fn.get("function-name") == entry:
            return Disassembly(
                tuple(
                    SassInstruction(i.get("opcode", ""), i.get("operands", ""))
                    for i in fn.get("sass-instructions", ())
                )
            )
    raise CodegenError(f"nvdisasm found no function {entry!r} in the cubin")


def text_section(cubin: bytes, entry: str) -> bytes:
    """The machine code of ``entry`` (its ``.text.<entry>`` section) in an ELF64 cubin."""
    try:
        if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
            raise ValueError("not an ELF64 file")
        shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
        shentsize, n, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
        headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(n)]
        names = headers[shstrndx][4]
        want = f".text.{entry}".encode()
        for name, _, _, _, offset, size in headers:
            start = names + name
            if cubin[start : cubin.index(b"\0", start)] == want:
                return cubin[offset : offset + size]
    except (struct.error, ValueError, IndexError) as e:
        raise CodegenError(f"a cubin ptxas produced is not a readable ELF file ({e})") from None
    raise CodegenError(f"the cubin has no code section for {entry!r}")


# nvdisasm reads raw instruction streams of these architectures (its --binary values); every sm
# from 70 on encodes an instruction in 16 bytes
RAW_SM = {75, 80, 86, 87, 88, 89, 90}
INSTRUCTION_BYTES = 16


def disassemble_many(cubins: list[bytes], entry: str, sm: int) -> list[Disassembly]:
    """The SASS of ``entry`` in each cubin, from one nvdisasm run over their code sections laid
    end to end as a raw instruction stream (nvdisasm's start-up, not the disassembly, is most of
    its time for one kernel). Branch targets are given relative to each kernel's start, as
    ``disassemble`` gives them. Architectures nvdisasm cannot read raw, and an nvdisasm that
    refuses the stream, fall back to ``disassemble`` per cubin."""
    if sm not in RAW_SM or len(cubins) < 2:
        return [disassemble(c, entry) for c in cubins]
    texts = [text_section(c, entry) for c in cubins]
    exe = tool_path("nvdisasm")
    with tempfile.TemporaryDirectory(prefix="aotune-nvdisasm-") as tmp:
        path = Path(tmp) / "kernels.bin"
        path.write_bytes(b"".join(texts))
        proc = _run([str(exe), "-b", f"SM{sm}", "-json", str(path)], "nvdisasm")
    try:
        doc = json.loads(proc.stdout) if proc.returncode == 0 else None
        stream = doc[1][0]["sass-instructions"] if doc else None
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        stream = None
    if stream is None or len(stream) * INSTRUCTION_BYTES != sum(len(t) for t in texts):
        return [disassemble(c, entry) for c in cubins]
    out, base = [], 0
    for t in texts:
        first, count = base // INSTRUCTION_BYTES, len(t) // INSTRUCTION_BYTES
        instructions = []
        for i in stream[first : first + count]:
            opcode, operands = i.get("opcode", ""), i.get("operands", "")
            if opcode.split(".")[0] in BRANCHES and operands.startswith("0x"):
                operands = hex(int(operands, 16) - base)
            instructions.append(SassInstruction(opcode, operands))
        out.append(Disassembly(tuple(instructions)))
        base += len(t)
    return out


BRANCHES = ("BRA", "BRX", "JMP", "CALL")
