"""Shared fixtures: small specs and workloads that keep the suite fast on a 2-core machine."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from aotune.hwspecs.spec import HwSpec, load_target


def small_spec(base: str = "haswell", **core: int) -> HwSpec:
    """A built-in spec with a few core fields replaced (e.g. cores=2)."""
    spec = load_target(base)
    return dataclasses.replace(spec, core=dataclasses.replace(spec.core, **core))


@pytest.fixture(scope="session")
def host():
    return load_target("host")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """How many distinct inputs the fuzz suite tried (the README reports a long run's count)."""
    for module in list(sys.modules.values()):
        tried = getattr(module, "TRIED", None)
        if getattr(module, "__name__", "").endswith("test_fuzz") and isinstance(tried, set):
            terminalreporter.write_line(f"fuzz: {len(tried)} distinct inputs tried")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Commands that use the default tuning database write under a temporary cache directory,
    never the user's (subprocesses inherit it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
