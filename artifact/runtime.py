"""The thread runtime every CPU library carries, generated as LLVM IR (no C compiler needed).

It is the design of ``codegen/workers.py`` made self-contained: worker threads started with
pthreads from libc (not Python), each polling a 128-byte slot of its own

    slot[0] state: 0 free, 1 posted, 2 running, 3 exit;  slot[1] function;  slot[2:10] arguments

for a few milliseconds after its last job, then napping 1 ms at a time. ``__aotune_run(fn, n,
args)`` posts shares 1.. to the workers it has, runs share 0 and any share without a worker itself,
then claims each posted share nobody has taken yet (compare-and-swap 1 -> 2) or waits until its
worker is done; a napping worker never delays a call.

One kernel call runs at a time (``__aotune_lock``): the kernels' packing workspaces and padded
copies are static buffers of the library, so calls from several threads take turns. The public
part, declared in the generated header:

    int aotune_set_num_threads(int n)   threads a call may use, the caller included (n >= 1)
    int aotune_get_num_threads(void)    the current setting (default: the CPUs online)
    void aotune_shutdown(void)          stop and join the workers (a later call starts them again)
    const char *aotune_strerror(int rc) what a return code means

The workers stop by themselves when the library is unloaded (a destructor calls
``aotune_shutdown``), so ``dlclose`` never pulls code from under a running thread.
"""

from __future__ import annotations

import llvmlite.ir as ir
from aotune.artifact.names import Names, unknown_error_text
from aotune.codegen.llvm_cpu import c64, counted_loop
from aotune.codegen.workers import join_share

SLOT_WORDS = 16  # 128 bytes per slot: two cache lines, so neighbouring slots never share one
MAX_WORKERS = 255  # worker threads at most (a call uses at most its kernel's shares anyway)
SPIN_ROUNDS = 200_000  # ~2-5 ms of polling after a job before a worker naps (as workers.py)
NAP_MICROSECONDS = 1000
YIELD_EVERY = 64  # spin rounds between sched_yield calls (a power of two)
ARGS = 8  # a share's arguments: the kernel entry's (A, B, C, bias, lo, hi, ws_a, ws_b)
SC_NPROCESSORS_ONLN = 84  # glibc's sysconf name for the CPUs online, on every Linux architecture

# return codes of the library's functions, with the text aotune_strerror gives for each
ERRORS: tuple[tuple[str, str], ...] = (
    ("AOTUNE_OK", "success"),
    ("AOTUNE_ERR_NULL", "a pointer argument is NULL"),
    ("AOTUNE_ERR_OVERLAP", "the output overlaps an input; pass a separate output buffer"),
    ("AOTUNE_ERR_THREADS", "the thread count must be at least 1"),
)
UNKNOWN_ERROR = unknown_error_text(Names())  # the default prefix's
ERROR_CODES = {name: code for code, (name, _) in enumerate(ERRORS)}

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
P8, P64 = I8.as_pointer(), I64.as_pointer()
SHARE_TY = ir.FunctionType(ir.VoidType(), [I64] * ARGS)  # pointers as integers: one ABI everywhere


