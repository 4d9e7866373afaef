"""The GPU model's features: the instruction mix is read per k tile as the loops run (SASS and
PTX agree, and count what the schedule implies), and one nvdisasm run reads many kernels."""

from __future__ import annotations

import pytest
from aotune.analysis.gpu_features import Op, gpu_features, gpu_features_many, mix_of, ptx_ops
from aotune.codegen.cuda_tools import disassemble, disassemble_many
from aotune.constraints.gpu import build_gpu_space
from aotune.constraints.xgemm import xgemm_workload
from aotune.hwspecs.spec import load_target
from aotune.targets import target_for
from hypothesis import given, settings
from hypothesis import strategies as st

CONFIGS = [  # aotune configs of Xgemm's space: staged A and B, direct B, direct both
    dict(bm=64, bn=64, bk=32, tx=8, ty=16, vm=4, vn=4, strm=0, strn=0, sa=1, sb=1, la=16, lb=16,
         va=4, vb=4, unroll=2, pad_a=0, pad_b=0),
    dict(bm=128, bn=128, bk=32, tx=8, ty=16, vm=4, vn=8, strm=0, strn=0, sa=1, sb=0, la=32, lb=1,
         va=4, vb=1, unroll=2, pad_a=0, pad_b=0),
    dict(bm=32, bn=64, bk=8, tx=8, ty=8, vm=1, vn=2, strm=1, strn=0, sa=0, sb=0, la=1, lb=1,
         va=1, vb=1, unroll=8, pad_a=0, pad_b=0),
]  # fmt: skip


@pytest.fixture(scope="module")
def kernels():
    hw = load_target("rtx-2080-ti")
    space = build_gpu_space(xgemm_workload(512, 512, 512), hw)
    target = target_for(hw)
    return [target.compile(target.schedule(space, space.config(c))) for c in CONFIGS]


def test_one_nvdisasm_run_reads_many_kernels_as_one_run_each(kernels):
    many = disassemble_many([k.cubin for k in kernels], "aotune_kernel", 75)
    assert [d.instructions for d in many] == [
        disassemble(k.cubin, "aotune_kernel").instructions for k in kernels
    ]
    assert gpu_features_many(kernels) == [gpu_features(k) for k in kernels]


def test_the_mix_counts_what_the_schedule_loads_per_k_tile(kernels):
    for k in kernels:
        s, mix = k.schedule, gpu_features(k).mix
        assert mix.source == "sass"
        ffma = s.mwi * s.nwi * s.bk
        # shared-memory loads: one per vector run of each staged operand per k step
        lds = s.bk * ((s.mwi // s.vm if s.sa else 0) + (s.nwi // s.vn if s.sb else 0))
        assert mix.lds_per_ffma * ffma == pytest.approx(lds, rel=0.02)
        # stores to shared memory: the thread's share of the staged tiles, once per tile
        staged = (s.sa * s.bm * s.bk // s.va + s.sb * s.bn * s.bk // s.vb) / s.threads
        assert mix.sts_per_ffma * ffma == pytest.approx(staged, rel=0.02)
        assert mix.bar_per_ffma * ffma == pytest.approx(2 if (s.sa or s.sb) else 0, abs=0.05)
        # what runs once per kernel (zeroing, storing C) is a k_tiles-th per tile: small here
        assert mix.other_per_ffma < 0.5


def test_ptx_and_sass_read_the_same_memory_instructions_per_tile(kernels):
    for k in kernels:
        s = k.schedule
        sass = gpu_features(k).mix
        ptx = mix_of(ptx_ops(k.ptx), s.mwi * s.nwi * s.bk, s.k_tiles, "ptx")
        for field in ("lds_bytes_per_ffma", "sts_bytes_per_ffma", "bar_per_ffma"):
            assert getattr(ptx, field) == pytest.approx(getattr(sass, field), rel=0.05), field


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 8),  # prologue
    st.integers(1, 6),  # tile-loop instructions outside the k loop
    st.integers(1, 16),  # FFMAs per k-loop iteration
    st.integers(1, 8),  # k-loop trips per tile
    st.integers(1, 64),  # k tiles
)
def test_loop_weights_count_each_instruction_as_often_as_it_runs(pro, outer, f_in, trips, tiles):
    """prologue; tile loop { staging ...; k loop { LDS; f_in x FFMA; branch back }; branch back };
    epilogue: per tile, the k loop runs ``trips`` times, the staging once, the rest 1/tiles."""
    ops = [Op("OTHER")] * pro
    tile_start = len(ops)
    ops += [Op("STS", 16)] * outer
    k_start = len(ops)
    ops += [Op("LDS", 16)] + [Op("FFMA")] * f_in + [Op("OTHER", 0, k_start)]
    ops += [Op("OTHER", 0, tile_start)] + [Op("OTHER")] * 3 + [Op("OTHER", 0, len(ops) + 4)]
    mix = mix_of(ops, f_in * trips, tiles, "sass")
    ffma = f_in * trips
    assert mix.lds_per_ffma * ffma == pytest.approx(trips)
    assert mix.sts_per_ffma * ffma == pytest.approx(outer)
    assert mix.sts_bytes_per_ffma * ffma == pytest.approx(16 * outer)
    # the k loop's branch each trip, the tile loop's once, prologue and epilogue once per kernel
    assert mix.other_per_ffma * ffma == pytest.approx(trips + 1 + (pro + 3) / tiles)
