"""Bad input found at stop 102: each test failed before its fix."""

from __future__ import annotations

import shutil

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


# ---- found by a probe of the Python API and the built libraries ----------------------------


@pytest.mark.parametrize(
    "name",
    ["linux", "unix", "uint", "pid_t", "fd_set", "alloca", "PATH_MAX", "CLOCK_MONOTONIC",
     "jmp_buf", "complex", "I", "isfinite", "EINVAL", "SIGTRAP", "LC_ALL", "MB_LEN_MAX",
     "noreturn", "once_flag", "WNOHANG", "std", "MAXFLOAT", "omp_get_num_threads", "MPI_Init",
     "mkl_malloc"],
)  # fmt: skip
def test_names_a_program_beside_the_header_would_break_are_refused(name):
    """Each was accepted, and every C or C++ program including the header beside the standard
    headers (or linking OpenMP, MPI or MKL) then failed to compile or link."""
    from aotune.artifact.inputs import check_c_name
    from aotune.errors import BuildError

    with pytest.raises(BuildError, match="choose another name"):
        check_c_name(name, "kernel 1")


@pytest.mark.parametrize("name", ["mm", "bert_ffn1", "WQKV", "ENCODER", "layer_t0", "W"])
def test_ordinary_names_stay_allowed(name):
    from aotune.artifact.inputs import check_c_name

    assert check_c_name(name, "kernel 1") == name


def test_a_name_ending_in_t_is_refused_for_what_it_is():
    """ein_t was called "a type or macro of the C standard headers", which it is not."""
    from aotune.artifact.inputs import reserved_name_reason

    assert reserved_name_reason("ein_t").startswith("ends in _t, which POSIX reserves")


LIBRARY_TOML = """
[[kernel]]
name = "mm"
op = "matmul"
shape = "8x12x16"

[[kernel]]
name = "ffn"
op = "dense"
shape = "4x8x8"
bias = true
activation = "relu"

[[kernel]]
name = "big"
op = "matmul"
shape = "192x192x192"
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """A small library built once: its directory."""
    work = tmp_path_factory.mktemp("lib102")
    (work / "k.toml").write_text(LIBRARY_TOML)
    argv = ["build", str(work / "k.toml"), "-o", str(work / "lib"), "--db", str(work / "t.db")]
    assert main([*argv, "--budget", "16", "--top-k", "1", "--no-verify"]) == 0
    return work / "lib"


def test_the_header_says_the_output_is_overwritten(library):
    """The header showed only the workload's notation, C[m, n] += A[m, k] * B[k, n], and a C
    user who relied on it to accumulate got wrong results."""
    header = (library / "aotune_kernels.h").read_text()
    assert header.count("is overwritten, not added to.") == 3


def test_a_pickled_kernel_loads_its_own_library_from_any_folder(library, tmp_path, monkeypatch):
    """The library kept the directory as given: unpickled after a change of folder it loaded
    whatever lay at that relative path (another library's kernel of the same shapes)."""
    import pickle

    import aotune
    import numpy as np

    monkeypatch.chdir(library.parent)
    lib = aotune.load("lib")
    data = pickle.dumps(lib.mm)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lib").mkdir()  # a different folder of that name here
    mm = pickle.loads(data)
    assert mm.library.directory == library
    a, b = np.ones((8, 16), np.float32), np.ones((16, 12), np.float32)
    assert np.allclose(mm(a, b), 16.0)


def test_a_library_built_again_since_it_was_pickled_is_refused(library):
    """Unpickling loads the library at the directory again; if it was rebuilt in between, its
    kernels may differ from the pickled ones."""
    from aotune.artifact.load import _load_again
    from aotune.errors import LibraryError

    with pytest.raises(LibraryError, match="built again since this library was pickled"):
        _load_again(str(library), {"libaotune_kernels.so": "0" * 64})


def test_the_loaded_description_is_read_only(library):
    """Changing k.output['shape'] turned off the shape check: the kernel wrote 384 x 384 floats
    into a 1 x 384 array and the process aborted (heap corruption)."""
    import aotune

    lib = aotune.load(library)
    with pytest.raises(TypeError):
        lib.mm.output["shape"][0] = 1
    with pytest.raises(TypeError):
        lib.manifest["kernels"][0]["params"] = []
    with pytest.raises(TypeError):
        lib.mm.inputs[0]["shape"] = (1, 1)


def test_loading_a_library_again_maps_it_once(library):
    """Each load (and each unpickle, in a process pool) mapped a private copy of the .so until
    the process ended: 401 copies after 401 tasks."""
    import aotune

    assert aotune.load(library)._dll is aotune.load(library)._dll


def test_no_room_for_the_private_copy_names_the_temporary_folder(library, monkeypatch):
    """It said the dynamic loader refused the library and to rebuild it."""
    import tempfile

    import aotune
    from aotune.artifact import load as load_module
    from aotune.errors import LibraryError

    monkeypatch.setattr(load_module, "_COPIES", {})
    monkeypatch.setattr(tempfile, "tempdir", str(library / "no such folder"))
    with pytest.raises(LibraryError, match="temporary folder .*no such folder.*set TMPDIR"):
        aotune.load(library)


CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

PLUGIN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include "aotune_kernels.h"
int main(int argc, char **argv) {
    static float a[192 * 192], b[192 * 192], c[192 * 192];
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) return 3;
    int (*other)(const float *, const float *, float *) = (int (*)(const float *, const float *,
        float *))dlsym(h, "big");
    if (!other || other(a, b, c) != 0) return 4;  /* starts the plugin's workers */
    dlclose(h);  /* its destructor must stop its own workers, not this program's library's */
    return big(a, b, c);
}
"""


@pytest.mark.skipif(CC is None, reason="needs a C compiler")
def test_unloading_a_second_library_stops_its_own_workers(library, tmp_path):
    """The destructor called the public aotune_shutdown, which the library linked first
    interposes: dlclose of a second library left its workers running into unmapped code
    (SIGSEGV)."""
    import json
    import subprocess

    kernels = json.loads((library / "manifest.json").read_text())["kernels"]
    big = next(k for k in kernels if k["name"] == "big")
    if big["config"]["threads"] < 2:
        pytest.skip("the search gave the kernel one thread here: no workers to stop")
    plugin = tmp_path / "plugin"
    shutil.copytree(library, plugin)
    src = tmp_path / "p.c"
    src.write_text(PLUGIN_C)
    exe = tmp_path / "p"
    subprocess.run(
        [CC, "-std=c11", "-D_DEFAULT_SOURCE", str(src), f"-I{library}", f"-L{library}",
         "-laotune_kernels", f"-Wl,-rpath,{library}", "-ldl", "-lpthread", "-o", str(exe)],
        check=True,
    )  # fmt: skip
    done = subprocess.run([str(exe), str(plugin / "libaotune_kernels.so")], timeout=60)
    assert done.returncode == 0


def test_a_link_to_a_folder_outside_the_output_is_not_written_through(tmp_path):
    """With --force, a symbolic link objects/ -> a folder of the user's made the build replace
    that folder's files."""
    from aotune.artifact.build import install_output
    from aotune.errors import BuildError

    out, theirs = tmp_path / "lib", tmp_path / "theirs"
    out.mkdir()
    theirs.mkdir()
    (theirs / "a.o").write_text("notes")
    (out / "objects").symlink_to(theirs)
    staging, files = _stage_build(out, {"objects/a.o": b"object"})
    with pytest.raises(BuildError, match="a symbolic link to .*outside -o"):
        install_output(staging, files)
    assert (theirs / "a.o").read_text() == "notes"


