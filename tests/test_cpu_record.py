"""The CPU bench records kept in the repository, and their re-scoring by today's model."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from aotune.benchmarks import cpu_record
from aotune.errors import MeasurementFileError

RECORDS = sorted(cpu_record.RECORDS_DIR.glob("*.json.gz"))


def test_the_zen5_records_are_kept():
    names = {p.name for p in RECORDS}
    assert {f"znver5-matmul-2026-11-30-{x}.json.gz" for x in "abcdefghijklmn"} <= names
    assert {
        "znver5-operators-2026-11-30.json.gz",
        "znver5-operators-2026-11-30-b.json.gz",
        "znver5-operators-2026-11-30-c.json.gz",
        "znver5-operators-2026-11-30-d.json.gz",
        "znver5-operators-2026-11-30-e.json.gz",
        "znver5-operators-2026-12-01.json.gz",
        "znver5-unseen-2026-11-30.json.gz",
        "znver5-unseen-2026-11-30-b.json.gz",
        "znver5-unseen-2026-11-30-c.json.gz",
        "znver5-unseen-2026-11-30-d.json.gz",
        "znver5-unseen-2026-11-30-e.json.gz",
        "znver5-unseen-2026-11-30-f.json.gz",
        "znver5-unseen-2026-11-30-g.json.gz",
        "znver5-unseen-2026-12-01.json.gz",
    } <= names


def test_the_zen4_records_are_kept():
    names = {p.name for p in RECORDS}
    assert {
        "znver4-matmul-2026-12-01.json.gz",
        "znver4-matmul-2026-12-01-b.json.gz",
        "znver4-matmul-2026-12-01-c.json.gz",
        "znver4-operators-2026-12-01.json.gz",
        "znver4-unseen-2026-12-01.json.gz",
    } <= names


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_every_kept_row_maps_to_its_workload_and_its_scores_come_back(path):
    """Each row's workload is found by its name, and the scores the bench printed are what its
    kept predictions and times give: the record holds what a re-score needs."""
    doc = cpu_record.read_record(path)
    rows = [r for r in doc["rows"] if r.get("accuracy")]
    assert rows
    for row in rows:
        assert cpu_record.row_workload(row["workload"]) is not None, row["workload"]
        samples = cpu_record._samples(row)
        assert len(samples) == row["accuracy"]["n"] == 64
        got = cpu_record.scores(
            [s["predicted_s"] for s in samples], [s["measured_s"] for s in samples]
        )
        for key in ("spearman", "kendall", "top1", "median_abs_error"):
            assert got[key] == pytest.approx(row["accuracy"][key]), (row["workload"], key)


def test_a_cut_record_is_re_predicted_for_the_spec_that_timed_it(tmp_path):
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / "znver5-matmul-2026-11-30-c.json.gz")
    row = dict(doc["rows"][0])
    row["accuracy"] = {**row["accuracy"], "samples": row["accuracy"]["samples"][:6]}
    small = tmp_path / "small.json.gz"
    small.write_bytes(gzip.compress(json.dumps({**doc, "rows": [row]}).encode()))
    (scored,) = cpu_record.rescore(cpu_record.read_record(small), "znver5", log=lambda _: None)[
        "rows"
    ]
    assert scored["workload"] == row["workload"] and scored["n"] == 6
    assert all(math.isfinite(p) and p > 0 for p in scored["predicted_s"])
    kept = row["accuracy"]["samples"]
    assert scored["before"] == cpu_record.scores(
        [s["predicted_s"] for s in kept], [s["measured_s"] for s in kept]
    )
    assert -1.0 <= scored["spearman"] <= 1.0 and 0.0 < scored["top1"] <= 1.0


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\x00\x01not json", "not JSON"),
        (b'{"rows": []}', "no row with sampled configs"),
        (b'{"rows": [{"workload": "matmul 8x8x8", "accuracy": {"samples": [1]}}]}', "no row"),
        (b"[1, 2]", "no row"),
    ],
)
def test_a_file_that_is_not_a_bench_record_is_named(tmp_path, content, words):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(MeasurementFileError, match=words):
        cpu_record.read_record(bad)


def test_the_command_answers_bad_input_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": []}')
    assert cpu_record.main(["rescore", str(bad), "--target", "znver5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bench record")
    good = cpu_record.RECORDS_DIR / "znver5-unseen-2026-11-30.json.gz"
    assert cpu_record.main(["rescore", str(good), "--target", "h100"]) == 2
    assert "is a GPU" in capsys.readouterr().err
    assert cpu_record.main(["rescore", str(tmp_path / "missing.json"), "--target", "znver5"]) == 2
    assert "cannot read bench record" in capsys.readouterr().err
