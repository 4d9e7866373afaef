"""What one call of a CPU kernel runs, independent of where it runs.

A call of a kernel is two phases of shares, each share one thread's call of a function with the
entry's signature ``(A, B, C, bias, lo, hi, ws_a, ws_b)``:

    1. only with a zero-padded copy: ``<entry>_pad(src, padded[t], rows, -, lo, hi, -, -)`` per
       share t: it copies the input rows ``rows[lo:hi]`` (a table of row indices), those its own
       kernel share reads, into a buffer of its own;
    2. ``<entry>(A or padded, B or padded, C, bias, lo, hi, ws_a[t], ws_b[t])`` per kernel share t,
       each thread with its own packing workspaces.

The phases are separated by a barrier: every row a share reads is written before it reads it.
:class:`LaunchPlan` says which buffers a call needs and which shares each phase runs; the host
runner (``runner.py``) turns it into addresses for its worker threads, the emulated check
(``emulate.py``) into a C driver on pthreads, so both exercise exactly the same shares.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from aotune.codegen.schedule import CpuSchedule


@dataclass(frozen=True, eq=False)
class LaunchPlan:
    """The buffers and shares of one call of a kernel (buffers are counted, not allocated)."""

    shares: tuple[tuple[int, int], ...]  # [lo, hi) of the parallel loop per thread
    ws_a_elems: int  # floats of one thread's packed-A workspace (1 when A is not packed)
    ws_b_elems: int
    pad_operand: str | None  # "a" or "b": the input copied into a zero-padded buffer, or None
    pad_elems: int  # floats of one padded buffer (0 without a padded copy)
    pad_buffers: int  # padded buffers: 0, or one per share
    pad_shares: tuple[tuple[int, int, int], ...]  # phase 1: (buffer, lo, hi): pad_rows[lo:hi]
    padded_of_share: tuple[int, ...]  # phase 2: the padded buffer each kernel share reads
    # the input rows phase 1 copies, share by share (indexed by pad_shares' lo, hi)
    pad_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def threads(self) -> int:
        """Threads a call runs on (one share each, in both phases)."""
        return len(self.shares)


def page_rounded(elems: int, page_bytes: int) -> int:
    """``elems`` float32 rounded up to whole pages: each per-thread buffer gets pages of its own,
    so one core's prefetcher never pulls lines another core is writing."""
    page = page_bytes // 4
    return -(-elems // page) * page


@functools.lru_cache(maxsize=64)
def launch_plan(s: CpuSchedule) -> LaunchPlan:
    """The launch plan of a kernel built from schedule ``s`` (cached: the final check, a library
    build and the emulated check each ask for it).

    With a padded copy, each share gets a buffer of its own and copies into it just the rows its
    kernel reads (all of them where the parallel loop does not pick the padded operand's rows).
    A buffer split over the threads sent the rows both shares read (a convolution window's
    halo) from one core's cache to the other's on every call, and cost twice the time where the
    two vCPUs sit far apart. (The worker pool may still run a share's two phases on different
    cores, e.g. after a nap; the result is the same, only slower.)

    The padded copy's border stays zero (the pad function writes only its interior), so its buffers
    must be zeroed once when they are allocated and may be reused by later calls.
    """
    shares = tuple(s.thread_ranges())
    threads = len(shares)
    pc = s.pad_copy
    if pc is None:
        return LaunchPlan(shares, s.pack_a_elems, s.pack_b_elems, None, 0, 0, (), ())
    if s.pad_copy_per_thread or threads < 2:  # one table of every row, which all shares copy
        rows = math.prod(pc.shape[:-1])
        pad_shares = tuple((t, 0, rows) for t in range(threads))
        pad_rows = np.arange(rows, dtype=np.int64)
    else:
        per_share = [padded_rows_read(s, lo, hi) for lo, hi in shares]
        bounds = np.cumsum([0] + [len(r) for r in per_share])
        pad_shares = tuple((t, int(bounds[t]), int(bounds[t + 1])) for t in range(threads))
        pad_rows = np.concatenate(per_share).astype(np.int64)
    pad_rows.flags.writeable = False  # shared by every caller of the cached plan
    return LaunchPlan(
        shares,
        s.pack_a_elems,
        s.pack_b_elems,
        pc.operand,
        pc.elems,
        threads,
        pad_shares,
        tuple(range(threads)),
        pad_rows,
    )


def padded_rows_read(s: CpuSchedule, lo: int, hi: int) -> np.ndarray:
    """Input rows (flattened, unpadded) whose copies the kernel share [lo, hi) of the parallel
    loop reads, over every batch entry; all rows where each thread reads all of them
    (``CpuSchedule.pad_copy_per_thread``) or runs alone."""
    pc = s.pad_copy
    assert pc is not None
    gather = s.a_gather if pc.operand == "a" else s.b_gather
    rows = math.prod(pc.shape[:-1])
    if s.pad_copy_per_thread or s.threads < 2 or gather is None or len(pc.shape) < 2:
        return np.arange(rows)
    row_offsets, k_offsets, _ = gather.tables()
    width = pc.padded[-1]
    # A read in place as vectors along its columns too: each read spans N elements more
    span = s.N - 1 if s.a_shared and pc.operand == "a" else 0
    if span >= width:
        return np.arange(rows)
    k_offsets = np.unique(np.concatenate([k_offsets, k_offsets + span]))
    # an operand row at q * width + rem reads rows q + (rem + k) // width: one short list per
    # distinct rem (one in all for NHWC), not a row of K offsets per operand row
    quotient, rem = np.divmod(row_offsets[lo:hi], width)
    read = []
    for r in np.unique(rem):
        steps = np.unique((r + k_offsets) // width)
        starts = np.unique(quotient[rem == r])
        read.append(np.unique((starts[:, None] + steps[None, :]).ravel()))
    padded_rows = np.unique(np.concatenate(read))
    batch = np.zeros(1, dtype=np.int64)  # each batch entry's offset in the padded buffer
    for extent, a_stride, b_stride, _ in s.batch:
        stride = a_stride if pc.operand == "a" else b_stride
        batch = (batch[:, None] + np.arange(extent, dtype=np.int64)[None, :] * stride).ravel()
    if np.all(batch % width == 0):
        padded_rows = (padded_rows[None, :] + (batch // width)[:, None]).ravel()
    else:  # a batch step inside a row: a row's elements then span two rows
        starts = padded_rows[None, :] * width + batch[:, None]
        padded_rows = np.concatenate([starts // width, (starts + width - 1) // width], axis=None)
    padded_rows = np.unique(padded_rows)
    index = np.unravel_index(padded_rows[padded_rows < math.prod(pc.padded[:-1])], pc.padded[:-1])
    inside = [i - below for i, below in zip(index, pc.lo[:-1])]
    keep = np.all([(i >= 0) & (i < n) for i, n in zip(inside, pc.shape[:-1])], axis=0)
    return np.ravel_multi_index([i[keep] for i in inside], pc.shape[:-1])
