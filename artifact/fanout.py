"""Searches of independent workloads, spread over processes or a Dask cluster.

Each task is ``search.cached.search_record(workload, hw, options)``: plain data in, plain data
(a ``TuneRecord``) out, nothing measured, so it runs the same anywhere. Results come back to the
submitting process, which alone writes the database (``done`` is called there, as each task
finishes, so a build stopped at any moment keeps every finished search).

    jobs == 1, no cluster   in this process, one after another
    jobs > 1                a local process pool (spawned: no LLVM or thread state is forked)
    cluster ADDRESS         Dask ``distributed``: a scheduler address, or a Client's cluster

Ctrl-C cancels what has not finished and re-raises ``KeyboardInterrupt`` after the pool or the
client is shut down.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aotune.analysis.workload import Workload
from aotune.errors import AotuneError, BuildError
from aotune.hwspecs.spec import HwSpec
from aotune.search.cached import search_record
from aotune.search.database import TuneRecord
from aotune.search.options import SearchOptions


@dataclass(frozen=True)
class SearchTask:
    """One workload to search; ``label`` names it in progress and errors."""

    key: str
    label: str
    workload: Workload
    hw: HwSpec
    options: SearchOptions


Started = Callable[[SearchTask], None]
Done = Callable[[SearchTask, TuneRecord], None]


def run_searches(
    tasks: Sequence[SearchTask],
    jobs: int,
    cluster: str | None = None,
    started: Started | None = None,
    done: Done | None = None,
) -> list[tuple[SearchTask, AotuneError]]:
    """Run every task; ``done`` gets each record as it arrives. Returns the tasks whose search
    raised a project error (the others still finish)."""
    if not tasks:
        return []
    started = started or (lambda t: None)
    done = done or (lambda t, r: None)
    if cluster:
        return _dask(tasks, cluster, started, done)
    if jobs <= 1 or len(tasks) == 1:
        failed = []
        for t in tasks:
            started(t)
            try:
                done(t, search_record(t.workload, t.hw, t.options))
            except AotuneError as e:
                failed.append((t, e))
        return failed
    return _pool(tasks, jobs, started, done)


def _pool(tasks: Sequence[SearchTask], jobs: int, started: Started, done: Done) -> list:
    failed = []
    workers = min(jobs, len(tasks))
    pool = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {
            pool.submit(search_record, t.workload, t.hw, t.options): i for i, t in enumerate(tasks)
        }
        # a pool takes tasks in order: the first ``workers`` run now, each finish starts the next
        for t in tasks[:workers]:
            started(t)
        next_up = workers
        for fut in cf.as_completed(futures):
            t = tasks[futures[fut]]
            try:
                done(t, fut.result())
            except AotuneError as e:
                failed.append((t, e))
            if next_up < len(tasks):
                started(tasks[next_up])
                next_up += 1
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return failed


def scheduler_host_port(address: str) -> tuple[str, int]:
    """(host, port) of a scheduler address ``[SCHEME://]HOST:PORT``, or a BuildError that shows
    the form: checked before anything runs, even where every kernel comes from the database."""
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or not port or parts.path not in ("", "/"):
        raise BuildError(
            f"--cluster {address}: give the scheduler as tcp://HOST:PORT, e.g. tcp://host:8786"
        )
    return host, port


def _check_reachable(address: Any) -> None:
    """Refuse a ``tcp://host:port`` nobody listens on at once (a Client would retry for its
    whole timeout before saying so)."""
    import socket

    if not isinstance(address, str) or not address.startswith("tcp://"):
        return
    host, port = scheduler_host_port(address)
    try:
        socket.create_connection((host, port), timeout=10).close()
    except OSError as e:
        raise BuildError(
            f"cannot reach the Dask scheduler at {address} ({e.strerror or e}); start one with "
            "'dask scheduler' and workers with 'dask worker ADDRESS', or drop --cluster"
        ) from None


def _dask(tasks: Sequence[SearchTask], address: Any, started: Started, done: Done) -> list:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise BuildError(
            "--cluster needs Dask's distributed package: pip install distributed"
        ) from None
    _check_reachable(address)
    try:
        client = Client(address, timeout="20s")
    except (OSError, TimeoutError, ValueError) as e:
        raise BuildError(
            f"cannot reach the Dask scheduler at {address} ({e}); start one with "
            "'dask scheduler' and workers with 'dask worker ADDRESS', or drop --cluster"
        ) from None
    failed = []
    try:
        futures = {
            client.submit(search_record, t.workload, t.hw, t.options, pure=False): t for t in tasks
        }
        for t in tasks:
            started(t)
        try:
            for fut in as_completed(list(futures)):
                t = futures[fut]
                try:
                    done(t, fut.result())
                except AotuneError as e:
                    failed.append((t, e))
        except BaseException:
            client.cancel(list(futures))
            raise
    finally:
        client.close()
    return failed
