"""Bad input found at stop 107: ``db import`` took a candidate's GFLOP/s that disagreed with its
own measured time (or came without one), so the record carried two answers to how fast a kernel
ran; and a library built with ``--prefix NAME`` said "unknown aotune error code" from
``NAME_strerror``."""

from __future__ import annotations

import json

import pytest
from aotune.cli import main


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """One record of a 32^3 matmul on haswell (flops 2 * 32^3 = 65536), as ``db export`` writes
    it."""
    tmp = tmp_path_factory.mktemp("db")
    db = tmp / "t.db"
    argv = ["tune", "matmul", "--shape", "32x32x32", "--target", "haswell", "--no-verify"]
    assert main([*argv, "--db", str(db)]) == 0
    out = tmp / "x.jsonl"
    assert main(["db", "export", str(out), "--db", str(db)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "seconds,gflops,said",
    [
        (1e-5, 6.5536, None),  # 65536 flops in 10 us: as the final check writes it
        (1e-5, 65.536, "gflops 65.536 disagrees with measured_seconds 1e-05, which gives 6.5536"),
        (None, 6.5536, "gflops 6.5536 without a measured_seconds"),
        (None, None, None),
    ],
)
def test_an_imported_gflops_must_be_the_flops_over_the_measured_time(
    exported, tmp_path, capsys, seconds, gflops, said
):
    record = json.loads(json.dumps(exported))
    best = next(c for c in record["candidates"] if c["rank"] == 1)
    best["measured_seconds"], best["gflops"] = seconds, gflops
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(record) + "\n")
    capsys.readouterr()
    rc = main(["db", "import", str(path), "--db", str(tmp_path / "other.db")])
    err = capsys.readouterr().err
    if said is None:
        assert rc == 0, err
    else:
        assert rc == 2
        assert said in err and "candidate rank 1" in err and "nothing was imported" in err
        assert "Traceback" not in err


def test_a_prefixed_librarys_strerror_names_that_library():
    """The runtime's text for a code it does not know names the library's prefix (the IR a
    build compiles; tests/test_library_prefix.py calls two such libraries)."""
    from aotune.artifact.names import Names
    from aotune.artifact.runtime import UNKNOWN_ERROR, runtime_ir

    ir_text = runtime_ir("x86_64-unknown-linux-gnu", Names("vision"))
    assert "unknown vision error code" in ir_text and "aotune error" not in ir_text
    assert UNKNOWN_ERROR == "unknown aotune error code"  # the default prefix's, as before
