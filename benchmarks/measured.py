"""The model against kernels other people timed on real GPUs: ``aotune accuracy --measured FILE``.

Roadmap: read a Kernel Tuner cache (``kernel_tuner.read_cache``), map every timed configuration to
the aotune config with the same meaning (``MEASURED_FAMILIES``: CLBlast's Xgemm through
``constraints/xgemm.py``), predict each one, and score the predictions against the times the way
the field does (``suite.spearman``, ``suite.kendall``, ``suite.topk_score``).

- Configurations that differ only in a parameter their kernel ignores (Xgemm's MDIMA without
  SA = 1) are one kernel and one aotune config: each distinct kernel is scored once, at the mean
  of its measured times.
- Tier 1 (the schedule alone) predicts every kernel. Tier 2 (LLVM -> PTX -> ptxas -> SASS, the
  model over the assembled code) predicts the tier-1 best ``candidates`` (the model's top-k picks
  come from them, ranked as the search ranks them: kernels that spill last), a seeded ``sample``
  of all kernels (Spearman, Kendall and the median error are computed on it), and the measured
  top 10 (so the plot shows where the model puts them).
- A configuration that ran on real hardware and that aotune's space calls invalid is a bug in the
  constraints: each is reported with its violations (``rejected``).
"""

from __future__ import annotations

import io
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aotune import machine_load
from aotune.benchmarks.kernel_tuner import UNKNOWN_DEVICE, KernelTunerCache, read_cache
from aotune.benchmarks.suite import kendall, median_abs_error, spearman, topk_score
from aotune.codegen.cuda_tools import ToolMissingError
from aotune.constraints.space import Config, Space
from aotune.constraints.xgemm import check_xgemm_parameters, xgemm_to_config, xgemm_workload
from aotune.errors import CodegenError, ConfigError, MeasurementFileError, WorkloadError
from aotune.files import write_new_file
from aotune.hwspecs.spec import builtin_names, load_target
from aotune.targets import registers_past_limit, target_for

# Kernels predicted by tier 2 for the correlations: with 1,000, ten seeds moved Spearman by at
# most 0.010, Kendall by 0.018 and the median error by 0.019 on either file (600: Kendall 0.031);
# how that was checked is in the README's accuracy section
DEFAULT_SAMPLE = 1000
# tier-1 best kernels that tier 2 re-ranks for the model's top-k picks: tier 2's own top 10 over
# the tier-1 best 800 of the measured Xgemm spaces lies within tier 1's best 291 (RTX 2080 Ti) and
# 245 (TITAN RTX), so the picks are tier 2's, not tier 1's (the search compiles 16)
DEFAULT_CANDIDATES = 320
TOP_K = (1, 5, 10)
Log = Callable[[str], None] | None


@dataclass(frozen=True)
class MeasuredFamily:
    """A kernel family whose measured configs map to aotune configs."""

    kind: str  # the target kind its kernels run on
    check: Callable[[Mapping[str, Sequence[int]], str], None]  # the space as a whole maps
    workload: Callable[[int, int, int], Any]  # (M, N, K) -> Workload
    to_config: Callable[[Mapping[str, int], Space], Config]


MEASURED_FAMILIES = {
    "Xgemm": MeasuredFamily("gpu", check_xgemm_parameters, xgemm_workload, xgemm_to_config),
}


@dataclass(frozen=True)
class ScoredKernel:
    """One distinct aotune config: the measured entries it stands for and its predictions."""

    config: Config
    params: tuple[tuple[str, int], ...]  # the first measured config's parameters
    entries: tuple[str, ...]  # the cache keys of the measured configs it stands for
    measured_ms: float  # the mean of their times
    tier1_ms: float
    tier2_ms: float | None  # None: not predicted by tier 2
    bottleneck: str
    spills: bool = False  # ptxas spilled registers (tier 2 only)


@dataclass(frozen=True)
class MeasuredAccuracy:
    """The scores of one target's model on one measured file, and what they were computed on."""

    target: str
    kernel: str
    device: str
    shape: tuple[int, int, int]
    configs: int  # measured configurations in the file (failed ones excluded)
    failed: int  # entries Kernel Tuner marked as failed (no time)
    rejected: tuple[tuple[str, str], ...]  # (cache key, why the space refuses it)
    kernels: tuple[ScoredKernel, ...]  # every distinct kernel, in the file's order
    sample: tuple[int, ...]  # indices into kernels: the tier-2 sample of the correlations
    picks: tuple[int, ...]  # the model's ranking of the tier-2 candidates, best first
    tier2_failed: tuple[tuple[str, str], ...]  # (config, why) where codegen or ptxas refused
    seed: int
    spearman: float
    kendall: float
    top: tuple[float, ...]  # top-1, top-5, top-10 scores
    median_abs_error: float
    seconds: float
    spec_from: str = ""  # a spec file that keeps a built-in's name says what it changed

    @property
    def mapped(self) -> int:
        """Measured configurations that map to an aotune config (all do, or the file is refused)."""
        return self.configs

    @property
    def scored(self) -> int:
        """Measured configurations whose times entered the scores."""
        return sum(len(k.entries) for k in self.kernels)

    def true_top(self, k: int = 10) -> list[int]:
        """Indices of the ``k`` fastest measured kernels."""
        return sorted(range(len(self.kernels)), key=lambda i: self.kernels[i].measured_ms)[:k]

    def as_json(self) -> dict[str, Any]:
        """The issue's JSON fields, exactly."""
        return {
            "target": self.target,
            "kernel": self.kernel,
            "configs": self.configs,
            "mapped": self.mapped,
            "rejected_by_space": len(self.rejected),
            "scored": self.scored,
            "spearman": round(self.spearman, 4),
            "kendall": round(self.kendall, 4),
            "top1": round(self.top[0], 4),
            "top5": round(self.top[1], 4),
            "top10": round(self.top[2], 4),
            "median_abs_error": round(self.median_abs_error, 4),
            "seconds": round(self.seconds, 1),
        }


