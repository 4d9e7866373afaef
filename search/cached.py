"""Searches that go through the tuning database: reuse a record, or search and record.

search_record(workload, hw, options)   driver.tune as plain data (what a pool or Dask worker
                                       sends back to the one database on the submitting side)
tune(workload, hw, options, db, ...)   the record of this key if the database has one (unless
                                       retune), else a search whose record is stored first
result_of(record, workload, hw)        a stored record as a TuneResult: the top-k compiled
                                       again from their configs (a few hundred ms, no search)
fitting_schedules(record, workload, hw)   each candidate's config and schedule in today's space,
                                       or a DatabaseError naming the record and --retune
check_importable(records, source)      records being imported: each workload one aotune makes,
                                       its labels its definition's, and, where the spec is known
                                       here, its target that spec's name, its configs in the
                                       space and each GFLOP/s its time's; a DatabaseError names
                                       the first that fails
store_check(db, record, verified, numpy_gflops)   the final check's measurements
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import Any

from aotune.analysis.model import Prediction
from aotune.analysis.workload import Workload, workload_from_definition
from aotune.constraints.space import Config, Space
from aotune.errors import AotuneError, DatabaseError, WorkloadError
from aotune.hwspecs.spec import HwSpec, builtin_names, is_spec_name, load_target
from aotune.search import driver
from aotune.search.database import (
    CandidateRecord,
    TuneRecord,
    TuningDatabase,
    model_version,
    options_json,
    spec_hash,
    workload_json,
    workload_key,
)
from aotune.search.options import SearchOptions
from aotune.targets import target_for


def record_key(workload: Workload, hw: HwSpec, options: SearchOptions) -> tuple[str, ...]:
    """The database key of a search of ``workload`` on ``hw`` with ``options``."""
    return (workload_key(workload), spec_hash(hw), model_version(), options_json(options))


def record_of(result: driver.TuneResult) -> TuneRecord:
    """A search result as plain data."""
    w, hw, opts = result.workload, result.hw, result.options
    key = record_key(w, hw, opts)
    return TuneRecord(
        workload_key=key[0],
        spec_hash=key[1],
        model_version=key[2],
        options=key[3],
        workload=workload_json(w),
        target=hw.name,
        candidates=tuple(
            CandidateRecord(
                rank=c.rank,
                config=c.config.as_dict(),
                predicted_seconds=c.prediction.seconds,
                estimate_seconds=c.estimate.seconds,
                bottleneck=c.prediction.bottleneck,
                breakdown=dict(c.prediction.breakdown),
            )
            for c in result.candidates
        ),
        search_seconds=result.search_seconds,
        candidates_scored=result.candidates_scored,
        kernels_compiled=result.kernels_compiled,
        created=time.time(),
    )


def search_record(workload: Workload, hw: HwSpec, options: SearchOptions) -> TuneRecord:
    """Search ``workload`` on ``hw`` (nothing measured) and return the result as plain data."""
    return record_of(driver.tune(workload, hw, options))


def fitting_schedules(
    record: TuneRecord,
    workload: Workload,
    hw: HwSpec,
    what: str = "",
    fix: str = "run again with --retune",
) -> tuple[Space, list[tuple[Config, Any]]]:
    """The workload's space on ``hw`` and (config, schedule) of each of the record's candidates
    in it: a record imported, or written by hand, may name configs the space refuses, and a
    DatabaseError then names the record (``what``, else its id) and ``fix``."""
    target = target_for(hw)
    space = target.build_space(workload)
    out = []
    for c in record.candidates:
        try:
            cfg = space.config(c.config)
            out.append((cfg, target.schedule(space, cfg)))
        except AotuneError as e:
            raise DatabaseError(
                f"{what or f'record {record.id}'}: config {c.config} does not fit the space "
                f"({e}){f'; {fix}' if fix else ''}"
            ) from None
    return space, out


def specs_named_here(names: Sequence[str] | None = None) -> dict[str, Any]:
    """The specs ``host`` and the built-in names load here (only those of ``names`` if given),
    by name; a host aotune cannot describe is left out."""
    known = ["host", *builtin_names()]
    specs: dict[str, Any] = {}
    for name in known if names is None else [n for n in known if n in names]:
        try:
            specs[name] = load_target(name)
        except AotuneError:
            continue
    return specs


def check_importable(records: Sequence[TuneRecord], source: str) -> int:
    """Check each record's workload (one aotune makes, its labels those of its definition) and
    its configs against that workload's space on its spec, where that spec is one known here (a
    built-in or this host's; a calibrated file is known only by its hash): a DatabaseError names
    the first record (by its place in ``source``) that fails, so nothing of a file with one is
    imported. Returns how many records' configs were not checked (their spec not known here);
    ``tune`` checks those when it reads them."""
    specs = specs_by_hash()
    fix = "remove that record, or tune the workload again and export it; nothing was imported"
    unchecked = 0
    for i, record in enumerate(records, 1):
        if not _check_record(record, specs, f"{source} record {i}", fix):
            unchecked += 1
    return unchecked


def import_refusal(record: TuneRecord, specs: dict[str, HwSpec]) -> str | None:
    """Why ``db import`` would refuse ``record`` (named by its database id), or None: ``db
    export`` leaves such records out, since one of them makes import refuse the whole file.
    ``specs``: :func:`specs_by_hash`, made once for all the records."""
    try:
        _check_record(record, specs, f"record {record.id}", "")
    except DatabaseError as e:
        return str(e)
    return None


def specs_by_hash() -> dict[str, HwSpec]:
    """The specs known here (the built-ins and this host's) by their hash."""
    specs: dict[str, HwSpec] = {}
    for hw in specs_named_here().values():  # a host aotune cannot describe: records unchecked
        specs.setdefault(spec_hash(hw), hw)
    return specs


def _check_record(record: TuneRecord, specs: dict[str, HwSpec], what: str, fix: str) -> bool:
    """Check one record as :func:`check_importable` does (``what`` names it in the error, ``fix``
    ends it); False where its spec is not known here, so its configs went unchecked."""
    end = f"; {fix}" if fix else ""
    try:
        workload = workload_from_definition(record.workload.get("definition"))
    except WorkloadError as e:
        raise DatabaseError(
            f"{what}: its workload definition is not one aotune makes: {e}{end}"
        ) from None
    if workload_key(workload) != record.workload_key:  # a size written as 64.5 or "64"
        raise DatabaseError(
            f"{what}: its workload definition is not as aotune writes it (a value of another "
            f"type, for {workload.describe()}){end}"
        )
    stored = json.loads(json.dumps(workload_json(workload)))
    wrong = [k for k in stored if k != "definition" and stored[k] != record.workload.get(k)]
    if wrong:
        raise DatabaseError(
            f"{what}: its workload's {', '.join(wrong)} "
            f"({', '.join(repr(record.workload.get(k))[:60] for k in wrong)}) "
            f"{'does' if len(wrong) == 1 else 'do'} not match its definition "
            f"({workload.describe()}){end}"
        )
    hw = specs.get(record.spec_hash)
    if hw is None:
        if not is_spec_name(record.target):  # a spec could not have it: made by hand
            raise DatabaseError(
                f"{what}: its target {record.target[:60]!r} is no spec's name "
                f"(1-64 letters, digits, '.', '_' or '-'){end}"
            )
        return False
    if record.target != hw.name:  # db list shows it, tune --target NAME reuses the record
        raise DatabaseError(
            f"{what}: its target {record.target!r} is not the name of its spec "
            f"({hw.name}, by its hash){end}"
        )
    _, schedules = fitting_schedules(
        record, workload, hw, f"{what} ({workload.describe()} on {record.target})", fix
    )
    for c, (_, schedule) in zip(record.candidates, schedules, strict=True):
        _check_gflops(c, schedule.flops, f"{what} candidate rank {c.rank}", end)
    return True


def _check_gflops(c: CandidateRecord, flops: int, what: str, end: str) -> None:
    """A candidate's GFLOP/s is its kernel's flops over its measured time, as the final check
    writes it: one that disagrees with the time (or comes without one) is refused, since the
    record would then carry two answers to how fast the kernel ran."""
    if c.gflops is None:
        return
    if c.measured_seconds is None:
        raise DatabaseError(
            f"{what}: gflops {c.gflops:g} without a measured_seconds (a check timed nothing); "
            f"give gflops null, or the time it was measured from{end}"
        )
    implied = flops / c.measured_seconds / 1e9
    if not math.isclose(c.gflops, implied, rel_tol=1e-6):
        raise DatabaseError(
            f"{what}: gflops {c.gflops:g} disagrees with measured_seconds {c.measured_seconds:g}, "
            f"which gives {implied:.6g} ({flops} flops); give gflops {implied:.6g} or null, or "
            f"the measured_seconds it was computed from{end}"
        )


def result_of(record: TuneRecord, workload: Workload, hw: HwSpec) -> driver.TuneResult:
    """The record's candidates as a TuneResult, compiled again from their configs."""
    target = target_for(hw)
    space, fitting = fitting_schedules(record, workload, hw)
    cands = []
    for c, (cfg, sched) in zip(record.candidates, fitting):
        cands.append(
            driver.Candidate(
                c.rank,
                cfg,
                sched,
                Prediction(c.estimate_seconds, (), c.bottleneck, "estimate"),
                Prediction(c.predicted_seconds, tuple(c.breakdown.items()), c.bottleneck, "asm"),
                target.compile(sched),
            )
        )
    return driver.TuneResult(
        workload,
        hw,
        space,
        SearchOptions(**json.loads(record.options)),
        tuple(cands),
        record.search_seconds,
        record.candidates_scored,
        record.kernels_compiled,
    )


def tune(
    workload: Workload,
    hw: HwSpec,
    options: SearchOptions,
    db: TuningDatabase | None,
    retune: bool = False,
    progress: driver.Progress | None = None,
) -> tuple[driver.TuneResult, TuneRecord | None, bool]:
    """(result, its stored record, whether it was reused) for ``workload`` on ``hw``.

    Without a database this is ``driver.tune``. With one, a stored record of the same key is
    reused unless ``retune``, which searches again and replaces it.
    """
    if db is None:
        return driver.tune(workload, hw, options, progress), None, False
    key = record_key(workload, hw, options)
    found = None if retune else db.find(key)  # type: ignore[arg-type]
    if found is not None:
        return result_of(found, workload, hw), found, True
    db.check_writable()  # now: a result the database then refused would be lost
    result = driver.tune(workload, hw, options, progress)
    stored = db.put(record_of(result), replace=retune)
    if [c.config for c in stored.candidates] != [c.config.as_dict() for c in result.candidates]:
        result = result_of(stored, workload, hw)  # another build stored this key first: use it
    return result, stored, False


def store_check(
    db: TuningDatabase,
    record: TuneRecord,
    verified: list[driver.Verified],
    numpy_gflops: float | None,
) -> None:
    """Keep the final check's measurements with the record's candidates."""
    assert record.id is not None
    by_rank = {c.rank: c for c in record.candidates}
    db.measure(
        record.id,
        [
            CandidateRecord(
                **{
                    **by_rank[v.candidate.rank].__dict__,
                    # an emulated check (a foreign ISA under qemu) says correct or not, no time
                    "measured_seconds": None if v.emulated else v.measurement.seconds,
                    "gflops": v.gflops,
                    "correct": v.measurement.correct,
                    "max_abs_error": v.measurement.max_abs_error,
                    "numpy_gflops": numpy_gflops,
                }
            )
            for v in verified
            if v.candidate.rank in by_rank
        ],
    )
