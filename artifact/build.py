"""``aotune build``: a kernel list or an ONNX model -> a library on disk, through the database.

    input      inputs.read_input: named workloads (TOML) or a model's kernels and skipped ops
    outdir     check_output_dir: new (in an existing folder), empty, or holding only what an
               earlier build wrote (its manifest lists every file with a hash); anything else
               needs --force;
               stage_output_dir: a staging directory made now, before any search (beside a new
               output directory, inside an existing one), so an output directory that cannot
               be created or written fails in a second
    backend    targets.backend_for(hw).preflight: the tools, before any search
    search     one task per distinct workload without a record (or all, with --retune),
               fanned out (fanout.run_searches); each record is stored the moment it arrives
    check      where this host runs the target and --verify: the final check of each record's
               top-k (timed with numpy, once per record: the measurements are stored with it);
               the library's kernel is the fastest correct one, else the best predicted
    emit       backend.emit into the staging directory: objects, header, .so/.a (CPU), then
               manifest.json last
    verify     backend.check: every function of the written library against numpy
    install    install_output: the staged files moved into the output directory (a new one is
               the staging directory renamed), then the earlier build's other files removed,
               under a lock on the folder (two builds into one install one after the other)

A build stopped at any point leaves a database with every finished search and no partial
record; running the same command again resumes from there. A build that fails (or is stopped)
leaves the output directory as it was: nothing is moved there before everything succeeded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aotune
from aotune.artifact.backends import LIBRARY, Check, Chosen, backend_for
from aotune.artifact.fanout import SearchTask, run_searches
from aotune.artifact.inputs import KernelList, SkippedOp
from aotune.artifact.names import DEFAULT_PREFIX, PREFIX_PATTERN, Names
from aotune.errors import BuildError, DatabaseError
from aotune.files import cannot_be_replaced, file_identity
from aotune.hwspecs.spec import HwSpec
from aotune.search import driver
from aotune.search.cached import fitting_schedules, record_key, result_of, store_check
from aotune.search.database import (
    CandidateRecord,
    TuneRecord,
    TuningDatabase,
    model_version,
    spec_hash,
)
from aotune.search.options import SearchOptions
from aotune.targets import target_for

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
STAGING = ".aotune-partial-"  # the directory a build writes into before installing its files
# what a progress display is told: (kernel names, state); states below
Event = Callable[[str, str], None]
STATES = ("queued", "database", "searching", "searched", "checking", "done", "failed")


@dataclass(frozen=True)
class BuildOptions:
    """How to build (the CLI's flags)."""

    out_dir: Path
    search: SearchOptions = SearchOptions()
    jobs: int = 1
    cluster: str | None = None
    retune: bool = False
    verify: bool = True
    force: bool = False
    cc: str | None = None
    objects_only: bool = False
    # what the build reads (a name for messages -> its path): never replaced by what it writes
    inputs: tuple[tuple[str, str], ...] = ()
    prefix: str = DEFAULT_PREFIX  # the library's global names (check_prefix)


@dataclass(frozen=True)
class KernelReport:
    """One function of the built library, as the report shows it."""

    name: str
    describe: str
    flops: int
    config: str
    predicted_seconds: float
    measured_seconds: float | None
    numpy_gflops: float | None
    reused: bool
    record: int | None
    nodes: tuple[str, ...]
    check: Check | None

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "name": self.name,
            "workload": self.describe,
            "config": self.config,
            "predicted_seconds": self.predicted_seconds,
            "predicted_gflops": self.flops / self.predicted_seconds / 1e9,
            "measured_seconds": self.measured_seconds,
            "measured_gflops": (
                self.flops / self.measured_seconds / 1e9 if self.measured_seconds else None
            ),
            "numpy_gflops": self.numpy_gflops,
            "from_database": self.reused,
            "record": self.record,
            "nodes": list(self.nodes),
            "check": None
            if self.check is None
            else {
                "correct": self.check.ok,
                "max_abs_error": self.check.max_abs_error,
                "tolerance": self.check.tolerance,
            },
        }


