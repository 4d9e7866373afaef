"""``build --prefix``: two libraries link into one C program, statically or shared, and load into
one Python process, each with its own runtime (the default names clash: the second header is
skipped by the first's guard, the objects define the runtime twice, and linked archives or
shared objects give both libraries the first one's runtime)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from aotune.cli import main

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
PROGRAM = Path(__file__).parent / "data" / "two_libraries.c"  # calls mm_a and mm_b, checks them


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Libraries alpha (mm_a, 33x17x29) and beta (mm_b, 31x19x23), built into one folder."""
    if CC is None:
        pytest.skip("no C compiler to link the libraries")
    work = tmp_path_factory.mktemp("prefix")
    for lib, name, shape in (("alpha", "mm_a", "[33, 17, 29]"), ("beta", "mm_b", "[31, 19, 23]")):
        (work / f"{lib}.toml").write_text(
            f'[[kernel]]\nname = "{name}"\nop = "matmul"\nshape = {shape}\n'
        )
        argv = ["build", str(work / f"{lib}.toml"), "-o", str(work / lib), "--prefix", lib,
                "--db", str(work / "t.db"), "--budget", "100", "--target", "host"]  # fmt: skip
        assert main(argv) == 0
    return work


def test_a_prefix_names_the_librarys_files_and_runtime(two):
    files = sorted(p.name for p in (two / "alpha").rglob("*") if p.is_file())
    assert files == ["alpha_kernels.h", "alpha_runtime.o", "libalpha_kernels.a",
                     "libalpha_kernels.so", "manifest.json", "mm_a.o"]  # fmt: skip
    header = (two / "alpha" / "alpha_kernels.h").read_text()
    for name in ("ALPHA_KERNELS_H", "ALPHA_OK", "alpha_set_num_threads", "-lalpha_kernels"):
        assert name in header
    # only the kernel's declaration guard, shared by every library's header, says AOTUNE
    assert "aotune_" not in header.replace("AOTUNE_DECLARES_", "")
    assert "AOTUNE" not in header.replace("AOTUNE_DECLARES_", "")


