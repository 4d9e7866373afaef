"""Hardware spec files (``*.toml``) and their loader; see :mod:`aotune.hwspecs.spec`."""

from aotune.hwspecs.spec import (
    CacheSpec,
    CoreSpec,
    HwSpec,
    IsaSpec,
    MemorySpec,
    OverheadSpec,
    builtin_names,
    load_spec_file,
    load_target,
)

__all__ = [
    "CacheSpec",
    "CoreSpec",
    "HwSpec",
    "IsaSpec",
    "MemorySpec",
    "OverheadSpec",
    "builtin_names",
    "load_spec_file",
    "load_target",
]
