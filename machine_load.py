"""What else ran on this machine while aotune measured: other processes' CPU time and the time
the hypervisor gave other guests (steal), from Linux's ``/proc/stat``.

Timings read slow when something else shares the cores, calibration's bandwidths above all (on the
2-vCPU Zen 4 slice memory read 23.9-25.9 GB/s beside a test run that kept 1-2 CPUs busy, 40.7
alone). ``hw calibrate``, ``tune``'s final check, ``accuracy WORKLOAD`` and the bench's accuracy
rows take a ``cpu_use`` before and after they measure; ``sharing`` turns the two into what
others used, which travels beside the numbers (a warning, a JSON field) so a reader can tell.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other processes' CPUs' worth of busy time on average on the CPUs this process may use (so a big
# machine's other cores do not count), and the share of those CPUs' time the hypervisor gave other
# guests, from which a measurement is called shared. Idle, the OS's daemons use ~0.01-0.05 CPUs.
OTHERS_WARN_CPUS = 0.25
STEAL_WARN_SHARE = 0.1
# Both counters move in 10 ms ticks: over less than this, rounding alone reads ~0.1 CPUs
MIN_SECONDS = 1.0


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds used so far on the CPUs this process may run on: by everything (their busy
    states), taken by the hypervisor for other guests (steal), and by this process (its threads
    and waited-for children), at ``wall`` (``time.perf_counter``)."""

    busy: float
    steal: float
    own: float
    wall: float
    cpus: int


@dataclass(frozen=True)
class Sharing:
    """What others used of the CPUs this process may run on between two ``CpuUse`` readings."""

    seconds: float  # wall-clock seconds between them
    cpus: int  # the CPUs counted
    others_cpus: float  # other processes' busy time over the seconds: CPUs' worth on average
    stolen_share: float  # the CPUs' time the hypervisor gave other guests

    def as_dict(self) -> dict[str, float]:
        """JSON-friendly form."""
        return {
            "seconds": round(self.seconds, 3),
            "cpus": self.cpus,
            "others_cpus": round(self.others_cpus, 3),
            "stolen_share": round(self.stolen_share, 4),
        }

    def describe(self) -> str | None:
        """What others did, when it reaches ``OTHERS_WARN_CPUS`` or ``STEAL_WARN_SHARE`` over at
        least ``MIN_SECONDS`` (else None): e.g. "other processes kept 1.2 of the 2 CPUs busy"."""
        if self.seconds < MIN_SECONDS:
            return None
        found = []
        cpus = f"the {self.cpus} CPUs" if self.cpus > 1 else "the CPU"
        if self.others_cpus >= OTHERS_WARN_CPUS:
            found.append(f"other processes kept {self.others_cpus:.1f} of {cpus} busy")
        if self.stolen_share >= STEAL_WARN_SHARE:
            time_of = f"{cpus}'" if self.cpus > 1 else f"{cpus}'s"
            found.append(
                f"the hypervisor gave {self.stolen_share:.0%} of {time_of} time to other guests"
            )
        return " and ".join(found) or None

    def warning(self, during: str, consequence: str) -> str | None:
        """``describe``'s text as a command's warning, "<what others did> <during>, so
        <consequence>", or None when there is nothing to say."""
        what = self.describe()
        return f"{what} {during}, so {consequence}" if what else None


def parse_proc_stat(
    text: str, ticks_per_second: int, cpus: set[int] | None = None
) -> tuple[float, float, int] | None:
    """(busy, steal) seconds and the number of CPUs they cover, from the text of Linux's
    ``/proc/stat``: summed over the ``cpuN`` lines of ``cpus`` (all of them when None), or None
    when none of those lines is well-formed. Busy is user + nice + system + irq + softirq (guest
    time is inside user already); idle and I/O wait are not busy."""
    busy = steal = 0.0
    counted = 0
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[0].startswith("cpu") or not parts[0][3:].isdigit():
            continue
        if cpus is not None and int(parts[0][3:]) not in cpus:
            continue
        try:
            ticks = [int(x) for x in parts[1:9]]
        except ValueError:
            return None
        if len(ticks) < 7 or ticks_per_second <= 0:
            return None
        user, nice, system, _idle, _iowait, irq, softirq, *rest = ticks
        busy += (user + nice + system + irq + softirq) / ticks_per_second
        steal += (rest[0] if rest else 0) / ticks_per_second
        counted += 1
    return (busy, steal, counted) if counted else None


def cpu_use() -> CpuUse | None:
    """This moment's ``CpuUse`` over the CPUs this process may run on (its affinity), or None
    where ``/proc/stat`` cannot be read (not Linux)."""
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            parsed = parse_proc_stat(f.read(), os.sysconf("SC_CLK_TCK"), mine)
    except (OSError, ValueError):
        return None
    if parsed is None:
        return None
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return CpuUse(parsed[0], parsed[1], own, time.perf_counter(), parsed[2])


def sharing(before: CpuUse | None, after: CpuUse | None) -> Sharing | None:
    """What others used of the CPUs counted between ``before`` and ``after``; None when either
    is unknown, no time passed, or they count different CPUs."""
    if before is None or after is None or after.wall <= before.wall:
        return None
    if before.cpus != after.cpus or after.cpus < 1:
        return None
    wall = after.wall - before.wall
    others = max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall
    stolen = max(0.0, after.steal - before.steal) / (wall * after.cpus)
    return Sharing(wall, after.cpus, others, stolen)
