"""The ``aotune`` command line.

Every AotuneError becomes one line ``error: ...`` on stderr and a non-zero exit (2; ``validate``
exits 1 for a config that breaks constraints). Tables and progress go through rich; ``--json``
prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import math
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aotune import __version__, machine_load
from aotune.artifact.commands import (
    add_build_parser,
    add_db_flags,
    add_db_parser,
    cmd_build,
    cmd_db,
    command_inputs,
    open_db,
)
from aotune.errors import AotuneError, ConfigError, DatabaseError, UnsatisfiableError
from aotune.files import (
    check_writable,
    file_identity,
    has_control_character,
    json_text,
    non_utf8_byte,
    printable,
    refuse_outputs_over_inputs,
    write_new_file,
)
from aotune.files import output_console as _console
from aotune.search.options import LIMITS, SearchOptions

if TYPE_CHECKING:
    from aotune.hwspecs.spec import HwSpec
    from aotune.search.driver import TuneResult

EXIT_ERROR = 2
SEED_LIMIT = LIMITS["seed"]
EXIT_INVALID = 1


class Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line, like every other aotune error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        extra = message.partition("unrecognized arguments: ")[2].split()
        spec = next((a for a in extra if "->" in a), None)
        if spec:  # argparse takes the optional spec only right after the operator
            message = (
                f"{spec!r} looks like an einsum spec, which goes right after the operator "
                f"einsum (einsum '{spec}' --dims ...); other operators take none"
            )
        sys.stderr.write(f"error: {_one_line(message)} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_ERROR)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """argparse's, but arguments left over are reported by the subcommand that was given,
        so the hint names its help (`aotune tune --help`), not the top level's."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self._chosen_subcommand(parsed).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _chosen_subcommand(self, parsed: argparse.Namespace) -> Parser:
        """The innermost parser of the subcommands named in `parsed` (self if none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, Parser):
                    return chosen._chosen_subcommand(parsed)
        return self

    def _print_message(self, message: str, file: Any = None) -> None:
        """argparse's, without its silence on a failed write: help printed to a full disk is an
        error, not a success."""
        if message:
            (file or sys.stderr).write(message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """argparse's, but an option that takes one value given twice with different values is
        an error (argparse keeps the last one silently)."""
        argv = list(sys.argv[1:] if args is None else args)
        given: dict[argparse.Action, str] = {}
        for i, token in enumerate(argv):
            if token == "--":
                break
            name, eq, value = token.partition("=")
            if not token.startswith("--") and token[:2] in self._option_string_actions:
                name, eq, value = token[:2], token[2:], token[2:]  # -o x, or -ox
            action = self._option_string_actions.get(name) if token.startswith("-") else None
            if type(action) is not argparse._StoreAction:  # append, flags, subcommands: fine
                continue
            value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if given.setdefault(action, value) != value:
                self.error(f"{name} given twice ({given[action]} and {value}); give it once")
        return super().parse_known_args(argv, namespace)


def _int_arg(text: str) -> int:
    """An integer option in ASCII digits (argparse's int() also takes other scripts' digits)."""
    # each option's own check states its range; only a number too long to read stops here
    if re.fullmatch(r"\s*-?[0-9]{401,}\s*", text):
        digits = text.strip().lstrip("-")
        raise argparse.ArgumentTypeError(f"{digits[:8]}... ({len(digits)} digits) is too large")
    if not re.fullmatch(r"\s*-?[0-9]{1,400}\s*", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer in digits 0-9")
    return int(text)


def _seconds_arg(text: str) -> float:
    """A positive, finite number of seconds, at most an hour, in ASCII digits (float() also
    takes other scripts' digits, which the integer options refuse)."""
    try:
        if not text.isascii():
            raise ValueError
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.0 < value <= 3600.0:
        raise argparse.ArgumentTypeError(f"{text!r} seconds: give a number in (0, 3600]")
    return value


def _add_problem_args(p: argparse.ArgumentParser, op_optional: bool = False) -> None:
    p.add_argument(
        "op",
        nargs="?" if op_optional else None,
        default="matmul",
        help="operator: matmul, batch_matmul, dense, conv2d, depthwise_conv2d or einsum",
    )
    p.add_argument(
        "spec", nargs="?", default=None, help='einsum only: the contraction, e.g. "bij,bjk->bik"'
    )
    p.add_argument(
        "--shape",
        default=None,
        help="sizes: matmul/dense M x N x K (e.g. 1024x1024x1024), batch_matmul B x M x N x K, "
        "conv2d N,C,H,W,K,R,S, depthwise_conv2d N,C,H,W,R,S",
    )
    p.add_argument(
        "--dims", default=None, help="einsum only: size of each index, e.g. b=8,i=256,j=256,k=256"
    )
    p.add_argument("--bias", action="store_true", help="dense only: add a bias vector of length N")
    p.add_argument(
        "--activation", default="none", help="dense only: relu, gelu (tanh form), sigmoid or none"
    )
    p.add_argument(
        "--stride",
        type=_int_arg,
        default=None,
        help="convolutions: step between output pixels (default 1)",
    )
    p.add_argument(
        "--pad",
        type=_int_arg,
        default=None,
        help="convolutions: zeros on each side of H and W (default 0)",
    )
    p.add_argument(
        "--dilation",
        type=_int_arg,
        default=None,
        help="convolutions: step between kernel taps (default 1)",
    )
    p.add_argument(
        "--groups",
        type=_int_arg,
        default=None,
        help="conv2d: channel groups dividing C and K (default 1)",
    )
    p.add_argument(
        "--layout",
        default=None,
        help="convolutions: NCHW (default) or NHWC, for input, weights and output",
    )
    p.add_argument(
        "--target", default="host", help="hwspec name, path to a .toml, or 'host' (default)"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = Parser(
        prog="aotune", description="Ahead-of-time kernel tuning without measurement in the loop."
    )
    parser.add_argument("--version", action="version", version=f"aotune {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    t = sub.add_parser("tune", help="search, rank statically, and verify the top-k on this host")
    _add_problem_args(t, op_optional=True)
    t.add_argument("--top-k", type=_int_arg, default=3, help="candidates to verify (default 3)")
    t.add_argument("--seed", type=_int_arg, default=0)
    t.add_argument("--strategy", default="cga", help="cga (default) or random")
    t.add_argument(
        "--budget",
        type=_int_arg,
        default=SearchOptions.budget,
        help="configs scored by the cheap estimate",
    )
    t.add_argument("--no-verify", action="store_true", help="skip the final check")
    t.add_argument("--emit-asm", metavar="FILE", help="write the best kernel's assembly to FILE")
    t.add_argument("--emit-ir", metavar="FILE", help="write the best kernel's LLVM IR to FILE")
    t.add_argument("--emit-ptx", metavar="FILE", help="GPU targets: write the best kernel's PTX")
    t.add_argument(
        "--emit-cubin", metavar="FILE", help="GPU targets: write the best kernel's cubin (ptxas)"
    )
    t.add_argument("--force", action="store_true", help="overwrite existing --emit-* files")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    add_db_flags(t)
    s = sub.add_parser(
        "space", help="show decision variables, constraints and the number of valid configs"
    )
    _add_problem_args(s)
    s.add_argument(
        "--count-seconds", type=_seconds_arg, default=10.0, help="time limit for exact counting"
    )
    s.add_argument("--json", action="store_true")
    v = sub.add_parser("validate", help="check a config against every constraint")
    _add_problem_args(v)
    v.add_argument("--config", required=True, help="e.g. mr=8,nr=32,kc=128,...")
    v.add_argument("--json", action="store_true")
    pr = sub.add_parser("predict", help="predicted time of a config with its breakdown")
    _add_problem_args(pr)
    pr.add_argument("--config", required=True)
    pr.add_argument("--json", action="store_true")
    hw = sub.add_parser("hw", help="hardware specs")
    hw_sub = hw.add_subparsers(dest="hw_command", parser_class=Parser)
    hw_sub.add_parser("list", help="list known targets")
    show = hw_sub.add_parser("show", help="show one target")
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    cal = hw_sub.add_parser(
        "calibrate", help="measure this machine once (about 2 minutes) and write its spec file"
    )
    cal.add_argument(
        "-o", "--output", metavar="FILE", help="write the spec to FILE (without it: print it)"
    )
    cal.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    cal.add_argument("--name", help="the spec's name (default: FILE's name without .toml)")
    cal.add_argument(
        "--json", action="store_true", help="print the values, their origins and the readings"
    )
    cal.add_argument(
        "--repeat",
        type=_int_arg,
        default=1,
        metavar="N",
        help="calibrate N times and keep each measured value's median: on a shared machine one "
        "run's probe can catch a neighbour's burst (default 1)",
    )
    b = sub.add_parser("bench", help="run the benchmark suite")
    b.add_argument("--quick", action="store_true", help="a subset in under 2 minutes")
    b.add_argument("--json", action="store_true")
    b.add_argument(
        "--samples",
        type=_int_arg,
        default=None,
        help="configs measured per workload for model accuracy (default 64; 32 with --quick)",
    )
    b.add_argument(
        "--library",
        action="store_true",
        help="only the library rows: kernels built by 'aotune build' and called through "
        "aotune.load, against the speed 'tune' measured",
    )
    b.add_argument(
        "--gpu-only",
        action="store_true",
        help="only the GPU rows (predicted for a100 and h100; no host timing)",
    )
    b.add_argument(
        "--only",
        default=None,
        help="one group of rows: matmul, operators, unseen (shapes the model was not developed "
        "on) or gpu",
    )
    b.add_argument(
        "--target",
        default="host",
        help="the spec host kernels are tuned and predicted with: host (default) or a calibrated "
        "spec file of this machine",
    )
    add_build_parser(sub, _int_arg)
    add_db_parser(sub)
    acc = sub.add_parser(
        "accuracy",
        help="score the model: against kernels timed on a GPU (--measured FILE), or by sampling, "
        "measuring and predicting kernels on this host",
    )
    _add_problem_args(acc, op_optional=True)
    # no --target: host for the host's workloads, the file's own GPU for --measured
    acc.set_defaults(op=None, target=None)
    acc.add_argument(
        "--measured",
        metavar="FILE",
        help="a Kernel Tuner cache file (plain or gzipped) of CLBlast's Xgemm timed on a GPU; "
        "without --target, the built-in spec of the GPU the file names",
    )
    acc.add_argument(
        "--sample",
        type=_int_arg,
        default=None,
        help="kernels predicted by tier 2 for the correlations (--measured; default 1000), or "
        "configs measured on this host (default 64)",
    )
    acc.add_argument(
        "--candidates",
        type=_int_arg,
        default=None,
        help="--measured: tier-1 best kernels tier 2 re-ranks for the top-k picks (default 320)",
    )
    acc.add_argument(
        "--config",
        action="append",
        default=None,
        help="time this config side by side with its prediction instead of a sample (repeat it "
        "for more); each line shows the model's terms",
    )
    acc.add_argument("--seed", type=_int_arg, default=0, help="seed of the sample (default 0)")
    acc.add_argument("--plot", metavar="FILE", help="--measured: write predicted vs measured (PNG)")
    acc.add_argument("--force", action="store_true", help="overwrite an existing --plot file")
    acc.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


# a final check whose kernels' predicted runs add up to this is announced off a terminal
SLOW_CHECK_SECONDS = 2.0


def _gflops_text(gflops: float) -> str:
    """GFLOP/s as the tables show them: one decimal, or three significant digits below 1 (a tiny
    problem's rate is not 0.0)."""
    return f"{gflops:.1f}" if gflops >= 1.0 else f"{gflops:.3g}"


def _announce_slow_check(result: TuneResult, hw: HwSpec) -> None:
    """One line on stderr before a final check on this CPU whose kernels the model expects to
    run for seconds, so a long check off a terminal (where no bar shows) is not silent. (An
    emulated check's time is the emulator's, which the model does not predict.)"""
    from aotune.codegen.runner import FINAL_CHECK_ROUNDS, MIN_TIMED_RUNS
    from aotune.hwspecs.host import host_can_run

    if hw.kind != "cpu" or not host_can_run(hw)[0]:
        return
    # each kernel: a checked call, then per round a warm-up call and its timed runs
    calls = 1 + FINAL_CHECK_ROUNDS * (1 + MIN_TIMED_RUNS)
    seconds = [c.prediction.seconds for c in result.candidates]
    expected = calls * sum(s for s in seconds if math.isfinite(s))
    if expected >= SLOW_CHECK_SECONDS:
        _progress_log()(
            f"[tune] final check: running {len(seconds)} kernels beside numpy, about "
            f"{expected:.0f} s of kernel runs predicted (numpy's runs come on top)"
        )


def _progress_log() -> Callable[[str], None]:
    """Prints progress lines on stderr as written: their "[bench]" tags and install hints such
    as 'aotune[gpu]' are text, not rich markup."""
    err = _console(stderr=True)
    return lambda line: err.print(line, markup=False)


def _problem(args: argparse.Namespace) -> tuple[Any, Any]:
    from aotune.analysis.workload import build_workload
    from aotune.hwspecs.spec import load_target

    w = build_workload(
        args.op,
        args.shape,
        spec=args.spec,
        dims=args.dims,
        bias=args.bias,
        activation=args.activation,
        stride=args.stride,
        pad=args.pad,
        dilation=args.dilation,
        groups=args.groups,
        layout=args.layout,
    )
    return w, load_target(args.target)


def _space(args: argparse.Namespace) -> Any:
    from aotune.targets import target_for

    w, hw = _problem(args)
    return target_for(hw).build_space(w)


def _labeled(space: Any, cfg: Any) -> dict[str, Any]:
    return {n: (space.var(n).label(v) if space.var(n).labels else v) for n, v in cfg.items}


def _refuse_emits_over_inputs(args: argparse.Namespace, emits: dict[str, str]) -> None:
    """A ConfigError where an --emit-* file is what the command reads (its tuning database or
    its --target spec file): --force replaces earlier output, never the command's own inputs."""
    for name, path in emits.items():
        if path == "-":
            raise ConfigError(f"--emit-{name} -: give a file name (the code is not printed)")
    outputs = {f"--emit-{name}": path for name, path in emits.items()}
    refuse_outputs_over_inputs(outputs, command_inputs(args), ConfigError)


def _write_new(path: str, text: str | bytes, force: bool) -> None:
    write_new_file(path, text, force, ConfigError)


def cmd_tune(args: argparse.Namespace) -> int:
    """``aotune tune``."""
    from aotune.search import cached, driver
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    w, hw = _problem(args)
    options = SearchOptions(
        strategy=args.strategy,
        seed=args.seed,
        budget=args.budget,
        top_k=args.top_k,
        compile_top=max(16, args.top_k),
    )
    from aotune.targets import spec_origin_lines, target_for

    target = target_for(hw)
    emits = {
        name: path
        for name in ("asm", "ir", "ptx", "cubin")
        if (path := getattr(args, f"emit_{name}", None)) is not None
    }
    if args.force and not emits:
        raise ConfigError("--force lets an --emit-* option replace its file, and none is given")
    # the same file however it is spelt (./F, an absolute path, a symlink to it, a hard link)
    seen: dict[object, str] = {}
    for name, path in emits.items():
        first = seen.setdefault(file_identity(path), name)
        if first != name:
            raise ConfigError(
                f"--emit-{first} {emits[first]} and --emit-{name} {path} name the same file; "
                "give each its own"
            )
    _refuse_emits_over_inputs(args, emits)
    for name, path in emits.items():
        if name not in target.emit():
            others = ", ".join(f"--emit-{n}" for n in target.emit())
            raise ConfigError(f"--emit-{name} does not apply to {hw.kind} targets; use {others}")
        check_writable(path, args.force, ConfigError)
    if not args.no_verify and driver.can_verify(hw)[0]:  # before the search, not after it
        target.check_final_check_memory(w, options.top_k)
    err = _console(stderr=True)
    with Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=args.json or not err.is_terminal,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            label = {
                "search": "searching (no runs)",
                "compile": "compiling top configs",
                "verify": "final check",
            }[stage]
            if stage not in tasks:
                tasks[stage] = bar.add_task(label, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        db = open_db(args)
        try:
            result, record, reused = cached.tune(w, hw, options, db, args.retune, progress)
            ok, why = driver.can_verify(hw)
            verified, numpy_gflops = ([], None)
            shared = None  # what others used of the machine while the final check timed
            if ok and not args.no_verify:
                if bar.disable and not args.json:  # no bar shows it: a long check says so
                    _announce_slow_check(result, hw)
                use_before = machine_load.cpu_use()
                verified, numpy_gflops = driver.verify(result, seed=args.seed, progress=progress)
                if numpy_gflops is not None:  # timed here beside numpy, not emulated
                    shared = machine_load.sharing(use_before, machine_load.cpu_use())
                if db is not None and record is not None:
                    try:
                        cached.store_check(db, record, verified, numpy_gflops)
                    except DatabaseError as e:  # a stored record reused from a read-only file
                        sys.stderr.write(f"warning: the final check's times were not kept: {e}\n")
        finally:
            if db is not None:
                db.close()
    best = result.best
    for name, path in emits.items():
        _write_new(path, target.emit()[name](best.kernel), args.force)
    top = target.candidate_report(result.candidates, seed=args.seed, emulate=not args.no_verify)
    pick = driver.chosen(verified)
    blas = None
    if numpy_gflops is not None and target.kind == "cpu":  # numpy timed: what it ran on
        from aotune.codegen.numpy_blas import numpy_blas
        from aotune.hwspecs.host import other_core_warning

        blas = numpy_blas()
        warning = blas.warning(hw.isa.vector_bits)
        if warning:
            sys.stderr.write(f"warning: {warning}\n")
        other_core = other_core_warning(hw, "the measured column times")
        if other_core:
            sys.stderr.write(f"warning: {other_core}\n")
    shared_warning = shared and shared.warning(
        f"during the final check ({shared.seconds:.0f} s)",
        "its times may read slow; numpy was timed beside them, so the ratio holds better",
    )
    if shared_warning:
        sys.stderr.write(f"warning: {shared_warning}\n")
    skipped = "--no-verify given" if args.no_verify else (None if ok else why)
    shortfall = driver.top_k_shortfall(result)
    doc = {
        "workload": {
            "op": w.op,
            "shape": w.shape_dict,
            "dtype": w.dtype,
            "flops": w.flops,
            # the order a built library's function takes them: inputs, then the output
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
                for t in (
                    *(w.tensor(a.tensor) for a in w.statement.inputs),
                    w.tensor(w.statement.output.tensor),
                )
            ],
            # what else sets the kernel, which the sizes and tensors do not say: a convolution's
            # parameters, a dense layer's epilogue (none: bias false, activation "none")
            **({"conv": dataclasses.asdict(w.conv)} if w.conv else {}),
            **({"epilogue": dataclasses.asdict(w.epilogue)} if w.op == "dense" else {}),
        },
        "database": {
            "path": None if db is None else str(db.path),
            "record": None if record is None else record.id,
            "reused": reused,
        },
        "target": target.describe(),
        "search": {
            "strategy": options.strategy,
            "seconds": round(result.search_seconds, 3),
            "candidates_scored": result.candidates_scored,
            "kernels_compiled": result.kernels_compiled,
            "measurements": result.measurements,
            "seed": options.seed,
            "top_k": options.top_k,
            "top_k_shortfall": shortfall,
        },
        "best": {
            "config": _labeled(result.space, best.config),
            "predicted_seconds": best.prediction.seconds,
            "bottleneck": best.prediction.bottleneck,
            "breakdown": dict(best.prediction.breakdown),
            # what --emit-* wrote of it: {"asm": "k.s"}; {} where nothing was asked
            "emitted": dict(emits),
        },
        "verify": [
            {
                "rank": v.candidate.rank,
                "config": _labeled(result.space, v.candidate.config),
                "predicted_seconds": v.candidate.prediction.seconds,
                "measured_seconds": v.measurement.seconds,
                "gflops": v.gflops,
                "correct": v.measurement.correct,
                "max_abs_error": v.measurement.max_abs_error,
                "tolerance": v.measurement.tolerance,
                "runs": v.measurement.runs,
                "spread": v.measurement.spread,
            }
            for v in verified
            if not v.emulated
        ]
        + [_emulated_entry(result.space, v) for v in verified if v.emulated],
        "verify_skipped": skipped,
        "verify_note": _emulated_note(verified),
        "numpy_gflops": numpy_gflops if target.kind == "cpu" else None,
        "numpy_blas": blas.as_dict() if blas else None,
        "verify_sharing": shared.as_dict() if shared else None,
        "baseline": {"name": target.baseline_name, "gflops": numpy_gflops},
        "chosen": _chosen_entry(pick, numpy_gflops, target.kind),
    }
    if top is not None:
        doc["top"] = [{**t, "config": _labeled(result.space, c.config)}
                      for t, c in zip(top, result.candidates)]  # fmt: skip
    if args.json:
        print(json_text(doc, indent=1))
        return 0 if (pick or skipped) else EXIT_ERROR
    from rich.markup import escape

    out = _console()
    what = doc["target"].get("isa") or f"{doc['target'].get('sm')}, PTX ISA {hw.ptx_isa}"
    out.print(f"[bold]{escape(w.describe())}[/] on [bold]{hw.name}[/] ({what})")
    for line in spec_origin_lines(hw):
        out.print(escape(line))
    if reused:
        out.print(
            f"search: reused record {record.id} of {printable(str(db.path))} (searched earlier in "
            f"{result.search_seconds:.1f} s); --retune searches again"
        )
    else:
        out.print(
            f"search: {options.strategy}, {result.candidates_scored} configs estimated, "
            f"{result.kernels_compiled} compiled and ranked from their assembly, "
            f"{result.search_seconds:.1f} s, {result.measurements} measurements (kernel runs, "
            "counted)"
        )
    if shortfall:
        out.print(f"top-k: {escape(shortfall)}")
    table = Table(title="top candidates (predicted without running)")
    for col in ("rank", "config", "predicted", "bottleneck", "measured", "GFLOP/s", "correct"):
        table.add_column(col, overflow="fold")
    by_rank = {v.candidate.rank: v for v in verified}
    for c in result.candidates:
        v = by_rank.get(c.rank)
        table.add_row(
            str(c.rank),
            escape(result.space.describe_config(c.config)),
            f"{c.prediction.seconds * 1e3:.3f} ms",
            c.prediction.bottleneck,
            f"{v.measurement.seconds * 1e3:.3f} ms"  # type: ignore[union-attr]
            if v and not v.emulated
            else ("emulated" if v else "-"),
            _gflops_text(v.gflops) if v and v.gflops is not None else "-",
            ("yes" if v.measurement.correct else "[red]NO[/]") if v else "-",
        )
    if top is not None:
        table = Table(title="top candidates (predicted without running; resources from ptxas)")
        cols = ["rank", "config", "predicted", "TFLOP/s", "of peak", "bottleneck", "regs",
                "spill B", "smem B", "blocks/SM", "waves", "emulated"]  # fmt: skip
        timed = any(not v.emulated for v in verified)  # checked on the GPU itself
        for col in cols + (["measured", "TFLOP/s meas.", "correct"] if timed else []):
            table.add_column(col, overflow="fold")
        for t, c in zip(top, result.candidates):
            r = t["resources"]
            e = t["emulated"]
            v = by_rank.get(c.rank)
            on_device = (
                [
                    f"{v.measurement.seconds * 1e3:.3f} ms",
                    f"{v.gflops / 1e3:.1f}",
                    "yes" if v.measurement.correct else "[red]NO[/]",
                ]
                if timed and v is not None and v.gflops is not None
                else (["-"] * 3 if timed else [])
            )
            table.add_row(
                str(c.rank),
                escape(result.space.describe_config(c.config)),
                f"{c.prediction.seconds * 1e3:.3f} ms",
                f"{t['predicted_tflops']:.1f}",
                f"{t['peak_fraction']:.0%}",
                c.prediction.bottleneck,
                str(r["registers"]),
                str(r["spill_bytes"]),
                str(r["shared_bytes"]),
                str(r["blocks_per_sm"]),
                str(r["waves"]),
                "-"
                if e is None
                else ("correct" if e["correct"] else "[red]WRONG[/]")
                + f" ({e['blocks_checked']}/{e['blocks_total']} blocks)",
                *on_device,
            )
    out.print(table)
    if top is not None and any(t["emulated"] and not t["emulated"]["correct"] for t in top):
        out.print("[red]a top candidate failed the emulated numpy check[/]")
        return EXIT_ERROR
    if skipped:
        out.print(f"final check skipped: {skipped}")
    elif pick and pick.emulated:
        from aotune.codegen.emulate import WHY_NO_TIME

        out.print(
            f"final check under {pick.measurement.emulator}: "
            f"{sum(v.measurement.correct for v in verified)} of {len(verified)} correct vs numpy; "
            f"chosen rank {pick.candidate.rank}, the best predicted correct one\n"
            f"(no times: {WHY_NO_TIME})"
        )
    elif pick and numpy_gflops and blas is not None:
        out.print(
            f"numpy (same run, {blas.library} {blas.kernel} kernel on {blas.threads} threads): "
            f"{_gflops_text(numpy_gflops)} GFLOP/s; chosen rank {pick.candidate.rank}: "
            f"{_gflops_text(pick.gflops)} GFLOP/s = {pick.gflops / numpy_gflops:.2f}x numpy"
        )
    elif pick and pick.gflops is not None:  # a GPU: timed on the device
        versus = (
            f"; {target.baseline_name}: {_gflops_text(numpy_gflops)} GFLOP/s, "
            f"{pick.gflops / numpy_gflops:.2f}x"
            if numpy_gflops
            else f" (no {target.baseline_name} baseline: a plain GEMM and cupy are needed)"
        )
        out.print(
            f"final check on the GPU: {sum(v.measurement.correct for v in verified)} of "
            f"{len(verified)} correct vs numpy; chosen rank {pick.candidate.rank}: "
            f"{_gflops_text(pick.gflops)} GFLOP/s measured{versus}"
        )
    else:
        out.print("[red]no candidate passed the numpy check[/]")
        return EXIT_ERROR
    for name, path in emits.items():
        out.print(f"{name} of rank 1 written to {path}")
    return 0


def _chosen_entry(pick: Any, baseline_gflops: float | None, kind: str) -> dict[str, Any] | None:
    """The JSON ``chosen`` block: the picked rank, its measured GFLOP/s and its ratio to the
    baseline (numpy on a CPU, cuBLAS on a GPU), or the emulated pick's entry."""
    if pick is None or pick.gflops is None:
        return _emulated_chosen(pick)
    ratio = pick.gflops / baseline_gflops if baseline_gflops else None
    entry = {"rank": pick.candidate.rank, "gflops": pick.gflops, "ratio_vs_baseline": ratio}
    if kind == "cpu":
        entry["ratio_vs_numpy"] = ratio
    return entry


def _emulated_entry(space: Any, v: Any) -> dict[str, Any]:
    """A ``verify`` entry of a kernel checked under emulation: correctness, no time."""
    return {
        "rank": v.candidate.rank,
        "config": _labeled(space, v.candidate.config),
        "predicted_seconds": v.candidate.prediction.seconds,
        "correct": v.measurement.correct,
        "max_abs_error": v.measurement.max_abs_error,
        "tolerance": v.measurement.tolerance,
        "emulated": True,
        "emulator": v.measurement.emulator,
    }


def _emulated_note(verified: list[Any]) -> str | None:
    """Why emulated checks carry no time (None when the check ran natively)."""
    from aotune.codegen.emulate import WHY_NO_TIME

    emulators = sorted({v.measurement.emulator for v in verified if v.emulated})
    return f"checked under {', '.join(emulators)}: {WHY_NO_TIME}" if emulators else None


def _emulated_chosen(pick: Any) -> dict[str, Any] | None:
    """The chosen kernel of an emulated check: the best predicted correct one, not timed."""
    if pick is None or not pick.emulated:
        return None
    return {
        "rank": pick.candidate.rank,
        "predicted_seconds": pick.candidate.prediction.seconds,
        "by": "prediction (emulated check: correctness only)",
    }


def cmd_space(args: argparse.Namespace) -> int:
    """``aotune space``."""
    from aotune.targets import spec_origin_lines, target_for

    space = _space(args)
    n, exact = space.count(time_limit=args.count_seconds)
    # an empty space is an answer, not an error; it names the constraints that leave no room
    empty_because = space.empty_space_message() if exact and n == 0 else None
    if args.json:
        print(
            json_text(
                {
                    "space": space.title,
                    "target": target_for(space.hw).describe(),
                    "variables": [
                        {"name": v.name, "domain": v.domain_text(), "description": v.description}
                        for v in space.variables
                    ],
                    "constraints": [
                        {"name": c.name, "text": c.text, "when": c.when} for c in space.constraints
                    ],
                    "accesses": [
                        {
                            "tensor": t.tensor,
                            "map": t.access_map,
                            "tile_footprint": t.footprint_text(),
                            "halo": t.halo,
                        }
                        for t in space.info.tensors
                    ],
                    "count": n,
                    "exact": exact,
                    **({"empty_because": empty_because} if empty_because else {}),
                },
                indent=1,
            )
        )
        return 0
    from rich.markup import escape

    out = _console()
    out.print(f"[bold]space: {escape(space.title)}[/]")
    for line in spec_origin_lines(space.hw):
        out.print(escape(line))
    out.print("decision variables:")
    for v in space.variables:
        out.print(f"  {v.name:<8} {v.domain_text():<28} {v.description}")
    out.print(
        "accesses (isl): tile footprint in elements, for a tile of T_loop iterations per loop"
    )
    for t in space.info.tensors:
        halo = [f"{lo}/{hi}" for lo, hi in t.halo]
        reach = f"; reads outside by {', '.join(halo)} per dim (zeros)" if t.reads_outside else ""
        out.print(escape(f"  {t.access_map}\n      footprint {t.footprint_text()}{reach}"))
    out.print("constraints:")
    for c in space.constraints:
        guard = f"   (when {c.when[0]} = {space.var(c.when[0]).label(c.when[1])})" if c.when else ""
        out.print(f"  {c.name:<20} {c.text}{guard}")
    qual = (
        "exactly"
        if exact
        else f"at least (enumeration stopped after {args.count_seconds:g} s; a lower bound)"
    )
    out.print(f"valid configs: {qual} {n}")
    if n == 0 and not exact:  # not an empty space: none was reached in the time given
        out.print("none found before the time ran out; give --count-seconds more to count them")
    if empty_because:
        out.print(escape(f"why none: {empty_because}"))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """``aotune validate``."""
    from aotune.targets import target_for

    space = _space(args)
    cfg = space.parse_config(args.config)
    bad = space.violations(cfg)
    # what the toolchain says beyond the constraints (a GPU kernel ptxas rejects or that spills)
    more = [] if bad else target_for(space.hw).check_config(space, cfg)
    if args.json:
        print(
            json_text(
                {"valid": not bad and not more, "violations": [v.as_dict() for v in bad],
                 "toolchain": more},
                indent=1,
            )
        )  # fmt: skip
    elif bad or more:
        print(f"invalid config for {space.title}: {len(bad) + len(more)} problem(s)")
        for v in bad:
            print(f"  - {v}")
        for text in more:
            print(f"  - {text}")
    else:
        print(
            f"valid: {space.describe_config(cfg)} satisfies all {len(space.constraints)} "
            f"constraints of {space.title}"
        )
    return EXIT_INVALID if bad or more else 0


def cmd_predict(args: argparse.Namespace) -> int:
    """``aotune predict``."""
    from aotune.targets import spec_origin_lines, target_for

    space = _space(args)
    target = target_for(space.hw)
    cfg = space.parse_config(args.config)
    sched = target.schedule(space, cfg)
    kernel = target.compile(sched)
    features = target.features(kernel)
    (pred,) = target.predict([sched], [features])
    # a kernel the toolchain found unusable (a GPU kernel that spills) is priced, and said so
    problems = target.kernel_problems(kernel)
    if not math.isfinite(pred.seconds):
        why = (
            problems[0]
            if problems
            else "one block needs more registers or shared memory than an SM of the spec has; "
            "choose smaller tiles, or check the spec's [limits] and [shared]"
        )
        raise UnsatisfiableError(
            f"{space.describe_config(cfg)} cannot launch on {space.hw.name} ({pred.bottleneck}): "
            f"{why}"
        )
    flops = space.workload.flops
    feature_data, feature_line = target.feature_summary(features)
    if args.json:
        print(
            json_text(
                {
                    **pred.as_dict(),
                    "target": target.describe(),
                    "gflops": flops / pred.seconds / 1e9,
                    "config": _labeled(space, cfg),
                    target.feature_key: feature_data,
                    "toolchain": problems,
                },
                indent=1,
            )
        )
        return 0
    print(f"{space.title}: {space.describe_config(cfg)}")
    for line in spec_origin_lines(space.hw):
        print(line)
    rate = _gflops_text(flops / pred.seconds / 1e9)
    print(f"predicted: {pred.seconds * 1e3:.3f} ms ({rate} GFLOP/s), bottleneck: {pred.bottleneck}")
    for name, sec in pred.breakdown:
        print(f"  {name:<9} {sec * 1e3:9.3f} ms")
    print(feature_line)
    for text in problems:
        print(
            f"warning: {text} (validate rejects this config; the search ranks it after every "
            "kernel that does not spill)"
        )
    return 0


def cmd_hw(args: argparse.Namespace) -> int:
    """``aotune hw list|show|calibrate``."""
    from aotune.hwspecs.spec import builtin_names, load_target

    if args.hw_command == "calibrate":
        return cmd_hw_calibrate(args)
    if args.hw_command == "show":
        spec = load_target(args.name)
        if getattr(args, "json", False):
            print(json_text(spec.to_dict(), indent=1))
            return 0
        for line in spec.summary_lines():
            print(line)
        return 0
    print("host  (" + load_target("host").description + ")")
    for name in builtin_names():
        print(f"{name:<15} {load_target(name).description}")
    return 0


def cmd_hw_calibrate(args: argparse.Namespace) -> int:
    """``aotune hw calibrate [-o FILE] [--force] [--name NAME] [--json] [--repeat N]``."""
    from aotune.hwspecs import calibrate as cal
    from aotune.hwspecs.spec_toml import value_at
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not 1 <= args.repeat <= cal.REPEAT_LIMIT:
        raise ConfigError(
            f"--repeat {args.repeat}: give 1 to {cal.REPEAT_LIMIT} runs (each takes about 2 "
            "minutes; 3 keep one noisy run out of the medians)"
        )
    name = cal.spec_name_for(args.output, args.name)
    if args.force and args.output is None:  # before minutes of measuring, not after
        raise ConfigError("--force lets -o replace its file, and no -o FILE is given")
    if args.output is not None:
        cal.check_output(args.output, args.force)
    cal.check_can_calibrate()
    err = _console(stderr=True)
    if not err.is_terminal:  # no progress bar to show: say once what the wait is for
        sys.stderr.write(
            f"hw calibrate: measuring this machine, {args.repeat} run(s) of "
            f"{len(cal.PROBES) + 1} probes (about 2 minutes each); keep it otherwise idle\n"
        )
    with Progress(
        TextColumn("{task.description:<22}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=args.json or not err.is_terminal,
    ) as bar:
        runs, steps = args.repeat, len(cal.PROBES) + 1
        task = bar.add_task("calibrating", total=runs * steps)
        results: list[cal.Calibration] = []
        for run in range(runs):

            def progress(stage: str, done: int, total: int, run: int = run) -> None:
                label = f"{run + 1}/{runs} {stage}" if runs > 1 else stage
                bar.update(
                    task, description=label, completed=run * total + done, total=runs * total
                )

            results.append(cal.calibrate(progress))
        result = cal.named(results[0] if runs == 1 else cal.median_of_runs(results), name)
    for warning in result.warnings:
        sys.stderr.write(f"warning: {warning}\n")
    text = cal.spec_text(result)
    if args.output is not None:
        cal.write_spec(result, args.output, args.force)
    if args.json:
        print(json_text({**result.as_dict(), "file": args.output}, indent=1))
    elif args.output is None:
        print(text, end="")
    else:
        for path in result.spec.field_paths():
            kind = result.origin[path].split(":", 1)[0]
            print(f"  {path:<38} {value_at(result.spec, path)!s:<14.14} {kind}")
        print(f"  core model: {result.spec.core_model_from}")
        print(
            f"wrote {printable(args.output)}, a spec named {name}: use it with --target "
            f"{shlex.quote(args.output)}"
        )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``aotune bench``."""
    from aotune.benchmarks.suite import MAX_SAMPLES, print_table, run_suite

    if args.library and args.gpu_only:
        raise ConfigError("--library and --gpu-only each choose a part of the suite; give one")
    if args.library and (args.only is not None or args.samples is not None):
        raise ConfigError(
            "--library runs the library rows only, which sample no configs; leave out --only "
            "and --samples"
        )
    if (args.gpu_only or args.only == "gpu") and args.samples is not None:
        raise ConfigError(
            "--samples sets the configs measured per host row, and the gpu group measures "
            "nothing; leave it out"
        )
    if args.samples is not None and args.samples < 5:
        raise ConfigError(
            f"--samples {args.samples}: model accuracy needs at least 5 measured configs "
            "(the top-5 score); pass --samples 5 or more"
        )
    if args.samples is not None and args.samples > MAX_SAMPLES:
        raise ConfigError(
            f"--samples {args.samples}: each config is compiled and timed per row (64 take "
            f"minutes); give at most {MAX_SAMPLES}"
        )
    if args.gpu_only and args.only not in (None, "gpu"):
        raise ConfigError(
            f"--gpu-only runs the gpu group and --only {args.only} another; give one of them"
        )
    if (args.gpu_only or args.only == "gpu" or args.library) and args.target != "host":
        raise ConfigError(
            f"--target {args.target} sets the spec of the host rows, and "
            f"{'--library' if args.library else 'the gpu group'} has none; leave it out"
        )
    if args.library:
        from aotune.benchmarks.library import print_library_table, run_library_bench

        doc = run_library_bench(args.quick, log=None if args.json else _progress_log())
        if args.json:
            print(json_text(doc, indent=1))
        else:
            print_library_table(doc, _console())
        return 0

    result = run_suite(
        quick=args.quick,
        samples=args.samples,
        log=None if args.json else _progress_log(),
        gpu_only=args.gpu_only,
        only=args.only,
        target=args.target,
    )
    if args.json:
        for warning in result.get("warnings", []):  # the log that said them is off under --json
            sys.stderr.write(f"warning: {warning}\n")
        print(json_text(result, indent=1))
    else:
        print_table(result, _console())
    return 0


def cmd_accuracy(args: argparse.Namespace) -> int:
    """``aotune accuracy``: the model against measured times (module ``benchmarks/measured.py``)."""
    from aotune.benchmarks import measured

    log = None if args.json else _progress_log()

    def warn(text: str) -> None:
        sys.stderr.write(f"warning: {_one_line(text)}\n")

    target_given = args.target is not None
    args.target = args.target if target_given else "host"
    if not 0 <= args.seed <= SEED_LIMIT:  # numpy's generators take no other seed
        raise ConfigError(f"--seed {args.seed}: give a seed in 0..{SEED_LIMIT}")
    if args.force and args.plot is None:
        raise ConfigError("--force lets --plot replace its file, and no --plot FILE is given")
    if args.config is not None:
        clashing = [
            flag
            for flag, value in (("--measured", args.measured), ("--sample", args.sample))
            if value is not None
        ]
        if clashing:
            raise ConfigError(
                f"--config times the configs given, on this host; {' and '.join(clashing)} "
                f"{'does' if len(clashing) == 1 else 'do'} something else: drop one or the other"
            )
    if args.measured is None:
        only_measured = (("--plot", args.plot), ("--candidates", args.candidates))
        given = [flag for flag, value in only_measured if value is not None]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} {'applies' if len(given) == 1 else 'apply'} to "
                "--measured FILE only (a Kernel Tuner file's configs); drop it, or give --measured"
            )
        args.op = args.op or "matmul"
        w, hw = _problem(args)
        if args.config is not None:
            timed = measured.host_configs(w, hw, args.config, args.seed, log, warn=warn)
            if args.json:
                print(json_text(timed, indent=1))
            else:
                for line in measured.config_lines(timed):
                    print(line)
            return 0
        sample = args.sample if args.sample is not None else 64
        result = measured.host_accuracy(w, hw, sample, args.seed, log, warn=warn)
        if args.json:
            print(json_text(result, indent=1))
        else:
            for key, value in result.items():
                print(f"{key:<17} {value}")
        return 0
    if not args.measured.strip():  # Path("") is the working directory
        raise ConfigError("--measured is an empty file name; name a Kernel Tuner cache file")
    given = [
        f"--{k}"
        for k in ("dims", "stride", "pad", "dilation", "groups", "layout")
        if getattr(args, k) is not None
    ] + (["--bias"] if args.bias else [])
    given += [f"--activation {args.activation}"] if args.activation != "none" else []
    if args.op is not None or args.spec is not None or given:
        raise ConfigError(
            "--measured FILE scores the kernel the file measured; leave out the workload "
            f"({' '.join(filter(None, [args.op, args.spec, *given]))}); --shape MxNxK may set K"
        )
    if args.plot is not None:
        if Path(args.plot).suffix.lower() != ".png":
            raise ConfigError(f"--plot {args.plot!r}: the plot is a PNG image; name it *.png")
        inputs = {"the --measured file": args.measured, **command_inputs(args, database=False)}
        refuse_outputs_over_inputs({"--plot": args.plot}, inputs, ConfigError)
        check_writable(args.plot, args.force, ConfigError)
        measured.require_matplotlib()
    shape = None
    if args.shape is not None:  # read as every command reads a matmul's shape
        from aotune.analysis.workload import parse_shape

        shape = tuple(parse_shape(args.shape, ("M", "N", "K")).values())
    result = measured.measured_accuracy(
        args.measured,
        args.target if target_given else None,
        sample=args.sample if args.sample is not None else measured.DEFAULT_SAMPLE,
        candidates=args.candidates if args.candidates is not None else measured.DEFAULT_CANDIDATES,
        seed=args.seed,
        shape=shape,
        log=log,
        warn=warn,
    )
    if args.plot:
        measured.write_plot(result, args.plot, args.force)
    if args.json:
        print(json_text(result.as_json(), indent=1))
    else:
        for line in measured.report_lines(result):
            print(line)
    return 0


def _join_values(argv: list[str]) -> list[str]:
    """``--shape -3x4x4`` -> ``--shape=-3x4x4``: a value starting with '-' is still a value, so the
    user gets the shape error rather than argparse's 'expected one argument'."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if (
            argv[i] in ("--shape", "--config", "--dims")
            and i + 1 < len(argv)
            and not argv[i + 1].startswith("--")  # the next option: this one's value is missing
        ):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


COMMANDS = {
    "tune": cmd_tune,
    "space": cmd_space,
    "validate": cmd_validate,
    "predict": cmd_predict,
    "hw": cmd_hw,
    "bench": cmd_bench,
    "build": cmd_build,
    "db": cmd_db,
    "accuracy": cmd_accuracy,
}


EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug of aotune's, not the user's input
_running_command = False
# set by Ctrl-C: an error that follows it (an extension module whose import it broke, a compiler
# child process it killed) is the interrupt, not a failure of its own
_interrupt_seen = False
# the signal that stopped the command: SIGTERM (``kill``, a job scheduler's time limit) or SIGHUP
# (its terminal closed) unwinds as Ctrl-C does, so a build's staging folder and temporary files
# go; it exits 128 + its number
_interrupt_signal = signal.SIGINT
_STOPPED_LINE = {
    signal.SIGINT: "interrupted",
    signal.SIGTERM: "terminated",
    signal.SIGHUP: "hung up (its terminal closed)",
}


def stopped_how() -> str:
    """How the running command was stopped ("interrupted", "terminated", "hung up ..."), for a
    command that reports its own stop."""
    return _STOPPED_LINE.get(_interrupt_signal, "interrupted")


def _on_sigint(signum: int, frame: Any) -> None:
    """Ctrl-C or SIGTERM: inside a command, unwind (KeyboardInterrupt, so temporary files are
    removed); before or after one (imports, interpreter exit), stop at once with one line."""
    global _interrupt_seen, _interrupt_signal
    if _running_command:
        _interrupt_seen = True
        _interrupt_signal = signal.Signals(signum)
        if _inside_an_import(frame):
            # raised inside an extension module's import (islpy's nanobind enums) it aborts the
            # process; sent again a moment later, it lands once the import is done
            _send_again_if_interrupt(KeyboardInterrupt)
            return
        raise KeyboardInterrupt
    os.write(2, f"error: {_STOPPED_LINE.get(signum, 'interrupted')}\n".encode())
    os._exit(128 + signum)


def _inside_an_import(frame: Any) -> bool:
    """Whether ``frame`` runs under a module's import (an importlib frame below it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_unraisable(unraisable: Any) -> None:
    """An exception Python cannot raise (in ``__del__``, or one an extension module swallows):
    an interrupt that lands there is sent again, to be raised where it can stop the command; after
    one, what the unwinding leaves half made (an object cut off in its constructor) is not news."""
    if _interrupt_seen:
        _send_again_if_interrupt(unraisable.exc_type)
        return
    sys.__unraisablehook__(unraisable)


def _on_reported(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
    """An exception an extension module reports instead of raising (islpy prints one raised in
    its callbacks through ``sys.excepthook``, then fails the isl call): an interrupt that lands
    there is not news after it was seen; it is sent again, as from ``_on_unraisable``."""
    if _interrupt_seen and issubclass(exc_type, KeyboardInterrupt):
        _send_again_if_interrupt(exc_type)
        return
    sys.__excepthook__(exc_type, exc, tb)


def _send_again_if_interrupt(exc_type: type[BaseException]) -> None:
    """An interrupt lost where it could not be raised, during a command: sent again (a thread
    sends it a moment later)."""
    if _running_command and issubclass(exc_type, KeyboardInterrupt):
        threading.Thread(target=_send_lost_interrupt_again, daemon=True).start()


def _send_lost_interrupt_again() -> None:
    """(A thread) The interrupt again, a moment later: raised here it would be lost in the hook
    once more; should it land in another finalizer, the hook sends it again."""
    time.sleep(0.05)
    if _running_command:
        os.kill(os.getpid(), _interrupt_signal)


def _stopped(argv: Sequence[str] | None) -> int:
    """The end of a command stopped by a signal, status 128 + its number (130 for Ctrl-C, 143 for
    SIGTERM): the script ends here, so nothing finalised at exit can print or turn the status
    into a signal's; a caller in-process gets the status."""
    code = 128 + int(_interrupt_signal)
    if argv is None:
        _flush_and_exit(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aotune`` script."""
    global _running_command, _interrupt_seen, _interrupt_signal, _given_arguments
    _interrupt_seen, _interrupt_signal = False, signal.SIGINT
    _given_arguments = tuple(sys.argv[1:] if argv is None else argv)
    # also when started with SIGINT ignored (a background job): Ctrl-C must stop aotune. A
    # SIGTERM someone chose to ignore stays ignored. Called in-process with arguments (tests,
    # scripts), the caller's handlers are put back afterwards.
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _on_sigint)
        for stop in (signal.SIGTERM, signal.SIGHUP):  # a SIGHUP ignored (nohup) stays ignored
            if signal.getsignal(stop) is signal.SIG_DFL:
                previous[stop] = signal.signal(stop, _on_sigint)
    if sys.stderr is None:  # started with stderr closed (``2>&-``): errors go nowhere, codes stay
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 -- for the whole process
    previous_unraisable, previous_excepthook = sys.unraisablehook, sys.excepthook
    sys.unraisablehook, sys.excepthook = _on_unraisable, _on_reported
    _running_command = True
    try:
        if sys.stdout is None:  # started with stdout closed (``>&-``): nothing printed would show
            sys.stderr.write("error: standard output is closed; give aotune somewhere to print\n")
            return EXIT_ERROR
        code = _run(argv)
        # a command that reported its own interruption (build) exits as the signal says
        return _stopped(argv) if code == EXIT_INTERRUPTED and _interrupt_seen else code
    except KeyboardInterrupt:
        with contextlib.suppress(OSError, ValueError):  # a terminal that hung up takes no line
            sys.stderr.write(f"error: {_STOPPED_LINE.get(_interrupt_signal, 'interrupted')}\n")
        return _stopped(argv)
    finally:
        _running_command = False
        if argv is not None:
            sys.unraisablehook, sys.excepthook = previous_unraisable, previous_excepthook
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = _join_values(list(sys.argv[1:] if argv is None else argv))
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["tune", *argv]  # tune is the command run without one: its options come alone
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        if e.code in (0, None):  # --help, --version: printed, unless stdout is a full disk
            try:
                sys.stdout.flush()
            except OSError:
                return report_error()
        raise
    except OSError:  # the help or version text could not be written
        return report_error()
    if args.command == "hw" and args.hw_command is None:
        args.hw_command = "list"
    try:
        _check_places_to_work()
        _warn_shadowed_target(args, argv)
        return COMMANDS[args.command](args)
    except Exception:
        if _interrupt_seen:
            raise KeyboardInterrupt from None
        return report_error()


def _warn_shadowed_target(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """One warning line where a target the user named is also a file here that the name
    shadows (not for the default ``host``, which they did not type)."""
    from aotune.hwspecs.spec import shadowed_file_note

    typed = any(a == "--target" or a.startswith("--target=") for a in argv)
    named = args.name if args.command == "hw" and args.hw_command == "show" else None
    for name in (getattr(args, "target", None) if typed else None, named):
        note = shadowed_file_note(name) if isinstance(name, str) else None
        if note:
            sys.stderr.write(f"warning: {note}\n")


def _check_places_to_work() -> None:
    """A ConfigError now where the current folder is gone (relative paths mean nothing) or no
    temporary folder takes files (compiling and loading kernels write them), not an internal
    error after a search."""
    try:
        os.getcwd()
    except FileNotFoundError:
        raise ConfigError(
            "the current folder no longer exists (it was removed while the shell was in it); "
            "cd to a folder that exists"
        ) from None
    import tempfile

    try:
        tempfile.gettempdir()
    except FileNotFoundError:
        raise ConfigError(
            f"no temporary folder takes new files (TMPDIR={os.environ.get('TMPDIR', '')!r}, "
            "/tmp, /var/tmp, /usr/tmp and the current folder were tried); point TMPDIR at a "
            "writable folder"
        ) from None


def report_error() -> int:
    """The exception being handled as one line on stderr, and the exit code for it (a closed
    pipe and a full disk included): for every command line of aotune's."""
    try:
        raise
    except AotuneError as e:
        sys.stderr.write(f"error: {_one_line(str(e))}\n")
        return EXIT_ERROR
    except BrokenPipeError:
        # the reader went away (``aotune predict ... | head``): stop quietly, as other CLI tools do;
        # pointing stdout at devnull keeps the interpreter's exit flush from failing again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno not in _FULL_OR_FAILING_DEVICE:
            return _report_internal(e)
        # a full disk (``> /dev/full``) or a failing device: the user's to fix, not a bug
        _silence_stdout_if_failed()
        what = e.filename or "the output, or a file aotune writes on the way"
        sys.stderr.write(
            f"error: cannot write {what}: {e.strerror}; free some space or check the device, "
            "or send the output to another file\n"
        )
        return EXIT_ERROR
    except MemoryError:
        sys.stderr.write(
            "error: ran out of memory; use a smaller shape, or get the kernel without running it "
            "here (tune --no-verify; build --objects-only)\n"
        )
        return EXIT_ERROR
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:  # noqa: BLE001 -- the last resort: one line, never a traceback
        return _report_internal(e)


# what writing fails with when the disk or device is full or broken: never aotune's bug
_FULL_OR_FAILING_DEVICE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


def _silence_stdout_if_failed() -> None:
    """Where stdout cannot be written, send what it still buffers nowhere, so the interpreter's
    flush at exit does not fail again; a working stdout (a caller's) is left alone."""
    try:
        sys.stdout.flush()
    except OSError:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout with no file descriptor (a caller's StringIO)
            pass


def _report_internal(e: BaseException) -> int:
    """An exception that is aotune's bug, as one line; the exit code for it."""
    sys.stderr.write(
        f"error: internal error ({type(e).__name__}: {_one_line(str(e))[:300]}); this is a "
        "bug in aotune: please report it with the command that caused it\n"
    )
    return EXIT_INTERNAL


# a word of an error message longer than this (an operator name, a shape or a name the user
# typed at length) is shown cut, so that the message stays one readable line; a path keeps its
# two ends (where it starts, and the file it names)
LONGEST_WORD_SHOWN = 300


# the command line being run: a line break or tab inside a value given there (a path) is shown
# escaped, as typed, not joined like the lines of an LLVM or OS message
_given_arguments: tuple[str, ...] = ()
_WHITESPACE_SHOWN = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\x0b", "\f": "\\x0c"}


def _given_values_escaped(text: str) -> str:
    """``text`` with each command-line value that holds a line break or tab (and each folder of
    such a path) written with the break escaped."""
    values: set[str] = set()
    for token in _given_arguments:
        value = token.partition("=")[2] if token.startswith("--") and "=" in token else token
        for end in [i for i, c in enumerate(value) if c == "/"] + [len(value)]:
            if any(c in _WHITESPACE_SHOWN for c in value[:end]):
                values.add(value[:end])
    for value in sorted(values, key=len, reverse=True):
        text = text.replace(value, "".join(_WHITESPACE_SHOWN.get(c, c) for c in value))
    return text


def _shown_character(c: str) -> str:
    """``c`` as a message shows it: itself, or escaped where a terminal would act on it; a byte
    of a non-UTF-8 file name (Python's surrogate escape) as that byte."""
    if byte := non_utf8_byte(c):
        return byte
    if has_control_character(c):
        return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
    return c


def _one_line(text: str) -> str:
    """A message on one line (LLVM and OS messages may carry newlines), each overlong word cut
    to its two ends and its length, control characters escaped."""
    text = _given_values_escaped(text)
    line = " ".join(
        w if len(w) <= LONGEST_WORD_SHOWN else f"{w[:60]}...{w[-60:]} ({len(w)} characters)"
        for w in text.split()
    )
    # a control character left in a path (ESC, ...) or a bidirectional override is shown, not
    # sent to the terminal
    return "".join(_shown_character(c) for c in line)


if __name__ == "__main__":
    raise SystemExit(main())
