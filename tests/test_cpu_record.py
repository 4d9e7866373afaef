"""The CPU bench records kept in the repository, and their re-scoring by today's model."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math

import pytest
from aotune.benchmarks import cpu_record
from aotune.errors import HwSpecError, MeasurementFileError
from aotune.hwspecs.spec import SPEC_DIR, load_target
from aotune.hwspecs.spec_toml import differing_paths, with_value

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
        "znver4-matmul-2026-12-01-d.json.gz",
        "znver4-matmul-2026-12-06.json.gz",
        "znver4-matmul-2026-12-06-b.json.gz",
        "znver4-matmul-2026-12-06-c.json.gz",
        "znver4-matmul-2026-12-06-d.json.gz",
        "znver4-matmul-2026-12-07.json.gz",
        "znver4-matmul-2026-12-07-b.json.gz",
        "znver4-matmul-2026-12-07-c.json.gz",
        "znver4-matmul-2026-12-07-d.json.gz",
        "znver4-matmul-2026-12-07-e.json.gz",
        "znver4-operators-2026-12-01.json.gz",
        "znver4-operators-2026-12-01-b.json.gz",
        "znver4-operators-2026-12-01-c.json.gz",
        "znver4-operators-2026-12-06.json.gz",
        "znver4-unseen-2026-12-01.json.gz",
        "znver4-unseen-2026-12-01-b.json.gz",
        "znver4-unseen-2026-12-01-c.json.gz",
    } <= names


def test_the_emerald_rapids_records_are_kept():
    names = {p.name for p in RECORDS}
    assert {
        f"emeraldrapids-{rows}-2026-12-02.json.gz" for rows in ("matmul", "operators", "unseen")
    } <= names
    assert {
        "emeraldrapids-matmul-2026-12-02-b.json.gz",
        "emeraldrapids-matmul-2026-12-02-c.json.gz",
        "emeraldrapids-matmul-2026-12-02-d.json.gz",
        "emeraldrapids-operators-2026-12-02-b.json.gz",
        "emeraldrapids-unseen-2026-12-02-b.json.gz",
        # the kernels without an indexed FMA (stop 91 on)
        "emeraldrapids-matmul-2026-12-02-e.json.gz",
        "emeraldrapids-matmul-2026-12-02-f.json.gz",
        "emeraldrapids-matmul-2026-12-03.json.gz",
        "emeraldrapids-operators-2026-12-02-c.json.gz",
        "emeraldrapids-operators-2026-12-03.json.gz",
    } <= names


def test_the_zen2_records_are_kept():
    """Stop 93's bench on a Zen 2 slice, timed with that day's calibration file (the built-in
    ``znver2`` spec was written from a later one the same day)."""
    names = {p.name for p in RECORDS}
    assert {f"znver2-{rows}-2026-12-03.json.gz" for rows in ("matmul", "operators")} <= names
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / "znver2-matmul-2026-12-03.json.gz")
    assert "(znver2)" in doc["machine"] and doc["numpy_blas"]["forced_by_env"] is False


def test_the_zen2_unseen_record_is_kept():
    """Stop 94's unseen rows on the Zen 2 slice, timed with the built-in spec (``host``)."""
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / "znver2-unseen-2026-12-04.json.gz")
    assert "core model from znver2" in doc["machine"]
    assert doc["numpy_blas"]["forced_by_env"] is False
    assert len(doc["rows"]) == 6 and all(r["all_correct"] for r in doc["rows"])


