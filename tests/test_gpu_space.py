"""The GPU space: valid by construction, every measured Xgemm config maps into it, limits named."""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import random
from pathlib import Path

import pytest
from aotune.analysis.workload import conv2d, depthwise_conv2d, matmul
from aotune.constraints.gpu import build_gpu_space
from aotune.constraints.space import Space
from aotune.constraints.xgemm import xgemm_to_config, xgemm_workload
from aotune.errors import ConfigError, UnsatisfiableError
from aotune.hwspecs.spec import builtin_names, load_target
from hypothesis import given, settings
from hypothesis import strategies as st

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "kernel-tuner"
FILES = {"gemm_RTX_2080_Ti.json.gz": "rtx-2080-ti", "gemm_RTX_Titan.json.gz": "titan-rtx"}


# every configuration of the two measured files (identical sets), kept in the repository so the
# mapping is tested where the files are not beside the checkout (the data README's licence)
CONFIGS_FIXTURE = Path(__file__).resolve().parent / "data" / "xgemm_measured_configs.txt.gz"


def measured_configs() -> list[dict[str, int]]:
    """The fixture's configurations as parameter dicts."""
    lines = gzip.open(CONFIGS_FIXTURE, "rt").read().splitlines()
    names = lines[[i for i, ln in enumerate(lines) if ln.startswith("#")][-1]][2:].split(",")
    return [dict(zip(names, map(int, ln.split(",")))) for ln in lines if not ln.startswith("#")]


@pytest.mark.parametrize("target", sorted(FILES.values()))
def test_every_measured_xgemm_config_maps_to_one_valid_config(target):
    configs = measured_configs()
    assert len(configs) == 17956
    space = build_gpu_space(xgemm_workload(4096, 4096, 4096), load_target(target))
    mapped: dict = {}
    for params in configs:
        cfg = xgemm_to_config(params, space)
        assert space.violations(cfg) == [], (params, space.violations(cfg))
        mapped.setdefault(cfg, []).append(params)
    # configs that differ only in a staging layout of an operand they do not stage are one kernel
    for cfg, same in mapped.items():
        if len(same) > 1:
            assert not (cfg["sa"] and cfg["sb"])
            assert {k for k in same[0] if same[0][k] != same[1][k]} <= {"MDIMA", "NDIMB"}
    assert len(mapped) == 9180  # the distinct kernels the README's accuracy table scores


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_fixture_holds_every_config_of_the_measured_files(name):
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} is not beside this checkout")
    doc = json.loads(gzip.open(path).read())
    keys = doc["tune_params_keys"]
    assert sorted(tuple(e[k] for k in keys) for e in doc["cache"].values()) == sorted(
        tuple(c[k] for k in keys) for c in measured_configs()
    )


def test_xgemm_mapping_by_hand():
    space = build_gpu_space(xgemm_workload(4096, 4096, 4096), load_target("rtx-2080-ti"))
    # the fastest measured config on the RTX 2080 Ti
    best = dict(MWG=128, NWG=128, KWG=32, MDIMC=16, NDIMC=8, MDIMA=16, NDIMB=32, KWI=2,
                VWM=8, VWN=4, STRM=0, STRN=0, SA=0, SB=1, PRECISION=32)  # fmt: skip
    cfg = xgemm_to_config(best, space).as_dict()
    assert cfg == dict(bm=128, bn=128, bk=32, tx=8, ty=16, vm=4, vn=8, strm=0, strn=0, sa=1,
                       sb=0, la=32, lb=1, va=4, vb=1, unroll=2, pad_a=0, pad_b=0,
                       ahead=1)  # fmt: skip
    # Xgemm's M is aotune's column axis: C (and Xgemm's A) are contiguous along it
    assert space.view.c_major == "n" and space.view.b_major == "n" and space.view.a_major == "m"
    with pytest.raises(ConfigError, match="GEMMK=1"):
        xgemm_to_config({**best, "GEMMK": 1}, space)
    with pytest.raises(ConfigError, match="lacks MWG"):
        xgemm_to_config({k: v for k, v in best.items() if k != "MWG"}, space)


@settings(max_examples=8, deadline=None)
@given(
    target=st.sampled_from(builtin_names("gpu")),
    shape=st.tuples(st.integers(1, 300), st.integers(1, 300), st.integers(1, 300)),
    seed=st.integers(0, 1000),
)
def test_sampled_configs_satisfy_every_constraint(target, shape, seed):
    space = build_gpu_space(matmul(*shape), load_target(target))
    for cfg in space.sample(3, seed=seed):
        assert space.violations(cfg) == []
        c = cfg.as_dict()
        assert c["tx"] * c["ty"] % 32 == 0
        if not c["sa"]:
            assert (c["la"], c["va"], c["pad_a"]) == (1, 1, 0)


