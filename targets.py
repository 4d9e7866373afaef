"""Targets: the few pieces a kind of hardware supplies, so the driver, the CLI and the bench never
branch on the kind.

Roadmap: ``TARGET_KINDS`` maps a spec's ``kind`` to its Target: ``cpu`` (BLIS-style kernels,
capstone features, verified on the host) and ``gpu`` (tiled SIMT GEMMs, PTX + ptxas + SASS
features, emulated on the host, verified only where a GPU and its driver are present). A new kind
adds a class here and a schema in ``hwspecs/``; nothing else dispatches on it.

Every target supplies: ``build_space``, ``schedule``, ``compile``, ``features``, ``estimate``
(tier 1), ``predict`` (tier 2), ``kernel_keys`` (which candidates are one kind of kernel),
``usable`` (a tier-2 kernel fit to be in the top-k), ``describe`` (the JSON ``target`` block),
``emit`` (the ``--emit-*`` artefacts), ``candidate_report`` (per top-k extras in the JSON) and
``can_verify``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from aotune.analysis.model import Prediction
from aotune.analysis.workload import Workload
from aotune.constraints.space import Config, Space
from aotune.errors import HwSpecError


class CpuTarget:
    """A CPU: the pieces the CPU path has always used, unchanged."""

    kind = "cpu"
    baseline_name = "numpy"  # what the final check times beside the kernels
    feature_key = "loop"  # the name of the features in ``aotune predict --json``

    def __init__(self, hw: Any) -> None:
        from aotune.analysis.model import AnalyticalCpuModel

        self.hw = hw
        self.model = AnalyticalCpuModel(hw)

    def build_space(self, w: Workload) -> Space:
        """The CPU space of ``w``."""
        from aotune.constraints.cpu import build_cpu_space

        return build_cpu_space(w, self.hw)

    def schedule(self, space: Space, cfg: Config) -> Any:
        """Config -> CpuSchedule."""
        from aotune.codegen.schedule import schedule_from_config

        return schedule_from_config(space, cfg)  # type: ignore[arg-type]

    def compile(self, schedule: Any) -> Any:
        """Schedule -> object code."""
        from aotune.codegen.compile import compile_kernel

        return compile_kernel(schedule, self.hw)

    def compile_and_read(self, schedule: Any) -> tuple[Any, Any]:
        """(kernel, features) of one schedule."""
        kernel = self.compile(schedule)
        return kernel, self.features(kernel)

    def compile_and_read_many(
        self, schedules: Sequence[Any], progress: Callable[[int, int], None] | None = None
    ) -> list[tuple[Any, Any]]:
        """(kernel, features) of each schedule, in order; ``progress(done, total)`` as they
        come."""
        out = []
        for s in schedules:
            out.append(self.compile_and_read(s))
            if progress:
                progress(len(out), len(schedules))
        return out

    def features(self, kernel: Any) -> Any:
        """The micro-kernel loop's instruction mix (capstone)."""
        from aotune.analysis.features import kernel_features

        return kernel_features(kernel, self.hw.isa.arch).loop

    def estimate(self, schedules: Sequence[Any]) -> list[Prediction]:
        """Tier 1."""
        return self.model.estimate_batch(schedules)

    def predict(self, schedules: Sequence[Any], features: Sequence[Any]) -> list[Prediction]:
        """Tier 2."""
        return self.model.predict_batch(schedules, features)

    def kernel_keys(self, schedule: Any) -> tuple[tuple[int, ...], ...]:
        """What kind of kernel it is, coarse to fine, for the final check to take one of each:
        how its threads split C (what two threads writing the same pages of C cost depends on
        where the OS places them, which no static model sees: on a VM the hand-over reads 40 or
        190 ns from one minute to the next; README, stop 72), how it reads A and B (packed
        panels or rows in place, where the model errs most: see the README's Zen 3 notes), then
        its micro-kernel (register tile and those reads)."""
        split = int(schedule.threads > 1 and schedule.par == "n")  # 1: they split its columns
        reads = (int(schedule.pack_a), int(schedule.pack_b))
        return ((split,), reads, (schedule.mr, schedule.nr, *reads))

    def usable(self, features: Any) -> bool:
        """Every compiled CPU kernel may be picked."""
        return True

    def describe(self) -> dict[str, Any]:
        """The JSON ``target`` block."""
        hw = self.hw
        return {
            "name": hw.name,
            "kind": hw.kind,
            "isa": f"{hw.isa.arch} {hw.isa.llvm_cpu} {hw.isa.vector_bits}-bit",
            "triple": hw.isa.triple,
            "core_model_from": hw.core_model_from,
        }

    def emit(self) -> dict[str, Callable[[Any], str | bytes]]:
        """``--emit-<name>`` -> the artefact of a kernel."""
        return {"asm": lambda k: k.asm, "ir": lambda k: k.llvm_ir}

    def candidate_report(
        self, candidates: Sequence[Any], seed: int = 0, emulate: bool = True
    ) -> list[dict] | None:
        """Per top-k extras for the JSON (the CPU has none: its top-k is verified on the host)."""
        return None

    def can_verify(self) -> tuple[bool, str]:
        """Whether the final check can run here: natively (the target is this host's kind) or,
        for a foreign ISA, under emulation (correctness only)."""
        from aotune.codegen.emulate import can_emulate
        from aotune.hwspecs.host import host_can_run

        ok, why = host_can_run(self.hw)
        if ok:
            return ok, why
        emulated, why_not = can_emulate(self.hw)
        return (True, "") if emulated else (False, f"{why}; {why_not}")

    def final_check(
        self, kernels: Sequence[Any], labels: Sequence[str], seed: int, min_runs: int
    ) -> tuple[list[Any], float | None]:
        """Each kernel against numpy on shared inputs: run here and timed side by side with
        numpy, or for a foreign ISA run under emulation (correct or not, no time). Returns (one
        check per kernel, the baseline's median seconds or None)."""
        from aotune.codegen.emulate import final_check_emulated
        from aotune.codegen.runner import final_check_side_by_side, random_operands
        from aotune.hwspecs.host import host_can_run

        a, b, bias = random_operands(kernels[0].schedule, seed)
        if not host_can_run(self.hw)[0]:
            return list(final_check_emulated(kernels, a, b, bias, labels)), None
        measured, numpy_seconds = final_check_side_by_side(
            list(kernels), self.hw, a, b, bias, min_runs=min_runs
        )
        return measured, numpy_seconds

    def check_final_check_memory(self, w: Workload, kernels: int) -> None:
        """Refuse a final check that would not fit in this machine's memory (every thread may
        hold its own padded copy of the input)."""
        from aotune.codegen.runner import check_final_check_memory

        check_final_check_memory(w, kernels, self.hw.core.cores)

    def feature_summary(self, features: Any) -> tuple[dict[str, Any], str]:
        """(JSON form, one line) of a kernel's features for ``aotune predict``."""
        loop = features
        return vars(loop), (
            f"micro-kernel loop ({loop.function}): {loop.fma} FMA, {loop.vector_loads} vector "
            f"loads, {loop.scalar_loads} scalar/broadcast loads, {loop.prefetches} prefetches, "
            f"{loop.stores} stores, "
            f"{loop.spills} spills, {loop.other} other"
        )

    def check_config(self, space: Space, cfg: Config) -> list[str]:
        """Problems beyond the space's constraints (none for a CPU)."""
        return []

    def kernel_problems(self, kernel: Any) -> list[str]:
        """Problems the toolchain found in a compiled kernel (none for a CPU)."""
        return []


