"""Proof that a generated GPU kernel touches no memory outside its tensors and buffers.

The proof reads the kernel itself: the llvmlite IR of the device module (the entry and its four
region functions, before any optimisation) is executed symbolically, with every integer an affine
expression (``floor``/``mod`` by constants allowed) of the thread index, the block indices and the
loop counters, and every memory access recorded with the conditions under which it happens:

    tid, bx, by, bz       the NVVM special registers, ranging over the launch's block and grid
    kt, kk                a loop's phi: init + step * n (n >= 0) while the loop's condition holds
    select(ok, flat, 0)   two pieces: ``flat`` where ok holds, 0 where it does not (a guarded read)
    if (ok) store         the store happens only where ok holds (a guarded write)

``analysis/polyhedral.py`` (the only islpy importer) then asks isl, for each access, whether any
point of its domain reaches outside ``[0, size - width]`` of its buffer (A, B, C, bias, the
shared-memory tile, the accumulators), and for each unsigned division or remainder whether its
dividend can be negative (where ``floor``/``mod`` would not describe it). An access isl cannot
place inside is reported with the indices that reach outside.

Anything the interpreter does not understand (a non-constant multiplier, a control-flow shape other
than a counted loop or an ``if``) is an error, never a silent pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import llvmlite.ir as ir
from aotune.analysis.polyhedral import range_violation
from aotune.codegen.gpu_compile import GpuKernel
from aotune.codegen.llvm_gpu import KernelEmitter
from aotune.errors import CodegenError

TRUE = "0 <= 0"
SIGNED = {"slt": "<", "sle": "<=", "sgt": ">", "sge": ">=", "eq": "="}
OPAQUE_CALLS = ("llvm.fma", "llvm.exp2")
SPECIAL_REGISTERS = {
    "llvm.nvvm.read.ptx.sreg.tid.x": "tid",
    "llvm.nvvm.read.ptx.sreg.ctaid.x": "bx",
    "llvm.nvvm.read.ptx.sreg.ctaid.y": "by",
    "llvm.nvvm.read.ptx.sreg.ctaid.z": "bz",
}


class UnprovableKernelError(CodegenError):
    """The kernel's IR has a form the bounds proof does not read."""


