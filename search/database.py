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
                  version check (a file from a newer aotune is refused, not misread)
        put       one transaction per record: a build killed at any moment leaves no partial
                  record; two writers of one key keep the first and both read it back
        find / get / all / measure / export_jsonl / import_jsonl
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aotune
from aotune.analysis.workload import Workload
from aotune.errors import DatabaseError
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
    """A content hash of the spec (a renamed file with the same content shares records)."""
    return _digest(_canonical({k: v for k, v in hw.to_dict().items() if k != "description"}))


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
        """The inverse of :meth:`as_dict`; a DatabaseError names a missing or extra field."""
        fields = {f.name for f in dataclasses.fields(TuneRecord)} - {"id"}
        missing, extra = fields - set(d), set(d) - fields
        if missing or extra:
            raise DatabaseError(
                f"record has {'missing ' + ', '.join(sorted(missing)) if missing else ''}"
                f"{'; ' if missing and extra else ''}"
                f"{'unknown ' + ', '.join(sorted(extra)) if extra else ''} fields"
            )
        try:
            cands = tuple(CandidateRecord(**c) for c in d["candidates"])
        except TypeError as e:
            raise DatabaseError(f"a candidate of the record is malformed: {e}") from None
        return TuneRecord(**{**d, "candidates": cands})


def default_path() -> Path:
    """``$XDG_CACHE_HOME/aotune/tuning.db``, or ``~/.cache/aotune/tuning.db``."""
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
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

    def _rows(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            raise DatabaseError(f"{self.path}: {e}; the database is damaged") from None

    def _record(self, row: sqlite3.Row) -> TuneRecord:
        cands = tuple(
            CandidateRecord(
                rank=c["rank"],
                config=json.loads(c["config"]),
                predicted_seconds=c["predicted_seconds"],
                estimate_seconds=c["estimate_seconds"],
                bottleneck=c["bottleneck"],
                breakdown=json.loads(c["breakdown"]),
                measured_seconds=c["measured_seconds"],
                gflops=c["gflops"],
                correct=None if c["correct"] is None else bool(c["correct"]),
                max_abs_error=c["max_abs_error"],
                numpy_gflops=c["numpy_gflops"],
            )
            for c in self._rows(
                "SELECT * FROM candidates WHERE record_id = ? ORDER BY rank", (row["id"],)
            )
        )
        return TuneRecord(
            workload_key=row["workload_key"],
            spec_hash=row["spec_hash"],
            model_version=row["model_version"],
            options=row["options"],
            workload=json.loads(row["workload"]),
            target=row["target"],
            candidates=cands,
            search_seconds=row["search_seconds"],
            candidates_scored=row["candidates_scored"],
            kernels_compiled=row["kernels_compiled"],
            created=row["created"],
            aotune_version=row["aotune_version"],
            id=row["id"],
        )

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
            raise DatabaseError(f"cannot write to {self.path}: {e}") from None
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
            raise DatabaseError(f"cannot write to {self.path}: {e}") from None

    def get_object(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """A compiled object stored under ``key`` (a content hash of everything it was made
        from), with its metadata; None if there is none."""
        rows = self._rows("SELECT object, meta FROM objects WHERE key = ?", (key,))
        return (bytes(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def put_object(self, key: str, data: bytes, meta: dict[str, Any]) -> None:
        """Keep a compiled object, so a build from stored records only links."""
        try:
            with self._conn:
                self._conn.execute(
                    "INSERT OR REPLACE INTO objects(key, object, meta, created) VALUES (?,?,?,?)",
                    (key, data, json.dumps(meta), time.time()),  # key order kept
                )
        except sqlite3.DatabaseError as e:
            raise DatabaseError(f"cannot write to {self.path}: {e}") from None

    def export_jsonl(self, path: Path) -> int:
        """Write every record as one JSON line; the number written."""
        n = 0
        with path.open("w") as f:
            for rec in self.all():
                f.write(json.dumps(rec.as_dict(), sort_keys=True) + "\n")
                n += 1
        return n

    def import_jsonl(self, path: Path) -> tuple[int, int]:
        """Add the records of a ``db export`` file: (added, already present). Each line is checked
        before anything is written, so a malformed file adds nothing."""
        records = []
        try:
            lines = path.read_text().splitlines()
        except OSError as e:
            raise DatabaseError(f"cannot read {path}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise DatabaseError(
                f"{path} is not a JSON-lines export of 'aotune db export'"
            ) from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatabaseError(
                    f"{path} line {i} is not JSON ({e.msg}); import a file 'aotune db export' wrote"
                ) from None
            if not isinstance(data, dict):
                raise DatabaseError(f"{path} line {i} is not a record object")
            try:
                records.append(TuneRecord.from_dict(data))
            except DatabaseError as e:
                raise DatabaseError(f"{path} line {i}: {e}") from None
        added = 0
        for rec in records:
            if self.find(rec.key) is None:
                self.put(rec)
                added += 1
        return added, len(records) - added


def open_database(path: Path | str | None = None) -> TuningDatabase:
    """Open (creating where needed) the tuning database at ``path`` or the default path.

    A file that is not an SQLite database, or one written by a newer aotune (a higher schema
    version), raises a DatabaseError that says what to do.
    """
    p = Path(path) if path is not None else default_path()
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatabaseError(f"cannot create the directory of {p}: {e.strerror}") from None
    if p.is_dir():
        raise DatabaseError(f"--db {p} is a directory; give a file path such as {p}/tuning.db")
    try:
        conn = sqlite3.connect(p, timeout=60.0, isolation_level=None)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {p}: {e}") from None
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA foreign_keys = ON")
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for stmt in _SCHEMA.strip().split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('schema_version', ?), ('created_by', ?)",
                    (str(SCHEMA_VERSION), f"aotune {aotune.__version__}"),
                )
                version = SCHEMA_VERSION
            else:
                version = int(row[0])
    except sqlite3.DatabaseError as e:
        conn.close()
        if "not a database" in str(e) or "malformed" in str(e):
            raise DatabaseError(
                f"{p} is not an aotune tuning database ({e}); pass --db with another path"
            ) from None
        raise DatabaseError(f"cannot open database {p}: {e}") from None
    except ValueError:
        conn.close()
        raise DatabaseError(
            f"{p}: its schema version is not a number; the file is damaged"
        ) from None
    if version > SCHEMA_VERSION:
        conn.close()
        raise DatabaseError(
            f"{p} was written by a newer aotune (database schema {version}, this aotune reads "
            f"up to {SCHEMA_VERSION}); upgrade aotune or pass --db with another file"
        )
    return TuningDatabase(p, conn)
