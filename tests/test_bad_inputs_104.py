"""Bad input fixed at stop 104 (left open at stop 103): each test failed before."""

from __future__ import annotations

import pytest
from aotune.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        # a line break in a path was joined as a space: 'a b.toml' is another file
        (["tune", "--target", "a\nb.toml"], "no spec file a\\nb.toml (no such file)"),
        (["tune", "--target=a\tb.toml"], "no spec file a\\tb.toml (no such file)"),
        # and so was the folder of one
        (["tune", "--emit-asm", "/no\nsuch/x.s"], "/no\\nsuch does not exist"),
        # a non-UTF-8 byte showed as Python's surrogate escape, \udcff
        (["tune", "--target", "a\udcffb.toml"], "no spec file a\\xffb.toml"),
    ],
)
def test_a_path_is_shown_as_typed_with_its_breaks_escaped(capsys, argv, said):
    """The message names the file the user gave, not one with a space where its break was."""
    assert main([*argv, "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert said in err
    assert "\udcff" not in err and err.count("\n") == 1


def test_a_line_break_in_an_llvm_or_os_message_is_still_joined():
    """Only a value the command line gave is escaped; a message's own lines join as before."""
    from aotune import cli

    cli._given_arguments = ("--target", "x.toml")
    assert cli._one_line("line one\nline two") == "line one line two"
