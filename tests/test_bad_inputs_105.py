"""Found and fixed at stop 105: each test failed before."""

from __future__ import annotations

from aotune.cli import main
from aotune.hwspecs import calibrate as cal
from aotune.hwspecs.spec import load_spec_file

from .test_calibrate import HOST, hand_made


def test_calibrate_says_what_it_waits_for_where_no_progress_bar_shows(
    tmp_path, monkeypatch, capsys
):
    """Without a terminal the progress bar is off, and minutes passed without a word."""
    monkeypatch.setattr(cal, "check_can_calibrate", lambda: (HOST, HOST))
    monkeypatch.setattr(cal, "calibrate", lambda progress=None: hand_made())
    path = tmp_path / "mine.toml"
    assert main(["hw", "calibrate", "--repeat", "2", "-o", str(path)]) == 0
    err = capsys.readouterr().err
    said = f"hw calibrate: measuring this machine, 2 run(s) of {len(cal.PROBES) + 1} probes"
    assert err.startswith(said) and err.count("\n") == 1
    assert load_spec_file(path).name == "mine"


def test_a_cache_level_read_slower_than_the_next_is_assumed_not_refused_at_the_end():
    """A busy slice read L2 at 101 cycles while L3, which did not step to memory, took the
    built-in's 72: the spec was out of order and the calibration failed after its minutes."""
    from aotune.hwspecs.probes import Finding, latencies_in_order
    from aotune.hwspecs.spec import load_target
    from aotune.hwspecs.spec_toml import value_at

    base = load_target("emeraldrapids")
    paths = [f"caches.L{c.level}.latency_cycles" for c in base.caches]

    def assumed(path: str, why: str) -> Finding:
        return Finding(value_at(base, path), f"assumed: from built-in spec {base.name}: {why}")

    found = {
        paths[0]: Finding(5, "measured: chase"),
        paths[1]: Finding(101, "measured: chase"),
        paths[2]: assumed(paths[2], "no step to memory"),
    }
    out, notes = latencies_in_order(found, paths, assumed)
    values = [out[p].value for p in paths]
    assert values == sorted(values) and len(set(values)) == 3
    assert out[paths[1]].origin.startswith("assumed:") and "101" in out[paths[1]].origin
    assert out[paths[0]] == found[paths[0]] and len(notes) == 1
    # in order already: nothing changes
    fine = {**found, paths[1]: Finding(16, "measured: chase")}
    assert latencies_in_order(fine, paths, assumed) == (fine, [])
    # the level beyond below even the assumed value: both take the built-in's
    low = {**found, paths[2]: Finding(12, "measured: chase")}
    out, _ = latencies_in_order(low, paths, assumed)
    assert [out[p].value for p in paths[1:]] == [value_at(base, p) for p in paths[1:]]
