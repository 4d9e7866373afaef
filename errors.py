"""The one error hierarchy of aotune.

Every error a user can cause derives from :class:`AotuneError` and carries a one-line message that
says what is wrong and how to fix it. The CLI prints ``error: <message>`` and exits non-zero; search
loops catch only these classes, never bare ``Exception``.
"""

from __future__ import annotations


class AotuneError(Exception):
    """Base class of every error aotune raises on purpose."""


class WorkloadError(AotuneError):
    """A workload is malformed: unknown operator, bad shape, inconsistent accesses."""


class UnsupportedWorkloadError(WorkloadError):
    """A well-formed workload that this version cannot schedule yet."""


class HwSpecError(AotuneError):
    """A hardware spec file is missing, malformed or incomplete, or a target name is unknown."""


class ConfigError(AotuneError):
    """A config cannot be parsed or names decisions the space does not have."""


class UnsatisfiableError(AotuneError):
    """The constraints admit no config (for this workload on this target)."""


class HardwareLimitError(AotuneError):
    """A config breaks a hardware limit; states required, available and a fix."""

    def __init__(self, what: str, required: float, available: float, hint: str) -> None:
        self.what, self.required, self.available, self.hint = what, required, available, hint
        super().__init__(f"{what}: requires {required:g}, the target has {available:g}; {hint}")


class CodegenError(AotuneError):
    """Code generation or compilation of a kernel failed."""


class FinalCheckError(AotuneError):
    """A kernel cannot be run on this machine (e.g. the target is not the host)."""


class DatabaseError(AotuneError):
    """The tuning database cannot be opened, read or written, or was made by a newer aotune."""


class BuildError(AotuneError):
    """A library cannot be built: bad kernel list or model, output directory, missing linker."""


class LibraryError(AotuneError):
    """A built library cannot be loaded or a kernel of it was called with bad arguments."""

    def __str__(self) -> str:
        # a path or name from the library shows its control characters as '?': a traceback
        # printed to a terminal must not act on them (an escape sequence in a folder's name)
        from aotune.files import printable  # (files imports this module)

        return printable(super().__str__())


class CalibrationError(AotuneError):
    """``hw calibrate`` cannot measure this machine, or a measurement makes no physical sense."""


class MeasurementFileError(AotuneError):
    """A file of measurements (a Kernel Tuner cache) cannot be read, or holds a kernel or
    parameters aotune cannot map to its own configs."""
