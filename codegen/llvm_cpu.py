"""Schedule -> LLVM IR (text) for a CPU contraction kernel, built with llvmlite.ir.

Structure of the generated module (all sizes and strides are compile-time constants):

    void <entry>(float* A, float* B, float* C, float* bias, i64 lo, i64 hi, float* ws_a,
                 float* ws_b)
        batch loops (independent GEMMs, pointers offset per entry), then three cache-block loops
        over m (mc), n (nc), k (kc) in the schedule's order, the parallel one restricted to
        [lo, hi); A/B blocks packed into panels where the schedule says so; then jr over nr
        columns, ir over mr rows, calling a micro-kernel variant:
    void ukernel_<rows>x<cols>(float* a, float* b, float* c, i64 kc, i1 first[, i1 last,
                               float* bias] [, i64* row_off, i64* k_off])
        rows x ceil(cols/lanes) accumulator vectors from zero, explicit llvm.fma per (row, vector),
        C added at the end unless this is the first k block (first), the k loop unrolled (and
        split c_prefetch_steps before its end, where the C tile is prefetched); the last
        vector of a column tail is the narrowest power-of-two width that holds it (a scalar for one
        column), loaded/stored with a lane mask where it overhangs. With an epilogue, the store of
        the last k block adds bias[n] and applies the activation.
        A is a broadcast scalar per (row, k), or, when A is shared along the columns (NHWC
        depthwise), a vector at a + row_off[r] + k_off[k], loaded in place like B.

    void <entry>_pad(float* src, float* dst, i64* rows, -, i64 lo, i64 hi, -, -)   (padded copy)
        copies the input rows rows[lo:hi] into the interior of a zero-bordered buffer, before the
        kernel: per thread, into its own buffer, the rows its share reads (codegen/launch.py).

Remainders: one variant for full tiles and one for the m tail, the n tail and both, because the
tails of M and N are known when the kernel is generated. A gathered operand (a convolution window)
is packed through constant offset tables, with bounds checks unless it was padded first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import llvmlite.ir as ir
import numpy as np
from aotune.codegen.schedule import (
    CpuSchedule,
    Gather,
    column_vector_widths,
    last_vector_lanes_used,
)

F32 = ir.FloatType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PF32 = F32.as_pointer()
PI64 = I64.as_pointer()
PI8 = ir.IntType(8).as_pointer()
# fp32 elements per prefetch: 64-byte lines (with longer lines the extra prefetches hit one line)
LINE_FLOATS = 16
F32_BYTES = 4
# ln(FLT_MAX) rounded up to a float32: e^x's 2^n is then at most 2^128, whose bits are +inf
EXP_OVERFLOW = 88.72283935546875


def c64(v: int) -> ir.Constant:
    """An i64 constant."""
    return ir.Constant(I64, v)


@contextmanager
def counted_loop(
    b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int, name: str
) -> Iterator[ir.Value]:
    """``for (iv = start; iv < stop; iv += step)``; yields the induction variable inside the
    body."""
    fn = b.function
    head, body, done = (fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
    pre = b.block
    b.branch(head)
    b.position_at_end(head)
    iv = b.phi(I64, name=name)
    iv.add_incoming(start, pre)
    b.cbranch(b.icmp_signed("<", iv, stop), body, done)
    b.position_at_end(body)
    yield iv
    iv.add_incoming(b.add(iv, c64(step)), b.block)
    b.branch(head)
    b.position_at_end(done)


def splat(b: ir.IRBuilder, x: ir.Value, ty: ir.VectorType) -> ir.Value:
    """``x`` in every lane of a vector of type ``ty``."""
    undef = ir.Constant(ty, ir.Undefined)
    return b.shuffle_vector(
        b.insert_element(undef, x, ir.Constant(I32, 0)),
        undef,
        ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count),
    )


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Signed minimum."""
    return b.select(b.icmp_signed("<", x, y), x, y)


