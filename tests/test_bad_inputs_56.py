"""Bad inputs found by the probe of stop 56: output that cannot be written, the options of the
default command given alone, and flags that belong to another form of a command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from aotune.cli import main
from aotune.errors import AotuneError
from aotune.files import check_writable

AOTUNE = [sys.executable, "-m", "aotune"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_output_to_a_full_disk_is_the_users_error_not_a_bug():
    """It was 'internal error ... this is a bug in aotune' with exit 70."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [*AOTUNE, "hw", "show", "znver4", "--json"], stdout=full, stderr=subprocess.PIPE
        )
    assert done.returncode == 2
    said = done.stderr.decode()
    assert "cannot write the output: No space left on device" in said
    assert "bug" not in said and "Traceback" not in said


def test_closed_standard_streams_give_the_error_code():
    """stdout closed: exit 0 with nothing printed; stderr closed: exit 1 for an error of exit 2."""
    cmd = " ".join(AOTUNE)
    done = subprocess.run(["bash", "-c", f"{cmd} hw list >&-"], capture_output=True, text=True)
    assert done.returncode == 2 and "standard output is closed" in done.stderr
    done = subprocess.run(["bash", "-c", f"{cmd} hw show nonexistent 2>&-"], capture_output=True)
    assert done.returncode == 2


def test_a_folder_no_one_can_create_files_in_is_refused_before_any_work():
    """os.access says yes to root for /proc: the search ran, then the write failed."""
    with pytest.raises(AotuneError, match="cannot write /proc/aotune-x"):
        check_writable("/proc/aotune-x", False, AotuneError)


def test_the_default_commands_options_alone_run_it(capsys):
    """``aotune --shape ...`` was 'invalid choice' for the spec name that followed."""
    argv = ["--shape", "16x16x16", "--target", "znver4", "--no-db", "--no-verify", "--budget", "8"]
    assert main(argv) == 0
    assert "matmul 16x16x16" in capsys.readouterr().out


def test_a_flag_of_the_measured_form_names_itself(capsys):
    assert main(["accuracy", "matmul", "--shape", "8x8x8", "--plot", "p.png"]) == 2
    said = capsys.readouterr().err
    assert "--plot applies to --measured FILE only" in said and "--candidates" not in said
