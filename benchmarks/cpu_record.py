"""CPU bench samples kept in the repository, re-predicted by today's model on any machine.

    python -m aotune.benchmarks.cpu_record rescore FILE.json.gz [FILE ...] --target znver5 \
        [--each] [--json]
    python -m aotune.benchmarks.cpu_record ablate FILE.json.gz [FILE ...] --target my-cpu.toml \
        --base znver4 [--json]

``aotune bench --json`` keeps, per accuracy row, every sampled config with the time it ran in
and what the model of the day predicted. The records in ``benchmarks/data/cpu/`` are such
documents from CPUs a later session may not have (the first: a Zen 5 slice, 2026-11-30: seven
timings of the same matmul samples, a-g, stops 69-72, the operator and unseen rows).
``rescore`` compiles each sampled config for ``--target`` (the spec of the CPU that timed it: its
own code and tier-2 features, none of the machine's), predicts it with today's model and scores
the predictions against the kept times, beside the scores the record was made with. Nothing is
timed. Given several timings of the same samples (a day's ``-b``, ``-c`` ...), it scores against
each config's median time (``median_record``): one timing's placement of the vCPUs, or a
neighbour's burst, then moves a score less; ``--each`` also scores each timing apart, beside the
core-to-core hand-over, clock and FMAs a cycle read while it ran. ``ablate`` answers which of the
values in which two specs of one CPU differ (a calibration against the built-in spec) moves which
row's scores: it predicts the samples with each such field set back alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aotune.analysis.features import kernel_features
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import Workload, matmul
from aotune.benchmarks.suite import OPERATORS_FULL, OPERATORS_QUICK, UNSEEN, accuracy_scores
from aotune.cli import Parser, report_error
from aotune.codegen.compile import compile_kernel
from aotune.codegen.schedule import CpuSchedule, schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import AotuneError, MeasurementFileError
from aotune.files import file_identity, read_user_file
from aotune.hwspecs.spec import HwSpec, load_target
from aotune.hwspecs.spec_toml import differing_paths, value_at, with_value

RECORDS_DIR = Path(__file__).resolve().parent / "data" / "cpu"
RECORD_LIMIT_BYTES = 64 << 20
Log = Callable[[str], None]
_MATMUL_ROW = re.compile(r"matmul (\d+)x(\d+)x(\d+)")


def row_workload(name: str) -> Workload | None:
    """The workload of a bench row, by the name the bench gave it (None for one it never runs)."""
    found = _MATMUL_ROW.fullmatch(name)
    if found:
        return matmul(*(int(x) for x in found.groups()))
    return dict(OPERATORS_FULL + OPERATORS_QUICK + UNSEEN).get(name)


def read_record(path: str | Path) -> dict[str, Any]:
    """A bench document (plain or gzipped JSON) with at least one row of kept samples."""
    raw = read_user_file(path, "bench record", MeasurementFileError, RECORD_LIMIT_BYTES)
    try:
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, EOFError, zlib.error, ValueError, RecursionError) as e:
        # ValueError: not JSON, not UTF-8, or a number of thousands of digits
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:120]
        if "integer string conversion" in why:
            why = "a number of thousands of digits"
        raise MeasurementFileError(
            f"bench record {path}: not JSON or gzipped JSON ({why}); give a file that "
            "`aotune bench --json` wrote"
        ) from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if isinstance(rows, list):
        for i, row in enumerate(rows):
            _check_row(row, i, path)
    if not isinstance(rows, list) or not any(_samples(r) for r in rows):
        raise MeasurementFileError(
            f"bench record {path}: no row with sampled configs (rows[].accuracy.samples); give "
            "a file that `aotune bench --json` wrote with its accuracy rows"
        )
    return doc


MIN_SAMPLES = 3  # fewer rank nothing


def _check_row(row: Any, i: int, path: str | Path) -> None:
    """A MeasurementFileError naming what is wrong where a row is not as the bench writes it: not
    an object, samples without a workload name, a sample without a config and two positive
    times, a config twice, too few samples to rank, or times that are all one."""
    fix = "give a file that `aotune bench --json` wrote"
    if not isinstance(row, dict):
        raise MeasurementFileError(
            f"bench record {path}: rows[{i}] is {json.dumps(row)[:40]}, not a row object; {fix}"
        )
    acc = row.get("accuracy")
    samples = acc.get("samples") if isinstance(acc, dict) else None
    if samples is None:
        return  # a row without an accuracy sample (a speed row)
    name = row.get("workload")
    where = f"bench record {path}: row {name!r}"
    if not isinstance(name, str) or not isinstance(samples, list):
        raise MeasurementFileError(
            f"bench record {path}: rows[{i}] has samples but "
            + ("no workload name" if not isinstance(name, str) else "they are not a list")
            + f"; {fix}"
        )
    for j, sample in enumerate(samples, 1):
        if not isinstance(sample, dict) or not isinstance(sample.get("config"), str):
            raise MeasurementFileError(f"{where}: sample {j} has no config; {fix}")
        for key in ("predicted_s", "measured_s"):
            t = sample.get(key)
            if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
                raise MeasurementFileError(
                    f"{where}: sample {j} ({sample['config']}) has {key} "
                    f"{json.dumps(t)[:40]}; a time is a positive number of seconds; {fix}"
                )
    configs = [sample["config"] for sample in samples]
    twice = next((c for c in configs if configs.count(c) > 1), None)
    if twice is not None:
        raise MeasurementFileError(f"{where}: config {twice} is sampled twice; {fix}")
    if len(samples) < MIN_SAMPLES:
        raise MeasurementFileError(
            f"{where}: {len(samples)} samples; scores need at least {MIN_SAMPLES}; {fix}"
        )
    if len({sample["measured_s"] for sample in samples}) == 1:
        raise MeasurementFileError(f"{where}: every sample has one time, which ranks nothing")


def _samples(row: Any) -> list[dict[str, Any]]:
    """A row's kept samples, each with a config, its prediction then and its measured time."""
    acc = row.get("accuracy") if isinstance(row, dict) else None
    samples = acc.get("samples") if isinstance(acc, dict) else None
    if not isinstance(samples, list):
        return []
    keys = {"config": str, "predicted_s": (int, float), "measured_s": (int, float)}
    return [
        s
        for s in samples
        if isinstance(s, dict) and all(isinstance(s.get(k), t) for k, t in keys.items())
    ]


