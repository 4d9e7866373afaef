"""Bad input a probe found at stop 101: each test failed before its fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aotune.cli import main

AOTUNE = [sys.executable, "-m", "aotune"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
@pytest.mark.parametrize("args", [["--help"], ["tune", "--help"], ["--version"]])
def test_help_to_a_full_disk_is_an_error_not_a_success(args):
    """argparse dropped the failed write and exited 0."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([*AOTUNE, *args], stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 2 and "No space left on device" in done.stderr


@pytest.mark.parametrize("op", ["einsum", "matmul"])
def test_an_einsum_spec_after_the_options_says_where_it_goes(capsys, op):
    """It was 'unrecognized arguments: ij,jk->ik'."""
    with pytest.raises(SystemExit) as done:
        main(["space", op, "--dims", "i=4,j=4,k=4", "ij,jk->ik"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "'ij,jk->ik' looks like an einsum spec, which goes right after the operator" in err
