"""``aotune hw calibrate``: the spec file it writes (values and origins read back, the -o/--force
rules, bad results refused), each probe's arithmetic on synthetic readings, the microbenchmark
kernels' machine code and results, and one smoke run of the quickest probes on this machine with
loose physical bounds. Timings are never asserted: CI machines vary."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import tempfile
import tomllib

import numpy as np
import pytest
from aotune.cli import main
from aotune.codegen.microbench import (
    OUT_BYTES,
    SCRATCH_BYTES,
    Chase,
    MicroBench,
    Mix,
    Rows,
    Stream,
    assembly_for,
    loop_instructions,
)
from aotune.errors import CalibrationError, HwSpecError
from aotune.files import has_control_character
from aotune.hwspecs import calibrate as cal
from aotune.hwspecs import probes
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import builtin_names, load_spec_file, load_target, spec_from_dict
from aotune.hwspecs.spec_toml import (
    comment_text,
    field_paths,
    origin_from_toml,
    spec_to_toml,
    value_at,
    with_value,
)
from hypothesis import given, settings
from hypothesis import strategies as st

HOST = load_target("host")
ON_HOST = pytest.mark.skipif(not host_can_run(HOST)[0], reason="the host spec cannot run here")


def hand_made(base: str = "znver4", **changes: object) -> cal.Calibration:
    """A calibration built by hand: a built-in spec with some values changed, every value with an
    origin of each kind."""
    spec = load_target(base)
    for path, value in changes.items():
        spec = with_value(spec, path.replace("__", "."), value)
    kinds = ("measured: a probe", "os: sysfs", "llvm: host features", "assumed: from znver4")
    origin = {
        p: f"{kinds[i % 4]} for {p}, 3 fastest within 0.4%" for i, p in enumerate(field_paths(spec))
    }
    return cal.Calibration(spec, origin, {}, ("Calibrated by hand in a test.", "Second note."))


# ---- the spec file -----------------------------------------------------------------------------


def test_a_calibration_writes_a_spec_that_loads_back_equal_comments_included(tmp_path):
    c = cal.named(hand_made(core__frequency_ghz=3.671, caches__L2__latency_cycles=15), "my-cpu")
    path = tmp_path / "my-cpu.toml"
    cal.write_spec(c, str(path), force=False)
    assert load_spec_file(path) == c.spec
    text = path.read_text()
    assert origin_from_toml(text) == dict(c.origin)
    assert text.startswith("# Calibrated by hand in a test.\n#\n# Second note.\n")
    assert "# measured: a probe for isa.arch" in text
    assert all(len(line) <= 100 for line in text.splitlines() if line.startswith("#"))
    # and tune --target FILE takes it
    assert load_target(str(path)).name == "my-cpu"


printable = st.text(
    st.characters(min_codepoint=1, max_codepoint=0x2FFF, blacklist_categories=("Cs",)),
    min_size=1,
    max_size=300,
).filter(lambda t: t.strip())


@settings(max_examples=40, deadline=None)
@given(
    ghz=st.floats(0.1, 10.0),
    bw=st.floats(0.01, 4096.0),
    call=st.floats(0.0, 1.0),
    note=printable,
    description=st.text(max_size=200),
)
def test_any_valid_values_and_origin_texts_round_trip(ghz, bw, call, note, description):
    c = hand_made(
        core__frequency_ghz=ghz,
        caches__L3__bandwidth_bytes_per_cycle=bw,
        overhead__call_seconds=call,
    )
    # a line break to str.splitlines (not a control character, which a spec refuses), TOML syntax
    description = "".join(ch for ch in description if not has_control_character(ch))
    description += "\u2028 [x] # y = 1"
    c = dataclasses.replace(c, spec=dataclasses.replace(c.spec, description=description))
    origin = dict(c.origin)
    origin["core.frequency_ghz"] = "measured: " + note
    # a note already as a comment holds it (single spaces, no control characters) comes back as is
    words = ("".join(ch for ch in w if not has_control_character(ch)) for w in note.split())
    clean = " ".join(w for w in words if w) or "x"
    origin["core.cores"] = "os: " + clean
    c = dataclasses.replace(c, origin=origin)
    text = spec_to_toml(c.spec, c.origin, "\n\n".join(c.notes))
    # the [origin] table holds each text as its comment does: no control character reaches it
    said = tuple((k, comment_text(v)) for k, v in c.spec.origin)
    assert spec_from_dict(tomllib.loads(text), "t") == dataclasses.replace(c.spec, origin=said)
    back = origin_from_toml(text)
    assert back == {k: comment_text(v) for k, v in origin.items()}
    assert back["core.cores"] == "os: " + clean


def test_a_comment_keeps_every_word_and_marks_what_toml_forbids():
    """What an origin note becomes in the file: whitespace runs one space, control characters
    U+FFFD, everything else (non-ASCII included) as it was."""
    assert comment_text("a\t b\x01") == "a b\ufffd"
    assert comment_text("  measured:\n 4.0   cycles \x7f") == "measured: 4.0 cycles \ufffd"
    assert comment_text("Zen 4 \u2014 3.665 GHz, \u00fc [x] # y = 1") == (
        "Zen 4 \u2014 3.665 GHz, \u00fc [x] # y = 1"
    )


def test_an_existing_file_is_kept_without_force_and_replaced_with_it(tmp_path, monkeypatch):
    path = tmp_path / "spec.toml"
    path.write_text("mine")
    c = hand_made()
    with pytest.raises(CalibrationError, match="exists; pass --force"):
        cal.check_output(str(path), force=False)
    kept_in = tmp_path / "tmp"
    kept_in.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(kept_in))  # where a refused spec is kept
    with pytest.raises(CalibrationError, match="exists; pass --force"):
        cal.write_spec(c, str(path), force=False)
    assert path.read_text() == "mine"
    (kept,) = kept_in.glob("aotune-calibrated-*.toml")
    assert load_spec_file(kept) == c.spec
    cal.write_spec(c, str(path), force=True)
    assert load_spec_file(path) == c.spec
    with pytest.raises(CalibrationError, match="is a directory"):
        cal.check_output(str(tmp_path), force=True)
    with pytest.raises(CalibrationError, match="does not exist"):
        cal.check_output(str(tmp_path / "no" / "spec.toml"), force=False)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"core__frequency_ghz": math.nan}, "finite"),
        ({"core__frequency_ghz": 0.0}, "out of range"),
        ({"core__fma_width_bits": 96}, "power of two"),
        ({"caches__L1__latency_cycles": -3}, "out of range"),
        ({"memory__prefetch_stride_bytes": 8192}, "beyond a page"),
        ({"isa__llvm_cpu": "no-such-cpu"}, "not a CPU LLVM knows"),
    ],
)
def test_bad_results_are_refused_and_nothing_is_written(tmp_path, changes, message):
    c = hand_made(**changes)
    path = tmp_path / "spec.toml"
    with pytest.raises((CalibrationError, HwSpecError), match=message):
        cal.write_spec(c, str(path), force=False)
    assert not path.exists()


def test_a_value_without_origin_or_an_origin_without_value_is_refused():
    c = hand_made()
    missing = {k: v for k, v in c.origin.items() if k != "memory.dtlb_entries"}
    with pytest.raises(HwSpecError, match="no origin for memory.dtlb_entries"):
        spec_to_toml(c.spec, missing)
    blank = {**c.origin, "core.cores": "  "}
    with pytest.raises(HwSpecError, match="no origin for core.cores"):
        spec_to_toml(c.spec, blank)
    extra = {**c.origin, "core.turbo": "measured: nothing"}
    with pytest.raises(HwSpecError, match="core.turbo"):
        spec_to_toml(c.spec, extra)


def test_field_paths_reach_every_value_and_replace_it_functionally():
    spec = load_target("znver4")
    paths = field_paths(spec)
    assert "caches.L3.bandwidth_bytes_per_cycle" in paths and "core.frequency_ghz" in paths
    for path in paths:
        value = value_at(spec, path)
        assert with_value(spec, path, value) == spec
    changed = with_value(spec, "caches.L2.latency_cycles", 99)
    assert changed.cache(2).latency_cycles == 99 and spec.cache(2).latency_cycles == 15
    with pytest.raises(HwSpecError):
        value_at(spec, "caches.L9.latency_cycles")
    with pytest.raises(HwSpecError):
        with_value(spec, "core.turbo", 1)


def test_every_schema_field_has_one_probe_or_one_source(monkeypatch):
    for name in builtin_names("cpu"):
        cal.check_coverage(load_target(name))
    monkeypatch.delitem(cal.SOURCES, "memory.page_bytes")
    with pytest.raises(CalibrationError, match="not set: memory.page_bytes"):
        cal.check_coverage(load_target("znver4"))


def test_spec_names_come_from_the_option_or_the_file_name():
    assert cal.spec_name_for("out/my-cpu.toml", None) == "my-cpu"
    assert cal.spec_name_for("weird name.toml", None) == "weird-name"
    assert cal.spec_name_for("cal/my spec ü.toml", None) == "my-spec-u"
    assert cal.spec_name_for("cal/日本.toml", None) == "calibrated"
    assert cal.spec_name_for(None, None) == "calibrated"
    assert cal.spec_name_for("x.toml", "zen5-lab") == "zen5-lab"
    with pytest.raises(CalibrationError, match="--name"):
        cal.spec_name_for(None, "bad name")
    # a built-in's name would list this host's records as that target's
    with pytest.raises(CalibrationError, match="built-in target is called that.*haswell-here"):
        cal.spec_name_for("x.toml", "haswell")
    assert cal.spec_name_for("specs/znver3.toml", None) == "znver3-calibrated"
    assert cal.spec_name_for("host.toml", None) == "host-calibrated"


def test_a_feature_list_too_long_for_a_spec_string_keeps_the_features_that_are_on():
    short = "+avx2,-avx512f,+fma"
    assert cal.spec_features(short)[0] == short
    long = ",".join(f"{'+-'[i % 2]}feature{i}" for i in range(140))
    kept, origin = cal.spec_features(long)
    assert len(long) > cal.FEATURES_LIMIT >= len(kept)
    assert kept.split(",") == [f for f in long.split(",") if f.startswith("+")]
    assert origin.startswith("llvm:")
    with pytest.raises(CalibrationError, match="limit"):
        cal.spec_features(",".join(f"+feature{i}" for i in range(200)))


def run_reading(
    ghz: float, l2: int, call: float, kind: str = "measured: a probe"
) -> cal.Calibration:
    """A hand-made run whose clock, L2 latency and call cycles read as given (origin ``kind``)."""
    c = hand_made(core__frequency_ghz=ghz, caches__L2__latency_cycles=l2, core__call_cycles=call)
    paths = ("core.frequency_ghz", "caches.L2.latency_cycles", "core.call_cycles")
    origin = {**c.origin, **{p: f"{kind} reading {i}" for i, p in enumerate(paths)}}
    origin["core.cores"] = f"os: sysfs, {ghz}"  # not measured: the first run's stays
    return dataclasses.replace(c, origin=origin, notes=(f"Calibrated at {ghz}.", "Origins."))


def test_repeated_runs_keep_each_measured_values_median_and_list_the_readings(tmp_path):
    runs = [run_reading(3.1, 16, 20.6), run_reading(3.4, 14, 15.4), run_reading(3.2, 15, 17.7)]
    c = cal.named(cal.median_of_runs(runs), "three")
    assert c.spec.core.frequency_ghz == 3.2 and c.spec.caches[1].latency_cycles == 15
    assert c.spec.core.call_cycles == 17.7 and isinstance(c.spec.caches[1].latency_cycles, int)
    assert c.origin["core.frequency_ghz"] == (
        "measured: a probe reading 0 (the median of 3 runs' readings: 3.1, 3.4, 3.2)"
    )
    assert c.origin["caches.L2.latency_cycles"].endswith("readings: 16, 14, 15)")
    assert c.origin["core.cores"] == "os: sysfs, 3.1"  # read from the OS: the first run's
    assert "3.2 GHz under load" in c.spec.description
    assert c.notes[0].startswith("3 runs of `aotune hw calibrate`")
    assert c.notes[1:4] == (
        "Run 1: Calibrated at 3.1.",
        "Run 2: Calibrated at 3.4.",
        "Run 3: Calibrated at 3.2.",
    )
    assert c.notes.count("Origins.") == 1
    path = tmp_path / "three.toml"
    cal.write_spec(c, str(path), force=False)
    assert load_spec_file(path) == c.spec  # and the file says where each median came from
    assert "the median of 3 runs' readings: 3.1, 3.4, 3.2" in path.read_text()


def test_an_even_count_keeps_the_lower_middle_and_assumed_readings_do_not_vote():
    runs = [
        run_reading(3.0, 14, 20.0, kind="assumed: from znver4"),
        run_reading(3.6, 18, 30.0),
        run_reading(3.2, 15, 10.0),
    ]
    c = cal.median_of_runs(runs)
    assert (c.spec.core.frequency_ghz, c.spec.caches[1].latency_cycles) == (3.2, 15)
    assert c.origin["core.call_cycles"] == (
        "measured: a probe reading 2 (the median of 2 of 3 runs' readings: 30, 10)"
    )
    only_assumed = [run_reading(3.0, 14, 20.0, kind="assumed: x") for _ in range(2)]
    assert cal.median_of_runs(only_assumed).origin["core.frequency_ghz"] == "assumed: x reading 0"
    with pytest.raises(CalibrationError, match="no calibration runs"):
        cal.median_of_runs([])


def test_a_median_one_run_could_move_more_than_twice_is_warned_of(tmp_path):
    """A Zen 3 slice once read 66, 24 and 26 (here: call cycles): the median is kept, and the
    warning names the field and every reading; one outlier among five, or runs within 2x of each
    other, say nothing."""
    runs = [run_reading(3.1, 16, 66.0), run_reading(3.2, 15, 24.0), run_reading(3.2, 15, 26.0)]
    c = cal.named(cal.median_of_runs(runs), "spread")
    assert c.spec.core.call_cycles == 26.0
    (said,) = [w for w in c.warnings if w.startswith("core.call_cycles:")]
    assert "the runs read 66, 24, 26, and one run more or less would move the median" in said
    assert "calibrate again" in said
    assert len(c.warnings) == 1  # clock and L2 agreed
    path = tmp_path / "spread.toml"
    cal.write_spec(c, str(path), force=False)
    assert "core.call_cycles: the runs read 66, 24, 26" in path.read_text()
    calm = [run_reading(3.1, 16, 20.0), run_reading(3.2, 15, 39.0), run_reading(3.2, 15, 30.0)]
    assert cal.median_of_runs(calm).warnings == ()
    # today's five runs: one outlier each, the median settled
    assert cal.spread_warning("core.call_cycles", [12.4, 15.7, 16.2, 24.3, 54.7]) == []
    assert cal.spread_warning("core.issue_width", [2, 5, 5, 5, 5]) == []
    assert cal.spread_warning("core.scheduler_entries", [42, 20, 62])  # 20..62 around 42
    assert cal.spread_warning("x", [10.0, 25.0])  # two runs: either may be the neighbour's
    assert cal.spread_warning("memory.page_walk_cycles", [0.0, 13.1, 14.0]) == []  # 0 is a reading
    assert cal.spread_warning("memory.l2_prefetch_fills_l1", [True, False]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.5, 6.0), st.integers(5, 40)), min_size=1, max_size=7))
def test_a_median_is_a_reading_with_half_the_runs_on_each_side(readings):
    runs = [run_reading(ghz, l2, 12.0) for ghz, l2 in readings]
    c = cal.median_of_runs(runs)
    for got, values in (
        (c.spec.core.frequency_ghz, [g for g, _ in readings]),
        (c.spec.caches[1].latency_cycles, [x for _, x in readings]),
    ):
        assert got in values
        assert 2 * sum(v <= got for v in values) >= len(values)
        assert 2 * sum(v >= got for v in values) >= len(values) - 1  # the lower middle of even


def test_the_cli_calibrates_as_often_as_asked_and_writes_the_medians(tmp_path, monkeypatch, capsys):
    made = iter(
        [run_reading(3.1, 16, 20.6), run_reading(3.4, 14, 15.4), run_reading(3.2, 15, 17.7)]
    )
    calls = []

    def fake(progress=None, *args):
        calls.append(progress)
        progress("clock", 1, 2)
        return next(made)

    monkeypatch.setattr(cal, "check_can_calibrate", lambda: (HOST, HOST))
    monkeypatch.setattr(cal, "calibrate", fake)
    path = tmp_path / "mine.toml"
    assert main(["hw", "calibrate", "--repeat", "3", "-o", str(path)]) == 0
    assert len(calls) == 3
    spec = load_spec_file(path)
    assert spec.name == "mine" and spec.core.frequency_ghz == 3.2
    capsys.readouterr()
    for bad in ("0", "10", "-1"):
        assert main(["hw", "calibrate", "--repeat", bad, "-o", str(tmp_path / "x.toml")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --repeat {bad}: give 1 to 9 runs") and err.count("\n") == 1
    assert len(calls) == 3 and not (tmp_path / "x.toml").exists()


def test_the_cli_refuses_bad_output_paths_and_names_before_measuring(tmp_path, capsys):
    existing = tmp_path / "mine.toml"
    existing.write_text("keep")
    for argv, message in (
        (["hw", "calibrate", "-o", str(existing)], "exists; pass --force"),
        (["hw", "calibrate", "-o", str(tmp_path)], "is a directory"),
        (["hw", "calibrate", "--name", "a b"], "--name"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert existing.read_text() == "keep"


def test_a_machine_that_cannot_be_calibrated_is_refused_in_one_line(monkeypatch, capsys):
    import aotune.hwspecs.host as host

    def no_host() -> None:
        raise HwSpecError("host CPU 'x' has neither AVX2+FMA nor AVX-512")

    monkeypatch.setattr(host, "detect_host", no_host)
    assert main(["hw", "calibrate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: hw calibrate measures the machine it runs on and cannot")
    assert err.count("\n") == 1


def test_the_cli_prints_a_calibrations_warnings_and_the_file_keeps_them(
    tmp_path, monkeypatch, capsys
):
    from aotune.machine_load import Sharing

    reading = Sharing(seconds=60.0, cpus=2, others_cpus=1.3, stolen_share=0.01)
    warned = dataclasses.replace(
        hand_made(), warnings=("other processes kept 1.3 of the 2 CPUs busy",), sharing=reading
    )
    warned = dataclasses.replace(warned, notes=(*warned.notes, "Warning: " + warned.warnings[0]))
    monkeypatch.setattr(cal, "check_can_calibrate", lambda: None)
    monkeypatch.setattr(cal, "calibrate", lambda progress=None: warned)
    path = tmp_path / "busy.toml"
    assert main(["hw", "calibrate", "-o", str(path)]) == 0
    err = capsys.readouterr().err
    assert "warning: other processes kept 1.3 of the 2 CPUs busy" in err
    assert "# Warning: other processes kept 1.3 of the 2 CPUs busy" in path.read_text()
    assert main(["hw", "calibrate", "--json"]) == 0
    out = capsys.readouterr()
    said = json.loads(out.out)
    assert said["warnings"] == ["other processes kept 1.3 of the 2 CPUs busy"]
    assert said["sharing"] == {"seconds": 60.0, "cpus": 2, "others_cpus": 1.3, "stolen_share": 0.01}
    assert "warning: other processes" in out.err


# ---- the arithmetic of the probes --------------------------------------------------------------


@pytest.mark.parametrize(
    "rates, pipes",
    [
        ({128: 2.0, 256: 1.96, 512: 0.99}, (2, 256)),  # Zen 4: 512-bit FMAs on 256-bit pipes
        ({128: 2.0, 256: 2.0, 512: 1.98}, (2, 512)),  # Skylake-SP with two 512-bit FMA units
        ({128: 2.0}, (2, 128)),  # NEON
        ({32: 2.0, 128: 2.0, 256: 1.95, 512: 1.0}, (2, 256)),  # loads, scalar included
        ({128: 4.0, 256: 2.0}, (4, 128)),
    ],
)
def test_pipe_fits_of_known_cores(rates, pipes):
    units, width, err = probes.fit_pipes(rates)
    assert (units, width) == pipes and err < 0.05


@settings(max_examples=60, deadline=None)
@given(
    units=st.integers(1, 8),
    width=st.sampled_from([64, 128, 256, 512, 1024]),
    widths=st.sets(st.sampled_from([32, 128, 256, 512]), min_size=1),
    noise=st.floats(-0.03, 0.03),
)
def test_pipe_fit_explains_the_rates_it_was_made_from(units, width, widths, noise):
    rates = {w: units * min(1.0, width / w) * (1 + noise) for w in widths}
    got_units, got_width, err = probes.fit_pipes(rates)
    assert err <= 0.04
    for w in widths:  # the fit predicts the same rate at every measured width
        assert got_units * min(1.0, got_width / w) == pytest.approx(units * min(1.0, width / w))


def test_the_l1_stream_cap_follows_the_load_rate_measured_at_its_width():
    # Golden Cove (Emerald Rapids slice, 2026-12-02): 3 loads a cycle up to 256 bits, 2 at 512;
    # the fit said 3 x 256 bits (96 B a cycle), and a 121.1 B/cycle stream was refused
    golden_cove = {32: 3.0, 128: 3.0, 256: 3.0, 512: 1.99}
    assert probes.fit_pipes(golden_cove)[:2] == (3, 256)
    cap = probes.stream_ceiling_bytes(golden_cove, 512, 3, 256)
    assert cap == pytest.approx(1.25 * 1.99 * 64) and cap > 121.1
    # unmeasured at that width, or read lower than the fitted ports take, the ports give it
    assert probes.stream_ceiling_bytes({}, 512, 2, 256) == pytest.approx(1.25 * 64)
    assert probes.stream_ceiling_bytes({512: math.nan}, 512, 2, 512) == pytest.approx(160.0)
    assert probes.stream_ceiling_bytes({512: 1.6}, 512, 2, 512) == pytest.approx(160.0)


def test_the_stream_cap_finds_the_load_rates_where_calibrate_files_them():
    """calibrate keeps a probe's readings under the probe's name once it settles (the rates
    were looked for under their own key, which by then is gone, and the cap fell back to the
    fitted ports)."""
    (load_probe,) = [p for p in cal.PROBES if p.run is probes.probe_loads]
    rates = {32: 3.0, 512: 1.99}
    while_running = {"loads": {"per_cycle": rates, "fit_error": 0.25}}
    filed = {load_probe.name: {"sets": [], "how": load_probe.how, **while_running}}
    assert probes.measured_load_rates(while_running) == rates
    assert probes.measured_load_rates(filed) == rates
    assert probes.measured_load_rates({}) == {}


def test_pipe_fit_refuses_non_rates():
    for bad in ({}, {128: 0.0}, {128: math.nan}, {128: -1.0}):
        with pytest.raises(CalibrationError):
            probes.fit_pipes(bad)


def test_a_reading_is_the_fastest_run_less_the_call_with_its_spread():
    t = probes.timing_from_runs([0.0040, 0.0041, 0.0050, 0.0042, 0.0100], overhead=0.0001)
    assert t.seconds == pytest.approx(0.0039)
    assert t.run_seconds == 0.0040 and t.runs == 5
    assert t.agree == pytest.approx(0.0042 / 0.0040 - 1)
    assert t.median == pytest.approx(0.0042 / 0.0040 - 1)
    assert "fastest of 5 runs of 4.0 ms" in t.describe()
    # an overhead larger than the run is never taken whole
    assert probes.timing_from_runs([1e-6], overhead=5e-6).seconds == 0.5e-6


def step_curve(entries: int, base: float, miss: float, counts: list[int]) -> dict[int, float]:
    return {n: base + (miss if n > entries else 0.0) for n in counts}


@settings(max_examples=50, deadline=None)
@given(
    entries=st.integers(8, 500),
    base=st.floats(3.0, 6.0),
    miss=st.floats(2.0, 40.0),
    spikes=st.lists(st.integers(0, 16), max_size=3),
)
def test_the_tlb_step_gives_entries_and_miss_cost_despite_slowed_readings(
    entries, base, miss, spikes
):
    counts = sorted({*probes.TLB_PAGE_COUNTS, entries, entries + 1})
    points = step_curve(entries, base, miss, counts)
    for i in spikes:  # noise only slows a reading: a slow one below the step is not trusted
        if counts[i] < entries:
            points[counts[i]] += 300.0
    got = probes.tlb_from_curve(points)
    assert got is not None
    found_entries, found_miss, found_base = got
    assert found_entries == entries
    assert found_base == pytest.approx(base)
    assert found_miss == pytest.approx(miss)


def test_a_tlb_that_holds_every_count_tried_gives_no_reading():
    assert probes.tlb_from_curve({n: 4.0 for n in (8, 16, 32, 64)}) is None
    assert probes.step_knee({8: 4.0, 16: 11.0, 32: 4.0}, 4.0, 1.0) is None


def test_prefetched_strides_are_the_run_from_the_smallest_up():
    random = {64: 14.0, 128: 14.0, 256: 15.0, 512: 28.0, 1024: 28.0, 2048: 31.0, 4096: 33.0}
    walk = {64: 4.3, 128: 4.4, 256: 4.5, 512: 8.3, 1024: 16.6, 2048: 10.0, 4096: 25.0}
    assert probes.followed_strides(walk, random, 4.0, 14.0) == 512  # 2048 alone does not count
    assert probes.followed_strides({64: 14.0}, {64: 14.0}, 4.0, 14.0) is None


def test_a_stride_is_followed_only_when_its_walk_is_nearer_an_l1_hit_than_an_l2_hit():
    # a Zen 3 slice's readings: the random order at wide strides pays page walks (43-70 cycles),
    # so half-way to it put the 4 KiB walk (26.5 cycles, beyond an L2 hit at 14.5) on the
    # followed side, and kernels with unpacked B rows 4 KiB apart ran 4-6x slower than predicted
    random = {64: 11.9, 128: 13.3, 256: 43.3, 512: 57.0, 1024: 57.8, 2048: 60.8, 4096: 69.8}
    walk = {64: 4.1, 128: 4.4, 256: 4.8, 512: 8.9, 1024: 16.5, 2048: 21.3, 4096: 26.5}
    assert probes.followed_strides(walk, random, 4.0, 14.5) == 512
    # the run of an hour before, whose 4 KiB walk read 40.1: the same answer
    walk_before = {**walk, 512: 8.7, 1024: 16.3, 2048: 24.6, 4096: 40.1}
    assert probes.followed_strides(walk_before, random, 4.0, 14.5) == 512


def test_far_prefetched_strides_are_the_run_from_the_smallest_up():
    """A Zen 3 slice's far walk: steps near an L2 hit up to 24 KiB, an L3 hit at 32 KiB; 48 KiB
    read fast again (lines in one or two L2 sets), which does not count: the run has ended."""
    walk = {4096: 25.6, 8192: 25.8, 12288: 25.7, 16384: 27.0, 24576: 26.3, 32768: 49.9}
    found = probes.far_followed_stride({**walk, 49152: 25.7}, 27.0, 57.0)
    assert found == (24576, pytest.approx(25.8))
    assert probes.far_followed_stride({4096: 45.0, 8192: 25.0}, 27.0, 57.0) is None
    # the half-way line: 42 of 27..57 is not followed
    assert probes.far_followed_stride({4096: 41.9, 8192: 42.0}, 27.0, 57.0) == (4096, 41.9)


@pytest.mark.parametrize(
    "l2_kib,last_mib,stlb", [(512, 32, 2048), (1024, 32, 3072), (256, 8, 1024), (2048, 4, 64)]
)
def test_the_far_walk_is_beyond_l2_within_the_last_level_and_the_tlb(l2_kib, last_mib, stlb):
    page = 4096
    lines, strides = probes.far_walk_shape(page, l2_kib * 1024, last_mib << 20, stlb)
    assert lines <= max(64, stlb // 2)
    if lines > 64:
        assert lines * page > l2_kib * 1024  # more lines than L2's sets keep at a page's stride
    assert strides == sorted(strides) and all(st % page == 0 for st in strides)
    assert all(st * 2 * lines <= last_mib << 20 for st in strides)
    assert strides  # every case above leaves strides to walk


def test_a_set_keeps_the_lines_its_sweep_still_hits():
    # a Zen 3 slice's readings, lines 4 KiB apart (one L1 set of 8 ways): LRU keeps 8, not 9
    zen3 = {4: 4.3, 5: 4.4, 6: 4.4, 7: 4.1, 8: 4.0, 9: 17.8}
    assert probes.lines_a_set_keeps(zen3, 4.0, 12.0) == 8
    # a slow reading below the knee ends the run there: a later fast one does not count
    assert probes.lines_a_set_keeps({4: 4.0, 5: 9.0, 6: 4.0, 7: 15.0}, 4.0, 14.0) == 4
    assert probes.lines_a_set_keeps({4: 13.0, 5: 14.0}, 4.0, 14.0) is None


def test_the_set_probe_turns_kept_lines_into_the_models_slack():
    # the model counts the lines a set keeps as slack x ways: Zen 3 keeps its 8 ways' worth
    hw = load_target("znver3")
    l1 = hw.cache(1)
    assert l1.conflict_slack * l1.associativity == 8
    assert "measured: a chase" in hw.origin_of("caches.L1.conflict_slack")


def test_the_lead_is_the_fewest_rows_that_reach_hit_speed():
    assert probes.lead_needed({0: 300.0, 1: 250.0, 2: 205.0, 4: 199.0}, reference=193.0) == 2
    assert probes.lead_needed({0: 195.0}, reference=193.0) == 0
    assert probes.lead_needed({0: 400.0, 8: 390.0}, reference=193.0) is None


def test_per_thread_cost_and_row_work():
    assert probes.per_thread_cost(7e-6, 10e-6, 2) == pytest.approx(3e-6)
    assert probes.per_thread_cost(7e-6, 6e-6, 4) == 0.0
    with pytest.raises(CalibrationError):
        probes.per_thread_cost(7e-6, 10e-6, 1)
    # 128 bytes per row at 3.7 GHz against 10 GB/s per core: >= 190 cycles of FMAs per row
    assert probes.row_fmas(128, 3.7, 10.0, 1.0) == 192
    assert probes.row_fmas(128, 3.7, 1000.0, 1.0) == 12
    assert probes.row_fmas(128, 3.7, 0.001, 1.0) == probes.ROW_FMAS[-1]


def test_call_cycles_and_chains_in_flight_from_synthetic_readings():
    # 1792 extra calls of 10 cycles at 3.5 GHz: 5.12 us more
    assert probes.cycles_per_extra_call(55.12e-6, 50e-6, 3.5, 1792) == pytest.approx(10.0)
    with pytest.raises(CalibrationError):
        probes.cycles_per_extra_call(1e-5, 1e-5, 3.5, 0)
    # 2048 calls of 64 dependent 4-cycle FMAs, 2 chains in flight: 2 cycles a step, plus 10 per
    # call and 8 us of overhead
    cyc = 2048 * (64 * 2.0 + 10.0)
    seconds = cyc / 3.5e9 + 8e-6
    assert probes.chains_in_flight(seconds, 8e-6, 3.5, 2048, 10.0, 64, 4) == pytest.approx(2.0)
    # no overlap: the chain's latency per step
    seconds = 2048 * (64 * 4.0 + 10.0) / 3.5e9 + 8e-6
    assert probes.chains_in_flight(seconds, 8e-6, 3.5, 2048, 10.0, 64, 4) == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(
    per_page=st.sampled_from([1, 2, 8, 32]),
    pages=st.integers(1, 80),
    window=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_chase_order_visits_every_point_once_a_window_of_pages_at_a_time(
    per_page, pages, window, seed
):
    order = probes.chase_order(per_page, pages, window, np.random.default_rng(seed))
    assert sorted(order.tolist()) == list(range(per_page * pages))
    per_window = min(window, pages) * per_page
    ids = [int(p) // per_window for p in order]
    runs = [w for i, w in enumerate(ids) if i == 0 or ids[i - 1] != w]
    assert len(runs) == len(set(runs))  # each window's points are visited together


def test_level_sizes_put_each_buffer_in_its_level():
    assert probes.geometric_sizes(4, 40) == [4, 8, 16, 32] and probes.geometric_sizes(8, 4) == []
    s = probes.Session.__new__(probes.Session)  # only the host is read
    s.host = load_target("znver4")
    assert probes.level_sizes(s, 1) == [16 << 10]
    assert probes.level_sizes(s, 2) == [512 << 10]
    assert probes.level_sizes(s, 3) == [4 << 20, 8 << 20, 16 << 20]


# ---- the microbenchmark kernels ----------------------------------------------------------------


@ON_HOST
def test_the_kernels_run_what_they_say():
    mix = Mix(adds=4, fmas=(HOST.isa.vector_bits, 32), loads=2, stores=1, mem_bits=32, unroll=8)
    chase, stream, rows = Chase(16), Stream(HOST.isa.vector_bits, 8), Rows(128, 30)
    bench = MicroBench([mix, chase, stream, rows], HOST)
    # machine code: the loop holds the step's instructions 8 times, plus its own control
    assert 8 * 9 <= bench.loop_instructions(mix) <= 8 * 9 + 4
    assert 16 <= bench.loop_instructions(chase) <= 16 + 4
    # the chains' results: integer chains count, FMA chains follow acc = a * b + acc
    scratch = np.zeros((SCRATCH_BYTES + 8 * OUT_BYTES) // 4, np.float32)
    params = np.array([0.5, 0.25, 1.0, 0.0], np.float32)
    out = scratch.ctypes.data + SCRATCH_BYTES
    bench.call(mix, 3, params.ctypes.data, scratch.ctypes.data, out)
    acc = np.float32(1.0)
    for _ in range(24):
        acc = np.float32(np.float32(0.5) * np.float32(0.25) + acc)
    results = scratch[SCRATCH_BYTES // 4 :].reshape(8, OUT_BYTES // 4)
    assert results[0, : HOST.isa.vector_bits // 32] == pytest.approx(acc)
    assert results[1, 0] == pytest.approx(acc)
    ints = results[2:6].view(np.int64)[:, 0]
    assert ints.tolist() == [3 + k + 24 for k in range(4)]
    # the chase follows its links
    links = np.zeros(64, np.uint64)
    base = links.ctypes.data
    order = [0, 5, 9, 2, 63, 17, 30, 8]
    for here, there in zip(order, order[1:] + order[:1]):
        links[here] = base + 8 * there
    landing = np.zeros(1, np.uint64)
    bench.call(chase, 3, base + 0, landing.ctypes.data)  # 48 links: 6 times round the cycle
    assert int(landing[0]) == base + 8 * order[48 % len(order)]
    # the stream and the row walk run over their buffers
    raw = np.ones(4096 + 16, np.float32)
    buf = raw[(-raw.ctypes.data % 64) // 4 :][:4096]  # vector loads need their own alignment
    bench.call(stream, 2, buf.ctypes.data, buf.nbytes)
    acc_out = np.zeros(32 * OUT_BYTES // 4, np.float32)
    rows_params = np.array([0.5, 0.25], np.float32)
    bench.call(rows, 1, buf.ctypes.data, 256, 2, 8, 2, rows_params.ctypes.data, acc_out.ctypes.data)
    assert np.isfinite(acc_out).all() and acc_out[0] != 0


@ON_HOST
@pytest.mark.parametrize("chains", [1, 3])
def test_chains_side_by_side_each_follow_their_links_and_go_on_from_there(chains):
    """Chains whose current links are in ``heads``, 4 links each per iteration: each lands where
    its own cycle says, and a second call goes on from there (as ``Session.chases`` runs them)."""
    chase = Chase(4, chains, heads=True)
    bench = MicroBench([chase], HOST)
    links = np.zeros(64, np.uint64)
    base = links.ctypes.data
    cycles = [[2, 63, 17, 30, 8], [0, 5, 9], [11, 40]][:chains]
    for cycle in cycles:
        for here, there in zip(cycle, cycle[1:] + cycle[:1]):
            links[here] = base + 8 * there
    heads = np.array([base + 8 * c[0] for c in cycles], np.uint64)
    for calls in (1, 2):
        bench.call(chase, 2, heads.ctypes.data, heads.ctypes.data)  # 8 links on each chain
        steps = 8 * calls
        assert heads.tolist() == [base + 8 * c[steps % len(c)] for c in cycles]


@ON_HOST
def test_the_latency_chase_goes_on_from_where_its_last_run_stopped(monkeypatch):
    """A timed run walks far fewer links than a buffer beyond the last cache holds, so runs that
    each started over would read the lines the last one left in that cache: each run of the
    latency probe's chase starts at the link the run before it stopped at."""
    host, base = cal.check_can_calibrate()
    s = probes.Session(host, base, probes.QUICK)
    starts: list[int] = []
    ends: list[int] = []
    follow = s.chases

    def chases(heads: int, chains: int, steps: int) -> None:
        word = np.ctypeslib.as_array(ctypes.cast(heads, ctypes.POINTER(ctypes.c_uint64)), (1,))
        starts.append(int(word[0]))
        follow(heads, chains, steps)
        ends.append(int(word[0]))

    def three_runs(run, ops_per_unit):
        for _ in range(3):
            run(2)
        return 1.0, None

    monkeypatch.setattr(s, "chases", chases)
    monkeypatch.setattr(s, "cycles_per", three_runs)
    try:
        probes._chase_cycles(s, 1 << 20, 128, 16)
    finally:
        s.close()
    assert len(starts) == 3 and len(set(starts)) == 3  # no run starts over
    assert starts[1:] == ends[:-1]