@pytest.mark.parametrize("link", ["static", "shared"])
def test_two_libraries_link_into_one_program(two, tmp_path, link):
    if link == "static":
        libs = [str(two / "alpha" / "libalpha_kernels.a"), str(two / "beta" / "libbeta_kernels.a")]
    else:
        libs = [f"-L{two / 'alpha'}", f"-L{two / 'beta'}", "-lalpha_kernels", "-lbeta_kernels",
                f"-Wl,-rpath,{two / 'alpha'}:{two / 'beta'}"]  # fmt: skip
    subprocess.run(
        [
            CC,
            "-std=c99",
            "-Wall",
            "-Werror",
            f"-I{two / 'alpha'}",
            f"-I{two / 'beta'}",
            str(PROGRAM),
            "-o",
            "prog",
            *libs,
            "-lpthread",
            "-lm",
        ],  # fmt: skip
        cwd=tmp_path,
        check=True,
    )
    run = subprocess.run(["./prog"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    # each library keeps its own thread setting: alpha 2, beta 1
    assert run.stdout.splitlines() == [
        "0 0 success | a pointer argument is NULL | 2 1",
        "err 0 0",
    ]


def test_two_libraries_load_into_one_process(two):
    import aotune
    import numpy as np

    alpha, beta = aotune.load(two / "alpha"), aotune.load(two / "beta")
    try:
        alpha.set_num_threads(2)
        beta.set_num_threads(1)
        assert (alpha.num_threads, beta.num_threads) == (2, 1)
        # each names itself for a code it does not know (both said "aotune" before stop 107)
        assert (alpha.strerror(99), beta.strerror(99)) == (
            "unknown alpha error code",
            "unknown beta error code",
        )
        rng = np.random.default_rng(0)
        a, b = rng.random((33, 29), np.float32), rng.random((29, 17), np.float32)
        np.testing.assert_allclose(alpha.mm_a(a, b), a @ b, rtol=1e-5)
    finally:
        alpha.shutdown()
        beta.shutdown()


@pytest.mark.parametrize(
    ("prefix", "said"),
    [
        ("Alpha", "give lower-case letters"),
        ("1x", "a letter first"),
        ("mm", "kernel 'mm_a' begins with the prefix mm_"),
        ("a_", "words joined by one _"),
        ("a__b", "words joined by one _"),
        # the names it gives are libc's, a header's or OpenMP's (found by the stop-103 probe)
        ("gai", "gai_strerror is defined by the C library"),
        ("r", "R_OK is a type or macro of the C standard headers"),
        ("omp", "omp_* is the namespace of a library"),
        ("pthread_mutex", "pthread_* is the namespace of a library"),
    ],
)
def test_a_prefix_that_cannot_name_the_library_is_refused(tmp_path, capsys, prefix, said):
    (tmp_path / "k.toml").write_text(
        '[[kernel]]\nname = "mm_a"\nop = "matmul"\nshape = [4, 4, 4]\n'
    )
    argv = ["build", str(tmp_path / "k.toml"), "-o", str(tmp_path / "lib"), "--prefix", prefix]
    assert main([*argv, "--db", str(tmp_path / "t.db")]) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "lib").exists()


def test_two_headers_declaring_one_kernel_stop_the_compile(tmp_path):
    """Two prefixed libraries with a kernel of one name (ONNX nodes '/fc/Gemm' in two models)
    linked, and the program called the first library's kernel for the second's (8x16x8 for
    40x24x36): the headers now stop the compile instead."""
    if CC is None:
        pytest.skip("no C compiler")
    for lib, shape in (("one", "[8, 16, 8]"), ("two", "[40, 24, 36]")):
        (tmp_path / f"{lib}.toml").write_text(
            f'[[kernel]]\nname = "fc"\nop = "matmul"\nshape = {shape}\n'
        )
        argv = ["build", str(tmp_path / f"{lib}.toml"), "-o", str(tmp_path / lib), "--prefix",
                lib, "--objects-only", "--target", "haswell", "--no-verify", "--db",
                str(tmp_path / "t.db"), "--budget", "20"]  # fmt: skip
        assert main(argv) == 0
    (tmp_path / "both.c").write_text('#include "one_kernels.h"\n#include "two_kernels.h"\n')
    (tmp_path / "one.c").write_text('#include "one_kernels.h"\n#include "one_kernels.h"\n')
    flags = [f"-I{tmp_path / 'one'}", f"-I{tmp_path / 'two'}", "-c", "-o", os.devnull]
    both = subprocess.run([CC, *flags, "both.c"], cwd=tmp_path, capture_output=True, text=True)
    assert both.returncode != 0 and "two aotune libraries declare the kernel fc" in both.stderr
    once = subprocess.run([CC, *flags, "one.c"], cwd=tmp_path, capture_output=True, text=True)
    assert once.returncode == 0, once.stderr  # one header twice: its guard


def test_a_manifest_naming_a_runtime_function_as_a_kernel_is_refused():
    """A manifest edited to list 'alpha_set_num_threads' as a kernel of a --prefix alpha
    library loaded, and the call passed arrays to the runtime's thread setter."""
    from aotune.artifact.load import _manifest_problem

    manifest = {
        "aotune": {"format": 1},
        "target": {"name": "x", "kind": "cpu", "arch": "x86_64", "cpu_features": []},
        "files": {},
        "prefix": "alpha",
        "kernels": [{"name": "alpha_set_num_threads"}],
    }
    assert "is not one aotune build writes" in (_manifest_problem(manifest) or "")


def test_an_onnx_node_named_in_the_prefix_is_renamed_not_refused():
    """A node 'alpha_fc' built with --prefix alpha was refused ('rename the kernel'), which an
    ONNX model cannot without editing it; aotune_fc was already renamed k_aotune_fc."""
    from aotune.artifact.onnx_import import c_name

    assert c_name("alpha_fc", set(), "alpha") == "k_alpha_fc"
    assert c_name("alpha_fc", set()) == "alpha_fc"  # outside the default prefix: kept
