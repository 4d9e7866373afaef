"""GPU kernels timed on a real GPU: compiled and predicted on a build machine without one, run in
one short session where a GPU is, scored back on the build machine.

    python -m aotune.benchmarks.gpu_device prepare DIR --target h100   # here: no GPU needed
    python -m aotune.benchmarks.gpu_device measure DIR                 # on the GPU's machine
    python -m aotune.benchmarks.gpu_device score DIR                   # here: the scores
    python -m aotune.benchmarks.gpu_device record DIR > REC.json       # bundle + times, no cubins
    python -m aotune.benchmarks.gpu_device rescore REC.json.gz         # today's model, old times

- ``prepare``: per row, the top-k that ``aotune tune`` ships (its search, 0 runs) and a seeded
  sample of the space, each compiled (LLVM -> PTX -> ptxas -> cubin, SASS) and predicted at
  tier 2; writes ``bundle.json``, one cubin per kernel, and the inputs and numpy reference of the
  rows small enough to carry (larger plain GEMMs are drawn again on the GPU's machine from the
  same seed, with a checksum).
- ``measure``: imports numpy and ``codegen/cuda_device.py`` only, so it runs beside any Python
  that has cuda-python. Every kernel goes through ``run_on_device`` (the final check's own
  launch: every output element against numpy, CUDA-event times); the baselines a user would call
  instead (cuBLAS through cupy, cuBLAS and cuDNN through torch, TF32 off) and the SM clock the
  card held are recorded beside them. ``measured.json`` is rewritten after every row.
- ``score``: per row, on the sample, Spearman and Kendall of predicted vs measured time, the
  top-1/5/10 score (the TenSet definition, as ``aotune accuracy``), the median of
  |predicted / measured - 1|; and the shipped pick against the sample's best and the baselines.
- ``record`` / ``rescore``: the measurements kept in the repository
  (``benchmarks/data/*.json.gz``) so that a later model is scored against them without a GPU.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from aotune.errors import AotuneError

Log = Callable[[str], None]
# rows whose inputs and reference take more bytes than this are drawn again where they are timed
CARRY_LIMIT_BYTES = 8 << 20
BUNDLE = "bundle.json"
MEASURED = "measured.json"
LIBRARY = "library"  # ``aotune build`` output of the small rows, loaded with ``aotune.load``
LIBRARY_TOML = """
[[kernel]]
name = "mm"
op = "matmul"
shape = "257x129x67"

[[kernel]]
name = "ffn"
op = "dense"
shape = "100x200x96"
bias = true
activation = "gelu"

[[kernel]]
name = "conv"
op = "conv2d"
shape = "2,16,9,9,8,3,3"
pad = 1
layout = "NHWC"
"""


def _rows() -> list[tuple[str, Any, int]]:
    """(name, workload, sample size) of each row: small awkward shapes first (correctness), then
    the GEMM of the Kernel Tuner files, a BERT-large FFN GEMM and two ResNet-50 convolutions."""
    from aotune.analysis.workload import conv2d, dense, matmul
    from aotune.benchmarks.suite import RESNET

    resnet = dict(RESNET)
    return [
        ("matmul 257x129x67", matmul(257, 129, 67), 4),
        ("dense 100x200x96 +bias gelu", dense(100, 200, 96, True, "gelu"), 4),
        ("conv2d 2x16x9x9->8 3x3 p1 NHWC", conv2d(2, 16, 9, 9, 8, 3, 3, pad=1, layout="NHWC"), 4),
        ("matmul 4096x4096x4096", matmul(4096, 4096, 4096), 160),
        ("matmul 384x1024x4096", matmul(384, 1024, 4096), 80),
        ("conv2d 56x56x64->64 3x3 p1 NHWC", resnet["56x56x64->64 3x3 p1"]("NHWC"), 60),
        ("conv2d 28x28x128->128 3x3 p1 NCHW", resnet["28x28x128->128 3x3 p1"]("NCHW"), 40),
    ]


def _torch_baseline(w: Any) -> dict[str, Any] | None:
    """How the GPU machine's torch runs the same computation (FP32, TF32 off), for ``measure``."""
    if w.op == "matmul" and not (w.epilogue.bias or w.epilogue.activation != "none"):
        sizes = {x.upper(): v for x, v in w.shape_dict.items()}  # an einsum names them m, n, k
        if {"M", "N", "K"} <= set(sizes):
            return {"op": "matmul", "m": sizes["M"], "n": sizes["N"], "k": sizes["K"]}
        return None
    if w.op == "conv2d" and w.conv is not None:
        c = w.conv
        return {
            "op": "conv2d",
            "input": list(w.tensor(w.statement.inputs[0].tensor).shape),
            "weight": list(w.tensor(w.statement.inputs[1].tensor).shape),
            "stride": c.stride,
            "padding": c.pad,
            "dilation": c.dilation,
            "groups": c.groups,
            "layout": c.layout,
        }
    return None


