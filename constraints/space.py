"""The search space: decision variables, constraints, and the CP-SAT model built once from them.

Roadmap: ``Space`` is target-agnostic; ``constraints/cpu.py`` fills it for CPU contractions and a
GPU builder will fill it with thread/shared-memory/register constraints. The model is built once per
space; ``solve`` copies it and adds the caller's restrictions, so GA children never rebuild it.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from aotune.constraints.expr import Expr, LoweringContext
from aotune.errors import ConfigError, UnsatisfiableError
from ortools.sat.python import cp_model

# draws in a row that found no new config, at least, after which ``Space.sample`` takes the space
# as used up; at least as many as it has found, too, so a larger space is drawn on for longer
SAMPLE_STALE_DRAWS = 100


@dataclass(frozen=True)
class DecisionVar:
    """One decision: a name, its allowed values and, for categorical ones, a label per value."""

    name: str
    domain: tuple[int, ...]
    description: str
    labels: tuple[str, ...] = ()  # labels[i] names value i
    # a decision added after configs were written down (records, databases, libraries): those
    # configs take this value, the kernel they were made as
    default: int | None = None

    def label(self, value: int) -> str:
        """The readable form of ``value``."""
        return self.labels[value] if self.labels and 0 <= value < len(self.labels) else str(value)

    def parse(self, text: str) -> int:
        """A value from its label or integer text."""
        if text in self.labels:
            return self.labels.index(text)
        if self.labels:  # a label's index is an internal number, not something a user means
            raise ConfigError(
                f"config value {self.name}={text!r} is not one of {self.name}'s values; "
                f"use {self.domain_text()}"
            )
        if re.fullmatch(r"-?0*[0-9]{1,18}", text):
            return int(text)
        if re.fullmatch(r"-?[0-9]+", text):  # digits, but more than any domain holds
            raise ConfigError(
                f"config value {self.name}={text[:12]}... ({len(text)} characters) is outside "
                f"{self.name}'s values; use one of {self.domain_text()}"
            )
        if re.search(r"[;\s]\w+=", text):  # mr=8;nr=16 or mr=8 nr=16: one value of it all
            raise ConfigError(
                f"config value {self.name}={text!r} holds more than one decision; separate "
                "them with ',' (mr=8,nr=16,...)"
            )
        raise ConfigError(
            f"config value {self.name}={text!r} is not valid; use an integer in digits 0-9"
        )

    def domain_text(self) -> str:
        """Compact description of the domain."""
        if self.labels:
            return " | ".join(self.labels)
        d = self.domain
        if len(d) > 2 and d == tuple(range(d[0], d[-1] + 1)):
            return f"{d[0]}..{d[-1]}"
        step = d[1] - d[0] if len(d) > 2 else 0
        if len(d) > 4 and step and d == tuple(range(d[0], d[-1] + 1, step)):
            return f"{d[0]}..{d[-1]} step {step}"
        return "{" + ", ".join(map(str, d)) + "}"


def _one_worker_solver(time_limit: float | None = None) -> cp_model.CpSolver:
    """A single-threaded solver (deterministic for a seed; the search runs many small solves),
    stopped after ``time_limit`` seconds if one is given."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    # CP-SAT installs its own SIGINT handler for each solve unless told not to, and it ends or
    # ignores Ctrl-C there; Python's handler must see it, so that the CLI stops in one line
    solver.parameters.catch_sigint_signal = False
    if time_limit is not None:
        solver.parameters.max_time_in_seconds = time_limit
    return solver


@dataclass(frozen=True)
class Config:
    """The decisions, as an ordered name -> int mapping: the GA genome and the cache key."""

    items: tuple[tuple[str, int], ...]

    def __getitem__(self, name: str) -> int:
        for k, v in self.items:
            if k == name:
                return v
        raise KeyError(name)

    def as_dict(self) -> dict[str, int]:
        """A plain dict copy."""
        return dict(self.items)

    def replaced(self, values: Mapping[str, int]) -> Config:
        """A new config with the decisions in ``values`` changed (not checked for validity)."""
        return Config(tuple((k, values.get(k, v)) for k, v in self.items))

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.items)


