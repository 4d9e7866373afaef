"""Native worker threads that run the shares of a host kernel's parallel loop.

Why not a Python thread pool: it hands work over through futexes, and waking a sleeping thread
costs tens of microseconds on a VM (measured on a 2-core KVM slice: an empty submit + result
~70 us, a third of a 256^3 matmul). Here each worker is a Python thread that enters a JIT-compiled
loop once and stays in native code (the GIL released), polling its own 128-byte slot:

    slot[0] state: 0 free, 1 posted, 2 running, 3 exit;  slot[1] kernel address;
    slot[2:10] its 8 arguments

``aotune_parallel`` posts one share per worker, runs share 0 itself, then for each worker either
claims a share nobody has taken yet (compare-and-swap 1 -> 2) and runs it, or waits until the
worker marks it done. A worker polls for ``SPIN_ROUNDS`` rounds after its last job, so back-to-back
calls hand over in well under a microsecond, then naps 1 ms at a time, costing an idle process
almost nothing; a share posted to a napping worker is run by the caller, never waited for.

The pool also times how long a cache line takes to move between two cores (``handoff_seconds``),
which the benchmark records beside its timings: on a VM it changes with the host's placement of
the virtual CPUs, and kernels whose threads write neighbouring lines of C slow down with it.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import time
from collections.abc import Callable

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
from aotune.codegen.compile import _LLVM_LOCK, _init_llvm
from aotune.codegen.executions import count_execution
from aotune.codegen.llvm_cpu import c64, counted_loop
from aotune.errors import FinalCheckError

SLOT_WORDS = 16  # 128 bytes: two cache lines, so neighbouring slots never share one
MAX_WORKERS = 1023  # 128 KiB of slots; a host's cores (and so threads) stay below this
SPIN_ROUNDS = 200_000  # ~2-5 ms of polling after a job before a worker starts napping
NAP_MICROSECONDS = 1000
YIELD_EVERY = 64  # spin rounds between sched_yield calls (a power of two)
PROBE_SHORT_STEPS, PROBE_LONG_STEPS = 500, 2500  # hand-over probe runs: ~0.1-1 ms each
# Longer than a BLAS library keeps its threads spinning after its last call (OpenBLAS: under
# 0.1 s): right after numpy's matmul a probe with 0.02 s of warm-up read 0-432 ns (0, 0, 9 among
# them) on the 2-vCPU slice, with 0.15 s 159-169, the placement's value, every time.
PROBE_WARMUP_SECONDS = 0.15
# polls (~a second) before a hand-over probe stops waiting for its partner
PROBE_SPIN_LIMIT = 1 << 28
PROBE_YIELD_EVERY = 1 << 14  # polls (~10 us, far beyond a hand-over) between sched_yield calls
# tries before the probe says it cannot tell: other work on both CPUs can make the long run no
# slower than the short one, and its difference (0 or below) is then noise, not a hand-over
PROBE_ATTEMPTS = 4
ARGS = 8  # the kernel entry: (A, B, C, bias, lo, hi, ws_a, ws_b)

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
_KERNEL_TY = ir.FunctionType(
    ir.VoidType(), [I64] * ARGS
)  # pointers passed as integers: same ABI on x86-64/AArch64


def join_share(
    b: ir.IRBuilder,
    state: ir.Value,
    run_here: Callable[[], None],
    relax: Callable[[ir.IRBuilder, ir.Value], None],
) -> None:
    """Join one posted share whose slot state word is ``state``: claim it (1 -> 2) and run it
    here if no worker took it, else spin (``relax`` per round) until its worker marks it done (0).
    The JIT pool and the library runtime both join this way."""
    pair = b.cmpxchg(state, c64(1), c64(2), "acq_rel", "acquire")
    with b.if_else(b.extract_value(pair, 1)) as (mine, theirs):
        with mine:  # nobody took it (its worker naps): run it here
            run_here()
            b.store_atomic(c64(0), state, "release", 8)
        with theirs:  # its worker runs it: wait until it is done
            before = b.block
            wait = b.append_basic_block("wait")
            done = b.append_basic_block("done")
            b.branch(wait)
            b.position_at_end(wait)
            rounds = b.phi(I64, name="rounds")
            rounds.add_incoming(c64(0), before)
            relax(b, rounds)
            busy = b.icmp_unsigned("!=", b.load_atomic(state, "acquire", 8), c64(0))
            rounds.add_incoming(b.add(rounds, c64(1)), b.block)
            b.cbranch(busy, wait, done)
            b.position_at_end(done)


def _module(triple: str) -> str:
    """IR of ``aotune_worker(slot)`` and ``aotune_parallel(slots, n, fn, args)``."""
    mod = ir.Module(name="aotune_workers")
    mod.triple = triple
    p64 = I64.as_pointer()
    usleep = ir.Function(mod, ir.FunctionType(I32, [I32]), name="usleep")
    sched_yield = ir.Function(mod, ir.FunctionType(I32, []), name="sched_yield")
    pause = (
        ir.Function(mod, ir.FunctionType(ir.VoidType(), []), name="llvm.x86.sse2.pause")
        if triple.startswith(("x86_64", "i686"))
        else None
    )

    def word(b: ir.IRBuilder, slot: ir.Value, i: int | ir.Value) -> ir.Value:
        return b.gep(slot, [i if isinstance(i, ir.Value) else ir.Constant(I64, i)], inbounds=True)

    def run_share(b: ir.IRBuilder, fn_addr: ir.Value, args: ir.Value) -> None:
        fn = b.inttoptr(fn_addr, _KERNEL_TY.as_pointer())
        b.call(fn, [b.load(word(b, args, i)) for i in range(ARGS)])

    def relax(b: ir.IRBuilder, rounds: ir.Value) -> None:
        """Spin politely: a pause hint, and every YIELD_EVERY rounds a sched_yield, so a thread that
        shares this CPU with the spinner (the caller, before the OS spreads them) is not starved."""
        if pause is not None:
            b.call(pause, [])
        every = b.and_(rounds, ir.Constant(I64, YIELD_EVERY - 1))
        with b.if_then(b.icmp_unsigned("==", every, ir.Constant(I64, YIELD_EVERY - 1))):
            b.call(sched_yield, [])

    # ---- the worker: poll, claim, run, mark done; nap when idle for long -------------------------
    worker = ir.Function(mod, ir.FunctionType(ir.VoidType(), [p64]), name="aotune_worker")
    slot = worker.args[0]
    blocks = {
        n: worker.append_basic_block(n)
        for n in ("entry", "poll", "claim", "run", "idle", "nap", "exit")
    }
    b = ir.IRBuilder(blocks["entry"])
    b.branch(blocks["poll"])
    b.position_at_end(blocks["poll"])
    spins = b.phi(I64, name="spins")
    spins.add_incoming(ir.Constant(I64, 0), blocks["entry"])
    state = b.load_atomic(word(b, slot, 0), "acquire", 8)
    sw = b.switch(state, blocks["idle"])
    sw.add_case(ir.Constant(I64, 1), blocks["claim"])
    sw.add_case(ir.Constant(I64, 3), blocks["exit"])
    b.position_at_end(blocks["claim"])
    pair = b.cmpxchg(
        word(b, slot, 0), ir.Constant(I64, 1), ir.Constant(I64, 2), "acq_rel", "acquire"
    )
    b.cbranch(b.extract_value(pair, 1), blocks["run"], blocks["idle"])
    b.position_at_end(blocks["run"])
    run_share(b, b.load(word(b, slot, 1)), word(b, slot, 2))
    b.store_atomic(ir.Constant(I64, 0), word(b, slot, 0), "release", 8)
    b.branch(blocks["poll"])
    spins.add_incoming(ir.Constant(I64, 0), blocks["run"])
    b.position_at_end(blocks["idle"])
    relax(b, spins)
    more = b.add(spins, ir.Constant(I64, 1))
    spins.add_incoming(more, b.block)
    b.cbranch(
        b.icmp_unsigned("<", more, ir.Constant(I64, SPIN_ROUNDS)), blocks["poll"], blocks["nap"]
    )
    b.position_at_end(blocks["nap"])
    b.call(usleep, [ir.Constant(I32, NAP_MICROSECONDS)])
    b.branch(blocks["poll"])
    spins.add_incoming(ir.Constant(I64, SPIN_ROUNDS), blocks["nap"])
    b.position_at_end(blocks["exit"])
    b.ret_void()

    # ---- the caller: post shares 1.., run share 0, then claim or wait for each posted share ------
    par = ir.Function(
        mod, ir.FunctionType(ir.VoidType(), [p64, I64, I64, p64]), name="aotune_parallel"
    )
    slots, n, fn_addr, args = par.args
    b = ir.IRBuilder(par.append_basic_block("entry"))
    with counted_loop(b, c64(1), n, 1, "post") as i:
        s = b.gep(
            slots,
            [b.mul(b.sub(i, ir.Constant(I64, 1)), ir.Constant(I64, SLOT_WORDS))],
            inbounds=True,
        )
        b.store(fn_addr, word(b, s, 1))
        for a in range(ARGS):
            b.store(
                b.load(word(b, args, b.add(b.mul(i, ir.Constant(I64, ARGS)), ir.Constant(I64, a)))),
                word(b, s, 2 + a),
            )
        b.store_atomic(ir.Constant(I64, 1), word(b, s, 0), "release", 8)
    run_share(b, fn_addr, args)
    with counted_loop(b, c64(1), n, 1, "join") as i:
        s = b.gep(
            slots,
            [b.mul(b.sub(i, ir.Constant(I64, 1)), ir.Constant(I64, SLOT_WORDS))],
            inbounds=True,
        )
        join_share(b, word(b, s, 0), lambda s=s: run_share(b, fn_addr, word(b, s, 2)), relax)
    b.ret_void()

    # ---- the hand-over probe: two shares pass a counter back and forth ---------------------------
    # aotune_pingpong(flag, role, rounds, ...): role 0 waits for 2i and writes 2i + 1, role 1 waits
    # for 2i + 1 and writes 2i + 2, so each step moves the flag's line to the other core once. A
    # wait gives up after PROBE_SPIN_LIMIT polls (its partner never came), so a probe cannot hang.
    probe = ir.Function(mod, _KERNEL_TY, name="aotune_pingpong")
    flag_addr, role, rounds = probe.args[:3]
    b = ir.IRBuilder(probe.append_basic_block("entry"))
    flag = b.inttoptr(flag_addr, p64)
    give_up = probe.append_basic_block("give_up")
    with counted_loop(b, c64(0), rounds, 1, "step") as i:
        want = b.add(b.mul(i, c64(2)), role)
        before = b.block
        wait, go = probe.append_basic_block("wait"), probe.append_basic_block("go")
        b.branch(wait)
        b.position_at_end(wait)
        check = probe.append_basic_block("check")
        polls = b.phi(I64, name="polls")
        polls.add_incoming(c64(0), before)
        more = b.add(polls, c64(1))
        b.cbranch(b.icmp_unsigned("==", b.load_atomic(flag, "acquire", 8), want), go, check)
        b.position_at_end(check)
        # a partner that shares this CPU (a loaded machine) runs only when this one yields
        every = b.and_(more, c64(PROBE_YIELD_EVERY - 1))
        with b.if_then(b.icmp_unsigned("==", every, c64(0))):
            b.call(sched_yield, [])
        polls.add_incoming(more, b.block)
        b.cbranch(b.icmp_unsigned("<", more, c64(PROBE_SPIN_LIMIT)), wait, give_up)
        b.position_at_end(go)
        b.store_atomic(b.add(want, c64(1)), flag, "release", 8)
    b.ret_void()
    b.position_at_end(give_up)
    b.ret_void()
    return str(mod)


class WorkerPool:
    """Native workers for the host; one per process (``workers()``), grown on demand."""

    def __init__(self) -> None:
        _init_llvm()
        with _LLVM_LOCK:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            target = llvm.Target.from_default_triple()
            tm = target.create_target_machine(opt=2)
            mod = llvm.parse_assembly(_module(llvm.get_process_triple()))
            mod.verify()
            self._engine = llvm.create_mcjit_compiler(mod, tm)
            self._engine.finalize_object()
            worker_addr = self._engine.get_function_address("aotune_worker")
            parallel_addr = self._engine.get_function_address("aotune_parallel")
            self._pingpong_addr = self._engine.get_function_address("aotune_pingpong")
        self._worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(worker_addr)
        self._parallel = ctypes.CFUNCTYPE(
            None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p
        )(parallel_addr)
        raw = np.zeros((MAX_WORKERS + 2) * SLOT_WORDS, dtype=np.int64)
        first = (-raw.ctypes.data % (SLOT_WORDS * 8)) // 8
        self._slots = raw[first : first + MAX_WORKERS * SLOT_WORDS]
        end = first + MAX_WORKERS * SLOT_WORDS
        self._probe_flag = raw[end : end + 1]  # the hand-over probe's counter: a slot of its own
        self._slots_addr = self._slots.ctypes.data
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()  # one parallel call at a time owns the slots

    def _grow(self, count: int) -> None:
        while len(self._threads) < count:
            addr = self._slots_addr + len(self._threads) * SLOT_WORDS * 8
            t = threading.Thread(
                target=self._worker,
                args=(addr,),
                daemon=True,
                name=f"aotune-worker-{len(self._threads)}",
            )
            t.start()
            self._threads.append(t)

    def run(self, fn_addr: int, shares: list[tuple[int, ...]]) -> None:
        """Call the kernel at ``fn_addr`` once per share (8 integer arguments each), in parallel."""
        if len(shares) - 1 > MAX_WORKERS:
            raise FinalCheckError(
                f"{len(shares)} threads requested; the worker pool runs at most "
                f"{MAX_WORKERS + 1}: use fewer threads"
            )
        flat = [x for share in shares for x in share]
        args = (ctypes.c_uint64 * len(flat))(*flat)
        with self._lock:
            self._grow(len(shares) - 1)
            self._parallel(self._slots_addr, len(shares), fn_addr, ctypes.addressof(args))

    def handoff_seconds(self, repeats: int = 3) -> float | None:
        """Seconds for one cache line to move from one core to another (this thread's to a worker's,
        or back): the hand-over that a line two threads both write pays each time it changes hands.
        None when the probe cannot tell (see below).

        Two shares pass a counter back and forth (``aotune_pingpong``); two runs of different
        lengths are each timed ``repeats`` times, and the difference of their fastest times over the
        difference of steps cancels the call's fixed cost. A warm-up comes first: after a quiet
        spell the worker naps, the OS may hold both threads on one CPU until they spin, and BLAS
        threads may still spin after numpy's last call (the first probe after compiling and checking
        64 kernels read 0-949 ns without it). On a VM this is the host's placement of the virtual
        CPUs: measured on a 2-vCPU EPYC slice, ~40 ns while both sit under one L3 and ~170 ns while
        the hypervisor has them on two, switching within seconds. A long run no slower than the
        short one is measured again, up to ``PROBE_ATTEMPTS`` times, then gives None: with two test
        suites on the two CPUs it read 0 ns.
        """
        start = time.perf_counter()
        while time.perf_counter() - start < PROBE_WARMUP_SECONDS:
            self._pingpong(PROBE_SHORT_STEPS)
        for _ in range(PROBE_ATTEMPTS):
            short = min(self._pingpong(PROBE_SHORT_STEPS) for _ in range(repeats))
            long = min(self._pingpong(PROBE_LONG_STEPS) for _ in range(repeats))
            if long > short:
                return (long - short) / (2 * (PROBE_LONG_STEPS - PROBE_SHORT_STEPS))
        return None

    def _pingpong(self, steps: int) -> float:
        """Seconds for ``steps`` round trips of the probe's counter between this thread and a
        worker."""
        flag = self._probe_flag.ctypes.data
        self._probe_flag[0] = 0
        count_execution("hand-over probe")
        start = time.perf_counter()
        self.run(
            self._pingpong_addr, [(flag, 0, steps, 0, 0, 0, 0, 0), (flag, 1, steps, 0, 0, 0, 0, 0)]
        )
        seconds = time.perf_counter() - start
        if self._probe_flag[0] != 2 * steps:
            raise FinalCheckError(
                "the hand-over probe's worker thread did not answer; "
                "is another program pinning this process to one CPU?"
            )
        return seconds

    def stop(self) -> None:
        """Ask every worker to return and wait for them (before the JIT code goes away)."""
        with self._lock:
            for i in range(len(self._threads)):
                self._slots[i * SLOT_WORDS] = 3
            for t in self._threads:
                t.join()
            self._threads.clear()


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def workers() -> WorkerPool:
    """The process's worker pool, created on first use and stopped at exit."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool()
            atexit.register(_POOL.stop)
        return _POOL