def xgemm_row(
    path: Path, target: str, best: int = 40, model_best: int = 20, drawn: int = 80, seed: int = 0
) -> tuple[str, Any, int, list[Any]]:
    """A row of Xgemm configurations measured in a Kernel Tuner file (``aotune accuracy
    --measured``'s mapping), to be timed as aotune's own kernels on another GPU: the file's
    ``best`` fastest, the ``model_best`` that ``target``'s tier-1 model puts first, and ``drawn``
    more drawn with ``seed``, each config once."""
    from aotune.benchmarks.kernel_tuner import read_cache
    from aotune.benchmarks.measured import (
        family_for,
        mapped_configs,
        param_values,
        problem_shape,
    )
    from aotune.hwspecs.spec import load_target
    from aotune.targets import target_for

    cache = read_cache(path)
    family = family_for(cache)
    family.check(param_values(cache), str(path))
    M, N, K = problem_shape(cache, None)
    w = family.workload(M, N, K)
    tgt = target_for(load_target(target))
    space = tgt.build_space(w)
    entries, _ = mapped_configs(cache, family, space)
    fastest = {cfg: min(cache.configs[i].milliseconds for i in at) for cfg, at in entries.items()}
    configs = list(fastest)
    by_time = sorted(configs, key=fastest.__getitem__)
    est = tgt.estimate([tgt.schedule(space, c) for c in configs])
    by_model = [configs[i] for i in np.argsort([e.seconds for e in est], kind="mergesort")]
    rng = np.random.default_rng(seed)
    picked = dict.fromkeys(by_time[:best] + by_model[:model_best])
    for i in rng.permutation(len(configs)):
        if len(picked) >= best + model_best + drawn:
            break
        picked.setdefault(configs[i])
    name = f"xgemm {M}x{N}x{K} ({cache.device_name}'s configs)"
    return name, w, 0, list(picked)


