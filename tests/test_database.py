"""The tuning database: transactions, WAL sharing, resuming after SIGKILL, export/import, reuse
by ``tune``, and fan-out on a Dask LocalCluster giving the same configs as one process."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aotune.analysis.workload import matmul
from aotune.cli import main
from aotune.errors import DatabaseError
from aotune.hwspecs.spec import SPEC_DIR, load_target
from aotune.search.cached import record_key
from aotune.search.database import (
    SCHEMA_VERSION,
    CandidateRecord,
    TuneRecord,
    open_database,
    options_json,
    workload_json,
    workload_key,
)
from aotune.search.options import SearchOptions
from hypothesis import given, settings
from hypothesis import strategies as st

FAST = ["--budget", "16", "--top-k", "1", "--no-verify"]


def _record(i: int, n_cands: int = 2) -> TuneRecord:
    w = matmul(i + 1, 8, 8)
    return TuneRecord(
        workload_key=workload_key(w),
        spec_hash="5" * 32,
        model_version="m",
        options=options_json(SearchOptions()),
        workload=workload_json(w),
        target="haswell",
        candidates=tuple(
            CandidateRecord(r + 1, {"mr": r + 1, "nr": 16}, 1e-3 * (r + 1), 2e-3, "L1", {"L1": 1.0})
            for r in range(n_cands)
        ),
        search_seconds=1.5,
        candidates_scored=10,
        kernels_compiled=2,
    )


def test_put_find_measure_and_keep_first_writer(tmp_path):
    with open_database(tmp_path / "t.db") as db:
        stored = db.put(_record(1))
        assert stored.id is not None and db.find(stored.key) == stored
        assert db.count() == 1
        # another writer of the same key: the first record stays, both read it back
        other = _record(1, n_cands=1)
        assert db.put(other).candidates == stored.candidates
        # --retune replaces it
        assert len(db.put(other, replace=True).candidates) == 1
        rec = db.find(other.key)
        db.measure(
            rec.id, [CandidateRecord(**{**vars(rec.candidates[0]), "measured_seconds": 2e-3})]
        )
        assert db.get(rec.id).candidates[0].measured_seconds == 2e-3
        assert db._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = db._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert int(version[0]) == SCHEMA_VERSION


@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 4), cands=st.integers(1, 3))
def test_export_import_round_trip(tmp_path_factory, n, cands):
    tmp = tmp_path_factory.mktemp("db")
    with open_database(tmp / "a.db") as a:
        for i in range(n):
            a.put(_record(i, cands))
        assert a.export_jsonl(tmp / "x.jsonl") == (n, [])
    with open_database(tmp / "b.db") as b:
        b.put(_record(0, cands))  # already there: kept, not duplicated
        added, present = b.import_jsonl(tmp / "x.jsonl")
        assert (added, present) == (max(0, n - 1), min(n, 1))
        assert [r.as_dict() | {"created": 0} for r in b.all()][1:] == [
            r.as_dict() | {"created": 0} for r in list(open_database(tmp / "a.db").all())[1:]
        ]


def test_an_export_named_gz_is_gzipped_and_imports(tmp_path):
    """``db export x.jsonl.gz`` wrote plain JSON under a gzip name; it gzips now (the same bytes
    for the same records), and import reads it."""
    import gzip

    with open_database(tmp_path / "a.db") as a:
        a.put(_record(1))
        assert a.export_jsonl(tmp_path / "x.jsonl.gz") == (1, [])
        assert a.export_jsonl(tmp_path / "y.jsonl.gz") == (1, [])
    packed = (tmp_path / "x.jsonl.gz").read_bytes()
    assert packed == (tmp_path / "y.jsonl.gz").read_bytes()
    assert json.loads(gzip.decompress(packed))["target"] == "haswell"
    with open_database(tmp_path / "b.db") as b:
        assert b.import_jsonl(tmp_path / "x.jsonl.gz") == (1, 0)


def test_import_checks_every_line_before_writing(tmp_path):
    good = json.dumps(_record(1).as_dict())
    (tmp_path / "x.jsonl").write_text(good + "\n{not json\n")
    with open_database(tmp_path / "t.db") as db:
        with pytest.raises(DatabaseError, match="line 2 is not JSON"):
            db.import_jsonl(tmp_path / "x.jsonl")
        assert db.count() == 0
    (tmp_path / "y.jsonl").write_text(json.dumps({**_record(1).as_dict(), "extra": 1}) + "\n")
    with open_database(tmp_path / "t.db") as db:
        with pytest.raises(DatabaseError, match="has unknown field.s. extra: give it as"):
            db.import_jsonl(tmp_path / "y.jsonl")


def _writer(path: str, first: int, count: int) -> None:
    with open_database(path) as db:
        for i in range(first, first + count):
            db.put(_record(i % 7))  # overlapping keys between the two writers


def test_two_writers_share_one_database(tmp_path):
    path = str(tmp_path / "t.db")
    open_database(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, s, 40)) for s in (0, 3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    with open_database(path) as db:
        assert db.count() == 7
        assert all(len(r.candidates) == 2 for r in db.all())  # no partial record
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_tune_reuses_its_record(tmp_path, capsys):
    db = str(tmp_path / "t.db")
    args = ["tune", "matmul", "--shape", "24x40x16", *FAST, "--db", db, "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["database"]["reused"] is False and first["search"]["candidates_scored"] > 0
    start = time.perf_counter()
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["database"] == {**first["database"], "reused": True}
    assert second["best"]["config"] == first["best"]["config"]
    assert time.perf_counter() - start < first["search"]["seconds"] + 5
    assert main([*args, "--retune"]) == 0
    assert json.loads(capsys.readouterr().out)["database"]["reused"] is False
    assert main(["tune", "matmul", "--shape", "24x40x16", *FAST, "--no-db", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["database"]["path"] is None


def test_db_commands(tmp_path, capsys):
    db = str(tmp_path / "t.db")
    assert main(["tune", "matmul", "--shape", "24x40x16", *FAST, "--db", db]) == 0
    capsys.readouterr()
    assert main(["db", "list", "--db", db]) == 0
    out = capsys.readouterr().out
    assert "1 record (" in out and "matmul 24x40x16" in out
    assert main(["db", "show", "1", "--db", db]) == 0
    assert "#1 " in capsys.readouterr().out
    assert main(["db", "show", "1", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == 1
    assert main(["db", "show", "9", "--db", db]) == 2
    assert "no record 9" in capsys.readouterr().err
    export = tmp_path / "x.jsonl"
    assert main(["db", "export", str(export), "--db", db]) == 0
    assert main(["db", "export", str(export), "--db", db]) == 2  # exists: needs --force
    assert "--force" in capsys.readouterr().err
    other = str(tmp_path / "other.db")
    assert main(["db", "import", str(export), "--db", other]) == 0
    assert "imported 1 record " in capsys.readouterr().out
    assert main(["db", "list", "--db", other, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["records"]) == 1


def test_db_list_tells_apart_records_of_specs_that_share_a_name(tmp_path, capsys):
    """An edited copy of a spec keeps its name: the list shows each record's spec hash (it showed
    two identical 'znver4' lines)."""
    db = str(tmp_path / "t.db")
    edited = tmp_path / "edited.toml"
    text = (SPEC_DIR / "znver4.toml").read_text()
    edited.write_text(text.replace("bandwidth_gbs = ", "bandwidth_gbs = 1", 1))
    for target in ("znver4", str(edited)):
        argv = ["tune", "matmul", "--shape", "24x40x16", *FAST, "--db", db, "--target", target]
        assert main(argv) == 0
    capsys.readouterr()
    assert main(["db", "list", "--db", db, "--json"]) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    assert [r["target"] for r in records] == ["znver4", "znver4"]
    hashes = [r["spec_hash"] for r in records]
    assert hashes[0] != hashes[1]
    # the copy's record is marked: --target znver4 loads the built-in's spec, not the copy's
    assert [r["target_loads_this_spec"] for r in records] == [True, False]
    assert main(["db", "list", "--db", db]) == 0
    out = capsys.readouterr().out
    assert all(f"spec {h[:8]}" in out for h in hashes)
    assert f"spec {hashes[0][:8]} " in out and f"spec {hashes[1][:8]}* " in out
    assert "* its spec is not the one --target znver4 loads here today" in out
    assert main(["db", "show", "2", "--db", db]) == 0
    assert "its spec is not the one --target znver4 loads" in capsys.readouterr().out
    assert main(["db", "show", "1", "--db", db]) == 0
    assert "its spec is not" not in capsys.readouterr().out


KILL_LIST = """
[[kernel]]
name = "a"
op = "matmul"
shape = "48x40x24"
[[kernel]]
name = "b"
op = "matmul"
shape = "40x48x24"
[[kernel]]
name = "c"
op = "dense"
shape = "24x48x40"
bias = true
[[kernel]]
name = "d"
op = "batch_matmul"
shape = "2x24x40x16"
"""


def test_build_killed_halfway_resumes(tmp_path):
    """SIGKILL after the first stored record: the database opens, passes integrity_check,
    holds only whole records, and the same command then finishes the rest."""
    (tmp_path / "k.toml").write_text(KILL_LIST)
    db = tmp_path / "t.db"
    cmd = [sys.executable, "-m", "aotune", "build", "k.toml", "-o", "out", "--db", str(db)]
    cmd += [*FAST, "--jobs", "1", "--objects-only", "--json"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    stored = 0
    while time.time() < deadline and proc.poll() is None:
        if db.exists():
            try:
                conn = sqlite3.connect(db, timeout=1)
                stored = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
                conn.close()
            except sqlite3.Error:
                stored = 0
            if stored >= 1:
                break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and 1 <= stored < 4
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    counts = conn.execute(
        "SELECT r.id, COUNT(c.rank) FROM records r LEFT JOIN candidates c ON c.record_id = r.id "
        "GROUP BY r.id"
    ).fetchall()
    conn.close()
    assert all(n == 1 for _, n in counts)  # --top-k 1: each stored record is whole
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (
        report["from_database"] >= len(counts) and report["searched"] + report["from_database"] == 4
    )


@pytest.mark.parametrize(
    ("stop", "code", "line"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "interrupted")],
)
def test_build_interrupted_keeps_what_finished(tmp_path, stop, code, line):
    """Ctrl-C, or SIGTERM (``kill``, a batch system's time limit), during a build: the finished
    searches stay in the database, and no output or staging folder is left behind."""
    (tmp_path / "k.toml").write_text(KILL_LIST)
    db = tmp_path / "t.db"
    cmd = [sys.executable, "-m", "aotune", "build", "k.toml", "-o", "out", "--db", str(db)]
    cmd += [*FAST, "--jobs", "1", "--objects-only"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        try:
            conn = sqlite3.connect(db, timeout=1)
            n = conn.execute("SELECT COUNT(*) FROM records").fetchone()[0]
            conn.close()
        except sqlite3.Error:
            n = 0
        if n >= 1:
            break
        time.sleep(0.05)
    proc.send_signal(stop)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    text = err.decode()
    assert line in text and "run the same command again to resume" in text
    assert "Traceback" not in text
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.toml", "t.db"]
    with open_database(db) as d:
        assert d.count() >= 1


@pytest.fixture(scope="module")
def local_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    yield cluster
    cluster.close()


def test_cluster_build_gives_the_configs_of_one_process(tmp_path, capsys, local_cluster):
    (tmp_path / "k.toml").write_text(KILL_LIST)
    common = ["build", str(tmp_path / "k.toml"), *FAST, "--objects-only", "--json"]
    assert main([*common, "-o", str(tmp_path / "one"), "--db", str(tmp_path / "one.db"),
                 "--jobs", "1"]) == 0  # fmt: skip
    one = json.loads(capsys.readouterr().out)
    assert main([*common, "-o", str(tmp_path / "dask"), "--db", str(tmp_path / "dask.db"),
                 "--cluster", local_cluster.scheduler_address]) == 0  # fmt: skip
    spread = json.loads(capsys.readouterr().out)
    assert spread["searched"] == 4
    assert [k["config"] for k in spread["kernels"]] == [k["config"] for k in one["kernels"]]
    with open_database(tmp_path / "dask.db") as db:  # results came back to the one database
        assert db.count() == 4


def test_unreachable_cluster_is_one_line(tmp_path, capsys):
    (tmp_path / "k.toml").write_text(KILL_LIST)
    rc = main(["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "o"), "--db",
               str(tmp_path / "t.db"), "--cluster", "tcp://127.0.0.1:9", *FAST])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err
    assert len(err.strip().splitlines()) == 1


def test_record_key_changes_with_spec_and_options():
    w = matmul(8, 16, 24)
    a = record_key(w, load_target("haswell"), SearchOptions())
    assert a == record_key(matmul(8, 16, 24), load_target("haswell"), SearchOptions())
    assert a != record_key(w, load_target("skylake-avx512"), SearchOptions())
    assert a != record_key(w, load_target("haswell"), SearchOptions(seed=1))
    assert a != record_key(matmul(8, 16, 25), load_target("haswell"), SearchOptions())


def test_default_database_lives_in_the_cache_dir(tmp_path, monkeypatch):
    from aotune.search.database import default_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_path() == Path(tmp_path) / "aotune" / "tuning.db"
    # a relative value is invalid by the XDG spec: it made ./relative/aotune/ wherever one stood
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert default_path() == Path.home() / ".cache" / "aotune" / "tuning.db"
    # pointing at a file: the error names the variable to fix, and --db
    (tmp_path / "a-file").write_text("mine")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    with pytest.raises(DatabaseError, match=r"Not a directory; .*XDG_CACHE_HOME.* --db"):
        open_database()
    assert (tmp_path / "a-file").read_text() == "mine"


# ---- bad input: one error line, exit 2, nothing a user had changed ---------------------------


def _filled_db(path: Path, n: int = 2) -> Path:
    with open_database(path) as db:
        for i in range(n):
            db.put(_record(i))
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_export_refuses_to_overwrite_its_own_database(tmp_path, capsys):
    db = _filled_db(tmp_path / "real.db")
    before = db.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(db)
    (tmp_path / "hard.db").hardlink_to(db)
    for out in (db, tmp_path / "link.jsonl", tmp_path / "hard.db", Path(f"{db}-wal")):
        for force in ([], ["--force"]):
            assert main(["db", "export", str(out), "--db", str(db), *force]) == 2
            err = _error_line(capsys)
            assert "being exported" in err and "export to another file" in err
    assert db.read_bytes() == before and not Path(f"{db}-wal").exists()
    with open_database(db) as d:
        assert d.count() == 2
    # a good export over an old file, with --force, replaces it whole
    out = tmp_path / "x.jsonl"
    out.write_text("old\n")
    assert main(["db", "export", str(out), "--db", str(db), "--force"]) == 0
    assert len(out.read_text().splitlines()) == 2


def _foreign(path: Path, *tables: str) -> Path:
    conn = sqlite3.connect(path)
    for t in tables:
        conn.execute(t)
    conn.commit()
    conn.close()
    return path


FOREIGN = {
    "other": ("CREATE TABLE t(x)",),
    "records": ("CREATE TABLE records(id INTEGER PRIMARY KEY, x TEXT)",),
    "meta": ("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_another_programs_database_is_refused_untouched(tmp_path, capsys, kind):
    other = _foreign(tmp_path / "other.db", *FOREIGN[kind])
    before = other.read_bytes()
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(json.dumps(_record(1).as_dict()) + "\n")
    out = tmp_path / "out.jsonl"
    for cmd in (
        ["db", "list"],
        ["db", "show", "1"],
        ["db", "export", str(out)],
        ["db", "import", str(jsonl)],
        ["tune", "matmul", "--shape", "24x40x16", *FAST],
    ):
        assert main([*cmd, "--db", str(other)]) == 2, cmd
        err = _error_line(capsys)
        assert "another program" in err and "not an aotune tuning database" in err
    assert other.read_bytes() == before
    assert not out.exists()  # the failed export left no file behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db", "x.jsonl"]


def test_read_only_commands_need_an_existing_database(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "t.db"
    for cmd in (["list"], ["show", "1"], ["export", str(tmp_path / "x.jsonl")]):
        assert main(["db", *cmd, "--db", str(missing)]) == 2
        err = _error_line(capsys)
        assert f"no tuning database at {missing}" in err and "check --db" in err
    assert list(tmp_path.iterdir()) == []
    empty = tmp_path / "empty.db"
    empty.touch()
    assert main(["db", "list", "--db", str(empty)]) == 2
    assert "nothing is stored there yet" in _error_line(capsys)
    assert empty.read_bytes() == b""
    for action in ("export", "import"):  # '-' is not the terminal, '' is not a name
        for name in ("-", ""):
            assert main(["db", action, name, "--db", str(missing)]) == 2
            assert "give a file name" in _error_line(capsys) and not Path("-").exists()
    # an empty export imports nothing and, having nothing to keep, makes no database
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n")
    assert main(["db", "import", str(blank), "--db", str(missing)]) == 0
    assert "holds no records" in capsys.readouterr().out and not missing.exists()
    blank.unlink()
    # import (like tune and build) makes a new database where there is none, in its folder
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_text(json.dumps(_record(1).as_dict()) + "\n")
    assert main(["db", "import", str(jsonl), "--db", str(missing)]) == 2
    assert "folder" in _error_line(capsys) and not missing.parent.exists()
    missing.parent.mkdir(parents=True)
    assert main(["db", "import", str(jsonl), "--db", str(missing)]) == 0
    assert "imported 1 record " in capsys.readouterr().out
    assert main(["db", "list", "--db", str(missing)]) == 0
    assert "1 record (" in capsys.readouterr().out


def _bad(field: str, value: object) -> dict:
    d = json.loads(json.dumps(_record(5).as_dict()))
    if field.startswith("candidates[0]."):
        d["candidates"][0][field.split(".", 1)[1]] = value
    else:
        d[field] = value
    return d


_OPTIONS = json.loads(options_json(SearchOptions()))
BAD_FIELDS = [
    ("candidates", []),
    ("candidates", [1]),
    ("created", -1e300),
    ("created", 1e300),
    ("search_seconds", "fast"),
    ("search_seconds", float("nan")),
    ("search_seconds", True),
    ("target", 12),
    ("target", ""),
    ("target", "haswell\x1b[2J"),  # db list printed it raw: an escape the terminal acts on
    ("target", "haswell\u202eevil"),  # a bidirectional override: the line shown reversed
    ("workload", [1]),
    ("candidates_scored", 2**63),
    ("kernels_compiled", -1),
    ("kernels_compiled", 1.5),
    ("candidates[0].predicted_seconds", -1e-3),
    ("candidates[0].predicted_seconds", 0),  # no kernel takes no time: tune would show 0 ms
    ("candidates[0].breakdown", {"L1": -1.0}),
    ("candidates[0].config", {"mr": -1}),
    ("workload", {}),  # no definition: the key cannot be checked against it
    ("candidates[0].estimate_seconds", 10**400),
    ("candidates[0].rank", 0),
    ("candidates[0].rank", 2),  # the rank of the second candidate: "field candidates"
    ("candidates[0].config", {"mr": "8"}),
    ("candidates[0].config", [8]),
    ("candidates[0].breakdown", {"L1": "x"}),
    ("candidates[0].correct", "yes"),
    ("candidates[0].measured_seconds", -1.0),
    ("candidates[0].measured_seconds", 1e308),  # shown in ms: inf
    ("candidates[0].measured_seconds", 0.0),  # 'measured 0.000 ms (correct)' until stop 104
    ("candidates[0].gflops", 1e308),
    ("candidates[0].bottleneck", None),
    # imported and shown, or reused by tune --no-verify as the pick's bottleneck
    ("candidates[0].bottleneck", "banana"),
    ("candidates[0].config", {"mr": 1, "nr": 16, "zz": 3}),  # not the others' decisions
    ("spec_hash", "nothex"),
    ("options", "zzz"),
    # options no search runs: imported, such a record could never be looked up again
    ("options", json.dumps({**_OPTIONS, "seed": -1})),
    ("options", json.dumps({**_OPTIONS, "strategy": "bogus"})),
    ("options", json.dumps({**_OPTIONS, "mutation": float("nan")})),
    ("options", json.dumps({**_OPTIONS, "budget": "x"})),
    ("options", json.dumps({**_OPTIONS, "mutation": "x"})),  # compared with 0: a TypeError
    ("options", json.dumps({**_OPTIONS, "zz": 1})),
    ("options", json.dumps({"seed": 0})),  # the others left out: not the text a search keys by
]


@pytest.mark.parametrize(
    ("field", "value"), BAD_FIELDS, ids=[f"{f}={v!r}"[:48] for f, v in BAD_FIELDS]
)
def test_import_checks_every_field(tmp_path, capsys, field, value):
    db = str(tmp_path / "t.db")
    good = json.dumps(_record(1).as_dict())
    (tmp_path / "x.jsonl").write_text(f"{good}\n{json.dumps(_bad(field, value))}\n")
    assert main(["db", "import", str(tmp_path / "x.jsonl"), "--db", db]) == 2
    err = _error_line(capsys)
    named = "field " + ("candidates is [2, 2]" if value == 2 else field)
    if isinstance(value, dict) and "zz" in value:  # two candidates: neither is the odd one out
        named = "the candidates name 2 different sets of decisions (candidates[0] mr, nr, zz; "
    assert f"x.jsonl line 2: {named}" in err
    with open_database(db) as d:
        assert d.count() == 0  # all or nothing
    assert main(["db", "list", "--db", db]) == 0


def test_import_refuses_a_definition_its_key_is_not_the_hash_of(tmp_path, capsys):
    d = json.loads(json.dumps(_record(1).as_dict()))
    assert d["workload"]["definition"]["shape"][1] == ["N", 8]
    d["workload"]["definition"]["shape"][1] = ["N", 9]  # another workload under the first's key
    (tmp_path / "x.jsonl").write_text(json.dumps(d) + "\n")
    assert main(["db", "import", str(tmp_path / "x.jsonl"), "--db", str(tmp_path / "t.db")]) == 2
    err = _error_line(capsys)
    assert "field workload.definition" in err and "workload_key is its hash" in err


def test_import_with_only_the_key_edited_names_both_fields(tmp_path, capsys):
    d = json.loads(json.dumps(_record(1).as_dict()))
    d["workload_key"] = "0" * 32  # the definition is as exported; the key was edited
    (tmp_path / "x.jsonl").write_text(json.dumps(d) + "\n")
    assert main(["db", "import", str(tmp_path / "x.jsonl"), "--db", str(tmp_path / "t.db")]) == 2
    err = _error_line(capsys)
    assert "but workload_key is '" + "0" * 32 + "'" in err and "one of them was edited" in err


@pytest.mark.parametrize("target", ["../../etc/passwd", "y" * 65, "zén4", "my cpu"])
def test_import_refuses_a_target_no_spec_could_be_named(tmp_path, capsys, target):
    """A record of a spec not known here (a calibrated file's) keeps its target unchecked against
    a spec, but a name no spec may have (tune refuses it) was made by hand: refused, not listed."""
    d = json.loads(json.dumps(_record(1).as_dict()))
    (tmp_path / "x.jsonl").write_text(json.dumps({**d, "target": target}) + "\n")
    db = tmp_path / "t.db"
    assert main(["db", "import", str(tmp_path / "x.jsonl"), "--db", str(db)]) == 2
    assert "record 1: its target" in _error_line(capsys) and not db.exists()


def test_import_of_lines_that_are_no_json_or_files_that_are_no_export(tmp_path, capsys):
    db = str(tmp_path / "t.db")
    x = tmp_path / "x.jsonl"
    for text in ("[" * 100_000, "1" * 5000, "[1]"):
        x.write_text(json.dumps(_record(1).as_dict()) + "\n" + text + "\n")
        assert main(["db", "import", str(x), "--db", db]) == 2
        err = _error_line(capsys)
        assert "x.jsonl line 2 is not" in err and "'aotune db export'" in err
    assert main(["db", "import", "/dev/zero", "--db", db]) == 2
    assert "not a regular file" in _error_line(capsys)
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate((1 << 30) + 1)  # sparse: no disk used
    assert main(["db", "import", str(huge), "--db", db]) == 2
    assert "more than the 1073741824" in _error_line(capsys)
    with open_database(db) as d:
        assert d.count() == 0


def test_import_keeps_a_config_that_cannot_run(tmp_path, capsys):
    """A GPU model predicts infinity for a config that cannot launch: such a record, as aotune
    wrote it, exports and imports."""
    bad = _record(1)
    cannot = dataclasses.replace(
        bad.candidates[1],
        predicted_seconds=math.inf,
        breakdown={"launch": math.inf},
        bottleneck="cannot launch",
    )
    with open_database(tmp_path / "a.db") as db:
        db.put(dataclasses.replace(bad, candidates=(bad.candidates[0], cannot)))
    x = str(tmp_path / "x.jsonl")
    assert main(["db", "export", x, "--db", str(tmp_path / "a.db")]) == 0
    assert main(["db", "import", x, "--db", str(tmp_path / "b.db")]) == 0
    assert main(["db", "show", "1", "--db", str(tmp_path / "b.db")]) == 0
    assert "#2 mr=2,nr=16: predicted inf ms" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("9223372036854775808", "no record 9223372036854775808"),
        ("99999999999999999999999", "no record 99999999999999999999999"),
        ("-1", "record ids are positive integers"),
        ("0", "record ids are positive integers"),
    ],
)
def test_show_of_ids_beyond_sqlite(tmp_path, capsys, arg, message):
    db = str(_filled_db(tmp_path / "t.db"))
    assert main(["db", "show", arg, "--db", db]) == 2
    assert message in _error_line(capsys)


def test_db_without_an_action(capsys):
    assert main(["db"]) == 2
    err = _error_line(capsys)
    assert "needs an action: list, show ID, export FILE or import FILE" in err


def test_a_damaged_stored_record_is_named_not_shown_wrong(tmp_path, capsys):
    db = _filled_db(tmp_path / "t.db")
    conn = sqlite3.connect(db)
    conn.execute("UPDATE records SET created = -1e300, search_seconds = 'fast' WHERE id = 2")
    conn.commit()
    conn.close()
    for cmd in (["list"], ["show", "2"], ["export", str(tmp_path / "x.jsonl")]):
        assert main(["db", *cmd, "--db", str(db)]) == 2
        err = _error_line(capsys)
        assert "record 2 is damaged (field search_seconds is 'fast'" in err
        assert "DELETE FROM records WHERE id=2" in err
    assert not (tmp_path / "x.jsonl").exists()
    assert main(["db", "show", "1", "--db", str(db)]) == 0


def test_a_database_given_to_import_or_missing_a_table_says_what_to_do(tmp_path, capsys):
    db = _filled_db(tmp_path / "t.db")
    assert main(["db", "import", str(db), "--db", str(tmp_path / "other.db")]) == 2
    err = _error_line(capsys)
    assert "is a database, not a 'db export' file" in err and "aotune db export" in err
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE candidates")
    conn.commit()
    conn.close()
    assert main(["db", "list", "--db", str(db)]) == 2
    err = _error_line(capsys)
    assert "table candidates is missing" in err and "pass --db with a new file" in err


def test_a_given_database_path_needs_its_folder_and_the_default_makes_its_own(
    tmp_path, capsys, monkeypatch
):
    typo = tmp_path / "runz" / "t.db"
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps(_record(1).as_dict()) + "\n")
    for argv in (
        ["db", "import", str(records), "--db", str(typo)],
        ["tune", "matmul", "--shape", "8x8x8", "--budget", "8", "--no-verify", "--db", str(typo)],
    ):
        assert main(argv) == 2
        err = _error_line(capsys)
        assert f"{typo.parent} does not exist" in err and "create the folder first" in err
    assert not typo.parent.exists()
    (tmp_path / "file").write_text("mine")
    assert main(["db", "import", str(records), "--db", str(tmp_path / "file" / "t.db")]) == 2
    assert f"{tmp_path / 'file'} is not a folder" in _error_line(capsys)
    assert (tmp_path / "file").read_text() == "mine"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with open_database() as db:  # the default's folder is made
        assert len(list(db.all())) == 0
    assert (tmp_path / "cache" / "aotune" / "tuning.db").is_file()


def test_a_refused_import_leaves_no_new_database_and_keeps_an_old_one(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text("not json\n")
    new = tmp_path / "new.db"
    assert main(["db", "import", str(bad), "--db", str(new)]) == 2
    assert "x.jsonl line 1 is not" in _error_line(capsys)
    assert not new.exists()
    old = tmp_path / "old.db"
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(_record(1).as_dict()) + "\n")
    assert main(["db", "import", str(good), "--db", str(old)]) == 0
    capsys.readouterr()
    assert main(["db", "import", str(bad), "--db", str(old)]) == 2
    with open_database(old) as d:
        assert d.count() == 1  # the refused file changed nothing, and the database stays


def test_show_of_an_id_that_is_no_number_says_where_the_ids_are(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:  # refused by the argument parser
        main(["db", "show", "nosuchid", "--db", str(tmp_path / "t.db")])
    assert info.value.code == 2
    assert "'nosuchid' is not a record id" in _error_line(capsys)


def test_db_show_prints_configs_as_config_takes_them(tmp_path, capsys):
    """Categorical decisions are stored as indices; db show prints their labels, so a line can
    be pasted into --config (which refuses an index: order=1 had silently meant mkn)."""
    rec = _record(1)
    labelled = dataclasses.replace(rec.candidates[0], config={"mr": 4, "order": 1, "par": 0})
    second = dataclasses.replace(rec.candidates[1], config={"mr": 2, "order": 0, "par": 1})
    with open_database(tmp_path / "a.db") as db:
        db.put(dataclasses.replace(rec, candidates=(labelled, second)))
    assert main(["db", "show", "1", "--db", str(tmp_path / "a.db")]) == 0
    assert "#1 mr=4,order=mkn,par=m:" in capsys.readouterr().out


def test_import_refuses_ranks_with_a_gap(tmp_path, capsys):
    """Ranks 1, 2, 5 would show as 'chosen rank 5' of a table of three."""
    d = json.loads(json.dumps(_record(3, n_cands=3).as_dict()))
    d["candidates"][2]["rank"] = 5
    (tmp_path / "x.jsonl").write_text(json.dumps(d) + "\n")
    assert main(["db", "import", str(tmp_path / "x.jsonl"), "--db", str(tmp_path / "t.db")]) == 2
    err = _error_line(capsys)
    assert "field candidates is [1, 2, 5]" in err and "rank the candidates 1 to their number" in err


def _fitting_haswell_record() -> TuneRecord:
    """A record of matmul 2x8x8 on the built-in haswell whose two configs fit its space."""
    from aotune.search.database import spec_hash
    from aotune.targets import target_for

    hw = load_target("haswell")
    fits = target_for(hw).build_space(matmul(2, 8, 8)).sample(2, seed=1)
    return dataclasses.replace(
        _record(1),
        spec_hash=spec_hash(hw),
        candidates=tuple(
            CandidateRecord(r + 1, c.as_dict(), 1e-3 * (r + 1), 2e-3, "L1", {"L1": 1.0})
            for r, c in enumerate(fits)
        ),
    )


def test_import_checks_configs_against_the_space_of_a_spec_known_here(tmp_path, capsys):
    """A record for a built-in spec whose config that spec's space refuses is named (by its
    place in the file) and nothing of the file is imported; records whose configs fit are
    imported, and one for a spec known only by its hash (a calibrated file) is counted as not
    checked, to be checked when tune reads it."""
    good = _fitting_haswell_record()
    bad = dataclasses.replace(
        good,
        candidates=(
            good.candidates[0],
            dataclasses.replace(good.candidates[1], config={**good.candidates[1].config, "mr": 30}),
        ),
    )
    unknown = _record(3)  # its spec hash is no spec's here
    x = tmp_path / "x.jsonl"
    x.write_text("".join(json.dumps(r.as_dict()) + "\n" for r in (unknown, bad)))
    db = tmp_path / "t.db"
    lying = dataclasses.replace(good, target="a100")
    x.write_text(json.dumps(lying.as_dict()) + "\n")
    assert main(["db", "import", str(x), "--db", str(db)]) == 2
    assert "its target 'a100' is not the name of its spec (haswell" in _error_line(capsys)
    x.write_text("".join(json.dumps(r.as_dict()) + "\n" for r in (unknown, bad)))
    assert main(["db", "import", str(x), "--db", str(db)]) == 2
    err = _error_line(capsys)
    assert "x.jsonl record 2 (matmul 2x8x8" in err and "on haswell" in err
    assert "'mr': 30" in err and "does not fit the space" in err and "choose mr from {1, 2}" in err
    assert "nothing was imported" in err and not db.exists()
    x.write_text("".join(json.dumps(r.as_dict()) + "\n" for r in (unknown, good)))
    assert main(["db", "import", str(x), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "imported 2 records" in out and "1 of the 2 records are for a spec not known" in out


def test_export_leaves_out_records_import_would_refuse(tmp_path, capsys):
    """A stored record whose config its spec's space refuses (a database edited by hand, or a
    space that changed since) is left out of an export, by its id and why, and the database
    keeps it: the file written is one ``db import`` takes whole (it had been refused whole)."""
    good = _fitting_haswell_record()
    config = {**good.candidates[1].config, "mr": 30}
    bad = dataclasses.replace(
        good,
        options=good.options.replace('"seed":0', '"seed":1'),  # another key
        candidates=(good.candidates[0], dataclasses.replace(good.candidates[1], config=config)),
    )
    assert bad.key != good.key
    db_path, x = tmp_path / "t.db", tmp_path / "x.jsonl"
    with open_database(db_path) as db:
        for r in (good, bad, _record(3)):
            db.put(r)
    assert main(["db", "export", str(x), "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert "exported 2 records" in out and "left out 1 record that 'db import' would refuse" in out
    assert "record 2 (matmul 2x8x8" in out and "'mr': 30" in out and "choose mr from {1, 2}" in out
    assert len(x.read_text().splitlines()) == 2
    with open_database(db_path) as db:
        assert db.count() == 3  # the database keeps it
    assert main(["db", "import", str(x), "--db", str(tmp_path / "u.db")]) == 0
    assert "imported 2 records" in capsys.readouterr().out


def _edited(d: dict, path: tuple, value: object) -> dict:
    """``d`` with the item at ``path`` set to ``value`` and its workload key made its hash
    again, as someone editing an export by hand would (the key check then passes)."""
    from aotune.search.database import _canonical, _digest

    d = json.loads(json.dumps(d))
    at = d
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    d["workload_key"] = _digest(_canonical(d["workload"]["definition"]))
    return d


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("workload", "definition", "loops", 0, "extent"), 0, "aotune makes another of its"),
        (("workload", "definition", "loops", 0, "extent"), -64, "aotune makes another of its"),
        (("workload", "definition", "dtype"), "float64", "aotune makes another of its"),
        (("workload", "definition", "loops"), [], "names no loop ('m')"),
        (("workload", "definition", "op"), "nonsense", "unknown operator 'nonsense'"),
        (("workload", "definition", "epilogue", "activation"), "swish", "'swish' is not"),
        (("workload", "definition", "loops", 0, "extent"), 2.5, "not as aotune writes it"),
        (("workload", "describe"), "conv2d 1x3x224x224", "describe ('conv2d 1x3x224x224')"),
        (("workload", "op"), "conv2d", "op ('conv2d') does not match"),
    ],
)
def test_import_refuses_a_workload_aotune_does_not_make(tmp_path, capsys, path, value, named):
    """An export edited so that its workload is not one aotune makes (a zero or negative
    extent, another dtype, an index over no loop, a label that contradicts the definition) is
    refused in one line naming the record (it crashed in the polyhedral analysis, or was
    imported and listed under the wrong description), for a spec known only by its hash too."""
    x, db = tmp_path / "x.jsonl", tmp_path / "t.db"
    good = _record(1).as_dict()
    x.write_text(json.dumps(good) + "\n" + json.dumps(_edited(good, path, value)) + "\n")
    assert main(["db", "import", str(x), "--db", str(db)]) == 2
    err = _error_line(capsys)
    assert "x.jsonl record 2: its workload" in err and named in err, err
    assert "nothing was imported" in err and not db.exists()


def test_import_names_records_a_file_repeats(tmp_path, capsys):
    x, db = tmp_path / "x.jsonl", tmp_path / "t.db"
    line = json.dumps(_record(1).as_dict()) + "\n"
    x.write_text(line + json.dumps(_record(2).as_dict()) + "\n" + line)
    assert main(["db", "import", str(x), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "imported 2 records" in out and "(0 already there, kept; 1 repeating an earlier" in out
    assert main(["db", "import", str(x), "--db", str(db)]) == 0
    assert "imported 0 records" in capsys.readouterr().out


def _import_refused(tmp_path: Path, text: str, says: str) -> None:
    """Importing ``text`` as a JSONL file is refused with an error matching ``says``."""
    (tmp_path / "x.jsonl").write_text(text)
    with open_database(tmp_path / "t.db") as db:
        with pytest.raises(DatabaseError, match=says):
            db.import_jsonl(tmp_path / "x.jsonl")


def _three_candidates() -> dict:
    d = json.loads(json.dumps(_record(5).as_dict()))
    first = d["candidates"][0]
    d["candidates"] = [json.loads(json.dumps({**first, "rank": r})) for r in (1, 2, 3)]
    return d


@pytest.mark.parametrize(
    "odd, change, says",
    [
        (0, lambda c: c.pop("mr"), r"field candidates\[0\].config is .*: it lacks mr; name the "),
        (2, lambda c: c.update(zz=3), r"field candidates\[2\].config is .*: it adds zz; name the "),
        (
            1,
            lambda c: c.update(zz=c.pop("mr")),
            "it lacks mr; it adds zz; name the decisions most ",
        ),
    ],
)
def test_import_names_the_candidate_whose_decisions_differ_from_the_others(
    tmp_path, odd, change, says
):
    d = _three_candidates()
    change(d["candidates"][odd]["config"])
    _import_refused(tmp_path, json.dumps(d) + "\n", says)


def test_import_names_missing_and_unknown_record_fields_apart(tmp_path):
    says = r"record lacks field\(s\) aotune_version, .*workload_key and has unknown field\(s\) a: "
    _import_refused(tmp_path, '{"a": 1}\n', says + "give it as")


def test_import_names_every_set_of_decisions_where_none_has_a_majority(tmp_path):
    d = _three_candidates()
    d["candidates"][1]["config"]["zz"] = 1
    d["candidates"][2]["config"]["yy"] = 1
    sets = r"\(candidates\[0\] mr, nr; candidates\[1\] mr, nr, zz; candidates\[2\] mr, nr, yy\)"
    _import_refused(tmp_path, json.dumps(d) + "\n", "name 3 different sets of decisions " + sets)


def test_import_says_how_many_more_candidates_differ_from_the_majority(tmp_path):
    d = _three_candidates()
    d["candidates"].append(json.loads(json.dumps({**d["candidates"][0], "rank": 4})))
    d["candidates"].append(json.loads(json.dumps({**d["candidates"][0], "rank": 5})))
    d["candidates"][1]["config"]["zz"] = 1
    d["candidates"][3]["config"]["yy"] = 1
    _import_refused(
        tmp_path, json.dumps(d) + "\n", r"candidates\[1\].config .*it adds zz; .*\(1 more"
    )


def test_a_database_that_cannot_be_written_is_refused_before_the_search(tmp_path, monkeypatch):
    from aotune.search import cached, driver

    hw, w = load_target("haswell"), matmul(24, 40, 16)
    opts = SearchOptions(budget=16, top_k=1, compile_top=1)
    with open_database(tmp_path / "t.db") as db:
        db._conn.execute("PRAGMA query_only = ON")  # refuses writes as a read-only file does
        searched = driver.tune
        monkeypatch.setattr(driver, "tune", lambda *a, **k: pytest.fail("searched first"))
        with pytest.raises(DatabaseError, match="cannot write to .*readonly.*--no-db"):
            cached.tune(w, hw, opts, db)
        monkeypatch.setattr(driver, "tune", searched)
        db._conn.execute("PRAGMA query_only = OFF")
        _, stored, reused = cached.tune(w, hw, opts, db)
        db._conn.execute("PRAGMA query_only = ON")  # a stored record is read, not written
        assert cached.tune(w, hw, opts, db)[1:] == (stored, True) and not reused


def _folder_refusing_new_files(folder: Path) -> Callable[[], None]:
    """Make ``folder`` take no new files (chmod; for root, which chmod does not stop, the
    immutable flag); the function that undoes it. Skips where neither works."""
    from aotune.files import folder_takes_new_files

    folder.chmod(0o555)
    if not folder_takes_new_files(folder):
        return lambda: folder.chmod(0o755)
    folder.chmod(0o755)
    chattr = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, check=False)
    if chattr.returncode or folder_takes_new_files(folder):
        pytest.skip("cannot make a folder refuse new files here")
    return lambda: subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_database_that_cannot_be_opened_says_why(tmp_path, capsys):
    assert main(["tune", "matmul", "--shape", "8x8x8", *FAST, "--db", str(tmp_path / "a.db")]) == 0
    capsys.readouterr()
    (tmp_path / "dangling.db").symlink_to(tmp_path / "missing" / "x.db")
    for db in (tmp_path / "dangling.db", f"{tmp_path / 'a.db'}/"):
        for cmd in (["db", "list"], ["tune", "matmul", "--shape", "8x8x8", *FAST]):
            assert main([*cmd, "--db", str(db)]) == 2
            assert re.search("symbolic link to .*missing|ends in '/'", capsys.readouterr().err)
    folder = tmp_path / "ro"
    folder.mkdir()
    (tmp_path / "a.db").rename(folder / "a.db")
    undo = _folder_refusing_new_files(folder)
    try:
        assert main(["db", "list", "--db", str(folder / "a.db")]) == 2
        assert f"its folder {folder} takes no new files" in capsys.readouterr().err
    finally:
        undo()


def test_import_refuses_a_key_given_twice_in_one_object(tmp_path, capsys):
    db, x = str(tmp_path / "t.db"), tmp_path / "x.jsonl"
    line = json.dumps(_record(1).as_dict())
    x.write_text(line + "\n" + line.replace('{"', '{"target": "haswell", "', 1) + "\n")
    assert main(["db", "import", str(x), "--db", db]) == 2
    assert "x.jsonl line 2 gives 'target' twice in one object" in _error_line(capsys)
    with open_database(db) as d:
        assert d.count() == 0


@pytest.mark.parametrize("version", ["0", "-1"])
def test_a_schema_version_no_aotune_writes_is_damage(tmp_path, capsys, version):
    db = _filled_db(tmp_path / "t.db")
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (version,))
    conn.commit()
    conn.close()
    assert main(["db", "list", "--db", str(db)]) == 2
    assert f"its schema version is {version}, which no aotune writes" in _error_line(capsys)
