"""CPU bench samples kept in the repository, re-predicted by today's model on any machine.

    python -m aotune.benchmarks.cpu_record rescore FILE.json.gz [FILE ...] --target znver5 [--json]

``aotune bench --json`` keeps, per accuracy row, every sampled config with the time it ran in
and what the model of the day predicted. The records in ``benchmarks/data/cpu/`` are such
documents from CPUs a later session may not have (the first: a Zen 5 slice, 2026-11-30: seven
timings of the same matmul samples, a-g, stops 69-72, the operator and unseen rows).
``rescore`` compiles each sampled config for ``--target`` (the spec of the CPU that timed it: its
own code and tier-2 features, none of the machine's), predicts it with today's model and scores
the predictions against the kept times, beside the scores the record was made with. Nothing is
timed. Given several timings of the same samples (a day's ``-b``, ``-c`` ...), it scores against
each config's median time (``median_record``): one timing's placement of the vCPUs, or a
neighbour's burst, then moves a score less.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from aotune.analysis.features import kernel_features
from aotune.analysis.model import AnalyticalCpuModel
from aotune.analysis.workload import Workload, matmul
from aotune.benchmarks.suite import OPERATORS_FULL, OPERATORS_QUICK, UNSEEN, accuracy_scores
from aotune.codegen.compile import compile_kernel
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import AotuneError, MeasurementFileError
from aotune.files import read_user_file
from aotune.hwspecs.spec import load_target

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
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MeasurementFileError(
            f"bench record {path}: not JSON or gzipped JSON ({e}); give a file that "
            "`aotune bench --json` wrote"
        ) from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not any(_samples(r) for r in rows):
        raise MeasurementFileError(
            f"bench record {path}: no row with sampled configs (rows[].accuracy.samples); give "
            "a file that `aotune bench --json` wrote with its accuracy rows"
        )
    return doc


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
    for row in first["rows"]:
        samples, name = _samples(row), row.get("workload") if isinstance(row, dict) else None
        if not samples:
            continue
        times: dict[str, list[float]] = {s["config"]: [] for s in samples}
        for doc, label in zip(docs, names):
            other = next(
                (r for r in doc["rows"] if isinstance(r, dict) and r.get("workload") == name),
                None,
            )
            if other is None:
                raise MeasurementFileError(
                    f"bench record {label}: no row {name!r}; a median needs timings of the same "
                    "rows and samples: give records the bench wrote with the same seed"
                )
            kept = {s["config"]: s["measured_s"] for s in _samples(other)}
            missing = [c for c in times if c not in kept]
            if missing:
                raise MeasurementFileError(
                    f"bench record {label}: row {name!r} has no time for {missing[0]} "
                    f"({len(missing)} of {len(times)} configs missing); a median needs timings "
                    "of the same samples: give records the bench wrote with the same seed"
                )
            for config, t in times.items():
                t.append(kept[config])
        median = [{**s, "measured_s": float(np.median(times[s["config"]]))} for s in samples]
        rows.append({**row, "accuracy": {**row["accuracy"], "samples": median}})
    return {**first, "rows": rows, "timings": len(docs)}


def scores(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """The bench's accuracy scores of predictions against times."""
    return accuracy_scores(np.asarray(predicted, float), np.asarray(measured, float))


def rescore(doc: dict[str, Any], target: str, log: Log = print) -> dict[str, Any]:
    """Every kept sample of ``doc`` compiled for ``target`` and predicted by today's model (tier
    2, from its object code); per row the scores then (``before``) and now."""
    hw = load_target(target)
    if hw.kind != "cpu":
        raise MeasurementFileError(f"rescore predicts CPU kernels, and {hw.name} is a GPU")
    model = AnalyticalCpuModel(hw)
    rows = []
    for row in doc["rows"]:
        samples, name = _samples(row), str(row.get("workload", ""))
        w = row_workload(name)
        if not samples or w is None:
            continue
        space = build_cpu_space(w, hw)
        scheds = [schedule_from_config(space, space.parse_config(s["config"])) for s in samples]
        loops = [kernel_features(compile_kernel(s, hw), hw.isa.arch).loop for s in scheds]
        now = [p.seconds for p in model.predict_batch(scheds, loops)]
        measured = [s["measured_s"] for s in samples]
        rows.append(
            {
                "workload": name,
                "n": len(samples),
                **scores(now, measured),
                "before": scores([s["predicted_s"] for s in samples], measured),
                "predicted_s": now,
            }
        )
        log(f"{name}: re-predicted {len(samples)} sampled configs")
    return {
        "machine": doc.get("machine"),
        "target": hw.name,
        "timings": doc.get("timings", 1),
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """The command line of the module docstring."""
    ap = argparse.ArgumentParser(prog="python -m aotune.benchmarks.cpu_record")
    ap.add_argument("step", choices=("rescore",))
    ap.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="a bench document (.json or .json.gz); several: timings of the same samples, "
        "scored against each config's median time",
    )
    ap.add_argument("--target", required=True, help="the spec of the CPU that timed it")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        docs = [read_record(f) for f in args.files]
        doc = median_record(docs, [str(f) for f in args.files]) if len(docs) > 1 else docs[0]
        result = rescore(doc, args.target, log=lambda m: print(m, file=sys.stderr))
    except AotuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
        return 0
    against = "" if result["timings"] == 1 else f", against {result['timings']} timings' median"
    print(f"{result['machine']} re-predicted for {result['target']}{against}: before -> now")
    for r in result["rows"]:
        b = r["before"]
        print(
            f"  {r['workload']:<40} n={r['n']:<4} Spearman {b['spearman']:.3f} -> "
            f"{r['spearman']:.3f}  top-1 {b['top1']:.3f} -> {r['top1']:.3f}  median err "
            f"{b['median_abs_error']:.3f} -> {r['median_abs_error']:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
