"""Integer expressions over decision variables, readable, evaluable and lowerable to CP-SAT.

One definition serves three uses: ``str()`` for ``aotune space``, ``evaluate()`` for
``Space.violations`` (the semantics), and ``to_cpsat()`` for the solver. The brute-force test checks
that the last two agree on small problems.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model


class LoweringContext:
    """Holds the CP-SAT model, the decision variables and their value bounds while lowering."""

    def __init__(
        self,
        model: cp_model.CpModel,
        variables: Mapping[str, Any],
        bounds: Mapping[str, tuple[int, int]],
    ):
        self.model, self.variables, self.bounds = model, variables, bounds
        self._cache: dict[str, Any] = {}
        self._count = 0

    def aux(self, key: str, lo: int, hi: int) -> tuple[Any, bool]:
        """An auxiliary variable for sub-expression ``key`` (shared when seen again)."""
        if key in self._cache:
            return self._cache[key], False
        self._count += 1
        var = self.model.new_int_var(lo, hi, f"aux{self._count}")
        self._cache[key] = var
        return var, True


class Expr:
    """Base class; subclasses are frozen dataclasses."""

    def evaluate(self, cfg: Mapping[str, int]) -> int:
        """The value under a full assignment ``cfg`` of the decisions."""
        raise NotImplementedError

    def bounds(self, b: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        """(lowest, highest) value over the decisions' domains ``b`` (sound, maybe loose)."""
        raise NotImplementedError

    def to_cpsat(self, ctx: LoweringContext) -> Any:
        """A CP-SAT linear expression equal to this one (products and divisions become
        auxiliary variables of ``ctx``'s model)."""
        raise NotImplementedError

    def variables(self) -> frozenset[str]:
        """Names of the decisions this expression reads."""
        raise NotImplementedError

    # small conveniences for building constraint tables
    def __add__(self, other: Expr | int) -> Expr:
        return Sum((self, as_expr(other)))

    def __mul__(self, other: Expr | int) -> Expr:
        return Prod((self, as_expr(other)))


def as_expr(x: Expr | int) -> Expr:
    """Wrap an int as a Const."""
    return x if isinstance(x, Expr) else Const(int(x))


@dataclass(frozen=True)
class Const(Expr):
    """An integer constant."""

    value: int

    def evaluate(self, cfg: Mapping[str, int]) -> int:
        return self.value

    def bounds(self, b: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        return self.value, self.value

    def to_cpsat(self, ctx: LoweringContext) -> Any:
        return self.value

    def variables(self) -> frozenset[str]:
        return frozenset()

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Var(Expr):
    """A decision of the space, by name."""

    name: str

    def evaluate(self, cfg: Mapping[str, int]) -> int:
        return int(cfg[self.name])

    def bounds(self, b: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        return b[self.name]

    def to_cpsat(self, ctx: LoweringContext) -> Any:
        return ctx.variables[self.name]

    def variables(self) -> frozenset[str]:
        return frozenset({self.name})

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Sum(Expr):
    """The sum of its terms."""

    terms: tuple[Expr, ...]

    def evaluate(self, cfg: Mapping[str, int]) -> int:
        return sum(t.evaluate(cfg) for t in self.terms)

    def bounds(self, b: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        bs = [t.bounds(b) for t in self.terms]
        return sum(lo for lo, _ in bs), sum(hi for _, hi in bs)

    def to_cpsat(self, ctx: LoweringContext) -> Any:
        return sum((t.to_cpsat(ctx) for t in self.terms), 0)

    def variables(self) -> frozenset[str]:
        return frozenset().union(*(t.variables() for t in self.terms))

    def __str__(self) -> str:
        out = ""
        for t in self.terms:
            s = str(t)
            if isinstance(t, Const) and t.value < 0:
                out += f" - {-t.value}"
            else:
                out += (" + " if out else "") + s
        return f"({out})"


@dataclass(frozen=True)
class Prod(Expr):
    """The product of its factors."""

    factors: tuple[Expr, ...]

    def evaluate(self, cfg: Mapping[str, int]) -> int:
        return math.prod(f.evaluate(cfg) for f in self.factors)

    def bounds(self, b: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        lo, hi = 1, 1
        for f in self.factors:
            flo, fhi = f.bounds(b)
            cands = [lo * flo, lo * fhi, hi * flo, hi * fhi]
            lo, hi = min(cands), max(cands)
        return lo, hi

    def to_cpsat(self, ctx: LoweringContext) -> Any:
        const = math.prod(f.value for f in self.factors if isinstance(f, Const))
        rest = [f for f in self.factors if not isinstance(f, Const)]
        if not rest:
            return const
        acc = rest[0].to_cpsat(ctx)
        acc_expr: Expr = rest[0]
        for f in rest[1:]:
            acc_expr = Prod((acc_expr, f))
            lo, hi = acc_expr.bounds(ctx.bounds)
            var, new = ctx.aux(str(acc_expr), lo, hi)
            if new:
                ctx.model.add_multiplication_equality(var, [acc, f.to_cpsat(ctx)])
            acc = var
        return const * acc

    def variables(self) -> frozenset[str]:
        return frozenset().union(*(f.variables() for f in self.factors))

    def __str__(self) -> str:
        return "*".join(str(f) for f in self.factors)


@dataclass(frozen=True)
class CeilDiv(Expr):
    """ceil(num / den), integer division rounding up."""

    num: Expr
    den: Expr  # must be >= 1 over the domains

    def evaluate(self, cfg: Mapping[str, int]) -> int:
        return -(-self.num.evaluate(cfg) // self.den.evaluate(cfg))

    def bounds(self, b: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        nlo, nhi = self.num.bounds(b)
        dlo, dhi = self.den.bounds(b)
        dlo = max(1, dlo)
        return -(-nlo // max(1, dhi)) if nlo >= 0 else nlo, -(-nhi // dlo) if nhi >= 0 else 0

    def to_cpsat(self, ctx: LoweringContext) -> Any:
        lo, hi = self.bounds(ctx.bounds)
        var, new = ctx.aux(str(self), min(lo, hi), max(lo, hi))
        if new:
            den = self.den.to_cpsat(ctx)
            nlo, nhi = self.num.bounds(ctx.bounds)
            _, dhi = self.den.bounds(ctx.bounds)
            shifted, _ = ctx.aux(f"shift:{self}", nlo, nhi + dhi)
            ctx.model.add(shifted == self.num.to_cpsat(ctx) + den - 1)
            ctx.model.add_division_equality(var, shifted, den)
        return var

    def variables(self) -> frozenset[str]:
        return self.num.variables() | self.den.variables()

    def __str__(self) -> str:
        return f"ceil({self.num}/{self.den})"
