# ruff: noqa: E501  (the docstring's mapping table is one row per line)
"""CLBlast's Xgemm (Kernel Tuner's and CLTune's GEMM) as configs of aotune's GPU space.

Xgemm computes ``C = alpha*A*B + beta*C`` column-major: A at ``A[k*M + m]``, B at ``B[k*N + n]``,
C at ``C[n*M + m]``, i.e. the einsum ``km,kn->nm`` with the last index contiguous
(``xgemm_workload``). aotune finds the GEMM roles from the accesses: its columns ``n`` are the axis
along which C is contiguous, which is Xgemm's M, so Xgemm's M and N trade places, and so do its A
and B (aotune's A is the operand with rows, Xgemm's B):

| Xgemm | aotune | meaning (identical on both sides) |
|---|---|---|
| MWG, NWG | bn, bm | block tile of C along Xgemm's M (contiguous in A and C) and N |
| KWG | bk | K step of a block |
| MDIMC, NDIMC | ty, tx | compute threads along Xgemm's M and N; the thread index runs fastest along M, C's contiguous axis, in both |
| VWM, VWN | vn, vm | a thread's runs along M (N): register vectors and loads of A (B) from shared or global memory, stores of C along M |
| STRM, STRN | strn, strm | 0: a thread's runs are adjacent; 1: strided by the thread count times the vector width |
| SA, SB | sb, sa | stage Xgemm's A (B) tile in shared memory |
| MDIMA | lb (when SA=1, else 1) | threads along M loading Xgemm's A tile, the rest (KDIMA) along K |
| NDIMB | la (when SB=1, else 1) | threads along N loading Xgemm's B tile |
| VWM (SA=1), VWN (SB=1) | vb, va (else 1) | elements per global load of the staged tile, along its contiguous axis |
| KWI | unroll | unroll of the loop over the KWG step |
| - | pad_a = pad_b = 0 | Xgemm does not pad shared memory |
| - | ahead = 1 unless SA = SB = 1 | Xgemm has no such parameter: nvcc schedules the loads of an operand read in place; aotune's kernel reads it a k step ahead of its FMAs (README, accuracy section) |
| GEMMK, KREG, PRECISION | 0, 1, 32 only | Xgemm's other formulation, K register tiling and precisions are outside this family |

Without staging Xgemm ignores MDIMA (NDIMB), so configs that differ only there are one kernel and
map to one aotune config (whose unused decisions take their canonical value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aotune.analysis.workload import Workload, einsum
from aotune.constraints.space import Config, Space
from aotune.errors import ConfigError

# parameters that must hold one value for a config to be this kernel family
FIXED = {"GEMMK": 0, "KREG": 1, "PRECISION": 32}
MAPPED = (
    "MWG", "NWG", "KWG", "MDIMC", "NDIMC", "MDIMA", "NDIMB", "KWI", "VWM", "VWN", "STRM", "STRN",
    "SA", "SB",
)  # fmt: skip
SWITCHES = ("STRM", "STRN", "SA", "SB")  # 0 or 1; the other mapped parameters are sizes


def check_xgemm_parameters(values: Mapping[str, Sequence[int]], where: str) -> None:
    """Refuse a measured Xgemm space aotune cannot map as a whole: a parameter it does not know,
    one it needs and the space lacks, or a value of GEMMK, KREG or PRECISION outside this family
    (``values``: each parameter's values over the space). One ConfigError naming them."""
    unknown = sorted(set(values) - set(MAPPED) - set(FIXED))
    if unknown:
        raise ConfigError(
            f"{where}: Xgemm parameter(s) {', '.join(unknown)} have no aotune meaning (it maps "
            f"{', '.join(MAPPED)}, and {', '.join(FIXED)} at one value each)"
        )
    missing = [p for p in MAPPED if p not in values]
    if missing:
        raise ConfigError(
            f"{where}: the measured configs lack {', '.join(missing)}; cannot map them"
        )
    for name, value in FIXED.items():
        other = sorted({int(v) for v in values.get(name, ())} - {value})
        if other:
            raise ConfigError(
                f"{where}: {name}={', '.join(map(str, other))} selects a kernel outside aotune's "
                f"GEMM family (only {name}={value} maps); keep those configs out of the file"
            )


def xgemm_workload(M: int, N: int, K: int) -> Workload:
    """Xgemm's computation as an aotune workload: column-major ``C(MxN) = A(MxK) B(KxN)``."""
    return einsum("km,kn->nm", {"m": M, "n": N, "k": K}, op="matmul")


def xgemm_to_config(params: Mapping[str, int], space: Space) -> Config:
    """The aotune config with the same meaning as one Xgemm configuration (``params`` maps
    parameter names to values, as in a Kernel Tuner cache entry). A parameter at a value outside
    this family, or a missing one, is a ConfigError naming it."""
    for name, value in FIXED.items():
        if name in params and int(params[name]) != value:
            raise ConfigError(
                f"Xgemm parameter {name}={params[name]} selects a kernel outside aotune's GEMM "
                f"family (only {name}={value} maps)"
            )
    missing = [p for p in MAPPED if p not in params]
    if missing:
        raise ConfigError(f"Xgemm config lacks {', '.join(missing)}; cannot map it")
    p = {k: int(params[k]) for k in MAPPED}
    for name, value in p.items():
        switch = name in SWITCHES
        if (value not in (0, 1)) if switch else value < 1:
            raise ConfigError(
                f"Xgemm parameter {name}={value} is no value of it ("
                + ("a switch: 0 or 1" if switch else "a size, thread count or width: 1 or more")
                + "); the entry is damaged"
            )
    sa, sb = p["SB"], p["SA"]
    return space.config(
        {
            "bm": p["NWG"],
            "bn": p["MWG"],
            "bk": p["KWG"],
            "tx": p["NDIMC"],
            "ty": p["MDIMC"],
            "vm": p["VWN"],
            "vn": p["VWM"],
            "strm": p["STRN"],
            "strn": p["STRM"],
            "sa": sa,
            "sb": sb,
            "la": p["NDIMB"] if sa else 1,
            "lb": p["MDIMA"] if sb else 1,
            "va": p["VWN"] if sa else 1,
            "vb": p["VWM"] if sb else 1,
            "unroll": p["KWI"],
            "pad_a": 0,
            "pad_b": 0,
            # Xgemm has no such parameter (nvcc schedules its loads): aotune reads an operand
            # read in place a k step ahead (the README's accuracy section scores both ways)
            "ahead": 0 if sa and sb else 1,
        }
    )
