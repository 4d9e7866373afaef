"""Stop 111: an element-wise packing copy whose source lies beyond L2, on a CPU whose last level
does not keep swept lines (``caches.L3.keeps_swept_lines = false``, Emerald Rapids, measured by
``hw calibrate``'s swept-lines probe), takes the lines L2 does not keep at memory's parallel pace,
not at the last level's latency per row; A's copy prefetches its rows there; a level that keeps
them keeps the latency rule."""

from __future__ import annotations

import dataclasses

import pytest
from aotune.analysis import model as M
from aotune.analysis.model import ThreadShare
from aotune.analysis.workload import matmul
from aotune.codegen.schedule import CpuSchedule, schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.spec import HwSpec, load_target
from aotune.hwspecs.spec_toml import with_value

HW = load_target("emeraldrapids")
# the same core with a last level that keeps swept lines
FAST_L3 = with_value(HW, "caches.L3.keeps_swept_lines", True)


def _sched(hw: HwSpec, m: int, kc: int = 96) -> CpuSchedule:
    """A packed A repacked for each of 8 column blocks, one thread: its whole A swept each time."""
    space = build_cpu_space(matmul(m, 512, 2048), hw)
    cfg = (
        f"mr=8,nr=32,kc={kc},mc={min(m, 256)},nc=64,order=nkm,pack_a=1,pack_b=1,unroll=8,"
        "par=m,threads=1"
    )
    return schedule_from_config(space, space.parse_config(cfg))


def _a_pack_cycles_per_elem(hw: HwSpec, s: CpuSchedule) -> float:
    """Cycles per element of A's copy in ``s``, as ``packing_cycles`` prices it."""
    share = ThreadShare.of(s)
    per_elem = max(1 / hw.core.store_ports, M.PACK_INSTRUCTIONS_PER_ELEMENT / hw.core.issue_width)
    packs = -(-share.n_share // s.nc)
    a_bytes = s.M * s.K * 4
    rows = M._pack_rows_in_flight(hw, min(s.mc, share.m_share), s.a_sm * 4)
    return M._strided_pack_cycles_per_elem(
        hw, per_elem, s.kc, a_bytes, packs, a_bytes, 1, rows_in_flight=rows
    )


def test_which_levels_keep_swept_lines():
    assert not HW.keeps_swept_lines(3)
    assert HW.keeps_swept_lines(2) and FAST_L3.keeps_swept_lines(3)
    assert HW.swept_bytes_held() == HW.usable_bytes_per_core(2)
    assert FAST_L3.swept_bytes_held() == HW.usable_bytes_per_core(3)
    for name in ("znver2", "znver4", "znver5", "skylake-avx512"):
        assert load_target(name).keeps_swept_lines(3), name


@pytest.mark.parametrize("kc", [32, 96, 128])
def test_a_copy_from_beyond_l2_waits_at_least_memorys_parallel_pace(kc: int):
    s = _sched(HW, 2048, kc)  # A of 16 MiB against 1.2 MiB of L2
    pace = M._memory_parallel_cycles_per_elem(HW)
    assert pace == pytest.approx(4 * 292 / (12.4 * 64))
    lost = 1 - M._usable_bytes(HW, 2) / (2048 * 2048 * 4)
    from_memory = lost * pace + (1 - lost) * HW.cache(2).latency_cycles / kc
    per_row = HW.cache(3).latency_cycles / kc  # a wait for the last level a row, as before
    assert _a_pack_cycles_per_elem(HW, s) == pytest.approx(max(from_memory, per_row), rel=1e-6)
    # long rows: memory's pace is the slower (Emerald Rapids: 1.8-2.0 at 3.94 GHz, kc 64-128)
    if kc >= 96:
        assert _a_pack_cycles_per_elem(HW, s) == pytest.approx(from_memory, rel=1e-6)
    # with a last level that keeps swept lines, the row waits for that level's latency only
    assert _a_pack_cycles_per_elem(FAST_L3, s) == pytest.approx(max(2 / 3, per_row), rel=1e-6)


def test_the_copy_slows_as_its_source_outgrows_l2():
    paces = [_a_pack_cycles_per_elem(HW, _sched(HW, m)) for m in (64, 256, 512, 1024, 2048)]
    assert paces == sorted(paces)
    assert paces[0] == pytest.approx(2 / 3)  # 512 KiB: in L2, the copy's own issue
    assert paces[-1] > 1.3


def _copied_per_elem(s: CpuSchedule) -> float:
    share = ThreadShare.of(s)
    in_place = dataclasses.replace(s, pack_a=False)
    copied = M.packing_cycles(s, HW, share) - M.packing_cycles(in_place, HW, share)
    return copied / (-(-s.N // s.nc) * s.M * s.K)


def test_packing_cycles_charge_a_at_that_pace_unless_its_copy_prefetches():
    prefetching = _sched(HW, 2048)
    waiting = dataclasses.replace(prefetching, a_pack_prefetch_rows=0)
    # within 1%: B's pack counts the pages of A's rows between its packs too
    assert _copied_per_elem(waiting) == pytest.approx(
        _a_pack_cycles_per_elem(HW, waiting), rel=0.01
    )
    # the prefetching copy waits for no line: its own issue (Emerald Rapids: 0.8 at 3.94 GHz)
    assert _copied_per_elem(prefetching) == pytest.approx(2 / 3, rel=0.01)


def test_a_copy_prefetches_its_rows_where_they_come_from_memory():
    # 16 MiB of A: beyond what L2 holds, so from memory here, and from L3 where L3 keeps it
    assert _sched(HW, 2048).a_pack_prefetch_rows > 0
    assert _sched(FAST_L3, 2048).a_pack_prefetch_rows == 0
    assert _sched(HW, 64).a_pack_prefetch_rows == 0  # 512 KiB: in L2


def test_a_source_beyond_every_level_takes_memorys_pace_too():
    per_elem = 2 / 3
    huge = 1 << 30  # 1 GiB: no level holds it
    pace = M._strided_pack_cycles_per_elem(HW, per_elem, 96, huge, 8, huge, 1)
    near = M._strided_pack_cycles_per_elem(HW, per_elem, 96, 64 << 20, 8, huge, 1)
    assert pace >= near > 1.3
    # where the last level keeps swept lines, a source beyond it keeps the latency rule
    assert M._strided_pack_cycles_per_elem(FAST_L3, per_elem, 96, huge, 8, huge, 1) < 1.0
