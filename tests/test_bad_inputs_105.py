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