@pytest.mark.parametrize("stop", [OSError(30, "Read-only file system"), KeyboardInterrupt()])
def test_an_install_stopped_part_way_leaves_the_earlier_library_whole(tmp_path, monkeypatch, stop):
    """A Ctrl-C or a failure while moving files in left new objects beside the old header and
    manifest (a C program would read out of bounds); 'build again' was then refused."""
    import os

    from aotune.artifact.build import install_output
    from aotune.errors import BuildError

    out = tmp_path / "lib"
    out.mkdir()
    first, first_files = _stage_build(out, {"objects/k.o": b"old k", "lib.h": b"old h"})
    install_output(first, first_files)

    def files():  # the library's, not the staging folders a build discards itself
        return {
            p: p.read_bytes()
            for p in out.rglob("*")
            if p.is_file() and not p.relative_to(out).parts[0].startswith(".aotune-partial-")
        }

    before = files()
    second, second_files = _stage_build(out, {"objects/k.o": b"new k", "lib.h": b"new h"})
    real_replace, calls = os.replace, []

    def replace_then_stop(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # k.o set aside and the new one in, lib.h set aside: stop
            raise stop
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_stop)
    with pytest.raises(BuildError if isinstance(stop, OSError) else KeyboardInterrupt):
        install_output(second, second_files)
    monkeypatch.setattr(os, "replace", real_replace)
    assert files() == before
    assert not list(out.glob(".aotune-partial-replaced-*"))  # the files set aside went back


def test_onnx_node_names_differing_in_case_give_distinct_kernel_names():
    """Nodes FC and fc made kernels FC and fc, whose files clash where names ignore case (the
    TOML path refuses such a pair)."""
    from aotune.artifact.onnx_import import c_name

    taken: set[str] = set()
    assert [c_name(n, taken) for n in ("FC", "fc", "Fc")] == ["FC", "fc_2", "Fc_3"]


@pytest.mark.parametrize(("op", "attrs"), [("Gemm", {"transA": "x"}), ("Gemm", {"alpha": [1, 2]})])
def test_an_onnx_attribute_of_the_wrong_type_is_an_error_not_a_crash(tmp_path, capsys, op, attrs):
    """transA = 'x' or alpha = [1, 2] ended in an internal error (exit 70)."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node(op, ["a", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
    )
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), str(model))
    argv = ["build", str(model), "-o", str(tmp_path / "lib"), "--db", str(tmp_path / "t.db")]
    assert main([*argv, "--target", "haswell", "--no-verify", "--objects-only"]) == 2
    err = capsys.readouterr().err  # (stop 103: the schema's type is named)
    assert "ONNX defines it as" in err and "internal error" not in err