def median_record(docs: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """The first of ``docs`` with each kept sample's time replaced by the median of that
    config's times over all of them (its predictions then stay the first's): timings of the same
    samples, as a day's bench runs with one seed give. ``names`` name the documents in errors."""
    first, rows = docs[0], []
    for doc, label in zip(docs[1:], names[1:]):
        if doc.get("machine") != first.get("machine"):
            raise MeasurementFileError(
                f"bench record {label} was timed on {doc.get('machine')!r}, {names[0]} on "
                f"{first.get('machine')!r}; a median takes timings of one machine"
            )
    seen: list[list[float]] = [[] for _ in docs]  # each timing's times, to find one given twice
    for row in first["rows"]:
        samples, name = _samples(row), row.get("workload") if isinstance(row, dict) else None
        if not samples:
            continue
        times: dict[str, list[float]] = {s["config"]: [] for s in samples}
        for j, (doc, label) in enumerate(zip(docs, names)):
            kept = _row_times(doc, name)
            if kept is None:
                raise MeasurementFileError(
                    f"bench record {label}: no row {name!r}; a median needs timings of the same "
                    "rows and samples: give records the bench wrote with the same seed"
                )
            missing = [c for c in times if c not in kept]
            extra = [c for c in kept if c not in times]
            if missing or extra:
                what = (
                    f"has no time for {missing[0]} ({len(missing)} of {len(times)} configs missing)"
                    if missing
                    else f"has {len(extra)} config(s) {names[0]} has not ({extra[0]})"
                )
                raise MeasurementFileError(
                    f"bench record {label}: row {name!r} {what}; a median needs timings of the "
                    "same samples: give records the bench wrote with the same seed"
                )
            for config, t in times.items():
                t.append(kept[config])
                seen[j].append(kept[config])
        median = [{**s, "measured_s": float(np.median(times[s["config"]]))} for s in samples]
        rows.append({**row, "accuracy": {**row["accuracy"], "samples": median}})
    for j in range(1, len(docs)):
        again = next((i for i in range(j) if seen[j] and seen[i] == seen[j]), None)
        if again is not None:  # a copy of a file: the median would count one timing twice
            raise MeasurementFileError(
                f"bench records {names[again]} and {names[j]} hold the same times: one timing "
                "given twice; give each timing once"
            )
    return {**first, "rows": rows, "timings": len(docs)}


def _row(doc: dict[str, Any], name: Any) -> dict[str, Any] | None:
    """``doc``'s row of workload ``name``, or None."""
    return next((r for r in doc["rows"] if isinstance(r, dict) and r.get("workload") == name), None)


def _row_times(doc: dict[str, Any], name: Any) -> dict[str, float] | None:
    """Config -> kept time of ``doc``'s row of workload ``name`` (None: no such row)."""
    row = _row(doc, name)
    return None if row is None else {s["config"]: s["measured_s"] for s in _samples(row)}


def scores(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """The bench's accuracy scores of predictions against times."""
    return accuracy_scores(np.asarray(predicted, float), np.asarray(measured, float))


@dataclass(frozen=True)
class _CompiledRow:
    """A kept row's samples compiled for one spec: what a prediction needs, and the times."""

    name: str
    measured: list[float]
    predicted_then: list[float]
    schedules: list[CpuSchedule]
    loops: list[Any]
    configs: list[str]

    def scores(self, model: AnalyticalCpuModel) -> dict[str, Any]:
        """The row's scores under ``model``, with the predictions (tier 2, the kept loops)."""
        now = [p.seconds for p in model.predict_batch(self.schedules, self.loops)]
        return {**scores(now, self.measured), "predicted_s": now}


def _compiled_rows(doc: dict[str, Any], hw: HwSpec, log: Log) -> list[_CompiledRow]:
    """Every kept row of ``doc`` whose workload is known, its samples compiled for ``hw``."""
    if hw.kind != "cpu":
        raise MeasurementFileError(f"rescore predicts CPU kernels, and {hw.name} is a GPU")
    rows = []
    for row in doc["rows"]:
        samples, name = _samples(row), str(row.get("workload", ""))
        if not samples:
            continue
        try:
            w = row_workload(name)
            if w is None:
                continue
            space = build_cpu_space(w, hw)
            scheds = [schedule_from_config(space, space.parse_config(s["config"])) for s in samples]
        except AotuneError as e:
            raise MeasurementFileError(
                f"row {name!r} (timed on {doc.get('machine')!r}) on {hw.name}: {e}; check that "
                "--target is the spec of the machine that timed it"
            ) from None
        loops = [kernel_features(compile_kernel(s, hw), hw.isa.arch).loop for s in scheds]
        measured = [float(s["measured_s"]) for s in samples]
        then = [float(s["predicted_s"]) for s in samples]
        configs = [str(s["config"]) for s in samples]
        rows.append(_CompiledRow(name, measured, then, scheds, loops, configs))
        log(f"{name}: compiled {len(samples)} sampled configs")
    if not rows:
        names = [r.get("workload") for r in doc["rows"] if _samples(r)]
        raise MeasurementFileError(
            f"no sampled row is one the bench runs ({', '.join(map(repr, names))[:120]}); give "
            "a file that `aotune bench --json` wrote"
        )
    return rows


def rescore(
    doc: dict[str, Any],
    target: str,
    log: Log = print,
    each: Sequence[tuple[str, dict[str, Any]]] = (),
) -> dict[str, Any]:
    """Every kept sample of ``doc`` compiled for ``target`` and predicted by today's model (tier
    2, from its object code); per row the scores then (``before``) and now. With ``each`` (name,
    document: the timings ``doc`` is the median of), also today's scores against each timing
    apart, beside the hand-over and clock read while it ran (``timing_scores``)."""
    hw = load_target(target)
    model = AnalyticalCpuModel(hw)
    rows = []
    for r in _compiled_rows(doc, hw, log):
        now = r.scores(model)
        apart = {"each": timing_scores(r, now["predicted_s"], each)} if each else {}
        rows.append(
            {
                "workload": r.name,
                "n": len(r.measured),
                **now,
                "before": scores(r.predicted_then, r.measured),
                **apart,
            }
        )
    return {
        "machine": doc.get("machine"),
        "target": hw.name,
        "timings": doc.get("timings", 1),
        "rows": rows,
    }


def timing_scores(
    row: _CompiledRow, predicted: Sequence[float], each: Sequence[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``predicted`` scored against each timing of ``row``'s samples apart, with the core-to-core
    hand-over, the clock and the FMAs a cycle the bench read beside it: what two threads pay for
    the lines they share follows where the VM placed its vCPUs at that moment (README, stop 87),
    and a core another guest shares issues fewer FMAs (stop 89), which a median of timings
    mixes."""
    out = []
    for name, doc in each:
        kept = _row(doc, row.name)
        times = _row_times(doc, row.name) or {}
        missing = [c for c in row.configs if c not in times]
        if missing:  # median_record has refused such timings before this is reached
            raise MeasurementFileError(
                f"bench record {name}: row {row.name!r} has no time for {missing[0]}"
            )
        acc = kept["accuracy"] if kept else {}
        out.append(
            {
                "file": name,
                "core_to_core_ns": _readings(acc.get("core_to_core_ns")),
                "clock_ghz": _readings(acc.get("clock_ghz")),
                "fma_per_cycle": _readings(acc.get("fma_per_cycle")),
                **scores(predicted, [float(times[c]) for c in row.configs]),
            }
        )
    return out


def _readings(values: Any) -> list[float | None]:
    """A kept list of readings (hand-over ns, clock GHz, FMAs a cycle) in their places, None for
    one that is no reading (not a number above 0 and below 1e6); older records have none."""
    if not isinstance(values, list):
        return []
    return [
        float(v) if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1e6 else None
        for v in values
    ]


ABLATE_MOVE = 0.005  # a score that moves less than this when a field is set back is not shown


def ablate(doc: dict[str, Any], target: str, base: str, log: Log = print) -> dict[str, Any]:
    """``doc``'s samples predicted with ``target`` (a calibrated spec, say), with ``base`` (the
    built-in it was compared with), and with each field in which the two differ set back to
    ``base``'s value alone: which measured value moves which score. The samples are compiled once,
    for ``target``, so the two specs must describe one ISA (LLVM's feature lists may differ)."""
    hw, ref = load_target(target), load_target(base)
    for spec in (hw, ref):
        if spec.kind != "cpu":
            raise MeasurementFileError(f"ablate predicts CPU kernels, and {spec.name} is a GPU")
    differ = differing_paths(hw, ref)
    isa = [p for p in differ if p.startswith("isa.") and p != "isa.llvm_features"]
    if isa:
        raise MeasurementFileError(
            f"{hw.name} and {ref.name} differ in {', '.join(isa)}: ablate compares specs of one "
            "ISA (the samples are compiled once); give a base spec for the same CPU kind"
        )
    # compiled for the target's features (a calibration lists every one of the host's)
    paths = [p for p in differ if not p.startswith("isa.")]
    rows = _compiled_rows(doc, hw, log)

    def scored(spec: HwSpec) -> list[dict[str, Any]]:
        model = AnalyticalCpuModel(spec)
        return [{k: v for k, v in r.scores(model).items() if k != "predicted_s"} for r in rows]

    back = {path: value_at(ref, path) for path in paths}
    base_spec = hw
    for path, value in back.items():
        base_spec = with_value(base_spec, path, value)
    fields = []
    for path, value in back.items():
        fields.append(
            {
                "path": path,
                "target_value": value_at(hw, path),
                "base_value": value,
                "rows": scored(with_value(hw, path, value)),
            }
        )
        log(f"{path}: set back to {ref.name}'s value and re-predicted")
    return {
        "machine": doc.get("machine"),
        "target": hw.name,
        "base": ref.name,
        "timings": doc.get("timings", 1),
        "workloads": [r.name for r in rows],
        "target_rows": scored(hw),
        "base_rows": scored(base_spec),
        "fields": fields,
    }


def _moves(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The scores that moved by at least ``ABLATE_MOVE``, as 'name a -> b' (empty: none)."""
    names = (("top1", "top-1"), ("spearman", "Spearman"), ("median_abs_error", "median err"))
    return "  ".join(
        f"{label} {before[k]:.3f} -> {after[k]:.3f}"
        for k, label in names
        if abs(after[k] - before[k]) >= ABLATE_MOVE
    )


def _against(result: dict[str, Any]) -> str:
    """What a result's times are: one timing's, or the median of several."""
    return "" if result["timings"] == 1 else f", against {result['timings']} timings' median"


def _print_ablation(result: dict[str, Any]) -> None:
    """The text form of ``ablate``'s result: per field, the rows whose scores it moves."""
    print(
        f"{result['machine']} re-predicted for {result['target']}{_against(result)}; each of the "
        f"{len(result['fields'])} fields in which it differs from {result['base']} set back alone"
    )
    still = []
    every = {"path": f"every field ({result['base']})", "rows": result["base_rows"]}
    for entry in [every, *result["fields"]]:
        moved = [
            (name, _moves(now, after))
            for name, now, after in zip(result["workloads"], result["target_rows"], entry["rows"])
        ]
        moved = [(name, text) for name, text in moved if text]
        if not moved:
            still.append(entry["path"])
            continue
        values = (
            f" {entry['target_value']} -> {entry['base_value']}" if "target_value" in entry else ""
        )
        print(f"  {entry['path']}{values}")
        for name, text in moved:
            print(f"      {name:<36} {text}")
    if still:
        print(f"  moving no score by {ABLATE_MOVE} or more: {', '.join(still)}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line of the module docstring."""
    ap = Parser(prog="python -m aotune.benchmarks.cpu_record")
    ap.add_argument("step", choices=("rescore", "ablate"))
    ap.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a bench document (.json or .json.gz); several: timings of the same samples, "
        "scored against each config's median time",
    )
    ap.add_argument("--target", required=True, help="the spec of the CPU that timed it")
    ap.add_argument(
        "--base",
        help="ablate: the spec to set each differing field back to, one at a time (e.g. the "
        "built-in spec a calibrated --target was compared with)",
    )
    ap.add_argument(
        "--each",
        action="store_true",
        help="rescore: also score each timing apart, beside the core-to-core hand-over, clock and "
        "FMAs a cycle read while it ran",
    )
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if (args.step == "ablate") != (args.base is not None):
        ap.error("--base goes with ablate, and ablate needs it")
    if args.each and args.step != "rescore":
        ap.error("--each goes with rescore")
    try:
        return _run(args)
    except Exception:
        return report_error()  # one line, and a closed pipe or a full disk as aotune's own


def _run(args: argparse.Namespace) -> int:
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    seen: dict[object, int] = {}
    for i, f in enumerate(args.files):
        first = seen.setdefault(file_identity(f), i)
        if first != i:
            raise MeasurementFileError(
                f"{f} is given twice (as file {first + 1} and {i + 1}); give each timing once"
            )
    docs = [read_record(f) for f in args.files]
    doc = median_record(docs, [str(f) for f in args.files]) if len(docs) > 1 else docs[0]
    if args.base is not None:
        result = ablate(doc, args.target, args.base, log=log)
    else:
        each = list(zip(map(str, args.files), docs)) if args.each else []
        result = rescore(doc, args.target, log=log, each=each)
    if args.json:
        print(json.dumps(result))
        return 0
    if args.base is not None:
        _print_ablation(result)
        return 0
    print(
        f"{result['machine']} re-predicted for {result['target']}{_against(result)}: before -> now"
    )
    for r in result["rows"]:
        b = r["before"]
        print(
            f"  {r['workload']:<40} n={r['n']:<4} Spearman {b['spearman']:.3f} -> "
            f"{r['spearman']:.3f}  top-1 {b['top1']:.3f} -> {r['top1']:.3f}  median err "
            f"{b['median_abs_error']:.3f} -> {r['median_abs_error']:.3f}"
        )
        for t in r.get("each", []):
            print(
                f"      {Path(t['file']).name:<38} hand-over "
                f"{_readings_text(t['core_to_core_ns'], '.0f')} ns, clock "
                f"{_readings_text(t['clock_ghz'], '.2f')} GHz, FMAs a cycle "
                f"{_readings_text(t['fma_per_cycle'], '.2f')}: Spearman {t['spearman']:.3f}  "
                f"top-1 {t['top1']:.3f}  median err {t['median_abs_error']:.3f}"
            )
    return 0


def _readings_text(values: list[float | None], form: str) -> str:
    """Readings as the text shows them: 'a/b' ('-' for none, '?' for one that is no reading)."""
    return "/".join("?" if v is None else format(v, form) for v in values) or "-"


if __name__ == "__main__":
    sys.exit(main())
