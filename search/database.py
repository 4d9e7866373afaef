"""The tuning database: what a search found, kept so no workload is searched twice.

One SQLite file (the standard library's ``sqlite3``), by default ``tuning.db`` under the user's
cache directory. A *record* is keyed by (workload, target spec content hash, model version, search
options) and holds the ranked candidates with both tiers of prediction, plus the measurements of
a final check when one ran. Roadmap of this module:

    keys          workload_key / spec_hash / model_version: content hashes, so a changed spec file
                  or a changed model (any source file that decides the ranking) never reuses a
                  record made without it
    TuneRecord    plain data of one search (what the fan-out workers send back)
    TuningDatabase
        open      WAL journal (two builds may share one file at once), a busy timeout, a schema
                  version check (a file from a newer aotune is refused, not misread); another
                  program's SQLite file, or an aotune file missing a table (damaged), is refused
                  untouched by every command, and the commands that only read never create a file
        put       one transaction per record: a build killed at any moment leaves no partial
                  record; two writers of one key keep the first and both read it back
        find / get / all / measure / export_jsonl / import_jsonl: every record read or
                  imported is checked field by field (TuneRecord.from_dict); an export file may
                  be gzipped
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import gzip
import hashlib
import io
import json
import math
import os
import re
import shlex
import sqlite3
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

import aotune
from aotune.analysis.workload import Workload
from aotune.errors import ConfigError, DatabaseError
from aotune.files import (
    check_writable,
    decode_utf8,
    first_control_character,
    folder_takes_new_files,
    read_user_file,
    write_new_file,
)
from aotune.hwspecs.spec import HwSpec
from aotune.search.options import SearchOptions

SCHEMA_VERSION = 1
# the packages whose sources decide which configs a search ranks first (the database's own
# modules excepted), and the module that picks the pieces by target kind
_MODEL_PACKAGES = ("analysis", "constraints", "codegen", "search")
_MODEL_EXCLUDED = ("search/database.py", "search/cached.py")
_MODEL_FILES = ("targets.py",)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records(
    id INTEGER PRIMARY KEY,
    workload_key TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    model_version TEXT NOT NULL,
    options TEXT NOT NULL,
    workload TEXT NOT NULL,
    target TEXT NOT NULL,
    search_seconds REAL NOT NULL,
    candidates_scored INTEGER NOT NULL,
    kernels_compiled INTEGER NOT NULL,
    created REAL NOT NULL,
    aotune_version TEXT NOT NULL,
    UNIQUE(workload_key, spec_hash, model_version, options)
);
CREATE TABLE IF NOT EXISTS candidates(
    record_id INTEGER NOT NULL REFERENCES records(id) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    config TEXT NOT NULL,
    predicted_seconds REAL NOT NULL,
    estimate_seconds REAL NOT NULL,
    bottleneck TEXT NOT NULL,
    breakdown TEXT NOT NULL,
    measured_seconds REAL,
    gflops REAL,
    correct INTEGER,
    max_abs_error REAL,
    numpy_gflops REAL,
    measured_at REAL,
    PRIMARY KEY(record_id, rank)
);
CREATE TABLE IF NOT EXISTS objects(
    key TEXT PRIMARY KEY,
    object BLOB NOT NULL,
    meta TEXT NOT NULL,
    created REAL NOT NULL
);
"""


def _canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def workload_key(w: Workload) -> str:
    """A content hash of everything that defines the computation (not the kernel's name)."""
    return _digest(_canonical(dataclasses.asdict(w)))


def workload_json(w: Workload) -> dict[str, Any]:
    """The workload as stored beside its record: what a person reads in ``db list``."""
    return {
        "op": w.op,
        "shape": w.shape_dict,
        "dtype": w.dtype,
        "describe": w.describe(),
        "definition": dataclasses.asdict(w),
    }


def spec_hash(hw: HwSpec) -> str:
    """A content hash of the spec (a renamed file with the same content shares records): its
    values, not its description, nor a GPU copy's ``spec_from``, which restates its values."""
    skip = ("description", "spec_from")
    return _digest(_canonical({k: v for k, v in hw.to_dict().items() if k not in skip}))


@functools.lru_cache(maxsize=1)
def model_version() -> str:
    """``<aotune version>+<hash of the sources that decide the ranking>``."""
    root = Path(aotune.__file__).parent
    files = sorted(
        str(p.relative_to(root)) for pkg in _MODEL_PACKAGES for p in (root / pkg).glob("*.py")
    )
    h = hashlib.sha256()
    for rel in [f for f in files if f not in _MODEL_EXCLUDED] + list(_MODEL_FILES):
        path = root / rel
        h.update(rel.encode())
        h.update(path.read_bytes() if path.exists() else b"")
    return f"{aotune.__version__}+{h.hexdigest()[:12]}"


def source_hash(*relative: str) -> str:
    """A hash of some of aotune's source files (for keys of things generated from them)."""
    root = Path(aotune.__file__).parent
    h = hashlib.sha256()
    for rel in relative:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:16]


def options_json(options: SearchOptions) -> str:
    """The search options as the canonical text a record is keyed by."""
    return _canonical(dataclasses.asdict(options))


