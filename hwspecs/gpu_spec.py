"""Frozen descriptions of NVIDIA GPU targets (``kind = "gpu"`` spec files) and their strict loader.

Roadmap: fp32 SIMT facts only (FFMA lanes, LD/ST units, shared memory, registers, L2, DRAM);
tensor-core shapes and rates join as a ``[tensor]`` table when tensor-core kernels land.

The schema is the dataclasses below, read by the same walker as the CPU schema
(:func:`aotune.hwspecs.spec.build_dataclass`): an unknown, missing or wrong-typed key names the
file, the key and the expected type. Every number also carries a range in its field's metadata;
a value outside it, or not finite, is an error naming the file, the key and the range.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from aotune.errors import HwSpecError
from aotune.hwspecs.spec import SET_BY_AOTUNE


def _num(lo: float, hi: float) -> Any:
    """A numeric field allowed in ``[lo, hi]``."""
    return field(metadata={"range": (lo, hi)})


@dataclass(frozen=True)
class GpuArchSpec:
    """What the compiler targets: compute capability, PTX ISA version, LLVM triple."""

    sm: int = _num(50, 200)  # compute capability x 10: 80 is sm_80
    ptx_version: int = _num(60, 200)  # PTX ISA version x 10 to emit: 70 is ".version 7.0"
    triple: str = field(metadata={})
    generation: str = field(metadata={})  # volta, turing, ampere, ada, hopper (for people)


@dataclass(frozen=True)
class GpuComputeSpec:
    """Issue resources of one SM (all SMs are alike)."""

    sms: int = _num(1, 1024)
    boost_clock_ghz: float = _num(0.1, 5.0)
    fp32_lanes_per_sm: int = _num(8, 1024)  # FP32 FMA lanes ("CUDA cores") per SM
    partitions_per_sm: int = _num(1, 16)  # SM sub-partitions, one warp scheduler each
    issue_per_partition: int = _num(1, 4)  # warp instructions each scheduler issues per cycle
    ldst_units_per_sm: int = _num(4, 256)  # LD/ST lanes: a warp's memory instruction takes 32/this
    warp_size: int = _num(1, 128)
    fma_latency_cycles: int = _num(1, 64)  # dependent FFMA to FFMA


@dataclass(frozen=True)
class GpuLimitsSpec:
    """Occupancy limits per block and per SM, and register allocation."""

    max_threads_per_block: int = _num(32, 4096)
    max_threads_per_sm: int = _num(32, 8192)
    max_blocks_per_sm: int = _num(1, 256)
    max_warps_per_sm: int = _num(1, 256)
    registers_per_sm: int = _num(1024, 1 << 20)  # 32-bit registers
    max_registers_per_block: int = _num(1024, 1 << 20)
    max_registers_per_thread: int = _num(16, 255)  # 255 on every GPU since sm_35 (CUDA guide)
    register_alloc_unit: int = _num(1, 4096)  # registers per warp are allocated in these steps
    max_grid_x: int = _num(1, 1 << 40)
    max_grid_yz: int = _num(1, 1 << 40)


@dataclass(frozen=True)
class GpuSharedSpec:
    """Shared memory: capacity, allocation and banks."""

    bytes_per_sm: int = _num(1024, 1 << 24)  # the largest carve-out of the unified L1/shared
    bytes_per_block: int = _num(1024, 1 << 24)  # static limit without opt-in
    bytes_per_block_optin: int = _num(1024, 1 << 24)  # dynamic, after cudaFuncSetAttribute
    reserved_per_block: int = _num(0, 1 << 16)  # the runtime's own share of each block
    alloc_unit: int = _num(1, 1 << 16)  # a block's shared memory is rounded up to this
    banks: int = _num(1, 256)
    bank_bytes: int = _num(1, 64)  # each bank serves this many bytes per cycle
    latency_cycles: int = _num(1, 1000)  # LDS to use, no conflict


@dataclass(frozen=True)
class GpuMemorySpec:
    """Caches and DRAM shared by all SMs."""

    l1_kib: int = _num(1, 1 << 16)  # unified L1/shared per SM
    l2_kib: int = _num(1, 1 << 20)
    l2_bandwidth_gbs: float = _num(1.0, 1e6)
    dram_bandwidth_gbs: float = _num(1.0, 1e6)
    dram_gib: float = _num(0.25, 1 << 14)  # device memory: a workload's tensors must fit in it
    l1_bytes_per_cycle: int = _num(8, 1024)  # per SM: global loads that hit L1, to registers
    l1_latency_cycles: int = _num(1, 10_000)  # a global load that hits L1, to its use
    sector_bytes: int = _num(4, 1024)  # the unit a global access moves between L1, L2 and DRAM
    line_bytes: int = _num(4, 4096)  # L1/L2 line: four sectors
    l2_latency_cycles: int = _num(1, 10_000)
    dram_latency_cycles: int = _num(1, 10_000)


@dataclass(frozen=True)
class GpuLaunchSpec:
    """Fixed costs of one kernel launch."""

    overhead_seconds: float = _num(0.0, 1e-2)


@dataclass(frozen=True)
class GpuSpec:
    """An NVIDIA GPU target: everything the GPU constraints and model need."""

    name: str
    description: str
    kind: str
    arch: GpuArchSpec
    compute: GpuComputeSpec
    limits: GpuLimitsSpec
    shared: GpuSharedSpec
    memory: GpuMemorySpec
    launch: GpuLaunchSpec
    # where a file that keeps a built-in's name departs from it (``mark_builtin_gpu_copy``): set
    # by aotune when it loads the file, never read from one; "" for a built-in or a new name
    spec_from: str = field(default="", metadata={SET_BY_AOTUNE: True})

    @property
    def sm_name(self) -> str:
        """``sm_80``: the ptxas ``-arch`` and LLVM cpu name."""
        return f"sm_{self.arch.sm}"

    @property
    def ptx_isa(self) -> str:
        """``7.0``: the PTX ``.version``."""
        return f"{self.arch.ptx_version // 10}.{self.arch.ptx_version % 10}"

    @property
    def peak_flops(self) -> float:
        """fp32 FLOP/s of the whole GPU at the boost clock (an FFMA is two operations)."""
        c = self.compute
        return 2.0 * c.sms * c.fp32_lanes_per_sm * c.boost_clock_ghz * 1e9

    @property
    def shared_bytes_per_cycle(self) -> int:
        """Bytes shared memory delivers per SM and cycle: every bank, one word each."""
        return self.shared.banks * self.shared.bank_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for JSON and ``aotune hw show``)."""
        return dataclasses.asdict(self)

    def summary_lines(self) -> list[str]:
        """What ``aotune hw show`` prints."""
        c, lim, sh, m = self.compute, self.limits, self.shared, self.memory
        return [
            f"{self.name}: {self.description}",
            *([f"  spec     {self.spec_from}"] if self.spec_from else []),
            f"  arch     {self.sm_name} ({self.arch.generation}), PTX ISA {self.ptx_isa}, "
            f"{self.arch.triple}",
            f"  compute  {c.sms} SMs @ {c.boost_clock_ghz} GHz boost, {c.fp32_lanes_per_sm} FP32 "
            f"lanes/SM in {c.partitions_per_sm} partitions, {c.ldst_units_per_sm} LD/ST/SM",
            f"  peak     {self.peak_flops / 1e12:.1f} TFLOP/s fp32",
            f"  limits   {lim.max_threads_per_block} threads/block, {lim.max_threads_per_sm} "
            f"threads, {lim.max_warps_per_sm} warps, {lim.max_blocks_per_sm} blocks per SM",
            f"  regs     {lim.registers_per_sm} per SM, {lim.max_registers_per_thread} per thread, "
            f"allocated per warp in units of {lim.register_alloc_unit}",
            f"  shared   {sh.bytes_per_sm} B/SM, {sh.bytes_per_block} B/block "
            f"({sh.bytes_per_block_optin} opt-in), {sh.reserved_per_block} B reserved per block, "
            f"{sh.banks} banks x {sh.bank_bytes} B",
            f"  memory   L1 {m.l1_kib} KiB/SM, L2 {m.l2_kib} KiB at {m.l2_bandwidth_gbs:g} GB/s, "
            f"DRAM {m.dram_gib:g} GiB at {m.dram_bandwidth_gbs:g} GB/s, "
            f"{m.sector_bytes} B sectors, {m.line_bytes} B lines",
        ]