class _Runtime:
    """Builds the runtime module."""

    def __init__(self, triple: str, names: Names) -> None:
        self.names = names
        self.mod = ir.Module(name=f"{names.prefix}_runtime")
        self.mod.triple = triple
        m = self.mod
        self.usleep = ir.Function(m, ir.FunctionType(I32, [I32]), name="usleep")
        self.sched_yield = ir.Function(m, ir.FunctionType(I32, []), name="sched_yield")
        self.sysconf = ir.Function(m, ir.FunctionType(I64, [I32]), name="sysconf")
        self.worker_ty = ir.FunctionType(P8, [P8])
        self.pthread_create = ir.Function(
            m,
            ir.FunctionType(I32, [P64, P8, self.worker_ty.as_pointer(), P8]),
            name="pthread_create",
        )
        self.pthread_join = ir.Function(
            m, ir.FunctionType(I32, [I64, P8.as_pointer()]), name="pthread_join"
        )
        arch = triple.split("-")[0]
        # a spin-wait hint: x86's pause, AArch64's yield hint (HINT #1); neither changes results
        if arch in ("x86_64", "i686"):
            self.pause = (
                ir.Function(m, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"),
            )
        elif arch in ("aarch64", "arm64"):
            self.pause = (
                ir.Function(m, ir.FunctionType(ir.VoidType(), [I32]), "llvm.aarch64.hint"),
                ir.Constant(I32, 1),
            )
        else:
            self.pause = ()
        self.slots = self._global("aotune.slots", ir.ArrayType(I64, MAX_WORKERS * SLOT_WORDS), 128)
        self.tids = self._global("aotune.tids", ir.ArrayType(I64, MAX_WORKERS), 8)
        self.started = self._global("aotune.started", I64, 8)  # workers running
        self.wanted = self._global("aotune.wanted", I64, 8)  # threads per call; 0: CPUs online
        self.mutex = self._global("aotune.mutex", I64, 64)

    def _global(self, name: str, ty: ir.Type, align: int) -> ir.GlobalVariable:
        g = ir.GlobalVariable(self.mod, ty, name=name)
        g.linkage = "internal"
        g.initializer = ir.Constant(ty, None)
        g.align = align
        return g

    def slot(self, b: ir.IRBuilder, i: ir.Value) -> ir.Value:
        """Pointer to word 0 of worker ``i``'s slot."""
        return b.gep(self.slots, [c64(0), b.mul(i, c64(SLOT_WORDS))], inbounds=True)

    @staticmethod
    def word(b: ir.IRBuilder, base: ir.Value, i: int | ir.Value) -> ir.Value:
        return b.gep(base, [i if isinstance(i, ir.Value) else c64(i)], inbounds=True)

    def relax(self, b: ir.IRBuilder, rounds: ir.Value) -> None:
        """Spin politely: a pause hint, and every YIELD_EVERY rounds a sched_yield, so a thread
        sharing this CPU with the spinner is not starved."""
        if self.pause:
            b.call(self.pause[0], list(self.pause[1:]))
        every = b.and_(rounds, c64(YIELD_EVERY - 1))
        with b.if_then(b.icmp_unsigned("==", every, c64(YIELD_EVERY - 1))):
            b.call(self.sched_yield, [])

    def run_share(self, b: ir.IRBuilder, fn_addr: ir.Value, args: ir.Value) -> None:
        fn = b.inttoptr(fn_addr, SHARE_TY.as_pointer())
        b.call(fn, [b.load(self.word(b, args, i)) for i in range(ARGS)])

    def build(self) -> ir.Module:
        worker = self.worker_fn()
        self.lock_fns()
        stop = self.stop_fn()
        self.run_fn(worker)
        self.api(stop)
        self.after_fork()
        return self.mod

    def after_fork(self) -> None:
        """A child forked while another thread was inside a kernel starts with the lock taken
        and workers that do not exist in it: its first call (or the destructor at its exit)
        would wait forever. A handler registered at load (pthread_atfork) resets the child to
        a library with no call running and no workers; its next call starts them again."""
        m = self.mod
        hook = ir.FunctionType(ir.VoidType(), [])
        child = ir.Function(m, hook, name="aotune.after_fork")
        child.linkage = "internal"
        b = ir.IRBuilder(child.append_basic_block("entry"))
        with counted_loop(b, c64(0), c64(MAX_WORKERS), 1, "clear") as i:
            b.store(c64(0), self.slot(b, i))  # free: no share posted to a worker
        b.store(c64(0), self.started)
        b.store(c64(0), self.mutex)
        b.ret_void()
        atfork = ir.Function(
            m, ir.FunctionType(I32, [hook.as_pointer()] * 3), name="pthread_atfork"
        )
        register = ir.Function(m, hook, name="aotune.register_after_fork")
        register.linkage = "internal"
        b = ir.IRBuilder(register.append_basic_block("entry"))
        none = ir.Constant(hook.as_pointer(), None)
        b.call(atfork, [none, none, child])
        b.ret_void()
        ctor_ty = ir.LiteralStructType([I32, hook.as_pointer(), P8])
        ctors = ir.GlobalVariable(m, ir.ArrayType(ctor_ty, 1), name="llvm.global_ctors")
        ctors.linkage = "appending"
        ctors.initializer = ir.Constant(
            ir.ArrayType(ctor_ty, 1),
            [ir.Constant(ctor_ty, [ir.Constant(I32, 65535), register, ir.Constant(P8, None)])],
        )

    # ---- the worker ------------------------------------------------------------------------------
    def worker_fn(self) -> ir.Function:
        fn = ir.Function(self.mod, self.worker_ty, name="aotune.worker")
        fn.linkage = "internal"
        blocks = {
            n: fn.append_basic_block(n)
            for n in ("entry", "poll", "claim", "run", "idle", "nap", "exit")
        }
        b = ir.IRBuilder(blocks["entry"])
        slot = b.bitcast(fn.args[0], P64)
        b.branch(blocks["poll"])
        b.position_at_end(blocks["poll"])
        spins = b.phi(I64, name="spins")
        spins.add_incoming(c64(0), blocks["entry"])
        state = b.load_atomic(self.word(b, slot, 0), "acquire", 8)
        sw = b.switch(state, blocks["idle"])
        sw.add_case(c64(1), blocks["claim"])
        sw.add_case(c64(3), blocks["exit"])
        b.position_at_end(blocks["claim"])
        pair = b.cmpxchg(self.word(b, slot, 0), c64(1), c64(2), "acq_rel", "acquire")
        b.cbranch(b.extract_value(pair, 1), blocks["run"], blocks["idle"])
        b.position_at_end(blocks["run"])
        self.run_share(b, b.load(self.word(b, slot, 1)), self.word(b, slot, 2))
        b.store_atomic(c64(0), self.word(b, slot, 0), "release", 8)
        b.branch(blocks["poll"])
        spins.add_incoming(c64(0), blocks["run"])
        b.position_at_end(blocks["idle"])
        self.relax(b, spins)
        more = b.add(spins, c64(1))
        spins.add_incoming(more, b.block)
        b.cbranch(b.icmp_unsigned("<", more, c64(SPIN_ROUNDS)), blocks["poll"], blocks["nap"])
        b.position_at_end(blocks["nap"])
        b.call(self.usleep, [ir.Constant(I32, NAP_MICROSECONDS)])
        b.branch(blocks["poll"])
        spins.add_incoming(c64(SPIN_ROUNDS), blocks["nap"])
        b.position_at_end(blocks["exit"])
        b.ret(ir.Constant(P8, None))
        return fn

    # ---- one call at a time ----------------------------------------------------------------------
    def lock_fns(self) -> None:
        lock = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), []), name=self.names.lock)
        b = ir.IRBuilder(lock.append_basic_block("entry"))
        spin = lock.append_basic_block("spin")
        done = lock.append_basic_block("done")
        before = b.block
        b.branch(spin)
        b.position_at_end(spin)
        rounds = b.phi(I64, name="rounds")
        rounds.add_incoming(c64(0), before)
        pair = b.cmpxchg(self.mutex, c64(0), c64(1), "acquire", "monotonic")
        got = b.extract_value(pair, 1)
        wait = lock.append_basic_block("wait")
        b.cbranch(got, done, wait)
        b.position_at_end(wait)
        self.relax(b, rounds)
        rounds.add_incoming(b.add(rounds, c64(1)), b.block)
        b.branch(spin)
        b.position_at_end(done)
        b.ret_void()
        unlock = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), []), name=self.names.unlock)
        b = ir.IRBuilder(unlock.append_basic_block("entry"))
        b.store_atomic(c64(0), self.mutex, "release", 8)
        b.ret_void()
        self.lock, self.unlock = lock, unlock

    def stop_fn(self) -> ir.Function:
        """aotune.stop(keep): ask workers keep.. to return and join them (lock held, no job)."""
        fn = ir.Function(self.mod, ir.FunctionType(ir.VoidType(), [I64]), name="aotune.stop")
        fn.linkage = "internal"
        (keep,) = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        started = b.load(self.started)
        with counted_loop(b, keep, started, 1, "ask") as i:
            b.store_atomic(c64(3), self.slot(b, i), "release", 8)
        with counted_loop(b, keep, started, 1, "join") as i:
            tid = b.load(b.gep(self.tids, [c64(0), i], inbounds=True))
            b.call(self.pthread_join, [tid, ir.Constant(P8.as_pointer(), None)])
            b.store_atomic(c64(0), self.slot(b, i), "release", 8)
        b.store(smin(b, keep, started), self.started)
        b.ret_void()
        return fn

    def threads_now(self, b: ir.IRBuilder) -> ir.Value:
        """Threads a call may use: the setting, or else the CPUs online, looked up once (glibc
        reads them from sysfs on every sysconf call)."""
        fn = b.function
        unset = fn.append_basic_block("unset")
        known = fn.append_basic_block("known")
        before = b.block
        wanted = b.load(self.wanted)
        b.cbranch(b.icmp_signed(">", wanted, c64(0)), known, unset)
        b.position_at_end(unset)
        online = b.call(self.sysconf, [ir.Constant(I32, SC_NPROCESSORS_ONLN)])
        online = b.select(b.icmp_signed("<", online, c64(1)), c64(1), online)
        b.store(online, self.wanted)
        b.branch(known)
        b.position_at_end(known)
        threads = b.phi(I64, name="threads")
        threads.add_incoming(wanted, before)
        threads.add_incoming(online, unset)
        return threads

    # ---- a parallel call -------------------------------------------------------------------------
    def run_fn(self, worker: ir.Function) -> None:
        """__aotune_run(fn, n, args): run fn once per share (args: n x ARGS i64), lock held."""
        fn = ir.Function(
            self.mod, ir.FunctionType(ir.VoidType(), [I64, I64, P64]), name=self.names.run
        )
        fn_addr, n, args = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        # workers this call posts to: min(threads - 1, n - 1, MAX_WORKERS); start missing ones
        need = smin(
            b, smin(b, b.sub(self.threads_now(b), c64(1)), b.sub(n, c64(1))), c64(MAX_WORKERS)
        )
        start_more = fn.append_basic_block("start")
        after = fn.append_basic_block("started")
        b.cbranch(b.icmp_signed("<", b.load(self.started), need), start_more, after)
        b.position_at_end(start_more)
        with counted_loop(b, b.load(self.started), need, 1, "spawn") as i:
            rc = b.call(
                self.pthread_create,
                [
                    b.gep(self.tids, [c64(0), i], inbounds=True),
                    ir.Constant(P8, None),
                    worker,
                    b.bitcast(self.slot(b, i), P8),
                ],
            )
            ok_block = fn.append_basic_block("spawned")
            b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), ok_block, after)
            b.position_at_end(ok_block)  # a thread that cannot be created: run with those we have
            b.store(b.add(i, c64(1)), self.started)
        b.branch(after)
        b.position_at_end(after)
        posted = smin(b, need, b.load(self.started))
        with counted_loop(b, c64(0), posted, 1, "post") as i:
            s = self.slot(b, i)
            b.store(fn_addr, self.word(b, s, 1))
            share = b.gep(args, [b.mul(b.add(i, c64(1)), c64(ARGS))], inbounds=True)
            for a in range(ARGS):
                b.store(b.load(self.word(b, share, a)), self.word(b, s, 2 + a))
            b.store_atomic(c64(1), self.word(b, s, 0), "release", 8)
        self.run_share(b, fn_addr, args)
        # shares without a worker: here
        with counted_loop(b, b.add(posted, c64(1)), n, 1, "rest") as i:
            self.run_share(b, fn_addr, b.gep(args, [b.mul(i, c64(ARGS))], inbounds=True))
        with counted_loop(b, c64(0), posted, 1, "joins") as i:
            s = self.slot(b, i)
            join_share(
                b,
                self.word(b, s, 0),
                lambda s=s: self.run_share(b, fn_addr, self.word(b, s, 2)),
                self.relax,
            )
        b.ret_void()

    # ---- the public functions --------------------------------------------------------------------
    def api(self, stop: ir.Function) -> None:
        m = self.mod
        set_n = ir.Function(m, ir.FunctionType(I32, [I32]), name=self.names.api("set_num_threads"))
        b = ir.IRBuilder(set_n.append_basic_block("entry"))
        (n,) = set_n.args
        with b.if_then(b.icmp_signed("<", n, ir.Constant(I32, 1))):
            b.ret(ir.Constant(I32, ERROR_CODES["AOTUNE_ERR_THREADS"]))
        b.call(self.lock, [])
        n64 = b.sext(n, I64)
        b.store(n64, self.wanted)
        b.call(stop, [b.sub(n64, c64(1))])  # fewer threads: the extra workers stop now
        b.call(self.unlock, [])
        b.ret(ir.Constant(I32, 0))

        get_n = ir.Function(m, ir.FunctionType(I32, []), name=self.names.api("get_num_threads"))
        b = ir.IRBuilder(get_n.append_basic_block("entry"))
        b.ret(b.trunc(self.threads_now(b), I32))

        # internal: the destructor below must stop this library's workers, not those of another
        # aotune library loaded first, whose public aotune_shutdown would interpose on this one's
        stop_all = ir.Function(m, ir.FunctionType(ir.VoidType(), []), name="aotune.stop_all")
        stop_all.linkage = "internal"
        b = ir.IRBuilder(stop_all.append_basic_block("entry"))
        b.call(self.lock, [])
        b.call(stop, [c64(0)])
        b.call(self.unlock, [])
        b.ret_void()
        shutdown = ir.Function(
            m, ir.FunctionType(ir.VoidType(), []), name=self.names.api("shutdown")
        )
        b = ir.IRBuilder(shutdown.append_basic_block("entry"))
        b.call(stop_all, [])
        b.ret_void()

        # the library stops its workers when unloaded (dlclose, exit), before its code goes away
        dtor_ty = ir.LiteralStructType([I32, ir.FunctionType(ir.VoidType(), []).as_pointer(), P8])
        dtors = ir.GlobalVariable(m, ir.ArrayType(dtor_ty, 1), name="llvm.global_dtors")
        dtors.linkage = "appending"
        dtors.initializer = ir.Constant(
            ir.ArrayType(dtor_ty, 1),
            [ir.Constant(dtor_ty, [ir.Constant(I32, 65535), stop_all, ir.Constant(P8, None)])],
        )

        texts = [text for _, text in ERRORS] + [unknown_error_text(self.names)]
        strings = []
        for k, text in enumerate(texts):
            data = bytearray(text.encode() + b"\0")
            ty = ir.ArrayType(I8, len(data))
            g = ir.GlobalVariable(m, ty, name=f"aotune.err{k}")
            g.linkage = "internal"
            g.global_constant = True
            g.initializer = ir.Constant(ty, data)
            strings.append(g)
        strerror = ir.Function(m, ir.FunctionType(P8, [I32]), name=self.names.api("strerror"))
        b = ir.IRBuilder(strerror.append_basic_block("entry"))
        (rc,) = strerror.args
        unknown = strerror.append_basic_block("unknown")
        sw = b.switch(rc, unknown)
        for k, g in enumerate(strings[:-1]):
            blk = strerror.append_basic_block(f"e{k}")
            sw.add_case(ir.Constant(I32, k), blk)
            b.position_at_end(blk)
            b.ret(b.gep(g, [c64(0), c64(0)], inbounds=True))
        b.position_at_end(unknown)
        b.ret(b.gep(strings[-1], [c64(0), c64(0)], inbounds=True))


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """Signed minimum."""
    return b.select(b.icmp_signed("<", x, y), x, y)


def runtime_ir(triple: str, names: Names = Names()) -> str:
    """LLVM IR text of the runtime for ``triple`` (a Linux target with pthreads in libc)."""
    return str(_Runtime(triple, names).build())
