"""What else ran on the machine while aotune measured (``machine_load``): /proc/stat's parsing
and the shares it gives, on synthetic readings; the warnings of the commands that use it are
tested beside those commands."""

from __future__ import annotations

import json
import os
import time

import pytest
from aotune import machine_load
from aotune.cli import main
from aotune.hwspecs import calibrate as cal

STAT = (
    "cpu  6825379 1294 350697 6192920 42701 0 3224 7511 0 0\n"
    "cpu0 2434351 36 155276 4090242 6926 0 715 4415 0 0\n"
    "cpu1 4391028 1257 195421 2102677 35774 0 2508 3095 0 0\nintr 1 2 3\n"
)


def test_proc_stat_gives_busy_and_stolen_seconds_of_the_cpus_asked_for():
    busy, steal, cpus = machine_load.parse_proc_stat(STAT, 100)
    assert cpus == 2 and steal == pytest.approx((4415 + 3095) / 100)
    assert busy == pytest.approx(
        (2434351 + 36 + 155276 + 715 + 4391028 + 1257 + 195421 + 2508) / 100
    )
    # the CPUs this process may run on only (taskset, a big machine's other cores)
    busy1, steal1, cpus1 = machine_load.parse_proc_stat(STAT, 100, {1})
    assert cpus1 == 1 and busy1 == pytest.approx((4391028 + 1257 + 195421 + 2508) / 100)
    assert steal1 == pytest.approx(30.95)
    # a kernel before steal was counted (7 fields) has none; garbage or no cpuN line: unknown
    assert machine_load.parse_proc_stat("cpu0 1 2 3 4 5 6 7\n", 100) == (
        pytest.approx(0.19),
        0.0,
        1,
    )
    assert machine_load.parse_proc_stat("cpu 1 2 3 4 5 6 7 8\n", 100) is None
    assert machine_load.parse_proc_stat("cpu0 1 x 3 4 5 6 7 8\n", 100) is None
    assert machine_load.parse_proc_stat("cpu0 1 2 3\n", 100) is None
    assert machine_load.parse_proc_stat(STAT, 100, {7}) is None


@pytest.mark.parametrize(
    "busy, steal, own, expect",
    [
        (100.0, 0.0, 99.0, None),  # only the probes ran (1 CPU-s of daemons in 100 s)
        (150.0, 0.0, 100.0, "other processes kept 0.5 of the 2 CPUs busy"),
        (100.0, 20.0, 100.0, "the hypervisor gave 10% of the 2 CPUs' time to other guests"),
        (250.0, 40.0, 100.0, "kept 1.5 of the 2 CPUs busy and the hypervisor gave 20%"),
    ],
)
def test_a_shared_machine_is_described_and_an_idle_one_is_not(busy, steal, own, expect):
    before = machine_load.CpuUse(busy=1000.0, steal=5.0, own=1.0, wall=50.0, cpus=2)
    after = machine_load.CpuUse(
        busy=1000.0 + busy, steal=5.0 + steal, own=1.0 + own, wall=150.0, cpus=2
    )
    shared = machine_load.sharing(before, after)
    assert shared.seconds == 100.0 and shared.cpus == 2
    assert shared.others_cpus == pytest.approx(max(0.0, busy - own) / 100.0)
    assert shared.stolen_share == pytest.approx(steal / 200.0)
    warning = cal.sharing_warning(shared)
    if expect is None:
        assert shared.describe() is None and warning is None
    else:
        assert expect in shared.describe() and expect in warning
        assert "rerun `aotune hw calibrate` when the machine is idle" in warning
    assert machine_load.sharing(None, after) is None
    assert machine_load.sharing(after, after) is None
    other_cpus = machine_load.CpuUse(busy=9e9, steal=0.0, own=0.0, wall=200.0, cpus=4)
    assert machine_load.sharing(before, other_cpus) is None  # the affinity changed between


def test_a_short_window_or_one_cpu_is_said_plainly():
    busy = machine_load.Sharing(seconds=0.5, cpus=1, others_cpus=0.6, stolen_share=0.3)
    assert busy.describe() is None  # under a second, 10 ms ticks alone move it by 0.1 CPUs
    busy = machine_load.Sharing(seconds=2.0, cpus=1, others_cpus=0.6, stolen_share=0.3)
    assert busy.describe() == (
        "other processes kept 0.6 of the CPU busy and the hypervisor gave 30% of the CPU's "
        "time to other guests"
    )


def test_this_machine_reads_its_own_use_where_linux_gives_it():
    before = machine_load.cpu_use()
    if before is None:
        pytest.skip("no /proc/stat here")
    start = time.process_time()
    while time.process_time() - start < 0.2:  # CPU time of our own: 20 clock ticks
        pass
    after = machine_load.cpu_use()
    own, busy = after.own - before.own, after.busy - before.busy
    wall = after.wall - before.wall
    assert 0.15 <= own <= wall + 0.05  # seconds, not ticks: one thread's worth at most
    assert busy >= 0.5 * own  # our own time is inside the CPUs' busy time
    assert busy <= after.cpus * wall + 0.1
    assert after.cpus == before.cpus == len(os.sched_getaffinity(0))


def test_tune_warns_when_others_shared_its_final_check_and_says_so_in_json(monkeypatch, capsys):
    busy = machine_load.Sharing(seconds=2.0, cpus=2, others_cpus=1.4, stolen_share=0.0)
    monkeypatch.setattr(machine_load, "sharing", lambda before, after: busy)
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--json", "--top-k", "1"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["verify_sharing"] == busy.as_dict()
    assert "warning: other processes kept 1.4 of the 2 CPUs busy during the final check" in out.err
    # an idle machine: the reading is in the JSON, and nothing is said
    idle = machine_load.Sharing(seconds=2.0, cpus=2, others_cpus=0.02, stolen_share=0.0)
    monkeypatch.setattr(machine_load, "sharing", lambda before, after: idle)
    assert main(argv) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["verify_sharing"]["others_cpus"] == 0.02
    assert "final check" not in out.err
    # --no-verify times nothing: no reading
    assert main([*argv, "--no-verify"]) == 0
    assert json.loads(capsys.readouterr().out)["verify_sharing"] is None