# the threads of a warp on every NVIDIA GPU since the first CUDA one (PTX's WARP_SZ)
NVIDIA_WARP_SIZE = 32
# the first PTX ISA version (x 10) that targets each sm (PTX ISA manual, "Release notes"): LLVM's
# NVPTX backend ends the process on an older one, so a spec naming it is refused on load
FIRST_PTX_FOR_SM = {
    50: 40, 52: 41, 53: 42, 60: 50, 61: 50, 62: 50, 70: 60, 72: 61, 75: 63, 80: 70, 86: 71,
    87: 74, 89: 78, 90: 78, 100: 86, 101: 86, 103: 88, 110: 90, 120: 87, 121: 88,
}  # fmt: skip
# NVIDIA's architecture name for each compute capability it has shipped (CUDA C++ Programming
# Guide, "Compute Capabilities"); a spec's generation must be its sm's
GENERATION_OF_SM = {
    50: "maxwell", 52: "maxwell", 53: "maxwell", 60: "pascal", 61: "pascal", 62: "pascal",
    70: "volta", 72: "volta", 75: "turing", 80: "ampere", 86: "ampere", 87: "ampere", 89: "ada",
    90: "hopper", 100: "blackwell", 101: "blackwell", 103: "blackwell", 110: "blackwell",
    120: "blackwell", 121: "blackwell",
}  # fmt: skip


