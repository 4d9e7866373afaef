"""What one call of a CPU kernel runs, independent of where it runs.

A call of a kernel is two phases of shares, each share one thread's call of a function with the
entry's signature ``(A, B, C, bias, lo, hi, ws_a, ws_b)``:

    1. only with a zero-padded copy: ``<entry>_pad(src, padded, -, -, lo, hi, -, -)`` per pad share
       (the rows split over the threads, or each thread copying all of them into its own buffer);
    2. ``<entry>(A or padded, B or padded, C, bias, lo, hi, ws_a[t], ws_b[t])`` per kernel share t,
       each thread with its own packing workspaces.

The phases are separated by a barrier: every row of the padded copy is written before any thread
reads it. :class:`LaunchPlan` says which buffers a call needs and which shares each phase runs; the
host runner (``runner.py``) turns it into addresses for its worker threads, the emulated check
(``emulate.py``) into a C driver on pthreads, so both exercise exactly the same shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aotune.codegen.schedule import CpuSchedule


@dataclass(frozen=True)
class LaunchPlan:
    """The buffers and shares of one call of a kernel (buffers are counted, not allocated)."""

    shares: tuple[tuple[int, int], ...]  # [lo, hi) of the parallel loop per thread
    ws_a_elems: int  # floats of one thread's packed-A workspace (1 when A is not packed)
    ws_b_elems: int
    pad_operand: str | None  # "a" or "b": the input copied into a zero-padded buffer, or None
    pad_elems: int  # floats of one padded buffer (0 without a padded copy)
    pad_buffers: int  # padded buffers: 0, 1 (split over the threads) or one per thread
    pad_shares: tuple[tuple[int, int, int], ...]  # phase 1: (padded buffer, lo row, hi row)
    padded_of_share: tuple[int, ...]  # phase 2: the padded buffer each kernel share reads

    @property
    def threads(self) -> int:
        """Threads a call runs on (one share each, in both phases)."""
        return len(self.shares)


def page_rounded(elems: int, page_bytes: int) -> int:
    """``elems`` float32 rounded up to whole pages: each per-thread buffer gets pages of its own,
    so one core's prefetcher never pulls lines another core is writing."""
    page = page_bytes // 4
    return -(-elems // page) * page


def launch_plan(s: CpuSchedule) -> LaunchPlan:
    """The launch plan of a kernel built from schedule ``s``.

    The padded copy's border stays zero (the pad function writes only its interior), so its buffers
    must be zeroed once when they are allocated and may be reused by later calls.
    """
    shares = tuple(s.thread_ranges())
    threads = len(shares)
    pc = s.pad_copy
    if pc is None:
        return LaunchPlan(shares, s.pack_a_elems, s.pack_b_elems, None, 0, 0, (), ())
    rows = math.prod(pc.shape[:-1])  # the pad function copies rows: all dims but the last
    if s.pad_copy_per_thread:
        pad_shares = tuple((t, 0, rows) for t in range(threads))
    else:
        pad_shares = tuple(
            (0, t * rows // threads, (t + 1) * rows // threads) for t in range(threads)
        )
    return LaunchPlan(
        shares,
        s.pack_a_elems,
        s.pack_b_elems,
        pc.operand,
        pc.elems,
        threads if s.pad_copy_per_thread else 1,
        pad_shares,
        tuple(buffer for buffer, _, _ in pad_shares),
    )
