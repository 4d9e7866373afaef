"""The ``aotune build`` and ``aotune db`` commands (parsers and handlers; ``cli.py`` mounts them).

Output follows the CLI's rules: tables through rich, ``--json`` prints one object on stdout,
progress on stderr only when it is a terminal, every AotuneError one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aotune.errors import BuildError, ConfigError, DatabaseError
from aotune.files import json_text, printable, refuse_inputs_inside
from aotune.files import output_console as _console
from aotune.search.options import SearchOptions

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130


def add_db_flags(p: argparse.ArgumentParser, search: bool = True, optional: bool = True) -> None:
    """``--db`` (and, for commands that search, ``--retune``; ``--no-db`` where the command can
    do without the database)."""
    p.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="tuning database (default: $XDG_CACHE_HOME/aotune/tuning.db or "
        "~/.cache/aotune/tuning.db)",
    )
    if search:
        p.add_argument(
            "--retune", action="store_true", help="search again and replace the stored record"
        )
    if search and optional:
        p.add_argument(
            "--no-db", action="store_true", help="neither read nor write the tuning database"
        )


def add_build_parser(sub: Any, int_arg: Callable[[str], int] = int) -> None:
    """The ``build`` subcommand's arguments; ``int_arg`` reads its integer options (the CLI's,
    which takes ASCII digits only and says so)."""
    b = sub.add_parser(
        "build",
        help="tune a kernel list or an ONNX model and write a library (.so, .a, header, manifest)",
    )
    b.add_argument("input", help="a TOML list of [[kernel]] tables, or an ONNX model (.onnx)")
    b.add_argument("-o", "--out", default="build", help="output directory (default: build)")
    b.add_argument(
        "--target", default="host", help="hwspec name, path to a .toml, or 'host' (default)"
    )
    b.add_argument(
        "--jobs",
        type=int_arg,
        default=None,
        help="searches run at once in local processes (default: one per core)",
    )
    b.add_argument(
        "--cluster",
        metavar="ADDRESS",
        default=None,
        help="run the searches on a Dask cluster, e.g. tcp://scheduler:8786",
    )
    b.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="ONNX: sizes of a dynamic model input, e.g. input=1x3x224x224 (repeatable)",
    )
    b.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the timed final check of each record's top-k (the written library is still "
        "checked against numpy where this host runs it)",
    )
    b.add_argument(
        "--force",
        action="store_true",
        help="write into a directory holding other files (those of the build's own names, as "
        "its header, library and manifest.json, are replaced)",
    )
    b.add_argument("--cc", default=None, help="C compiler that links the shared object")
    b.add_argument(
        "--objects-only", action="store_true", help="write objects and the header; link nothing"
    )
    b.add_argument(
        "--prefix",
        default=None,
        metavar="NAME",
        help="the library's symbol and file prefix (default: aotune): NAME_set_num_threads, "
        "NAME_kernels.h, libNAME_kernels.so; two libraries of different prefixes link into one "
        "program",
    )
    b.add_argument("--seed", type=int_arg, default=0)
    b.add_argument("--strategy", default="cga", help="cga (default) or random")
    b.add_argument(
        "--budget", type=int_arg, default=SearchOptions.budget, help="configs scored per workload"
    )
    b.add_argument(
        "--top-k", type=int_arg, default=3, help="candidates kept and checked (default 3)"
    )
    b.add_argument("--json", action="store_true", help="print one JSON object")
    add_db_flags(b, optional=False)  # build keeps every search in the database


def _record_id(text: str) -> int:
    """A record id as ``db show`` takes it."""
    if not re.fullmatch(r"\s*-?[0-9]+\s*", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a record id (a positive integer); 'aotune db list' shows them"
        )
    if len(text.strip()) > 30:  # beyond any id, and int() of thousands of digits is slow
        raise argparse.ArgumentTypeError(
            f"no record {text.strip()[:12]}... ({len(text.strip())} digits); 'aotune db list' "
            "shows the ids"
        )
    return int(text)


def add_db_parser(sub: Any) -> None:
    """The ``db`` subcommand and its actions."""
    d = sub.add_parser("db", help="the tuning database: list, show, export, import")
    dsub = d.add_subparsers(dest="db_command", parser_class=type(d))
    ls = dsub.add_parser("list", help="one line per record")
    add_db_flags(ls, search=False)
    ls.add_argument("--json", action="store_true")
    show = dsub.add_parser("show", help="one record with its candidates")
    show.add_argument("id", type=_record_id)
    add_db_flags(show, search=False)
    show.add_argument("--json", action="store_true")
    ex = dsub.add_parser("export", help="write every record as JSON lines")
    ex.add_argument("file")
    ex.add_argument("--force", action="store_true", help="overwrite FILE")
    add_db_flags(ex, search=False)
    im = dsub.add_parser("import", help="add the records of an export (existing ones are kept)")
    im.add_argument("file")
    add_db_flags(im, search=False)


def command_inputs(
    args: argparse.Namespace, database: bool = True, builtin_specs: bool = True
) -> dict[str, str]:
    """The files a command reads, by what they are (for messages): its --target spec where that
    is a file, with ``builtin_specs`` aotune's own spec files (a target by name, ``host`` too,
    reads them), and with ``database`` its tuning database unless --no-db."""
    from aotune.hwspecs.spec import builtin_spec_inputs
    from aotune.search.database import default_path

    inputs = {}
    if os.path.isfile(args.target):
        inputs["the --target spec"] = args.target
    if builtin_specs:
        inputs.update(builtin_spec_inputs())
    if database and not getattr(args, "no_db", False):
        inputs["the tuning database"] = str(getattr(args, "db", None) or default_path())
    return inputs


def open_db(args: argparse.Namespace, create: bool = True) -> Any:
    """The database the flags name, or None with ``--no-db``; ``create`` makes a missing file a
    new database (commands that only read pass False: a wrong --db is an error, not a new file)."""
    from aotune.search.database import open_database

    if getattr(args, "no_db", False):
        if getattr(args, "db", None) is not None:
            raise ConfigError("--db and --no-db contradict each other; give one")
        if getattr(args, "retune", False):
            raise ConfigError("--retune replaces a stored record; with --no-db there is none")
        return None
    return open_database(getattr(args, "db", None), create=create)


def cmd_build(args: argparse.Namespace) -> int:
    """``aotune build``."""
    from aotune.artifact.build import (
        BuildOptions,
        build,
        check_output_parent,
        check_prefix,
        default_jobs,
    )
    from aotune.artifact.inputs import read_input
    from aotune.artifact.names import DEFAULT_PREFIX
    from aotune.artifact.onnx_import import parse_shape_args
    from aotune.hwspecs.spec import load_target

    if args.jobs is not None and args.jobs < 1:
        raise BuildError(f"--jobs {args.jobs}: give 1 or more worker processes")
    for flag, value in (("the kernel list", args.input), ("-o", args.out), ("--cc", args.cc)):
        if value is not None and not value.strip():
            raise BuildError(f"{flag} is an empty name; give a path")
    if args.out == "-":  # other tools' name for standard output
        raise BuildError(
            "-o -: a build writes a folder (objects, a header and a manifest), not to standard "
            "output; give a folder (./- for one named '-')"
        )
    if args.cluster is not None and not args.cluster.strip():
        raise BuildError(
            "--cluster is an empty address; give the scheduler's, e.g. tcp://host:8786"
        )
    if args.cluster and args.jobs is not None:
        raise BuildError("--jobs and --cluster contradict each other: the cluster has its workers")
    if args.cluster:
        from aotune.artifact.fanout import scheduler_host_port

        scheduler_host_port(args.cluster.strip())
    search = SearchOptions(
        strategy=args.strategy,
        seed=args.seed,
        budget=args.budget,
        top_k=args.top_k,
        compile_top=max(16, args.top_k),
    )
    shapes = parse_shape_args(args.shape)
    kernels = read_input(Path(args.input), shapes, args.prefix or DEFAULT_PREFIX)
    hw = load_target(args.target)
    # the build writes files of its own names only: aotune's spec files cannot be among them
    inputs = {"the kernel list": args.input, **command_inputs(args, builtin_specs=False)}
    if not args.force:  # with --force they may stay there, if the build writes none of them
        # checked before the database is opened, which would create it inside -o
        refuse_inputs_inside(args.out, "-o", inputs, BuildError)
    # a missing parent of -o is a likely typo: refused before the database is made
    check_output_parent(Path(args.out))
    db = open_db(args)
    options = BuildOptions(
        out_dir=Path(args.out),
        search=search,
        jobs=args.jobs or default_jobs(),
        cluster=args.cluster,
        retune=args.retune,
        verify=not args.no_verify,
        force=args.force,
        cc=args.cc,
        objects_only=args.objects_only,
        inputs=tuple(inputs.items()),
        prefix=check_prefix(args.prefix, hw, kernels),
    )
    err = _console(stderr=True)
    states: dict[str, str] = {}
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    live = not args.json and err.is_terminal
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<32}"),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
        disable=not live,
    )
    rows: dict[str, Any] = {}
    shown = {
        "queued": "queued",
        "database": "from the database",
        "searching": "searching (no runs)",
        "searched": "searched",
        "checking": "final check (timed with numpy)",
        "done": "done",
        "failed": "[red]failed[/]",
    }

    def event(names: str, state: str) -> None:
        states[names] = state
        if live:
            if names not in rows:
                rows[names] = bar.add_task(names, total=1, state="")
            bar.update(
                rows[names],
                state=shown[state],
                completed=1 if state in ("done", "database", "failed") else 0,
            )
            if state in ("searched", "database", "failed", "done"):
                bar.stop_task(rows[names])  # its clock shows how long its search took
        elif not args.json and state in ("database", "searched", "failed"):
            err.print(f"{names}: {shown[state]}")

    start = time.perf_counter()
    try:
        with bar:
            report = build(kernels, hw, options, db, event)
    except KeyboardInterrupt:
        from aotune.cli import stopped_how

        finished = sum(1 for s in states.values() if s in ("searched", "database", "done"))
        with contextlib.suppress(OSError):  # a terminal that hung up takes no line
            sys.stderr.write(
                f"{stopped_how()} after {time.perf_counter() - start:.0f} s: {finished} of "
                f"{len(states)} workloads are searched and kept in {db.path}; run the same "
                "command again to resume\n"
            )
        return EXIT_INTERRUPTED
    finally:
        db.close()
    if args.json:
        print(json_text(report.as_dict(), indent=1))
    else:
        _print_report(report, _console())
    if report.failed:
        sys.stderr.write(
            f"error: the built library computes {', '.join(report.failed)} wrongly (checked "
            "against numpy); this is a bug in aotune: please report it\n"
        )
        return EXIT_ERROR
    return 0


def _print_report(report: Any, out: Any) -> None:
    from aotune.targets import spec_origin_lines, target_for
    from rich.markup import escape
    from rich.table import Table

    hw = report.target
    triple = target_for(hw).describe()["triple"]
    out.print(
        f"[bold]{len(report.kernels)} kernels[/] for [bold]{hw.name}[/] ({triple}) from "
        f"{escape(printable(report.source))}: {report.searched} searched, {report.reused} from the "
        f"database ({escape(printable(report.database))}), {report.seconds:.1f} s"
    )
    for line in spec_origin_lines(hw):
        out.print(escape(line))
    measured = any(k.as_dict()["measured_gflops"] for k in report.kernels)
    table = Table(
        title="kernels (predicted without running; "
        + ("measured on this host)" if measured else "none measured here)")
    )
    for col in (
        "kernel",
        "workload",
        "config",
        "predicted",
        "GFLOP/s pred",
        "GFLOP/s meas",
        "vs numpy",
        "library check",
    ):
        table.add_column(col, overflow="fold")
    for k in report.kernels:
        d = k.as_dict()
        meas = d["measured_gflops"]
        if k.check is None:
            check = "-"
        elif k.check.ok:
            check = f"ok (err {k.check.max_abs_error:.1e})"
        else:
            check = f"[red]WRONG[/] (err {k.check.max_abs_error:.1e} > {k.check.tolerance:.1e})"
        table.add_row(
            escape(k.name),
            escape(k.describe),
            escape(k.config),
            f"{k.predicted_seconds * 1e3:.3f} ms",
            f"{d['predicted_gflops']:.1f}",
            f"{meas:.1f}" if meas else "-",
            f"{meas / k.numpy_gflops:.2f}x" if meas and k.numpy_gflops else "-",
            check,
        )
    out.print(table)
    if report.skipped:
        skipped = Table(title="ONNX ops not generated by aotune (the model still builds)")
        for col in ("node", "op", "why"):
            skipped.add_column(col, overflow="fold")
        for s in report.skipped:
            skipped.add_row(escape(s.node), s.op_type, escape(s.reason))
        out.print(skipped)
    for note in report.notes:
        out.print(f"note: {escape(note)}")
    if report.check_skipped:
        out.print(f"final check skipped: {escape(report.check_skipped)}")
    if report.library_check:
        out.print(f"library check: {escape(report.library_check)}")
    out.print(f"wrote {escape(printable(str(report.out_dir)))}/: {', '.join(report.files)}")


def named_spec_hashes(names: set[str]) -> dict[str, str | None]:
    """The hash of the spec each target name loads here today (``host``: this machine's; a
    built-in's file), None for a name that loads nothing by itself (a spec file's own name) or
    a host aotune cannot describe."""
    from aotune.search.cached import specs_named_here
    from aotune.search.database import spec_hash

    specs = specs_named_here(sorted(names))
    return {name: spec_hash(specs[name]) if name in specs else None for name in names}


def _record_line(r: Any, named: dict[str, str | None] | None = None) -> dict[str, Any]:
    best = r.candidates[0]
    today = (named or {}).get(r.target)
    measured = [c for c in r.candidates if c.measured_seconds is not None]
    return {
        "id": r.id,
        "workload": r.workload.get("describe", "?"),
        "target": r.target,
        "spec_hash": r.spec_hash,
        # whether --target NAME loads the record's spec here today (a copy or a calibration kept
        # under a built-in's name, or an earlier version of it, does not); None: not a built-in
        "target_loads_this_spec": None if today is None else today == r.spec_hash,
        "model_version": r.model_version,
        "candidates": len(r.candidates),
        "predicted_seconds": best.predicted_seconds,
        "measured_seconds": min((c.measured_seconds for c in measured), default=None),
        "search_seconds": r.search_seconds,
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created)),
    }


def _config_label(name: str, value: int) -> str | int:
    """A stored decision as --config takes it: a categorical one by its label."""
    from aotune.constraints.cpu import CATEGORICAL_LABELS

    labels = CATEGORICAL_LABELS.get(name, ())
    return labels[value] if 0 <= value < len(labels) else value


def _records(n: int) -> str:
    """``n`` records, in words ("1 record", "2 records")."""
    return f"{n} record{'' if n == 1 else 's'}"


def cmd_db(args: argparse.Namespace) -> int:
    """``aotune db list|show|export|import``."""
    command = args.db_command
    if command is None:  # the namespace then has none of the actions' flags
        raise DatabaseError(
            "'aotune db' needs an action: list, show ID, export FILE or import FILE "
            "(see 'aotune db --help')"
        )
    if command in ("import", "export") and args.file.strip() in ("", "-"):
        raise DatabaseError(
            f"db {command} {args.file!r}: give a file name (records are not read from or printed "
            "to the terminal)"
        )
    if command == "import":  # the one action that may make a new database
        from aotune.search.database import read_export

        records = read_export(Path(args.file))  # checked first: a refused file makes no database
        if not records:  # what 'db export' writes for an empty database; no database is made
            print(f"{args.file} holds no records (an empty export); nothing imported")
            return 0
        from aotune.search.cached import check_importable

        unchecked = check_importable(records, args.file)  # before a database is made
        with open_db(args, create=True) as db:
            added, present = db.import_records(records)
        repeated = len(records) - len({r.key for r in records})
        again = f"; {repeated} repeating an earlier line of the file, the first kept"
        again = again if repeated else ""
        print(
            f"imported {_records(added)} into {db.path} ({present - repeated} already there, "
            f"kept{again})"
        )
        if unchecked:
            print(
                f"{unchecked} of the {_records(len(records))} are for a spec not known here (a "
                "calibrated file is known only by its hash): their configs are checked against "
                "the space when tune reads them"
            )
        return 0
    if command == "export":  # --force replaces earlier output, never aotune's own files
        from aotune.files import refuse_outputs_over_inputs
        from aotune.hwspecs.spec import builtin_spec_inputs

        outputs = {"db export": args.file}
        refuse_outputs_over_inputs(outputs, builtin_spec_inputs(), DatabaseError, "aotune")
    with open_db(args, create=False) as db:
        if command == "export":
            from aotune.search.cached import import_refusal, specs_by_hash

            specs = specs_by_hash()
            n, left_out = db.export_jsonl(
                Path(args.file), force=args.force, refusal=lambda r: import_refusal(r, specs)
            )
            print(f"exported {_records(n)} from {db.path} to {args.file}")
            if left_out:  # one of them would make 'db import' refuse the whole file
                print(
                    f"left out {_records(len(left_out))} that 'db import' would refuse (the "
                    f"database keeps them; 'tune --retune' searches such a workload again):"
                )
                for why in left_out[:5]:
                    print(f"  {why}")
                if len(left_out) > 5:
                    print(f"  and {len(left_out) - 5} more")
            return 0
        if command == "show":
            rec = db.get(args.id)
            if args.json:
                print(json_text({"id": rec.id, **rec.as_dict()}, indent=1))
                return 0
            line = _record_line(rec, named_spec_hashes({rec.target}))
            print(f"record {rec.id}: {line['workload']}")
            print(f"  target {rec.target} (spec {rec.spec_hash}), model {rec.model_version}")
            if line["target_loads_this_spec"] is False:
                print(f"  {_not_named_spec(rec.target)}")
            print(
                f"  searched in {rec.search_seconds:.1f} s on {line['created']}, options "
                f"{rec.options}"
            )
            for c in rec.candidates:
                meas = (
                    f", measured {c.measured_seconds * 1e3:.3f} ms "
                    f"({({True: 'correct', False: 'WRONG'}).get(c.correct, 'not checked')})"
                    if c.measured_seconds is not None
                    else ""
                )
                cfg = ",".join(f"{k}={_config_label(k, v)}" for k, v in c.config.items())
                print(
                    f"  #{c.rank} {cfg}: predicted {c.predicted_seconds * 1e3:.3f} ms "
                    f"({c.bottleneck}){meas}"
                )
            return 0
        records = list(db.all())
        named = named_spec_hashes({r.target for r in records})
        lines = [_record_line(r, named) for r in records]
        if args.json:
            print(json_text({"database": str(db.path), "records": lines}, indent=1))
            return 0
        print(
            f"{printable(str(db.path))}: {_records(len(lines))} (spec and model: short hashes; "
            "'db show ID')"
        )
        others = sorted({ln["target"] for ln in lines if ln["target_loads_this_spec"] is False})
        for ln in lines:
            meas = (
                f"{ln['measured_seconds'] * 1e3:.3f} ms"
                if ln["measured_seconds"] is not None
                else "-"
            )
            # records of one name differ by the spec's content or the model: both, shortened
            version, _, code = ln["model_version"].rpartition("+")
            model = f"{version}+{code[:8]}" if version else code[:8]
            mark = "*" if ln["target_loads_this_spec"] is False else " "
            print(
                f"{ln['id']:>5}  {ln['created']}  {ln['target']:<14} spec {ln['spec_hash'][:8]}"
                f"{mark} model {model:<14}  pred {ln['predicted_seconds'] * 1e3:9.3f} ms  "
                f"meas {meas:>10}  {ln['workload']}"
            )
        if others:
            print(f"* {_not_named_spec(', '.join(others))}")
    return 0


def _not_named_spec(names: str) -> str:
    """Why a record kept under a target's name is not the spec that name loads today."""
    return (
        f"its spec is not the one --target {names} loads here today (a copy or calibration "
        "kept under that name, an earlier version of it, or another machine's host): tune "
        "reuses it only with the spec it was made for"
    )
