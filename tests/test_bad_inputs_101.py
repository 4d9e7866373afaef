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


def test_an_output_in_a_folder_that_takes_no_files_says_so():
    """It was 'cannot write /proc/version: No such file or directory'."""
    from aotune.errors import ConfigError
    from aotune.files import write_new_file

    if not Path("/proc/version").is_file():
        pytest.skip("needs Linux's /proc")
    with pytest.raises(ConfigError, match="its folder /proc takes no new files"):
        write_new_file("/proc/version", "x", True, ConfigError)


def test_a_build_with_nothing_measured_does_not_say_measured(tmp_path, capsys):
    """A GPU build's table said 'measured on this host' with nothing measured."""
    listing = tmp_path / "k.toml"
    listing.write_text('[[kernel]]\nname = "mm"\nop = "matmul"\nshape = "16x16x16"\n')
    argv = ["build", str(listing), "-o", str(tmp_path / "lib"), "--db", str(tmp_path / "t.db")]
    assert main([*argv, "--no-verify", "--budget", "16", "--top-k", "1", "--target", "t4"]) == 0
    out = capsys.readouterr().out
    assert "none measured here" in out and "measured on this host" not in out
