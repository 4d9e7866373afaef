"""Reading what a user hands us and writing what we make, safely.

Every file aotune reads on a user's behalf (spec files, workload lists, measurement files) goes
through ``read_user_file``: only regular files (a FIFO would block forever, ``/dev/zero`` never
ends), at most a size limit, with errors that name the file and the fix. Every file aotune writes
(``--emit-*``, spec files from calibration) goes through ``write_new_file``: never over an existing
file without ``force``, and atomically, so an interrupted write leaves no partial file behind.
"""

from __future__ import annotations

import codecs
import errno
import functools
import json
import math
import os
import re
import stat
import sys
import tempfile
import unicodedata
from pathlib import Path
from typing import Any

from aotune.errors import AotuneError

MIB = 1 << 20
# the files SQLite keeps beside a database named F: F-wal, F-shm (WAL mode), F-journal
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def read_user_file(
    path: str | Path, what: str, error: type[AotuneError], limit_bytes: int = MIB
) -> bytes:
    """The bytes of the regular file ``path``; ``error`` (naming ``what`` the file is for) when it
    is missing, not a regular file, unreadable or larger than ``limit_bytes``."""
    p = Path(path)
    try:
        info = os.stat(p)
    except OSError as e:
        raise error(f"cannot read {what} {_shown(p)}: {e.strerror}") from None
    except ValueError as e:  # an embedded NUL byte
        raise error(f"cannot read {what} {_shown(p)}: {e}") from None
    if stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {_shown(p)} is a directory; pass the path of a file")
    if not stat.S_ISREG(info.st_mode):
        raise error(
            f"{what} {_shown(p)} is not a regular file (a device, pipe or socket); "
            "save it to a file and pass that"
        )
    if info.st_size > limit_bytes:
        raise error(
            f"{what} {_shown(p)} is {info.st_size} bytes, more than the {limit_bytes} a "
            f"{what} may have; is it the right file?"
        )
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise error(f"cannot read {what} {_shown(p)}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError as e:  # /proc files that claim to be regular, I/O errors
        raise error(f"cannot read {what} {_shown(p)}: {e.strerror}") from None
    if len(data) > limit_bytes:  # it grew after the check
        raise error(f"{what} {_shown(p)} is larger than the {limit_bytes} bytes a {what} may have")
    return data


def decode_utf8(data: bytes, path: str | Path, what: str, error: type[AotuneError]) -> str:
    """``data`` as UTF-8 text, or ``error`` naming the byte offset that is not. A byte-order
    mark (some editors save one) is dropped: TOML and JSON parsers refuse it, invisibly."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        at = e.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        raise error(
            f"{what} {_shown(Path(path))} is not UTF-8 text (byte {at}); save it as UTF-8"
        ) from None


def check_writable(path: str | Path, force: bool, error: type[AotuneError]) -> None:
    """Fail now, before any long work, if ``write_new_file(path, ..., force)`` would fail later:
    an empty name, a directory, an existing file without ``force``, or a folder we cannot write."""
    p = Path(path)
    if not str(path):
        raise error("an empty file name was given; name the file to write")
    if str(path) == "-":  # other tools' name for standard output: never a file named '-' here
        raise error(
            "'-' is not a file: aotune writes named files, not to standard output; give a file "
            "path (./- for a file named '-')"
        )
    stream = _stream_named(p)
    if stream:  # followed to the file the stream is redirected to, --force would replace it
        via = f" (through {stream})" if stream != os.path.abspath(p) else ""
        raise error(
            f"{_shown(p)} names an open stream{via}, not a file; aotune writes a named file (a "
            "new one, renamed into place), so give a file path"
        )
    try:
        exists = p.exists() or p.is_symlink()
        if exists and p.is_dir():
            raise error(f"{_shown(p)} is a directory; name a file to write")
        if str(path).endswith(("/", os.sep)):  # Path drops the slash: x.s/ would write x.s
            raise error(f"{_shown(path)} ends in '/', which names a folder; name a file to write")
        if p.exists() and not p.is_file():  # --force replaces files, never a device or a pipe
            raise error(
                f"{_shown(p)} is not a regular file (a device, pipe or socket); name a file to "
                "write"
            )
        if exists and not force:
            raise error(f"{_shown(p)} exists; pass --force to overwrite it or choose another file")
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            what = "is not a folder" if parent.exists() else "does not exist"
            raise error(
                f"cannot write {_shown(p)}: {_shown(parent)} {what}; name a file in an existing "
                "folder, or create the folder first"
            )
        if not os.access(parent, os.W_OK):
            raise error(f"cannot write {_shown(p)}: folder {_shown(parent)} is not writable")
        # os.access says yes to root everywhere, /proc and read-only mounts too: try it
        if not folder_takes_new_files(parent):
            raise error(
                f"cannot write {_shown(p)}: its folder {_shown(parent)} takes no new files (a "
                "read-only or virtual file system); name a file in a folder you can write"
            )
        link = p.is_symlink()
        target = Path(os.path.realpath(p)) if link else p
        if exists and not link and cannot_be_replaced(p):
            raise error(
                f"cannot replace {_shown(p)}: it is marked immutable or append-only (chattr); "
                f"clear that (chattr -i -a {_shown(p)}) or choose another file"
            )
    except OSError as e:
        raise error(f"cannot write {_shown(p)}: {e.strerror}") from None
    if link:  # written through: its target must be writable too (a dangling link's folder)
        if target.is_symlink():  # realpath stops where links loop
            raise error(f"{_shown(p)} is a symbolic link that loops; name a file to write")
        check_writable(target, True, error)


_FS_IOC_GETFLAGS = 0x80086601  # Linux: a file's attribute flags (chattr)
_IMMUTABLE_OR_APPEND_ONLY = 0x10 | 0x20  # FS_IMMUTABLE_FL | FS_APPEND_FL


def cannot_be_replaced(path: Path) -> bool:
    """Whether ``path`` carries a flag that stops any user, root too, from replacing it: a
    write would fail only after the work (os.access says yes to root). False where the file
    system keeps no such flags."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        flags = bytearray(8)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags)
        return bool(int.from_bytes(flags[:4], sys.byteorder) & _IMMUTABLE_OR_APPEND_ONLY)
    except OSError:  # not Linux, or a file system without the flags
        return False
    finally:
        os.close(fd)


# a process's open files by number: /dev/stdout and the like lead there
_STREAM_PATH = re.compile(
    r"/(dev/(stdin|stdout|stderr|fd/\d+)|proc/(self|thread-self|\d+)(/task/\d+)?/fd/\d+)"
)


def _stream_named(p: Path) -> str:
    """The path by which ``p``, or a link on the way to its file, names one of the process's open
    files by number (/dev/stdout, /proc/self/fd/1) rather than a file; '' where it does not."""
    current = os.path.abspath(p)
    for _ in range(40):  # the kernel's own limit on links followed
        try:  # its folder's real path: /dev/fd is a link to /proc/self/fd
            current = os.path.join(
                os.path.realpath(os.path.dirname(current)), os.path.basename(current)
            )
        except ValueError:  # an embedded NUL byte: the checks after say so
            return ""
        if _STREAM_PATH.fullmatch(current):
            return current
        try:
            current = os.path.join(os.path.dirname(current), os.readlink(current))
        except (OSError, ValueError):
            return ""
    return ""


def folder_takes_new_files(folder: str | Path) -> bool:
    """Whether a new file can be made in ``folder`` (tried: ``os.access`` says yes to root on
    read-only mounts and immutable folders)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except (OSError, ValueError):
        return False


def write_new_file(
    path: str | Path, data: str | bytes, force: bool, error: type[AotuneError]
) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file renamed into place); refuse to
    replace an existing file unless ``force``, one made after the check as well (the new file
    is linked to its name, which fails where a file has it). A symbolic link is written through
    (its target replaced, the link kept); the file gets the mode a new file gets (the umask), or
    the mode of the file it replaces."""
    p = Path(path)
    check_writable(path, force, error)
    if p.is_symlink():  # check_writable checked its target too
        p = Path(os.path.realpath(p))
    raw = data.encode() if isinstance(data, str) else data
    parent = p.parent if str(p.parent) else Path(".")
    mode = _new_file_mode(p)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:40]}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())  # the data on disk before the name: a crash leaves old or new
        os.chmod(tmp, mode)  # mkstemp makes 0600
        if not force and _link_new(tmp, p, error):
            os.unlink(tmp)  # the file keeps its new name only
        else:
            os.replace(tmp, p)
        tmp = None
    except OSError as e:
        raise error(f"cannot write {_shown(p)}: {e.strerror}") from None
    finally:
        if tmp is not None:  # interrupted or failed: leave nothing behind
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _link_new(tmp: str, p: Path, error: type[AotuneError]) -> bool:
    """Give the written file ``tmp`` the name ``p`` too, only where no file has it (a hard link,
    which the OS refuses over an existing name: a file made at ``p`` since ``check_writable``
    looked, by another run or the user, is never replaced without ``force``); False where this
    file system makes no hard links (the caller renames instead)."""
    try:
        os.link(tmp, p)
    except FileExistsError:
        raise error(
            f"{_shown(p)} was made while aotune worked; pass --force to overwrite it or choose "
            "another file"
        ) from None
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            return False
        raise
    return True