def prepare(
    out: Path,
    target: str = "h100",
    seed: int = 0,
    rows: Sequence[tuple[Any, ...]] | None = None,
    library: bool = True,
    carry_limit: int = CARRY_LIMIT_BYTES,
    log: Log = print,
) -> dict[str, Any]:
    """Compile and predict the kernels of ``rows`` (default ``_rows()``: (name, workload, sample
    size)) for ``target``; write the bundle to ``out``, with ``aotune build``'s library of the
    small rows when ``library``."""
    from aotune.codegen.gpu_emulator import _reference, random_inputs
    from aotune.codegen.runner import tolerance
    from aotune.errors import ConfigError
    from aotune.hwspecs.spec import load_target
    from aotune.search import driver
    from aotune.search.options import SearchOptions
    from aotune.targets import target_for

    hw = load_target(target)
    tgt = target_for(hw)
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for name, w, n_sample, *chosen in rows if rows is not None else _rows():
        start = time.perf_counter()
        result = driver.tune(w, hw, SearchOptions(seed=seed))
        space = result.space
        picks = {c.config: c.rank for c in result.candidates}
        drawn = chosen[0] if chosen else space.sample(n_sample, seed=seed)
        sample = [c for c in drawn if c not in picks]
        scheds = [tgt.schedule(space, c) for c in sample]
        compiled = tgt.compile_and_read_many(scheds)
        preds = tgt.predict(scheds, [f for _, f in compiled])
        ests = tgt.estimate(scheds)
        entries = [
            (
                c.config,
                c.schedule,
                c.kernel,
                tgt.features(c.kernel),
                c.prediction,
                c.estimate,
                c.rank,
            )
            for c in result.candidates
        ] + [  # fmt: skip
            (cfg, s, k, f, p, e, None)
            for cfg, s, (k, f), p, e in zip(sample, scheds, compiled, preds, ests)
        ]
        s0 = entries[0][1]
        a, b, bias = random_inputs(s0, seed)
        ref = np.asarray(_reference(s0, a, b, bias))
        tol = tolerance(a, b, s0.K, ref if s0.has_epilogue else None)
        slug = f"r{len(done)}"
        carried = sum(x.nbytes for x in (a, b, ref) + ((bias,) if bias is not None else ()))
        if carried <= carry_limit:
            np.savez(
                out / f"{slug}.npz",
                a=a,
                b=b,
                ref=ref,
                **({"bias": bias} if bias is not None else {}),
            )
            inputs = {"file": f"{slug}.npz"}
        elif w.op == "matmul" and not s0.has_epilogue and s0.batch == 1:
            inputs = {
                "draw": "uniform",
                "seed": seed,
                "a_sum": float(a.sum(dtype=np.float64)),
                "einsum": s0.reference,
            }
        else:
            raise ConfigError(f"{name}: inputs of {carried} bytes and no way to draw them there")
        kernels = []
        for i, (cfg, s, k, f, p, e, rank) in enumerate(entries):
            (out / f"{slug}k{i}.cubin").write_bytes(k.cubin)
            kernels.append(
                {
                    "id": i,
                    "cubin": f"{slug}k{i}.cubin",
                    "entry": k.entry,
                    "launch": k.launch.as_dict(),
                    "config": space.describe_config(cfg),
                    "shipped_rank": rank,
                    "predicted_seconds": p.seconds,
                    "estimated_seconds": e.seconds,
                    "bottleneck": p.bottleneck,
                    "breakdown": dict(p.breakdown),
                    "registers": f.registers,
                    "spill_bytes": f.spill_bytes,
                    "shared_bytes": f.shared_bytes,
                    "threads": s.threads,
                }
            )
        done.append(
            {
                "name": name,
                "flops": s0.flops,
                "K": s0.K,
                "shapes": [list(x) for x in s0.shapes],
                "bias": s0.bias,
                "tolerance": tol,
                "inputs": inputs,
                "baseline": _torch_baseline(w),
                "kernels": kernels,
            }
        )
        log(f"{name}: {len(kernels)} kernels ({len(picks)} shipped) in "
            f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    names = []
    if library:
        names = _prepare_library(out, target, {row[0]: row[1] for row in _rows()[:3]})
        log(f"library: {', '.join(names)} built with aotune build")
    bundle = {
        "library": names,
        "target": hw.name,
        "sm": hw.arch.sm,
        "sm_name": hw.sm_name,
        "peak_flops": hw.peak_flops,
        "boost_clock_ghz": hw.compute.boost_clock_ghz,
        "seed": seed,
        "rows": done,
    }
    (out / BUNDLE).write_text(json.dumps(bundle, indent=1))
    return bundle


def _prepare_library(out: Path, target: str, small: dict[str, Any]) -> list[str]:
    """``aotune build`` of ``LIBRARY_TOML`` into ``out/LIBRARY``, and per kernel the inputs
    ``check_library`` would draw, their float64 numpy reference and its tolerance
    (``out/LIBRARY.npz``)."""
    from aotune.artifact.backends import numpy_reference
    from aotune.cli import main as aotune_main
    from aotune.codegen.runner import tolerance
    from aotune.errors import BuildError

    toml = out / "library.toml"
    toml.write_text(LIBRARY_TOML)
    lib = out / LIBRARY
    db = out / "library.sqlite"
    argv = ["build", str(toml), "--target", target, "-o", str(lib), "--jobs", "1", "--db", str(db)]
    if aotune_main([*argv, "--force"] if lib.exists() else argv) != 0:
        raise BuildError(f"aotune {' '.join(argv)} failed")
    manifest = json.loads((lib / "manifest.json").read_text())
    by_name = dict(zip(("mm", "ffn", "conv"), small.values()))
    rng = np.random.default_rng(0)
    arrays = {}
    for e in manifest["kernels"]:
        ins = [p for p in e["params"] if p["role"] != "out"]
        drawn = [rng.uniform(-1, 1, tuple(p["shape"])).astype(np.float32) for p in ins]
        for i, x in enumerate(drawn):
            arrays[f"{e['name']}_in{i}"] = x
        w = by_name[e["name"]]
        ref = numpy_reference(w, drawn)
        red = math.prod(lp.extent for lp in w.loops if lp.kind == "reduction")
        arrays[f"{e['name']}_ref"] = ref
        arrays[f"{e['name']}_tol"] = np.float64(
            tolerance(drawn[0], drawn[1], red, ref if w.epilogue.active else None)
        )
    np.savez(out / f"{LIBRARY}.npz", **arrays)
    return [e["name"] for e in manifest["kernels"]]


def _check_library(d: Path, names: list[str]) -> list[dict[str, Any]]:
    """Each kernel of the bundle's library called through ``aotune.load`` on the GPU, against
    the reference and tolerance made where it was built (as ``check_library``'s)."""
    import aotune
    from aotune.errors import AotuneError

    if not names:
        return []
    z = np.load(d / f"{LIBRARY}.npz")
    out = []
    try:
        lib: Any = aotune.load(d / LIBRARY)
    except AotuneError as e:
        return [{"name": n, "error": str(e)} for n in names]
    for n in names:
        ins = [z[k] for k in sorted(k for k in z.files if k.startswith(f"{n}_in"))]
        ref = z[f"{n}_ref"]
        got = np.full(ref.shape, np.nan, np.float32)
        try:
            getattr(lib, n)(*ins, out=got)
        except AotuneError as e:
            out.append({"name": n, "error": str(e)})
            continue
        err = float(np.abs(got - ref).max(initial=0.0))
        tol = float(z[f"{n}_tol"])
        out.append({"name": n, "correct": bool(np.isfinite(got).all() and err <= tol),
                    "max_abs_error": err, "tolerance": tol})  # fmt: skip
    lib.shutdown()
    return out


def _inputs(d: Path, row: dict[str, Any]) -> tuple[tuple[Any, Any, Any], np.ndarray]:
    """((A, B, bias), reference) of a row: carried, or drawn as ``random_inputs`` draws them."""
    spec = row["inputs"]
    if "file" in spec:
        z = np.load(d / spec["file"])
        return (z["a"], z["b"], z["bias"] if "bias" in z else None), z["ref"]
    rng = np.random.default_rng(spec["seed"])
    a = rng.uniform(-1, 1, row["shapes"][0]).astype(np.float32)
    b = rng.uniform(-1, 1, row["shapes"][1]).astype(np.float32)
    if not math.isclose(float(a.sum(dtype=np.float64)), spec["a_sum"], rel_tol=1e-9):
        raise RuntimeError(f"{row['name']}: the inputs drawn here differ from the bundle's")
    return (a, b, None), np.einsum(spec.get("einsum", "mk,kn->mn"), a, b, optimize=True)


def _torch_seconds(base: dict[str, Any] | None) -> dict[str, float] | None:
    """Median seconds of torch's FP32 (TF32 off) matmul or conv2d of the row, by CUDA events."""
    if base is None:
        return None
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    if base["op"] == "matmul":
        a = torch.rand(base["m"], base["k"], device=dev)
        b = torch.rand(base["k"], base["n"], device=dev)

        def fn() -> object:
            return a @ b

        name = "torch.matmul (cuBLAS)"
    else:
        x = torch.rand(*base["input"], device=dev)
        wt = torch.rand(*base["weight"], device=dev)
        if base["layout"] == "NHWC":  # aotune's NHWC: x N,H,W,C and weights R,S,C/G,K
            x = x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
            wt = wt.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)

        def fn() -> object:
            return torch.nn.functional.conv2d(x, wt, None, base["stride"], base["padding"],
                                              base["dilation"], base["groups"])  # fmt: skip

        name = f"torch conv2d (cuDNN, {base['layout']})"
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return {"name": name, "seconds": float(np.median(times))}


