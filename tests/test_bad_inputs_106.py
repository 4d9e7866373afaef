"""Found and fixed at stop 106: each test failed before."""

from __future__ import annotations

import shutil

from aotune.cli import main
from aotune.hwspecs.spec import SPEC_DIR


def test_a_spec_file_shadowed_by_a_target_name_is_named_in_a_warning(tmp_path, monkeypatch, capsys):
    """A spec file saved as ``host`` or ``znver4`` in the working folder was passed over for the
    built-in of that name without a word: the user's calibration silently unused."""
    monkeypatch.chdir(tmp_path)
    for name in ("host", "znver4"):
        shutil.copy(SPEC_DIR / "znver4.toml", tmp_path / name)
        assert main(["hw", "show", name]) == 0
        err = capsys.readouterr().err
        assert err == (
            f"warning: target {name} is the built-in name, not the file {name} in this folder; "
            f"give ./{name} to use the file\n"
        )
        assert main(["hw", "show", f"./{name}"]) == 0  # the file itself: no warning
        assert capsys.readouterr().err == ""
    # the default target is not something the user typed
    assert main(["tune", "--shape", "8x8x8", "--no-verify", "--json"]) == 0
    assert "warning: target" not in capsys.readouterr().err
    assert main(["tune", "--target", "znver4", "--shape", "8x8x8", "--no-verify", "--json"]) == 0
    assert "not the file znver4 in this folder" in capsys.readouterr().err