# the bidirectional formatting characters: printed, they reorder the text around them
BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


# control characters have no Unicode name: those a message meets most, in words
_CONTROL_NAMES = {"\x1b": "an escape", "\r": "a carriage return", "\n": "a newline", "\t": "a tab"}


def _acted_on(ch: str) -> bool:
    """Whether a terminal acts on ``ch`` when it is printed: a control character or a
    bidirectional override."""
    return unicodedata.category(ch) == "Cc" or ch in BIDI_CONTROLS


def has_control_character(text: str, allowed: str = "") -> bool:
    """Whether ``text`` holds a control character (ESC, a carriage return, ...; those in
    ``allowed`` aside) or a bidirectional override, which a terminal would act on when it is
    printed."""
    return any(_acted_on(ch) and ch not in allowed for ch in text)


def first_control_character(text: str, allowed: str = "") -> str:
    """The first character of ``text`` that ``has_control_character`` refuses, named for a
    message (``U+202E (RIGHT-TO-LEFT OVERRIDE)``, ``U+001B (an escape)``); '' where none is."""
    for ch in text:
        if _acted_on(ch) and ch not in allowed:
            name = unicodedata.name(ch, "") or _CONTROL_NAMES.get(ch, "")
            return f"U+{ord(ch):04X}" + (f" ({name})" if name else "")
    return ""