def _clock_sampler(out: Path) -> subprocess.Popen | None:
    """nvidia-smi writing the SM clock, power and temperature every 200 ms, where it exists."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    fields = "timestamp,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu"
    return subprocess.Popen(
        [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "200"],
        stdout=(out / "clocks.csv").open("w"),
        stderr=subprocess.DEVNULL,
    )


def measure(
    d: Path,
    out: Path | None = None,
    log: Log = print,
    runs: int = 10,
    only: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Run every kernel of the bundle in ``d`` (or those whose id is in ``only``, for a profiler)
    on this machine's GPU (up to ``runs`` timed launches each, at least 3); write
    ``measured.json``."""
    from aotune.codegen.cuda_device import (
        cublas_sgemm_seconds,
        device_available,
        device_name,
        run_on_device,
    )
    from aotune.errors import FinalCheckError

    out = out or d
    if not (d / BUNDLE).is_file():
        raise SystemExit(f"error: {d} holds no {BUNDLE}; make one with 'gpu_device prepare {d}'")
    bundle = json.loads((d / BUNDLE).read_text())
    hw = SimpleNamespace(arch=SimpleNamespace(sm=bundle["sm"]), sm_name=bundle["sm_name"])
    ok, why = device_available(hw)
    if not ok:
        raise SystemExit(f"error: {why}")
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"device": device_name(hw), "target": bundle["target"], "rows": []}
    sampler = _clock_sampler(out)
    try:
        result["library"] = _check_library(d, bundle.get("library", []))
        log(f"library through aotune.load: {result['library']}")
        for row in bundle["rows"]:
            start = time.perf_counter()
            inputs, ref = _inputs(d, row)
            shapes = SimpleNamespace(shapes=[tuple(x) for x in row["shapes"]], K=row["K"])
            measured = []
            for k in row["kernels"]:
                if only is not None and k["id"] not in only:
                    continue
                kernel = SimpleNamespace(
                    hw=hw,
                    cubin=(d / k["cubin"]).read_bytes(),
                    entry=k["entry"],
                    launch=SimpleNamespace(
                        grid=tuple(k["launch"]["grid"]),
                        block=tuple(k["launch"]["block"]),
                        dynamic_shared_bytes=k["launch"]["dynamic_shared_bytes"],
                    ),
                    schedule=shapes,
                )
                try:
                    m = run_on_device(kernel, inputs, ref, row["tolerance"], runs, 0.5)
                    measured.append({"id": k["id"], **vars(m)})
                except FinalCheckError as e:
                    measured.append({"id": k["id"], "error": str(e)})
            base = row["baseline"]
            cublas = None
            if base is not None and base["op"] == "matmul":
                cublas = cublas_sgemm_seconds(hw, base["m"], base["n"], base["k"])
            result["rows"].append(
                {
                    "name": row["name"],
                    "kernels": measured,
                    "cupy_cublas_seconds": cublas,
                    "torch": _torch_seconds(base),
                    "seconds": time.perf_counter() - start,
                }
            )
            (out / MEASURED).write_text(json.dumps(result, indent=1))
            bad = sum(1 for m in measured if not m.get("correct"))
            log(f"{row['name']}: {len(measured)} kernels, {bad} wrong or failed, "
                f"{time.perf_counter() - start:.0f} s")  # fmt: skip
    finally:
        if sampler is not None:
            sampler.terminate()
    return result