def family_for(cache: KernelTunerCache) -> MeasuredFamily:
    """The family of a cache's kernel, or one error line naming the kernels aotune maps."""
    family = MEASURED_FAMILIES.get(cache.kernel_name)
    if family is None:
        raise MeasurementFileError(
            f"{cache.path} holds measurements of kernel {cache.kernel_name!r}; aotune maps "
            f"{', '.join(MEASURED_FAMILIES)} (CLBlast's GEMM) only"
        )
    return family


def problem_shape(cache: KernelTunerCache, shape: tuple[int, ...] | None) -> tuple[int, int, int]:
    """(M, N, K) of the measured problem: ``problem_size`` gives M and N; K is not recorded by
    Kernel Tuner, and is taken equal to N (its GEMM benchmarks are square) unless ``shape`` says."""
    size = cache.problem_size
    if shape is not None:
        if len(shape) != 3:
            raise ConfigError(f"--shape gives {len(shape)} sizes; give M x N x K of the GEMM")
        if size[:2] and tuple(shape[:2]) != size[:2]:
            raise ConfigError(
                f"--shape {'x'.join(map(str, shape))} disagrees with the file's problem size "
                f"{'x'.join(map(str, size))} (M x N); give the file's M and N"
            )
        return (shape[0], shape[1], shape[2])
    if len(size) != 2:
        raise MeasurementFileError(
            f"{cache.path}: problem_size {list(size)} is not M, N of a GEMM; pass --shape MxNxK"
        )
    return (size[0], size[1], size[1])


def param_values(cache: KernelTunerCache) -> dict[str, list[int]]:
    """Each tuning parameter's values over the cache's timed configs (what ``family.check``
    reads)."""
    values: dict[str, set[int]] = {k: set() for k in cache.tune_params_keys}
    for c in cache.configs:
        for k, v in c.params:
            values[k].add(v)
    return {k: sorted(v) for k, v in values.items()}


def mapped_configs(
    cache: KernelTunerCache, family: MeasuredFamily, space: Space
) -> tuple[dict[Config, list[int]], list[tuple[str, str]]]:
    """Each timed config of ``cache`` as the config of ``space`` with the same meaning: the
    indices into ``cache.configs`` of each config the space accepts (configs that differ only in
    a parameter their kernel ignores are one), and (key, why) of each config it rejects. An entry
    the family cannot map is a MeasurementFileError naming it."""
    entries: dict[Config, list[int]] = {}
    rejected = []
    for i, c in enumerate(cache.configs):
        try:
            cfg = family.to_config(c.as_dict(), space)
        except ConfigError as e:
            raise MeasurementFileError(f"{cache.path}: entry {c.key!r}: {e}") from None
        bad = space.violations(cfg)
        if bad:
            rejected.append((c.key, "; ".join(map(str, bad))))
        else:
            entries.setdefault(cfg, []).append(i)
    return entries, rejected


# kernels compiled and read per nvdisasm run (its start-up is most of its time for one kernel)
TIER2_BATCH = 48


# a measured time beyond this many times the spec's fp32 peak is not this GPU's: cards boost
# above their rated clock (an RTX 2080 Ti's fastest Xgemm runs at 0.94 of it), not by half again
IMPLAUSIBLE_PEAK_SHARE = 1.5
# nor is a tuning run whose fastest kernel reached less than this share of the peak (plus a
# launch): Xgemm's naive configurations run at a few percent of it, microseconds read as ms 0.1%
IMPLAUSIBLE_BEST_SHARE = 0.001
# an entry this many times the file's median time is damaged (a whole brute-forced Xgemm space
# spans 18x on the RTX 2080 Ti file)
OUTLIER_TIMES_MEDIAN = 1000.0
# words of a GPU's name that say who made it or its line, not which GPU it is
_VENDOR_WORDS = frozenset({"nvidia", "geforce", "tesla", "quadro"})
# words that make another part of one model number (an RTX 2080 is not a 2080 Ti, an H100 PCIe
# or NVL not the SXM part the h100 spec is)
_VARIANT_WORDS = frozenset({"ti", "super", "laptop", "mobile", "max", "q", "pcie", "nvl"})