def non_utf8_byte(c: str) -> str | None:
    """``\\xNN`` where ``c`` stands for byte NN of a file name that is not UTF-8 (Python's
    surrogate escape, as ``os.fsdecode`` gives it); None for any other character."""
    return f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else None


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on or that would not show (escapes,
    bidirectional overrides, zero-width marks) as '?', and a non-UTF-8 file name's bytes as
    ``\\xNN``, as error lines show them."""
    return "".join(non_utf8_byte(c) or (c if c.isprintable() else "?") for c in text)


def file_identity(path: str | Path) -> object:
    """What makes two names one file: its device and inode where it exists (symlinks and hard
    links alike), else the real path it would be created at."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        return os.path.realpath(path)


def refuse_outputs_over_inputs(
    outputs: dict[str, str],
    inputs: dict[str, str],
    error: type[AotuneError],
    reader: str = "this command",
) -> None:
    """``error`` where an output file (``--plot F``: its path) is one of the command's inputs
    (``the --target spec``: its path), however either is spelt: --force replaces earlier output,
    never what the command (or, for aotune's own files, ``reader``) reads. Nor the journals
    SQLite keeps beside an input (a database): it would read a file written there as the
    database's journal, and delete or overwrite it."""
    for out_name, out_path in outputs.items():
        out_id = file_identity(out_path)
        for in_name, in_path in inputs.items():
            if out_id == file_identity(in_path):
                raise error(f"{out_name} {out_path} is {in_name} {reader} reads; give another file")
            for base in {in_path, os.path.realpath(in_path)}:
                for end in SQLITE_SIDE_FILES:
                    if out_id == file_identity(f"{base}{end}"):
                        raise error(
                            f"{out_name} {out_path} is where SQLite keeps the journal of "
                            f"{in_name} ({in_path}), which {reader} reads; give another file"
                        )