# the first sm whose shared memory and L1 are one SRAM (Volta tuning guide, "Unified Shared
# Memory/L1/Texture Cache")
UNIFIED_L1_FROM_SM = 70


def validate_gpu_spec(spec: GpuSpec, where: str) -> GpuSpec:
    """The relations between fields (each field's type, finiteness and range were checked while
    loading, from its metadata); returns the spec unchanged."""
    from aotune.hwspecs.spec import check_spec_texts

    check_spec_texts(spec.name, spec.description, where)
    c, lim, sh, m = spec.compute, spec.limits, spec.shared, spec.memory
    first_ptx = FIRST_PTX_FOR_SM.get(spec.arch.sm)
    generation = GENERATION_OF_SM.get(spec.arch.sm)
    relations = [
        (
            # "Ada Lovelace" names ada: the first word decides
            generation is None or spec.arch.generation.lower().split()[:1] == [generation],
            f"arch.generation = {spec.arch.generation!r} is not sm_{spec.arch.sm}'s, which is "
            f"{generation!r}; set generation = {generation!r}, or the sm of the GPU you mean",
        ),
        (
            first_ptx is not None,
            f"arch.sm = {spec.arch.sm} is not a compute capability aotune knows the PTX ISA "
            f"of (LLVM may end the process on it); use one of "
            f"{', '.join(map(str, sorted(FIRST_PTX_FOR_SM)))}",
        ),
        (
            first_ptx is None or spec.arch.ptx_version >= first_ptx,
            f"arch.ptx_version = {spec.arch.ptx_version} cannot target sm_{spec.arch.sm}, "
            f"which PTX {(first_ptx or 0) // 10}.{(first_ptx or 0) % 10} introduced; set "
            f"ptx_version >= {first_ptx}",
        ),
        (
            c.warp_size == NVIDIA_WARP_SIZE,
            f"compute.warp_size = {c.warp_size}: every NVIDIA GPU (the NVPTX targets aotune "
            f"generates for) runs warps of {NVIDIA_WARP_SIZE} threads; set {NVIDIA_WARP_SIZE}",
        ),
        (
            lim.max_threads_per_block <= lim.max_threads_per_sm,
            f"limits.max_threads_per_block ({lim.max_threads_per_block}) must be <= "
            f"limits.max_threads_per_sm ({lim.max_threads_per_sm})",
        ),
        (
            lim.max_warps_per_sm * c.warp_size >= lim.max_threads_per_sm,
            f"limits.max_warps_per_sm x compute.warp_size ({lim.max_warps_per_sm} x "
            f"{c.warp_size}) must hold limits.max_threads_per_sm ({lim.max_threads_per_sm})",
        ),
        (
            lim.max_threads_per_block % c.warp_size == 0,
            f"limits.max_threads_per_block ({lim.max_threads_per_block}) must be a whole number "
            f"of warps of {c.warp_size}",
        ),
        (
            sh.bytes_per_block <= sh.bytes_per_block_optin <= sh.bytes_per_sm,
            f"shared memory must satisfy bytes_per_block ({sh.bytes_per_block}) <= "
            f"bytes_per_block_optin ({sh.bytes_per_block_optin}) <= bytes_per_sm "
            f"({sh.bytes_per_sm}) in [shared]",
        ),
        (
            c.fp32_lanes_per_sm % c.partitions_per_sm == 0,
            f"compute.fp32_lanes_per_sm ({c.fp32_lanes_per_sm}) must split evenly over "
            f"compute.partitions_per_sm ({c.partitions_per_sm})",
        ),
        (
            m.line_bytes % m.sector_bytes == 0,
            f"memory.line_bytes ({m.line_bytes}) must be a whole number of "
            f"memory.sector_bytes ({m.sector_bytes})",
        ),
        (
            lim.max_registers_per_block <= lim.registers_per_sm,
            f"limits.max_registers_per_block ({lim.max_registers_per_block}) must be <= "
            f"limits.registers_per_sm ({lim.registers_per_sm})",
        ),
        (
            m.l1_latency_cycles <= m.l2_latency_cycles <= m.dram_latency_cycles,
            f"memory latencies must grow outwards: l1_latency_cycles ({m.l1_latency_cycles}) <= "
            f"l2_latency_cycles ({m.l2_latency_cycles}) <= dram_latency_cycles "
            f"({m.dram_latency_cycles})",
        ),
        (  # from Volta on, shared memory is a carve-out of the unified L1 (before, apart)
            spec.arch.sm < UNIFIED_L1_FROM_SM or m.l1_kib * 1024 >= sh.bytes_per_sm,
            f"memory.l1_kib = {m.l1_kib} cannot hold shared.bytes_per_sm ({sh.bytes_per_sm}): "
            f"from sm_{UNIFIED_L1_FROM_SM} on shared memory is carved out of the unified L1; "
            "give the whole L1's size",
        ),
        (  # the driver's reserve is a sliver of a block's share (1 KiB on sm_80 and later)
            sh.reserved_per_block < sh.bytes_per_block,
            f"shared.reserved_per_block ({sh.reserved_per_block}) must be below "
            f"shared.bytes_per_block ({sh.bytes_per_block}): it is what the system keeps of "
            "each block's shared memory, not the whole",
        ),
        (  # the L2 serves every SM: on every NVIDIA GPU it is many times one SM's L1
            m.l2_kib >= m.l1_kib,
            f"memory.l2_kib = {m.l2_kib} is smaller than one SM's L1 (memory.l1_kib = "
            f"{m.l1_kib}); give the whole chip's L2 in KiB",
        ),
    ]
    relations += [
        (
            value & (value - 1) == 0,
            f"{key} = {value} must be a power of two, as on every NVIDIA GPU",
        )
        for key, value in (
            ("shared.banks", sh.banks),
            ("shared.bank_bytes", sh.bank_bytes),
            ("shared.alloc_unit", sh.alloc_unit),
            ("limits.register_alloc_unit", lim.register_alloc_unit),
        )
    ]
    for ok, text in relations:
        if not ok:
            raise HwSpecError(f"{where}: {text}")
    if spec.arch.triple.split("-")[0] != "nvptx64":
        raise HwSpecError(  # ptxas takes 64-bit addressing only for the GPUs aotune targets
            f"{where}: arch.triple {spec.arch.triple!r} is not a 64-bit NVPTX triple; "
            f'use "nvptx64-nvidia-cuda"'
        )
    return spec