def _assert_host_bench_kept(cpu: str, name: str, rows: int) -> dict:
    """The kept bench ``{cpu}-{name}``, timed with the built-in spec against numpy as users have
    it: ``rows`` rows, every kernel correct, no measurement in any search."""
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / f"{cpu}-{name}.json.gz")
    assert f"core model from {cpu}" in doc["machine"]
    assert doc["numpy_blas"]["forced_by_env"] is False
    assert len(doc["rows"]) == rows and all(r["all_correct"] for r in doc["rows"])
    assert all(r["measurements"] == 0 for r in doc["rows"])
    return doc


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("matmul-2026-12-04", 8),
        ("unseen-2026-12-04-b", 6),
        ("matmul-2026-12-04-b", 8),
        ("unseen-2026-12-04-c", 6),
    ],
)
def test_the_zen2_records_of_kernels_that_prefetch_c_are_kept(name, rows):
    """Stop 95's matmul and unseen benches on the Zen 2 slice, the first of micro-kernels that
    prefetch their C tile (``c_prefetch_steps``), and stop 96's, whose A packs from DRAM also
    prefetch their rows (``a_pack_prefetch_rows``), timed with the built-in spec (``host``): the
    earlier timings are of the kernels before them, so they are not one sample of today's."""
    _assert_host_bench_kept("znver2", name, rows)


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("matmul-2026-12-04", 8),
        ("unseen-2026-12-04", 6),
        ("operators-2026-12-04", 13),
        ("matmul-2026-12-04-b", 8),
    ],
)
def test_the_zen4_records_of_today_s_kernels_are_kept(name, rows):
    """Stop 97's benches on the Zen 4 slice, timed with the built-in spec (``host``): the first
    there of kernels whose loops step a pointer per operand (stop 91) and that prefetch their C
    tile and A's rows (stops 95-96); the same samples as the slice's kept timings of 2026-12-01,
    which are of earlier kernels. Stop 98's matmul timing (``-b``) is of the same kernels, four
    hours later, while the slice's L3 held less."""
    doc = _assert_host_bench_kept("znver4", name, rows)
    assert doc["numpy_blas"]["kernel"] == "SkylakeX"


@pytest.mark.parametrize(
    ("name", "rows"),
    [("matmul-2026-12-07", 8), ("operators-2026-12-07", 13), ("unseen-2026-12-07", 6)],
)
def test_the_zen3_records_are_kept(name, rows):
    """Stop 122's benches on a Zen 3 slice, the first kept there: the model and kernels of stop
    121, none of whose changes since stop 67 was made on a Zen 3, timed with the built-in spec
    (``host``) against numpy's ``Haswell`` kernel, which is what this CPU gets unforced."""
    doc = _assert_host_bench_kept("znver3", name, rows)
    assert doc["numpy_blas"]["kernel"] == "Haswell"


def test_the_emerald_rapids_host_timings_make_one_median():
    """The slice's timings with the built-in spec (``host``) are of one machine and one sample
    set, so ``rescore`` takes their median; the first matmul timing was made with a calibration
    file, whose description names another target, and stays apart."""
    data = cpu_record.RECORDS_DIR
    for rows, parts in (("matmul", ("-b", "-c", "-d")), ("unseen", ("", "-b"))):
        names = [f"emeraldrapids-{rows}-2026-12-02{p}.json.gz" for p in parts]
        doc = cpu_record.median_record([cpu_record.read_record(data / n) for n in names], names)
        assert doc["timings"] == len(parts) and len(doc["rows"]) >= 6
    # today's kernels, timed on two days with the same samples
    days = ("2026-12-02-e", "2026-12-02-f", "2026-12-03")
    names = [f"emeraldrapids-matmul-{d}.json.gz" for d in days]
    doc = cpu_record.median_record([cpu_record.read_record(data / n) for n in names], names)
    assert doc["timings"] == 3 and len(doc["rows"]) == 8
    names = ["emeraldrapids-matmul-2026-12-02.json.gz", "emeraldrapids-matmul-2026-12-02-b.json.gz"]
    with pytest.raises(MeasurementFileError, match="a median takes timings of one machine"):
        cpu_record.median_record([cpu_record.read_record(data / n) for n in names], names)


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
        (b'{"rows": [{"workload": "matmul 8x8x8", "accuracy": {"samples": [1]}}]}', "no config"),
        (b"[1, 2]", "no row"),
        (b'{"rows": [{"workload": "x"}, null]}', r"rows\[1\] is null, not a row object"),
        (b'{"rows": [{"accuracy": {"samples": []}}]}', "has samples but no workload name"),
        (b'{"rows": [' + b"[" * 100_000, "nested too deeply"),
        (b'{"rows": [' + b"1" * 5000 + b"]}", "a number of thousands of digits"),
        (gzip.compress(b'{"rows": []}', mtime=0)[:-12] + b"\x00" * 12, "not JSON or gzipped JSON"),
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


def _row_of(times: list[object], measured: str = "measured_s") -> bytes:
    samples = [
        {"config": f"mr={i + 1}", "predicted_s": 1.0, measured: t} for i, t in enumerate(times)
    ]
    return json.dumps({"rows": [{"workload": "matmul 8x8x8", "accuracy": {"samples": samples}}]})


