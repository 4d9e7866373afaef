"""Searches of independent workloads, spread over processes or a Dask cluster.

Each task is ``search.cached.search_record(workload, hw, options)``: plain data in, plain data
(a ``TuneRecord``) out, nothing measured, so it runs the same anywhere. Results come back to the
submitting process, which alone writes the database (``done`` is called there, as each task
finishes, so a build stopped at any moment keeps every finished search).

    jobs == 1, no cluster   in this process, one after another
    jobs > 1                a local process pool (spawned: no LLVM or thread state is forked)
    cluster ADDRESS         Dask ``distributed``: a scheduler address, or a Client's cluster;
                            a TCP address must answer Dask's handshake as a scheduler within
                            CONNECT_TIMEOUT_S (check_scheduler) before a Client is made

Ctrl-C cancels what has not finished and re-raises ``KeyboardInterrupt`` after the pool or the
client is shut down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import multiprocessing
import socket
import threading
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


# how long a --cluster address has to answer (connect, Dask's handshake, the Client's start)
CONNECT_TIMEOUT_S = 20.0

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
    """(host, port) of a scheduler address ``[tcp://]HOST:PORT``, or a BuildError that shows
    the form: checked before anything runs, even where every kernel comes from the database."""
    from urllib.parse import urlsplit

    try:  # a malformed IPv6 host ("tcp://[::1:8786") fails in urlsplit itself
        parts = urlsplit(address if "://" in address else f"tcp://{address}")
        host, port = parts.hostname, parts.port
    except ValueError:
        parts, host, port = None, None, None
    if parts is not None and parts.scheme != "tcp":
        # tls:// needs certificates and ucx:// a driver that a bare address does not configure
        raise BuildError(
            f"--cluster {address}: only a tcp:// scheduler can be given by address (a "
            f"{parts.scheme}:// one needs a security or transport configuration); give it as "
            "tcp://HOST:PORT"
        )
    if parts is None or not host or not port or parts.path not in ("", "/"):
        raise BuildError(
            f"--cluster {address}: give the scheduler as tcp://HOST:PORT, e.g. tcp://host:8786"
        )
    return host, port


def _tcp_address(address: Any) -> str | None:
    """``address`` as ``tcp://HOST:PORT`` where it is a TCP address (a bare ``HOST:PORT`` is
    one: Dask reads it so), else None (another scheme, or a Client's cluster object)."""
    if not isinstance(address, str):
        return None
    if "://" not in address:
        return f"tcp://{address}"
    return address if address.startswith("tcp://") else None


def _start_hint(address: str) -> str:
    """How to get a scheduler at ``address`` (or do without one), for the end of a message."""
    return (
        f"start one there with 'dask scheduler' (and workers with 'dask worker {address}'), "
        "or drop --cluster"
    )


def check_scheduler(address: Any, timeout: float | None = None) -> None:
    """A BuildError, within about ``timeout`` seconds (default ``CONNECT_TIMEOUT_S``), unless
    a Dask scheduler answers at the TCP ``address``: nobody listening, nobody answering (a
    Client would wait for ever on the handshake), a service that speaks another protocol (Dask
    would read its reply as a frame size and run out of memory) or a Dask worker's port."""
    tcp = _tcp_address(address)
    if tcp is None:  # tls://, inproc://, a cluster object: Dask's own checks
        return
    limit = CONNECT_TIMEOUT_S if timeout is None else timeout
    _check_reachable(tcp, limit)
    result: list[Any] = []
    # a thread of its own: the caller may be running an event loop (a notebook)
    probe = threading.Thread(
        target=lambda: result.append(_handshake(tcp, limit)), name="aotune-dask-probe"
    )
    probe.daemon = True
    probe.start()
    probe.join(limit + 5)  # the probe ends itself at ``limit``; this is a backstop
    outcome = result[0] if result else TimeoutError()
    # Dask's connect says "Timed out trying to connect" as an OSError
    timed_out = isinstance(outcome, TimeoutError) or (
        isinstance(outcome, OSError) and "timed out" in str(outcome).lower()
    )
    # Dask retries a connection the peer drops until its time is up (on a busy machine it
    # runs out before the drop is seen): ask the socket whether the peer hangs up at once
    if timed_out and _closes_at_once(tcp, min(limit, 1.0)):
        outcome, timed_out = ConnectionAbortedError("closed by the peer"), False
    if timed_out:
        raise BuildError(
            f"nothing at {address} answered as a Dask scheduler within {limit:g} s (something "
            f"accepts connections there but says nothing); {_start_hint(address)}"
        )
    if isinstance(outcome, BaseException):
        why = (
            "it closed the connection"
            if isinstance(outcome, OSError)
            else "its reply is not Dask's protocol"
        )
        raise BuildError(
            f"{address} answered, but not as a Dask scheduler ({why}); is it the scheduler's "
            f"port (8786 unless it was started with another)? {_start_hint(address)}"
        )
    if outcome in ("Worker", "Nanny"):
        raise BuildError(
            f"{address} is a Dask {outcome.lower()}, not the scheduler; give --cluster the "
            "scheduler's address (the one 'dask worker' was started with)"
        )


def _handshake(address: str, timeout: float) -> Any:
    """Dask's handshake and an ``identity`` call at ``address``, all within ``timeout``: what
    the peer says it is (``Scheduler``, ``Worker``...), or the exception that stopped it."""
    from distributed.comm import connect
    from distributed.core import send_recv

    async def talk() -> Any:
        # deserialize=False: a stranger's reply is never unpickled
        comm = await connect(address, timeout=timeout, deserialize=False)
        try:
            who = await send_recv(comm, op="identity")
        finally:
            comm.abort()
        return who.get("type") if isinstance(who, dict) else None

    async def bounded() -> Any:
        return await asyncio.wait_for(talk(), timeout)

    try:
        return asyncio.run(bounded())
    except BaseException as e:  # MemoryError, msgpack's, comm errors: all say "not Dask"
        return e


def _closes_at_once(address: str, timeout: float) -> bool:
    """Whether the service at the TCP ``address`` accepts a connection and closes it without a
    word within ``timeout`` seconds (a silent one keeps it open; a Dask scheduler speaks)."""
    host, port = scheduler_host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(1) == b""
    except OSError:  # silent until the timeout, reset, or gone: not a clean hang-up
        return False


def _check_reachable(address: str, timeout: float) -> None:
    """Refuse a ``tcp://host:port`` nobody listens on at once (Dask would retry for its whole
    timeout before saying so), and one no connection reaches within ``timeout``."""
    host, port = scheduler_host_port(address)
    try:
        socket.create_connection((host, port), timeout=min(timeout, 10)).close()
    except TimeoutError:
        raise BuildError(
            f"nothing at {address} answered within {min(timeout, 10):g} s (no route to it, or "
            f"a firewall drops the connection); check the address, {_start_hint(address)}"
        ) from None
    except OSError as e:
        raise BuildError(
            f"cannot reach the Dask scheduler at {address} ({e.strerror or e}); start one with "
            "'dask scheduler' and workers with 'dask worker ADDRESS', or drop --cluster"
        ) from None


def _dask(
    tasks: Sequence[SearchTask],
    address: Any,
    started: Started,
    done: Done,
    timeout: float | None = None,
) -> list:
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise BuildError(
            "--cluster needs Dask's distributed package: pip install distributed"
        ) from None
    limit = CONNECT_TIMEOUT_S if timeout is None else timeout
    if isinstance(address, str):
        scheduler_host_port(address)
    check_scheduler(address, limit)
    try:
        client = Client(address, timeout=limit)
    # MemoryError: Dask reading a stranger's reply as a frame size (check_scheduler saw a
    # scheduler; this is one that changed since)
    except (OSError, TimeoutError, ValueError, MemoryError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BuildError(
            f"cannot connect to the Dask scheduler at {address} ({first}); "
            f"{_start_hint(str(address))}"
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
