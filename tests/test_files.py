"""files.py: what aotune writes never replaces a device, writes through a link, keeps modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from aotune.errors import ConfigError
from aotune.files import check_writable, read_user_file, write_new_file


def test_force_never_replaces_a_device_or_a_pipe(tmp_path: Path):
    fifo = tmp_path / "pipe.s"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        write_new_file(fifo, "x", True, ConfigError)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    link = tmp_path / "null.s"
    link.symlink_to("/dev/null")
    with pytest.raises(ConfigError, match="not a regular file"):
        write_new_file(link, "x", True, ConfigError)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and link.is_symlink()


def test_an_open_stream_is_refused_not_the_file_it_is_redirected_to(tmp_path: Path):
    kept = tmp_path / "all.jsonl"
    kept.write_text("PREVIOUS\n")
    fd = os.open(kept, os.O_WRONLY | os.O_APPEND)  # as `>> all.jsonl` opens it
    try:
        link = tmp_path / "out.jsonl"
        link.symlink_to(f"/dev/fd/{fd}")
        for path in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}", link, "/dev/stdout"):
            with pytest.raises(ConfigError, match="names an open stream"):
                write_new_file(path, "new\n", True, ConfigError)
    finally:
        os.close(fd)
    assert kept.read_text() == "PREVIOUS\n" and link.is_symlink()


def test_a_name_ending_in_a_slash_is_a_folder_not_the_file_before_it(tmp_path: Path):
    with pytest.raises(ConfigError, match="ends in '/'"):
        write_new_file(f"{tmp_path}/x.s/", "x", True, ConfigError)
    assert not (tmp_path / "x.s").exists()


def test_a_link_is_written_through_and_kept(tmp_path: Path):
    target = tmp_path / "real.s"
    target.write_text("old")
    link = tmp_path / "link.s"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="exists; pass --force"):
        write_new_file(link, "new", False, ConfigError)
    write_new_file(link, "new", True, ConfigError)
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.s", "real.s"]  # no temp left


def test_the_early_check_follows_a_link_to_its_target(tmp_path: Path):
    """``check_writable``, run before the long work, refuses a link whose target lies in a
    missing folder, or links that loop, as the write after it would; a dangling link into an
    existing folder passes, and the write makes its target."""
    dangling = tmp_path / "d.s"
    dangling.symlink_to("nowhere/y.s")
    with pytest.raises(ConfigError, match=r"nowhere/y.s: .*nowhere does not exist"):
        check_writable(dangling, True, ConfigError)
    (tmp_path / "l1").symlink_to("l2")
    (tmp_path / "l2").symlink_to("l1")
    with pytest.raises(ConfigError, match="is a symbolic link that loops"):
        check_writable(tmp_path / "l1", True, ConfigError)
    fresh = tmp_path / "f.s"
    fresh.symlink_to("made.s")
    check_writable(fresh, True, ConfigError)
    write_new_file(fresh, "x", True, ConfigError)
    assert fresh.is_symlink() and (tmp_path / "made.s").read_text() == "x"


def test_a_new_file_gets_the_umask_mode_and_a_replaced_one_keeps_its_own(tmp_path: Path):
    old = os.umask(0o022)
    try:
        write_new_file(tmp_path / "a.s", "x", False, ConfigError)
        assert stat.S_IMODE(os.stat(tmp_path / "a.s").st_mode) == 0o644
        os.chmod(tmp_path / "a.s", 0o640)
        write_new_file(tmp_path / "a.s", "y", True, ConfigError)
        assert stat.S_IMODE(os.stat(tmp_path / "a.s").st_mode) == 0o640
    finally:
        os.umask(old)


def test_reading_refuses_devices_and_files_over_the_limit(tmp_path: Path):
    with pytest.raises(ConfigError, match="not a regular file"):
        read_user_file("/dev/zero", "spec file", ConfigError)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * 2000)
    with pytest.raises(ConfigError, match="2000 bytes, more than the 1000"):
        read_user_file(big, "spec file", ConfigError, limit_bytes=1000)
    assert read_user_file(big, "spec file", ConfigError, limit_bytes=2000) == b"#" * 2000


def test_text_with_a_byte_order_mark_decodes_and_a_bad_byte_is_placed_in_the_file():
    from aotune.errors import HwSpecError
    from aotune.files import decode_utf8

    assert decode_utf8(b"\xef\xbb\xbfab", "f.toml", "hwspec", HwSpecError) == "ab"
    for data, at in ((b"ab\xffc", 2), (b"\xef\xbb\xbfab\xffc", 5)):
        with pytest.raises(HwSpecError, match=f"byte {at}\\)"):
            decode_utf8(data, "f.toml", "hwspec", HwSpecError)