def _name_words(text: str) -> set[str]:
    """Lower-case words of a GPU's name, less the vendor's and memory sizes ("80gb", "40 gb")."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"\d+\s*gb\b", " ", text.lower()))
    return set(words) - _VENDOR_WORDS


def device_looks_like(device_name: str, hw: Any) -> bool:
    """Whether a measured file's ``device_name`` may be the GPU ``hw`` describes: a model number
    it holds (2080, a100, v100) is in the spec's name or the description before its parenthesis,
    with the same variant words (Ti, SUPER, Laptop), or, with no number, all its words are ("TITAN
    RTX")."""
    words = _name_words(device_name)
    spec_words = _name_words(hw.name) | _name_words(hw.description.split("(")[0])
    models = {w for w in words if re.search(r"\d", w)}
    if not models:
        return words <= spec_words
    return bool(models & spec_words) and words & _VARIANT_WORDS == spec_words & _VARIANT_WORDS


def target_for_device(device_name: str, kind: str, path: str) -> str:
    """The built-in spec of kind ``kind`` that ``device_name`` (the GPU a file names) is, when
    exactly one is; otherwise a ConfigError that names the file's GPU and asks for --target."""
    if device_name == UNKNOWN_DEVICE:
        raise ConfigError(
            f"{path} names no device (no device_name), so aotune cannot tell which {kind.upper()} "
            f"it was timed on; give --target (built-in: {', '.join(builtin_names(kind))}, or a "
            "spec file)"
        )
    matches = [n for n in builtin_names(kind) if device_looks_like(device_name, load_target(n))]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(
            f"{path} was timed on {device_name}, and several built-in specs may be it "
            f"({', '.join(matches)}); give --target with the one it is"
        )
    raise ConfigError(
        f"{path} was timed on {device_name}, and no built-in spec is it (built-in: "
        f"{', '.join(builtin_names(kind))}); give --target with the spec of that {kind.upper()}: "
        "a file, e.g. a copy of a built-in one (aotune's hwspecs/*.toml) with its datasheet values"
    )


def _cannot_launch_reason(hw: Any, features: Any) -> str:
    """Why a compiled GPU kernel cannot launch on ``hw``: its registers past the spec's limit, or
    one block past what an SM of the spec holds."""
    return registers_past_limit(features.registers, hw) or (
        "one block needs more registers or shared memory than an SM of the spec has"
    )


def _tier2(target: Any, schedules: list[Any], log: Log) -> list[tuple[Any, str | None]]:
    """(features, None) or (None, why) per schedule: compiled on the target's compile slots, read
    in batches (one disassembler run each where the target can)."""

    def one(s: Any) -> tuple[Any, str | None]:
        try:
            return target.compile(s), None
        except ToolMissingError:  # the toolchain, not this kernel: every one would fail alike
            raise
        except CodegenError as e:  # a kernel ptxas refuses is reported, not scored
            return None, str(e)

    read_many = getattr(target, "features_many", None) or (
        lambda ks: [target.features(k) for k in ks]
    )
    out: list[tuple[Any, str | None]] = []
    with ThreadPoolExecutor(max_workers=getattr(target, "compile_workers", 1)) as pool:
        for start in range(0, len(schedules), TIER2_BATCH):
            compiled = list(pool.map(one, schedules[start : start + TIER2_BATCH]))
            kernels = [k for k, _ in compiled if k is not None]
            feats = iter(read_many(kernels))
            out += [(next(feats), None) if k is not None else (None, why) for k, why in compiled]
            if log:
                log(f"tier 2: {len(out)}/{len(schedules)} kernels compiled and read")
    return out


def measured_accuracy(
    path: str | Path,
    target_name: str | None,
    sample: int = DEFAULT_SAMPLE,
    candidates: int = DEFAULT_CANDIDATES,
    seed: int = 0,
    shape: tuple[int, ...] | None = None,
    log: Log = None,
    warn: Log = None,
) -> MeasuredAccuracy:
    """Score ``target_name``'s model on the Kernel Tuner cache at ``path`` (module docstring);
    None: the built-in spec of the GPU the file names (``target_for_device``). ``warn`` hears,
    before the minutes of compiling, when the file's GPU is not the target's."""
    start = time.perf_counter()
    if sample < 10:
        raise ConfigError(f"--sample {sample}: the correlations need at least 10 kernels")
    if candidates < max(TOP_K):
        raise ConfigError(f"--candidates {candidates}: the top-10 score needs at least 10")
    cache = read_cache(path)
    family = family_for(cache)
    if not cache.configs:
        raise MeasurementFileError(f"{path} holds no timed configuration (failed: {cache.failed})")
    family.check(param_values(cache), str(path))
    if target_name is None:  # no --target: the file's own GPU
        target_name = target_for_device(cache.device_name, family.kind, str(path))
        if log:
            log(f"--target {target_name}: the built-in spec of {cache.device_name}")
    hw = load_target(target_name)
    target = target_for(hw)
    if target.kind != family.kind:
        raise ConfigError(
            f"{cache.kernel_name} is a {family.kind.upper()} kernel and {hw.name} a {target.kind} "
            f"target; give the --target of a {family.kind.upper()} like the one measured "
            f"({cache.device_name})"
        )
    M, N, K = problem_shape(cache, shape)
    if len(cache.configs) < max(TOP_K):
        raise MeasurementFileError(
            f"{path} holds {len(cache.configs)} timed configurations (failed: {cache.failed}); "
            f"the correlations and the top-{max(TOP_K)} score need at least {max(TOP_K)}: "
            "give a file of a longer tuning run"
        )
    try:
        workload = family.workload(M, N, K)
    except WorkloadError as e:  # a size out of range: say whose it is
        given = "--shape" if shape is not None else f"{path}'s problem_size"
        raise WorkloadError(f"{given} (M={M} N={N} K={K}): {e}") from None
    space = target.build_space(workload)
    if log:
        log(
            f"{cache.device_name}: {len(cache.configs)} timed {cache.kernel_name} configs, "
            f"M={M} N={N} K={K}; mapping them to aotune configs for {hw.name}"
        )
    entries, rejected = mapped_configs(cache, family, space)
    if not entries:
        key, why = rejected[0]
        raise MeasurementFileError(
            f"{path}: aotune's space refuses every configuration (the first, {key!r}: {why}); "
            f"check that the file's problem size (M={M} N={N} K={K}) and parameters are those "
            "of a real tuning run"
        )
    configs = list(entries)
    if len(configs) < max(TOP_K):
        raise MeasurementFileError(
            f"{path}: its {len(cache.configs)} timed configurations are {len(configs)} distinct "
            f"kernels aotune scores ({len(rejected)} refused by its space; configs that differ "
            "only in a parameter their kernel ignores are one kernel); the correlations and the "
            f"top-{max(TOP_K)} score need at least {max(TOP_K)}: give a file of a longer tuning run"
        )
    times = {cache.configs[j].milliseconds for indices in entries.values() for j in indices}
    if len(times) < 2:
        raise MeasurementFileError(
            f"{path}: every configuration has the same time ({times.pop():g} ms), so there is "
            "no ranking to score the model against; give the file of a real tuning run"
        )
    if warn and len(configs) < 2 * max(TOP_K):  # the model's top 10 of 10 hold the best by force
        warn(
            f"the file's configurations are {len(configs)} distinct kernels: the top-"
            f"{max(TOP_K)} score is near 1 by force below {2 * max(TOP_K)} (the host's --sample "
            "needs that many); read it, and the correlations, with that in mind"
        )
    foreign = cache.device_name != UNKNOWN_DEVICE and not device_looks_like(cache.device_name, hw)
    if warn and foreign:  # once the file is known to be scored
        warn(
            f"{path} was measured on {cache.device_name}, and --target {hw.name} is "
            f"{hw.description.split('(')[0].strip()}: the model of one GPU is scored against "
            "another's times; give the --target of the GPU measured, or its spec file"
        )
    flops = family.workload(M, N, K).flops
    # the least time the target's fp32 peak allows (times are compared with it, never divided by:
    # a time of 1e-322 ms is a time the file may hold)
    least_ms = flops / (IMPLAUSIBLE_PEAK_SHARE * hw.peak_flops) * 1e3
    times_ms = [c.milliseconds for c in cache.configs]
    quickest, median_ms = min(times_ms), float(np.median(times_ms))
    too_fast = sum(t < least_ms for t in times_ms)
    if warn and too_fast:
        warn(
            f"{too_fast} of the file's {len(cache.configs)} times are too fast for "
            f"{hw.name}: {quickest:.4g} ms for M={M} N={N} K={K}, where "
            f"{IMPLAUSIBLE_PEAK_SHARE:g}x its fp32 peak ({hw.peak_flops / 1e12:.3g} TFLOP/s) "
            f"takes {least_ms:.4g} ms; the times may not be in ms, or the problem size or the GPU "
            "may not be those measured (the rank scores do not depend on the unit, the median "
            "error does)"
        )
    most_ms = (flops / (IMPLAUSIBLE_BEST_SHARE * hw.peak_flops) + hw.launch.overhead_seconds) * 1e3
    too_slow = [t for t in times_ms if t > OUTLIER_TIMES_MEDIAN * median_ms]
    if warn and quickest > most_ms:
        warn(
            f"the file's fastest time, {quickest:.4g} ms for M={M} N={N} K={K}, is too slow for "
            f"{hw.name}: {IMPLAUSIBLE_BEST_SHARE:g}x its fp32 peak takes {most_ms:.4g} ms; the "
            "times may not be in ms, or the problem size or the GPU may not be those measured "
            "(the rank scores do not depend on the unit, the median error does)"
        )
    if warn and too_slow:  # a few entries, not the unit: damaged or hand-edited times
        warn(
            f"{len(too_slow)} of the file's {len(cache.configs)} times are over "
            f"{OUTLIER_TIMES_MEDIAN:g}x its median ({median_ms:.4g} ms; the slowest is "
            f"{max(too_slow):.4g} ms); they are scored as they are: check the file"
        )
    schedules = [target.schedule(space, cfg) for cfg in configs]
    if log:
        log(f"tier 1: predicting {len(configs)} distinct kernels")
    tier1 = target.estimate(schedules)
    measured = np.array(
        [np.mean([cache.configs[i].milliseconds for i in entries[c]]) for c in configs]
    )
    t1 = np.array([p.seconds for p in tier1])
    # tier 2: the candidates, the sample, and the measured top 10 (for the plot)
    rng = np.random.default_rng(seed)
    defaults = DEFAULT_SAMPLE + DEFAULT_CANDIDATES
    given = (("--sample", sample), ("--candidates", candidates))
    asked = [f"{flag} {n}" for flag, n in given if n > len(configs) > defaults]
    if warn and asked:  # tier 2 then compiles every kernel: many minutes, not a few
        warn(
            f"{' and '.join(asked)}: the file has {len(configs)} distinct kernels, so tier 2 "
            f"compiles every one, about {len(configs) / defaults:.0f}x as long as with the "
            f"defaults (--sample {DEFAULT_SAMPLE}, --candidates {DEFAULT_CANDIDATES})"
        )
    drawn = sorted(rng.choice(len(configs), size=min(sample, len(configs)), replace=False).tolist())
    best_t1 = list(np.argsort(t1, kind="mergesort")[:candidates])
    fastest = list(np.argsort(measured, kind="mergesort")[: max(TOP_K)])
    todo = sorted(set(drawn) | set(best_t1) | set(fastest))
    if log:
        log(
            f"tier 2: compiling {len(todo)} kernels (ptxas + SASS): the tier-1 best "
            f"{len(best_t1)}, "
            f"a sample of {len(drawn)} (seed {seed}) and the measured top {max(TOP_K)}"
        )
    feats = _tier2(target, [schedules[i] for i in todo], log)
    ok = [(i, f) for i, (f, _) in zip(todo, feats) if f is not None]
    if not ok:  # no score could be computed from nothing
        raise CodegenError(
            f"tier 2 compiled none of its {len(todo)} kernels (the first: {feats[0][1]}); "
            "the scores need at least one"
        )
    predicted = target.predict([schedules[i] for i, _ in ok], [f for _, f in ok])
    # a kernel the spec says cannot launch, though the file's GPU ran its config: the spec's
    # limits are not that GPU's; it is reported with those tier 2 could not compile
    cannot = {i: _cannot_launch_reason(hw, f) for (i, f), p in zip(ok, predicted)
              if not math.isfinite(p.seconds)}  # fmt: skip
    if len(cannot) == len(ok):
        raise ConfigError(
            f"none of the {len(ok)} kernels tier 2 compiled can launch on {hw.name} as its spec "
            f"describes it (the first: {next(iter(cannot.values()))}), yet the file's GPU ran "
            "their configs: the spec's [limits] are not that GPU's; fix them, or give the "
            "built-in spec of the file's GPU"
        )
    preds = {i: p for (i, _), p in zip(ok, predicted) if i not in cannot}
    ok = [(i, f) for i, f in ok if i not in cannot]
    usable = {i: target.usable(f) for i, f in ok}
    failed2 = tuple(
        (space.describe_config(configs[i]), why) for i, (f, why) in zip(todo, feats) if f is None
    ) + tuple((space.describe_config(configs[i]), why) for i, why in cannot.items())
    kernels = tuple(
        ScoredKernel(
            cfg,
            cache.configs[entries[cfg][0]].params,
            tuple(cache.configs[i].key for i in entries[cfg]),
            float(measured[j]),
            float(t1[j]) * 1e3,
            preds[j].seconds * 1e3 if j in preds else None,
            (preds[j] if j in preds else tier1[j]).bottleneck,
            j in usable and not usable[j],
        )
        for j, cfg in enumerate(configs)
    )
    # the model's picks: tier 2 re-ranks the tier-1 best, kernels that spill last (as the search)
    picks = sorted(
        (j for j in best_t1 if j in preds), key=lambda j: (not usable[j], preds[j].seconds)
    )
    rank = np.full(len(configs), np.inf)
    for r, j in enumerate(picks):
        rank[j] = r
    top = tuple(topk_score(rank, measured, k) for k in TOP_K)
    scored_sample = [j for j in drawn if j in preds]
    p = np.array([preds[j].seconds * 1e3 for j in scored_sample])
    m = measured[scored_sample]
    return MeasuredAccuracy(
        target=hw.name,
        kernel=cache.kernel_name,
        device=cache.device_name,
        shape=(M, N, K),
        configs=len(cache.configs),
        failed=cache.failed,
        rejected=tuple(rejected),
        kernels=kernels,
        sample=tuple(scored_sample),
        picks=tuple(picks),
        tier2_failed=failed2,
        seed=seed,
        spearman=spearman(p, m),
        kendall=kendall(p, m),
        top=top,
        median_abs_error=median_abs_error(p, m),
        seconds=time.perf_counter() - start,
        spec_from=getattr(hw, "spec_from", ""),
    )


def _params_text(k: ScoredKernel) -> str:
    """The measured parameters that vary (fixed ones such as PRECISION left out)."""
    return " ".join(f"{n}={v}" for n, v in k.params if n not in ("PRECISION", "GEMMK", "KREG"))


def report_lines(r: MeasuredAccuracy) -> list[str]:
    """What ``aotune accuracy --measured`` prints."""
    M, N, K = r.shape
    lines = [
        f"{r.kernel} on {r.device}: {r.configs} timed configs (M={M} N={N} K={K})"
        + (f", {r.failed} failed ones skipped" if r.failed else "")
        + f"; model: {r.target}",
        *([f"spec: {r.spec_from}"] if r.spec_from else []),
        f"mapped {r.mapped}, rejected by aotune's space {len(r.rejected)}, scored {r.scored} "
        f"as {len(r.kernels)} distinct kernels (configs that differ only in a parameter their "
        f"kernel ignores are one kernel, at the mean of their times)",
    ]
    for key, why in r.rejected:
        lines.append(f"  rejected {key}: {why}")
    for cfg, why in r.tier2_failed:
        lines.append(f"  tier 2 failed for {cfg}: {why}")
    lines += [
        f"Spearman {r.spearman:.3f}  Kendall {r.kendall:.3f}  median |predicted/measured - 1| "
        f"{r.median_abs_error:.3g}   (tier 2 on a sample of {len(r.sample)}, seed {r.seed})",
        f"top-1 {r.top[0]:.3f}  top-5 {r.top[1]:.3f}  top-10 {r.top[2]:.3f}   (best measured / "
        f"best measured among the model's top k; tier 2 re-ranks the tier-1 best {len(r.picks)})",
        "model's top 10:",
    ]
    for rank, j in enumerate(r.picks[:10], 1):
        k = r.kernels[j]
        lines.append(
            f"  {rank:2d}. predicted {k.tier2_ms:8.2f} ms  measured {k.measured_ms:8.2f} ms  "
            f"{_params_text(k)}"
        )
    lines.append("measured top 10:")
    for rank, j in enumerate(r.true_top(10), 1):
        k = r.kernels[j]
        pred = f"{k.tier2_ms:8.2f}" if k.tier2_ms is not None else "       -"
        lines.append(
            f"  {rank:2d}. predicted {pred} ms  measured {k.measured_ms:8.2f} ms  {_params_text(k)}"
        )
    lines.append(f"took {r.seconds:.0f} s")
    return lines


PLOT_NEEDS = "--plot needs matplotlib, which is not installed; pip install 'aotune[plot]'"


def require_matplotlib() -> None:
    """Refuse ``--plot`` before the run where matplotlib is missing (the run takes minutes)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(PLOT_NEEDS) from None


def plot_png(r: MeasuredAccuracy, title: str | None = None) -> bytes:
    """Predicted vs measured, log-log: every kernel by tier 1 (grey), the tier-2 sample (blue),
    the model's top 10 and the measured top 10 marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(PLOT_NEEDS) from None
    ks = r.kernels
    # times past OUTLIER_TIMES_MEDIAN x the median (a damaged entry, warned of when read) and
    # kernels that cannot launch would stretch the log axes past what they can draw
    bound = OUTLIER_TIMES_MEDIAN * float(np.median([k.measured_ms for k in ks]))
    shown = {
        j
        for j, k in enumerate(ks)
        if k.measured_ms <= bound
        and math.isfinite(k.tier1_ms)
        and (k.tier2_ms is None or math.isfinite(k.tier2_ms))
    }
    if not shown:
        raise ConfigError("--plot: no kernel can be drawn: none of them can launch on the target")
    drawn = sorted(shown)
    left_out = len(ks) - len(drawn)
    sample = [j for j in r.sample if j in shown]
    fig, ax = plt.subplots(figsize=(6.4, 5.2), dpi=90)
    ax.scatter(
        [ks[j].measured_ms for j in drawn],
        [ks[j].tier1_ms for j in drawn],
        s=2,
        c="0.8",
        label=f"tier 1, all {len(ks)} kernels"
        + (
            f" ({left_out} not drawn: over {OUTLIER_TIMES_MEDIAN:g}x the median time, or "
            "unlaunchable)"
            if left_out
            else ""
        ),
        rasterized=True,
    )
    ax.scatter(
        [ks[j].measured_ms for j in sample],
        [ks[j].tier2_ms for j in sample],
        s=5,
        c="tab:blue",
        label=f"tier 2, sample of {len(sample)}",
    )
    true_top = [j for j in r.true_top(10) if ks[j].tier2_ms is not None and j in shown]
    ax.scatter(
        [ks[j].measured_ms for j in true_top],
        [ks[j].tier2_ms for j in true_top],
        s=60,
        facecolors="none",
        edgecolors="tab:green",
        linewidths=1.5,
        label="measured top 10",
    )
    picks = [j for j in r.picks[:10] if j in shown]
    ax.scatter(
        [ks[j].measured_ms for j in picks],
        [ks[j].tier2_ms for j in picks],
        s=40,
        marker="x",
        c="tab:red",
        label="model's top 10",
    )
    lo = min(min(ks[j].measured_ms for j in drawn), min(ks[j].tier1_ms for j in drawn))
    hi = max(max(ks[j].measured_ms for j in drawn), max(ks[j].tier1_ms for j in drawn))
    ax.plot([lo, hi], [lo, hi], c="0.5", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured ms")
    ax.set_ylabel("predicted ms")
    ax.set_title(
        title
        or f"{r.kernel} on {r.device} ({r.target} model): Spearman {r.spearman:.2f}, "
        f"top-1 {r.top[0]:.2f}, top-10 {r.top[2]:.2f}",
        fontsize=8,
    )
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_plot(r: MeasuredAccuracy, path: str, force: bool) -> None:
    """Write the plot to ``path`` (never over an existing file without ``force``)."""
    write_new_file(path, plot_png(r), force, ConfigError)


def _check_host_runs(hw: Any) -> None:
    """Refuse a target whose kernels this machine cannot time."""
    from aotune.hwspecs.host import host_can_run

    if target_for(hw).kind != "cpu":
        raise ConfigError(
            f"accuracy WORKLOAD times kernels on this machine, which cannot run {hw.name}'s; for "
            f"a GPU give --measured FILE with timings made on one (a Kernel Tuner cache)"
        )
    runs, why = host_can_run(hw)
    if not runs:
        raise ConfigError(f"accuracy WORKLOAD times kernels here, and {why}; use --target host")


def _kernel_name(w: Any) -> str:
    """The workload as the JSON's "kernel" names it: operator and sizes."""
    return f"{w.op} {'x'.join(str(x) for _, x in w.shape)}"


def _warn_if_other_core(hw: Any, warn: Callable[[str], None] | None, timed: str) -> None:
    """Tell ``warn`` when ``hw`` models another core than this host's (``other_core_warning``)."""
    from aotune.hwspecs.host import other_core_warning

    text = other_core_warning(hw, timed)
    if warn and text:
        warn(text)


def _warn_if_shared(
    acc: Mapping[str, Any], warn: Callable[[str], None] | None, when: str, so: str
) -> None:
    """Tell ``warn`` when others used enough of the machine ``when`` timings ran to slow them."""
    shared = acc["sharing"] and machine_load.Sharing(**acc["sharing"]).warning(when, so)
    if warn and shared:
        warn(shared)


MAX_GIVEN_CONFIGS = 64  # each is compiled, checked and timed in every round


def host_configs(
    w: Any,
    hw: Any,
    texts: Sequence[str],
    seed: int,
    log: Log = None,
    warn: Callable[[str], None] | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    """``aotune accuracy WORKLOAD --config C ...``: the given configs predicted, checked against
    numpy and timed side by side on this host (``suite.configs_side_by_side``, in rounds for
    ``seconds``, a third of the bench's sweep unless given): where the model misses on a kernel of
    the user's choosing, and by which terms."""
    from aotune.benchmarks.suite import ACCURACY_SWEEP_SECONDS, configs_side_by_side
    from aotune.constraints.cpu import build_cpu_space

    _check_host_runs(hw)
    _warn_if_other_core(hw, warn, "the configs time")
    if not 1 <= len(texts) <= MAX_GIVEN_CONFIGS:
        raise ConfigError(
            f"{len(texts)} --config given: each is compiled and timed here; give 1 to "
            f"{MAX_GIVEN_CONFIGS}"
        )
    space = build_cpu_space(w, hw)
    configs: list[Config] = []
    for text in texts:
        cfg = space.parse_config(text)
        bad = space.violations(cfg)
        if bad:
            raise ConfigError(
                f"--config {text!r} is not valid for {space.title}: " + "; ".join(map(str, bad))
            )
        if cfg in configs:  # keys in another order are the same config: timed once is enough
            raise ConfigError(
                f"--config {text!r} is given twice (as {texts[configs.index(cfg)]!r}); give "
                "each config once"
            )
        configs.append(cfg)
    start = time.perf_counter()
    acc = configs_side_by_side(
        w,
        hw,
        space,
        configs,
        seed=seed,
        log=log,
        seconds=ACCURACY_SWEEP_SECONDS / 3 if seconds is None else seconds,
    )
    _warn_if_shared(acc, warn, "while the configs were timed", "their times may read slow")
    return {
        "target": hw.name,
        "kernel": _kernel_name(w),
        "configs": acc["configs"],
        "clock_ghz": [round(g, 3) for g in acc["clock_ghz"]],
        "spec_clock_ghz": hw.core.frequency_ghz,
        "fma_per_cycle": [round(r, 2) for r in acc["fma_per_cycle"]],
        "spec_fma_per_cycle": hw.vector_fmas_per_cycle,
        "rounds": acc["rounds"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def config_lines(result: Mapping[str, Any]) -> list[str]:
    """``host_configs``' result as text: one line per config, its largest terms under it."""
    clocks = ", ".join(f"{g:.2f}" for g in result["clock_ghz"])
    fmas = ", ".join(f"{r:.2f}" for r in result["fma_per_cycle"])
    lines = [
        f"{result['kernel']} on {result['target']}: the clock read {clocks} GHz (the spec says "
        f"{result['spec_clock_ghz']:g}), the core issued {fmas} FMAs a cycle (the spec's pipes "
        f"{result['spec_fma_per_cycle']:g}); {result['rounds']} rounds, {result['seconds']} s"
    ]
    for c in result["configs"]:
        flag = "" if c["correct"] else "  WRONG RESULT against numpy"
        lines.append(
            f"  measured {c['measured_s'] * 1e3:9.3f} ms  predicted {c['predicted_s'] * 1e3:9.3f} "
            f"ms  x{c['measured_over_predicted']:.2f}  {c['gflops']:7.1f} GFLOP/s  "
            f"{c['config']}{flag}"
        )
        terms = sorted(c["breakdown_s"].items(), key=lambda kv: -kv[1])
        lines.append(
            "      "
            + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in terms if v > 0)
            + f" ms; bound by {c['bottleneck']}"
        )
    return lines


def host_accuracy(
    w: Any,
    hw: Any,
    samples: int,
    seed: int,
    log: Log = None,
    timing_seconds: tuple[float, float] | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``aotune accuracy WORKLOAD`` on this host: sample valid configs, compile, check, measure
    and predict each one as the bench's accuracy rows do (``suite.model_accuracy``, timed for
    ``timing_seconds`` = (sweep, finalists), the bench's by default), in the JSON fields of
    ``accuracy --measured``; ``warn`` is told when others used enough of the machine meanwhile to
    slow the timings (``machine_load``)."""
    from aotune.benchmarks.suite import (
        ACCURACY_SWEEP_SECONDS,
        FINALIST_SECONDS,
        MAX_SAMPLES,
        model_accuracy,
    )

    _check_host_runs(hw)
    _warn_if_other_core(hw, warn, "the samples time")
    if samples < 2 * max(TOP_K):  # of 10 configs, the model's top 10 hold the best by force
        raise ConfigError(
            f"--sample {samples}: the top-{max(TOP_K)} score needs twice as many configs to "
            f"mean something; give at least {2 * max(TOP_K)}"
        )
    if samples > MAX_SAMPLES:
        raise ConfigError(
            f"--sample {samples}: each config is compiled and timed here (64 take about a "
            f"minute); give at most {MAX_SAMPLES}"
        )
    start = time.perf_counter()
    sweep, finalists = timing_seconds or (ACCURACY_SWEEP_SECONDS, FINALIST_SECONDS)
    acc = model_accuracy(
        w, hw, samples, seed=seed, log=log, sweep_seconds=sweep, finalist_seconds=finalists
    )
    _warn_if_shared(
        acc, warn, "while the samples were timed", "their times may read slow and their order move"
    )
    if warn and acc["n"] < samples:
        warn(
            f"--sample {samples}: the sampler's draws found only {acc['n']} distinct valid "
            f"configs of {_kernel_name(w)} (a small shape's space holds few); those were scored"
        )
    return {
        "target": hw.name,
        "kernel": _kernel_name(w),
        "configs": acc["n"],
        "mapped": acc["n"],
        "rejected_by_space": 0,
        "scored": acc["n"],
        "spearman": round(acc["spearman"], 4),
        "kendall": round(acc["kendall"], 4),
        "top1": round(acc["top1"], 4),
        "top5": round(acc["top5"], 4),
        "top10": round(acc["top10"], 4),
        "median_abs_error": round(acc["median_abs_error"], 4),
        "seconds": round(time.perf_counter() - start, 1),
    }


# the measured spaces the full bench scores (beside the checkout, as in the repository's layout)
DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "kernel-tuner"
BENCH_FILES = (("gemm_RTX_2080_Ti.json.gz", "rtx-2080-ti"), ("gemm_RTX_Titan.json.gz", "titan-rtx"))


def bench_rows(log: Log = None, data_dir: Path = DATA_DIR) -> list[dict[str, Any]]:
    """The full bench's GPU accuracy rows: ``accuracy --measured`` on each file that is present
    (a missing one is a row that says where it was looked for)."""
    rows: list[dict[str, Any]] = []
    for name, target in BENCH_FILES:
        path = data_dir / name
        if not path.is_file():
            rows.append({"file": name, "target": target, "skipped": f"{path} not found"})
            continue
        if log:
            log(f"[bench] accuracy --measured {name} --target {target}")
        rows.append({"file": name, **measured_accuracy(path, target, log=log).as_json()})
    return rows


def print_bench_rows(rows: list[dict[str, Any]], console: Any) -> None:
    """The GPU accuracy rows as a rich table."""
    from rich.table import Table

    table = Table(title="GPU model against measured kernels (aotune accuracy --measured)")
    for col in ("file", "target", "configs", "Spearman", "Kendall", "top-1", "top-5", "top-10",
                "median error", "seconds"):  # fmt: skip
        table.add_column(col, overflow="fold")
    for r in rows:
        if "skipped" in r:
            table.add_row(r["file"], r["target"], "-", "-", "-", "-", "-", "-", r["skipped"], "-")
            continue
        table.add_row(
            r["file"], r["target"], str(r["configs"]),
            *(f"{r[k]:.2f}" for k in ("spearman", "kendall", "top1", "top5", "top10")),
            f"{r['median_abs_error']:.3g}", f"{r['seconds']:.0f}",
        )  # fmt: skip
    console.print(table)