class GpuTarget:
    """An NVIDIA GPU: tiled SIMT GEMMs, PTX/ptxas/SASS, host emulation, device check."""

    kind = "gpu"
    baseline_name = "cuBLAS SGEMM (FP32, through cupy)"
    feature_key = "features"

    def __init__(self, hw: Any) -> None:
        from aotune.analysis.gpu_model import AnalyticalGpuModel

        self.hw = hw
        self.model = AnalyticalGpuModel(hw)

    def build_space(self, w: Workload) -> Space:
        """The GPU space of ``w``."""
        from aotune.constraints.gpu import build_gpu_space

        return build_gpu_space(w, self.hw)

    def schedule(self, space: Space, cfg: Config) -> Any:
        """Config -> GpuSchedule."""
        from aotune.codegen.gpu_schedule import schedule_from_config

        return schedule_from_config(space, cfg)  # type: ignore[arg-type]

    def compile(self, schedule: Any) -> Any:
        """Schedule -> PTX -> cubin (ptxas)."""
        from aotune.codegen.gpu_compile import compile_gpu_kernel

        return compile_gpu_kernel(schedule, self.hw)

    def compile_and_read(self, schedule: Any) -> tuple[Any, Any]:
        """(kernel, features) of one schedule."""
        kernel = self.compile(schedule)
        return kernel, self.features(kernel)

    def compile_and_read_many(
        self, schedules: Sequence[Any], progress: Callable[[int, int], None] | None = None
    ) -> list[tuple[Any, Any]]:
        """(kernel, features) of each schedule, in order: ptxas beside LLVM, and one nvdisasm
        run for the SASS of them all."""
        from aotune.codegen.gpu_compile import compile_gpu_kernels

        kernels = compile_gpu_kernels(schedules, self.hw, progress)
        return [(k, self.features(k)) for k in kernels]

    def features(self, kernel: Any) -> Any:
        """SASS (or PTX) mix and ptxas's resources."""
        from aotune.analysis.gpu_features import gpu_features

        return gpu_features(kernel)

    def features_many(self, kernels: Sequence[Any]) -> list[Any]:
        """``features`` of many kernels, disassembled by one nvdisasm run."""
        from aotune.analysis.gpu_features import gpu_features_many

        return gpu_features_many(list(kernels))

    def estimate(self, schedules: Sequence[Any]) -> list[Prediction]:
        """Tier 1."""
        return self.model.estimate_batch(schedules)

    def predict(self, schedules: Sequence[Any], features: Sequence[Any]) -> list[Prediction]:
        """Tier 2."""
        return self.model.predict_batch(schedules, features)

    def kernel_keys(self, schedule: Any) -> tuple[tuple[int, ...], ...]:
        """What kind of kernel it is, for the final check to take one of each: its block and
        thread tile."""
        return ((schedule.bm, schedule.bn, schedule.mwi, schedule.nwi),)

    def usable(self, features: Any) -> bool:
        """A kernel that spills, or that has more registers a thread than the spec allows, is
        never picked while one that does not remains."""
        regs_ok = features.registers <= self.hw.limits.max_registers_per_thread
        return features.spill_bytes == 0 and regs_ok

    def describe(self) -> dict[str, Any]:
        """The JSON ``target`` block."""
        from aotune.hwspecs.gpu_spec import gpu_spec_from
        from aotune.hwspecs.spec import builtin_names

        hw = self.hw
        return {
            "name": hw.name,
            "kind": hw.kind,
            "sm": hw.sm_name,
            "ptx_isa": hw.ptx_isa,
            "triple": hw.arch.triple,
            "peak_tflops": round(hw.peak_flops / 1e12, 2),
            "spec_from": gpu_spec_from(hw, builtin_names()),
        }

    def emit(self) -> dict[str, Callable[[Any], str | bytes]]:
        """``--emit-<name>`` -> the artefact of a kernel."""
        return {"ptx": lambda k: k.ptx, "cubin": lambda k: k.cubin, "ir": lambda k: k.llvm_ir}

    def candidate_report(
        self, candidates: Sequence[Any], seed: int = 0, emulate: bool = True
    ) -> list[dict] | None:
        """The issue's ``top`` entries: resources from ptxas, occupancy, waves, and unless
        ``emulate`` is off (``--no-verify``: nothing is computed on this CPU) the emulated check
        against numpy (inputs and reference made once for all)."""
        from aotune.codegen.gpu_emulator import _reference, check_emulated, random_inputs

        if not candidates:
            return []
        if emulate:
            s0 = candidates[0].schedule
            inputs = random_inputs(s0, seed)
            ref = _reference(s0, *inputs)
        out = []
        for c in candidates:
            f = self.features(c.kernel)
            occ = self.model.occupancy(c.schedule, f)
            s = c.schedule
            per_wave = max(1, occ.blocks_per_sm) * self.hw.compute.sms
            emulated = (
                check_emulated(c.kernel, seed=seed, inputs=inputs, reference=ref).as_dict()
                if emulate
                else None
            )
            out.append(
                {
                    "rank": c.rank,
                    "predicted_seconds": c.prediction.seconds,
                    "predicted_tflops": s.flops / c.prediction.seconds / 1e12,
                    "peak_fraction": s.flops / c.prediction.seconds / self.hw.peak_flops,
                    "bottleneck": c.prediction.bottleneck,
                    "resources": {
                        "registers": f.registers,
                        "spill_bytes": f.spill_bytes,
                        "shared_bytes": f.shared_bytes,
                        "threads_per_block": s.threads,
                        "blocks_per_sm": occ.blocks_per_sm,
                        "occupancy": round(occ.occupancy, 4),
                        "waves": -(-(s.grid[0] * s.grid[1] * s.grid[2]) // per_wave),
                    },
                    "ptxas_ok": True,
                    "emulated": emulated,
                    "launch": c.kernel.launch.as_dict(),
                }
            )
        return out

    def can_verify(self) -> tuple[bool, str]:
        """Whether a GPU of this target's kind and its driver are here."""
        from aotune.codegen.cuda_device import device_available

        return device_available(self.hw)

    def final_check(
        self, kernels: Sequence[Any], labels: Sequence[str], seed: int, min_runs: int
    ) -> tuple[list[Any], float | None]:
        """Each kernel launched on the GPU on shared inputs, every output element compared with
        numpy, timed with CUDA events; cuBLAS's SGEMM of the same size as the baseline where the
        workload is one plain GEMM and cupy is installed."""
        import numpy as np
        from aotune.codegen.cuda_device import cublas_sgemm_seconds, run_on_device
        from aotune.codegen.gpu_emulator import _reference, random_inputs
        from aotune.codegen.runner import tolerance

        s = kernels[0].schedule
        inputs = random_inputs(s, seed)
        ref = _reference(s, *inputs)
        tol = tolerance(inputs[0], inputs[1], s.K, np.asarray(ref) if s.has_epilogue else None)
        runs = max(min_runs, 10)
        checks = [run_on_device(k, inputs, ref, tol, runs=runs) for k in kernels]
        plain = s.conv is None and s.batch == 1 and not s.has_epilogue
        baseline = cublas_sgemm_seconds(self.hw, s.M, s.N, s.K, runs) if plain else None
        return checks, baseline

    def check_final_check_memory(self, w: Workload, kernels: int) -> None:
        """Refuse a device check whose host-side inputs and numpy reference would not fit here."""
        from aotune.codegen.runner import check_final_check_memory

        check_final_check_memory(w, kernels, 1)

    def feature_summary(self, features: Any) -> tuple[dict[str, Any], str]:
        """(JSON form, one line) of a kernel's features for ``aotune predict``."""
        m = features.mix
        data = {
            "registers": features.registers,
            "spill_bytes": features.spill_bytes,
            "shared_bytes": features.shared_bytes,
            "mix": vars(m),
        }
        return data, (
            f"{m.source.upper()} per FFMA: {m.lds_per_ffma:.3f} LDS ({m.lds_bytes_per_ffma:.2f} "
            f"B), {m.sts_per_ffma:.3f} STS, {m.ldg_per_ffma:.3f} LDG, {m.other_per_ffma:.3f} "
            f"other; ptxas: {features.registers} registers, {features.spill_bytes} B spilled, "
            f"{features.shared_bytes} B shared"
        )

    def check_config(self, space: Space, cfg: Config) -> list[str]:
        """What ptxas says about a config the constraints accept: rejection or spills."""
        from aotune.errors import CodegenError

        try:
            kernel = self.compile(self.schedule(space, cfg))
        except CodegenError as e:
            return [f"ptxas: {e}"]
        return self.kernel_problems(kernel)

    def kernel_problems(self, kernel: Any) -> list[str]:
        """What ptxas reported of a compiled kernel that makes it unusable: spills, with the
        register limit that applied (a block of many threads leaves each fewer registers)."""
        from aotune.analysis.gpu_model import registers_per_thread_cap

        r, threads = kernel.report, kernel.schedule.threads
        lim = self.hw.limits
        over = registers_past_limit(r.registers, self.hw)  # below ptxas's floor (24 on sm_90)
        if over:
            return [
                f"registers/thread: {over}: it cannot launch on this GPU; use a smaller thread "
                "tile (bm/tx x bn/ty: a smaller bm or bn, or more threads tx or ty), or check "
                "the spec"
            ]
        if not r.spill_bytes:
            return []
        # the block's size, not the thread limit, set the registers each thread could have
        by_block = registers_per_thread_cap(threads, self.hw) < lim.max_registers_per_thread
        why = (
            f"the most each of a block's {threads} threads may have ({lim.registers_per_sm} "
            f"per SM / {threads})"
            if by_block
            else "the most a thread may have"
        )
        return [
            f"registers/thread: ptxas spills {r.spill_store_bytes} B and reloads "
            f"{r.spill_load_bytes} B per thread at {r.registers} registers, {why}; use a "
            + (
                "smaller thread tile (bm/tx x bn/ty) with a smaller bm or bn, or fewer threads "
                "per block"
                if by_block
                else "smaller thread tile (bm/tx x bn/ty: a smaller bm or bn, or more threads tx "
                "or ty)"
            )
        ]


def registers_past_limit(registers: int, hw: Any) -> str | None:
    """What is wrong where ptxas gives a thread more registers than GPU spec ``hw`` allows; None
    where it does not."""
    limit = hw.limits.max_registers_per_thread
    if registers <= limit:
        return None
    return (
        f"ptxas gives a thread {registers} registers and the spec allows {limit} "
        "(limits.max_registers_per_thread)"
    )


TARGET_KINDS: dict[str, type] = {"cpu": CpuTarget, "gpu": GpuTarget}


def spec_origin_lines(hw: Any) -> list[str]:
    """What a target's header says of where its spec came from, when it is not plainly the
    built-in of its name: a CPU's core model (``core_model_from``), a GPU file's departure from
    the built-in whose name it keeps (``spec_from``)."""
    model = getattr(hw, "core_model_from", hw.name)
    return ([f"core model: {model}"] if model != hw.name else []) + (
        [f"spec: {hw.spec_from}"] if getattr(hw, "spec_from", "") else []
    )


@functools.lru_cache(maxsize=32)
def target_for(hw: Any) -> Any:
    """The Target of a spec, by its kind."""
    if hw.kind not in TARGET_KINDS:
        raise HwSpecError(f"no target kind {hw.kind!r}; known: {', '.join(TARGET_KINDS)}")
    return TARGET_KINDS[hw.kind](hw)
