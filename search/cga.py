"""Constraint-preserving genetic algorithm (after Heron), valid by construction.

A child is not built by splicing genomes (which breaks constraints) but solved by CP-SAT from
constraints: each inherited variable must equal parent 1's or parent 2's value, each mutated
variable is free with a uniformly random hint. If that restriction is unsatisfiable the inherited
set is halved until it is not, so every child is a solution of the space. The CP-SAT model is built
once by the Space and copied per child (Heron rebuilds it per sample).

The GA budget is shared by ISLANDS independent populations, each from its own random draw: one
population settles on the basin its best early members sit in, which need not be the best one
(README, "Calibrating a CPU"). Each island's first population is the best quarter of a random
draw four times its size (SEED_DRAW). A
population keeps one config per distinct score: configs the scorer cannot tell apart (cache blocks
that change no predicted cost) would otherwise fill it with copies of one basin and stop the search.

The last quarter of the budget (POLISH_SHARE) is steepest descent from the best few configs found
(``polish``) over one-variable changes and joint changes of coupled decisions (the register tile),
each repaired by CP-SAT to the nearest valid config; a wide domain offers a spread of its values
and the space's ``landmarks`` (cache blocks that cut a loop evenly, which a spread steps over and
random draws seldom hit). Crossover seldom moves one decision on its own,
such as which loop runs in parallel, when the rest of a good config is built around the other value,
and a population that has settled on one register tile seldom leaves it.

Options (``SearchOptions`` fields used): ``seed``, ``budget``, ``population``, ``mutation``.
"""

from __future__ import annotations

import itertools
import random as _random
from collections.abc import Callable

from aotune.constraints.space import Config, Space
from aotune.errors import UnsatisfiableError
from aotune.search.options import SearchOptions

Scorer = Callable[[Config], float]
SEED_DRAW = 4  # the first population is the best of SEED_DRAW x population random configs
POLISH_SHARE = 4  # 1/POLISH_SHARE of the budget goes to local descent from the best configs
POLISH_STARTS = 3
ISLANDS = 2  # independent populations, each from its own draw, sharing the GA budget
WIDE_DOMAIN = 12  # a domain wider than this offers local search a thinned set of values
WIDE_DOMAIN_SPREAD = 8


def make_child(
    space: Space, p1: Config, p2: Config, rng: _random.Random, mutation: float
) -> Config:
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


