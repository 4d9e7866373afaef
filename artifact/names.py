"""The global names of a CPU library: its runtime's functions, header and files, from one prefix.

The default prefix ``aotune`` gives ``aotune_set_num_threads``, ``AOTUNE_OK``,
``aotune_kernels.h`` and ``libaotune_kernels.so``; ``build --prefix vision`` gives
``vision_set_num_threads``, ``VISION_OK``, ``vision_kernels.h`` and ``libvision_kernels.so``, so
two libraries link into one program. The loader reads the prefix from the manifest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "aotune"
# a prefix: lower case (the header's macros are it in upper case, and the files named after it
# must not clash on a disk that ignores case), a letter first, short enough for any linker
# and no '__' (C++ reserves names holding it) nor a '_' last (NAME__set_num_threads)
PREFIX_PATTERN = re.compile(r"(?=.{1,32}$)[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


# namespaces of the libraries a program links beside aotune's (POSIX threads, OpenMP and
# OpenACC, MPI, BLAS and LAPACK, CUDA): a prefix would put the runtime's functions in them
RESERVED_PREFIXES = frozenset(
    "pthread posix sched omp kmp acc mpi pmpi mkl cblas lapack lapacke openblas cuda cu nv".split()
)


@dataclass(frozen=True)
class Names:
    """The global names of one library, from its prefix (``build --prefix``): two libraries of
    different prefixes link into one program, each with its own runtime and header."""

    prefix: str = DEFAULT_PREFIX

    @property
    def run(self) -> str:  # these three: what the kernel objects link against (hidden in a .so)
        return f"__{self.prefix}_run"

    @property
    def lock(self) -> str:
        return f"__{self.prefix}_lock"

    @property
    def unlock(self) -> str:
        return f"__{self.prefix}_unlock"

    def api(self, what: str) -> str:
        """A public function's name: ``set_num_threads`` -> ``aotune_set_num_threads``."""
        return f"{self.prefix}_{what}"

    @property
    def library(self) -> str:  # lib<library>.so / .a, <library>.h
        return f"{self.prefix}_kernels"

    @property
    def runtime_object(self) -> str:  # relative to the library's folder
        return f"objects/{self.prefix}_runtime.o"

    @property
    def macro(self) -> str:  # the header's macros: AOTUNE_OK, AOTUNE_KERNELS_H
        return self.prefix.upper()

    def error_macro(self, code: str) -> str:
        """A return code's macro: ``AOTUNE_ERR_NULL`` -> ``VISION_ERR_NULL``."""
        return self.macro + code.removeprefix("AOTUNE")

    def kernel_macro(self, kernel: str) -> str:
        """The macro every library's header defines for each kernel it declares, whatever its
        prefix: a second header declaring the same name stops the compile (#error)."""
        return f"AOTUNE_DECLARES_{kernel}"


API = ("set_num_threads", "get_num_threads", "shutdown", "strerror")  # the public functions


def unknown_error_text(names: Names) -> str:
    """What ``PREFIX_strerror`` says of a return code it does not know: the library's own prefix,
    so that a program linking two libraries can tell which one was asked."""
    return f"unknown {names.prefix} error code"
