from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings, strategies as st

from aotune.analysis.polyhedral import analyze
from aotune.analysis.workload import build_workload, einsum, matmul
from aotune.errors import WorkloadError


def brute_force_footprint(w, tensor: str, origin: dict[str, int], tiles: dict[str, int]) -> int:
    """Distinct elements of ``tensor`` touched by the tile, counted point by point."""
    acc = next(a for a in (w.statement.output, *w.statement.inputs) if a.tensor == tensor)
    names = [lp.name for lp in w.loops]
    touched = set()
    ranges = [range(origin[n], min(origin[n] + tiles[n], w.loop(n).extent)) for n in names]
    for point in itertools.product(*ranges):
        env = dict(zip(names, point))
        touched.add(tuple(sum(c * env[v] for v, c in idx.terms) + idx.const for idx in acc.indices))
    return len(touched)


@settings(max_examples=40, deadline=None)
@given(spec=st.sampled_from(["mk,kn->mn", "km,kn->mn", "mk,nk->mn", "ik,kj->ij"]),
       tm=st.integers(1, 6), tn=st.integers(1, 6), tk=st.integers(1, 6))
def test_isl_footprints_equal_brute_force_counts(spec, tm, tn, tk):
    letters = sorted(set(spec) - set(",->"))
    dims = {ch: 7 for ch in letters}
    w = einsum(spec, dims)
    info = analyze(w)
    out_letters = spec.split("->")[1]
    red = next(ch for ch in letters if ch not in out_letters)
    tiles = {out_letters[0]: tm, out_letters[1]: tn, red: tk}
    origin = {ch: 0 for ch in letters}
    for t in info.tensors:
        assert info.footprint_elements(t.tensor, tiles) == brute_force_footprint(w, t.tensor, origin, tiles)


def test_reuse_strides_and_dependences_of_matmul():
    info = analyze(matmul(64, 48, 32))
    a, b, c = info.tensor("A"), info.tensor("B"), info.tensor("C")
    assert a.invariant_loops == {"n"} and b.invariant_loops == {"m"} and c.invariant_loops == {"k"}
    assert (a.stride("m"), a.stride("k")) == (32, 1)
    assert (b.stride("k"), b.stride("n")) == (48, 1)
    assert c.stride("n") == 1
    assert info.reduction_carried_by == {"k"}
    assert "S[m, n, k] -> A[m, k]" in a.access_map


@pytest.mark.parametrize("shape, message", [
    ("0x5x5", "dimension M must be a positive integer, got 0"),
    ("-3x4x4", "dimension M must be a positive integer, got -3"),
    ("abc", "has 1 sizes, expected 3"),
    ("4xfoox4", "N='foo' is not an integer"),
])
def test_bad_shapes_get_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_workload("matmul", shape)


def test_unknown_operator():
    with pytest.raises(WorkloadError, match="unknown operator 'conv9d'"):
        build_workload("conv9d", "4x4x4")


def test_flops_of_matmul():
    assert matmul(3, 5, 7).flops == 2 * 3 * 5 * 7
