"""``aotune bench --library``: a built library's kernels against what ``aotune tune`` measured.

Per workload: tune and run the final check as ``aotune tune`` does (the chosen kernel, on the
JIT runner and the Python-side worker pool), build the library of that same config (object, the
runtime, the system's C compiler), load it with ``aotune.load``, and time the two side by side
in interleaved rounds on the same cache-line-aligned inputs. The bar (issue 24): each kernel
called through ``aotune.load`` runs within 5% of the speed ``tune`` measured for it, so
``ratio`` (library GFLOP/s over tune's) should be >= 0.95.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from aotune.analysis.workload import Workload, conv2d, dense, depthwise_conv2d, matmul
from aotune.artifact.cpu import compile_library_kernel, compile_runtime
from aotune.artifact.load import load
from aotune.benchmarks.suite import _handoff_ns
from aotune.codegen.runner import HostKernel, aligned_copy, random_operands, time_side_by_side
from aotune.errors import BuildError
from aotune.hwspecs.spec import HwSpec, load_target
from aotune.search import driver
from aotune.search.options import SearchOptions

LIBRARY_FULL: tuple[tuple[str, Workload], ...] = (
    ("matmul 512x512x512", matmul(512, 512, 512)),
    ("matmul 128x1000x4032", matmul(128, 1000, 4032)),
    ("conv2d 56x56x64->64 3x3 p1 NHWC", conv2d(1, 64, 56, 56, 64, 3, 3, pad=1, layout="NHWC")),
    ("conv2d 14x14x256->256 3x3 p1 NCHW", conv2d(1, 256, 14, 14, 256, 3, 3, pad=1)),
    (
        "depthwise 112x112x32 3x3 p1 NHWC",
        depthwise_conv2d(1, 32, 112, 112, 3, 3, pad=1, layout="NHWC"),
    ),  # fmt: skip
    ("dense 128x768->3072 +bias gelu", dense(128, 3072, 768, bias=True, activation="gelu")),
)
LIBRARY_QUICK = LIBRARY_FULL[:1] + LIBRARY_FULL[2:3]
ROUNDS, SECONDS = 6, 1.2


def _library_of(name: str, w: Workload, kernel: Any, hw: HwSpec, where: Path) -> Any:
    """The kernel's config as a one-function library in ``where``, loaded."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise BuildError("bench --library needs a C compiler (cc, gcc or clang) to link")
    obj = compile_library_kernel(name, w, kernel.schedule, hw)
    (where / f"{name}.o").write_bytes(obj.object_code)
    (where / "rt.o").write_bytes(compile_runtime(hw))
    subprocess.run(
        [cc, "-shared", "-o", "libk.so", f"{name}.o", "rt.o", "-lpthread"], cwd=where, check=True
    )
    import hashlib
    import json

    from aotune.artifact.build import MANIFEST_FORMAT

    manifest = {
        "aotune": {"format": MANIFEST_FORMAT},
        "target": {"name": hw.name, "kind": hw.kind, "arch": hw.isa.arch, "cpu_features": []},
        "shared_object": "libk.so",
        "kernels": [{"name": name, "params": [p.as_dict() for p in obj.params]}],
        "files": {"libk.so": hashlib.sha256((where / "libk.so").read_bytes()).hexdigest()},
    }
    (where / "manifest.json").write_text(json.dumps(manifest))
    return load(where)


def library_row(
    label: str,
    w: Workload,
    hw: HwSpec,
    log: Any = None,
    options: SearchOptions = SearchOptions(),
    rounds: int = ROUNDS,
    seconds: float = SECONDS,
) -> dict[str, Any]:
    """Tune ``w`` as ``aotune tune`` does, then time its chosen kernel through the runner and
    through the built library, side by side (``rounds`` interleaved rounds, ``seconds`` each)."""
    result = driver.tune(w, hw, options)
    verified, numpy_gflops = driver.verify(result)
    pick = driver.chosen(verified)
    if pick is None:
        raise BuildError(f"{label}: no candidate passed the numpy check")
    kernel = pick.candidate.kernel
    a, b, bias = random_operands(kernel.schedule)
    s = kernel.schedule
    # the library takes the workload's inputs in statement order; the runner takes (A, B)
    ins = (a, b) if s.a_is_first else (b, a)
    args = [*ins, bias] if bias is not None else list(ins)
    with tempfile.TemporaryDirectory(prefix="aotune-bench-") as tmp:
        lib = _library_of("kernel", w, kernel, hw, Path(tmp))
        fn = lib.kernel
        out = aligned_copy(np.zeros(s.shapes[2], dtype=np.float32))
        # one output buffer for both: where a thread's share of C ends within a page decides how
        # much the other core's prefetcher pulls away (see the README), so two buffers at
        # different page offsets would compare placements, not code
        host = HostKernel(kernel, hw).call_on(a, b, bias, out)
        # the vCPUs' placement changes how fast work moves between threads: probed around the timing
        handoff = [_handoff_ns(hw)]
        timed = time_side_by_side(
            [host, lambda: fn(*args, out=out)], min_runs=5, min_seconds=seconds, rounds=rounds
        )
        handoff.append(_handoff_ns(hw))
        lib.shutdown()
    tune_s, lib_s = timed[0][0], timed[1][0]
    row = {
        "workload": label,
        "config": str(pick.candidate.config),
        "tune_measured_gflops": pick.gflops,
        "runner_gflops": w.flops / tune_s / 1e9,
        "library_gflops": w.flops / lib_s / 1e9,
        "ratio": tune_s / lib_s,
        "numpy_gflops": numpy_gflops,
        "core_to_core_ns": [h for h in handoff if h is not None],
    }
    if log:
        log(
            f"{label}: runner {row['runner_gflops']:.1f} GFLOP/s, library "
            f"{row['library_gflops']:.1f} ({row['ratio']:.3f}x)"
        )
    return row


def run_library_bench(quick: bool = False, log: Any = None) -> dict[str, Any]:
    """The library rows on this host (``aotune bench --library [--quick]``)."""
    from aotune.benchmarks.suite import machine_description

    hw = load_target("host")
    rows = [
        library_row(label, w, hw, log) for label, w in (LIBRARY_QUICK if quick else LIBRARY_FULL)
    ]
    return {"machine": machine_description(hw), "library_rows": rows}


def print_library_table(result: dict[str, Any], console: Any) -> None:
    """The library rows as a rich table."""
    from rich.table import Table

    table = Table(title=f"aotune bench --library on {result['machine']}")
    for col in ("workload", "tune GFLOP/s", "runner", "library (aotune.load)", "ratio",
                "core-to-core ns"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for r in result["library_rows"]:
        table.add_row(
            r["workload"],
            f"{r['tune_measured_gflops']:.1f}",
            f"{r['runner_gflops']:.1f}",
            f"{r['library_gflops']:.1f}",
            f"{r['ratio']:.3f}",
            " / ".join(f"{ns:.0f}" for ns in r.get("core_to_core_ns", ())) or "-",
        )
    console.print(table)