def gpu_spec_from_dict(data: dict[str, Any], where: str) -> GpuSpec:
    """Build and validate a GPU spec from parsed TOML."""
    from aotune.hwspecs.spec import build_dataclass

    return validate_gpu_spec(build_dataclass(GpuSpec, data, where), where)


# how a GPU spec's ``spec_from`` begins where it is a file's (GPU specs have no [origin] to say so
# field by field)
FILE_MARK = "the spec file"


def _flat_fields(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"memory.l2_kib": 51200, ...}``: a spec's plain-data form, one path per value."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flat_fields(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def mark_builtin_gpu_copy(spec: GpuSpec, builtin: Any) -> GpuSpec:
    """A GPU spec file that keeps a built-in's name (a copy made to edit), with ``spec_from``
    saying what it changed, so ``hw show`` and ``tune`` do not pass it off as the built-in; an
    exact copy (or one whose description alone differs) is returned as it is. No path goes into
    the text, so the spec's hash stays its content's."""
    if not isinstance(builtin, GpuSpec):
        note = f"{FILE_MARK} (it takes the name of the built-in {builtin.kind} spec {spec.name})"
    else:
        ours, theirs = _flat_fields(spec.to_dict()), _flat_fields(builtin.to_dict())
        changed = [p for p, v in ours.items() if p != "description" and theirs.get(p) != v]
        if not changed:
            return spec
        from aotune.hwspecs.spec_toml import values_changed_text

        note = f"{FILE_MARK}: the built-in {spec.name} with {values_changed_text(changed)}"
    return dataclasses.replace(spec, spec_from=note)


def gpu_spec_from(spec: GpuSpec, builtin_names: list[str]) -> str:
    """Where ``spec`` came from, for the JSON: what aotune marked it with when it loaded the file
    (``mark_builtin_gpu_copy``), else the built-in of its name, else the spec file."""
    if spec.spec_from:
        return spec.spec_from
    return f"the built-in spec {spec.name}" if spec.name in builtin_names else FILE_MARK
