"""aotune: ahead-of-time tensor kernel tuning without running candidates on the target."""

__version__ = "0.1.0"


def load(path: object) -> object:
    """Load a library that ``aotune build`` wrote (see :mod:`aotune.artifact.load`)."""
    from aotune.artifact.load import load as _load

    return _load(path)  # type: ignore[arg-type]
