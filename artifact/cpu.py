"""One tuned CPU kernel -> one object file exporting ``int NAME(in0, in1, [bias,] out)``.

The object holds the kernel's share function (``codegen/llvm_cpu.py``, entry renamed and made
internal), its padded-copy function when it has one, the static buffers the shares use (packing
workspaces and zero-bordered padded copies, one set per share), and a wrapper generated here:

    int NAME(const float *in0, const float *in1, [const float *bias,] float *out)
        NULL pointers -> AOTUNE_ERR_NULL; out overlapping an input -> AOTUNE_ERR_OVERLAP
        A, B = in0, in1 (or swapped, where the schedule made the second input A)
        __aotune_lock()
        [__aotune_run(NAME.pad, copies, pad shares)]      the zero-padded copies: per share, the
                                                          rows it reads (a static table)
        __aotune_run(NAME.share, shares, kernel shares)    the parallel loop's [lo, hi) per share
        __aotune_unlock(); return AOTUNE_OK

Every share's arguments are those ``codegen/runner.py``'s ``HostKernel`` passes, so the library
computes exactly what the final check verified. Everything but ``NAME`` is internal to the object,
so any number of kernels link into one library without clashing. Loads are unaligned-safe (the
kernel never assumes more than 4-byte alignment); aligned inputs are only faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import llvmlite.binding as llvm
import llvmlite.ir as ir
from aotune.analysis.workload import Workload
from aotune.artifact import runtime
from aotune.artifact.load import INTERFACE_SYMBOL, interface_words
from aotune.artifact.names import Names
from aotune.codegen.compile import _LLVM_LOCK, optimize, target_machine
from aotune.codegen.launch import launch_plan, page_rounded
from aotune.codegen.llvm_cpu import generate_ir
from aotune.codegen.schedule import CpuSchedule
from aotune.errors import CodegenError
from aotune.hwspecs.spec import HwSpec

F32 = ir.FloatType()
PF32 = F32.as_pointer()
I32, I64 = ir.IntType(32), ir.IntType(64)


@dataclass(frozen=True)
class Param:
    """One argument of a library function."""

    name: str  # the C parameter name
    role: str  # in0, in1, bias or out
    tensor: str  # the workload's tensor name ("bias" for the bias vector)
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def elems(self) -> int:
        """Elements of the array."""
        return math.prod(self.shape)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the manifest."""
        return {
            "name": self.name,
            "role": self.role,
            "tensor": self.tensor,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }


def params_of(workload: Workload) -> tuple[Param, ...]:
    """The library function's parameters: the workload's inputs in statement order (the order
    ``tune --json`` lists its tensors), the bias when the epilogue adds one, then the output."""
    st = workload.statement
    out = workload.tensor(st.output.tensor)
    ps = [
        Param(acc.tensor.lower(), f"in{i}", acc.tensor, workload.tensor(acc.tensor).shape)
        for i, acc in enumerate(st.inputs)
    ]
    if workload.epilogue.bias:
        ps.append(Param("bias", "bias", "bias", (out.shape[-1],)))
    ps.append(Param(out.name.lower(), "out", out.name, out.shape))
    return tuple(ps)


@dataclass(frozen=True)
class CpuKernelObject:
    """A kernel compiled into an object that exports ``name``."""

    name: str
    triple: str
    params: tuple[Param, ...]
    object_code: bytes
    launch: dict[str, Any]


