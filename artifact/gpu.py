"""The library backend of GPU targets: PTX and a cubin per kernel, and a manifest a launcher reads.

    ptx/NAME.ptx      the kernel for the target's PTX ISA (the driver can JIT it for newer GPUs)
    cubin/NAME.cubin  ptxas's machine code for the target's sm (what ``aotune.load`` launches)
    manifest entry    ``entry`` (the kernel's symbol, = NAME), ``params`` (the function's inputs in
                      ``tune --json``'s tensor order, then the output), ``kernel_args`` (the order
                      the kernel takes them: A, B, C, bias by role), ``launch`` (``grid``,
                      ``block``, ``dynamic_shared_bytes``, and ptxas's registers and static shared
                      bytes)

Nothing runs at build time on a machine without a GPU: each written kernel is checked against
numpy by the host emulation of its own code (``codegen/gpu_emulator.py``: every grid corner block
and seeded others); where a GPU of the target's kind and its driver are present, the written
cubins are launched instead (``aotune.load``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aotune.artifact.backends import Check, Chosen, Emitted
from aotune.artifact.cpu import params_of
from aotune.errors import AotuneError, BuildError
from aotune.targets import target_for


class GpuBackend:
    """PTX + cubin per kernel, and the manifest (no header: a GPU kernel is launched, not
    linked)."""

    def __init__(self) -> None:
        self._kernels: dict[str, Any] = {}

    def preflight(self, hw: Any, cc: str | None, objects_only: bool) -> None:
        """A cubin needs ptxas (from NVIDIA's wheel): refuse before any search without it, or
        with the options of a CPU library (a GPU library links nothing)."""
        from aotune.codegen.cuda_tools import tool_path

        given = [f for f, on in (("--cc", cc is not None), ("--objects-only", objects_only)) if on]
        if given:
            raise BuildError(
                f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to CPU "
                "libraries; a GPU library is PTX and cubins "
                f"made by ptxas and links nothing: leave out {' and '.join(given)}"
            )

        try:
            tool_path("ptxas")
        except AotuneError as e:
            raise BuildError(f"a GPU library needs ptxas for its cubins: {e}") from None

    def emit(
        self,
        chosen: list[Chosen],
        hw: Any,
        out_dir: Path,
        state: Any,
        cache: Any = None,
        names: Any = None,
    ) -> Emitted:
        """Compile each kernel under its own name and write its PTX and cubin (``names``: a CPU
        library's; a GPU library has no runtime of its own to name)."""
        from aotune.artifact.load import GPU_INTERFACE_SYMBOL, gpu_record_words
        from aotune.codegen.gpu_compile import compile_gpu_kernel, launch_of

        target = target_for(hw)
        (out_dir / "ptx").mkdir(parents=True, exist_ok=True)
        (out_dir / "cubin").mkdir(parents=True, exist_ok=True)
        spaces: dict[str, Any] = {}
        entries, files = [], []
        for ch in chosen:
            w = ch.request.workload
            if ch.record.workload_key not in spaces:
                spaces[ch.record.workload_key] = target.build_space(w)
            space = spaces[ch.record.workload_key]
            sched = target.schedule(space, space.config(ch.candidate.config))
            first, second = ("in0", "in1") if sched.a_is_first else ("in1", "in0")
            kernel_args = [first, second, "out", "bias"]
            launch = launch_of(sched, hw, ch.request.name)
            params = params_of(w)
            record = gpu_record_words(
                [(p.role, p.shape) for p in params],
                kernel_args,
                launch.grid,
                launch.block,
                launch.dynamic_shared_bytes,
            )  # what aotune.load checks the manifest against
            kernel = compile_gpu_kernel(
                sched,
                hw,
                entry=ch.request.name,
                exported={GPU_INTERFACE_SYMBOL.format(name=ch.request.name): record},
            )
            self._kernels[ch.request.name] = kernel
            ptx = out_dir / "ptx" / f"{ch.request.name}.ptx"
            cubin = out_dir / "cubin" / f"{ch.request.name}.cubin"
            ptx.write_text(kernel.ptx)
            cubin.write_bytes(kernel.cubin)
            files += [ptx, cubin]
            entry = ch.entry_base(hw)
            entry.update(
                config={
                    n: (space.var(n).label(v) if space.var(n).labels else v)
                    for n, v in ((n, ch.candidate.config[n]) for n in space.names)
                },
                entry=kernel.entry,
                ptx=str(ptx.relative_to(out_dir)),
                cubin=str(cubin.relative_to(out_dir)),
                params=[p.as_dict() for p in params],
                kernel_args=kernel_args,
                launch={
                    **kernel.launch.as_dict(),
                    "registers": kernel.report.registers,
                    "static_shared_bytes": kernel.report.shared_bytes,
                },
            )
            entries.append(entry)
        fields = {"sm": hw.sm_name, "ptx_isa": hw.ptx_isa}
        return Emitted(entries, files, fields, [])

    def check(self, out_dir: Path, chosen: list[Chosen]) -> tuple[dict[str, Check], str | None]:
        """Each written kernel against numpy: launched where a GPU of the target is present,
        else emulated on this CPU from its own code."""
        from aotune.codegen.cuda_device import device_available
        from aotune.codegen.gpu_emulator import check_emulated

        out: dict[str, Check] = {}
        first = next(iter(self._kernels.values()), None)
        on_device = first is not None and device_available(first.hw)[0]
        if on_device:
            from aotune.artifact.backends import check_library

            return check_library(out_dir, chosen), None
        for ch in chosen:
            e = check_emulated(self._kernels[ch.request.name])
            out[ch.request.name] = Check(e.correct, e.max_abs_error, e.tolerance)
        return out, None if on_device else "emulated on this CPU (no GPU of the target here)"
