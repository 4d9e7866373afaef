"""Two-tier tuning without measurement, then (only when asked) the final check of the top-k.

target = target_for(hw)                            # the CPU or GPU pieces, by the spec's kind
space  = target.build_space(workload)               # CP-SAT, built once
tier 1 = strategy.tune(space, estimate)             # every candidate, config-only model
tier 2 = compile the best ``compile_top`` distinct estimates + features (capstone; SASS and
         ptxas for a GPU) + model.predict_batch; more while fewer than top_k are usable
top-k  = best usable tier-2 predictions, one per register tile while others remain
         # measurements: 0
verify = final check of the top-k vs numpy on the host, timed side by side
         # optional; a foreign-ISA target's top-k runs under qemu-user instead
         # (codegen/emulate.py): correct or not, never timed
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aotune.analysis.model import Prediction
from aotune.analysis.workload import Workload
from aotune.codegen.compile import Kernel
from aotune.codegen.cuda_device import DeviceMeasurement
from aotune.codegen.emulate import EmulatedCheck
from aotune.codegen.executions import executions
from aotune.codegen.runner import MIN_TIMED_RUNS, Measurement
from aotune.codegen.schedule import CpuSchedule
from aotune.constraints.cpu import CpuSpace
from aotune.constraints.space import Config
from aotune.errors import UnsatisfiableError
from aotune.hwspecs.spec import HwSpec
from aotune.search import cga, random
from aotune.search.options import SearchOptions
from aotune.targets import target_for

STRATEGIES = {"cga": cga.tune, "random": random.tune}
Progress = Callable[[str, int, int], None]
T = TypeVar("T")
# a kernel's kinds, coarse to fine (``Target.kernel_keys``)
KernelKeys = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Candidate:
    """A compiled candidate with both tiers of prediction."""

    rank: int
    config: Config
    schedule: CpuSchedule
    estimate: Prediction
    prediction: Prediction
    kernel: Kernel


@dataclass(frozen=True)
class TuneResult:
    """What a search produced, and what it cost."""

    workload: Workload
    hw: HwSpec
    space: CpuSpace
    options: SearchOptions
    candidates: tuple[Candidate, ...]  # the top-k, best predicted first
    search_seconds: float
    candidates_scored: int
    kernels_compiled: int
    measurements: int = 0  # runs of generated code during the search (counted; aotune's is 0)

    @property
    def best(self) -> Candidate:
        """The top-1 candidate."""
        return self.candidates[0]


@dataclass(frozen=True)
class Verified:
    """A candidate's final check."""

    candidate: Candidate
    measurement: Measurement | EmulatedCheck | DeviceMeasurement  # emulated: no time

    @property
    def emulated(self) -> bool:
        """Whether the check ran under emulation (correctness only, no time)."""
        return isinstance(self.measurement, EmulatedCheck)

    @property
    def gflops(self) -> float | None:
        """Measured GFLOP/s (None under emulation)."""
        if isinstance(self.measurement, EmulatedCheck):
            return None
        return self.candidate.schedule.flops / self.measurement.seconds / 1e9