@dataclass(frozen=True)
class CandidateRecord:
    """One ranked candidate: its config (decision name -> value) and predictions."""

    rank: int
    config: dict[str, int]
    predicted_seconds: float
    estimate_seconds: float
    bottleneck: str
    breakdown: dict[str, float]
    measured_seconds: float | None = None
    gflops: float | None = None
    correct: bool | None = None
    max_abs_error: float | None = None
    numpy_gflops: float | None = None


@dataclass(frozen=True)
class TuneRecord:
    """What one search found, as plain data (picklable, JSON-able)."""

    workload_key: str
    spec_hash: str
    model_version: str
    options: str
    workload: dict[str, Any]
    target: str
    candidates: tuple[CandidateRecord, ...]
    search_seconds: float
    candidates_scored: int
    kernels_compiled: int
    created: float = 0.0
    aotune_version: str = aotune.__version__
    id: int | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The unique key of the record."""
        return (self.workload_key, self.spec_hash, self.model_version, self.options)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (one line of ``db export``)."""
        d = dataclasses.asdict(self)
        d.pop("id")
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TuneRecord:
        """The inverse of :meth:`as_dict`, every field checked: a DatabaseError names a missing or
        extra field, or the first field whose value has the wrong type or range."""
        fields = {f.name for f in dataclasses.fields(TuneRecord)} - {"id"}
        _check_fields(d, fields, fields, "record")
        cands = d["candidates"]
        if not isinstance(cands, list | tuple) or not cands:
            raise _field_error("candidates", cands, "give a non-empty list of candidates")
        checked = tuple(_candidate(c, f"candidates[{i}]") for i, c in enumerate(cands))
        ranks = [c.rank for c in checked]
        if len(set(ranks)) != len(ranks):
            raise _field_error("candidates", ranks, "two candidates have one rank")
        if sorted(ranks) != list(range(1, len(ranks) + 1)):  # a search ranks 1, 2, ... n
            raise _field_error("candidates", ranks, "rank the candidates 1 to their number")
        best = ranks.index(1)
        if not math.isfinite(checked[best].predicted_seconds):  # the search refuses such a best
            raise _field_error(
                f"candidates[{best}].predicted_seconds",
                checked[best].predicted_seconds,
                "give the best (rank 1) a finite time: a search keeps no record whose best "
                "cannot run",
            )
        _check_same_decisions(checked)
        workload = d["workload"]
        if not isinstance(workload, dict):
            raise _field_error("workload", workload, "give the workload as an object")
        if not isinstance(workload.get("describe", ""), str):
            raise _field_error("workload.describe", workload["describe"], "give a text")
        found = first_control_character(workload.get("describe", ""))
        if found:
            raise _field_error(
                "workload.describe", workload["describe"], f"give printable text (it holds {found})"
            )
        # the key is the definition's hash: a definition edited or lost would be shown, and
        # reused, as another workload's record
        key = _text(d, "workload_key")
        definition = workload.get("definition")
        if not isinstance(definition, dict):
            raise _field_error(
                "workload.definition",
                definition,
                "give the definition the record was made for (workload_key is its hash); "
                "export the record again with aotune db export",
            )
        digest = _digest(_canonical(definition))
        if digest != key:  # either may be the one edited: name both
            raise _field_error(
                "workload.definition",
                definition,
                f"its hash is {digest}, but workload_key is {_shortened(key)} (one of them was "
                "edited); give the definition the record was made for and its key "
                "(workload_key is its hash), or export the record again with aotune db export",
            )
        spec, options = _text(d, "spec_hash"), _text(d, "options")
        if not _HASH.fullmatch(spec):
            raise _field_error(
                "spec_hash", spec, "give the spec's hash: 32 hex digits, as export wrote"
            )
        _check_search_options(options)
        return TuneRecord(
            workload_key=key,
            spec_hash=spec,
            model_version=_text(d, "model_version"),
            options=options,
            workload=workload,
            target=_text(d, "target"),
            candidates=checked,
            search_seconds=_number(d, "search_seconds"),
            candidates_scored=_count(d, "candidates_scored"),
            kernels_compiled=_count(d, "kernels_compiled"),
            created=_number(d, "created", high=_LAST_CREATED, want=_CREATED_WANT),
            aotune_version=_text(d, "aotune_version"),
        )


# what a record may hold: SQLite stores integers in 64 bits, and a record's date is a time since
# 1970 before 2100 (0 means "now" to put); anything else is a damaged or hand-made record
_MAX_INT = 2**63 - 1
_IMPORT_LIMIT = 1 << 30  # bytes of a file to import: far beyond any real export
_GZIP_MAGIC = b"\x1f\x8b"  # the first two bytes of every gzip file (RFC 1952)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_LAST_CREATED = 4102444800.0
PREDICTED_SECONDS_MAX = 1e12  # 31,700 years: no model predicts a kernel call this long
_PREDICTED = (
    f"give a number of seconds above 0, at most {PREDICTED_SECONDS_MAX:g} (Infinity: the config "
    "cannot run)"
)
_CREATED_WANT = "give the seconds since 1970 it was made, from 0 to 4102444800 (the year 2100)"


_HASH = re.compile(r"[0-9a-f]{32}")  # _digest's form
# the bottlenecks a model names that are not a component of its breakdown: a GPU block that
# cannot launch (its breakdown is the launch alone)
_BOTTLENECKS_BEYOND_BREAKDOWN = ("cannot launch",)

