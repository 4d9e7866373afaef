"""Linking objects into ``lib<name>.so`` and ``lib<name>.a`` with the system's tools.

The C compiler (``--cc``, else cc/gcc/clang on PATH) links the shared object; ``ar``
makes the archive. For a target that is not this machine's architecture, the GNU cross tools
``<arch>-linux-gnu-gcc`` / ``-ar`` are used where installed; without them the build still
produces the objects and the header, and says so (a program links them on the target).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from aotune.errors import BuildError
from aotune.files import printable

# what a program linking the objects or the archive adds; no libm: the activations' exp is inline
LINK_LIBS = ("-lpthread",)
# how long --cc may take to answer -dumpmachine or compile one line (a cold ccache is slow)
CC_CHECK_TIMEOUT_S = 30.0
# what of a checked compiler's output is kept: a program that floods it is stopped there
CC_OUTPUT_LIMIT = 4096
MIB = 1 << 20


@dataclass(frozen=True)
class Linker:
    """The tools a build links with (None where missing)."""

    cc: str | None
    ar: str | None
    native: bool  # the target is this machine's architecture

    def note(self, arch: str) -> str | None:
        """A line for the report when something cannot be made, else None."""
        if self.cc and self.ar:
            return None
        if self.cc:  # the shared object is linked; only the archive needs ar
            how = (
                "install binutils (apt-get install binutils)"
                if self.native
                else (f"install the {arch} cross tools (apt-get install binutils-{arch}-linux-gnu)")
            )
            return (
                f"no ar for {arch}: wrote the shared object, the objects and the header, not the "
                f"archive (.a); {how} and build again for it"
            )
        missing = " and ".join(
            what for what, tool in (("a C compiler", self.cc), ("ar", self.ar)) if not tool
        )
        how = (
            "install gcc (apt-get install gcc) and build again"
            if self.native
            else f"install the {arch} cross tools (apt-get install gcc-{arch}-linux-gnu) to "
            "link here, or link the objects on the target"
        )
        return f"no {missing} for {arch}: wrote the objects and the header only; {how}"


def find_linker(arch: str, host_arch: str, cc: str | None) -> Linker:
    """The tools for ``arch`` on this machine (``cc``: the compiler the user named)."""
    native = arch == host_arch
    if cc:
        found, words = shutil.which(cc), cc.split()
        if not found and len(words) > 1 and shutil.which(words[0]):
            raise BuildError(
                f"--cc {cc!r}: --cc takes one compiler, a name on PATH or a path, not its flags; "
                f"give --cc {words[0]}"
            )
        if not found and os.path.isfile(cc):  # which() passes over files that cannot run
            raise BuildError(
                f"--cc {cc}: the file is not executable; name a C compiler (cc, gcc or clang)"
            )
        if not found:
            raise BuildError(f"--cc {cc}: no such compiler on PATH; install it or name another")
        found = os.path.abspath(found)  # the link runs in the output directory, not here
        made_for = _compiler_arch(found)
        if made_for is not None and made_for != arch:
            raise BuildError(
                f"--cc {cc} makes {made_for} code (its -dumpmachine), and the target is {arch}; "
                f"name a compiler for {arch}"
            )
        check_compiles(cc, found)
        prefix = None
    else:
        prefix = "" if native else f"{arch}-linux-gnu-"
        names = ("cc", "gcc", "clang") if native else ("gcc",)
        found = next((shutil.which(prefix + n) for n in names if shutil.which(prefix + n)), None)
    ar = shutil.which((prefix or "") + "ar") if prefix is not None else shutil.which("ar")
    return Linker(found, ar, native)


def check_compiles(name: str, path: str, timeout: float | None = None) -> None:
    """A BuildError, before any search, unless ``path`` (``--cc name``) compiles a one-line C
    file into an object within ``timeout`` seconds (default ``CC_CHECK_TIMEOUT_S``): a program
    that is not a C compiler would otherwise fail only at the link, after every search."""
    limit = CC_CHECK_TIMEOUT_S if timeout is None else timeout
    fix = "name a C compiler with --cc (cc, gcc or clang), or leave --cc out"
    with tempfile.TemporaryDirectory(prefix="aotune-cc-check-") as tmp:
        src, obj = "aotune_cc_check.c", "aotune_cc_check.o"
        (Path(tmp) / src).write_text("int aotune_cc_check(int x) { return x + 1; }\n")
        try:
            rc, out = _run_bounded([path, "-c", src, "-o", obj], Path(tmp), limit, stderr=True)
        except OSError as e:
            raise BuildError(f"--cc {name}: cannot run {path} ({e.strerror}); {fix}") from None
        # its first line in the message, with nothing a terminal would act on
        said = [printable(line) for line in out.decode(errors="replace").strip().splitlines()]
        if rc is None:
            raise BuildError(
                f"--cc {name} does not behave as a C compiler: compiling a one-line C file did "
                f"not finish in {limit:g} s; {fix}"
            )
        if rc != 0:
            why = said[0][:200] if said else f"exit {rc}"
            raise BuildError(
                f"--cc {name} does not behave as a C compiler: it failed to compile a one-line "
                f"C file ({why}); {fix}"
            )
        made = Path(tmp) / obj
        if not made.is_file() or made.stat().st_size == 0:
            raise BuildError(
                f"--cc {name} does not behave as a C compiler: asked to compile a one-line C "
                f"file, it exited without error but wrote no object; {fix}"
            )


def _run_bounded(
    cmd: list[str], cwd: Path | None, timeout: float, stderr: bool = False
) -> tuple[int | None, bytes]:
    """Run ``cmd`` (no input) for at most ``timeout`` seconds: its exit code (None where it was
    stopped at the limit) and the first ``CC_OUTPUT_LIMIT`` bytes of its stdout (and stderr
    with ``stderr``). A program that prints without end (``yes``) is stopped after a MiB: its
    pipe is closed, not read into memory for the whole timeout."""
    # a session of its own: a wrapper script's children are stopped with it
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if stderr else subprocess.DEVNULL,
        start_new_session=True,
    )
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        _kill_group(proc)

    timer = threading.Timer(timeout, stop)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        out = proc.stdout.read(CC_OUTPUT_LIMIT)
        extra = 0
        while extra < MIB and (chunk := proc.stdout.read(65536)):
            extra += len(chunk)  # what a real compiler says beyond the limit: read, not kept
        proc.stdout.close()  # a program still writing gets SIGPIPE
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # interrupted (Ctrl-C): leave no process behind
            _kill_group(proc)
            proc.wait()
    return (None if fired.is_set() else rc), out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and the processes it started (its session's group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


def _compiler_arch(cc: str) -> str | None:
    """The architecture a C compiler makes code for (``-dumpmachine``, which gcc and clang
    answer); None where it does not say (a wrapper script, another compiler)."""
    try:
        rc, raw = _run_bounded([cc, "-dumpmachine"], None, CC_CHECK_TIMEOUT_S)
    except (OSError, ValueError):
        return None
    out = raw.decode(errors="replace").strip()
    first = out.split("-")[0] if out else ""
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(first, first)
    return arch if arch in ("x86_64", "aarch64") else None


def link(linker: Linker, objects: list[Path], out_dir: Path, lib: str) -> list[Path]:
    """Link ``objects`` into ``lib<lib>.so`` and ``lib<lib>.a`` in ``out_dir`` where the tools
    exist; the files written."""
    written = []
    rel = [str(o.relative_to(out_dir)) for o in objects]
    if linker.cc:
        so = out_dir / f"lib{lib}.so"
        so.unlink(missing_ok=True)  # a stale one must not pass for what this compiler made
        # the runtime needs pthreads; nothing calls libm (the activations' exp is inline)
        _run_in(out_dir, [linker.cc, "-shared", "-o", so.name, *rel, *LINK_LIBS], so.name)
        written.append(so)
    if linker.ar:
        a = out_dir / f"lib{lib}.a"
        a.unlink(missing_ok=True)  # ar adds to an existing archive
        _run_in(out_dir, [linker.ar, "rcs", a.name, *rel], a.name)
        written.append(a)
    return written


def _run_in(cwd: Path, cmd: list[str], target: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    except OSError as e:
        raise BuildError(f"cannot run {cmd[0]} to make {target}: {e.strerror}") from None
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()
        raise BuildError(
            f"{cmd[0]} failed to make {target}: "
            f"{first[0] if first else 'exit ' + str(done.returncode)}"
        )
    if not (cwd / target).is_file():
        raise BuildError(
            f"{cmd[0]} exited without error but wrote no {target}: is it a C compiler (or "
            "archiver)? name one with --cc (cc, gcc or clang)"
        )
