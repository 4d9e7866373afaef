"""Microbenchmark kernels for ``aotune hw calibrate``: LLVM IR built with llvmlite, JIT-compiled.

Roadmap: four kernel shapes cover every probe. Each is a frozen description whose ``emit`` adds
one function to a module; ``MicroBench`` compiles the kernels a calibration needs into one module
once and calls them. Every kernel has the worker pool's entry signature ``void f(i64 x 8)``
(pointers passed as integers), so the same code runs on one core (``call``) or on every core at
once (``codegen/workers.py``).

- ``Mix``: a loop whose step issues an add on each of some integer chains, an FMA on each of some
  FMA chains (any width, scalar included), and volatile loads and stores of one width inside an
  L1-resident buffer. One dependent chain of adds times the clock; one FMA chain its latency;
  many its throughput; chains of two widths the mixed-width case; loads/stores their ports; all
  of them together the issue width.
- ``Chase``: ``p = *p`` unrolled: load-to-use latency of whatever holds the chain's lines (the
  caller lays out the chain: a random cycle for cache latency, one line per page for the TLB, a
  fixed stride for the prefetcher); on several chains at once, how many misses overlap.
- ``Stream``: volatile vector loads walking a buffer: bandwidth from where the buffer lives.
- ``Rows``: a micro-kernel's B operand: one vector per row, rows a stride apart, FMA work per row,
  and a software prefetch a given number of rows ahead.

Nothing here decides what a result means; ``hwspecs/calibrate.py`` does. Integer chains pass
through an empty inline-asm statement after every add (no instruction, any ISA: the ``r``
constraint), which hides the value from LLVM so it cannot fold a chain of adds into one multiply
(the step added is such a value too: some renamers fold chains of adds of an immediate);
loads and stores whose values nobody uses are volatile, so each one is issued.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llvmlite.binding as llvm
import llvmlite.ir as ir
from aotune.codegen.compile import _LLVM_LOCK, target_machine
from aotune.codegen.llvm_cpu import c64, counted_loop, splat
from aotune.errors import CodegenError
from aotune.hwspecs.spec import HwSpec

F32 = ir.FloatType()
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
ARGS = 8  # the worker pool's entry signature: void f(i64 x 8)
_ENTRY = ir.FunctionType(ir.VoidType(), [I64] * ARGS)
_CALL = ctypes.CFUNCTYPE(None, *([ctypes.c_int64] * ARGS))
SCRATCH_BYTES = 4096  # Mix's buffer: loads in the first half, stores in the second (stays in L1)
OUT_BYTES = 64  # bytes of ``out`` a kernel may write per chain it keeps alive
MAX_CHAINS = 64


class _VolatileLoad(ir.LoadInstr):
    """``load volatile``: llvmlite.ir has no flag for it, and a probe must issue every load."""

    def descr(self, buf: list[str]) -> None:
        start = len(buf)
        super().descr(buf)
        buf[start] = buf[start].replace("load ", "load volatile ", 1)


class _VolatileStore(ir.StoreInstr):
    """``store volatile``: as ``_VolatileLoad``, for stores."""

    def descr(self, buf: list[str]) -> None:
        start = len(buf)
        super().descr(buf)
        buf[start] = buf[start].replace("store ", "store volatile ", 1)


def volatile_load(b: ir.IRBuilder, ptr: ir.Value, align: int) -> ir.Instruction:
    """A load the compiler must issue even though its value is unused."""
    ld = b.load(ptr, align=align)
    ld.__class__ = _VolatileLoad
    return ld


def volatile_store(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, align: int) -> None:
    """A store the compiler must issue even though nothing reads it."""
    st = b.store(value, ptr, align=align)
    st.__class__ = _VolatileStore


def float_type(bits: int) -> ir.Type:
    """fp32 scalar (32 bits) or a vector of ``bits // 32`` lanes."""
    if bits < 32 or bits & (bits - 1):
        raise CodegenError(f"a probe width of {bits} bits is not a power of two >= 32")
    return F32 if bits == 32 else ir.VectorType(F32, bits // 32)


def _fma(mod: ir.Module, ty: ir.Type) -> ir.Function:
    name = "llvm.fma.f32" if ty == F32 else f"llvm.fma.v{ty.count}f32"
    if name in mod.globals:
        return mod.globals[name]
    return ir.Function(mod, ir.FunctionType(ty, [ty] * 3), name=name)


def _broadcast(b: ir.IRBuilder, x: ir.Value, ty: ir.Type) -> ir.Value:
    return x if ty == F32 else splat(b, x, ty)


# read, locality 3 (keep in L1), data: what the micro-kernel's B prefetch issues
L1_READ_HINT = (ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1))
LINE_BYTES = 64  # the prefetches' step: one line each on every supported core


