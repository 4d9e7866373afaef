"""Bad input found at stop 102: each test failed before its fix."""

from __future__ import annotations

import pytest
from aotune.cli import main


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["tune", "matmul", "--shape", "4x4x4", "--bogus", "1"], "'aotune tune --help'"),
        (["db", "list", "--zzz"], "'aotune db list --help'"),
        (["hw", "show", "znver4", "extra"], "'aotune hw show --help'"),
        (["hw", "--zz"], "'aotune hw --help'"),
    ],
)
def test_arguments_left_over_point_to_the_subcommands_help(capsys, argv, hint):
    """They all said "(see 'aotune --help')", whose text lists no subcommand's options."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and f"(see {hint})" in err
