"""A damaged tuning database is refused by the commands that write, untouched (they had recreated
a dropped table and stored into it), and a gzipped 'db export' file imports."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest
from aotune.cli import main
from aotune.errors import DatabaseError
from aotune.search import database
from aotune.search.database import (
    open_database,
)

from .test_database import _filled_db, _record

FAST = ["--budget", "5", "--top-k", "1", "--no-verify"]
KERNELS = '[[kernel]]\nname = "a"\nop = "matmul"\nshape = "8x8x8"\n'


def _drop(path: Path, table: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("table", ["candidates", "records"])
def test_a_database_missing_a_table_is_refused_by_every_write_path_untouched(
    tmp_path, capsys, table
):
    db = _filled_db(tmp_path / "t.db")
    export = tmp_path / "x.jsonl"
    assert main(["db", "export", str(export), "--db", str(db)]) == 0
    capsys.readouterr()
    _drop(db, table)
    before = db.read_bytes()
    with pytest.raises(DatabaseError) as info:  # what tune, build and import open it with
        open_database(db)
    assert f"its table {table} is missing; the file is damaged; restore it" in str(info.value)
    (tmp_path / "k.toml").write_text(KERNELS)
    for argv in (
        # a workload the file holds no record of: it had been searched and stored
        ["tune", "matmul", "--shape", "8x8x24", "--target", "haswell", *FAST],
        ["db", "import", str(export)],
        ["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "out"), *FAST],
    ):
        assert main([*argv, "--db", str(db)]) == 2, argv
        err = _error_line(capsys)
        assert f"its table {table} is missing; the file is damaged" in err, argv
        assert "pass --db with a new file" in err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.toml", "t.db", "x.jsonl"]


def test_a_new_or_empty_file_gets_the_schema(tmp_path, capsys):
    empty = tmp_path / "empty.db"
    empty.touch()
    with open_database(empty) as db:
        db.put(_record(0))
    with open_database(tmp_path / "new.db") as db:
        db.put(_record(1))
    export = tmp_path / "x.jsonl"
    assert main(["db", "export", str(export), "--db", str(empty)]) == 0
    other = tmp_path / "other.db"
    other.touch()
    assert main(["db", "import", str(export), "--db", str(other)]) == 0
    assert "imported 1 record " in capsys.readouterr().out
    with open_database(other, create=False) as db:
        assert [r.key for r in db.all()] == [_record(0).key]


def test_a_file_from_before_the_objects_table_gets_it_and_keeps_its_records(tmp_path):
    """The objects table came after schema 1: a file without it is an older one, not damaged."""
    db = _filled_db(tmp_path / "t.db")
    _drop(db, "objects")
    with open_database(db) as d:
        d.put_object("k", b"\x7fELF object", {"what": "test"})
        assert d.get_object("k") == (b"\x7fELF object", {"what": "test"})
        assert d.count() == 2


def _gzip_export(tmp_path: Path, capsys) -> tuple[Path, Path]:
    db = _filled_db(tmp_path / "t.db")
    export = tmp_path / "x.jsonl"
    assert main(["db", "export", str(export), "--db", str(db)]) == 0
    capsys.readouterr()
    packed = tmp_path / "x.jsonl.gz"
    packed.write_bytes(gzip.compress(export.read_bytes()))
    return export, packed


def test_a_gzipped_export_imports(tmp_path, capsys):
    export, packed = _gzip_export(tmp_path, capsys)
    new = tmp_path / "new.db"
    assert main(["db", "import", str(packed), "--db", str(new)]) == 0
    assert "imported 2 records" in capsys.readouterr().out
    with open_database(new, create=False) as db:
        stored = [json.dumps(r.as_dict(), sort_keys=True) for r in db.all()]
    assert stored == export.read_text().splitlines()  # as export writes them: nothing changed


def test_a_damaged_or_oversized_gzipped_export_is_one_line(tmp_path, capsys, monkeypatch):
    export, packed = _gzip_export(tmp_path, capsys)
    new = tmp_path / "new.db"
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[:-12])  # a download cut short
    assert main(["db", "import", str(cut), "--db", str(new)]) == 2
    err = _error_line(capsys)
    assert "is a gzip file that cannot be unpacked" in err and "gunzip" in err
    twice = tmp_path / "twice.jsonl.gz.gz"
    twice.write_bytes(gzip.compress(packed.read_bytes()))
    assert main(["db", "import", str(twice), "--db", str(new)]) == 2
    assert "gzipped twice" in _error_line(capsys)
    sqlite_gz = tmp_path / "t.db.gz"
    sqlite_gz.write_bytes(gzip.compress((tmp_path / "t.db").read_bytes()))
    assert main(["db", "import", str(sqlite_gz), "--db", str(new)]) == 2
    assert "is a gzipped database, not a 'db export' file" in _error_line(capsys)
    # the size limit holds for what it unpacks to, not only for the packed file
    monkeypatch.setattr(database, "_IMPORT_LIMIT", len(export.read_bytes()) - 1)
    assert main(["db", "import", str(packed), "--db", str(new)]) == 2
    err = _error_line(capsys)
    assert f"unpacks to more than the {len(export.read_bytes()) - 1} bytes" in err
    assert not new.exists()