# the columns of the tables that hold the fields of the same names
_CANDIDATE_COLUMNS = tuple(f.name for f in dataclasses.fields(CandidateRecord))
_RECORD_COLUMNS = tuple(
    f.name for f in dataclasses.fields(TuneRecord) if f.name not in ("id", "candidates")
)


def _loads(text: Any) -> Any:
    """A JSON column's value; the text itself where it is not JSON (the record check then names
    the field)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return text


def _shortened(value: Any) -> str:
    """``repr(value)``, at most 60 characters: a value may be megabytes long."""
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _check_search_options(options: str) -> None:
    """A DatabaseError unless ``options`` is the text of search options this aotune runs: a
    record under any other text (a seed of -1, an unknown strategy, NaN) can never be looked up
    again, so importing it kept a record no search would use."""
    given = _loads(options)
    if not isinstance(given, dict):
        raise _field_error(
            "options", options, "give the search options as the JSON object text export wrote"
        )
    known = {f.name for f in dataclasses.fields(SearchOptions)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise _field_error(
            "options",
            options,
            f"it names {', '.join(map(repr, unknown))}, which no search of this aotune has "
            f"(it has {', '.join(sorted(known))}); export the record again with aotune db export",
        )
    try:
        canonical = options_json(SearchOptions(**given))
    except ConfigError as e:
        raise _field_error(
            "options", options, f"{e}; export the record again with aotune db export"
        ) from None
    if _loads(canonical) != given:
        raise _field_error(
            "options",
            options,
            f"give every search option, as export wrote them: {canonical}",
        )


def _field_error(name: str, value: Any, want: str) -> DatabaseError:
    """``field NAME is VALUE: WANT`` (the value shortened)."""
    return DatabaseError(f"field {name} is {_shortened(value)}: {want}")


def _check_same_decisions(checked: Sequence[CandidateRecord]) -> None:
    """One search's candidates come from one space, so they name the same decisions: a
    DatabaseError names the first candidate whose decisions differ from those of more than half of
    them, and what it lacks or adds; with no such majority, each set of decisions and where it
    first appears (which one is right is not known here)."""
    sets = [frozenset(c.config) for c in checked]
    (usual, most), *rest = Counter(sets).most_common()
    if not rest:
        return
    if most * 2 <= len(sets):
        named = "; ".join(
            f"candidates[{sets.index(s)}] {', '.join(sorted(s))}" for s in Counter(sets)
        )
        raise DatabaseError(
            f"the candidates name {len(rest) + 1} different sets of decisions ({named}); one "
            "search's candidates name the same ones: mend those that are wrong"
        )
    odd = [i for i, s in enumerate(sets) if s != usual]
    lacks, adds = sorted(usual - sets[odd[0]]), sorted(sets[odd[0]] - usual)
    differs = "; ".join(
        ([f"it lacks {', '.join(lacks)}"] if lacks else [])
        + ([f"it adds {', '.join(adds)}"] if adds else [])
    )
    more = f" ({len(odd) - 1} more differ)" if len(odd) > 1 else ""
    raise _field_error(
        f"candidates[{odd[0]}].config",
        checked[odd[0]].config,
        f"{differs}; name the decisions most candidates do ({', '.join(sorted(usual))}){more}",
    )


def _check_fields(d: dict[str, Any], fields: set[str], required: set[str], what: str) -> None:
    """A DatabaseError naming the ``required`` fields ``d`` lacks and those not in ``fields``."""
    missing, extra = sorted(required - set(d)), sorted(set(d) - fields)
    if missing or extra:
        problems = ([f"lacks field(s) {', '.join(missing)}"] if missing else []) + (
            [f"has unknown field(s) {', '.join(extra)}"] if extra else []
        )
        raise DatabaseError(
            f"{what} {' and '.join(problems)}: give it as `aotune db export` writes it"
        )


def _finite(value: Any, allow_inf: bool = False) -> float | None:
    """``value`` as a float where it is a finite JSON number (not a bool; infinity too where
    ``allow_inf``), else None."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) or (allow_inf and number == math.inf) else None


def _text(d: dict[str, Any], name: str, where: str = "", empty: bool = False) -> str:
    """The text ``d[name]``, not empty unless ``empty``."""
    value = d[name]
    if not isinstance(value, str) or not (value or empty):
        raise _field_error(where + name, value, "give a text" if empty else "give a non-empty text")
    found = first_control_character(value)
    if found:  # db list and show print it to a terminal
        raise _field_error(where + name, value, f"give printable text (it holds {found})")
    return value


def _count(d: dict[str, Any], name: str) -> int:
    """The whole number ``d[name]``, in SQLite's integer range."""
    value = d[name]
    if type(value) is not int or not 0 <= value <= _MAX_INT:  # bool is no count
        raise _field_error(name, value, f"give a whole number from 0 to {_MAX_INT}")
    return value


def _number(
    d: dict[str, Any],
    name: str,
    where: str = "",
    high: float = math.inf,
    want: str = "give a finite number of seconds, 0 or more",
    optional: bool = False,
    allow_inf: bool = False,
) -> Any:
    """The number ``d[name]``: finite (or infinity where ``allow_inf``), from 0 to ``high``, or
    None where ``optional``."""
    value = d.get(name)
    if value is None and optional:
        return None
    number = _finite(value, allow_inf)
    if number is None or not 0.0 <= number <= high:
        raise _field_error(where + name, value, want)
    return number