def test_misses_in_flight_is_one_chains_latency_over_the_fewest_cycles_per_access():
    readings = {1: 500.0, 2: 251.0, 4: 126.0, 8: 64.0, 16: 33.0, 24: 25.0, 32: 26.5}
    assert probes.misses_in_flight(readings) == pytest.approx(20.0)
    # a core that overlaps nothing
    assert probes.misses_in_flight({1: 300.0, 2: 300.0, 4: 310.0}) == pytest.approx(1.0)


@ON_HOST
def test_the_memory_parallelism_probe_assumes_rather_than_take_memory_it_cannot_spare(
    monkeypatch,
):
    import aotune.hwspecs.host as host_module

    host, base = cal.check_can_calibrate()
    monkeypatch.setattr(host_module, "available_memory_bytes", lambda: 4096)
    s = probes.Session(host, base, probes.QUICK)
    try:
        found = probes.probe_memory_parallelism(s)
    finally:
        s.close()
    for path in ("memory.latency_cycles", "memory.misses_in_flight"):
        origin = found[path].origin
        assert origin.startswith("assumed:") and "cannot be spared" in origin
        assert found[path].value == probes.value_at(base, path)


@pytest.mark.parametrize("target", ["neoverse-n1", "haswell", "skylake-avx512"])
def test_the_kernels_compile_for_every_cpu_target_with_the_loops_they_say(target):
    """Built for another ISA (not run): the probes' loops hold exactly their step's work."""
    hw = load_target(target)
    v = hw.isa.vector_bits
    mix = Mix(adds=3, fmas=(v,) * 4 + (32,), loads=2, mem_bits=v, unroll=4)
    chains = Chase(4, max(probes.PARALLEL_CHAINS), heads=True)
    kernels = [mix, Chase(16), Stream(v, 8), Rows(v, 30), Mix(stores=8, mem_bits=32, unroll=2)]
    asm = assembly_for([*kernels, chains], hw)
    # every chain's load is issued, past the integer registers too (the rest spill)
    assert 4 * 32 <= loop_instructions(asm, chains.name)
    assert 4 * 10 <= loop_instructions(asm, mix.name) <= 4 * 10 + 4
    assert 16 <= loop_instructions(asm, "chase_u16") <= 16 + 4
    assert 8 <= loop_instructions(asm, f"stream_{v}_u8") <= 8 + 4
    # the clock's chains add a register, never an immediate: Golden Cove's renamer folds chains
    # of `add reg, imm` (the clock probe read 14 GHz on a Sapphire Rapids slice)
    body = asm[asm.index(f"{mix.name}:") : asm.index(".Lfunc_end", asm.index(f"{mix.name}:"))]
    adds = [ln.split() for ln in body.splitlines() if ln.split()[:1] in (["add"], ["addq"])]
    by_register = [a for a in adds if not any(m in " ".join(a) for m in "$#")]
    assert len(by_register) >= 3 * 4


