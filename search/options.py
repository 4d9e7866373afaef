"""Typed, validated search options shared by all strategies."""

from __future__ import annotations

from dataclasses import dataclass

from aotune.errors import ConfigError

STRATEGIES = ("cga", "random")
# upper bounds: a seed numpy and random both take; budgets that finish within hours
LIMITS = {
    "seed": 2**32 - 1,
    "budget": 1_000_000,
    "population": 10_000,
    "top_k": 1_000,  # before compile_top, which the CLI derives from it
    "compile_top": 10_000,
}


@dataclass(frozen=True)
class SearchOptions:
    """| option | meaning | default |
    |---|---|---|
    | strategy | ``cga`` (constraint-preserving GA) or ``random`` | cga |
    | seed | makes the whole search reproducible | 0 |
    | budget | configs scored by the cheap estimate (GA generations, then one-variable
      descent) | 1920 |
    | population | GA population size | 32 |
    | mutation | per-variable probability that a child's value is freed and re-drawn | 0.2 |
    | compile_top | distinct candidates compiled and scored from their assembly | 16 |
    | top_k | candidates kept for the final check | 3 |
    """

    strategy: str = "cga"
    seed: int = 0
    budget: int = 1920
    population: int = 32
    mutation: float = 0.2
    compile_top: int = 16
    top_k: int = 3

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"unknown strategy {self.strategy!r}; use one of {', '.join(STRATEGIES)}"
            )
        for name, top in LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"search option {name} must be an integer, got {value!r}")
            low = 0 if name == "seed" else 1
            if not low <= value <= top:
                flag = "--" + name.replace("_", "-")  # as the CLI spells it
                raise ConfigError(f"{flag} must be in {low}..{top}, got {value}")
        if isinstance(self.mutation, bool) or not isinstance(self.mutation, (int, float)):
            raise ConfigError(f"search option mutation must be a number, got {self.mutation!r}")
        if not 0.0 <= self.mutation <= 1.0:
            raise ConfigError(f"search option mutation must be in [0, 1], got {self.mutation}")
        if self.top_k > self.compile_top:
            raise ConfigError(
                f"top_k ({self.top_k}) cannot exceed compile_top ({self.compile_top})"
            )