def _candidate(c: Any, where: str) -> CandidateRecord:
    """One candidate of a record, every field checked (``where`` names it in errors)."""
    if not isinstance(c, dict):
        raise _field_error(where, c, "give the candidate as an object")
    fields = {f.name for f in dataclasses.fields(CandidateRecord)}
    required = {f.name for f in dataclasses.fields(CandidateRecord) if f.default is MISSING}
    _check_fields(c, fields, required, where)
    rank = c["rank"]
    if type(rank) is not int or not 1 <= rank <= _MAX_INT:
        raise _field_error(f"{where}.rank", rank, "give a rank from 1 up")
    config = c["config"]
    if not isinstance(config, dict) or not all(
        type(v) is int and 0 <= v <= _MAX_INT for v in config.values()
    ):
        raise _field_error(
            f"{where}.config", config, "give an object of decision names and whole numbers >= 0"
        )
    breakdown = c["breakdown"]
    if not isinstance(breakdown, dict) or not all(
        _finite(v, True) is not None and v >= 0 for v in breakdown.values()
    ):
        raise _field_error(
            f"{where}.breakdown", breakdown, "give an object of component names and seconds >= 0"
        )
    correct = c.get("correct")
    if correct is not None and not isinstance(correct, bool):
        raise _field_error(f"{where}.correct", correct, "give true, false or null")
    bottleneck = _text(c, "bottleneck", where + ".", empty=True)
    if bottleneck and bottleneck not in (*breakdown, *_BOTTLENECKS_BEYOND_BREAKDOWN):
        raise _field_error(
            f"{where}.bottleneck",
            bottleneck,
            f"name one of the candidate's breakdown components ({', '.join(breakdown)})",
        )
    where += "."
    return CandidateRecord(
        rank=rank,
        config=config,
        # a model says infinity for a config that cannot run at all (a GPU block too large)
        predicted_seconds=_seconds_taken(c, "predicted_seconds", where),
        estimate_seconds=_seconds_taken(c, "estimate_seconds", where),
        bottleneck=bottleneck,
        breakdown={k: float(v) for k, v in breakdown.items()},
        # bounds far beyond any kernel call, so that ms and GFLOP/s shown stay finite
        measured_seconds=_time_measured(c, where),
        gflops=_number(c, "gflops", where, GFLOPS_MAX, _GFLOPS, optional=True),
        correct=correct,
        max_abs_error=_number(
            c, "max_abs_error", where, want="give a finite number, 0 or more", optional=True
        ),
        numpy_gflops=_number(
            c, "numpy_gflops", where, want="give a finite number, 0 or more", optional=True
        ),
    )


MEASURED_SECONDS_MAX = 1e6  # 11.6 days for one call
GFLOPS_MAX = 1e9  # an exaflop per second
_MEASURED = f"give a finite number of seconds above 0, at most {MEASURED_SECONDS_MAX:g}"
_GFLOPS = f"give a finite number from 0 to {GFLOPS_MAX:g}"


def _time_measured(c: dict[str, Any], where: str) -> float | None:
    """A measured time, or None: more than 0 seconds (a timer reads no call as taking none)."""
    seconds = _number(c, "measured_seconds", where, MEASURED_SECONDS_MAX, _MEASURED, optional=True)
    if seconds == 0:
        raise _field_error(where + "measured_seconds", seconds, _MEASURED)
    return seconds


def _seconds_taken(c: dict[str, Any], name: str, where: str) -> float:
    """A predicted time: more than 0 seconds (no kernel takes none), or infinity."""
    seconds = _number(c, name, where, want=_PREDICTED, allow_inf=True)
    if seconds == 0 or PREDICTED_SECONDS_MAX < seconds < math.inf:
        raise _field_error(where + name, seconds, _PREDICTED)
    return float(seconds)


