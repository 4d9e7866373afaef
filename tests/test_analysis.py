from __future__ import annotations

import itertools

import pytest
from aotune.analysis.polyhedral import analyze
from aotune.analysis.workload import build_workload, einsum, matmul
from aotune.errors import WorkloadError
from hypothesis import given, settings
from hypothesis import strategies as st


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
@given(
    spec=st.sampled_from(["mk,kn->mn", "km,kn->mn", "mk,nk->mn", "ik,kj->ij"]),
    tm=st.integers(1, 6),
    tn=st.integers(1, 6),
    tk=st.integers(1, 6),
)
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
        assert info.footprint_elements(t.tensor, tiles) == brute_force_footprint(
            w, t.tensor, origin, tiles
        )


def test_reuse_strides_and_dependences_of_matmul():
    info = analyze(matmul(64, 48, 32))
    a, b, c = info.tensor("A"), info.tensor("B"), info.tensor("C")
    assert a.invariant_loops == {"n"} and b.invariant_loops == {"m"} and c.invariant_loops == {"k"}
    assert (a.stride("m"), a.stride("k")) == (32, 1)
    assert (b.stride("k"), b.stride("n")) == (48, 1)
    assert c.stride("n") == 1
    assert info.reduction_carried_by == {"k"}
    assert "S[m, n, k] -> A[m, k]" in a.access_map


@pytest.mark.parametrize(
    "shape, message",
    [
        ("0x5x5", "dimension M must be a positive integer, got 0"),
        ("-3x4x4", "dimension M must be a positive integer, got -3"),
        ("abc", "is not sizes; give 3"),
        ("4xfoox4", "N='foo' is not an integer"),
    ],
)
def test_bad_shapes_get_clear_errors(shape, message):
    with pytest.raises(WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_workload("matmul", shape)


def test_unknown_operator():
    with pytest.raises(WorkloadError, match="unknown operator 'conv9d'"):
        build_workload("conv9d", "4x4x4")


def test_activation_names_are_case_blind_as_layouts_are():
    """``--activation GELU`` is gelu, as ``--layout nhwc`` is NHWC; a name that is none of them
    still says which there are."""
    assert build_workload("dense", "4x8x4", activation="GELU").epilogue.activation == "gelu"
    assert build_workload("conv2d", "1,2,5,6,2,3,3", layout="nhwc").conv.layout == "NHWC"
    with pytest.raises(WorkloadError, match="activation 'relu6' is not supported; use one of"):
        build_workload("dense", "4x8x4", activation="ReLU6")


def test_flops_of_matmul():
    assert matmul(3, 5, 7).flops == 2 * 3 * 5 * 7


def brute_force_box(w, tensor: str, tiles: dict[str, int]) -> int:
    """Elements of the bounding box of what the tile at the origin touches, point by point."""
    acc = next(a for a in (w.statement.output, *w.statement.inputs) if a.tensor == tensor)
    names = [lp.name for lp in w.loops]
    points = [
        tuple(
            sum(c * dict(zip(names, p))[v] for v, c in idx.terms) + idx.const for idx in acc.indices
        )
        for p in itertools.product(*(range(tiles[n]) for n in names))
    ]
    size = 1
    for d in range(len(acc.indices)):
        size *= max(p[d] for p in points) - min(p[d] for p in points) + 1
    return size


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(["NCHW", "NHWC"]),
    stride=st.integers(1, 3),
    dilation=st.integers(1, 3),
    pad=st.integers(0, 2),
    groups=st.sampled_from([1, 2]),
    toh=st.integers(1, 4),
    tow=st.integers(1, 4),
    tr=st.integers(1, 3),
    ts=st.integers(1, 3),
    tc=st.integers(1, 2),
    tko=st.integers(1, 2),
    tg=st.integers(1, 2),
)
def test_isl_conv_footprints_equal_brute_force_counts(
    layout, stride, dilation, pad, groups, toh, tow, tr, ts, tc, tko, tg
):
    """Overlapping windows: isl's box extents equal the touched box, isl's exact count the touched
    set, and the box is exact whenever nothing leaves gaps (unit stride and dilation, one channel
    group: several groups with part of a group's channels skip the rest)."""
    w = build_workload(
        "conv2d",
        "1,4,12,12,4,3,3",
        stride=stride,
        pad=pad,
        dilation=dilation,
        groups=groups,
        layout=layout,
    )
    info = analyze(w)
    tiles = {
        "n": 1,
        "g": min(tg, groups),
        "oh": toh,
        "ow": tow,
        "ko": tko,
        "r": tr,
        "s": ts,
        "c": tc,
    }
    tiles = {lp.name: min(tiles[lp.name], lp.extent) for lp in w.loops}  # no g loop without groups
    origin = {n: 0 for n in tiles}
    for t in info.tensors:
        touched = brute_force_footprint(w, t.tensor, origin, tiles)
        assert info.footprint_elements(t.tensor, tiles) == brute_force_box(w, t.tensor, tiles)
        assert info.exact_footprint_elements(t.tensor, tiles) == touched
        if stride == dilation == 1 and tiles.get("g", 1) == 1:
            assert info.footprint_elements(t.tensor, tiles) == touched


def test_conv_halo_is_the_padding_actually_read():
    # H=5, pad 1, 3x3, stride 2: rows -1..5 are read, so one row of zeros above and one below;
    # W=6: columns -1..4, nothing beyond the right edge is ever read
    info = analyze(build_workload("conv2d", "1,2,5,6,2,3,3", stride=2, pad=1, layout="NCHW"))
    assert info.tensor("X").halo == ((0, 0), (0, 0), (1, 1), (1, 0))
    assert info.tensor("X").reads_outside and not info.tensor("Wt").reads_outside
    assert not analyze(build_workload("conv2d", "1,2,5,6,2,3,3")).tensor("X").reads_outside