def score_row(bundle_row: dict[str, Any], measured_row: dict[str, Any]) -> dict[str, Any]:
    """The scores of one row (module docstring)."""
    from aotune.benchmarks.suite import kendall, median_abs_error, spearman, topk_score

    by_id = {m["id"]: m for m in measured_row["kernels"]}
    ks = bundle_row["kernels"]
    ok = [k for k in ks if by_id.get(k["id"], {}).get("correct")]
    sample = [k for k in ok if k["shipped_rank"] is None]
    p = np.array([k["predicted_seconds"] for k in sample])
    m = np.array([by_id[k["id"]]["seconds"] for k in sample])
    rank = np.argsort(np.argsort(p, kind="mergesort"), kind="mergesort").astype(float)
    shipped = sorted((k for k in ok if k["shipped_rank"] is not None),
                     key=lambda k: k["shipped_rank"])  # fmt: skip
    flops = bundle_row["flops"]
    best_sampled = float(m.min()) if len(m) else math.nan
    pick = by_id[shipped[0]["id"]]["seconds"] if shipped else math.nan
    fastest_shipped = min((by_id[k["id"]]["seconds"] for k in shipped), default=math.nan)
    torch_s = (measured_row.get("torch") or {}).get("seconds")
    out = {
        "row": bundle_row["name"],
        "kernels": len(ks),
        "correct": len(ok),
        "sample": len(sample),
        "spearman": spearman(p, m) if len(sample) >= 3 else None,
        "kendall": kendall(p, m) if len(sample) >= 3 else None,
        "top1": topk_score(rank, m, 1) if len(sample) else None,
        "top5": topk_score(rank, m, 5) if len(sample) else None,
        "top10": topk_score(rank, m, 10) if len(sample) else None,
        "median_abs_error": median_abs_error(p, m) if len(sample) else None,
        "median_measured_over_predicted": float(np.median(m / p)) if len(sample) else None,
        "pick_tflops": flops / pick / 1e12,
        "pick_predicted_tflops": flops / shipped[0]["predicted_seconds"] / 1e12
        if shipped
        else None,
        "fastest_shipped_tflops": flops / fastest_shipped / 1e12,
        "best_sampled_tflops": flops / best_sampled / 1e12,
        "pick_vs_best_sampled": best_sampled / pick,
        "torch": measured_row.get("torch"),
        "torch_tflops": flops / torch_s / 1e12 if torch_s else None,
        "cupy_cublas_tflops": flops / measured_row["cupy_cublas_seconds"] / 1e12
        if measured_row.get("cupy_cublas_seconds")
        else None,
        "failed": [
            {"config": k["config"], **by_id.get(k["id"], {"error": "not run"})}
            for k in ks
            if not by_id.get(k["id"], {}).get("correct")
        ],
    }
    return out


