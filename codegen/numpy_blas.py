"""Which BLAS numpy's baseline ran with, and whether the environment held it back.

Every speed ratio aotune reports is against numpy as a user has it. OpenBLAS picks its kernel for
the CPU at load time unless ``OPENBLAS_CORETYPE`` forces one: some machines set it (with
``OPENBLAS_L2_SIZE``) to keep old OpenBLAS builds safe, which puts current numpy on its AVX2 kernel
on AVX-512 CPUs (half the speed on Zen 5). The variables are read when numpy loads, so they cannot
be undone in-process: benchmark with them unset in that command alone
(``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE aotune bench``). This module records what numpy
ran with (threadpoolctl) and says when the environment forced a lesser kernel than the CPU runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

FORCING_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
# OpenBLAS's x86 kernel names -> the widest vectors they use (bits); a kernel missing here is not
# compared with the CPU
KERNEL_VECTOR_BITS = {
    "SapphireRapids": 512,
    "Cooperlake": 512,
    "SkylakeX": 512,
    "Zen": 256,
    "Haswell": 256,
    "Sandybridge": 256,
    "Bulldozer": 128,
    "Piledriver": 256,
    "Steamroller": 256,
    "Excavator": 256,
    "Nehalem": 128,
    "Core2": 128,
    "Prescott": 128,
    "Atom": 128,
}


@dataclass(frozen=True)
class NumpyBlas:
    """The BLAS library under numpy: its kernel (CPU type), threads and what set it."""

    library: str  # "openblas", "mkl", "blis", ... or "unknown"
    kernel: str  # OpenBLAS's core type (e.g. "SkylakeX"), MKL's or "unknown"
    threads: int
    forced_by_env: bool  # OPENBLAS_CORETYPE chose the kernel, not OpenBLAS's CPU detection
    env: tuple[tuple[str, str], ...]  # the forcing variables that are set, with their values

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``numpy_blas`` in ``tune`` and ``bench``)."""
        return {
            "library": self.library,
            "kernel": self.kernel,
            "threads": self.threads,
            "forced_by_env": self.forced_by_env,
            "env": dict(self.env),
        }

    def warning(self, cpu_vector_bits: int) -> str | None:
        """A one-line warning when the environment forced a kernel narrower than the CPU's
        vectors (the baseline is then slower than numpy as users have it), else None."""
        if not self.forced_by_env:
            return None
        bits = KERNEL_VECTOR_BITS.get(self.kernel)
        if bits is None or bits >= cpu_vector_bits:
            return None
        names = " ".join(f"-u {n}" for n, _ in self.env)
        return (
            f"numpy's baseline runs OpenBLAS's {self.kernel} kernel ({bits}-bit) because "
            f"OPENBLAS_CORETYPE={dict(self.env).get('OPENBLAS_CORETYPE')} is set, on a CPU with "
            f"{cpu_vector_bits}-bit vectors: the ratios understate numpy as users have it; "
            f"run with `env {names} aotune ...`"
        )


def numpy_blas() -> NumpyBlas:
    """What numpy's matmul runs on in this process."""
    import numpy as np  # noqa: F401 -- loads the BLAS that threadpoolctl then finds
    from threadpoolctl import threadpool_info

    env = tuple((n, os.environ[n]) for n in FORCING_VARIABLES if n in os.environ)
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return NumpyBlas("unknown", "unknown", 1, bool(env), env)
    info = blas[0]
    library = str(info.get("internal_api", "unknown"))
    kernel = str(info.get("architecture") or info.get("threading_layer") or "unknown")
    forced = library == "openblas" and "OPENBLAS_CORETYPE" in os.environ
    return NumpyBlas(library, kernel, int(info.get("num_threads") or 1), forced, env)
