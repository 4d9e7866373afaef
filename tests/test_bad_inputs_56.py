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
    assert "cannot write the output, or a file aotune writes on the way: No space left" in said
    assert "bug" not in said and "Traceback" not in said


def test_closed_standard_streams_give_the_error_code():
    """stdout closed gave exit 0 with nothing printed, stderr closed exit 1 for an error of exit
    2: both are exit 2 now."""
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


def test_a_disk_error_away_from_stdout_leaves_stdout_alone(monkeypatch, capsys):
    """Only a failed stdout is sent to /dev/null (a caller's stdout stays usable after main)."""
    import errno

    import aotune.cli as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/staging/k.o")

    monkeypatch.setitem(cli.COMMANDS, "hw", full)
    assert main(["hw", "list"]) == 2
    said = capsys.readouterr().err
    assert "cannot write /tmp/staging/k.o: No space left on device" in said
    assert "bug" not in said
    print("still here")
    assert "still here" in capsys.readouterr().out


def test_a_cpu_name_that_implies_apx_gets_code_capstone_reads(tmp_path):
    """diamondrapids turns APX on inside LLVM: every kernel then read as 'no FMA instruction
    found'. The features handed to LLVM switch it off."""
    from aotune.analysis.features import kernel_features
    from aotune.analysis.workload import matmul
    from aotune.codegen.compile import compile_kernel
    from aotune.codegen.schedule import schedule_from_config
    from aotune.constraints.cpu import build_cpu_space
    from aotune.hwspecs.spec import SPEC_DIR, load_spec_file

    text = (SPEC_DIR / "znver4.toml").read_text()
    path = tmp_path / "dmr.toml"
    path.write_text(text.replace('llvm_cpu = "znver4"', 'llvm_cpu = "diamondrapids"'))
    hw = load_spec_file(path)
    space = build_cpu_space(matmul(64, 64, 64), hw)
    (cfg,) = space.sample(1, seed=5)
    kernel = compile_kernel(schedule_from_config(space, cfg), hw)
    assert kernel_features(kernel, hw.isa.arch).loop.fma > 0