def _wrapper_ir(
    name: str,
    share: str,
    s: CpuSchedule,
    params: tuple[Param, ...],
    hw: HwSpec,
    names: Names,
) -> tuple[str, dict[str, Any]]:
    """(IR text of the wrapper module, launch facts for the manifest)."""
    mod = ir.Module(name=f"{name}.wrapper")
    mod.triple = hw.isa.triple
    share_ty = runtime.SHARE_TY
    share_fn = ir.Function(mod, share_ty, name=share)
    pad_fn = ir.Function(mod, share_ty, name=f"{share}_pad") if s.pad_copy else None
    run = ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [I64, I64, I64.as_pointer()]), name=names.run
    )
    lock = ir.Function(mod, ir.FunctionType(ir.VoidType(), []), name=names.lock)
    unlock = ir.Function(mod, ir.FunctionType(ir.VoidType(), []), name=names.unlock)

    plan = launch_plan(s)  # the shares and buffers HostKernel and the emulated check run
    ranges = list(plan.shares)
    shares = plan.threads
    # static buffers: per share a packing workspace for A and for B, then the padded copies
    layout: list[tuple[str, int]] = []
    for t in range(shares):
        layout += [(f"ws_a{t}", plan.ws_a_elems), (f"ws_b{t}", plan.ws_b_elems)]
    for t in range(plan.pad_buffers):
        layout.append((f"padded{t}", plan.pad_elems))
    offsets, total = {}, 0
    for key, elems in layout:  # each buffer on pages of its own, as the runner's
        offsets[key] = total
        total += page_rounded(elems, hw.memory.page_bytes)
    buf_ty = ir.ArrayType(F32, total)
    buf = ir.GlobalVariable(mod, buf_ty, name=f"{name}.buffers")
    buf.linkage = "internal"
    buf.initializer = ir.Constant(buf_ty, None)  # zeros: a padded copy's border stays zero
    buf.align = hw.memory.page_bytes

    # the parameters (roles, shapes) it was built for, exported beside it: aotune.load checks the
    # manifest's against them
    shapes = interface_words([(p.role, p.shape) for p in params])
    shapes_ty = ir.ArrayType(I64, len(shapes))
    shapes_var = ir.GlobalVariable(mod, shapes_ty, name=INTERFACE_SYMBOL.format(name=name))
    shapes_var.global_constant = True
    shapes_var.initializer = ir.Constant(shapes_ty, shapes)

    fn = ir.Function(mod, ir.FunctionType(I32, [PF32] * len(params)), name=name)
    for arg, p in zip(fn.args, params):
        arg.name = p.name
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    addr = {p.role: b.ptrtoint(arg, I64) for arg, p in zip(fn.args, params)}
    for p in params:
        with b.if_then(b.icmp_unsigned("==", addr[p.role], ir.Constant(I64, 0)), likely=False):
            b.ret(ir.Constant(I32, runtime.ERROR_CODES["AOTUNE_ERR_NULL"]))
    out = next(p for p in params if p.role == "out")
    out_lo, out_hi = addr["out"], b.add(addr["out"], ir.Constant(I64, 4 * out.elems))
    for p in params:
        if p.role == "out":
            continue
        lo = addr[p.role]
        hi = b.add(lo, ir.Constant(I64, 4 * p.elems))
        overlap = b.and_(b.icmp_unsigned("<", out_lo, hi), b.icmp_unsigned("<", lo, out_hi))
        with b.if_then(overlap, likely=False):
            b.ret(ir.Constant(I32, runtime.ERROR_CODES["AOTUNE_ERR_OVERLAP"]))
    pa, pb = (addr["in0"], addr["in1"]) if s.a_is_first else (addr["in1"], addr["in0"])
    bias = addr.get("bias", ir.Constant(I64, 0))

    def at(key: str) -> ir.Value:
        return b.ptrtoint(b.gep(buf, [ir.Constant(I64, 0), ir.Constant(I64, offsets[key])]), I64)

    def run_shares(fn_ptr: ir.Function, rows: list[list[ir.Value]]) -> None:
        arr_ty = ir.ArrayType(I64, runtime.ARGS * len(rows))
        arr = b.alloca(arr_ty, name="shares")
        for i, row in enumerate(rows):
            for j, v in enumerate(row):
                slot = b.gep(arr, [ir.Constant(I64, 0), ir.Constant(I64, i * runtime.ARGS + j)])
                b.store(v if isinstance(v, ir.Value) else ir.Constant(I64, v), slot)
        first = b.gep(arr, [ir.Constant(I64, 0), ir.Constant(I64, 0)])
        b.call(run, [b.ptrtoint(fn_ptr, I64), ir.Constant(I64, len(rows)), first])

    b.call(lock, [])
    operands = [(pa, pb)] * shares
    if plan.pad_operand is not None:
        src = pa if plan.pad_operand == "a" else pb
        rows_ty = ir.ArrayType(I64, len(plan.pad_rows))
        rows_var = ir.GlobalVariable(mod, rows_ty, name=f"{name}.pad_rows")
        rows_var.linkage = "internal"
        rows_var.global_constant = True
        rows_var.initializer = ir.Constant(rows_ty, [int(r) for r in plan.pad_rows])
        rows = b.ptrtoint(b.gep(rows_var, [ir.Constant(I64, 0), ir.Constant(I64, 0)]), I64)
        run_shares(
            pad_fn,
            [[src, at(f"padded{buf}"), rows, 0, lo, hi, 0, 0] for buf, lo, hi in plan.pad_shares],
        )
        operands = [
            (at(f"padded{buf}"), pb) if plan.pad_operand == "a" else (pa, at(f"padded{buf}"))
            for buf in plan.padded_of_share
        ]
    run_shares(
        share_fn,
        [
            [opa, opb, addr["out"], bias, lo, hi, at(f"ws_a{t}"), at(f"ws_b{t}")]
            for t, ((opa, opb), (lo, hi)) in enumerate(zip(operands, ranges))
        ],
    )
    b.call(unlock, [])
    b.ret(ir.Constant(I32, 0))
    launch = {
        "shares": [list(r) for r in ranges],
        "parallel_loop": s.par,
        "threads": s.threads,
        "pad_copy": None
        if s.pad_copy is None
        else {
            "operand": s.pad_copy.operand,
            "padded_shape": list(s.pad_copy.padded),
            "buffers": plan.pad_buffers,  # one per share, each holding the rows it reads
            "rows_copied": [hi - lo for _, lo, hi in plan.pad_shares],
        },
        "static_bytes": 4 * total,
    }
    return str(mod), launch