@pytest.mark.parametrize(
    "target, masked",
    [("haswell", "vmaskmovps"), ("znver3", "vmaskmovps"), ("znver4", "{%k"), ("neoverse-n1", "")],
)
def test_the_masked_store_probe_issues_the_isas_masked_store(target, masked):
    """AVX2 has ``vmaskmovps``, AVX-512 masks a plain ``vmovups`` with a k register, and NEON
    has none: there LLVM tests each lane and stores it alone (about 4 stores per vector)."""
    hw = load_target(target)
    mix = Mix(masked_stores=8, mem_bits=hw.isa.vector_bits, unroll=2)
    asm = assembly_for([mix], hw)
    body = asm[asm.index(f"{mix.name}:") : asm.index(".Lfunc_end", asm.index(f"{mix.name}:"))]
    if masked:
        assert body.count(masked) == 16  # the mask is not a constant: none became plain
    else:
        lanes = hw.isa.vector_bits // 32
        stores = [ln for ln in body.splitlines() if ln.split()[:1] in (["str"], ["st1"])]
        assert len(stores) >= 16 * (lanes - 1)  # the mask keeps every lane but the last


@pytest.mark.parametrize("target", builtin_names("cpu"))
def test_the_call_probes_time_what_they_say_on_every_cpu_target(target):
    """The call probes' kernels exist in every CPU target's space and keep their C tiles in L1 and
    A in L2; on at least one tile per target the model charges nothing for the C tile's loads and
    stores (so the time per extra call is the call's own), and only such tiles are timed."""
    from aotune.analysis import model

    hw = load_target(target)
    l2 = hw.cache(2).size_kib * 1024 // hw.cache(2).shared_by_cores
    tiles = [(r, v, kc) for r, v in probes.CALL_PROBE_TILES for kc in (8, probes.CALL_PROBE_K)]
    free = []
    for rows, vectors, kc in [*tiles, (1, 1, probes.CALL_PROBE_K)]:
        s = probes.call_probe_schedule(hw, rows, vectors, kc)
        assert s is not None, (target, rows, vectors, kc)
        assert (s.mr, s.nr, s.kc, s.order) == (rows, vectors * s.lanes, kc, "mkn")
        assert s.mc == s.mr and s.nc == s.nr == s.N and s.M % s.mr == 0
        assert not s.pack_a and not s.pack_b and s.threads == 1
        assert s.M * s.K * 4 <= l2 // 2
        assert model._c_stays_in_l1(s, hw, s.M, s.N)
        if rows > 1 and model.c_tile_port_cycles(s, hw) == 0.0:
            free.append((rows, vectors, kc))
    assert any(kc == 8 for _, _, kc in free), target