def tune(
    space: Space,
    score: Scorer,
    options: SearchOptions,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[float, Config]]:
    """Evolve ``options.budget`` scored configs; returns every distinct config scored, best
    first."""
    rng = _random.Random(options.seed)
    scores: dict[Config, float] = {}

    def evaluate(cfg: Config) -> float:
        if cfg not in scores:
            scores[cfg] = score(cfg)
            if progress:
                progress(min(len(scores), options.budget), options.budget)
        return scores[cfg]

    polish_budget = options.budget // POLISH_SHARE
    ga_budget = options.budget - polish_budget
    for island in range(ISLANDS):
        if len(scores) >= options.budget:
            break  # a budget smaller than the islands: the first ones spent it
        # start from the best quarter of a wider random draw: a population drawn at random
        # converges on whichever basin its best member sits in
        draw = max(1, min(SEED_DRAW * options.population, options.budget // ISLANDS))
        drawn = space.sample(draw, seed=options.seed * ISLANDS + island)
        population = one_per_score(sorted(drawn, key=evaluate), evaluate)[: options.population]
        island_budget = ga_budget * (island + 1) // ISLANDS
        evolve(space, population, evaluate, lambda: len(scores), island_budget, rng, options)
    for start in one_per_score(sorted(scores, key=evaluate), evaluate)[:POLISH_STARTS]:
        polish(space, start, evaluate, lambda: len(scores) >= options.budget)
    return sorted(((s, c) for c, s in scores.items()), key=lambda sc: sc[0])


def evolve(
    space: Space,
    population: list[Config],
    evaluate: Scorer,
    scored: Callable[[], int],
    budget: int,
    rng: _random.Random,
    options: SearchOptions,
) -> None:
    """Evolve one island's ``population`` until ``scored()`` (distinct configs scored so far)
    reaches ``budget``, or until 4 x population children in a row were scored before (the island
    has converged)."""
    stale = 0
    while population and scored() < budget and stale < 4 * options.population:
        ranked = sorted(population, key=evaluate)
        elite = ranked[: max(2, len(ranked) // 4)]
        children: list[Config] = []
        for _ in range(options.population):
            p1, p2 = (_tournament(ranked, evaluate, rng) for _ in range(2))
            child = make_child(space, p1, p2, rng, options.mutation)
            before = scored()
            evaluate(child)
            stale = stale + 1 if scored() == before else 0
            children.append(child)
            if scored() >= budget:
                break
        population = one_per_score(elite + sorted(children, key=evaluate), evaluate)[
            : options.population
        ]


def _tournament(ranked: list[Config], evaluate: Scorer, rng: _random.Random) -> Config:
    """The best of three members drawn at random (tournament selection)."""
    return min(rng.sample(ranked, min(3, len(ranked))), key=evaluate)


def polish(space: Space, start: Config, evaluate: Scorer, spent: Callable[[], bool]) -> None:
    """Steepest descent from ``start`` over ``local_moves``, until no move is better or the budget
    is ``spent``. Crossover rarely moves a single decision that the rest of a good config depends on
    (par, order, kc) on its own; this tries each such move. A move that breaks a constraint is
    repaired by CP-SAT to the valid config that changes the fewest other decisions, so a step may
    cross from one register tile to another (a 16x16 tile to 4x64 shrinks kc with it). The configs
    it visits are known to the caller through ``evaluate``, which records every score."""
    current = start
    while not spent():
        best = current
        for move in local_moves(space, current):
            if spent():
                break
            moved = current.replaced(move)
            if not space.is_valid(moved):
                try:
                    moved = space.nearest(current, move)
                except UnsatisfiableError:
                    continue
            if evaluate(moved) < evaluate(best):
                best = moved
        if best == current:
            return
        current = best


def local_moves(space: Space, cfg: Config) -> list[dict[str, int]]:
    """The moves ``polish`` tries from ``cfg``: each decision set to another value of its domain,
    and each of the space's ``joint_moves`` set to every other combination of values. A wide domain
    (a cache block of 1..541) offers its nearest two valid values either side (mc next to 30 is 20
    and 40 when it must be a multiple of mr=10), WIDE_DOMAIN_SPREAD values spread over it, so one
    step does not spend the budget on one decision, and the space's ``landmarks`` in it (the cache
    blocks that cut a loop into equal blocks)."""
    moves: list[dict[str, int]] = []
    landmarks = space.landmarks(cfg)
    for v in space.variables:
        domain, now = list(v.domain), cfg[v.name]
        if len(domain) > WIDE_DOMAIN:
            i = domain.index(now)
            values = set(domain[:: len(domain) // WIDE_DOMAIN_SPREAD])
            values.update(x for x in landmarks.get(v.name, ()) if x in v.domain)
            for side in (domain[i + 1 :], domain[:i][::-1]):
                values.update(
                    itertools.islice(
                        (x for x in side if space.is_valid(cfg.replaced({v.name: x}))), 2
                    )
                )
            domain = sorted(values)
        moves += [{v.name: x} for x in domain if x != now]
    for names in space.joint_moves:
        for values in itertools.product(*(space.var(n).domain for n in names)):
            if all(x != cfg[n] for n, x in zip(names, values)):
                moves.append(dict(zip(names, values)))
    return moves


def one_per_score(configs: list[Config], score: Scorer) -> list[Config]:
    """``configs`` in order, keeping only the first of those with the same score (to 1e-9
    relative)."""
    kept: list[Config] = []
    seen: set[float] = set()
    for cfg in configs:
        key = float(f"{score(cfg):.9e}")
        if key not in seen:
            seen.add(key)
            kept.append(cfg)
    return kept