def sub_box(space: Space, seed: int, limit: int) -> Space:
    """The space restricted to a box of at most ``limit`` configs around a sampled valid one:
    each decision keeps that config's value and up to two other values of its domain, its
    largest one half the time (large tiles are where products and limits bind)."""
    rng = random.Random(seed)
    (start,) = space.sample(1, seed=seed)
    domains = {v.name: {start[v.name]} for v in space.variables}
    size = 1
    for v in rng.sample(space.variables, len(space.variables)):
        others = [x for x in v.domain if x != start[v.name]]
        extra = rng.sample(others, min(len(others), rng.choice([1, 2])))
        if others and rng.random() < 0.5:
            extra[0] = max(others)
        if extra and size * (1 + len(extra)) <= limit:
            domains[v.name] |= set(extra)
            size *= 1 + len(extra)
    narrowed = tuple(
        dataclasses.replace(v, domain=tuple(sorted(domains[v.name]))) for v in space.variables
    )
    return dataclasses.replace(space, variables=narrowed)


@settings(max_examples=12, deadline=None)
@given(
    target=st.sampled_from(builtin_names("gpu")),
    workload=st.sampled_from(
        [
            matmul(13, 7, 33),
            matmul(64, 1, 5),
            matmul(1000, 1024, 4096),
            xgemm_workload(4096, 4096, 4096),
            conv2d(1, 4, 7, 6, 6, 3, 2, pad=1, layout="NHWC"),
            conv2d(2, 4, 5, 5, 4, 3, 3, stride=2, groups=2),
            depthwise_conv2d(1, 8, 7, 7, 3, 3, pad=1),
            depthwise_conv2d(1, 8, 7, 7, 3, 3, pad=1, layout="NHWC"),
        ]
    ),
    seed=st.integers(0, 10_000),
)
def test_cpsat_solutions_equal_brute_force_enumeration_on_a_box_of_the_space(
    target, workload, seed
):
    """The whole GPU space is too large to enumerate (14,080 configs for a 1x1x1 matmul, 11 s);
    a box of a few thousand configs around a valid one keeps every constraint, guard and product
    of it: CP-SAT's solutions in the box are exactly the box's configs that satisfy every
    constraint, checked one by one."""
    box = sub_box(build_gpu_space(workload, load_target(target)), seed, limit=8000)
    expected = set()
    for values in itertools.product(*(v.domain for v in box.variables)):
        cfg = dict(zip(box.names, values))
        if all(c.holds(cfg) for c in box.constraints):
            expected.add(tuple(cfg.items()))
    assert expected  # the sampled config is in the box
    assert {cfg.items for cfg in box.enumerate()} == expected


def test_shared_memory_over_the_limit_names_required_and_available():
    hw = load_target("t4")
    space = build_gpu_space(matmul(4096, 4096, 4096), hw)
    cfg = space.solve({"bm": [256], "bn": [256], "bk": [64], "sa": [1], "sb": [0]})
    big = cfg.replaced({"sb": 1, "lb": cfg["la"] if cfg["la"] <= 64 else 64, "vb": 1})
    bad = [v for v in space.violations(big) if v.constraint == "shared memory/block"]
    assert bad and bad[0].required == 4 * 64 * 512 and bad[0].available == 65536
    assert "opt-in" in bad[0].text


def test_conv_and_depthwise_spaces_build_for_every_layout():
    hw = load_target("a100")
    for layout in ("NCHW", "NHWC"):
        s = build_gpu_space(conv2d(2, 16, 9, 9, 8, 3, 3, pad=1, stride=2, layout=layout), hw)
        assert s.violations(s.solve()) == []
        d = build_gpu_space(depthwise_conv2d(1, 8, 7, 7, 3, 3, pad=1, layout=layout), hw)
        assert d.violations(d.solve()) == []


def test_reading_ahead_is_a_decision_only_where_the_k_loop_reads_global_memory():
    hw = load_target("t4")
    space = build_gpu_space(matmul(64, 64, 64), hw)
    assert {space.solve({"sa": [0], "ahead": [a]})["ahead"] for a in (0, 1)} == {0, 1}
    staged = space.solve({"sa": [1], "sb": [1]})
    assert staged["ahead"] == 0
    (bad,) = [v for v in space.violations(staged.replaced({"ahead": 1})) if "ahead" in v.constraint]
    assert bad.hint == "set ahead=0" and "sa=1 and sb=1" in bad.text
    # NHWC depthwise reads A per output, never ahead: with B staged there is nothing to read ahead
    d = build_gpu_space(depthwise_conv2d(1, 8, 7, 7, 3, 3, pad=1, layout="NHWC"), hw)
    assert d.solve({"sb": [0], "ahead": [1]})["ahead"] == 1
    with pytest.raises(UnsatisfiableError):
        d.solve({"sb": [1], "ahead": [1]})


def test_a_config_written_before_a_decision_existed_takes_its_default():
    """Records, databases and libraries hold configs from before ``ahead``: they parse, as the
    kernels they were made as (ahead = 0); a config missing any other decision is refused."""
    space = build_gpu_space(matmul(64, 64, 64), load_target("h100"))
    text = space.describe_config(space.solve({"sa": [0], "ahead": [1]}))
    assert text.endswith(",ahead=1")
    old = text.removesuffix(",ahead=1")
    assert space.parse_config(old)["ahead"] == 0
    with pytest.raises(ConfigError, match="missing unroll"):
        space.parse_config(",".join(p for p in old.split(",") if not p.startswith("unroll")))