def default_path() -> Path:
    """``$XDG_CACHE_HOME/aotune/tuning.db``, or ``~/.cache/aotune/tuning.db``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG spec: a relative value is invalid and ignored
        home = os.environ.get("HOME")
        if home is not None and not os.path.isabs(home):  # '' or relative: not a place
            raise DatabaseError(
                f"HOME is {home!r}, not an absolute folder, so the default database has no "
                "place; set HOME or XDG_CACHE_HOME to an absolute folder, or give --db a file"
            )
        base = str(Path.home() / ".cache")
    return Path(base) / "aotune" / "tuning.db"


class TuningDatabase:
    """One SQLite tuning database (open it with :func:`open_database`)."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path, self._conn = path, conn

    def close(self) -> None:
        """Close the connection (every write is already committed)."""
        self._conn.close()

    def __enter__(self) -> TuningDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_writable(self) -> None:
        """A DatabaseError now, before a search whose result is to be stored, where this
        database cannot be written (a read-only file or folder): a write that changes nothing,
        rolled back."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("UPDATE meta SET value = value WHERE key = 'schema_version'")
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
        except sqlite3.DatabaseError as e:
            raise self._write_error(e) from None

    def _write_error(self, e: sqlite3.DatabaseError) -> DatabaseError:
        """The error for a write this database refused, with what would let it write."""
        name = getattr(e, "sqlite_errorname", "")
        # a damaged file (or tables that disagree: candidates left of a lost record, where a new
        # record's take its id), not a permission: making it writable would not help
        if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or name.startswith("SQLITE_CONSTRAINT"):
            return DatabaseError(f"{self.path}: {e}; the database is damaged{_DAMAGED_FIX}")
        return DatabaseError(
            f"cannot write to {self.path}: {e}; make the file and its folder writable, or pass "
            "--db with another file ('aotune tune' also takes --no-db, which stores nothing)"
        )

    def _rows(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise DatabaseError(
                f"{self.path}: {e}; the database is damaged{_DAMAGED_FIX}"
            ) from None

    def _record(self, row: sqlite3.Row) -> TuneRecord:
        """The record of a ``records`` row with its candidates, checked as an import is: a
        record that breaks the rules (written by hand, or imported by an older aotune) is
        reported with its id and the way to remove it, rather than shown wrong."""
        cands = [
            {
                **{k: c[k] for k in _CANDIDATE_COLUMNS},
                "config": _loads(c["config"]),
                "breakdown": _loads(c["breakdown"]),
                "correct": {0: False, 1: True}.get(c["correct"], c["correct"]),
            }
            for c in self._rows(
                "SELECT * FROM candidates WHERE record_id = ? ORDER BY rank", (row["id"],)
            )
        ]
        data = {k: row[k] for k in _RECORD_COLUMNS}
        try:
            rec = TuneRecord.from_dict(
                {**data, "workload": _loads(row["workload"]), "candidates": cands}
            )
        except DatabaseError as e:
            raise DatabaseError(
                f"{self.path}: record {row['id']} is damaged ({e}); remove it with: sqlite3 "
                f"{shlex.quote(str(self.path))} "
                f"'PRAGMA foreign_keys=ON; DELETE FROM records WHERE id={row['id']}'"
            ) from None
        return dataclasses.replace(rec, id=row["id"])

    def find(self, key: tuple[str, str, str, str]) -> TuneRecord | None:
        """The record of ``key`` (workload, spec hash, model version, options), if any."""
        rows = self._rows(
            "SELECT * FROM records WHERE workload_key = ? AND spec_hash = ? "
            "AND model_version = ? AND options = ?",
            key,
        )
        return self._record(rows[0]) if rows else None

    def get(self, record_id: int) -> TuneRecord:
        """The record with this id; a DatabaseError says how to list the ids."""
        if record_id < 1:
            raise DatabaseError(
                f"record ids are positive integers, not {record_id}; 'aotune db list' shows them"
            )
        rows = []  # beyond SQLite's integer range: no record has the id, sqlite3 cannot bind it
        if record_id <= _MAX_INT:
            rows = self._rows("SELECT * FROM records WHERE id = ?", (record_id,))
        if not rows:
            raise DatabaseError(
                f"{self.path} has no record {record_id}; 'aotune db list' shows the ids"
            )
        return self._record(rows[0])

    def all(self) -> Iterator[TuneRecord]:
        """Every record, oldest first."""
        for row in self._rows("SELECT * FROM records ORDER BY id"):
            yield self._record(row)

    def count(self) -> int:
        """Number of records."""
        return int(self._rows("SELECT COUNT(*) FROM records")[0][0])

    def put(self, record: TuneRecord, replace: bool = False) -> TuneRecord:
        """Store ``record`` in one transaction and return it as stored. Where another writer
        stored the same key first, theirs is kept and returned (both builds then use one
        result), unless ``replace`` (``--retune``), which replaces it."""
        try:
            with self._conn:  # BEGIN ... COMMIT, or ROLLBACK on any error
                self._conn.execute("BEGIN IMMEDIATE")
                if replace:
                    self._conn.execute(
                        "DELETE FROM records WHERE workload_key = ? AND spec_hash = ? "
                        "AND model_version = ? AND options = ?",
                        record.key,
                    )
                cur = self._conn.execute(
                    "INSERT INTO records(workload_key, spec_hash, model_version, options, "
                    "workload, target, search_seconds, candidates_scored, kernels_compiled, "
                    "created, aotune_version) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
                    "ON CONFLICT DO NOTHING",
                    (
                        *record.key,
                        _canonical(record.workload),
                        record.target,
                        record.search_seconds,
                        record.candidates_scored,
                        record.kernels_compiled,
                        record.created or time.time(),
                        record.aotune_version,
                    ),
                )
                if cur.rowcount == 1:
                    rid = cur.lastrowid
                    self._conn.executemany(
                        "INSERT INTO candidates(record_id, rank, config, predicted_seconds, "
                        "estimate_seconds, bottleneck, breakdown, measured_seconds, gflops, "
                        "correct, max_abs_error, numpy_gflops) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        [
                            (
                                rid,
                                c.rank,
                                _canonical(c.config),
                                c.predicted_seconds,
                                c.estimate_seconds,
                                c.bottleneck,
                                _canonical(c.breakdown),
                                c.measured_seconds,
                                c.gflops,
                                None if c.correct is None else int(c.correct),
                                c.max_abs_error,
                                c.numpy_gflops,
                            )
                            for c in record.candidates
                        ],
                    )
        except sqlite3.DatabaseError as e:
            raise self._write_error(e) from None
        stored = self.find(record.key)
        assert stored is not None  # inserted now, or by another writer before us
        return stored

    def measure(self, record_id: int, measured: list[CandidateRecord]) -> None:
        """Store the final check's measurements of a record's candidates (one transaction)."""
        try:
            with self._conn:
                self._conn.executemany(
                    "UPDATE candidates SET measured_seconds = ?, gflops = ?, correct = ?, "
                    "max_abs_error = ?, numpy_gflops = ?, measured_at = ? "
                    "WHERE record_id = ? AND rank = ?",
                    [
                        (
                            c.measured_seconds,
                            c.gflops,
                            None if c.correct is None else int(c.correct),
                            c.max_abs_error,
                            c.numpy_gflops,
                            time.time(),
                            record_id,
                            c.rank,
                        )
                        for c in measured
                    ],
                )
        except sqlite3.DatabaseError as e:
            raise self._write_error(e) from None

    def get_object(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """A compiled object stored under ``key`` (a content hash of everything it was made
        from), with its metadata; None if there is none."""
        rows = self._rows("SELECT object, meta FROM objects WHERE key = ?", (key,))
        if not rows:
            return None
        data = bytes(rows[0][0]) if isinstance(rows[0][0], bytes) else b""
        try:
            meta = json.loads(rows[0][1])
        except (TypeError, ValueError, RecursionError):
            meta = None
        # a damaged entry (not an ELF object, or metadata that is not an object) is compiled
        # again, and the caller's put_object replaces it
        if not data.startswith(b"\x7fELF") or not isinstance(meta, dict):
            return None
        return data, meta

    def put_object(self, key: str, data: bytes, meta: dict[str, Any]) -> None:
        """Keep a compiled object, so a build from stored records only links."""
        try:
            with self._conn:
                self._conn.execute(
                    "INSERT OR REPLACE INTO objects(key, object, meta, created) VALUES (?,?,?,?)",
                    (key, data, json.dumps(meta), time.time()),  # key order kept
                )
        except sqlite3.DatabaseError as e:
            raise self._write_error(e) from None

    def export_jsonl(
        self,
        path: Path | str,
        force: bool = False,
        refusal: Callable[[TuneRecord], str | None] | None = None,
    ) -> tuple[int, list[str]]:
        """Write every record as one JSON line to ``path`` (gzipped where its name ends in .gz;
        replacing a file only with ``force``): the number written, and why each record left out
        was (those ``refusal`` gives a reason for; the database keeps them). Every record is read
        before the file is written, and the file is written whole or not at all, so a failed
        export leaves nothing behind."""
        self._refuse_own_file(Path(path))  # first: --force must not make that a question
        check_writable(path, force, DatabaseError)  # before the reading, which may take a while
        lines, left_out = [], []
        for rec in self.all():
            why = refusal(rec) if refusal is not None else None
            if why is None:
                lines.append(json.dumps(rec.as_dict(), sort_keys=True) + "\n")
            else:
                left_out.append(why)
        text = "".join(lines).encode()
        # a name ending in .gz says gzip (import reads both); the timestamp left out, so the same
        # records export to the same bytes
        packed = gzip.compress(text, mtime=0) if str(path).endswith(".gz") else text
        write_new_file(path, packed, force, DatabaseError)
        return len(lines), left_out

    def _refuse_own_file(self, path: Path) -> None:
        """A DatabaseError where ``path`` is this database or a journal SQLite keeps beside it
        (a link or another name of it included): writing there destroys the records."""
        for end in ("", "-wal", "-shm", "-journal"):
            own = Path(f"{self.path}{end}")
            try:
                same = os.path.realpath(path) == os.path.realpath(own) or (
                    path.exists() and own.exists() and os.path.samefile(path, own)
                )
            except (OSError, ValueError):
                continue  # not a usable path: check_writable reports it
            if same:
                what = "SQLite's journal of the tuning database" if end else "the tuning database"
                raise DatabaseError(
                    f"{path} is {what} being exported (--db {self.path}); export to another file"
                )

    def import_jsonl(self, path: Path) -> tuple[int, int]:
        """Add the records of a ``db export`` file: (added, already present). Each line is checked
        before anything is written, so a malformed file adds nothing."""
        return self.import_records(read_export(path))

    def import_records(self, records: list[TuneRecord]) -> tuple[int, int]:
        """Add ``records`` not stored yet: (added, already present)."""
        added = 0
        for rec in records:
            if self.find(rec.key) is None:
                self.put(rec)
                added += 1
        return added, len(records) - added


def _gunzip(data: bytes, path: Path) -> bytes:
    """The unpacked bytes of ``data``, the gzip file ``path`` (as ``gzip -k`` makes of an export):
    at most ``_IMPORT_LIMIT`` of them, so a small file cannot unpack to fill the memory."""
    limit = _IMPORT_LIMIT
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            unpacked = f.read(limit + 1)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; cut short: EOF
        raise DatabaseError(
            f"{path} is a gzip file that cannot be unpacked ({e}); check it with "
            f"'gunzip -t {shlex.quote(str(path))}', or export the records again"
        ) from None
    if len(unpacked) > limit:
        raise DatabaseError(
            f"{path} unpacks to more than the {limit} bytes a JSON-lines file may have; is it "
            "the right file?"
        )
    if unpacked.startswith(_GZIP_MAGIC):
        raise DatabaseError(
            f"{path} is gzipped twice; unpack it with 'gunzip -c {shlex.quote(str(path))} | "
            "gunzip > records.jsonl' and import records.jsonl"
        )
    return unpacked


class _RepeatedKey(ValueError):
    """A JSON object that names one key twice (``json`` keeps the last without a word)."""


def _object_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict, or ``_RepeatedKey`` naming a key it gives twice."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _RepeatedKey(key)
        obj[key] = value
    return obj


def read_export(path: Path) -> list[TuneRecord]:
    """The records of a ``db export`` file, plain or gzipped, every line checked (a DatabaseError
    names the first that is wrong); nothing is written, so a refused file leaves no database
    behind."""
    # a regular file of at most 1 GiB (never a device read to its end), decoded as UTF-8
    data = read_user_file(path, "JSON-lines file", DatabaseError, limit_bytes=_IMPORT_LIMIT)
    packed = data.startswith(_GZIP_MAGIC)
    if packed:  # an export kept compressed: read it as gunzip would
        data = _gunzip(data, path)
    if data.startswith(_SQLITE_MAGIC):
        if packed:
            raise DatabaseError(
                f"{path} is a gzipped database, not a 'db export' file; unpack it with gunzip, "
                "export its records (aotune db export records.jsonl --db FILE) and import that"
            )
        raise DatabaseError(
            f"{path} is a database, not a 'db export' file; export its records first "
            f"(aotune db export records.jsonl --db {path}) and import that"
        )
    text = decode_utf8(data, path, "JSON-lines file", DatabaseError)
    records = []
    for i, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line, object_pairs_hook=_object_without_repeats)
        except _RepeatedKey as e:
            raise DatabaseError(
                f"{path} line {i} gives {e.args[0]!r} twice in one object (which one is meant?); "
                "keep one, or import a file 'aotune db export' wrote"
            ) from None
        except RecursionError:
            raise DatabaseError(
                f"{path} line {i} is not JSON (nested too deeply); import a file "
                "'aotune db export' wrote"
            ) from None
        except ValueError as e:  # JSONDecodeError, or an integer of thousands of digits
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise DatabaseError(
                f"{path} line {i} is not JSON ({why}); import a file 'aotune db export' wrote"
            ) from None
        if not isinstance(record, dict):
            raise DatabaseError(
                f"{path} line {i} is not a record object; import a file 'aotune db export' wrote"
            )
        try:
            records.append(TuneRecord.from_dict(record))
        except DatabaseError as e:
            raise DatabaseError(f"{path} line {i}: {e}") from None
    return records


def open_database(path: Path | str | None = None, create: bool = True) -> TuningDatabase:
    """Open the tuning database at ``path`` or the default path; with ``create``, a missing file
    is made a new, empty database, else it is a DatabaseError (the commands that only read must
    not leave files behind). The default path's folder is made where missing; a given path's
    must exist, as ``--emit-*`` files' must: a mistyped folder is an error, not a new tree.

    A file that is not an SQLite database, an SQLite file of another program (whose tables are
    left as they are), one written by a newer aotune (a higher schema version), or a damaged one
    (a table missing: it is left as it is, even with ``create``), raises a DatabaseError that says
    what to do.
    """
    p = Path(path) if path is not None else default_path()
    if not str(path if path is not None else p):
        raise DatabaseError("--db was given an empty path; name the database file")
    try:
        if p.is_symlink() and not p.exists():
            raise DatabaseError(
                f"--db {p} is a symbolic link to {os.readlink(p)}, which does not exist; give "
                "--db the database file itself, or make the link point at one"
            )
        if p.is_dir():
            raise DatabaseError(f"--db {p} is a directory; give a file path such as {p}/tuning.db")
        if str(path).endswith(("/", os.sep)):  # Path drops the slash: x.db/ would open x.db
            raise DatabaseError(f"--db {path} ends in '/', which names a folder; give a file path")
        if p.exists() and not p.is_file():
            raise DatabaseError(
                f"--db {p} is not a regular file (a device, pipe or socket); give a database file"
            )
        if not create and not p.exists():
            raise DatabaseError(
                f"there is no tuning database at {p} (no such file): nothing is stored there "
                "yet; check --db, or run 'aotune tune' or 'aotune build' to make one"
            )
        if create and path is not None and not p.parent.is_dir():
            what = "is not a folder" if p.parent.exists() else "does not exist"
            raise DatabaseError(
                f"cannot create the database {p}: {p.parent} {what}; give --db a file in an "
                "existing folder, or create the folder first"
            )
        if create:
            p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # the path itself, before any folder is made
            raise DatabaseError(
                f"--db {p}: {e.strerror} (a name may have 255 bytes, a path 4096); give a "
                "shorter path"
            ) from None
        fix = (
            "give --db a file in an existing folder, or create the folder first"
            if path is not None
            else "the default database sits under $XDG_CACHE_HOME (else ~/.cache): point that "
            "at a folder, or give --db a file"
        )
        raise DatabaseError(f"cannot create the directory of {p}: {e.strerror}; {fix}") from None
    except ValueError as e:  # an embedded NUL byte
        raise DatabaseError(f"cannot open database {p}: {e}") from None
    try:
        # mode=rw never makes a file: a read-only command leaves a missing path missing
        uri = f"{p.absolute().as_uri()}?mode={'rwc' if create else 'rw'}"
        conn = sqlite3.connect(uri, timeout=60.0, isolation_level=None, uri=True)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {p}: {e}{_why_not_opened(p)}") from None
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA busy_timeout = 60000")
        # look before writing anything: another program's database is refused untouched
        _schema_version(conn, p, create)
        if create:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                version = _schema_version(conn, p, create)  # again: another opener may be first
                for stmt in _SCHEMA.strip().split(";"):
                    if stmt.strip():
                        conn.execute(stmt)  # IF NOT EXISTS: none where the file has them
                if version is None:
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES ('schema_version', ?), "
                        "('created_by', ?)",
                        (str(SCHEMA_VERSION), f"aotune {aotune.__version__}"),
                    )
            conn.execute("PRAGMA journal_mode = WAL")  # two builds may share the file at once
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.DatabaseError as e:
        conn.close()
        if "not a database" in str(e) or "malformed" in str(e):
            raise DatabaseError(
                f"{p} is not an aotune tuning database ({e}); pass --db with another path"
            ) from None
        raise DatabaseError(f"cannot open database {p}: {e}{_why_not_opened(p)}") from None
    except DatabaseError:
        conn.close()
        raise
    return TuningDatabase(p, conn)


# SQLite's SQLITE_MAX_PATHNAME as built (its default): a longer path does not open
SQLITE_LONGEST_PATH = 512


def _why_not_opened(p: Path) -> str:
    """What SQLite's 'unable to open database file' means for ``p``, where it can be told: a
    folder that takes no new files, where SQLite must make the journals it keeps beside it."""
    if len(str(p.absolute())) > SQLITE_LONGEST_PATH:
        return (
            f"; its full path is {len(str(p.absolute()))} characters, more than the "
            f"{SQLITE_LONGEST_PATH} SQLite opens: give --db a shorter path"
        )
    if p.parent.is_dir() and not folder_takes_new_files(p.parent):
        return (
            f"; its folder {p.parent} takes no new files, and SQLite makes its journals "
            f"({p.name}-wal, {p.name}-shm) beside the database: make the folder writable, or "
            "copy the database to a writable folder and give --db the copy"
        )
    return ""


@functools.lru_cache(maxsize=1)
def _schema_columns() -> dict[str, set[str]]:
    """The columns of each of aotune's tables (from the schema itself)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(_SCHEMA)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {t: {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
    finally:
        conn.close()


