"""The one count of executions of generated code in this process.

aotune's search ranks candidates without running them; the claim "0 measurements" is this count,
taken before and after a search, not a constant. Every path that runs generated code — a host
kernel call, a worker-pool probe, a GPU kernel emulated on the host or launched on a device, a
program under qemu, a calibration microbenchmark — calls ``count_execution`` as it starts it.
"""

from __future__ import annotations

import threading
from collections import Counter

_LOCK = threading.Lock()
_COUNTS: Counter[str] = Counter()


def count_execution(kind: str, times: int = 1) -> None:
    """Record ``times`` runs of generated code of ``kind`` (e.g. "host kernel", "qemu")."""
    with _LOCK:
        _COUNTS[kind] += times


def executions() -> int:
    """Runs of generated code so far in this process, of every kind."""
    with _LOCK:
        return sum(_COUNTS.values())


def executions_by_kind() -> dict[str, int]:
    """Runs of generated code so far, per kind."""
    with _LOCK:
        return dict(_COUNTS)
