"""What else ran on the machine while aotune measured (``machine_load``): /proc/stat's parsing
and the shares it gives, on synthetic readings; the warnings of the commands that use it are
tested beside those commands."""

from __future__ import annotations

import json
import time

import pytest
from aotune import machine_load
from aotune.cli import main
from aotune.hwspecs import calibrate as cal


def test_proc_stat_gives_busy_and_stolen_seconds_of_all_cpus():
    text = (
        "cpu  6825379 1294 350697 6192920 42701 0 3224 7511 0 0\n"
        "cpu0 2434351 36 155276 4090242 6926 0 715 4415 0 0\nintr 1 2 3\n"
    )
    busy, steal = machine_load.parse_proc_stat(text, 100)
    assert busy == pytest.approx((6825379 + 1294 + 350697 + 0 + 3224) / 100)
    assert steal == pytest.approx(75.11)
    # a kernel before steal was counted (7 fields) has none; garbage or no cpu line: unknown
    assert machine_load.parse_proc_stat("cpu 1 2 3 4 5 6 7\n", 100) == (pytest.approx(0.19), 0.0)
    assert machine_load.parse_proc_stat("cpu0 1 2 3 4 5 6 7 8\n", 100) is None
    assert machine_load.parse_proc_stat("cpu 1 x 3 4 5 6 7 8\n", 100) is None
    assert machine_load.parse_proc_stat("cpu 1 2 3\n", 100) is None


@pytest.mark.parametrize(
    "busy, steal, own, expect",
    [
        (100.0, 0.0, 99.0, None),  # only the probes ran (1 CPU-s of daemons in 100 s)
        (150.0, 0.0, 100.0, "other processes kept 0.5 of the 2 CPUs busy"),
        (100.0, 20.0, 100.0, "gave 10% of the CPUs' time to other guests"),
        (300.0, 40.0, 100.0, "kept 2.0 of the 2 CPUs busy and the hypervisor gave 20%"),
    ],
)
def test_a_shared_machine_is_described_and_an_idle_one_is_not(busy, steal, own, expect):
    before = machine_load.CpuUse(busy=1000.0, steal=5.0, own=1.0, wall=50.0)
    after = machine_load.CpuUse(busy=1000.0 + busy, steal=5.0 + steal, own=1.0 + own, wall=150.0)
    warning = cal.sharing_warning(before, after, cpus=2)
    if expect is None:
        assert warning is None
    else:
        assert (
            expect in warning and "rerun `aotune hw calibrate` when the machine is idle" in warning
        )
    assert (
        cal.sharing_warning(None, after, 2) is None and cal.sharing_warning(after, after, 2) is None
    )


def test_this_machine_reads_its_own_use_where_linux_gives_it():
    before = machine_load.cpu_use()
    if before is None:
        pytest.skip("no /proc/stat here")
    start = time.process_time()
    while time.process_time() - start < 0.05:  # some CPU time of our own: 5 clock ticks
        pass
    after = machine_load.cpu_use()
    assert after.own > before.own and after.busy >= before.busy and after.wall > before.wall


def test_tune_warns_when_others_shared_its_final_check_and_says_so_in_json(monkeypatch, capsys):
    busy = machine_load.Sharing(seconds=2.0, cpus=2, others_cpus=1.4, stolen_share=0.0)
    monkeypatch.setattr(machine_load, "sharing", lambda before, after, cpus=None: busy)
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--json", "--top-k", "1"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["verify_sharing"] == busy.as_dict()
    assert "warning: other processes kept 1.4 of the 2 CPUs busy during the final check" in out.err
    # an idle machine: the reading is in the JSON, and nothing is said
    idle = machine_load.Sharing(seconds=2.0, cpus=2, others_cpus=0.02, stolen_share=0.0)
    monkeypatch.setattr(machine_load, "sharing", lambda before, after, cpus=None: idle)
    assert main(argv) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["verify_sharing"]["others_cpus"] == 0.02
    assert "final check" not in out.err
    # --no-verify times nothing: no reading
    assert main([*argv, "--no-verify"]) == 0
    assert json.loads(capsys.readouterr().out)["verify_sharing"] is None
