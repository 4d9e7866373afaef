"""Random sampling: the baseline strategy.

Options (``SearchOptions`` fields used): ``seed``, ``budget`` (configs sampled).
"""

from __future__ import annotations

from collections.abc import Callable

from aotune.constraints.space import Config, Space
from aotune.search.options import SearchOptions

Scorer = Callable[[Config], float]


def tune(
    space: Space,
    score: Scorer,
    options: SearchOptions,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[float, Config]]:
    """Sample ``options.budget`` valid configs and return them scored, best (lowest) first."""
    configs = space.sample(options.budget, seed=options.seed)
    scored = []
    for i, cfg in enumerate(configs):
        scored.append((score(cfg), cfg))
        if progress:
            progress(i + 1, len(configs))
    return sorted(scored, key=lambda sc: sc[0])
