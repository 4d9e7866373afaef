"""Constraint-preserving genetic algorithm (after Heron), valid by construction.

A child is not built by splicing genomes (which breaks constraints) but solved by CP-SAT from
constraints: each inherited variable must equal parent 1's or parent 2's value, each mutated
variable is free with a uniformly random hint. If that restriction is unsatisfiable the inherited
set is halved until it is not, so every child is a solution of the space. The CP-SAT model is built
once by the Space and cloned per child (Heron rebuilds it per sample).

The first population is the best quarter of a random draw four times its size (SEED_DRAW).

Options (``SearchOptions`` fields used): ``seed``, ``budget``, ``population``, ``mutation``.
"""
from __future__ import annotations

import random as _random
from typing import Callable

from aotune.constraints.space import Config, Space
from aotune.errors import UnsatisfiableError
from aotune.search.options import SearchOptions

Scorer = Callable[[Config], float]
SEED_DRAW = 4  # the first population is the best of SEED_DRAW x population random configs


def make_child(space: Space, p1: Config, p2: Config, rng: _random.Random, mutation: float) -> Config:
    """A valid child of ``p1`` and ``p2`` (crossover and mutation as CP-SAT restrictions)."""
    inherited = [v for v in space.variables if rng.random() >= mutation]
    mutated = [v for v in space.variables if v not in inherited]
    hints = {v.name: rng.choice(v.domain) for v in mutated}
    for v in inherited:  # the hint picks which parent's value to prefer
        hints[v.name] = p1[v.name] if rng.random() < 0.5 else p2[v.name]
    while True:
        allowed = {v.name: {p1[v.name], p2[v.name]} for v in inherited}
        try:
            return space.solve(allowed, hints, seed=rng.randrange(1 << 30))
        except UnsatisfiableError:
            if not inherited:
                raise
            rng.shuffle(inherited)
            inherited = inherited[: len(inherited) // 2]


def tune(space: Space, score: Scorer, options: SearchOptions,
         progress: Callable[[int, int], None] | None = None) -> list[tuple[float, Config]]:
    """Evolve ``options.budget`` scored configs; returns every distinct config scored, best first."""
    rng = _random.Random(options.seed)
    scores: dict[Config, float] = {}

    def evaluate(cfg: Config) -> float:
        if cfg not in scores:
            scores[cfg] = score(cfg)
            if progress:
                progress(min(len(scores), options.budget), options.budget)
        return scores[cfg]

    # start from the best quarter of a wider random draw: a population drawn at random converges
    # on whichever basin its best member sits in
    drawn = space.sample(min(SEED_DRAW * options.population, options.budget), seed=options.seed)
    population = sorted(drawn, key=evaluate)[: options.population]
    stale = 0
    while len(scores) < options.budget and stale < 4 * options.population:
        ranked = sorted(population, key=evaluate)
        elite = ranked[: max(2, len(ranked) // 4)]
        children: list[Config] = []
        for _ in range(options.population):
            p1 = min(rng.sample(ranked, min(3, len(ranked))), key=evaluate)  # tournament selection
            p2 = min(rng.sample(ranked, min(3, len(ranked))), key=evaluate)
            child = make_child(space, p1, p2, rng, options.mutation)
            before = len(scores)
            evaluate(child)
            stale = stale + 1 if len(scores) == before else 0
            children.append(child)
            if len(scores) >= options.budget:
                break
        population = list(dict.fromkeys(elite + sorted(children, key=evaluate)))[: options.population]
    return sorted(((s, c) for c, s in scores.items()), key=lambda sc: sc[0])