@dataclass(frozen=True)
class Violation:
    """A broken constraint: what, how much is required, how much is available, how to fix."""

    constraint: str
    text: str
    required: int
    available: int
    hint: str

    relation: str = "<="

    def as_dict(self) -> dict[str, object]:
        """JSON form: the fields, and ``message``, the line that says what ``required`` and
        ``available`` are under this relation (for ``divides``: the value, and what it must be a
        multiple of)."""
        return {**dataclasses.asdict(self), "message": str(self)}

    def __str__(self) -> str:
        if self.relation == "in":
            amounts = f"{self.required} is outside the allowed values"
        elif self.relation == "divides":
            amounts = f"{self.required} is not a multiple of {self.available}"
        elif self.relation == "==":
            amounts = f"is {self.required}, must be {self.available}"
        elif self.relation == ">=":
            amounts = f"have {self.required}, need at least {self.available}"
        else:
            amounts = f"required {self.required}, available {self.available}"
        return f"{self.constraint}: {self.text} -- {amounts}; {self.hint}"


Relation = Literal["<=", ">=", "==", "divides"]


@dataclass(frozen=True)
class Constraint:
    """``lhs REL rhs`` (``divides``: rhs divides lhs), optionally only when ``var == value``."""

    name: str
    lhs: Expr
    relation: Relation
    rhs: Expr
    text: str
    hint: str
    when: tuple[str, int] | None = None

    def applies(self, cfg: Mapping[str, int]) -> bool:
        """Whether the guard (if any) is active for ``cfg``."""
        return self.when is None or cfg[self.when[0]] == self.when[1]

    def holds(self, cfg: Mapping[str, int]) -> bool:
        """The constraint's truth for a full config (the semantics CP-SAT must match)."""
        if not self.applies(cfg):
            return True
        lhs, rhs = self.lhs.evaluate(cfg), self.rhs.evaluate(cfg)
        return {
            "<=": lhs <= rhs,
            ">=": lhs >= rhs,
            "==": lhs == rhs,
            "divides": rhs != 0 and lhs % rhs == 0,
        }[self.relation]

    def violation(self, cfg: Mapping[str, int]) -> Violation | None:
        """A Violation if ``cfg`` breaks this constraint."""
        if self.holds(cfg):
            return None
        return Violation(
            self.name,
            self.text,
            self.lhs.evaluate(cfg),
            self.rhs.evaluate(cfg),
            self.hint,
            self.relation,
        )