def tune(
    workload: Workload,
    hw: HwSpec,
    options: SearchOptions = SearchOptions(),
    progress: Progress | None = None,
    space: CpuSpace | None = None,
) -> TuneResult:
    """Search ``workload`` on ``hw`` and return the top-k candidates, measuring nothing."""
    start = time.perf_counter()
    runs_before = executions()
    target = target_for(hw)
    space = space or target.build_space(workload)

    def estimate(cfg: Config) -> float:
        return target.estimate([target.schedule(space, cfg)])[0].seconds

    step = (lambda done, total: progress("search", done, total)) if progress else None
    scored = STRATEGIES[options.strategy](space, estimate, options, step)
    # configs with one estimate differ only in decisions the estimate ignores, and almost always
    # compile to the same predicted time: one of each, so the compile slots see different kernels
    estimates = {cfg: seconds for seconds, cfg in scored}
    ranked = cga.one_per_score([cfg for _, cfg in scored], estimates.__getitem__)
    ranked = with_kernels_spread(
        ranked,
        options.top_k,
        options.compile_top,
        lambda cfg: target.kernel_keys(target.schedule(space, cfg)),
    )
    shortlist, schedules, kernels, loops = compile_shortlist(
        target, space, ranked, options, progress
    )
    compiled = sorted(
        zip(
            target.predict(schedules, loops),
            target.estimate(schedules),
            shortlist,
            schedules,
            kernels,
            loops,
        ),
        # a kernel its target cannot use (a GPU kernel that spills) ranks after every usable one
        key=lambda c: (not target.usable(c[5]), c[0].seconds),
    )
    picked = usable_top_k(
        compiled, options.top_k, lambda c: target.usable(c[5]), lambda c: target.kernel_keys(c[3])
    )
    top = tuple(
        Candidate(i + 1, cfg, sched, est, pred, kernel)
        for i, (pred, est, cfg, sched, kernel, _) in enumerate(picked)
    )
    if top and not math.isfinite(top[0].prediction.seconds):
        # ptxas's registers (or the shared memory) leave no SM room for one block of any kernel
        problems = target.kernel_problems(top[0].kernel)  # a thread's registers past the limit
        why = problems[0] if problems else (
            "one block of the best needs more registers or shared memory than an SM of the "
            "spec has; check the spec's [limits] and [shared]"
        )  # fmt: skip
        raise UnsatisfiableError(
            f"no kernel the search compiled can launch on {hw.name} "
            f"({top[0].prediction.bottleneck}: {why})"
        )
    return TuneResult(
        workload,
        hw,
        space,
        options,
        top,
        time.perf_counter() - start,
        len(scored),
        len(shortlist),
        measurements=executions() - runs_before,
    )


def top_k_shortfall(result: TuneResult) -> str | None:
    """Why ``result`` holds fewer candidates than ``top_k`` asked for, in one line (None where it
    holds them all): the budget ran out first, or the configs the search met give fewer kernels
    (configs with one estimate are kept once)."""
    asked, given, scored = result.options.top_k, len(result.candidates), result.candidates_scored
    if given >= asked:
        return None
    head = f"{given} of the {asked} candidates asked for (--top-k {asked})"
    if scored >= result.options.budget:
        return (
            f"{head}: --budget {result.options.budget} estimated {scored} config(s), which give "
            f"{given} different kernel(s); a larger --budget gives more"
        )
    return (
        f"{head}: the search met only {scored} distinct config(s) before its draws stopped "
        f"finding new ones (--budget {result.options.budget}), which give {given} different "
        "kernel(s); a small shape's space holds few, and a larger --budget may reach more"
    )


# When fewer than top_k kernels of the shortlist are usable (GPU kernels that spill are not), the
# next best estimates are compiled too, EXTRA_BATCHES batches of half a shortlist at most.
EXTRA_BATCHES = 2