def _has_text(p: Path) -> bool:
    """Whether the file ``p`` gives at least one byte when read."""
    try:
        with open(p, "rb") as f:
            return bool(f.read(1))
    except OSError:
        return False


def _schema_version(conn: sqlite3.Connection, p: Path, create: bool) -> int | None:
    """The schema version of the database open in ``conn``; None for a file with no tables yet
    (a new database, which only a command that may ``create`` one takes). A DatabaseError where
    the file is another program's (tables, but not aotune's meta table with its version), a
    newer aotune's, or damaged (one of aotune's tables missing), whether or not ``create``."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        if create:
            return None
        if _has_text(p):  # /proc/self/status: its size reads 0, so SQLite sees no tables
            raise DatabaseError(
                f"{p} is not a tuning database (a virtual file, whose size reads 0 though it "
                "has text); pass --db a file of your own"
            )
        raise DatabaseError(
            f"{p} holds no tuning database (an empty file): nothing is stored there yet; check "
            "--db, or run 'aotune tune' or 'aotune build' to make one"
        )
    foreign = (
        f"{p} is an SQLite database of another program (tables "
        f"{', '.join(sorted(tables)[:5])}{', ...' if len(tables) > 5 else ''}), not an aotune "
        "tuning database; it is left as it is: pass --db with another path"
    )
    expected = _schema_columns()
    if "meta" not in tables or not expected["meta"] <= _columns(conn, "meta"):
        raise DatabaseError(foreign)
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise DatabaseError(foreign)
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        raise DatabaseError(
            f"{p}: its schema version is not a number; the file is damaged{_DAMAGED_FIX}"
        ) from None
    if version < 1:  # versions count from 1
        raise DatabaseError(
            f"{p}: its schema version is {version}, which no aotune writes; the file is "
            f"damaged{_DAMAGED_FIX}"
        )
    if version > SCHEMA_VERSION:
        raise DatabaseError(
            f"{p} was written by a newer aotune (database schema {version}, this aotune reads "
            f"up to {SCHEMA_VERSION}); upgrade aotune or pass --db with another file"
        )
    for table, columns in expected.items():
        if table in tables and not columns <= _columns(conn, table):
            raise DatabaseError(foreign)
        # objects came after schema 1 with no new version: a file without it is an older aotune's,
        # and the schema's IF NOT EXISTS adds it. Any other table missing is damage, which a
        # write must not paper over: recreated empty, it would hide what was lost
        if table not in tables and table != "objects":
            raise DatabaseError(
                f"{p}: its table {table} is missing; the file is damaged{_DAMAGED_FIX}"
            )
    return version


_DAMAGED_FIX = (
    "; restore it from a backup or a 'db export' file, or pass --db with a new file (a record "
    "is only a search's result: a new database searches again)"
)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The column names of ``table`` (one of aotune's names, never a user's text)."""
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
