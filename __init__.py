"""aotune: ahead-of-time tensor kernel tuning without running candidates on the target."""

__version__ = "0.1.0"