def compile_shortlist(
    target: Any,
    space: Any,
    ranked: list[Config],
    options: SearchOptions,
    progress: Progress | None = None,
) -> tuple[list[Config], list[Any], list[Any], list[Any]]:
    """Compile the ``compile_top`` best of ``ranked`` (best estimate first) and read their
    features: (configs, schedules, kernels, features), in the order compiled. While fewer than
    ``top_k`` of them are usable and more remain, compile the next ``compile_top // 2`` (up to
    ``EXTRA_BATCHES`` times): the tier-1 estimate cannot see every spill that ptxas will report,
    and a top-k of kernels that spill is none to ship."""
    configs: list[Config] = []
    schedules: list[Any] = []
    kernels: list[Any] = []
    loops: list[Any] = []
    batch = options.compile_top
    for _ in range(1 + EXTRA_BATCHES):
        todo = ranked[len(configs) : len(configs) + batch]
        if not todo:
            break
        new = [target.schedule(space, cfg) for cfg in todo]
        done = len(configs)
        # the target compiles a batch as it can best (a GPU: ptxas beside LLVM, one nvdisasm for
        # all); results keep the batch's order
        step = (lambda i, n, at=done: progress("compile", at + i, at + n)) if progress else None
        for kernel, feats in target.compile_and_read_many(new, step):
            kernels.append(kernel)
            loops.append(feats)
        configs += todo
        schedules += new
        if sum(1 for f in loops if target.usable(f)) >= options.top_k:
            break
        batch = max(1, options.compile_top // 2)
    return configs, schedules, kernels, loops


def usable_top_k(
    ranked: list[T],
    k: int,
    usable: Callable[[T], bool],
    keys_of: Callable[[T], KernelKeys],
) -> list[T]:
    """``spread_top_k`` of the usable items of ``ranked``; an unusable item (a GPU kernel that
    spills) fills a place only when no usable one is left for it."""
    picked = spread_top_k([c for c in ranked if usable(c)], k, keys_of)
    return picked + [c for c in ranked if not usable(c)][: k - len(picked)]


def _first_of_each(ranked: list[T], k: int, keys_of: Callable[[T], KernelKeys]) -> list[int]:
    """Indices of the first item of each distinct key among ``ranked``'s first ``k``, level by
    level (``keys_of``: coarse to fine): every coarse key first, then finer ones."""
    firsts: list[int] = []
    keys = [keys_of(item) for item in ranked]
    for level in range(max((len(ks) for ks in keys), default=0)):
        seen = {keys[i][level] for i in firsts if level < len(keys[i])}
        for i, ks in enumerate(keys):
            if len(firsts) == k:
                return sorted(firsts)
            if level < len(ks) and ks[level] not in seen and i not in firsts:
                firsts.append(i)
                seen.add(ks[level])
    return sorted(firsts)


def with_kernels_spread(
    ranked: list[T], k: int, slots: int, keys_of: Callable[[T], KernelKeys]
) -> list[T]:
    """``ranked`` with the best of each of its first ``k`` kinds of kernel (``keys_of``) among its
    first ``slots`` (k <= slots): when the best estimates all share a micro-kernel, the compiled
    shortlist still holds others for ``spread_top_k`` to pick; the last of the slots' repeats
    move out to make room, just behind them."""
    firsts = _first_of_each(ranked, k, keys_of)
    if all(i < slots for i in firsts):
        return ranked
    firsts_at = set(firsts)
    head = [i for i in range(slots) if i not in firsts_at][: max(0, slots - len(firsts))]
    front = sorted(set(head) | firsts_at)
    moved = set(front)
    return [ranked[i] for i in front] + [ranked[i] for i in range(len(ranked)) if i not in moved]


def spread_top_k(ranked: list[T], k: int, keys_of: Callable[[T], KernelKeys]) -> list[T]:
    """The ``k`` best of ``ranked`` (best predicted first), taking each kind of kernel once while
    others remain (``keys_of``: the target's ``kernel_keys``, coarse to fine; on a CPU how the
    kernel reads its operands, then its micro-kernel). The final check is there because the model
    can be wrong, and configs that share a kind of kernel tend to be wrong together."""
    taken = _first_of_each(ranked, k, keys_of)
    taken += [i for i in range(len(ranked)) if i not in taken][: k - len(taken)]
    return [ranked[i] for i in sorted(taken)]


def can_verify(hw: HwSpec) -> tuple[bool, str]:
    """Whether the final check can run here: a CPU target natively (this host's kind) or, for a
    foreign ISA, under emulation; a GPU target needs a GPU of its kind and the driver."""
    return target_for(hw).can_verify()


def verify(
    result: TuneResult,
    seed: int = 0,
    min_runs: int = MIN_TIMED_RUNS,
    progress: Progress | None = None,
) -> tuple[list[Verified], float | None]:
    """Final check of the top-k against numpy where the target can run them: (verified
    candidates, the baseline's GFLOP/s). The target decides how (``Target.final_check``): a CPU
    here, timed side by side with numpy; a foreign ISA under emulation (correctness only, no
    baseline: None); a GPU on the device, timed with CUDA events against cuBLAS where it can."""
    target = target_for(result.hw)
    target.check_final_check_memory(result.workload, len(result.candidates))
    if progress:
        progress("verify", 0, len(result.candidates))
    labels = [
        f"rank {c.rank} ({result.space.describe_config(c.config)})" for c in result.candidates
    ]
    checks, baseline_seconds = target.final_check(
        [c.kernel for c in result.candidates], labels, seed, min_runs
    )
    if progress:
        progress("verify", len(result.candidates), len(result.candidates))
    out = [Verified(cand, m) for cand, m in zip(result.candidates, checks, strict=True)]
    baseline = None if baseline_seconds is None else result.workload.flops / baseline_seconds / 1e9
    return out, baseline


def chosen(verified: list[Verified]) -> Verified | None:
    """The fastest correct kernel among the verified top-k (the best predicted correct one when
    they were checked under emulation, which times nothing)."""
    correct = [v for v in verified if v.measurement.correct]
    if not correct:
        return None
    if any(v.emulated for v in correct):
        return min(correct, key=lambda v: v.candidate.prediction.seconds)
    return min(correct, key=lambda v: v.measurement.seconds)  # type: ignore[union-attr]
