"""Shared fixtures: small specs and workloads that keep the suite fast on a 2-core machine."""

from __future__ import annotations

import dataclasses
import os
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


# the suite's workers (pytest-xdist): more than this only adds memory, not speed, on a shared box
MAX_WORKERS = 8


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: one worker per CPU this process may use (at most ``MAX_WORKERS``); on a single
    CPU none, so the tests run in this process."""
    cpus = len(os.sched_getaffinity(0))
    return min(cpus, MAX_WORKERS) if cpus > 1 else 0


# the fuzz inputs the workers tried, gathered on the controller
_FUZZ_KEY = pytest.StashKey[set]()


def _fuzz_tried() -> set[tuple[str, ...]]:
    """The distinct inputs this process's fuzz tests tried (none where they did not run here)."""
    for module in list(sys.modules.values()):
        tried = getattr(module, "TRIED", None)
        if getattr(module, "__name__", "").endswith("test_fuzz") and isinstance(tried, set):
            return tried
    return set()


def pytest_sessionfinish(session) -> None:
    """A worker sends the fuzz inputs it tried to the controller, which counts them."""
    sent = getattr(session.config, "workeroutput", None)
    if sent is not None:
        sent["fuzz_tried"] = sorted(list(argv) for argv in _fuzz_tried())


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """The controller gathers each worker's fuzz inputs (pytest-xdist's hook)."""
    tried = getattr(node, "workeroutput", {}).get("fuzz_tried", [])
    node.config.stash.setdefault(_FUZZ_KEY, set()).update(tuple(argv) for argv in tried)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """How many distinct inputs the fuzz suite tried (the README reports a long run's count)."""
    tried = _fuzz_tried() | config.stash.get(_FUZZ_KEY, set())
    if tried:
        terminalreporter.write_line(f"fuzz: {len(tried)} distinct inputs tried")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Commands that use the default tuning database write under a temporary cache directory,
    never the user's (subprocesses inherit it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