@dataclass
class Space:
    """Decision variables + constraints, with a CP-SAT model built once."""

    title: str
    variables: tuple[DecisionVar, ...]
    constraints: tuple[Constraint, ...]
    # decisions that trade off against one shared limit (a register tile's rows and columns against
    # the vector registers): local search moves them together, since one alone is seldom valid
    joint_moves: tuple[tuple[str, ...], ...] = ()
    # sample() may take a drawn value without a solve when changing that one decision of the
    # current config keeps it valid (a sufficient test, about 100x cheaper than a solve); off, every
    # drawn value is settled by a solve
    sample_by_replacement: ClassVar[bool] = False
    # CP-SAT parameters for the search's solves (solve, nearest, and so sample), set after the
    # defaults; empty: every solve as it always was
    search_solver_parameters: ClassVar[Mapping[str, object]] = {}
    _model: cp_model.CpModel = field(init=False, repr=False)
    _vars: dict[str, cp_model.IntVar] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = [n for group in self.joint_moves for n in group if n not in self.names]
        if unknown:
            raise ConfigError(f"joint moves name unknown decision(s) {', '.join(unknown)}")
        self._scratch: cp_model.CpModel | None = None
        self._model = cp_model.CpModel()
        self._vars, _ = self._lower_into(self._model, switchable=False)

    def _lower_into(
        self, model: cp_model.CpModel, switchable: bool
    ) -> tuple[dict[str, cp_model.IntVar], list[cp_model.IntVar]]:
        """Add the decision variables and every constraint to ``model``; with ``switchable``, each
        constraint holds only when a literal of its own is true (returned in constraint order), so
        a solve under assumptions can tell which constraints conflict."""
        variables = {
            v.name: model.new_int_var_from_domain(
                cp_model.Domain.from_values(list(v.domain)), v.name
            )
            for v in self.variables
        }
        bounds = {v.name: (min(v.domain), max(v.domain)) for v in self.variables}
        ctx = LoweringContext(model, variables, bounds)
        guards: dict[tuple[str, int], cp_model.IntVar] = {}

        def guard(name: str, value: int) -> cp_model.IntVar:
            if (name, value) not in guards:
                b = model.new_bool_var(f"{name}_is_{value}")
                model.add(variables[name] == value).only_enforce_if(b)
                model.add(variables[name] != value).only_enforce_if(~b)
                guards[name, value] = b
            return guards[name, value]

        switches = []
        for c in self.constraints:
            lhs, rhs = c.lhs.to_cpsat(ctx), c.rhs.to_cpsat(ctx)
            if c.relation == "divides":
                rlo, rhi = c.rhs.bounds(bounds)
                rem, _ = ctx.aux(f"rem:{c.name}:{c.lhs}%{c.rhs}", 0, max(0, rhi - 1))
                lo, hi = c.lhs.bounds(bounds)
                lhs_var, new_lhs = ctx.aux(f"val:{c.lhs}", lo, hi)
                rhs_var, new_rhs = ctx.aux(f"val:{c.rhs}", max(1, rlo), max(1, rhi))
                if new_lhs:
                    model.add(lhs_var == lhs)
                if new_rhs:
                    model.add(rhs_var == rhs)
                model.add_modulo_equality(rem, lhs_var, rhs_var)
                ct = model.add(rem == 0)
            else:
                ct = model.add({"<=": lhs <= rhs, ">=": lhs >= rhs, "==": lhs == rhs}[c.relation])
            literals = [guard(*c.when)] if c.when is not None else []
            if switchable:
                switches.append(model.new_bool_var(f"holds:{c.name}"))
                literals.append(switches[-1])
            if literals:
                ct.only_enforce_if(literals)
        return variables, switches

    def conflicting_constraints(self, time_limit: float = 5.0) -> list[Constraint]:
        """A small set of constraints that no config can meet together (empty when some config
        meets them all, or when CP-SAT cannot tell in time): what an empty space's error names."""
        model = cp_model.CpModel()
        _, switches = self._lower_into(model, switchable=True)
        model.add_assumptions(switches)
        solver = _one_worker_solver(time_limit)
        if solver.solve(model) != cp_model.INFEASIBLE:
            return []
        core = set(solver.sufficient_assumptions_for_infeasibility())
        return [c for c, lit in zip(self.constraints, switches) if lit.index in core]

    # ---- configs -------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """Decision variable names, in order."""
        return tuple(v.name for v in self.variables)

    def var(self, name: str) -> DecisionVar:
        """The decision variable ``name``."""
        for v in self.variables:
            if v.name == name:
                return v
        raise ConfigError(f"unknown decision {name!r}; this space has {', '.join(self.names)}")

    def config(self, values: Mapping[str, int]) -> Config:
        """A Config in this space's variable order; names must match exactly."""
        unknown = [k for k in values if k not in self.names]
        if unknown:
            raise ConfigError(
                f"unknown decision(s) {', '.join(unknown)}; this space has {', '.join(self.names)}"
            )
        values = {
            **{v.name: v.default for v in self.variables if v.default is not None},
            **values,
        }
        missing = [n for n in self.names if n not in values]
        if missing:
            # a decision with a default (added after configs were first written) may be left out
            given = [
                n if self.var(n).default is None else f"{n} (optional, {self.var(n).default})"
                for n in self.names
            ]
            raise ConfigError(
                f"config is missing {', '.join(missing)}; give every decision: {', '.join(given)}"
            )
        return Config(tuple((n, int(values[n])) for n in self.names))

    def parse_config(self, text: str) -> Config:
        """``"mr=8,nr=32,..."`` (labels allowed for categorical decisions) -> Config."""
        values: dict[str, int] = {}
        if not text.strip():
            raise ConfigError(f"the config is empty; give every decision, e.g. {self.example()}")
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise ConfigError(f"config item {part!r} is not name=value; e.g. {self.example()}")
            k, v = (s.strip() for s in part.split("=", 1))
            if k in values:
                raise ConfigError(f"config gives {k} twice; give each decision once")
            values[k] = self.var(k).parse(v)
        return self.config(values)

    def example(self) -> str:
        """A valid config as text, for messages."""
        try:
            return self.describe_config(self.solve())  # labels, as --config takes them
        except UnsatisfiableError:
            return ",".join(f"{v.name}={v.domain[0]}" for v in self.variables)

    def landmarks(self, cfg: Config) -> Mapping[str, tuple[int, ...]]:
        """Values of wide decisions worth a local search's try from ``cfg``, beside its spread of
        the domain (a space knows which values its loops favour); none by default."""
        return {}

    def describe_config(self, cfg: Config) -> str:
        """Config with labels for categorical decisions."""
        return ",".join(f"{n}={self.var(n).label(v)}" for n, v in cfg.items)

    def violations(self, cfg: Config) -> list[Violation]:
        """Every broken domain and constraint for ``cfg`` (empty: valid)."""
        out = []
        values = cfg.as_dict()
        for v in self.variables:
            if values[v.name] not in v.domain:
                out.append(
                    Violation(
                        f"domain of {v.name}",
                        f"{v.name} in {v.domain_text()}",
                        values[v.name],
                        max(v.domain),
                        f"choose {v.name} from {v.domain_text()}",
                        "in",
                    )
                )
        if out:
            return out  # constraint formulas assume in-domain values (e.g. no division by 0)
        return [viol for c in self.constraints if (viol := c.violation(values)) is not None]

    def is_valid(self, cfg: Config) -> bool:
        """No violations."""
        return not self.violations(cfg)

    # ---- solving -------------------------------------------------------------------------------
    def solve(
        self,
        allowed: Mapping[str, Iterable[int]] | None = None,
        hints: Mapping[str, int] | None = None,
        seed: int = 0,
        time_limit: float = 2.0,
    ) -> Config:
        """One valid config with each variable restricted to ``allowed`` values, guided by
        ``hints``.

        Raises UnsatisfiableError if no config satisfies the restrictions.

        Hints that name every decision and form a valid config within ``allowed`` are returned
        as they are, without a solve: CP-SAT (no presolve, one worker) returns such a complete,
        feasible hint as its solution, so the answer is the same at a fraction of the cost.
        """
        hinted = self._valid_hint(allowed, hints)
        if hinted is not None:
            return hinted
        model = self._model
        if allowed or hints:
            model, cvars = self._restrictable_copy()
            for name, vals in (allowed or {}).items():
                model.add_linear_expression_in_domain(
                    cvars[name], cp_model.Domain.from_values(sorted(set(vals)))
                )
            for name, val in (hints or {}).items():
                model.add_hint(cvars[name], val)
        solver = _one_worker_solver(time_limit)
        solver.parameters.random_seed = seed
        # presolve rewrites variables and drops the hints on them (a hinted par=n came back as par=m
        # every time), which turned every GA mutation into "take the solver's default value"
        solver.parameters.cp_model_presolve = not hints
        self._tuned(solver)
        status = solver.solve(model)
        if status == cp_model.INFEASIBLE and not allowed:
            raise UnsatisfiableError(self.empty_space_message())
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            why = (
                "no config satisfies the restrictions"
                if status == cp_model.INFEASIBLE
                else f"the solver found no config within {time_limit:g} s"
            )
            raise UnsatisfiableError(f"{self.title}: {why}")
        return self._solution(solver)

    def _valid_hint(
        self, allowed: Mapping[str, Iterable[int]] | None, hints: Mapping[str, int] | None
    ) -> Config | None:
        """The hinted config, if the hints name every decision, keep to ``allowed`` and meet
        every constraint."""
        if not hints or any(n not in hints for n in self.names):
            return None
        if any(hints[n] not in set(vals) for n, vals in (allowed or {}).items()):
            return None
        cfg = Config(tuple((n, int(hints[n])) for n in self.names))
        return cfg if self.is_valid(cfg) else None

    def empty_space_message(self) -> str:
        """Why no config exists at all: the constraints that conflict, with their rules."""
        conflict = self.conflicting_constraints()
        if not conflict:
            return f"{self.title}: no config satisfies all {len(self.constraints)} constraints"
        rules = "; ".join(f"{c.name} ({c.text})" for c in conflict)
        return (
            f"{self.title}: no config satisfies {rules}; the workload or the target's limits "
            "leave no room for any schedule (check the spec's values)"
        )

    def nearest(self, cfg: Config, fixed: Mapping[str, int], time_limit: float = 1.0) -> Config:
        """The valid config with the ``fixed`` values that changes the fewest other decisions of
        ``cfg`` (a local-search move repaired: setting mr alone may break the register limit that a
        smaller nr would meet). Raises UnsatisfiableError if no config has the ``fixed`` values."""
        model, cvars = self._restrictable_copy()
        changed = []
        for name, value in cfg.items:
            if name in fixed:
                model.add(cvars[name] == fixed[name])
                continue
            kept = model.new_bool_var(f"keep:{name}")
            model.add(cvars[name] == value).only_enforce_if(kept)
            changed.append(~kept)
            model.add_hint(cvars[name], value)
        model.minimize(sum(changed))
        solver = self._tuned(_one_worker_solver(time_limit))
        if solver.solve(model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            raise UnsatisfiableError(
                f"{self.title}: no config has {', '.join(f'{k}={v}' for k, v in fixed.items())}"
            )
        return self._solution(solver)

    def _tuned(self, solver: cp_model.CpSolver) -> cp_model.CpSolver:
        """``solver`` with this space's ``search_solver_parameters``."""
        for name, value in self.search_solver_parameters.items():
            setattr(solver.parameters, name, value)
        return solver

    def _solution(self, solver: cp_model.CpSolver) -> Config:
        return Config(tuple((n, int(solver.value(self._vars[n]))) for n in self.names))

    def _restrictable_copy(self) -> tuple[cp_model.CpModel, dict[str, cp_model.IntVar]]:
        """The base model, copied into one scratch model that a solve may add restrictions to, and
        the decision variables of that copy by name.

        ``CpModel.clone`` builds a new CpModel, and recent OR-Tools attach dozens of deprecated
        method aliases to each new instance: that was a third of a whole GA search. Copying the
        proto into a kept model does the same work without it (one solve at a time per Space).
        """
        if self._scratch is None:
            self._scratch = cp_model.CpModel()
        proto = self._scratch.proto
        copy_from = getattr(proto, "copy_from", None) or proto.CopyFrom  # pybind proto / protobuf
        copy_from(self._model.proto)
        self._scratch.rebuild_constant_map()
        return self._scratch, {
            n: self._scratch.get_int_var_from_proto_index(v.index) for n, v in self._vars.items()
        }

    def sample(self, n: int, seed: int = 0) -> list[Config]:
        """Up to ``n`` distinct valid configs, reproducible for a given ``seed``.

        Each sample visits the variables in random order and fixes each to a uniformly random value
        of its domain when CP-SAT says the fixings so far stay feasible (two tries, else it is left
        to the solver), so every sample is valid by construction and spread over the whole space.
        With ``sample_by_replacement`` a value whose one-decision change of the current config is
        valid is taken without a solve (the solver is asked only when that change alone breaks a
        constraint and others must move with it). Stops early once ``SAMPLE_STALE_DRAWS`` draws
        in a row, and as many as it has found, found nothing new: a small space is used up (a
        1 x 1 x 1 matmul's holds 24 configs; a budget of a million drew three million times).
        """
        rng = random.Random(seed)
        seen: dict[Config, None] = {}
        attempts = stale = 0
        while len(seen) < n and attempts < 3 * n + 10:
            if stale >= max(SAMPLE_STALE_DRAWS, len(seen)):
                break  # as many draws in a row found nothing new as there are configs found
            attempts += 1
            order = list(self.variables)
            rng.shuffle(order)
            fixed: dict[str, list[int]] = {}
            cfg = self.solve(seed=rng.randrange(1 << 30))
            for v in order:
                for _ in range(2):
                    value = rng.choice(v.domain)
                    if cfg[v.name] == value:
                        fixed[v.name] = [value]
                        break
                    moved = cfg.replaced({v.name: value})
                    if self.sample_by_replacement and self.is_valid(moved):
                        cfg, fixed[v.name] = moved, [value]
                        break
                    try:
                        cfg = self.solve({**fixed, v.name: [value]}, seed=rng.randrange(1 << 30))
                    except UnsatisfiableError:
                        continue
                    fixed[v.name] = [value]
                    break
                else:
                    fixed[v.name] = [cfg[v.name]]
            stale = stale + 1 if cfg in seen else 0
            seen.setdefault(cfg, None)
        return list(seen)

    def count(self, time_limit: float = 10.0) -> tuple[int, bool]:
        """Number of valid configs and whether it is exact (False: a lower bound, time ran out)."""

        class _Counter(cp_model.CpSolverSolutionCallback):
            def __init__(self, deadline: float) -> None:
                super().__init__()
                self.n, self.deadline, self.cut = 0, deadline, False

            def on_solution_callback(self) -> None:
                self.n += 1
                if self.n % 256 == 0 and time.monotonic() > self.deadline:
                    self.cut = True
                    self.stop_search()

        solver = _one_worker_solver(time_limit)
        solver.parameters.enumerate_all_solutions = True
        counter = _Counter(time.monotonic() + time_limit)
        # Auxiliary variables are functions of the decisions, so solutions map 1:1 to configs.
        status = solver.solve(self._model, counter)
        exact = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and not counter.cut
        return counter.n, exact

    def enumerate(self, limit: int = 100_000) -> list[Config]:
        """All valid configs (small spaces only; raises if there are more than ``limit``)."""

        class _Collector(cp_model.CpSolverSolutionCallback):
            def __init__(self, space: Space) -> None:
                super().__init__()
                self.space, self.found = space, []

            def on_solution_callback(self) -> None:
                self.found.append(
                    Config(
                        tuple((n, int(self.value(self.space._vars[n]))) for n in self.space.names)
                    )
                )
                if len(self.found) > limit:
                    self.stop_search()

        solver = _one_worker_solver()
        solver.parameters.enumerate_all_solutions = True
        collector = _Collector(self)
        solver.solve(self._model, collector)
        if len(collector.found) > limit:
            raise UnsatisfiableError(
                f"{self.title}: more than {limit} configs; use sample() instead"
            )
        return collector.found