def refuse_inputs_inside(
    directory: str | Path, flag: str, inputs: dict[str, str], error: type[AotuneError]
) -> None:
    """``error`` where an input (``the kernel list``: its path) lies inside the output directory
    ``directory`` that a command replaces files of (``flag`` names it for the message)."""
    root = Path(os.path.realpath(directory))
    for name, path in inputs.items():
        if Path(os.path.realpath(path)).is_relative_to(root):
            raise error(
                f"{name} {path} is inside {flag} {directory}, where this command writes; keep "
                f"it outside, or give {flag} another directory"
            )


def _new_file_mode(p: Path) -> int:
    """The permission bits of the file being replaced, else those open() gives a new file."""
    try:
        return stat.S_IMODE(os.stat(p).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _shown(p: str | Path) -> str:
    """A path for a one-line message: long ones shortened in the middle."""
    text = str(p)
    return text if len(text) <= 120 else f"{text[:50]}...{text[-50:]}"


def finite_for_json(x: Any) -> Any:
    """``x`` with every float that is not finite (a kernel that cannot launch: inf) as None, the
    JSON null (json.dumps writes Infinity, which strict JSON parsers refuse)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_for_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite_for_json(v) for v in x]
    return x


def json_text(doc: Any, **kw: Any) -> str:
    """``doc`` as strict JSON (``json.dumps`` keywords in ``kw``)."""
    return json.dumps(finite_for_json(doc), allow_nan=False, **kw)


# a terminal narrower than this gets tables as wide as this (its lines wrap): narrower, rich
# leaves a table's cells empty
NARROWEST_TABLE_COLUMNS = 60
# piped output is read by programs and people at leisure: tables are not squeezed to 80 columns
PIPED_COLUMNS = 200


@functools.cache
def _console_class() -> Any:
    from rich.console import Console

    class QuietOnClosedPipe(Console):
        """rich's console, but a reader that went away (``aotune space ... | head -1``) ends the
        command as the CLI's error report says (quietly, status 0), not with rich's exit 1."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return QuietOnClosedPipe


def output_console(stderr: bool = False) -> Any:
    """The rich console aotune prints its lines and tables on (stdout, or ``stderr``)."""
    Console = _console_class()  # noqa: N806 -- a class

    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        return Console(stderr=stderr, highlight=False, width=PIPED_COLUMNS)
    if console.width < NARROWEST_TABLE_COLUMNS:
        return Console(stderr=stderr, highlight=False, width=NARROWEST_TABLE_COLUMNS)
    return console


def toml_shown(value: object) -> str:
    """A value read from a TOML file as TOML writes it (``true``, not Python's ``True``; a date
    as ``1979-05-27``, not ``datetime.date(1979, 5, 27)``), cut to 60 characters."""
    import datetime

    if isinstance(value, datetime.date | datetime.time):  # datetime is a date
        return f"{value.isoformat()} (a TOML date or time; quote it for text)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