class CpuKernelBuilder:
    """Emits one module for one schedule."""

    def __init__(self, s: CpuSchedule, entry: str, triple: str) -> None:
        self.s, self.entry = s, entry
        self.vec = ir.VectorType(F32, s.lanes)
        self.pvec = self.vec.as_pointer()
        self.mask_ty = ir.VectorType(I1, s.lanes)
        self.module = ir.Module(name=entry)
        self.module.triple = triple
        self.mload = self.masked_load_fn(s.lanes)
        self.mstore = self.masked_store_fn(s.lanes)
        self.ukernels: dict[tuple[int, int], ir.Function] = {}
        self.prefetch = ir.Function(
            self.module,
            ir.FunctionType(ir.VoidType(), [PI8, I32, I32, I32]),
            name="llvm.prefetch.p0",
        )

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """The declaration of LLVM intrinsic ``name``, made once per module."""
        if name in self.module.globals:
            return self.module.globals[name]
        return ir.Function(self.module, ir.FunctionType(ret, args), name=name)

    def vector_fn(self, op: str, width: int, arity: int) -> ir.Function:
        """``llvm.<op>.v<width>f32`` taking ``arity`` vectors (fma, exp)."""
        ty = ir.VectorType(F32, width)
        return self.intrinsic(f"llvm.{op}.v{width}f32", ty, [ty] * arity)

    def masked_load_fn(self, width: int) -> ir.Function:
        """``llvm.masked.load`` of ``width`` floats."""
        ty = ir.VectorType(F32, width)
        return self.intrinsic(
            f"llvm.masked.load.v{width}f32.p0",
            ty,
            [ty.as_pointer(), I32, ir.VectorType(I1, width), ty],
        )

    def masked_store_fn(self, width: int) -> ir.Function:
        """``llvm.masked.store`` of ``width`` floats."""
        ty = ir.VectorType(F32, width)
        return self.intrinsic(
            f"llvm.masked.store.v{width}f32.p0",
            ir.VoidType(),
            [ty, ty.as_pointer(), I32, ir.VectorType(I1, width)],
        )

    # ---- micro-kernel ----------------------------------------------------------------------------
    def a_strides(self) -> tuple[int, int]:
        """(row stride, k stride) of the A operand the micro-kernel reads."""
        if self.s.a_panel_row_major:
            return (self.s.kc, 1)
        return (1, self.s.mr) if self.s.pack_a else (self.s.a_sm, self.s.a_sk)

    def b_stride(self) -> int:
        """k stride of the B operand the micro-kernel reads (columns are contiguous)."""
        return self.s.nr if self.s.pack_b else self.s.b_sk

    def ukernel(self, rows: int, cols: int) -> ir.Function:
        """The micro-kernel for a rows x cols tile (cols <= nr), created once."""
        key = (rows, cols)
        if key in self.ukernels:
            return self.ukernels[key]
        s = self.s
        lanes = s.lanes
        widths = column_vector_widths(cols, lanes)
        nvec = len(widths)
        tail = last_vector_lanes_used(cols, lanes)
        vtys = [ir.VectorType(F32, w) for w in widths]
        # the last vector is masked only where its power-of-two width overhangs the tile
        mask = (
            ir.Constant(
                ir.VectorType(I1, widths[-1]), [1 if i < tail else 0 for i in range(widths[-1])]
            )
            if tail < widths[-1]
            else None
        )
        params = (
            [PF32, PF32, PF32, I64, I1]
            + ([I1, PF32] if s.has_epilogue else [])
            + ([PI64, PI64] if s.a_shared else [])
        )
        fn = ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), params), name=f"ukernel_{rows}x{cols}"
        )
        fn.linkage = "internal"
        fn.attributes.add("noinline")  # keeps each variant a symbol of its own for the asm features
        for arg in fn.args[:3]:
            arg.add_attribute("noalias")
        a_ptr, b_ptr, c_ptr, kc, first = fn.args[:5]
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        acc = [[b.alloca(vtys[v], name=f"acc{r}_{v}") for v in range(nvec)] for r in range(rows)]
        zeros = [ir.Constant(t, [0.0] * t.count) for t in vtys]
        fmas = [self.vector_fn("fma", w, 3) for w in widths]
        a_rs, a_cs = self.a_strides()
        b_rs = self.b_stride()
        c_rs = s.c_sm

        def vptr(base: ir.Value, offset: ir.Value, v: int) -> ir.Value:
            return b.bitcast(b.gep(base, [offset], inbounds=True), vtys[v].as_pointer())

        def load_vec(base: ir.Value, offset: ir.Value, v: int, masked: bool) -> ir.Value:
            if masked and v == nvec - 1 and mask is not None:
                return b.call(
                    self.masked_load_fn(widths[v]),
                    [vptr(base, offset, v), ir.Constant(I32, 4), mask, zeros[v]],
                )
            return b.load(vptr(base, offset, v), align=4)

        # The accumulators start from zero and C is added at the end, as BLAS kernels do: loaded
        # first, C would hold the FMA chains back whenever its loads wait for the last call's
        # stores, which they do when the rows alias them (a page apart: 1.3-1.5x slower calls).
        for r in range(rows):
            for v in range(nvec):
                b.store(zeros[v], acc[r][v])

        # B panels are zero-padded to nr columns, so only unpacked B needs masked loads.
        b_masked = not s.pack_b
        if (
            s.a_shared
        ):  # A(row, k) vectors sit at a + row_off[r] + k_off[k]; the row offsets are per call
            row_tab, k_tab = fn.args[-2:]
            a_rows = [b.load(b.gep(row_tab, [c64(r)], inbounds=True)) for r in range(rows)]

        def prefetch_b(b_at: ir.Value, t: int) -> None:
            # one prefetch per cache line of the row b_prefetch_rows ahead (prefetches never fault,
            # so rows past the operand's end are harmless: no inbounds)
            ahead = (t + s.b_prefetch_rows) * b_rs
            locality = 3 if s.b_prefetch_level == 1 else 2  # LLVM: 3 keeps it in L1, 2 in L2
            for col in range(0, cols, LINE_FLOATS):
                at = b.gep(b_at, [c64(ahead + col)])
                b.call(
                    self.prefetch,
                    [
                        b.bitcast(at, PI8),
                        ir.Constant(I32, 0),
                        ir.Constant(I32, locality),
                        ir.Constant(I32, 1),
                    ],
                )

        def at_step(base: ir.Value, k: ir.Value, stride: int) -> ir.Value:
            # as an integer, LLVM steps the address in a register of its own; from a GEP it folds
            # k into an index register, and FMAs with an indexed operand run slower on Intel cores
            at = b.add(b.ptrtoint(base, I64), b.mul(k, c64(stride * F32_BYTES)))
            return b.inttoptr(at, PF32)

        def k_step(k0: ir.Value, t: int, a_at: ir.Value | None, b_at: ir.Value) -> None:
            """Step k0 + t, with A's and B's step k0 at ``a_at`` (None: gathered A) and ``b_at``."""
            if s.b_prefetch_rows:
                prefetch_b(b_at, t)
            bvec = [load_vec(b_at, c64(t * b_rs + v * lanes), v, b_masked) for v in range(nvec)]
            if s.a_shared:
                k = b.add(k0, c64(t)) if t else k0
                k_off = b.load(b.gep(k_tab, [k], inbounds=True))
                for r in range(rows):
                    at = b.add(a_rows[r], k_off)
                    for v in range(nvec):
                        avec = load_vec(a_ptr, b.add(at, c64(v * lanes)), v, True)
                        cur = b.load(acc[r][v])
                        b.store(b.call(fmas[v], [avec, bvec[v], cur]), acc[r][v])
                return
            assert a_at is not None
            for r in range(rows):
                a_val = b.load(b.gep(a_at, [c64(t * a_cs + r * a_rs)], inbounds=True), align=4)
                a_vecs = {w: splat(b, a_val, ir.VectorType(F32, w)) for w in dict.fromkeys(widths)}
                for v in range(nvec):
                    cur = b.load(acc[r][v])
                    b.store(b.call(fmas[v], [a_vecs[widths[v]], bvec[v], cur]), acc[r][v])

        def prefetch_c() -> None:
            # for writing, into L1: a line per 16 columns and the row's last element's, so a row
            # that starts inside a line gets its last line too (C is not padded: in bounds)
            for r in range(rows):
                for col in sorted({*range(0, cols, LINE_FLOATS), cols - 1}):
                    at = b.bitcast(b.gep(c_ptr, [c64(r * c_rs + col)], inbounds=True), PI8)
                    write, keep = ir.Constant(I32, 1), ir.Constant(I32, 3)
                    b.call(self.prefetch, [at, write, keep, ir.Constant(I32, 1)])

        u = s.unroll
        k_main = b.mul(b.sdiv(kc, c64(u)), c64(u)) if u > 1 else kc

        def k_steps(k0: ir.Value, count: int) -> None:
            a_at = None if s.a_shared else at_step(a_ptr, k0, a_cs)
            b_at = at_step(b_ptr, k0, b_rs)
            for t in range(count):
                k_step(k0, t, a_at, b_at)

        # the k steps before C's lines are fetched, then the last ``lead`` (or all) of them
        lead = -(-s.c_prefetch_steps // u) * u
        k_split = (
            b.select(b.icmp_signed(">", k_main, c64(lead)), b.sub(k_main, c64(lead)), c64(0))
            if lead
            else k_main
        )
        with counted_loop(b, c64(0), k_split, u, "k") as k:
            k_steps(k, u)
        if lead:
            prefetch_c()
            with counted_loop(b, k_split, k_main, u, "klast") as k:
                k_steps(k, u)
        if u > 1:
            with counted_loop(b, k_main, kc, 1, "krem") as k:
                k_steps(k, 1)

        def store_tile(epilogue: bool, add_c: bool) -> None:
            bias_vec = (
                [load_vec(fn.args[6], c64(v * lanes), v, True) for v in range(nvec)]
                if epilogue and s.bias
                else None
            )
            for r in range(rows):
                for v in range(nvec):
                    val = b.load(acc[r][v])
                    if add_c:
                        val = b.fadd(val, load_vec(c_ptr, c64(r * c_rs + v * lanes), v, True))
                    if epilogue:
                        val = self.epilogue(b, val, bias_vec[v] if bias_vec else None)
                    ptr = vptr(c_ptr, c64(r * c_rs + v * lanes), v)
                    if v == nvec - 1 and mask is not None:
                        b.call(
                            self.masked_store_fn(widths[v]), [val, ptr, ir.Constant(I32, 4), mask]
                        )
                    else:
                        b.store(val, ptr, align=4)

        def finish(add_c: bool) -> None:
            if s.has_epilogue:
                with b.if_else(fn.args[5]) as (then, otherwise):  # the last k block ends the tile
                    with then:
                        store_tile(True, add_c)
                    with otherwise:
                        store_tile(False, add_c)
            else:
                store_tile(False, add_c)

        with b.if_else(first) as (then, otherwise):  # the first k block overwrites C
            with then:
                finish(False)
            with otherwise:
                finish(True)
        b.ret_void()
        self.ukernels[key] = fn
        return fn

    def epilogue(self, b: ir.IRBuilder, val: ir.Value, bias: ir.Value | None) -> ir.Value:
        """``act(val + bias)`` on one vector of a finished output tile (any width)."""
        width = val.type.count

        def const(x: float) -> ir.Constant:
            return ir.Constant(val.type, [x] * width)

        if bias is not None:
            val = b.fadd(val, bias)
        act = self.s.activation
        if act == "relu":  # not maxnum, which drops a NaN as numpy's maximum does not
            return b.select(b.fcmp_ordered("<", val, const(0.0)), const(0.0), val)
        if act == "sigmoid":  # 1 / (1 + e^-x): e^-x overflows to inf past x = -88.7, giving 0
            e = self.exp(b, b.fsub(const(0.0), val))
            return b.fdiv(const(1.0), b.fadd(const(1.0), e))
        if (
            act == "gelu"
        ):  # 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), tanh(u) = 1 - 2/(e^2u + 1)
            x3 = b.fmul(b.fmul(val, val), val)
            u = b.fmul(const(0.7978845608028654), b.fadd(val, b.fmul(const(0.044715), x3)))
            e2u = self.exp(b, b.fmul(const(2.0), u))
            tanh = b.fsub(const(1.0), b.fdiv(const(2.0), b.fadd(e2u, const(1.0))))
            return b.fmul(b.fmul(const(0.5), val), b.fadd(const(1.0), tanh))
        return val

    def exp(self, b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        """e^x on a vector, inline: the activations' exp as a polynomial in the vector registers
        (llvm.exp would become one libm call per lane). x = n ln2 + r with |r| <= ln2/2, e^r by
        Cephes' degree-6 expf polynomial (about 1 ulp), times 2^n built in the exponent bits.
        x is clamped to [-87, ln(FLT_MAX)], so 2^n is a normal float or, at n = 128, the bits of
        +inf: e^x overflows as numpy's float32 exp does (a sigmoid below -88.7 is 0, not e^-88);
        NaN passes through the clamps."""
        width = x.type.count
        fty, ity = x.type, ir.VectorType(I32, width)

        def const(v: float) -> ir.Constant:
            return ir.Constant(fty, [v] * width)

        fma = self.vector_fn("fma", width, 3)
        x = b.select(b.fcmp_ordered(">", x, const(EXP_OVERFLOW)), const(EXP_OVERFLOW), x)
        x = b.select(b.fcmp_ordered("<", x, const(-87.0)), const(-87.0), x)
        n = b.call(self.vector_fn("rint", width, 1), [b.fmul(x, const(1.4426950408889634))])
        r = b.call(fma, [n, const(-0.693359375), x])  # ln2 in two parts: n * hi is exact
        r = b.call(fma, [n, const(2.12194440e-4), r])
        p = const(1.9875691500e-4)
        for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 0.5):
            p = b.call(fma, [p, r, const(c)])
        er = b.fadd(b.call(fma, [b.fmul(p, r), r, r]), const(1.0))  # 1 + r + r^2 p(r)
        bits = b.shl(
            b.add(b.fptosi(n, ity), ir.Constant(ity, [127] * width)), ir.Constant(ity, [23] * width)
        )
        return b.fmul(er, b.bitcast(bits, fty))

    # ---- packing ---------------------------------------------------------------------------------
    def table(self, name: str, values: np.ndarray, ty: ir.IntType) -> ir.GlobalVariable:
        """A constant array in the module (offset and index tables of a gathered operand)."""
        arr = ir.ArrayType(ty, len(values))
        g = ir.GlobalVariable(self.module, arr, name=name)
        g.global_constant = True
        g.linkage = "internal"
        g.initializer = ir.Constant(arr, [int(v) for v in values])
        return g

    def gatherer(
        self, name: str, gather: Gather
    ) -> Callable[[ir.IRBuilder, ir.Value, ir.Value, ir.Value], ir.Value]:
        """fetch(b, base, row, k): element (row, k) of a gathered operand, 0 outside the tensor.

        Offsets come from per-row and per-k tables; a read outside the tensor loads element 0
        instead (always valid) and is replaced by zero, so no branch sits in the packing loop.
        """
        offset = self.gather_offsets(name, gather)

        def fetch(b: ir.IRBuilder, base: ir.Value, row: ir.Value, k: ir.Value) -> ir.Value:
            off, inside = offset(b, row, k)
            if inside is None:
                return b.load(b.gep(base, [off], inbounds=True))
            val = b.load(b.gep(base, [b.select(inside, off, c64(0))], inbounds=True))
            return b.select(inside, val, ir.Constant(F32, 0.0))

        return fetch

    def gather_offsets(
        self, name: str, gather: Gather
    ) -> Callable[[ir.IRBuilder, ir.Value, ir.Value], tuple[ir.Value, ir.Value | None]]:
        """offset(b, row, k) -> (element offset, inside or None when nothing is guarded), from
        tables."""
        offset = self.gather_offsets_lane_guard(name, gather, None)

        def whole(b: ir.IRBuilder, row: ir.Value, k: ir.Value) -> tuple[ir.Value, ir.Value | None]:
            off, inside, _ = offset(b, row, k)
            return off, inside

        return whole

    def gather_offsets_lane_guard(
        self, name: str, gather: Gather, lane_dim: int | None
    ) -> Callable[
        [ir.IRBuilder, ir.Value, ir.Value], tuple[ir.Value, ir.Value | None, ir.Value | None]
    ]:
        """offset(b, row, k) -> (element offset, inside, index along ``lane_dim``): inside covers
        every guard but ``lane_dim``'s (None when none is left), whose index (i32) the caller
        checks per lane; None for the index when ``lane_dim`` is None."""
        row_off, k_off, guards = gather.tables()
        g_row = self.table(f"{name}_row_off", row_off, I64)
        g_k = self.table(f"{name}_k_off", k_off, I64)
        g_guards = [
            (
                self.table(f"{name}_row_idx{d}", ri, I32),
                self.table(f"{name}_k_idx{d}", ki, I32),
                bound,
                dim,
            )
            for d, (dim, (ri, ki, bound)) in enumerate(zip(gather.guarded, guards))
        ]

        def at(b: ir.IRBuilder, g: ir.GlobalVariable, i: ir.Value) -> ir.Value:
            return b.load(b.gep(g, [ir.Constant(I32, 0), i], inbounds=True))

        def offset(
            b: ir.IRBuilder, row: ir.Value, k: ir.Value
        ) -> tuple[ir.Value, ir.Value | None, ir.Value | None]:
            off = b.add(at(b, g_row, row), at(b, g_k, k))
            inside, lane_idx = None, None
            for g_ri, g_ki, bound, dim in g_guards:  # 0 <= idx < bound as one unsigned compare
                idx = b.add(at(b, g_ri, row), at(b, g_ki, k))
                if dim == lane_dim:
                    lane_idx = idx
                    continue
                ok = b.icmp_unsigned("<", idx, ir.Constant(I32, bound))
                inside = ok if inside is None else b.and_(inside, ok)
            return off, inside, lane_idx

        return offset

    def pack_prologue(self, name: str) -> tuple[ir.Function, ir.IRBuilder]:
        """An internal ``name(src, ws, outer0, k0, outer_len, k_len)`` packing function and its
        builder."""
        fn = ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [PF32, PF32, I64, I64, I64, I64]), name=name
        )
        fn.linkage = "internal"
        return fn, ir.IRBuilder(fn.append_basic_block("entry"))

    def pack_a_runs_fn(self) -> ir.Function:
        """pack_a(A, ws, ic, pc, m_len, k_len) for a gathered A:
        ws[p*mr*kc + r*kc + k] = A(ic + p*mr + r, pc + k).

        Row-major panels: k runs that are contiguous in A (a window's channels) are copied by an
        inner loop LLVM vectorises; a run outside the tensor is written as zeros.
        """
        s = self.s
        g = s.a_gather
        assert g is not None
        run = s.a_pack_run  # 1 works too: runs of one element
        fn, b = self.pack_prologue("pack_a")
        A, ws, ic, pc, m_len, k_len = fn.args
        fetch_offset = self.gather_offsets("a", g)
        with counted_loop(b, c64(0), m_len, 1, "row") as row:
            p = b.sdiv(row, c64(s.mr))
            r = b.srem(row, c64(s.mr))
            dst_row = b.add(b.mul(p, c64(s.mr * s.kc)), b.mul(r, c64(s.kc)))
            gi = b.add(ic, row)
            self.copy_runs(
                b,
                A,
                pc,
                b.add(pc, k_len),
                run,
                lambda k: fetch_offset(b, gi, k),
                lambda k: b.gep(ws, [b.add(dst_row, b.sub(k, pc))], inbounds=True),
            )
        b.ret_void()
        return fn

    def pack_a_fn(self) -> ir.Function:
        """pack_a(A, ws, ic, pc, m_len, k_len):
        ws[p*mr*kc + k*mr + r] = A[ic + p*mr + r, pc + k]."""
        s = self.s
        if s.a_panel_row_major:  # a gathered A
            return self.pack_a_runs_fn()
        fn, b = self.pack_prologue("pack_a")
        if s.mr > 1:
            # stores mr apart: LLVM vectorises them as scatters, slower than a copy one element at
            # a time (Zen 5: 1.1-1.5x the kernel's time where packing weighs); out of line, so the
            # attribute that keeps the copy scalar stays on the copy alone
            fn.attributes.add("noimplicitfloat")
            fn.attributes.add("noinline")
        A, ws, ic, pc, m_len, k_len = fn.args
        with counted_loop(b, c64(0), m_len, 1, "row") as row:
            p = b.sdiv(row, c64(s.mr))
            r = b.srem(row, c64(s.mr))
            src_row = b.add(b.mul(b.add(ic, row), c64(s.a_sm)), b.mul(pc, c64(s.a_sk)))
            dst_row = b.add(b.mul(p, c64(s.mr * s.kc)), r)
            if s.a_pack_prefetch_rows:
                # the lines of the row a_pack_prefetch_rows ahead (the last row's, past the block's
                # end), for reading, into L1: a line per 16 elements and the segment's last one's
                ahead = smin(b, b.add(row, c64(s.a_pack_prefetch_rows)), b.sub(m_len, c64(1)))
                at_row = b.add(b.mul(b.add(ic, ahead), c64(s.a_sm)), pc)
                read, keep, data = (ir.Constant(I32, x) for x in (0, 3, 1))

                def prefetch_a(col: ir.Value) -> None:
                    at = b.gep(A, [b.add(at_row, col)], inbounds=True)
                    b.call(self.prefetch, [b.bitcast(at, PI8), read, keep, data])

                with counted_loop(b, c64(0), k_len, LINE_FLOATS, "pf") as col:
                    prefetch_a(col)
                prefetch_a(b.sub(k_len, c64(1)))
            with counted_loop(b, c64(0), k_len, 1, "k") as k:
                val = b.load(b.gep(A, [b.add(src_row, b.mul(k, c64(s.a_sk)))], inbounds=True))
                b.store(val, b.gep(ws, [b.add(dst_row, b.mul(k, c64(s.mr)))], inbounds=True))
        b.ret_void()
        return fn

    @staticmethod
    def for_each_run(
        b: ir.IRBuilder,
        lo: ir.Value,
        hi: ir.Value,
        run: int,
        body: Callable[[ir.Value, ir.Value], None],
    ) -> None:
        """``body(first, length)`` for each piece of [lo, hi) cut at multiples of ``run``."""
        with counted_loop(
            b, b.sdiv(lo, c64(run)), b.sdiv(b.add(hi, c64(run - 1)), c64(run)), 1, "run"
        ) as ri:
            start = b.mul(ri, c64(run))
            first = b.select(b.icmp_signed("<", start, lo), lo, start)
            body(first, b.sub(smin(b, b.add(start, c64(run)), hi), first))

    def copy_runs(
        self,
        b: ir.IRBuilder,
        base: ir.Value,
        lo: ir.Value,
        hi: ir.Value,
        run: int,
        source: Callable[[ir.Value], tuple[ir.Value, ir.Value | None]],
        dest: Callable[[ir.Value], ir.Value],
    ) -> None:
        """Copy indices [lo, hi), which are contiguous in ``base`` within each aligned block of
        ``run``: one vectorisable copy per block, from ``source(first index)`` to
        ``dest(first index)``."""

        def copy(first: ir.Value, length: ir.Value) -> None:
            off, inside = source(first)
            self.copy_run(b, base, off, inside, dest(first), length)

        self.for_each_run(b, lo, hi, run, copy)

    def copy_short_run(
        self,
        b: ir.IRBuilder,
        base: ir.Value,
        off: ir.Value,
        inside: ir.Value | None,
        dst: ir.Value,
        n: ir.Value,
        lane_guard: tuple[ir.Value, int] | None = None,
    ) -> None:
        """``copy_run`` for short runs (an NCHW output row: 7 to 112 pixels), one masked vector load
        and store per ``lanes`` elements: LLVM's vectorised loop would copy most of such a run in
        its scalar remainder. (Long runs, such as NHWC channels, go faster through ``copy_run``.)
        ``lane_guard`` = (index of the run's first element along a guarded dim the run walks,
        bound): lanes whose index leaves [0, bound) load zero (padding at a row's ends)."""
        lanes = self.s.lanes
        # 32-bit lane indices: one vector register per mask compare (a run is far below 2^31)
        lane_ids = ir.Constant(ir.VectorType(I32, lanes), list(range(lanes)))
        zero = ir.Constant(self.vec, [0.0] * lanes)
        with counted_loop(b, c64(0), n, lanes, "copy") as t_:
            t32 = b.trunc(t_, I32)
            left = b.trunc(b.sub(n, t_), I32)
            in_run = b.icmp_signed("<", lane_ids, splat(b, left, lane_ids.type))
            # a masked-off lane never touches memory, so a run outside the tensor loads nothing
            load_mask = in_run if inside is None else b.and_(in_run, splat(b, inside, self.mask_ty))
            if lane_guard is not None:
                first_idx, bound = lane_guard
                idx = b.add(lane_ids, splat(b, b.add(first_idx, t32), lane_ids.type))
                limit = splat(b, ir.Constant(I32, bound), lane_ids.type)
                load_mask = b.and_(load_mask, b.icmp_unsigned("<", idx, limit))
            src = b.bitcast(b.gep(base, [b.add(off, t_)]), self.pvec)
            val = b.call(self.mload, [src, ir.Constant(I32, 4), load_mask, zero])
            out = b.bitcast(b.gep(dst, [t_], inbounds=True), self.pvec)
            # a whole vector is a plain store: AVX2's masked store (vmaskmovps) is microcoded on
            # AMD cores, and where the run's length is not a constant LLVM cannot drop the mask
            whole = b.icmp_signed(">=", left, ir.Constant(I32, lanes))
            with b.if_else(whole) as (then, otherwise):
                with then:
                    b.store(val, out, align=4)
                with otherwise:
                    b.call(self.mstore, [val, out, ir.Constant(I32, 4), in_run])

    def copy_run(
        self,
        b: ir.IRBuilder,
        base: ir.Value,
        off: ir.Value,
        inside: ir.Value | None,
        dst: ir.Value,
        n: ir.Value,
    ) -> None:
        """dst[0:n] = base[off:off+n], or zeros where the run lies outside the tensor (a
        vectorisable loop)."""

        def copy() -> None:
            src = b.gep(base, [off], inbounds=True)
            with counted_loop(b, c64(0), n, 1, "copy") as t_:
                b.store(b.load(b.gep(src, [t_], inbounds=True)), b.gep(dst, [t_], inbounds=True))

        if inside is None:
            copy()
            return
        with b.if_else(inside) as (then, otherwise):
            with then:
                copy()
            with otherwise:
                with counted_loop(b, c64(0), n, 1, "zero") as t_:
                    b.store(ir.Constant(F32, 0.0), b.gep(dst, [t_], inbounds=True))

    def pack_b_runs_fn(self) -> ir.Function:
        """pack_b for a gathered B whose columns run contiguously (NCHW pixels of one output row at
        stride 1): each run of a panel's columns is copied down all k rows, the columns past N
        zero-filled. Runs outside, k inside: a run's bounds and masks are worked out once per panel,
        not once per k row, which was most of the packing's instructions. A run may cross the
        width's zero padding (read in place): those lanes are masked off."""
        s = self.s
        g = s.b_gather
        assert g is not None
        run = s.b_pack_run
        fn, b = self.pack_prologue("pack_b")
        B, ws, jc, pc, n_len, k_len = fn.args
        lane_dim = g.lane_guard_dim
        lane_bound = g.dims[lane_dim] if lane_dim is not None else 0
        offset = self.gather_offsets_lane_guard("b", g, lane_dim)
        n_pad = b.mul(b.sdiv(b.add(n_len, c64(s.nr - 1)), c64(s.nr)), c64(s.nr))
        with counted_loop(b, c64(0), n_pad, s.nr, "q") as q0:
            panel = b.mul(b.sdiv(q0, c64(s.nr)), c64(s.nr * s.kc))
            cols = smin(b, c64(s.nr), b.sub(n_len, q0))
            g_lo = b.add(jc, q0)
            g_hi = b.add(g_lo, cols)

            def copy_down_k(first: ir.Value, length: ir.Value) -> None:
                dst_first = b.add(panel, b.sub(first, g_lo))
                with counted_loop(b, c64(0), k_len, 1, "k") as k:
                    off, inside, lane_idx = offset(b, first, b.add(pc, k))
                    dst = b.gep(ws, [b.add(dst_first, b.mul(k, c64(s.nr)))], inbounds=True)
                    guard = None if lane_idx is None else (lane_idx, lane_bound)
                    self.copy_short_run(b, B, off, inside, dst, length, guard)

            self.for_each_run(b, g_lo, g_hi, run, copy_down_k)
            with counted_loop(b, c64(0), k_len, 1, "k") as k:
                dst_row = b.add(panel, b.mul(k, c64(s.nr)))
                with counted_loop(b, cols, c64(s.nr), 1, "pad") as c:
                    b.store(ir.Constant(F32, 0.0), b.gep(ws, [b.add(dst_row, c)], inbounds=True))
        b.ret_void()
        return fn

    def pack_b_fn(self) -> ir.Function:
        """pack_b(B, ws, jc, pc, n_len, k_len):
        ws[q*nr*kc + k*nr + c] = B[pc + k, jc + q*nr + c], 0-padded."""
        s = self.s
        if s.b_pack_run > 1:
            return self.pack_b_runs_fn()
        if s.b_pack_copies_vectors:
            return self.pack_b_rows_fn()
        fn, b = self.pack_prologue("pack_b")
        B, ws, jc, pc, n_len, k_len = fn.args
        fetch = self.gatherer("b", s.b_gather) if s.b_gather else None
        n_pad = b.mul(b.sdiv(b.add(n_len, c64(s.nr - 1)), c64(s.nr)), c64(s.nr))
        with counted_loop(b, c64(0), n_pad, s.nr, "q") as q0:
            panel = b.mul(b.sdiv(q0, c64(s.nr)), c64(s.nr * s.kc))
            with counted_loop(b, c64(0), k_len, 1, "k") as k:
                src = b.add(b.mul(b.add(pc, k), c64(s.b_sk)), b.mul(b.add(jc, q0), c64(s.b_sn)))
                dst = b.add(panel, b.mul(k, c64(s.nr)))
                with counted_loop(b, c64(0), c64(s.nr), 1, "c") as c:
                    inside = b.icmp_signed("<", b.add(q0, c), n_len)
                    with b.if_else(inside) as (then, otherwise):
                        with then:
                            if fetch is not None:
                                val = fetch(b, B, b.add(b.add(jc, q0), c), b.add(pc, k))
                            else:
                                val = b.load(
                                    b.gep(B, [b.add(src, b.mul(c, c64(s.b_sn)))], inbounds=True)
                                )
                            b.store(val, b.gep(ws, [b.add(dst, c)], inbounds=True))
                        with otherwise:
                            b.store(
                                ir.Constant(F32, 0.0), b.gep(ws, [b.add(dst, c)], inbounds=True)
                            )
        b.ret_void()
        return fn

    def pack_b_rows_fn(self) -> ir.Function:
        """pack_b for a B whose columns are contiguous: each panel row is copied as nr/lanes vectors
        (loads masked at N's edge, so the panel's columns past N are zero). The element-wise copy,
        which LLVM left scalar for 16- and 32-wide panels, took ~0.85 cycles per element from a
        B held in L3 where vectors take ~0.3 (Zen 4)."""
        s = self.s
        fn, b = self.pack_prologue("pack_b")
        B, ws, jc, pc, n_len, k_len = fn.args
        lanes, nvec = s.lanes, s.nr // s.lanes
        lane_ids = ir.Constant(ir.VectorType(I64, lanes), list(range(lanes)))
        zero = ir.Constant(self.vec, [0.0] * lanes)
        n_pad = b.mul(b.sdiv(b.add(n_len, c64(s.nr - 1)), c64(s.nr)), c64(s.nr))
        with counted_loop(b, c64(0), n_pad, s.nr, "q") as q0:
            panel = b.mul(b.sdiv(q0, c64(s.nr)), c64(s.nr * s.kc))
            cols = b.sub(n_len, q0)
            # a mask per vector of the panel, the same for every k row (all true inside N)
            masks = [
                b.icmp_signed("<", lane_ids, splat(b, b.sub(cols, c64(v * lanes)), lane_ids.type))
                for v in range(nvec)
            ]
            with counted_loop(b, c64(0), k_len, 1, "k") as k:
                src = b.add(b.mul(b.add(pc, k), c64(s.b_sk)), b.add(jc, q0))
                dst = b.add(panel, b.mul(k, c64(s.nr)))
                for v in range(nvec):
                    ptr = b.bitcast(
                        b.gep(B, [b.add(src, c64(v * lanes))], inbounds=True), self.pvec
                    )
                    val = b.call(self.mload, [ptr, ir.Constant(I32, 4), masks[v], zero])
                    b.store(
                        val,
                        b.bitcast(
                            b.gep(ws, [b.add(dst, c64(v * lanes))], inbounds=True), self.pvec
                        ),
                        align=4,
                    )
        b.ret_void()
        return fn

    def pad_fn(self) -> ir.Function:
        """<entry>_pad(src, dst, rows, -, lo, hi, -, -): copy the input rows (all dims but the
        last, flattened) that ``rows[lo:hi]`` names (an i64 table) into the interior of its
        zero-padded buffer.

        It has the entry's signature, so the worker pool can run it on the threads. The
        buffer's border is zeroed once when it is allocated and never written, so each call copies
        only the interior, row by contiguous row.
        """
        pc = self.s.pad_copy
        assert pc is not None
        fn = ir.Function(
            self.module,
            ir.FunctionType(ir.VoidType(), [PF32, PF32, PF32, PF32, I64, I64, PF32, PF32]),
            name=f"{self.entry}_pad",
        )
        src, dst, table, _, lo, hi, _, _ = fn.args
        for arg in (src, dst, table):
            arg.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        nd = len(pc.shape)
        width = pc.shape[-1]
        dst_strides = [math.prod(pc.padded[d + 1 :]) for d in range(nd)]
        row_table = b.bitcast(table, PI64)
        with counted_loop(b, lo, hi, 1, "slot") as slot:
            row = b.load(b.gep(row_table, [slot], inbounds=True))
            # the row's index in each outer dim, innermost first, and its offset in the padded
            # buffer
            dst_off, rest = c64(sum(p * st for p, st in zip(pc.lo, dst_strides))), row
            for d in reversed(range(nd - 1)):
                idx = b.urem(rest, c64(pc.shape[d])) if d else rest
                rest = b.udiv(rest, c64(pc.shape[d]))
                dst_off = b.add(dst_off, b.mul(idx, c64(dst_strides[d])))
            src_row = b.mul(row, c64(width))
            with counted_loop(b, c64(0), c64(width), 1, "col") as col:
                val = b.load(b.gep(src, [b.add(src_row, col)], inbounds=True))
                b.store(val, b.gep(dst, [b.add(dst_off, col)], inbounds=True))
        b.ret_void()
        return fn

    # ---- the entry -------------------------------------------------------------------------------
    def build(self) -> ir.Module:
        """Emit the whole module and return it."""
        s = self.s
        fn = ir.Function(
            self.module,
            ir.FunctionType(ir.VoidType(), [PF32, PF32, PF32, PF32, I64, I64, PF32, PF32]),
            name=self.entry,
        )
        A, B, C, bias, lo, hi, ws_a, ws_b = fn.args
        for arg in (A, B, C, bias, ws_a, ws_b):
            arg.add_attribute("noalias")
        if s.pad_copy is not None:
            self.pad_fn()
        pack_a = self.pack_a_fn() if s.pack_a else None
        pack_b = self.pack_b_fn() if s.pack_b else None
        a_tables = None
        if s.a_shared:
            assert s.a_gather is not None and not s.a_gather.guarded
            row_off, k_off, _ = s.a_gather.tables()
            a_tables = (self.table("a_rows", row_off, I64), self.table("a_ks", k_off, I64))
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        batch_loops = []
        for i, (extent, a_st, b_st, c_st) in enumerate(s.batch):  # independent GEMMs, outermost
            cm = counted_loop(b, c64(0), c64(extent), 1, f"batch{i}")
            idx = cm.__enter__()
            batch_loops.append(cm)
            A = b.gep(A, [b.mul(idx, c64(a_st))], inbounds=True)
            B = b.gep(B, [b.mul(idx, c64(b_st))], inbounds=True)
            C = b.gep(C, [b.mul(idx, c64(c_st))], inbounds=True)
        bounds = {"m": (c64(0), c64(s.M)), "n": (c64(0), c64(s.N)), "k": (c64(0), c64(s.K))}
        bounds[s.par] = (lo, hi)
        step = {"m": s.mc, "n": s.nc, "k": s.kc}
        start: dict[str, ir.Value] = {}
        length: dict[str, ir.Value] = {}
        entered: set[str] = set()
        stack = []

        def enter(dim: str) -> None:
            cm = counted_loop(b, bounds[dim][0], bounds[dim][1], step[dim], f"{dim}c")
            iv = cm.__enter__()
            stack.append(cm)
            start[dim] = iv
            length[dim] = smin(b, c64(step[dim]), b.sub(bounds[dim][1], iv))
            entered.add(dim)
            if pack_b is not None and dim in "nk" and {"n", "k"} <= entered:
                b.call(pack_b, [B, ws_b, start["n"], start["k"], length["n"], length["k"]])
            if pack_a is not None and dim in "mk" and {"m", "k"} <= entered:
                b.call(pack_a, [A, ws_a, start["m"], start["k"], length["m"], length["k"]])

        for dim in s.order:
            enter(dim)
        first = b.icmp_signed("==", start["k"], c64(0))
        last = b.icmp_signed("==", b.add(start["k"], length["k"]), c64(s.K))
        m_tail, n_tail = s.M % s.mr, s.N % s.nr
        with counted_loop(b, c64(0), length["n"], s.nr, "jr") as jr:
            with counted_loop(b, c64(0), length["m"], s.mr, "ir") as ir_:
                row = b.add(start["m"], ir_)
                col = b.add(start["n"], jr)
                if s.a_shared:
                    a_op = b.gep(A, [col], inbounds=True)  # unit stride along the columns
                elif s.pack_a:
                    a_op = b.gep(
                        ws_a, [b.mul(b.sdiv(ir_, c64(s.mr)), c64(s.mr * s.kc))], inbounds=True
                    )
                else:
                    a_op = b.gep(
                        A,
                        [b.add(b.mul(row, c64(s.a_sm)), b.mul(start["k"], c64(s.a_sk)))],
                        inbounds=True,
                    )
                if s.pack_b:
                    b_op = b.gep(
                        ws_b, [b.mul(b.sdiv(jr, c64(s.nr)), c64(s.nr * s.kc))], inbounds=True
                    )
                else:
                    b_op = b.gep(
                        B,
                        [b.add(b.mul(start["k"], c64(s.b_sk)), b.mul(col, c64(s.b_sn)))],
                        inbounds=True,
                    )
                c_op = b.gep(C, [b.add(b.mul(row, c64(s.c_sm)), col)], inbounds=True)
                args = [a_op, b_op, c_op, length["k"], first]
                if s.has_epilogue:
                    args += [last, b.gep(bias, [col], inbounds=True)]
                if a_tables is not None:
                    args += [
                        b.gep(a_tables[0], [c64(0), row], inbounds=True),
                        b.gep(a_tables[1], [c64(0), start["k"]], inbounds=True),
                    ]
                self._dispatch(b, row, col, m_tail, n_tail, args)
        for cm in reversed(batch_loops + stack):
            cm.__exit__(None, None, None)
        b.ret_void()
        return self.module

    def _dispatch(
        self,
        b: ir.IRBuilder,
        row: ir.Value,
        col: ir.Value,
        m_tail: int,
        n_tail: int,
        args: list[ir.Value],
    ) -> None:
        """Call the right micro-kernel variant for the tile at (row, col)."""
        s = self.s
        is_m_tail = b.icmp_signed(">", b.add(row, c64(s.mr)), c64(s.M)) if m_tail else None
        is_n_tail = b.icmp_signed(">", b.add(col, c64(s.nr)), c64(s.N)) if n_tail else None

        def call_cols(rows: int) -> None:
            if is_n_tail is None:
                b.call(self.ukernel(rows, s.nr), args)
                return
            with b.if_else(is_n_tail) as (then, otherwise):
                with then:
                    b.call(self.ukernel(rows, n_tail), args)
                with otherwise:
                    b.call(self.ukernel(rows, s.nr), args)

        if is_m_tail is None:
            call_cols(s.mr)
            return
        with b.if_else(is_m_tail) as (then, otherwise):
            with then:
                call_cols(m_tail)
            with otherwise:
                call_cols(s.mr)


def generate_ir(s: CpuSchedule, entry: str, triple: str) -> str:
    """LLVM IR text of the kernel for schedule ``s``."""
    return str(CpuKernelBuilder(s, entry, triple).build())