@dataclass(frozen=True)
class BuildReport:
    """What a build made."""

    target: HwSpec
    out_dir: Path
    source: str
    kernels: tuple[KernelReport, ...]
    skipped: tuple[SkippedOp, ...]
    files: tuple[str, ...]
    notes: tuple[str, ...]
    seconds: float
    searched: int
    reused: int
    database: str
    check_skipped: str | None = None
    library_check: str | None = None  # how the written library was checked, or why it was not
    failed: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``aotune build --json``)."""
        return {
            "target": {"name": self.target.name, "kind": self.target.kind},
            "out_dir": str(self.out_dir),
            "source": self.source,
            "seconds": round(self.seconds, 3),
            "searched": self.searched,
            "from_database": self.reused,
            "database": self.database,
            "kernels": [k.as_dict() for k in self.kernels],
            "skipped": [vars(s) for s in self.skipped],
            "files": list(self.files),
            "notes": list(self.notes),
            "check_skipped": self.check_skipped,
            "library_check": self.library_check,
        }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_library_check_memory(kernels: KernelList, verify: bool) -> None:
    """Refuse, before any search, a build whose library check (each kernel against numpy, here)
    would not fit in the memory available now: it ran out of memory after the searches, and
    the advice then named --no-verify, which does not skip it."""
    from aotune.codegen.runner import final_check_bytes
    from aotune.hwspecs.host import available_memory_bytes

    have = available_memory_bytes()
    for k in kernels.kernels:
        need = final_check_bytes(k.workload, 1, 1)
        if have is not None and need > 0.9 * have:
            flags = "--objects-only --no-verify" if verify else "--objects-only"
            raise BuildError(
                f"kernel {k.name}: the library check of {k.workload.op} "
                f"{'x'.join(str(v) for _, v in k.workload.shape)} needs about "
                f"{need / 2**30:.1f} GiB and {have / 2**30:.1f} GiB is available; pass {flags} "
                "to write the objects and header without running them here, or use a smaller shape"
            )


def check_output_dir(out: Path, force: bool) -> list[Path]:
    """Make sure writing into ``out`` overwrites nothing the user had (unless ``force``); the
    files of an earlier build there, to be replaced."""
    try:
        return _earlier_files(out, force)
    except OSError as e:  # an unreadable directory or file in it
        raise BuildError(
            f"-o {out}: cannot read {e.filename or 'it'} ({e.strerror}); choose a directory you "
            "can read and write"
        ) from None


def _earlier_files(out: Path, force: bool) -> list[Path]:
    if out.is_symlink() and not out.exists():
        raise BuildError(f"-o {out} is a symbolic link to nothing; give a directory (new or empty)")
    if out.exists() and not out.is_dir():
        raise BuildError(f"-o {out} is a file; give a directory (new or empty)")
    if not out.exists():
        return []
    present = sorted(
        p
        for p in out.rglob("*")
        if (p.is_file() or p.is_symlink())
        # another build's staging directory (running, or killed): its files are not the user's
        and not p.relative_to(out).parts[0].startswith(STAGING)
    )
    if not present:
        return []
    listed: dict[str, str] = {}
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
            if data.get("aotune", {}).get("format") is not None:
                listed = dict(data.get("files", {}))
        except (ValueError, AttributeError, TypeError, RecursionError):
            listed = {}
    ours = []
    for p in present:
        rel = str(p.relative_to(out))
        if rel == MANIFEST and listed:
            ours.append(p)
            continue
        if rel in listed and p.is_file() and _sha256(p) == listed[rel]:
            ours.append(p)
            continue
        if force:
            continue
        why = "was changed since aotune wrote it" if rel in listed else "was not written by aotune"
        raise BuildError(
            f"{out} holds {rel}, which {why}; choose a new or empty directory with -o, "
            f"or pass --force to build there anyway (which replaces the files of the build's "
            f"own names: {LIBRARY}.h, lib{LIBRARY}.so or .a (or those of its --prefix), "
            f"objects/, ptx/, cubin/, {MANIFEST})"
        )
    for p in ours:  # each is replaced or removed at the install, after the whole build
        if cannot_be_replaced(p):
            raise BuildError(
                f"{out} holds {p.relative_to(out)}, an earlier build's file marked immutable or "
                "append-only (chattr), which the build must replace or remove; clear that "
                f"(chattr -i -a {p}) or choose another directory with -o"
            )
    return ours


def check_prefix(prefix: str | None, hw: HwSpec, kernels: KernelList) -> str:
    """``--prefix`` checked (None: the default), with the kernels' names it would clash with."""
    if prefix is None:
        return DEFAULT_PREFIX
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise BuildError(
            f"--prefix {prefix[:40]!r}: give lower-case letters and digits, words joined by one "
            "_, a letter first, 32 at most (e.g. vision): it begins the library's C names and "
            "files"
        )
    if hw.kind != "cpu" and prefix != DEFAULT_PREFIX:
        raise BuildError(
            f"--prefix names a CPU library's runtime and files; a {hw.kind} library has neither "
            "(its kernels are loaded by name): leave it out"
        )
    if prefix != DEFAULT_PREFIX:
        _check_prefix_names(Names(prefix))
    taken = [k.name for k in kernels.kernels if k.name.lower().startswith(f"{prefix}_")]
    if taken:
        raise BuildError(
            f"kernel {taken[0]!r} begins with the prefix {prefix}_, which the library's own "
            "functions take; rename the kernel or choose another --prefix"
        )
    return prefix