@pytest.mark.parametrize(
    "times, words",
    [
        ([1.0, -1.0, 2.0], "sample 2 .mr=2. has measured_s -1.0; a time is a positive number"),
        ([1.0, float("nan"), 2.0], "has measured_s NaN"),
        ([1.0, float("inf"), 2.0], "has measured_s Infinity"),
        ([1.0, 0, 2.0], "has measured_s 0;"),
        ([1.0, True, 2.0], "has measured_s true"),
        ([1.0, "2", 2.0], 'has measured_s "2"'),
        ([1.0, 2.0], "2 samples; scores need at least 3"),
        ([1.0, 1.0, 1.0], "every sample has one time"),
    ],
)
def test_times_that_are_no_times_are_named_not_scored(tmp_path, times, words):
    """A sample's time that is not a positive number of seconds (it scored top-1 -10756.968, a
    median error of inf), too few samples, or one time for all are refused, naming the row and
    the sample."""
    bad = tmp_path / "bad.json"
    bad.write_text(_row_of(times))
    with pytest.raises(MeasurementFileError, match=f"row 'matmul 8x8x8'.*{words}"):
        cpu_record.read_record(bad)


def test_the_same_file_twice_or_timings_of_two_machines_are_refused(tmp_path, capsys):
    good = cpu_record.RECORDS_DIR / "znver5-unseen-2026-11-30.json.gz"
    again = tmp_path / "link.json.gz"
    again.symlink_to(good)
    assert cpu_record.main(["rescore", str(good), str(again), "--target", "znver5"]) == 2
    assert "is given twice (as file 1 and 2); give each timing once" in capsys.readouterr().err
    doc = json.loads(gzip.decompress(good.read_bytes()))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**doc, "machine": "bare metal: detected host: znver4"}))
    assert cpu_record.main(["rescore", str(good), str(other), "--target", "znver5"]) == 2
    err = capsys.readouterr().err
    assert "other.json was timed on 'bare metal" in err and "timings of one machine" in err
    args = ["rescore", str(good), "--target", "znver5", "--target", "znver4"]
    with pytest.raises(SystemExit):
        cpu_record.main(args)
    assert "--target given twice (znver5 and znver4)" in capsys.readouterr().err
    assert cpu_record.main(["rescore", str(good), "--target", "haswell"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "row '" in err and "check that --target is the spec of the machine" in err


def _timing(times: dict[str, float], predicted: float = 1.0) -> dict:
    """A bench document of one row whose samples ran in ``times`` (config -> seconds)."""
    samples = [{"config": c, "predicted_s": predicted, "measured_s": t} for c, t in times.items()]
    row = {"workload": "matmul 8x8x8", "accuracy": {"samples": samples}}
    return {"machine": "m", "rows": [row]}


def test_several_timings_are_scored_against_each_configs_median():
    docs = [
        _timing({"a": 1.0, "b": 5.0, "c": 2.0}, predicted=3.0),
        _timing({"c": 4.0, "a": 9.0, "b": 1.0}, predicted=7.0),  # another order, another model
        _timing({"b": 2.0, "a": 3.0, "c": 3.0}, predicted=7.0),
    ]
    doc = cpu_record.median_record(docs, ["x", "y", "z"])
    (row,) = doc["rows"]
    got = {s["config"]: (s["measured_s"], s["predicted_s"]) for s in row["accuracy"]["samples"]}
    assert got == {"a": (3.0, 3.0), "b": (2.0, 3.0), "c": (3.0, 3.0)}
    assert doc["timings"] == 3 and doc["machine"] == "m"
    assert [s["measured_s"] for s in docs[0]["rows"][0]["accuracy"]["samples"]] == [1.0, 5.0, 2.0]


def test_timings_of_other_samples_are_named_not_mixed():
    docs = [_timing({"a": 1.0, "b": 2.0}), _timing({"a": 1.0, "d": 2.0})]
    with pytest.raises(MeasurementFileError, match=r"second.json: row 'matmul 8x8x8' has no time"):
        cpu_record.median_record(docs, ["first.json", "second.json"])
    with pytest.raises(MeasurementFileError, match=r"second.json: row 'matmul 8x8x8' has 1 conf"):
        cpu_record.median_record([docs[0], _timing({"a": 1.0, "b": 2.0, "d": 3.0})],
                                 ["first.json", "second.json"])  # fmt: skip
    copy = _timing({"a": 1.0, "b": 2.0})  # a copy of a file: the same timing given twice
    with pytest.raises(MeasurementFileError, match="first.json and copy.json hold the same times"):
        cpu_record.median_record([docs[0], _timing({"a": 1.5, "b": 2.0}), copy],
                                 ["first.json", "other.json", "copy.json"])  # fmt: skip
    other_row = _timing({"a": 1.0, "b": 2.0})
    other_row["rows"][0]["workload"] = "matmul 9x9x9"
    with pytest.raises(MeasurementFileError, match=r"third.json: no row 'matmul 8x8x8'"):
        cpu_record.median_record([docs[0], other_row], ["first.json", "third.json"])


def test_the_command_scores_several_files_against_their_median(tmp_path, capsys):
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / "znver4-matmul-2026-12-01.json.gz")
    row = dict(doc["rows"][0])
    row["accuracy"] = {**row["accuracy"], "samples": row["accuracy"]["samples"][:3]}
    paths = []
    for scale in (1.0, 2.0):
        cut = json.loads(json.dumps({**doc, "rows": [row]}))
        for s in cut["rows"][0]["accuracy"]["samples"]:
            s["measured_s"] *= scale
        paths.append(tmp_path / f"t{scale}.json")
        paths[-1].write_text(json.dumps(cut))
    argv = ["rescore", *map(str, paths), "--target", "znver4", "--json"]
    assert cpu_record.main(argv) == 0
    (scored,) = json.loads(capsys.readouterr().out)["rows"]
    kept = row["accuracy"]["samples"]
    median = [s["measured_s"] * 1.5 for s in kept]
    assert scored["before"] == pytest.approx(
        cpu_record.scores([s["predicted_s"] for s in kept], median)
    )


def test_each_timing_is_also_scored_apart_beside_its_hand_over(tmp_path, capsys):
    """``--each``: today's predictions scored against every timing alone, with the hand-over and
    clock the bench read beside it (a shared line's cost follows the vCPUs' placement)."""
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / "znver4-matmul-2026-12-01.json.gz")
    row = dict(doc["rows"][0])
    kept = row["accuracy"]["samples"][:4]
    paths, timings = [], ([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])
    for i, (times, ns) in enumerate(zip(timings, (40.0, 170.0))):
        samples = [{**s, "measured_s": t * 1e-3} for s, t in zip(kept, times)]
        acc = {**row["accuracy"], "samples": samples, "core_to_core_ns": [ns]}
        acc |= {"clock_ghz": [3.5], "fma_per_cycle": [1.9 - i]}
        paths.append(tmp_path / f"t{i}.json")
        paths[-1].write_text(json.dumps({**doc, "rows": [{**row, "accuracy": acc}]}))
    argv = ["rescore", *map(str, paths), "--target", "znver4", "--each"]
    assert cpu_record.main([*argv, "--json"]) == 0
    (scored,) = json.loads(capsys.readouterr().out)["rows"]
    first, second = scored["each"]
    assert (first["file"], second["file"]) == (str(paths[0]), str(paths[1]))
    assert first["core_to_core_ns"] == [40.0] and second["core_to_core_ns"] == [170.0]
    assert first["fma_per_cycle"] == [1.9] and second["fma_per_cycle"] == [pytest.approx(0.9)]
    for t, times in zip((first, second), timings):
        want = cpu_record.scores(scored["predicted_s"], [x * 1e-3 for x in times])
        assert t["spearman"] == pytest.approx(want["spearman"])
    assert first["spearman"] == pytest.approx(-second["spearman"])  # the times reversed
    assert cpu_record.main(argv) == 0
    out = capsys.readouterr().out
    assert "t1.json" in out and "hand-over 170 ns, clock 3.50 GHz, FMAs a cycle 0.90: " in out
    odd = [1, 2.5, True, "40", float("nan"), float("inf"), 10**400, None, -5, 0, 1e299]
    assert cpu_record._readings(odd) == [1.0, 2.5] + [None] * 9
    assert cpu_record._readings("x") == []
    assert cpu_record._readings_text([40.0, None], ".0f") == "40/?"
    with pytest.raises(SystemExit) as stop:  # the parser's own refusal: exit 2, one line
        cpu_record.main(["ablate", str(paths[0]), "--target", "znver4", "--base", "znver4",
                         "--each"])  # fmt: skip
    assert stop.value.code == 2 and "--each goes with rescore" in capsys.readouterr().err


