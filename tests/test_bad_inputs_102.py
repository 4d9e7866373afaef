"""Bad input found at stop 102: each test failed before its fix."""

from __future__ import annotations

import pytest
from aotune.cli import main


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["tune", "matmul", "--shape", "4x4x4", "--bogus", "1"], "'aotune tune --help'"),
        (["db", "list", "--zzz"], "'aotune db list --help'"),
        (["hw", "show", "znver4", "extra"], "'aotune hw show --help'"),
        (["hw", "--zz"], "'aotune hw --help'"),
    ],
)
def test_arguments_left_over_point_to_the_subcommands_help(capsys, argv, hint):
    """They all said "(see 'aotune --help')", whose text lists no subcommand's options."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and f"(see {hint})" in err


def _stage_build(out, files):
    """A staged build into ``out`` of ``files`` (relative path -> bytes) and its manifest."""
    import hashlib
    import json

    from aotune.artifact.build import MANIFEST, stage_output_dir

    staging = stage_output_dir(out)
    sums = {}
    for rel, data in files.items():
        (staging.dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging.dir / rel).write_bytes(data)
        sums[rel] = hashlib.sha256(data).hexdigest()
    manifest = {"aotune": {"format": 1}, "files": sums}
    (staging.dir / MANIFEST).write_text(json.dumps(manifest))
    return staging, [*files, MANIFEST]


def test_a_build_that_installs_second_replaces_all_of_the_first(tmp_path):
    """Two builds into one folder at once: the second removed only the files that were there
    when it began, so the first's object stayed beside a manifest that did not list it."""
    from aotune.artifact.build import install_output

    out = tmp_path / "lib"
    out.mkdir()
    second, second_files = _stage_build(out, {"objects/b.o": b"b"})  # began first, ends last
    first, first_files = _stage_build(out, {"objects/a.o": b"a"})
    install_output(first, first_files)
    assert (out / "objects" / "a.o").exists()
    install_output(second, second_files)
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == ["manifest.json", "objects/b.o"]


def test_a_users_file_beside_a_build_stays(tmp_path):
    """Installing reads the earlier build's files from its manifest: a file it does not list,
    or one changed since, is the user's and is kept."""
    from aotune.artifact.build import install_output

    out = tmp_path / "lib"
    out.mkdir()
    first, first_files = _stage_build(out, {"objects/a.o": b"a", "notes.txt": b"n"})
    install_output(first, first_files)
    (out / "notes.txt").write_text("mine now")
    (out / "mine.c").write_text("int x;")
    second, second_files = _stage_build(out, {"objects/b.o": b"b"})
    install_output(second, second_files)
    assert (out / "notes.txt").read_text() == "mine now" and (out / "mine.c").exists()
    assert not (out / "objects" / "a.o").exists()