def score(d: Path, measured_dir: Path | None = None) -> dict[str, Any]:
    """Scores of every measured row of the bundle in ``d``."""
    bundle = json.loads((d / BUNDLE).read_text())
    measured = json.loads(((measured_dir or d) / MEASURED).read_text())
    by_name = {r["name"]: r for r in measured["rows"]}
    rows = [score_row(r, by_name[r["name"]]) for r in bundle["rows"] if r["name"] in by_name]
    return {"device": measured["device"], "target": bundle["target"], "rows": rows}


def record(d: Path, measured_dir: Path | None = None, clock_mhz: float | None = None) -> dict:
    """One self-contained record of a measured bundle (no cubins): per row and kernel the config,
    the prediction made before the run, and what the GPU measured; what ``rescore`` reads."""
    bundle = json.loads((d / BUNDLE).read_text())
    measured = json.loads(((measured_dir or d) / MEASURED).read_text())
    by_name = {r["name"]: r for r in measured["rows"]}
    rows = []
    for r in bundle["rows"]:
        m = by_name.get(r["name"])
        if m is None:
            continue
        by_id = {k["id"]: k for k in m["kernels"]}
        rows.append(
            {
                "name": r["name"],
                "flops": r["flops"],
                "kernels": [
                    {
                        "config": k["config"],
                        "shipped_rank": k["shipped_rank"],
                        "predicted_seconds": k["predicted_seconds"],
                        "measured_seconds": by_id[k["id"]].get("seconds"),
                        "runs": by_id[k["id"]].get("runs"),
                        "correct": bool(by_id[k["id"]].get("correct")),
                    }
                    for k in r["kernels"]
                ],
                "cupy_cublas_seconds": m.get("cupy_cublas_seconds"),
                "torch": m.get("torch"),
            }
        )
    return {
        "device": measured["device"],
        "target": bundle["target"],
        "sm_clock_mhz": clock_mhz,
        "library": measured.get("library"),
        "rows": rows,
    }


def _row_workload(name: str) -> Any | None:
    """The workload of a recorded row, by its name: one of ``_rows()``, or an ``xgemm_row``."""
    from aotune.constraints.xgemm import xgemm_workload

    for row in _rows():
        if row[0] == name:
            return row[1]
    if name.startswith("xgemm "):
        m, n, k = (int(x) for x in name.split()[1].split("x"))
        return xgemm_workload(m, n, k)
    return None


def rescore(rec: dict[str, Any], target: str | None = None, log: Log = print) -> dict[str, Any]:
    """The current model's tier-2 predictions of every kernel of a ``record`` (compiled again),
    scored against the times measured then, as ``score`` scores a fresh run."""
    from aotune.hwspecs.spec import load_target
    from aotune.targets import target_for

    hw = load_target(target or rec["target"])
    tgt = target_for(hw)
    out = []
    for row in rec["rows"]:
        w = _row_workload(row["name"])
        if w is None:
            continue
        space = tgt.build_space(w)
        scheds = [tgt.schedule(space, space.parse_config(k["config"])) for k in row["kernels"]]
        compiled = tgt.compile_and_read_many(scheds)
        preds = tgt.predict(scheds, [f for _, f in compiled])
        bundle_row = {"name": row["name"], "flops": row["flops"], "kernels": []}
        measured_row = {"name": row["name"], "kernels": [], "torch": row["torch"],
                        "cupy_cublas_seconds": row["cupy_cublas_seconds"]}  # fmt: skip
        for i, (k, p) in enumerate(zip(row["kernels"], preds)):
            bundle_row["kernels"].append(
                {
                    "id": i,
                    "config": k["config"],
                    "shipped_rank": k["shipped_rank"],
                    "predicted_seconds": p.seconds,
                }  # fmt: skip
            )
            measured_row["kernels"].append(
                {"id": i, "seconds": k["measured_seconds"], "correct": k["correct"]}
            )
        out.append(score_row(bundle_row, measured_row))
        log(f"{row['name']}: re-predicted {len(scheds)} kernels")
    return {"device": rec["device"], "target": hw.name, "rows": out}