def test_two_specs_differ_in_the_fields_set_apart():
    hw = load_target("znver4")
    other = with_value(with_value(hw, "memory.set_refill_cycles", 10.0), "core.call_cycles", 5.0)
    assert differing_paths(hw, hw) == []
    assert differing_paths(other, hw) == ["core.call_cycles", "memory.set_refill_cycles"]
    with pytest.raises(HwSpecError, match="cache levels"):
        differing_paths(dataclasses.replace(hw, caches=hw.caches[:2]), hw)


def _spec_file(tmp_path, name: str, values: dict[str, str]) -> str:
    """znver4's spec file as ``name``, with ``values`` (key -> TOML value) in place."""
    text = (SPEC_DIR / "znver4.toml").read_text().replace('name = "znver4"', f'name = "{name}"')
    for key, value in values.items():
        old = f"\n{key} = "
        assert text.count(old) == 1, key
        start = text.index(old) + len(old)
        text = text[:start] + value + text[text.index("\n", start) :]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return str(path)


def test_ablate_predicts_with_each_differing_field_set_back_alone(tmp_path, capsys):
    """What a field moves is what a re-score with the other fields changed and that one not
    gives: each set-back is the spec with only the other field changed, every field set back is
    the base spec."""
    doc = cpu_record.read_record(cpu_record.RECORDS_DIR / "znver4-matmul-2026-12-01.json.gz")
    row = dict(doc["rows"][0])
    row["accuracy"] = {**row["accuracy"], "samples": row["accuracy"]["samples"][:8]}
    doc = {**doc, "rows": [row]}
    changed = {"call_cycles": "30.0", "set_refill_cycles": "12.0"}
    target = _spec_file(tmp_path, "mine", changed)
    result = cpu_record.ablate(doc, target, "znver4", log=lambda _: None)
    assert [f["path"] for f in result["fields"]] == ["core.call_cycles", "memory.set_refill_cycles"]
    base = load_target("znver4")
    assert [(f["target_value"], f["base_value"]) for f in result["fields"]] == [
        (30.0, base.core.call_cycles),
        (12.0, base.memory.set_refill_cycles),
    ]

    def rescored(spec: str) -> dict:
        (r,) = cpu_record.rescore(doc, spec, log=lambda _: None)["rows"]
        return {k: r[k] for k in result["target_rows"][0]}

    assert result["target_rows"] == [rescored(target)]
    assert result["base_rows"] == [rescored("znver4")]
    assert result["target_rows"] != result["base_rows"]  # the samples feel the change
    only_refill = _spec_file(tmp_path, "refill", {"set_refill_cycles": "12.0"})
    only_calls = _spec_file(tmp_path, "calls", {"call_cycles": "30.0"})
    assert result["fields"][0]["rows"] == [rescored(only_refill)]
    assert result["fields"][1]["rows"] == [rescored(only_calls)]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(doc))
    assert cpu_record.main(["ablate", str(path), "--target", target, "--base", "znver4"]) == 0
    out = capsys.readouterr().out
    assert "each of the 2 fields in which it differs from znver4 set back alone" in out
    assert "core.call_cycles 30.0 -> 10.5" in out


def test_ablate_refuses_specs_of_another_isa_and_a_missing_base(tmp_path, capsys):
    good = str(cpu_record.RECORDS_DIR / "znver4-unseen-2026-12-01.json.gz")
    assert cpu_record.main(["ablate", good, "--target", "znver4", "--base", "znver5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differ in isa.llvm_cpu" in err[0] and "one ISA" in err[0]
    for target, base in (("h100", "znver4"), ("znver4", "h100")):
        assert cpu_record.main(["ablate", good, "--target", target, "--base", base]) == 2
        assert "h100 is a GPU" in capsys.readouterr().err
    for argv in (["ablate", good, "--target", "znver4"], ["rescore", good, "--target", "znver4",
                                                         "--base", "znver4"]):  # fmt: skip
        with pytest.raises(SystemExit) as stop:
            cpu_record.main(argv)
        assert stop.value.code == 2
        assert "--base goes with ablate" in capsys.readouterr().err