def compile_library_kernel(
    name: str,
    workload: Workload,
    schedule: CpuSchedule,
    hw: HwSpec,
    names: Names = Names(),
) -> CpuKernelObject:
    """Generate and assemble the object for ``name`` on ``hw`` (no execution, any host), calling
    the runtime of ``names``."""
    params = params_of(workload)
    share = f"aotune.{name}.share"
    kernel_ir = generate_ir(schedule, share, hw.isa.triple)
    wrapper_ir, launch = _wrapper_ir(name, share, schedule, params, hw, names)
    with _LLVM_LOCK:
        tm = target_machine(hw)
        try:
            mod = llvm.parse_assembly(kernel_ir)
            mod.link_in(llvm.parse_assembly(wrapper_ir))
        except RuntimeError as e:
            raise CodegenError(f"kernel {name}: cannot link its wrapper: {e}") from None
        for f in mod.functions:
            if f.name.startswith(share):  # the share and pad functions: reached by address only
                f.linkage = "internal"
        obj = tm.emit_object(optimize(str(mod), tm))
    return CpuKernelObject(name, hw.isa.triple, params, bytes(obj), launch)


def compile_runtime(hw: HwSpec, names: Names = Names()) -> bytes:
    """The runtime's object for ``hw``; its internal entry points are hidden in a shared object."""
    with _LLVM_LOCK:
        tm = target_machine(hw)
        mod = optimize(runtime.runtime_ir(hw.isa.triple, names), tm)
        for f in mod.functions:
            if f.name in (names.run, names.lock, names.unlock):
                f.visibility = "hidden"
        return bytes(tm.emit_object(mod))