def _check_prefix_names(names: Names) -> None:
    """A BuildError where a global name the prefix gives the library is taken by the C library,
    a standard header, OpenMP and the like (``--prefix gai``: gai_strerror, libc's)."""
    from aotune.artifact.inputs import c_library_defines, reserved_name_reason
    from aotune.artifact.names import API, RESERVED_PREFIXES
    from aotune.artifact.runtime import ERRORS

    namespace = names.prefix.split("_")[0]
    if namespace in RESERVED_PREFIXES:
        raise BuildError(
            f"--prefix {names.prefix}: {namespace}_* is the namespace of a library programs "
            "link beside aotune's; choose another prefix"
        )
    public = [names.api(what) for what in API]
    macros = [names.error_macro(code) for code, _ in ERRORS] + [f"{names.macro}_KERNELS_H"]
    for name in public + macros:
        why = reserved_name_reason(name)
        if why is not None:
            raise BuildError(
                f"--prefix {names.prefix}: the library's {name} {why}; choose another prefix"
            )
    for name in (names.run, names.lock, names.unlock):  # hidden in a .so, global in the .a
        if c_library_defines(name):
            raise BuildError(
                f"--prefix {names.prefix}: the library's {name} is defined by the C library; "
                "choose another prefix"
            )


def check_output_parent(out: Path) -> None:
    """A BuildError where a new output directory ``out`` has no folder to be made in: a missing
    parent is refused as a likely typo (as ``--db`` and ``--emit-*`` refuse one), not made."""
    try:
        if out.exists() or out.is_symlink():  # an existing one: check_output_dir's to judge
            return
        parent = out.parent
        while not parent.exists() and not parent.is_symlink() and parent != parent.parent:
            parent = parent.parent
        if parent.exists() and not parent.is_dir():
            raise BuildError(
                f"-o {out}: {parent} is a file, not a directory; choose another output directory"
            )
        if not out.parent.is_dir():  # missing, or a symbolic link to nothing
            raise BuildError(
                f"cannot create -o {out}: {out.parent} does not exist; give -o a directory in "
                "an existing folder, or create the folder first"
            )
    except OSError as e:  # a path we may not even look at
        raise BuildError(
            f"-o {out}: cannot use it ({e.strerror}); choose a directory you can write"
        ) from None