def test_a_load_bound_probe_tile_is_left_out_of_the_call_cycles():
    # on a core of 2 load ports and issue 5 (Zen 3), an 8 x one-vector tile's 8 broadcasts and 1
    # load per 8 FMAs bind the ports: its C tile's loads would be timed with the call
    from aotune.analysis import model

    zen3 = load_target("znver3")
    short = probes.call_probe_schedule(zen3, 8, 1, 8)
    assert model.c_tile_port_cycles(short, zen3) > 0
    assert model.c_tile_port_cycles(probes.call_probe_schedule(zen3, 6, 2, 8), zen3) == 0
    # at issue 3 the same tile (21 instructions a k step, the prefetch of B's row ahead among
    # them, as its machine code has) is issue-bound and leaves the ports idle cycles
    three = with_value(zen3, "core.issue_width", 3)
    assert model.c_tile_port_cycles(short, three) == 0


def test_the_set_refill_reading_is_the_swept_rows_cost_where_it_stands_out():
    """A sweep over more rows of one set than it keeps, slower than over rows it keeps by more
    than ``SET_REFILL_SLACK``, gives its cost per row; one that keeps pace says the refills are
    at most the in-L1 step apart, and gives that."""
    from aotune.hwspecs.probes import SET_REFILL_SLACK, set_refill_reading

    assert set_refill_reading(4.0, 9.77) == (9.77, True)
    assert set_refill_reading(4.0, 4.0 * SET_REFILL_SLACK) == (4.0, False)
    assert set_refill_reading(4.0, 3.5) == (4.0, False)


