"""Shared fixtures: small specs and workloads that keep the suite fast on a 2-core machine."""

from __future__ import annotations

import dataclasses

import pytest
from aotune.hwspecs.spec import HwSpec, load_target


def small_spec(base: str = "haswell", **core: int) -> HwSpec:
    """A built-in spec with a few core fields replaced (e.g. cores=2)."""
    spec = load_target(base)
    return dataclasses.replace(spec, core=dataclasses.replace(spec.core, **core))


@pytest.fixture(scope="session")
def host():
    return load_target("host")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Commands that use the default tuning database write under a temporary cache directory,
    never the user's (subprocesses inherit it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