@dataclass(frozen=True)
class Staging:
    """Where a build writes its files until they are complete, and what a failure undoes."""

    out: Path  # the output directory
    dir: Path  # the staging directory: beside a new ``out``, inside an existing one
    new_out: bool  # ``out`` did not exist: ``dir`` is renamed to it
    held: int = -1  # the descriptor of the lock on ``dir`` (_hold), closed once ``dir`` is gone


def stage_output_dir(out: Path) -> Staging:
    """The staging directory of a build into ``out``, made now: an output directory that
    cannot be created or written is an error before any search, not after it."""
    try:
        return _stage(out)
    except OSError as e:  # a path we may not even look at
        raise BuildError(
            f"-o {out}: cannot use it ({e.strerror}); choose a directory you can write"
        ) from None


def _stage(out: Path) -> Staging:
    _clear_abandoned(out)
    if out.exists():
        try:
            return _held(Path(tempfile.mkdtemp(prefix=STAGING, dir=out)), out, False)
        except OSError as e:
            raise BuildError(
                f"-o {out}: cannot write in this directory ({e.strerror}); choose a directory "
                "you can write"
            ) from None
    check_output_parent(out)
    try:
        tmp = tempfile.mkdtemp(prefix=f".{out.name[:40]}{STAGING}", dir=out.parent)
    except OSError as e:
        raise BuildError(
            f"-o {out}: cannot create it in {out.parent} ({e.strerror}); choose a directory you "
            "can write"
        ) from None
    return _held(Path(tmp), out, True)


