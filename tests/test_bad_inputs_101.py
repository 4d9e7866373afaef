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


@pytest.mark.parametrize("config", ["mr=6;nr=16;kc=16", "mr=6 nr=16 kc=16"])
def test_a_config_split_by_another_separator_says_to_use_commas(capsys, config):
    """It was "config value mr='6;nr=16;...' is not valid; use an integer in digits 0-9"."""
    argv = ["validate", "matmul", "--shape", "32x48x16", "--target", "znver4", "--config"]
    assert main([*argv, config]) == 2
    assert "holds more than one decision; separate them with ','" in capsys.readouterr().err


def test_a_missing_decision_marks_those_with_a_default_optional(capsys):
    """A GPU config may leave out ahead (0), which the message had listed as required."""
    config = "bm=8,bn=16,bk=16,tx=8,ty=4,vm=1,vn=4,strm=0,strn=0,sa=1,sb=1,la=8,lb=8,va=1,vb=2"
    argv = ["predict", "matmul", "--shape", "64x64x64", "--target", "a100", "--config"]
    assert main([*argv, config + ",unroll=8,pad_a=2"]) == 2
    err = capsys.readouterr().err
    assert "missing pad_b; give every decision:" in err and "pad_b, ahead (optional, 0)" in err


def test_two_emits_of_one_file_are_named(tmp_path, capsys):
    """It was 'two --emit-* options name the same file', naming neither."""
    out = str(tmp_path / "k.s")
    argv = ["tune", "matmul", "--shape", "16x16x16", "--target", "znver4", "--no-db"]
    assert main([*argv, "--no-verify", "--emit-asm", out, "--emit-ir", out]) == 2
    assert f"--emit-asm {out} and --emit-ir {out} name the same file" in capsys.readouterr().err


def test_the_json_names_the_files_emit_wrote(tmp_path, capsys):
    """Text output said 'asm of rank 1 written to ...'; the JSON said nothing of it."""
    import json

    out = str(tmp_path / "k.s")
    argv = ["tune", "matmul", "--shape", "16x16x16", "--target", "znver4", "--no-db", "--json"]
    assert main([*argv, "--no-verify", "--budget", "16", "--top-k", "1", "--emit-asm", out]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["emitted"] == {"asm": out}
    assert Path(out).read_text().strip()
    assert main([*argv, "--no-verify", "--budget", "16", "--top-k", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["emitted"] == {}


def test_a_current_folder_that_was_removed_is_named(tmp_path):
    """It was 'internal error (FileNotFoundError ...)', exit 70, for a relative output path."""
    script = (
        f"mkdir gone && cd gone && rmdir ../gone && {' '.join(AOTUNE)} tune matmul --shape "
        "8x8x8 --no-db --no-verify --budget 16 --emit-asm k.s"
    )
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 2 and "the current folder no longer exists" in done.stderr


def test_no_usable_temporary_folder_is_the_users_to_fix(capsys, monkeypatch):
    """It was 'internal error' (exit 70) after the search, where the kernel was loaded."""
    import tempfile

    def nowhere() -> str:
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", nowhere)
    assert main(["tune", "matmul", "--shape", "8x8x8", "--no-db", "--budget", "16"]) == 2
    assert "no temporary folder takes new files" in capsys.readouterr().err


@pytest.mark.parametrize("home", ["", "relhome"])
def test_a_home_that_is_no_absolute_folder_gives_no_default_database(
    tmp_path, capsys, monkeypatch, home
):
    """HOME='' put the database at /.cache, and a relative HOME below the current folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert main(["tune", "matmul", "--shape", "8x8x8", "--no-verify", "--budget", "16"]) == 2
    assert f"HOME is {home!r}, not an absolute folder" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_database_path_longer_than_sqlite_opens_says_so(tmp_path, capsys):
    folder = tmp_path
    for c in "abc":
        folder = folder / (c * 200)
    folder.mkdir(parents=True)
    argv = ["tune", "matmul", "--shape", "8x8x8", "--no-verify", "--budget", "16"]
    assert main([*argv, "--db", str(folder / "t.db")]) == 2
    assert "more than the 512 SQLite opens" in capsys.readouterr().err


def test_the_quick_bench_of_the_unseen_group_is_refused(capsys):
    """It printed nothing and exited 0: the quick suite has no unseen rows."""
    assert main(["bench", "--quick", "--only", "unseen"]) == 2
    assert "the quick suite has no unseen rows" in capsys.readouterr().err


def test_without_ar_the_note_says_only_the_archive_is_missing():
    from aotune.artifact.link import Linker

    note = Linker("cc", None, True).note("x86_64")
    assert note and "wrote the shared object" in note and "binutils" in note


def test_paths_a_terminal_would_act_on_are_shown_not_sent(tmp_path, capsys):
    assert main(["hw", "show", str(tmp_path / "nope\u202e\x1b[31m.toml")]) == 2
    err = capsys.readouterr().err
    assert "\\u202e" in err and "\\x1b" in err and "\u202e" not in err and "\x1b" not in err
    folder = tmp_path / "e\x1b[31m"
    folder.mkdir()
    db = str(folder / "t.db")
    argv = ["tune", "matmul", "--shape", "8x8x8", "--no-verify", "--budget", "16", "--db", db]
    assert main(argv) == 0
    assert "\x1b" not in capsys.readouterr().out
    assert main(argv) == 0  # reused: 'search: reused record 1 of PATH'
    capsys.readouterr()
    assert main(["db", "list", "--db", db]) == 0
    assert "\x1b" not in capsys.readouterr().out