@dataclass(frozen=True)
class Lin:
    """``sum(coeff * atom) + const``: an affine form whose atoms are variables or ``floor``/``mod``
    terms of other forms, kept canonical (sorted, merged), so equal forms print equally."""

    terms: tuple[tuple[str, int], ...]
    const: int

    @staticmethod
    def of(value: str | int) -> Lin:
        """A constant or one variable."""
        return Lin((), value) if isinstance(value, int) else Lin(((value, 1),), 0)

    def __add__(self, other: Lin) -> Lin:
        merged = dict(self.terms)
        for atom, c in other.terms:
            merged[atom] = merged.get(atom, 0) + c
        return Lin(tuple(sorted((a, c) for a, c in merged.items() if c)), self.const + other.const)

    def scaled(self, k: int) -> Lin:
        """``k`` times this form."""
        if k == 0:
            return Lin((), 0)
        return Lin(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def floor_div(self, k: int) -> Lin:
        """``floor(self / k)``."""
        if not self.terms:
            return Lin((), self.const // k)
        return Lin.of(f"floor(({self})/{k})") if k != 1 else self

    def modulo(self, k: int) -> Lin:
        """``self mod k``."""
        if not self.terms:
            return Lin((), self.const % k)
        return Lin.of(f"(({self}) mod {k})") if k != 1 else Lin((), 0)

    def __str__(self) -> str:
        parts = [atom if c == 1 else f"{c}*{atom}" for atom, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class Int:
    """A piecewise affine integer: ``form`` where ``condition`` holds, for each piece."""

    pieces: tuple[tuple[str, Lin], ...]

    @staticmethod
    def of(value: str | int | Lin) -> Int:
        """One piece, everywhere."""
        return Int(((TRUE, value if isinstance(value, Lin) else Lin.of(value)),))

    def constant(self) -> int | None:
        """The value, if this is one integer constant."""
        if len(self.pieces) == 1 and not self.pieces[0][1].terms:
            return self.pieces[0][1].const
        return None

    def single(self, what: str) -> Lin:
        """The one form (an error where the value is piecewise)."""
        if len(self.pieces) != 1 or self.pieces[0][0] != TRUE:
            raise UnprovableKernelError(f"{what} of a piecewise integer")
        return self.pieces[0][1]


@dataclass(frozen=True)
class Pred:
    """An i1 value: a condition in isl syntax."""

    text: str


@dataclass(frozen=True)
class Ptr:
    """A pointer into a named buffer at an element offset, read ``width`` elements at a time."""

    buffer: str
    offset: Int
    width: int = 1


class Opaque:
    """A value the proof does not follow (floats, vectors of floats)."""


OPAQUE = Opaque()


@dataclass(frozen=True)
class Access:
    """One memory access: ``buffer[index .. index + width - 1]`` where ``condition`` holds."""

    buffer: str
    kind: str  # "load" or "store"
    index: Lin
    width: int
    condition: str
    region: str

    def __str__(self) -> str:
        where = "from" if self.kind == "load" else "to"
        return f"{self.kind} of {self.width} {where} {self.buffer}[{self.index}] in {self.region}"


@dataclass(frozen=True)
class Violation:
    """An access (or a division) that isl places outside, with the indices of a witness."""

    what: str
    witness: dict[str, int]

    def __str__(self) -> str:
        at = ", ".join(f"{k}={v}" for k, v in self.witness.items())
        return f"{self.what} at {at}"


@dataclass(frozen=True)
class BoundsReport:
    """Every access of a kernel, its buffers' sizes, and what isl could not prove."""

    accesses: tuple[Access, ...]
    sizes: dict[str, int]
    divisions_checked: int
    violations: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        """Whether every access was proven in bounds (and every division well defined)."""
        return not self.violations

    def count(self, buffer: str, kind: str) -> int:
        """Accesses of one kind to one buffer."""
        return sum(1 for a in self.accesses if a.buffer == buffer and a.kind == kind)

    @property
    def guarded(self) -> int:
        """Accesses that happen only under a condition beyond the domain (bounds checks)."""
        return sum(1 for a in self.accesses if a.condition != TRUE)


@dataclass
class _Interpreter:
    """Symbolic execution of the device module's IR, recording accesses and obligations."""

    launch_block: tuple[int, int, int]
    launch_grid: tuple[int, int, int]
    variables: list[str] = field(default_factory=list)
    domain: list[str] = field(default_factory=list)
    accesses: set[Access] = field(default_factory=set)
    divisions: set[tuple[str, str]] = field(default_factory=set)  # (condition, dividend)
    sizes: dict[str, int] = field(default_factory=dict)
    env: dict[int, object] = field(default_factory=dict)
    keep: list[object] = field(default_factory=list)

    # ---- values ---------------------------------------------------------------------------------
    def value(self, v: ir.Value) -> object:
        if isinstance(v, ir.Constant):
            if isinstance(v.type, ir.IntType):
                return (
                    Pred(TRUE if v.constant else "0 > 0")
                    if v.type.width == 1
                    else Int.of(int(v.constant))
                )
            if isinstance(v.type, ir.PointerType) and v.constant is None:
                self.sizes.setdefault("null", 0)
                return Ptr("null", Int.of(0))
            return OPAQUE
        if id(v) not in self.env:
            raise UnprovableKernelError(f"value {v.get_reference()} used before it is defined")
        return self.env[id(v)]

    def bind(self, v: ir.Value, sym: object) -> None:
        self.keep.append(v)
        self.env[id(v)] = sym

    def new_variable(self, name: str) -> str:
        base, n = name.replace(".", "_") or "v", 0
        while (name := f"{base}{n or ''}") in self.variables:
            n += 1
        self.variables.append(name)
        return name

    # ---- integer arithmetic ---------------------------------------------------------------------
    @staticmethod
    def add(a: Int, b: Int) -> Int:
        pieces = []
        for ca, ea in a.pieces:
            for cb, eb in b.pieces:
                cond = ca if cb == TRUE else cb if ca == TRUE else f"{ca} and {cb}"
                pieces.append((cond, ea + eb))
        return Int(tuple(pieces))

    @staticmethod
    def multiply(a: Int, b: Int) -> Int:
        ka, kb = a.constant(), b.constant()
        if ka is None and kb is None:
            raise UnprovableKernelError("a product of two non-constant integers is not affine")
        if kb is None:
            a, ka, kb = b, kb, ka
        assert kb is not None
        return Int(tuple((c, e.scaled(kb)) for c, e in a.pieces))

    def divide(self, a: Int, b: Int, op: str, path: str) -> Int:
        k = b.constant()
        if k is None or k <= 0:
            raise UnprovableKernelError(f"{op} by a non-constant or non-positive divisor")
        out = []
        for c, e in a.pieces:
            if e.terms:  # unsigned: floor and mod describe it only from 0 up
                self.divisions.add((path if c == TRUE else f"{path} and {c}", str(e)))
            out.append((c, e.floor_div(k) if op == "udiv" else e.modulo(k)))
        return Int(tuple(out))

    # ---- execution ------------------------------------------------------------------------------
    def run_function(self, fn: ir.Function, args: list[object], path: str) -> None:
        for formal, actual in zip(fn.args, args):
            self.bind(formal, actual)
        self.run_from(fn, fn.blocks[0], path, stop=None)

    def run_from(self, fn: ir.Function, block: ir.Block, path: str, stop: ir.Block | None) -> None:
        """Execute from ``block`` until ``stop`` (a loop's header or an if's join) or a return."""
        while block is not stop:
            for ins in block.instructions[:-1]:
                self.step(fn, ins, path)
            term = block.instructions[-1]
            if isinstance(term, ir.Ret):
                return
            if isinstance(term, ir.ConditionalBranch):
                cond = self.value(term.operands[0])
                assert isinstance(cond, Pred)
                then, other = term.operands[1], term.operands[2]
                # an if: the then-block rejoins the other target
                self.run_from(fn, then, f"{path} and {cond.text}", stop=other)
                block = other
                continue
            if not isinstance(term, ir.Branch):
                raise UnprovableKernelError(f"terminator {term.opname} in {fn.name}")
            target = term.operands[0]
            if target is stop:
                return
            first = target.instructions[0] if target.instructions else None
            if isinstance(first, ir.PhiInstr):
                block = self.loop(fn, target, block, path)
                continue
            block = target

    def loop(self, fn: ir.Function, header: ir.Block, entry: ir.Block, path: str) -> ir.Block:
        """A counted loop: its phi becomes a variable (init + step * n), the body runs under the
        header's condition; returns the exit block."""
        phis = [i for i in header.instructions if isinstance(i, ir.PhiInstr)]
        # values carried from one iteration to the next (loads issued a step ahead) are data:
        # no address depends on them
        counters = [i for i in phis if isinstance(i.type, ir.IntType)]
        if len(counters) != 1:
            raise UnprovableKernelError(f"a loop header with {len(counters)} counters in {fn.name}")
        for data in phis:
            if data not in counters:
                self.bind(data, OPAQUE)
        phi = counters[0]
        init = next((v for v, b in phi.incomings if b is entry), None)
        latch = [(v, b) for v, b in phi.incomings if b is not entry]
        if init is None or len(latch) != 1:
            raise UnprovableKernelError(f"loop {phi.name} in {fn.name} is not a counted loop")
        nxt = latch[0][0]
        if not (
            isinstance(nxt, ir.Instruction)
            and nxt.opname == "add"
            and nxt.operands[0] is phi
            and isinstance(nxt.operands[1], ir.Constant)
        ):
            raise UnprovableKernelError(f"loop {phi.name} in {fn.name} does not step by a constant")
        step = int(nxt.operands[1].constant)
        start = self.value(init)
        if not isinstance(start, Int):
            raise UnprovableKernelError(f"loop {phi.name} in {fn.name} starts at a non-integer")
        first = start.single(f"the start of loop {phi.name}")
        var = self.new_variable(phi.name)
        self.domain.append(f"{var} >= {first} and ({var} - ({first})) mod {step} = 0")
        self.bind(phi, Int.of(var))
        for ins in header.instructions[len(phis) : -1]:
            self.step(fn, ins, path)
        term = header.instructions[-1]
        if not isinstance(term, ir.ConditionalBranch):
            raise UnprovableKernelError(f"loop {phi.name} in {fn.name} has no exit test")
        cond = self.value(term.operands[0])
        assert isinstance(cond, Pred)
        body, exit_ = term.operands[1], term.operands[2]
        self.run_from(fn, body, f"{path} and {cond.text}", stop=header)
        return exit_

    def step(self, fn: ir.Function, ins: ir.Instruction, path: str) -> None:
        op = ins.opname
        vals = [self.value(o) for o in ins.operands] if op not in ("call", "phi") else []
        if op in ("add", "mul", "udiv", "urem"):
            a, b = vals
            if not (isinstance(a, Int) and isinstance(b, Int)):
                raise UnprovableKernelError(f"{op} of non-integers in {fn.name}")
            if op == "add":
                self.bind(ins, self.add(a, b))
            elif op == "mul":
                self.bind(ins, self.multiply(a, b))
            else:
                self.bind(ins, self.divide(a, b, op, path))
        elif op == "and":
            a, b = vals
            if not (isinstance(a, Pred) and isinstance(b, Pred)):
                raise UnprovableKernelError(f"an integer 'and' in {fn.name}")
            self.bind(ins, Pred(f"({a.text}) and ({b.text})"))
        elif op == "icmp":
            a, b = vals
            if ins.op not in SIGNED or not (isinstance(a, Int) and isinstance(b, Int)):
                raise UnprovableKernelError(f"comparison {ins.op} in {fn.name}")
            lhs, rhs = a.single("a comparison"), b.single("a comparison")
            self.bind(ins, Pred(f"({lhs}) {SIGNED[ins.op]} ({rhs})"))
        elif op == "select":
            c, a, b = vals
            if isinstance(a, Int) and isinstance(b, Int) and isinstance(c, Pred):
                pieces = [(f"{ca} and ({c.text})", e) for ca, e in a.pieces]
                pieces += [(f"{cb} and not ({c.text})", e) for cb, e in b.pieces]
                self.bind(ins, Int(tuple(pieces)))
            else:
                self.bind(ins, OPAQUE)
        elif op == "getelementptr":
            base = vals[0]
            if not isinstance(base, Ptr) or len(vals) != 2 or not isinstance(vals[1], Int):
                raise UnprovableKernelError(f"a getelementptr of another form in {fn.name}")
            self.bind(ins, Ptr(base.buffer, self.add(base.offset, vals[1]), base.width))
        elif op in ("bitcast", "addrspacecast"):
            src = vals[0]
            if isinstance(src, Ptr):
                pointee = ins.type.pointee
                width = pointee.count if isinstance(pointee, ir.VectorType) else 1
                self.bind(ins, Ptr(src.buffer, src.offset, width))
            else:
                self.bind(ins, OPAQUE)
        elif op == "zext":
            self.bind(ins, vals[0])
        elif op in ("load", "store"):
            ptr = vals[0] if op == "load" else vals[1]
            if not isinstance(ptr, Ptr):
                raise UnprovableKernelError(f"a {op} through an unknown pointer in {fn.name}")
            for cond, index in ptr.offset.pieces:
                where = path if cond == TRUE else f"{path} and {cond}"
                self.accesses.add(Access(ptr.buffer, op, index, ptr.width, where, fn.name))
            if op == "load":
                self.bind(ins, OPAQUE)
        elif op == "phi" and not isinstance(ins.type, ir.IntType):
            self.bind(ins, OPAQUE)  # data joining after an if (a read skipped on the last step)
        elif op == "alloca":
            count = ins.type.pointee.count if isinstance(ins.type.pointee, ir.ArrayType) else 1
            self.sizes[ins.name or "alloca"] = count
            self.bind(ins, Ptr(ins.name or "alloca", Int.of(0)))
        elif op == "call":
            self.call(fn, ins, path)
        elif op in ("extractelement", "insertelement", "fadd", "fsub", "fmul", "fdiv", "fneg",
                    "fcmp"):  # fmt: skip
            self.bind(ins, OPAQUE)
        else:
            raise UnprovableKernelError(f"instruction {op} in {fn.name}")

    def call(self, fn: ir.Function, ins: ir.CallInstr, path: str) -> None:
        callee = ins.callee
        name = callee.name
        if name in SPECIAL_REGISTERS:
            var = self.new_variable(SPECIAL_REGISTERS[name])
            extent = {
                "tid": self.launch_block[0],
                "bx": self.launch_grid[0],
                "by": self.launch_grid[1],
                "bz": self.launch_grid[2],
            }[SPECIAL_REGISTERS[name]]
            self.domain.append(f"0 <= {var} < {extent}")
            self.bind(ins, Int.of(var))
        elif name == "llvm.nvvm.barrier0":
            pass
        elif name.startswith(OPAQUE_CALLS):
            self.bind(ins, OPAQUE)
        elif isinstance(callee, ir.Function) and callee.blocks:
            self.run_function(callee, [self.value(a) for a in ins.args], path)
        else:
            raise UnprovableKernelError(f"a call to {name} in {fn.name}")


def prove_in_bounds(kernel: GpuKernel) -> BoundsReport:
    """Every global and shared-memory access of ``kernel``'s device code, and isl's verdict on
    each: inside its buffer at every thread, block and loop index the launch reaches."""
    s, launch = kernel.schedule, kernel.launch
    module = KernelEmitter(s, kernel.entry).device_ir(
        kernel.hw.arch.triple, dynamic_shared=launch.dynamic_shared_bytes > 0
    )
    entry = module.get_global(kernel.entry)
    interp = _Interpreter(launch.block, launch.grid)
    sizes = {
        "A": math.prod(s.shapes[0]),
        "B": math.prod(s.shapes[1]),
        "C": math.prod(s.shapes[2]),
        "bias": s.shapes[2][-1] if s.bias else 0,
    }
    interp.sizes.update(sizes)
    for g in module.global_values:
        if isinstance(g, ir.GlobalVariable) and isinstance(g.value_type, ir.ArrayType):
            count = g.value_type.count or launch.dynamic_shared_bytes // 4
            interp.sizes["shared"] = count
            interp.bind(g, Ptr("shared", Int.of(0)))
    params = [Ptr(name, Int.of(0)) for name in launch.parameters]
    interp.run_function(entry, params, TRUE)
    return check(interp)


def check(interp: _Interpreter) -> BoundsReport:
    """isl's verdict on every recorded access and division.

    Accesses that differ only in a constant (the elements of a run, the steps of an unrolled
    loop) under one condition are one question: ``form + c`` stays inside for every ``c`` exactly
    when ``form + min(c)`` and ``form + max(c + width) - 1`` do. A constant index needs no isl."""
    variables = tuple(interp.variables)
    domain = " and ".join(interp.domain) or TRUE
    violations = []
    accesses = sorted(interp.accesses, key=lambda a: (a.region, a.buffer, a.kind, str(a.index)))
    groups: dict[tuple[str, str, tuple[tuple[str, int], ...]], list[Access]] = {}
    for a in accesses:
        groups.setdefault((a.buffer, a.condition, a.index.terms), []).append(a)
    for (buffer, condition, terms), members in groups.items():
        size = interp.sizes.get(buffer, 0)
        low = min(a.index.const for a in members)
        high = max(a.index.const + a.width for a in members) - 1
        if not terms and 0 <= low and high < size:
            continue
        form = Lin(terms, 0)
        witness = range_violation(
            variables, f"{domain} and {condition}", str(form), -low, size - 1 - high
        )
        if witness is not None:
            first = members[0]
            violations.append(
                Violation(f"{first} (and {len(members) - 1} like it; size {size})", witness)
            )
    by_dividend: dict[str, list[str]] = {}
    for cond, dividend in sorted(interp.divisions):
        by_dividend.setdefault(dividend, []).append(cond)
    for dividend, conds in by_dividend.items():
        # most dividends (row, column and k indices) are >= 0 wherever the domain reaches; only
        # those that are not need the conditions of the paths that divide them
        if range_violation(variables, domain, dividend, 0, None) is None:
            continue
        for cond in conds:
            witness = range_violation(variables, f"{domain} and {cond}", dividend, 0, None)
            if witness is not None:
                violations.append(Violation(f"unsigned division of negative {dividend}", witness))
    return BoundsReport(
        tuple(accesses), dict(interp.sizes), len(interp.divisions), tuple(violations)
    )