def test_the_alias_wait_per_pair_from_synthetic_readings():
    # 4608 calls at 250 cycles against 4680 at 200, 56 pairs per call: 50 / 56 cycles a pair
    aliased, clear = 4608 * 250 / 3.5e9, 4680 * 200 / 3.5e9
    wait = probes.alias_wait_cycles(aliased, clear, 3.5, (4608, 4680), 56.0)
    assert wait == pytest.approx(50 / 56)
    assert probes.alias_wait_cycles(clear, aliased, 3.5, (4680, 4608), 56.0) == 0.0
    with pytest.raises(CalibrationError):
        probes.alias_wait_cycles(aliased, clear, 3.5, (4608, 4680), 0.0)


@pytest.mark.parametrize("target", builtin_names("cpu"))
def test_the_alias_probe_steps_down_rows_a_page_apart_and_not(target):
    """Both kernels of the alias probe exist in every CPU target's space; each call steps down
    C's rows and adds C, and the model counts 8 x 8 aliasing pairs at the page stride and none a
    vector further."""
    from aotune.analysis import model

    hw = load_target(target)
    page, lanes = hw.memory.page_bytes, hw.isa.vector_bits // 32
    aliased, clear = (probes.alias_probe_schedule(hw, n) for n in (page // 4, page // 4 + lanes))
    for s in (aliased, clear):
        assert s is not None, target
        assert (s.mr, s.nr, s.kc, s.order, s.par) == (8, lanes, 24, "nmk", "n")
        assert s.threads == hw.core.cores
        assert s.mc == s.M == 72 and s.K == 24 * 32 and s.pack_b and not s.pack_a
        assert model._calls_step_down_rows(s)
    assert model.aliasing_row_pairs(8, 8, aliased.c_sm * 4, page) == 64
    assert model.aliasing_row_pairs(8, 8, clear.c_sm * 4, page) == 0
    kt = probes.ALIAS_PROBE_BLOCKS
    charged = model._store_alias_cycles(aliased, hw, 8)
    assert charged == pytest.approx(64 * hw.core.store_alias_cycles * (kt - 1) / kt)


def test_the_shared_line_wait_from_synthetic_readings():
    # a model that charges 5 cycles a call besides 14 lines at the price: 285 measured is 20
    def model(price):
        return 5.0 + 14.0 * price

    assert probes.shared_line_cycles(285.0, model) == pytest.approx(20.0)
    assert probes.shared_line_cycles(3.0, model) == 0.0  # under the model's other charges: none
    with pytest.raises(CalibrationError):
        probes.shared_line_cycles(285.0, lambda price: 5.0)


def test_the_model_s_extra_for_the_probe_kernels_is_the_shared_lines_at_the_price():
    """On the 2-core Zen 4 slice the model prices the two kernels apart by the shared lines
    alone: 15 a call (8 rows, 2 lines a row, 15 of 16 rows split mid-line) at the price, and
    half a line a call whose pair is shared (on the 16th row): at the price too on the visits
    that would find it in L2, at the pair's price on the first, from beyond L2."""
    from aotune.analysis import model

    hw = with_value(load_target("znver4"), "memory.shared_pair_store_cycles", 10.0)
    shared, clear = probes.shared_probe_schedules(hw)
    extra = probes.shared_kernels_model_extra(hw, shared, clear)
    share = model.ThreadShare.of(shared)
    lines = model.shared_line_share(shared, hw, share) * shared.mr * 2
    beyond, from_l2 = (x * shared.mr * 2 for x in model.shared_pair_shares(shared, hw, share))
    assert lines == pytest.approx(15.0)
    assert (beyond, from_l2) == pytest.approx((0.5 / 96, 0.5 * 95 / 96))
    assert extra(2.0) - extra(1.0) == pytest.approx(lines + from_l2)
    assert extra(1.0) == pytest.approx(lines + from_l2 + 10.0 * beyond)  # nothing else differs
    wait = 27.5 * (lines + from_l2) + 10.0 * beyond
    assert probes.shared_line_cycles(wait, extra) == pytest.approx(27.5)


@pytest.mark.parametrize("target", builtin_names("cpu"))
def test_the_shared_line_probe_splits_rows_mid_line_and_on_line_pairs(target):
    """Both kernels of the shared-line probe exist in every CPU target's space: one tile per
    thread, as many vectors each, down the same rows (the model's lockstep case); one column
    fewer puts every row's split mid-line, the full width on line-pair boundaries, and the
    model charges only the first for shared lines, at the spec's price."""
    from aotune.analysis import model

    hw = load_target(target)
    kernels = probes.shared_probe_schedules(hw)
    assert kernels is not None, target
    shared, clear = kernels
    line = hw.cache(1).line_bytes
    for s in (shared, clear):
        share = model.ThreadShare.of(s)
        assert s.par == "n" and s.threads == hw.core.cores >= 2 and share.n_tiles == 1
        assert (s.nr * 4) % (2 * line) == 0 and s.nr % s.lanes == 0
        assert s.kc == probes.SHARED_PROBE_KC and s.pack_b and not s.pack_a
        assert model._threads_store_shared_lines_at_once(s, share)
    assert (shared.M, shared.N + 1, shared.K) == (clear.M, clear.N, clear.K)
    assert model.ThreadShare.of(shared).calls == model.ThreadShare.of(clear).calls
    full = model.ThreadShare.of(shared)
    assert model.shared_line_share(shared, hw, full) > 0.9
    assert model.shared_line_share(clear, hw, model.ThreadShare.of(clear)) == 0.0


def test_the_shared_line_price_is_the_specs_where_measured():
    """A measured ``memory.shared_line_store_cycles`` sets what a shared line's store costs; the
    kernel whose rows split mid-line is priced higher by the lines it shares, the other not."""
    from aotune.analysis.features import kernel_features
    from aotune.analysis.model import (
        AnalyticalCpuModel,
        ThreadShare,
        shared_line_share,
        shared_pair_shares,
    )
    from aotune.codegen.compile import compile_kernel

    hw = load_target("znver4")
    shared, clear = probes.shared_probe_schedules(hw)
    feats = [kernel_features(compile_kernel(s, hw), hw.isa.arch).loop for s in (shared, clear)]
    low, high = (with_value(hw, "memory.shared_line_store_cycles", v) for v in (10.0, 30.0))
    t_low, t_high = (
        [p.seconds for p in AnalyticalCpuModel(h).predict_batch([shared, clear], feats)]
        for h in (low, high)
    )
    assert t_low[1] == t_high[1]  # no shared line: no change
    share = ThreadShare.of(shared)
    line = hw.cache(1).line_bytes
    # the lines both write, and those whose pair is shared met again where L2 would hold them
    lines = shared_line_share(shared, hw, share) + shared_pair_shares(shared, hw, share)[1]
    lines *= shared.mr * -(-shared.nr * 4 // line)
    calls = share.calls  # the lockstep wait adds in full to each call
    extra = (t_high[0] - t_low[0]) * hw.core.frequency_ghz * 1e9
    assert extra == pytest.approx(20.0 * lines * calls, rel=0.01)


def _queue(pace: float) -> float:
    """A synthetic difference per call: 12 cycles of floor, a queue of 8 lines at the pace that
    the calls' issue hides up to 40 cycles."""
    return 12.0 + max(0.0, 8 * pace - 40.0)


def test_pace_matching_takes_the_largest_pace_whose_prediction_stays_within_the_reading():
    """The dirty-refill probe's inversion: a queue the calls' issue hides up to 40 cycles, then 8
    lines at the pace each: 64 cycles measured is a pace of 13; a reading the issue hides gives
    the edge of what it hides (a bound); below the floor, the lowest pace; beyond, the highest."""

    assert probes.pace_matching(_queue, 12.0 + 64.0, 0.5, 1000.0) == pytest.approx(13.0)
    assert probes.pace_matching(_queue, 12.0, 0.5, 1000.0) == pytest.approx(5.0)
    assert probes.pace_matching(_queue, 3.0, 0.5, 1000.0) == 0.5
    assert probes.pace_matching(_queue, 1e9, 0.5, 1000.0) == 1000.0


def test_a_dirty_pace_reading_matches_bounds_or_says_why_not():
    """A reading above the floor the calls' issue leaves is matched; one within it (or below) is
    a bound, at most the fallback the model charges unmeasured; a model that prices the kernels
    alike at every pace, or a reading beyond the highest pace, gives no pace."""

    read, queue = probes.dirty_pace_reading, _queue
    got = read(queue, 12.0 + 64.0, 0.5, 1000.0, 32.0)
    assert got.kind == "matched" and got.pace == pytest.approx(13.0)
    for measured in (12.2, 3.0):
        got = read(queue, measured, 0.5, 1000.0, 32.0)
        assert got.kind == "bound" and got.pace == pytest.approx(5.0 + 0.5 / 8)
    assert read(queue, 3.0, 0.5, 1000.0, 4.0) == probes.PaceReading("bound", 4.0)
    assert read(lambda pace: 59.8, 70.0, 0.5, 1000.0, 32.0) == probes.PaceReading(
        "insensitive", None
    )
    assert read(queue, 1e9, 0.5, 1000.0, 32.0) == probes.PaceReading("beyond", None)


def test_the_difference_per_call_from_synthetic_readings():
    # runs of 20 kernel calls; each kernel call 1 us of overhead, then 4608 calls at 250 cycles
    # against 4680 at 200 (3.5 GHz): 50 cycles more per call
    runs = [20 * (1e-6 + 4608 * 250 / 3.5e9), 20 * (1e-6 + 4680 * 200 / 3.5e9)]
    got = probes.per_call_difference_cycles(runs, 20, 1e-6, (4608, 4680), 3.5)
    assert got == pytest.approx(50.0)
    assert probes.per_call_difference_cycles(runs[::-1], 20, 1e-6, (4680, 4608), 3.5) < 0
    with pytest.raises(CalibrationError):
        probes.per_call_difference_cycles(runs, 20, 1e-6, (4608, 0), 3.5)


@pytest.mark.parametrize("target", builtin_names("cpu"))
def test_the_dirty_probe_reads_a_pace_only_where_the_model_prices_one(target):
    """Where the probe's crowded kernel is never in the window beside the next call (Neoverse
    N1's 128-entry window), the model's difference does not move with the pace, and the probe
    must not read one; where it is, the difference grows with the pace."""
    from aotune.analysis.model import AnalyticalCpuModel, ThreadShare

    hw = load_target(target)
    page, lanes = hw.memory.page_bytes, hw.isa.vector_bits // 32
    scheds = [probes.dirty_probe_schedule(hw, n) for n in (page // 4, page // 4 + lanes)]
    calls = [ThreadShare.of(s).calls for s in scheds]
    overhead = hw.overhead.call_seconds

    def predicted(pace: float) -> float:
        priced = AnalyticalCpuModel(
            with_value(hw, "memory.dirty_set_refill_cycles", pace)
        ).estimate_batch(scheds)
        return probes.per_call_difference_cycles(
            [p.seconds for p in priced], 1, overhead, calls, hw.core.frequency_ghz
        )

    reading = probes.dirty_pace_reading(predicted, predicted(20.0), 0.5, 1000.0, 32.0)
    if target == "neoverse-n1":
        assert reading.kind == "insensitive"
    else:
        assert predicted(1000.0) > predicted(0.5) and reading.kind in ("matched", "bound")


@pytest.mark.parametrize("target", builtin_names("cpu"))
def test_the_dirty_probe_crowds_one_set_with_c_rows_a_page_apart_and_not(target):
    """Both kernels of the dirty-refill probe exist in every CPU target's space: 8-row one-vector
    tiles, packed, one thread, stepping down C's rows; the model queues the crowded kernel's
    fills in one set, at the pace it is given, the other's over many."""
    from aotune.analysis import model

    hw = load_target(target)
    page, lanes = hw.memory.page_bytes, hw.isa.vector_bits // 32
    crowded, clear = (probes.dirty_probe_schedule(hw, n) for n in (page // 4, page // 4 + lanes))
    for s in (crowded, clear):
        assert s is not None, target
        assert (s.mr, s.nr, s.kc, s.order, s.threads) == (8, lanes, 8, "nmk", 1)
        assert s.mc == s.M == 8 * probes.DIRTY_PROBE_TILES and s.pack_a and s.pack_b
        assert s.K == 8 * probes.DIRTY_PROBE_BLOCKS and model._calls_step_down_rows(s)
    share = model.ThreadShare.of(crowded)
    paced = [with_value(hw, "memory.dirty_set_refill_cycles", x) for x in (10.0, 20.0)]
    waits = [model._c_sweep_set_cycles(crowded, h, 8, lanes, share) for h in paced]
    assert waits[1] == pytest.approx(2 * waits[0]) and waits[0] > 0
    spread = model._c_sweep_set_cycles(clear, paced[1], 8, lanes, model.ThreadShare.of(clear))
    assert spread <= waits[1] / 8  # the rows spread over the sets, each taking its own fills


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 32),
    mr=st.integers(1, 32),
    stride=st.integers(1, 4096).map(lambda x: 4 * x),
)
def test_aliasing_row_pairs_counts_what_a_brute_force_counts(rows, mr, stride):
    from aotune.analysis.model import aliasing_row_pairs

    brute = sum(((mr + i - j) * stride) % 4096 == 0 for i in range(rows) for j in range(mr))
    assert aliasing_row_pairs(rows, mr, stride, 4096) == brute


def test_c_tile_loads_and_stores_cost_only_beyond_the_ports_idle_cycles():
    from aotune.analysis.model import _c_tile_port_cycles

    # 8 FMA cycles per k step, 5 of them load-port cycles: 8 loads and 8 stores hide in 8 steps
    assert _c_tile_port_cycles(8, 8, 8.0, 5.0, 0.0, 1.0, 1) == 0.0
    # 1 step of 2 cycles, both on the load ports: the tile's 4 loads and 4 stores show
    assert _c_tile_port_cycles(4, 1, 2.0, 2.0, 0.0, 1.0, 1) == 4.0 + 2.0
    # more work never costs less
    assert _c_tile_port_cycles(16, 8, 8.0, 5.0, 0.0, 1.0, 1) >= _c_tile_port_cycles(
        8, 8, 8.0, 5.0, 0.0, 1.0, 1
    )


@ON_HOST
def test_the_quickest_probes_read_physical_values_here():
    host, base = cal.check_can_calibrate()
    s = probes.Session(host, base, probes.QUICK)
    try:
        s.warm_up()
        clock = probes.probe_clock(s)["core.frequency_ghz"]
        assert 0.2 <= clock.value <= 7.0 and clock.origin.startswith("measured:")
        s.found["core.frequency_ghz"] = clock
        fma = probes.probe_fma(s)
        for path, (lo, hi) in {
            "core.fma_units": (1, 8),
            "core.fma_width_bits": (64, 1024),
            "core.fma_latency_cycles": (2, 16),
        }.items():
            assert lo <= fma[path].value <= hi
            assert fma[path].origin.startswith(("measured:", "assumed:"))
        masked = probes.probe_masked_stores(s)["core.masked_store_cycles"]
        assert 0.1 <= masked.value <= 1000 and masked.origin.startswith("measured:")
        fetched = probes.probe_prefetches(s)["core.prefetches_per_cycle"]
        assert 0.1 <= fetched.value <= 16 and fetched.origin.startswith("measured:")
        forward = probes.probe_store_forwarding(s)["core.store_forward_cycles"]
        assert forward.origin.startswith(("measured:", "assumed:"))
        assert 1.0 <= forward.value <= 40.0 and set(s.details["store_forwarding"]["chain_cycles"])
    finally:
        s.close()


@ON_HOST
def test_a_whole_calibration_writes_a_spec_that_tune_uses(tmp_path, capsys, monkeypatch):
    """The only end-to-end run of every probe (about 40 s on a 2-core slice); the machine is
    said to be shared, to see the warning reach the terminal and the file's header."""
    from aotune.machine_load import Sharing

    seen = []

    def busy(before, after):
        seen.append((before, after))
        return Sharing(seconds=40.0, cpus=2, others_cpus=1.1, stolen_share=0.0)

    monkeypatch.setattr(cal, "sharing", busy)
    path = tmp_path / "here.toml"
    assert main(["hw", "calibrate", "-o", str(path)]) == 0
    ((before, after),) = seen  # one reading before the probes, one after them
    assert before is None or after.wall - before.wall >= 5.0
    said = capsys.readouterr().err
    assert "warning: other processes kept 1.1 of the 2 CPUs busy while the probes ran" in said
    assert "# Warning: other processes kept 1.1 of the 2 CPUs busy" in path.read_text()
    spec = load_spec_file(path)
    assert spec.name == "here" and spec.core.cores == HOST.core.cores
    assert 0.2 <= spec.core.frequency_ghz <= 7.0
    assert spec.cache(1).latency_cycles < spec.cache(2).latency_cycles
    assert spec.origin_of("memory.misses_in_flight").startswith("measured:")
    assert spec.memory.latency_cycles > 1.5 * spec.caches[-1].latency_cycles
    assert spec.origin_of("memory.page_walk_cycles").startswith("measured:")
    assert spec.memory.stlb_entries >= spec.memory.dtlb_entries
    assert spec.origin_of("memory.far_prefetch_stride_bytes").startswith("measured:")
    # rows of eight lines one L1 way apart: a cost a line, or 0 where the refills hid
    assert spec.origin_of("memory.swept_line_refill_cycles").startswith("measured:")
    assert spec.origin_of("memory.swept_line_refill_overlap").startswith("measured:")
    assert 0.0 <= spec.memory.swept_line_refill_overlap <= 1.0
    assert set(origin_from_toml(path.read_text())) == set(field_paths(spec))
    capsys.readouterr()
    argv = ["tune", "matmul", "--shape", "64x48x32", "--target", str(path), "--json"]
    assert main(argv) == 0
    assert '"name": "here"' in capsys.readouterr().out


def test_the_call_probe_times_only_the_tiles_whose_ports_stay_free(monkeypatch):
    """On Zen 3's core the call probe leaves the load-bound 8 x 8 tile out, says so, and takes the
    6 x 16 tile's cycles per extra call (fake timings: 10 cycles per extra call, 100 for 8 x 8)."""
    s = probes.Session.__new__(probes.Session)
    s.host, s.base = load_target("znver3"), load_target("haswell")
    s.found = {"core.frequency_ghz": probes.Finding(2.0, "measured: the clock")}
    s.details = {}

    def fake(session, sched, calls_per_run=20):
        extra = (sched.M // sched.mr) * (probes.CALL_PROBE_K // 8 - 1)
        per_call = 100.0 if sched.nr == sched.lanes else 10.0
        base = 1e-3
        seconds = base + (extra * per_call / 2e9 if sched.kc == 8 else 0.0)
        return seconds, probes.Timing(seconds, 11, 4e-3, 0.001, 0.02)

    monkeypatch.setattr(probes, "_kernel_call_seconds", fake)
    found = probes.probe_call_cycles(s)["core.call_cycles"]
    assert found.value == pytest.approx(10.0)
    assert "8 x 8 left out" in found.origin and "6 x 16 tiles 10.0" in found.origin


def test_a_last_level_that_reads_like_memory_is_not_taken_as_its_latency():
    """This slice's calibration once read L3 at 451 cycles in L3's sizes (memory: 330-535): the
    spec then priced every L2 miss at memory's latency, and the bench's accuracy collapsed
    (1024^3 Spearman 0.94 -> 0.69 on the same measurements). Such a reading is no step to
    memory; a real L3 (55 against 400) is."""
    from aotune.hwspecs.probes import steps_to_memory

    assert steps_to_memory(55.0, 400.0)
    assert not steps_to_memory(451.0, 460.0)
    assert not steps_to_memory(300.0, 400.0)


@ON_HOST
def test_the_clock_read_beside_timings_is_the_clock_probes_reading():
    """``clock_now_ghz`` (the bench's reading beside its timings) reads what ``probe_clock``
    reads, within what a shared machine's clock moves between two readings."""
    host, base = cal.check_can_calibrate()
    s = probes.Session(host, base, probes.QUICK)
    probed = probes.probe_clock(s)["core.frequency_ghz"].value
    now = probes.clock_now_ghz(HOST)
    assert 0.2 < now < 7.0
    assert abs(now / probed - 1) < 0.25