RECORDS_DIR = Path(__file__).resolve().parent / "data"


def bench_rows(log: Log | None = None, records: Path = RECORDS_DIR) -> list[dict[str, Any]]:
    """The full bench's rows of kernels timed on real GPUs by this module: every record kept in
    the repository, re-predicted by today's model (``rescore``)."""
    rows = []
    for path in sorted(records.glob("*.json.gz")):
        rec = json.loads(gzip.decompress(path.read_bytes()))
        scored = rescore(rec, log=log or (lambda _: None))
        rows += [{"record": path.name, "device": rec["device"], **r} for r in scored["rows"]]
    return rows


def print_bench_rows(rows: list[dict[str, Any]], console: Any) -> None:
    """The rescored rows as a rich table."""
    from rich.table import Table

    table = Table(title="aotune's own GPU kernels timed on a real GPU, predicted by today's model")
    for col in ("device", "row", "sample", "Spearman", "Kendall", "top-1", "top-5", "median err",
                "shipped pick TFLOP/s", "library TFLOP/s"):  # fmt: skip
        table.add_column(col, overflow="fold")

    def num(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    for r in rows:
        lib = r["torch_tflops"] or r["cupy_cublas_tflops"]
        table.add_row(
            r["device"], r["row"], str(r["sample"]),
            *(num(r[k]) for k in ("spearman", "kendall", "top1", "top5", "median_abs_error")),
            num(r["pick_tflops"]), num(lib),
        )  # fmt: skip
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line of the module docstring."""
    ap = argparse.ArgumentParser(prog="python -m aotune.benchmarks.gpu_device")
    ap.add_argument("step", choices=("prepare", "measure", "score", "record", "rescore"))
    ap.add_argument("dir", type=Path, help="the bundle directory (rescore: a record file)")
    ap.add_argument("--target", default=None, help="prepare: default h100; rescore: the record's")
    ap.add_argument("--out", type=Path, help="where measured.json is (default: dir)")
    ap.add_argument("--clock-mhz", type=float, help="record: the SM clock the card held")
    ap.add_argument("--runs", type=int, default=10, help="measure: timed launches per kernel")
    ap.add_argument(
        "--only",
        type=_kernel_ids,
        metavar="IDS",
        help="measure: only these kernel ids (comma-separated), e.g. under ncu",
    )
    ap.add_argument(
        "--xgemm",
        type=Path,
        metavar="FILE",
        help="prepare: one row, the Xgemm configs of a Kernel Tuner file (xgemm_row)",
    )
    args = ap.parse_args(argv)
    try:
        _run(args)
    except AotuneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _kernel_ids(text: str) -> list[int]:
    """``--only``'s value: kernel ids separated by commas."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give kernel ids (the bundle's 'id') separated by commas, e.g. 0,3"
        ) from None


def _run(args: argparse.Namespace) -> None:
    """One step of the command line; our own errors reach ``main``."""
    if args.step == "prepare" and args.xgemm:
        target = args.target or "h100"
        prepare(args.dir, target, rows=[xgemm_row(args.xgemm, target)], library=False)
    elif args.step == "prepare":
        prepare(args.dir, args.target or "h100")
    elif args.step == "measure":
        measure(args.dir, args.out, runs=args.runs, only=args.only)
    elif args.step == "score":
        print(json.dumps(score(args.dir, args.out), indent=1))
    elif args.step == "record":
        print(json.dumps(record(args.dir, args.out, args.clock_mhz), indent=1))
    else:
        opener = gzip.open if args.dir.suffix == ".gz" else open
        with opener(args.dir, "rt") as f:
            rec = json.load(f)
        print(json.dumps(rescore(rec, args.target, log=lambda m: print(m, file=sys.stderr)),
                         indent=1))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