def _prefetch_intrinsic(mod: ir.Module) -> ir.Function:
    return mod.globals.get("llvm.prefetch.p0") or ir.Function(
        mod,
        ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
        name="llvm.prefetch.p0",
    )


def _ptr(b: ir.IRBuilder, addr: ir.Value, ty: ir.Type) -> ir.Value:
    return b.inttoptr(addr, ty.as_pointer())


def _opaque(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``x`` through an empty asm statement: no instruction, but LLVM cannot see through it."""
    return b.asm(ir.FunctionType(I64, [I64]), "", "=r,0", [x], side_effect=False)


def _loop(
    b: ir.IRBuilder,
    count: ir.Value,
    inits: Sequence[ir.Value],
    body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]],
) -> list[ir.Value]:
    """``for i in [0, count): values = body(i, values)``; the values after the loop (``inits``
    when ``count <= 0``). Loop-carried values are phis, so no IR optimisation is needed."""
    fn = b.function
    pre = b.block
    loop, done = fn.append_basic_block("loop"), fn.append_basic_block("done")
    b.cbranch(b.icmp_signed(">", count, c64(0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(c64(0), pre)
    phis = [b.phi(v.type) for v in inits]
    for phi, v in zip(phis, inits):
        phi.add_incoming(v, pre)
    values = body(i, list(phis))
    nxt = b.add(i, c64(1))
    end = b.block
    i.add_incoming(nxt, end)
    for phi, v in zip(phis, values):
        phi.add_incoming(v, end)
    b.cbranch(b.icmp_signed("<", nxt, count), loop, done)
    b.position_at_end(done)
    finals = []
    for v_in, v_out in zip(inits, values):
        merged = b.phi(v_in.type)
        merged.add_incoming(v_in, pre)
        merged.add_incoming(v_out, end)
        finals.append(merged)
    return finals


def _lane_mask(b: ir.IRBuilder, ty: ir.Type) -> ir.Value:
    """A mask of every lane of vector type ``ty`` but the last, from a count the compiler cannot
    see (a constant mask may be lowered to something other than a masked store)."""
    lanes = ty.count
    last = b.trunc(_opaque(b, c64(lanes - 1)), I32)
    ids = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))
    return b.icmp_signed("<", ids, splat(b, last, ids.type))


def _masked_store(mod: ir.Module, ty: ir.Type) -> ir.Function:
    """``llvm.masked.store`` of vector type ``ty``."""
    mask_ty = ir.VectorType(ir.IntType(1), ty.count)
    fn_ty = ir.FunctionType(ir.VoidType(), [ty, ty.as_pointer(), I32, mask_ty])
    name = f"llvm.masked.store.v{ty.count}f32.p0"
    return mod.globals.get(name) or ir.Function(mod, fn_ty, name=name)


def _entry(mod: ir.Module, name: str) -> tuple[ir.IRBuilder, list[ir.Argument]]:
    fn = ir.Function(mod, _ENTRY, name=name)
    return ir.IRBuilder(fn.append_basic_block("entry")), list(fn.args)


@dataclass(frozen=True)
class Mix:
    """Each of ``iters * unroll`` steps: one add on each of ``adds`` integer chains, one FMA on each
    chain of ``fmas`` (the chain's width in bits; 32 is a scalar FMA), ``loads`` volatile loads and
    ``stores`` volatile stores of ``mem_bits`` each.

    Arguments: (iters, params, scratch, out): ``params`` holds the floats a, b, c (each FMA chain
    is ``acc = a * b + acc`` from ``c``: chained through the accumulator, as a micro-kernel's
    FMAs are, which ISAs with a destructive accumulator (AArch64's FMLA) run without copies, and
    which some cores forward sooner), ``scratch`` is
    ``SCRATCH_BYTES`` on a cache line, ``out`` receives each chain's final value (``OUT_BYTES``
    per chain). Memory operations walk the halves of ``scratch`` at consecutive addresses, aligned
    to their width (so ``scratch`` must be aligned to ``mem_bits / 8``).
    """

    adds: int = 0
    fmas: tuple[int, ...] = ()
    loads: int = 0
    stores: int = 0
    mem_bits: int = 32
    unroll: int = 1
    # stores with a lane mask (all lanes but the last, a mask the compiler cannot see), in the
    # stores' half of the buffer after the plain ones
    masked_stores: int = 0
    # software prefetches into L1 of the loads' half, one line apart: no data comes back
    prefetches: int = 0
    # the first this many FMA chains' accumulators stored to a stack slot and loaded back after
    # every FMA, as a spilled accumulator is: such a chain waits on the store's forwarding too
    through_memory: int = 0

    @property
    def name(self) -> str:
        """The function's name (unique per description)."""
        fmas = ".".join(map(str, self.fmas)) or "0"
        masked = f"_k{self.masked_stores}" if self.masked_stores else ""
        fetched = f"_p{self.prefetches}" if self.prefetches else ""
        spilled = f"_r{self.through_memory}" if self.through_memory else ""
        return (
            f"mix_a{self.adds}_f{fmas}{spilled}_l{self.loads}_s{self.stores}{masked}{fetched}"
            f"_m{self.mem_bits}_u{self.unroll}"
        )

    @property
    def steps_per_iteration(self) -> int:
        """Steps in one iteration of the loop (an iteration's operations are this times each
        step's)."""
        return self.unroll

    def emit(self, mod: ir.Module) -> None:
        """Add this kernel to ``mod``."""
        if self.adds + len(self.fmas) > MAX_CHAINS:
            raise CodegenError(f"{self.name}: more than {MAX_CHAINS} chains")
        b, (iters, params, scratch, out, *_) = _entry(mod, self.name)
        pf = _ptr(b, params, F32)
        a, bb, c = (b.load(b.gep(pf, [c64(i)])) for i in range(3))
        coef = {
            w: (_broadcast(b, a, float_type(w)), _broadcast(b, bb, float_type(w)))
            for w in sorted(set(self.fmas))
        }
        mem_ty, mem_bytes, half = float_type(self.mem_bits), self.mem_bits // 8, SCRATCH_BYTES // 2
        store_value = _broadcast(b, c, mem_ty)
        accs = [_broadcast(b, c, float_type(w)) for w in self.fmas]
        ints = [b.add(iters, c64(k)) for k in range(self.adds)]
        # a register, not an immediate: Golden Cove's renamer folds chains of `add reg, imm`
        one = _opaque(b, c64(1))
        mask = _lane_mask(b, mem_ty) if self.masked_stores else None
        prefetch = _prefetch_intrinsic(mod) if self.prefetches else None
        # each chain's slot on the stack, as the register allocator places a spilled accumulator
        slots = [b.alloca(x.type) for x in accs[: self.through_memory]]
        slot_align = max(self.fmas, default=32) // 8
        for at in slots:
            at.align = slot_align

        def step(_i: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
            fmas, adds = values[: len(accs)], values[len(accs) :]
            loads = stores = fetches = 0
            for _ in range(self.unroll):
                adds = [_opaque(b, b.add(x, one)) for x in adds]
                fmas = [
                    b.call(_fma(mod, float_type(w)), [*coef[w], x]) for x, w in zip(fmas, self.fmas)
                ]
                for x, at in zip(fmas, slots):
                    volatile_store(b, x, at, slot_align)
                reloaded = [volatile_load(b, at, slot_align) for at in slots]
                fmas = reloaded + fmas[len(reloaded) :]
                for _ in range(self.loads):
                    at = b.add(scratch, c64(loads * mem_bytes % half))
                    volatile_load(b, _ptr(b, at, mem_ty), mem_bytes)
                    loads += 1
                for _ in range(self.stores):
                    at = b.add(scratch, c64(half + stores * mem_bytes % half))
                    volatile_store(b, store_value, _ptr(b, at, mem_ty), mem_bytes)
                    stores += 1
                for _ in range(self.masked_stores):
                    at = _ptr(b, b.add(scratch, c64(half + stores * mem_bytes % half)), mem_ty)
                    b.call(_masked_store(mod, mem_ty), [store_value, at, ir.Constant(I32, 4), mask])
                    stores += 1
                for _ in range(self.prefetches):
                    at = b.add(scratch, c64(fetches * LINE_BYTES % half))
                    b.call(prefetch, [b.inttoptr(at, I8.as_pointer()), *L1_READ_HINT])
                    fetches += 1
            return fmas + adds

        for k, val in enumerate(_loop(b, iters, accs + ints, step)):
            b.store(val, _ptr(b, b.add(out, c64(k * OUT_BYTES)), val.type), align=4)
        b.ret_void()


@dataclass(frozen=True)
class Chase:
    """``p = *p``, ``unroll`` times per iteration, ``iters`` iterations, on each of ``chains``
    independent chains (their loads overlap as far as the core lets misses overlap).

    Arguments: (iters, start, out): ``start`` is the address of the first link (each link holds
    the address of the next), or with ``heads`` the address of an array of the chains' first
    links (needed for more than one chain). ``out`` receives the last address each chain reached
    (8 bytes each).
    """

    unroll: int = 16
    chains: int = 1
    heads: bool = False

    @property
    def name(self) -> str:
        """The function's name."""
        return f"chase_u{self.unroll}" + (f"_c{self.chains}h" if self.heads else "")

    def emit(self, mod: ir.Module) -> None:
        """Add this kernel to ``mod``."""
        if not 1 <= self.chains <= MAX_CHAINS or (self.chains > 1 and not self.heads):
            raise CodegenError(f"{self.name}: 1 to {MAX_CHAINS} chains, more than one from heads")
        b, (iters, start, out, *_) = _entry(mod, self.name)
        if self.heads:
            array = _ptr(b, start, I64)
            firsts = [b.load(b.gep(array, [c64(j)]), align=8) for j in range(self.chains)]
        else:
            firsts = [start]

        def step(_i: ir.Value, values: list[ir.Value]) -> list[ir.Value]:
            for _ in range(self.unroll):
                values = [b.load(_ptr(b, p, I64), align=8) for p in values]
            return values

        lasts = _loop(b, iters, firsts, step)
        outs = _ptr(b, out, I64)
        for j, last in enumerate(lasts):
            b.store(last, b.gep(outs, [c64(j)]), align=8)
        b.ret_void()


@dataclass(frozen=True)
class Stream:
    """Volatile loads of ``bits`` each over ``[buf, buf + nbytes)``, ``passes`` times, ``unroll``
    loads per iteration (``buf`` aligned to ``bits / 8`` bytes, ``nbytes`` a multiple of
    ``unroll * bits / 8``).

    Arguments: (passes, buf, nbytes).
    """

    bits: int
    unroll: int = 8

    @property
    def name(self) -> str:
        """The function's name."""
        return f"stream_{self.bits}_u{self.unroll}"

    @property
    def chunk_bytes(self) -> int:
        """Bytes one iteration reads; a buffer's length must be a multiple of it."""
        return self.unroll * self.bits // 8

    def emit(self, mod: ir.Module) -> None:
        """Add this kernel to ``mod``."""
        b, (passes, buf, nbytes, *_) = _entry(mod, self.name)
        ty = float_type(self.bits)
        width = self.bits // 8
        with counted_loop(b, c64(0), passes, 1, "pass"):
            with counted_loop(b, c64(0), nbytes, self.chunk_bytes, "chunk") as off:
                base = b.add(buf, off)
                for j in range(self.unroll):
                    volatile_load(b, _ptr(b, b.add(base, c64(j * width)), ty), width)
        b.ret_void()


@dataclass(frozen=True)
class Rows:
    """A micro-kernel's unpacked B operand: per row, ``vectors`` adjacent ``bits`` vectors loaded
    and each used by ``fmas`` FMAs (over at most ``ACCUMULATORS`` chains), and a software prefetch
    (into L1) of the row ``distance`` rows ahead.

    Arguments: (passes, buf, stride, distance, rows, slots, params, out). Pass ``p`` reads the
    vector at byte ``(p % slots) * SLOT_BYTES`` of each of ``rows`` rows ``stride`` bytes apart,
    so a line comes back only after ``slots`` passes (where a row's vectors fit a slot: wider
    rows are swept with one slot). ``params`` holds the floats a, b; ``out`` receives the
    accumulators.
    """

    bits: int
    fmas: int = 12
    vectors: int = 1
    ACCUMULATORS = 24  # at most: the FMAs of a row cycle through them (registers are few)
    WIDE_ACCUMULATORS = 8  # rows of several vectors: their loads need registers of their own
    SLOT_BYTES = 128  # a line pair: the adjacent-line prefetch of one slot never fills the next

    @property
    def name(self) -> str:
        """The function's name."""
        wide = f"_v{self.vectors}" if self.vectors > 1 else ""
        return f"rows_{self.bits}_f{self.fmas}{wide}"

    @property
    def accumulators(self) -> int:
        """Independent FMA chains the row's FMAs cycle through."""
        cap = self.ACCUMULATORS if self.vectors == 1 else self.WIDE_ACCUMULATORS
        return min(self.fmas * self.vectors, cap)

    def emit(self, mod: ir.Module) -> None:
        """Add this kernel to ``mod``."""
        b, (passes, buf, stride, distance, rows, slots, params, out) = _entry(mod, self.name)
        ty = float_type(self.bits)
        pf = _ptr(b, params, F32)
        a, bb = (b.load(b.gep(pf, [c64(i)])) for i in range(2))
        coefs = [
            _broadcast(b, b.fadd(a, ir.Constant(F32, 0.001 * j)), ty)
            for j in range(self.accumulators)
        ]
        prefetch = _prefetch_intrinsic(mod)
        ahead = b.mul(distance, stride)
        hint = L1_READ_HINT

        def one_pass(p: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            col = b.add(buf, b.mul(b.srem(p, slots), c64(self.SLOT_BYTES)))

            def one_row(r: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                at = b.add(col, b.mul(r, stride))
                # prefetches never fault: rows past the buffer's end are harmless
                b.call(prefetch, [b.inttoptr(b.add(at, ahead), I8.as_pointer()), *hint])
                accs = list(accs)
                for i in range(self.vectors):
                    at_i = b.add(at, c64(i * self.bits // 8))
                    v = b.load(_ptr(b, at_i, ty), align=self.bits // 8)
                    for j in range(self.fmas):
                        slot = (i * self.fmas + j) % self.accumulators
                        accs[slot] = b.call(_fma(mod, ty), [v, coefs[slot], accs[slot]])
                return accs

            return _loop(b, rows, accs, one_row)

        start = [_broadcast(b, bb, ty)] * self.accumulators
        for j, val in enumerate(_loop(b, passes, start, one_pass)):
            b.store(val, _ptr(b, b.add(out, c64(j * OUT_BYTES)), ty), align=4)
        b.ret_void()


Kernel = Mix | Chase | Stream | Rows


def loop_instructions(assembly: str, function: str) -> int:
    """Instructions in the innermost loop of ``function`` in ``assembly`` (LLVM's text for any
    target): a block that branches back to its own label (the probes' loops are single blocks),
    directives not counted; the smallest such block when there are several."""
    body: list[str] = []
    inside = False
    for line in assembly.splitlines():
        text = line.split("//")[0].split("#")[0].strip()
        if text.endswith(":") and text[:-1].strip('"') == function:
            inside = True
        elif inside and text.startswith(".Lfunc_end"):
            break
        elif inside and text:
            body.append(text)
    labels = {t[:-1]: i for i, t in enumerate(body) if t.endswith(":")}
    loops = []
    for i, t in enumerate(body):
        target = t.replace(",", " ").split()[-1]
        if not t.endswith(":") and target in labels and labels[target] < i:
            span = body[labels[target] + 1 : i + 1]
            if not any(x.endswith(":") for x in span):  # one block: the loop's own back edge
                loops.append(sum(_is_instruction(x) for x in span))
    if not loops:
        raise CodegenError(f"no loop found in the machine code of {function}")
    return min(loops)


def _is_instruction(text: str) -> bool:
    """Whether an assembly line (comments stripped) is an instruction, not a label or
    directive."""
    return bool(text) and not text.endswith(":") and not text.startswith(".")


def module_ir(kernels: Sequence[Kernel], triple: str) -> str:
    """LLVM IR text of one module holding ``kernels``."""
    mod = ir.Module(name="aotune_microbench")
    mod.triple = triple
    seen: set[str] = set()
    for k in kernels:
        if k.name not in seen:
            seen.add(k.name)
            k.emit(mod)
    return str(mod)


class MicroBench:
    """``kernels`` JIT-compiled for the host ``hw`` (the CPU that will run them)."""

    def __init__(self, kernels: Sequence[Kernel], hw: HwSpec) -> None:
        with _LLVM_LOCK:
            tm = target_machine(hw, jit=True)
            mod = _parsed(module_ir(kernels, hw.isa.triple))
            self._engine = llvm.create_mcjit_compiler(mod, tm)
            self._engine.finalize_object()
            self.addresses = {k.name: self._engine.get_function_address(k.name) for k in kernels}
        self._assembly = assembly_for(kernels, hw)
        self._calls = {name: _CALL(addr) for name, addr in self.addresses.items()}

    def call(self, kernel: Kernel, *args: int) -> None:
        """Run ``kernel`` on this thread with up to 8 integer arguments (the rest are 0)."""
        self._calls[kernel.name](*args, *([0] * (ARGS - len(args))))

    def loop_instructions(self, kernel: Kernel) -> int:
        """Machine instructions in ``kernel``'s innermost loop as this host runs it."""
        return loop_instructions(self.assembly(), kernel.name)

    def assembly(self) -> str:
        """The module's assembly for this host (to check what a probe really runs)."""
        return self._assembly


def _parsed(text: str) -> llvm.ModuleRef:
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"a microbenchmark's LLVM IR is invalid: {e}") from None
    return mod


def assembly_for(kernels: Sequence[Kernel], hw: HwSpec) -> str:
    """The assembly of ``kernels`` built for ``hw`` as ``MicroBench`` builds them (no IR
    optimisation: the kernels are written as they must run), for any target, run or not."""
    with _LLVM_LOCK:
        tm = target_machine(hw)
        return tm.emit_assembly(_parsed(module_ir(kernels, hw.isa.triple)))
