"""Stop 109: a SIGTERM that landed in one of islpy's callbacks (CI, a build stopped after its first
kernel) printed a traceback: islpy reports an exception raised in a callback through
``sys.excepthook`` and fails the isl call, where the command's own handler never sees it."""

from __future__ import annotations

import sys
import threading

import islpy as isl
import pytest
from aotune import cli


def _callback_raising_an_interrupt() -> None:
    def callback(_basic_set: isl.BasicSet) -> None:
        raise KeyboardInterrupt

    with pytest.raises(isl.Error):  # islpy fails the call it could not finish
        isl.Set("{ [i] : 0 <= i < 4 }").foreach_basic_set(callback)


def _join_hook_threads() -> None:
    for t in threading.enumerate():
        if t is not threading.current_thread() and t.daemon:
            t.join(timeout=5)


def test_an_interrupt_in_an_islpy_callback_is_sent_again_without_a_traceback(monkeypatch, capsys):
    """During a command, once the interrupt was seen, islpy's report of it prints nothing and the
    interrupt is sent again, to be raised where it can stop the command."""
    sent: list[int] = []
    monkeypatch.setattr(cli, "_interrupt_seen", True)
    monkeypatch.setattr(cli, "_running_command", True)
    monkeypatch.setattr(cli, "_send_lost_interrupt_again", lambda: sent.append(1))
    monkeypatch.setattr(sys, "excepthook", cli._on_reported)
    _callback_raising_an_interrupt()
    _join_hook_threads()
    assert sent == [1]
    assert "Traceback" not in capsys.readouterr().err


def test_other_reported_exceptions_still_print(monkeypatch, capsys):
    """Without an interrupt seen, a reported exception is printed as Python would."""
    monkeypatch.setattr(cli, "_interrupt_seen", False)
    monkeypatch.setattr(sys, "excepthook", cli._on_reported)
    _callback_raising_an_interrupt()
    assert "KeyboardInterrupt" in capsys.readouterr().err


def test_a_command_in_process_puts_the_callers_hooks_back():
    """Called with arguments (tests, scripts), ``main`` leaves ``sys.excepthook`` as it was."""
    before = sys.excepthook
    cli.main(["hw", "list"])
    assert sys.excepthook is before
