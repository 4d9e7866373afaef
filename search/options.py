"""Typed, validated search options shared by all strategies."""

from __future__ import annotations

from dataclasses import dataclass

from aotune.errors import ConfigError

STRATEGIES = ("cga", "random")


@dataclass(frozen=True)
class SearchOptions:
    """| option | meaning | default |
    |---|---|---|
    | strategy | ``cga`` (constraint-preserving GA) or ``random`` | cga |
    | seed | makes the whole search reproducible | 0 |
    | budget | configs scored by the cheap estimate (GA generations, then one-variable
      descent) | 960 |
    | population | GA population size | 32 |
    | mutation | per-variable probability that a child's value is freed and re-drawn | 0.2 |
    | compile_top | distinct candidates compiled and scored from their assembly | 16 |
    | top_k | candidates kept for the final check | 3 |
    """

    strategy: str = "cga"
    seed: int = 0
    budget: int = 960
    population: int = 32
    mutation: float = 0.2
    compile_top: int = 16
    top_k: int = 3

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"unknown strategy {self.strategy!r}; use one of {', '.join(STRATEGIES)}"
            )
        for name in ("budget", "population", "compile_top", "top_k"):
            if getattr(self, name) < 1:
                raise ConfigError(f"search option {name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.mutation <= 1.0:
            raise ConfigError(f"search option mutation must be in [0, 1], got {self.mutation}")
        if self.top_k > self.compile_top:
            raise ConfigError(
                f"top_k ({self.top_k}) cannot exceed compile_top ({self.compile_top})"
            )
