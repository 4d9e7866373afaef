from __future__ import annotations

import dataclasses

import pytest
from aotune.analysis.workload import matmul
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import ConfigError, UnsatisfiableError
from aotune.hwspecs.spec import load_target
from constraint import FunctionConstraint, Problem
from hypothesis import given, settings
from hypothesis import strategies as st

from .conftest import small_spec


def brute_force(space) -> set[tuple[tuple[str, int], ...]]:
    """Every config satisfying every constraint, enumerated by python-constraint (no CP-SAT)."""
    problem = Problem()
    for v in space.variables:
        problem.addVariable(v.name, list(v.domain))
    for c in space.constraints:
        names = sorted(c.lhs.variables() | c.rhs.variables() | ({c.when[0]} if c.when else set()))

        def check(*values, c=c, names=names):
            return c.holds(dict(zip(names, values)))

        problem.addConstraint(FunctionConstraint(check), names)
    return {tuple((n, sol[n]) for n in space.names) for sol in problem.getSolutions()}


@pytest.mark.parametrize("shape, spec", [((3, 17, 5), "haswell"), ((5, 9, 20), "neoverse-n1")])
def test_cpsat_solutions_equal_brute_force_enumeration(shape, spec):
    hw = small_spec(spec, cores=2)
    space = build_cpu_space(matmul(*shape), hw)
    expected = brute_force(space)
    got = {cfg.items for cfg in space.enumerate()}
    assert got == expected
    assert len(got) > 100
    n, exact = space.count(time_limit=30)
    assert exact and n == len(expected)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 10_000), M=st.integers(1, 300), N=st.integers(1, 300), K=st.integers(1, 300)
)
def test_every_sampled_config_satisfies_every_constraint(seed, M, N, K):
    space = build_cpu_space(matmul(M, N, K), load_target("skylake-avx512"))
    configs = space.sample(4, seed=seed)
    assert configs
    for cfg in configs:
        values = cfg.as_dict()
        assert all(values[v.name] in v.domain for v in space.variables)
        assert all(c.holds(values) for c in space.constraints), space.violations(cfg)


def test_sampling_is_reproducible():
    space = build_cpu_space(matmul(64, 64, 64), load_target("haswell"))
    assert space.sample(5, seed=3) == space.sample(5, seed=3)


def test_sampling_a_small_space_stops_when_it_is_used_up():
    """A 1 x 1 x 1 matmul's space holds a few dozen configs: asking a million of them gives every
    one (the brute-force enumeration's), after about a hundred draws that find nothing new, not
    three million draws."""
    space = build_cpu_space(matmul(1, 1, 1), load_target("haswell"))
    every = brute_force(space)
    drawn = space.sample(1_000_000, seed=3)
    assert {tuple((n, c[n]) for n in space.names) for c in drawn} == every


def test_violations_state_required_available_and_hint():
    space = build_cpu_space(matmul(1024, 1024, 1024), load_target("skylake-avx512"))
    cfg = space.parse_config(
        "mr=16,nr=64,kc=512,mc=100,nc=64,order=nkm,pack_a=1,pack_b=1,unroll=4,par=m,threads=2"
    )
    bad = {v.constraint: v for v in space.violations(cfg)}
    assert {"registers", "mc multiple of mr", "L1 footprint"} <= set(bad)
    reg = bad["registers"]
    assert (reg.required, reg.available) == (16 * 4 + 4 + 1, 32)
    assert "reduce mr or nr" in str(reg)
    l1 = bad["L1 footprint"]
    assert l1.required == 4 * (16 * 512 + 512 * 64) and l1.available == int(32 * 1024 * 0.8)


def test_config_parsing_errors():
    space = build_cpu_space(matmul(64, 64, 64), load_target("haswell"))
    with pytest.raises(ConfigError, match="unknown decision"):
        space.parse_config("mr=4,bogus=1")
    with pytest.raises(ConfigError, match="missing"):
        space.parse_config("mr=4")
    with pytest.raises(ConfigError, match="order='zzz' is not one of order's values"):
        space.parse_config("order=zzz")
    # a label's index is not a value a user means: order=1 would silently pick mkn
    for bad in ("order=1", "par=0", "order=01"):
        with pytest.raises(ConfigError, match="use nkm \\| mkn \\| nmk|use m \\| n"):
            space.parse_config(bad)


def test_one_vector_register_is_unsatisfiable():
    hw = load_target("haswell")
    hw = dataclasses.replace(hw, isa=dataclasses.replace(hw.isa, vector_registers=1))
    with pytest.raises(UnsatisfiableError, match="1 vector register"):
        build_cpu_space(matmul(64, 64, 64), hw)


def test_one_cache_block_may_cover_an_extent_no_register_tile_divides():
    # M=49 with mr=13: mc=52 is one block (B swept once); past the rounded-up extent is refused
    space = build_cpu_space(matmul(49, 64, 64), load_target("skylake-avx512"))
    base = "mr=13,nr=32,kc=64,nc=64,order=nkm,pack_a=1,pack_b=0,unroll=1,par=n,threads=2"
    assert space.violations(space.parse_config(f"{base},mc=52")) == []
    assert {v.constraint for v in space.violations(space.parse_config(f"{base},mc=65"))} == {
        "cover m"
    }


def test_solver_follows_every_feasible_hint():
    # The GA mutates a decision by hinting a new value; CP-SAT's presolve used to drop hints on some
    # variables (a hinted par=n came back as par=m every time), so mutation only ever reset them.
    space = build_cpu_space(matmul(96, 80, 64), load_target("skylake-avx512"))
    base = space.sample(1, seed=4)[0]
    tried = 0
    for v in space.variables:
        fixed = {u.name: {base[u.name]} for u in space.variables if u.name != v.name}
        for value in v.domain:
            moved = dataclasses.replace(
                base, items=tuple((k, value if k == v.name else x) for k, x in base.items)
            )
            if value == base[v.name] or not space.is_valid(moved):
                continue
            assert space.solve(fixed, {v.name: value}, seed=tried) == moved, (
                f"hint {v.name}={value} ignored"
            )
            tried += 1
    assert tried >= 10


@settings(max_examples=12, deadline=None)
@given(
    pick=st.integers(0, 10_000),
    var=st.sampled_from(["mr", "nr", "kc", "order", "pack_a", "par"]),
    value_pick=st.integers(0, 10_000),
)
def test_nearest_valid_config_changes_the_fewest_decisions_brute_force_finds(pick, var, value_pick):
    # local search repairs a move that breaks a constraint with ``nearest``; it must keep the moved
    # value and change no more other decisions than the closest valid config does
    space = build_cpu_space(matmul(3, 17, 5), small_spec("haswell", cores=2))
    valid = sorted(brute_force(space))
    start = space.config(dict(valid[pick % len(valid)]))
    value = space.var(var).domain[value_pick % len(space.var(var).domain)]
    with_value = [dict(items) for items in valid if dict(items)[var] == value]
    if not with_value:
        with pytest.raises(UnsatisfiableError):
            space.nearest(start, {var: value})
        return
    fewest = min(sum(cfg[n] != start[n] for n in space.names if n != var) for cfg in with_value)
    got = space.nearest(start, {var: value})
    assert space.is_valid(got) and got[var] == value
    assert sum(got[n] != start[n] for n in space.names if n != var) == fewest
