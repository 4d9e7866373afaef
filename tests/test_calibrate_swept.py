"""``hw calibrate``'s swept-lines probe: which level keeps the lines a sweep meets, read from the
real kernel's A copy against the model's charge either way (its timings are not tested here)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from aotune.errors import HwSpecError
from aotune.hwspecs.probes import (
    SWEPT_PROBE_KC,
    SWEPT_PROBE_L2S,
    swept_lines_kept,
    swept_probe_schedules,
)
from aotune.hwspecs.spec import load_target, spec_from_dict
from aotune.hwspecs.spec_toml import with_value

EMR_TOML = (Path(__file__).parent.parent / "hwspecs" / "emeraldrapids.toml").read_text()


@pytest.mark.parametrize(
    "measured,kept,not_kept,expected",
    [
        (1.44, 0.32, 0.77, False),  # the Emerald Rapids reading: far beyond either, nearer memory
        (0.35, 0.32, 0.77, True),
        (0.49, 0.32, 0.77, True),  # the geometric middle is 0.496
        (0.51, 0.32, 0.77, False),
        (-5.0, 0.32, 0.77, True),  # no slower packed: nothing says memory
        (1.0, 0.5, 0.5, True),  # the model cannot tell them apart
    ],
)
def test_the_nearer_charge_by_ratio_decides(measured, kept, not_kept, expected):
    assert swept_lines_kept(measured, kept, not_kept) is expected


def test_the_probe_kernels_sweep_a_beyond_l2():
    hw = load_target("emeraldrapids")
    packed, in_place = swept_probe_schedules(hw, 3)
    a_bytes = packed.M * packed.K * 4
    assert hw.usable_bytes_per_core(2) < a_bytes <= SWEPT_PROBE_L2S * hw.usable_bytes_per_core(2)
    assert packed.pack_a and not in_place.pack_a and packed.kc == SWEPT_PROBE_KC
    assert packed.a_pack_prefetch_rows == 0  # the copy waits as an unprefetched one does
    assert packed.order == "nkm" and packed.nc == packed.nr and packed.N // packed.nc == 8


def test_no_probe_kernels_where_the_level_cannot_hold_that_a():
    hw = with_value(load_target("emeraldrapids"), "caches.L3.size_kib", 4096)
    assert swept_probe_schedules(hw, 3) is None


def test_the_field_loads_defaults_to_kept_and_is_refused_on_l2():
    hw = spec_from_dict(tomllib.loads(EMR_TOML), "emr")
    assert not hw.keeps_swept_lines(3) and hw.keeps_swept_lines(2)
    # an older file without the field keeps every level's lines
    old = spec_from_dict(tomllib.loads(EMR_TOML.replace("keeps_swept_lines = false\n", "")), "o")
    assert old.keeps_swept_lines(3)
    bad = EMR_TOML.replace("replacement = ", "keeps_swept_lines = false\nreplacement = ", 1)
    with pytest.raises(HwSpecError, match="caches.L2.keeps_swept_lines = false"):
        spec_from_dict(tomllib.loads(bad), "bad")
