"""``aotune bench``'s GPU rows: predicted, never measured here.

For each GPU target in ``TARGETS``, the 4096^3 matmul and ResNet-50's convolutions (the CPU
suite's ``RESNET`` shapes, both layouts) are tuned exactly as ``aotune tune`` tunes them, and the
row reports what a build machine without a GPU can know: the model's predicted time, TFLOP/s and
fraction of the target's FP32 peak, the search's seconds (0 measurements), and for the top-k
kernels how many ptxas accepted for the target's sm with no spills and how many the host emulation
found correct against numpy. Nothing in a row is a GPU measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aotune.analysis.workload import LAYOUTS, Workload, matmul
from aotune.codegen.cuda_tools import ToolMissingError, tool_path
from aotune.hwspecs.spec import load_target
from aotune.search import driver
from aotune.search.options import SearchOptions
from aotune.targets import target_for

Log = Callable[[str], None] | None
TARGETS = ("a100", "h100")


def _workloads() -> tuple[tuple[str, Workload], ...]:
    from aotune.benchmarks.suite import RESNET

    return (("matmul 4096x4096x4096", matmul(4096, 4096, 4096)),) + tuple(
        (f"conv2d {name} {layout}", make(layout)) for name, make in RESNET for layout in LAYOUTS
    )


def row_specs(quick: bool = False) -> list[tuple[str, str, Workload]]:
    """(target, workload name, workload) of every GPU row; ``quick``: the first one only."""
    specs = [(t, name, w) for t in TARGETS for name, w in _workloads()]
    return specs[:1] if quick else specs


def gpu_row(
    target: str, name: str, w: Workload, options: SearchOptions = SearchOptions(), log: Log = None
) -> dict[str, Any]:
    """Tune ``w`` for GPU ``target`` as ``aotune tune`` does and report the predictions, the
    search's cost and the checks a GPU-less machine can make of the top-k."""
    if log:
        log(f"[bench] {name} on {target}: tuning (predicted, no GPU)")
    hw = load_target(target)
    result = driver.tune(w, hw, options)
    top = target_for(hw).candidate_report(result.candidates) or []
    best = top[0]
    return {
        "workload": name,
        "target": target,
        "measured": False,  # predictions of the model; no GPU ran anything
        "predicted_seconds": best["predicted_seconds"],
        "predicted_tflops": best["predicted_tflops"],
        "peak_fraction": best["peak_fraction"],
        "peak_tflops": hw.peak_flops / 1e12,
        "bottleneck": best["bottleneck"],
        "search_seconds": result.search_seconds,
        "measurements": result.measurements,
        "kernels_compiled": result.kernels_compiled,
        "top_k": len(top),
        "ptxas_accepted": sum(
            1 for c in top if c["ptxas_ok"] and c["resources"]["spill_bytes"] == 0
        ),
        "emulated_correct": sum(1 for c in top if c["emulated"]["correct"]),
        "chosen_config": result.space.describe_config(result.best.config),
        "resources": best["resources"],
    }


def run_gpu_rows(quick: bool = False, log: Log = None) -> list[dict[str, Any]]:
    """Every GPU row (one with ``quick``)."""
    return [gpu_row(t, name, w, log=log) for t, name, w in row_specs(quick)]


def missing_gpu_tools() -> str | None:
    """Why the GPU rows cannot run here (ptxas or nvdisasm not installed), or None."""
    try:
        for tool in ("ptxas", "nvdisasm"):
            tool_path(tool)
    except ToolMissingError as e:
        return str(e)
    return None


def print_gpu_table(rows: list[dict[str, Any]], console: Any) -> None:
    """The GPU rows as a rich table, titled as predictions."""
    from rich.table import Table

    table = Table(title="GPU rows: predicted by the model, not measured (no GPU here)")
    for col in (
        "workload",
        "target",
        "pred. TFLOP/s",
        "of peak",
        "bottleneck",
        "search s",
        "runs in search",
        "ptxas ok, no spills",
        "emulated correct",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["workload"],
            r["target"],
            f"{r['predicted_tflops']:.1f}",
            f"{r['peak_fraction']:.2f}",
            r["bottleneck"],
            f"{r['search_seconds']:.1f}",
            str(r["measurements"]),
            f"{r['ptxas_accepted']}/{r['top_k']}",
            f"{r['emulated_correct']}/{r['top_k']}",
        )
    console.print(table)
