"""What else ran on this machine while aotune measured: other processes' CPU time and the time
the hypervisor gave other guests (steal), from Linux's ``/proc/stat``.

Timings read slow when something else shares the cores, calibration's bandwidths above all (on the
2-vCPU Zen 4 slice memory read 23.9-25.9 GB/s beside a test run that kept 1-2 CPUs busy, 40.7
alone). ``hw calibrate``, ``tune``'s final check and the bench's accuracy rows take a ``cpu_use``
before and after they measure; ``sharing`` turns the two into what others used, which travels
beside the numbers (a warning, a JSON field) so a reader can tell.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

# Other processes' CPUs' worth of busy time on average, and the share of the machine's time the
# hypervisor gave other guests, from which a measurement is called shared. Idle, the OS's own
# daemons use about 0.01-0.05 CPUs.
OTHERS_WARN_CPUS = 0.25
STEAL_WARN_SHARE = 0.1


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds used so far: by the whole machine (every CPU's busy states), taken by the
    hypervisor for other guests (steal), and by this process (its threads and waited-for
    children), at ``wall`` (``time.perf_counter``)."""

    busy: float
    steal: float
    own: float
    wall: float


@dataclass(frozen=True)
class Sharing:
    """What others used of the machine between two ``CpuUse`` readings."""

    seconds: float  # wall-clock seconds between them
    cpus: int  # CPUs of the machine
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
        """What others did, when it reaches ``OTHERS_WARN_CPUS`` or ``STEAL_WARN_SHARE`` (else
        None): e.g. "other processes kept 1.2 of the 2 CPUs busy"."""
        found = []
        if self.others_cpus >= OTHERS_WARN_CPUS:
            found.append(
                f"other processes kept {self.others_cpus:.1f} of the {self.cpus} CPUs busy"
            )
        if self.stolen_share >= STEAL_WARN_SHARE:
            found.append(
                f"the hypervisor gave {self.stolen_share:.0%} of the CPUs' time to other guests"
            )
        return " and ".join(found) or None


def parse_proc_stat(text: str, ticks_per_second: int) -> tuple[float, float] | None:
    """(busy, steal) seconds of all CPUs from the text of Linux's ``/proc/stat``, or None when it
    has no well-formed ``cpu`` line. Busy is user + nice + system + irq + softirq (guest time is
    inside user already); idle and I/O wait are not busy."""
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != "cpu":
            continue
        try:
            ticks = [int(x) for x in parts[1:9]]
        except ValueError:
            return None
        if len(ticks) < 7 or ticks_per_second <= 0:
            return None
        user, nice, system, _idle, _iowait, irq, softirq, *rest = ticks
        steal = rest[0] if rest else 0
        return (user + nice + system + irq + softirq) / ticks_per_second, steal / ticks_per_second
    return None


def cpu_use() -> CpuUse | None:
    """This moment's ``CpuUse``, or None where ``/proc/stat`` cannot be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii", errors="replace") as f:
            parsed = parse_proc_stat(f.read(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None
    if parsed is None:
        return None
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return CpuUse(parsed[0], parsed[1], own, time.perf_counter())


def sharing(before: CpuUse | None, after: CpuUse | None, cpus: int | None = None) -> Sharing | None:
    """What others used of the machine's ``cpus`` CPUs (default: all of them) between ``before``
    and ``after``; None when either is unknown or no time passed."""
    cpus = cpus if cpus is not None else os.cpu_count() or 1
    if before is None or after is None or after.wall <= before.wall or cpus < 1:
        return None
    wall = after.wall - before.wall
    others = max(0.0, (after.busy - before.busy) - (after.own - before.own)) / wall
    stolen = max(0.0, after.steal - before.steal) / (wall * cpus)
    return Sharing(wall, cpus, others, stolen)
