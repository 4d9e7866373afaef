"""aotune: ahead-of-time tensor kernel tuning without running candidates on the target."""

from aotune.errors import AotuneError, LibraryError

__version__ = "0.1.0"
__all__ = ["AotuneError", "LibraryError", "load"]


def load(path: object) -> object:
    """Load a library that ``aotune build`` wrote (see :mod:`aotune.artifact.load`)."""
    from aotune.artifact.load import load as _load

    return _load(path)  # type: ignore[arg-type]