def _held(tmp: Path, out: Path, new_out: bool) -> Staging:
    """The staging of ``tmp``, just made, once it holds its lock; removed again if that fails or
    a signal (a terminal that hung up) stops the build before the caller can clean up."""
    try:
        return Staging(out, tmp, new_out, _hold(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


HELD = ".held"  # in a staging directory: locked while its build runs


def _hold(staging_dir: Path) -> int:
    """A lock on ``staging_dir`` for as long as its build runs: the kernel drops it when the
    process ends, however it ends (killed, the machine down), so a later build can tell an
    abandoned staging directory from a running build's. Its descriptor."""
    made = staging_dir / f"{HELD}-new"
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(made, staging_dir / HELD)  # only a lock already held is ever seen under HELD
    return fd


def _release(staging: Staging) -> None:
    """Close the lock of a staging directory that is gone (removed, or renamed to the output)."""
    if staging.held >= 0:
        with contextlib.suppress(OSError):
            os.close(staging.held)


def _clear_abandoned(out: Path) -> None:
    """Remove the staging directories of builds into ``out`` that ended without cleaning up
    (SIGKILL, a crash, the machine down): those whose lock no process holds. One without a
    lock (being made this moment, or an older aotune's) is left alone."""
    beside = f".{out.name[:40]}{STAGING}"
    found: list[Path] = []
    for folder, prefix in ((out, STAGING), (out.parent, beside)):
        with contextlib.suppress(OSError):  # a folder we cannot list: the staging step says why
            found += [
                p
                for p in folder.iterdir()
                if p.name.startswith(prefix) and not p.name.startswith(f"{STAGING}replaced-")
            ]
    for d in found:
        try:
            fd = os.open(d / HELD, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its build runs
            if os.path.samestat(os.fstat(fd), os.stat(d / HELD)):  # not renamed away meanwhile
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass
        finally:
            os.close(fd)


def discard_staging(staging: Staging) -> None:
    """Undo a build that failed: its staging directory is removed."""
    shutil.rmtree(staging.dir, ignore_errors=True)
    _release(staging)


def _remove_dirs(dirs: list[Path]) -> None:
    """Remove the directories ``dirs`` (outermost first) where they are empty."""
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:  # not empty (someone else wrote there): theirs now
            pass


def install_output(
    staging: Staging, written: list[str], inputs: tuple[tuple[str, str], ...] = ()
) -> None:
    """Move the staged files (``written``, relative paths, the manifest last) into the output
    directory, then remove the earlier build's files that the new build did not replace;
    nothing is moved where one would replace an input (``inputs``: name, path)."""
    out = staging.out
    _check_destinations(out, written, inputs)
    try:
        if staging.new_out:  # one rename: the directory appears complete or not at all
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staging.dir, 0o777 & ~umask)  # mkdtemp makes 0700
            os.rename(staging.dir, out)
            (out / HELD).unlink(missing_ok=True)
            _release(staging)
            return
        with _installing_into(out):
            # read now, not when the build began: another build may have installed since
            old_files = _earlier_files(out, force=True)
            _replace_all_or_none(staging, written)
            emptied: set[Path] = set()
            for p in old_files:  # an earlier build's files: none of them left stale
                if str(p.relative_to(out)) not in written:
                    p.unlink(missing_ok=True)
                    emptied |= {d for d in p.parents if d != out and out in d.parents}
            _remove_dirs(sorted(emptied, key=lambda d: len(d.parts)))
        shutil.rmtree(staging.dir, ignore_errors=True)
        _release(staging)
    except OSError as e:
        kept = "" if staging.new_out else "; nothing in it was changed"
        raise BuildError(
            f"cannot move the built library into {out} ({e.strerror}){kept}: was it changed "
            "while aotune built, or is a file there read-only? fix that and build again"
        ) from None


def _replace_all_or_none(staging: Staging, written: list[str]) -> None:
    """Move the staged files into the output directory, each file it replaces set aside first:
    a failure or a Ctrl-C part-way puts every one back, so the directory holds the earlier
    library whole or the new one whole, never a mix of the two."""
    out = staging.out
    aside = Path(tempfile.mkdtemp(prefix=f"{STAGING}replaced-", dir=out))
    moved: list[tuple[Path, Path | None]] = []  # (destination, where its earlier file went)
    try:
        for rel in written:
            dst = out / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            saved = None
            if dst.exists() or dst.is_symlink():
                saved = aside / rel
                saved.parent.mkdir(parents=True, exist_ok=True)
                os.replace(dst, saved)
            moved.append((dst, saved))
            os.replace(staging.dir / rel, dst)
    except BaseException:
        try:
            for dst, saved in reversed(moved):
                if saved is None or saved.exists() or saved.is_symlink():
                    dst.unlink(missing_ok=True)  # the new file, where it got there
                if saved is not None and (saved.exists() or saved.is_symlink()):
                    os.replace(saved, dst)
        except OSError as e:
            raise BuildError(
                f"the install into {out} failed part-way and the earlier files could not all be "
                f"put back ({e.strerror}); those not back are in {aside}"
            ) from None
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def _installing_into(out: Path) -> Iterator[None]:
    """An exclusive lock on the directory ``out`` while a build installs into it: two builds
    into one folder install one after the other, and the second replaces all of the first."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _check_destinations(
    out: Path, written: list[str], inputs: tuple[tuple[str, str], ...] = ()
) -> None:
    """A BuildError, before anything is moved, where a file of the build would replace one of
    its inputs, or land on a directory or under a file of the user's (kept by --force): the
    folder stays as it was."""
    read = {file_identity(path): (name, path) for name, path in inputs}
    for rel in written:
        dst = out / rel
        if dst.exists() and (replaced := read.get(file_identity(dst))):
            name, path = replaced
            raise BuildError(
                f"the library's {rel} would replace {name} {path}, which this build read; keep "
                "it outside -o, or give -o another directory (nothing was moved)"
            )
        if dst.is_dir() and not dst.is_symlink():
            raise BuildError(
                f"{out} holds a directory {rel}, where the build writes a file; remove it or "
                "choose another -o (nothing was moved)"
            )
        for parent in dst.relative_to(out).parents:
            p = out / parent
            if parent != Path(".") and p.is_symlink() and p.is_dir():
                raise BuildError(
                    f"{out} holds {parent}, a symbolic link to {os.readlink(p)}, where the build "
                    f"makes a directory for {rel}: its files would land outside -o; remove the "
                    "link or choose another -o (nothing was moved)"
                )
            if parent != Path(".") and (p.is_file() or p.is_symlink() and not p.is_dir()):
                raise BuildError(
                    f"{out} holds a file {parent}, where the build makes a directory for {rel}; "
                    "remove it or choose another -o (nothing was moved)"
                )


def _short(w: Any) -> str:
    """``conv2d 1x3x8x8x8x3x3 + relu``: op, sizes and the fused epilogue."""
    sizes = "x".join(str(v) for _, v in w.shape)
    return f"{w.op} {sizes}" + (f" then {w.epilogue}" if w.epilogue.active else "")


def _labeled(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def _pick(record: TuneRecord) -> CandidateRecord:
    """The candidate the library uses: the fastest correct measured one, else the best ranked
    one no check found wrong (an emulated check says correct or not, without a time)."""
    timed = [c for c in record.candidates if c.measured_seconds is not None and c.correct]
    if timed:
        return min(timed, key=lambda c: c.measured_seconds or 0.0)
    correct = [c for c in record.candidates if c.correct is not False]
    if not correct:
        raise BuildError(
            f"no candidate of record {record.id} ({record.workload.get('describe')}) passed the "
            "numpy check stored with it; --retune searches again (a record this aotune made, not "
            "one imported, failing so is a bug: please report it)"
        )
    return correct[0]


def build(
    kernels: KernelList,
    hw: HwSpec,
    options: BuildOptions,
    db: TuningDatabase,
    event: Event | None = None,
) -> BuildReport:
    """Build the library of ``kernels`` for ``hw`` into ``options.out_dir`` (module docstring).

    ``event(names, state)`` follows each distinct workload through the states in ``STATES``.
    """
    start = time.perf_counter()
    event = event or (lambda names, state: None)
    check_output_dir(options.out_dir, options.force)
    staging = stage_output_dir(options.out_dir)
    try:
        report, written = _build(kernels, hw, options, db, event, start, staging)
        install_output(staging, written, options.inputs)
    except BaseException:  # failed or interrupted (Ctrl-C): the output directory stays as it was
        discard_staging(staging)
        raise
    return report


def _build(
    kernels: KernelList,
    hw: HwSpec,
    options: BuildOptions,
    db: TuningDatabase,
    event: Event,
    start: float,
    staging: Staging,
) -> tuple[BuildReport, list[str]]:
    """``build`` after the output directory's checks, writing into ``staging``: the report and
    the files written (relative paths, the manifest last), for ``install_output``."""
    out = staging.dir
    backend = backend_for(hw)
    state = backend.preflight(hw, options.cc, options.objects_only)
    if not options.objects_only and driver.can_verify(hw)[0]:
        _check_library_check_memory(kernels, options.verify)

    groups: dict[tuple[str, ...], list] = {}
    for k in kernels.kernels:
        groups.setdefault(record_key(k.workload, hw, options.search), []).append(k)
    labels = {key: ", ".join(k.name for k in ks) for key, ks in groups.items()}
    records: dict[tuple[str, ...], TuneRecord] = {}
    reused: set[tuple[str, ...]] = set()
    tasks = []
    for key, ks in groups.items():
        found = None if options.retune else db.find(key)  # type: ignore[arg-type]
        if found is not None:
            try:
                fitting_schedules(found, ks[0].workload, hw)  # an imported record may not fit
            except DatabaseError as e:
                raise BuildError(f"kernel {labels[key]}: {e}") from None
            records[key] = found
            reused.add(key)
            event(labels[key], "database")
        else:
            event(labels[key], "queued")
            tasks.append(
                SearchTask("\0".join(key), labels[key], ks[0].workload, hw, options.search)
            )

    if tasks:
        db.check_writable()  # now: results the database then refused would be lost

    def started(t: SearchTask) -> None:
        event(t.label, "searching")

    def done(t: SearchTask, record: TuneRecord) -> None:
        key = tuple(t.key.split("\0"))
        records[key] = db.put(record, replace=options.retune)
        event(t.label, "searched")

    failed = run_searches(tasks, options.jobs, options.cluster, started, done)
    if failed:
        for t, _ in failed:
            event(t.label, "failed")
        t, e = failed[0]
        raise BuildError(f"kernel {t.label}: {e}")

    can_run, why = driver.can_verify(hw)  # natively, or a foreign ISA under emulation
    check_skipped = None
    if not can_run:
        check_skipped = why
    elif not options.verify:
        check_skipped = "--no-verify given"
    if check_skipped is None:
        for key, ks in groups.items():
            rec = records[key]
            if any(c.correct is not None for c in rec.candidates):
                continue  # checked when this record was made: not again
            event(labels[key], "checking")
            result = result_of(rec, ks[0].workload, hw)
            verified, numpy_gflops = driver.verify(result, seed=options.search.seed)
            store_check(db, rec, verified, numpy_gflops)
            records[key] = db.get(rec.id)  # type: ignore[arg-type]

    chosen = []
    for key, ks in groups.items():
        cand = _pick(records[key])
        chosen += [Chosen(k, records[key], cand) for k in ks]

    emitted = backend.emit(chosen, hw, out, state, db, Names(options.prefix))
    files = {str(p.relative_to(out)): _sha256(p) for p in emitted.files}
    manifest = {
        "aotune": {
            "version": aotune.__version__,
            "format": MANIFEST_FORMAT,
            "model_version": model_version(),
        },
        "source": kernels.source,
        "target": {
            **target_for(hw).describe(),
            **emitted.fields.get("target", {}),
            "spec_hash": spec_hash(hw),
        },
        **{k: v for k, v in emitted.fields.items() if k != "target"},
        "kernels": emitted.entries,
        "skipped": [vars(s) for s in kernels.skipped],
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for d in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        if not any(d.iterdir()):  # a folder a backend made and left empty
            d.rmdir()

    checks, library_check = backend.check(out, chosen)  # a check that fails installs nothing
    by_name = {e["name"]: e for e in emitted.entries}
    reports = []
    for ch in chosen:
        key = tuple(ch.record.key)
        reports.append(
            KernelReport(
                name=ch.request.name,
                describe=_short(ch.request.workload),
                flops=ch.request.workload.flops,
                config=_labeled(by_name[ch.request.name]["config"]),
                predicted_seconds=ch.candidate.predicted_seconds,
                measured_seconds=ch.candidate.measured_seconds,
                numpy_gflops=ch.candidate.numpy_gflops,
                reused=key in reused,
                record=ch.record.id,
                nodes=ch.request.nodes,
                check=checks.get(ch.request.name),
            )
        )
    for key in groups:
        event(labels[key], "done")
    bad = tuple(r.name for r in reports if r.check is not None and not r.check.ok)
    report = BuildReport(
        target=hw,
        out_dir=staging.out,
        source=kernels.source,
        kernels=tuple(reports),
        skipped=kernels.skipped,
        files=tuple([*files, MANIFEST]),
        notes=tuple(emitted.notes),
        seconds=time.perf_counter() - start,
        searched=len(groups) - len(reused),
        reused=len(reused),
        database=str(db.path),
        check_skipped=check_skipped,
        library_check=library_check,
        failed=bad,
    )
    return report, [*files, MANIFEST]


def default_jobs() -> int:
    """One search process per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
