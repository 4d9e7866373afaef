"""``aotune build`` end to end: a 6-workload list -> a library that C (against the .so and the
.a) and Python (aotune.load) call, matching numpy; the database makes a second build fast."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from aotune.artifact.backends import numpy_reference
from aotune.codegen.runner import tolerance
from aotune.errors import LibraryError

from .c_programs import c_program, write_inputs

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler to link the library")

KERNELS_TOML = """
[[kernel]]
name = "mm"
op = "matmul"
shape = "61x97x53"

[[kernel]]
name = "ffn_gelu"
op = "dense"
shape = "24x80x48"
bias = true
activation = "gelu"

[[kernel]]
name = "conv_nchw"
op = "conv2d"
shape = "1,8,13,13,16,3,3"
pad = 1

[[kernel]]
name = "conv_nhwc"
op = "conv2d"
shape = "2,8,11,11,12,3,3"
pad = 1
stride = 2
layout = "NHWC"

[[kernel]]
name = "dw"
op = "depthwise_conv2d"
shape = "1,16,14,14,3,3"
pad = 1

[[kernel]]
name = "bmm"
op = "batch_matmul"
shape = "4x17x40x32"
"""


def aotune(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """Run the CLI as a user does, in its own process."""
    done = subprocess.run(
        [sys.executable, "-m", "aotune", *args], cwd=cwd, capture_output=True, text=True
    )
    if check and done.returncode != 0:
        raise AssertionError(f"aotune {' '.join(args)} failed:\n{done.stderr}\n{done.stdout}")
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The list built twice into one directory with one database: (dir, first, second report)."""
    work = tmp_path_factory.mktemp("build")
    (work / "kernels.toml").write_text(KERNELS_TOML)
    args = ["build", "kernels.toml", "-o", "out", "--db", "tuning.db", "--budget", "64", "--json"]
    first = json.loads(aotune(*args, "--jobs", "2", cwd=work).stdout)
    second = json.loads(aotune(*args, cwd=work).stdout)
    return work, first, second


def test_build_writes_the_library_and_checks_it(built):
    work, first, _ = built
    out = work / "out"
    names = ["mm", "ffn_gelu", "conv_nchw", "conv_nhwc", "dw", "bmm"]
    assert [k["name"] for k in first["kernels"]] == names
    for f in ("libaotune_kernels.so", "libaotune_kernels.a", "aotune_kernels.h", "manifest.json"):
        assert (out / f).is_file(), f
    assert all((out / "objects" / f"{n}.o").is_file() for n in names)
    assert first["searched"] == 6 and first["from_database"] == 0
    for k in first["kernels"]:
        assert k["check"]["correct"], k  # the written .so against numpy, during the build
        assert k["measured_seconds"] and k["measured_gflops"] > 0  # the final check ran
    header = (out / "aotune_kernels.h").read_text()
    assert "int ffn_gelu(const float *a, const float *b, const float *bias, float *c);" in header
    assert "int conv_nhwc(const float *x, const float *wt, float *y);" in header
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) >= {"libaotune_kernels.so", "aotune_kernels.h"}


def test_second_build_reuses_the_database(built):
    _, first, second = built
    assert second["searched"] == 0 and second["from_database"] == 6
    assert [k["config"] for k in second["kernels"]] == [k["config"] for k in first["kernels"]]
    assert all(k["check"]["correct"] for k in second["kernels"])
    # the bar: a rebuild from the database costs at most a tenth of the first build
    assert second["seconds"] <= 0.10 * first["seconds"], (second["seconds"], first["seconds"])


@pytest.mark.parametrize("link", ["shared", "static"])
def test_c_program_calls_every_kernel(built, tmp_path, link):
    work, _, _ = built
    out = work / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    inputs = write_inputs(tmp_path, manifest)
    (tmp_path / "prog.c").write_text(c_program(manifest))
    if link == "shared":  # the shared object brings its own libraries (pthreads, libm)
        flags = [f"-L{out}", "-laotune_kernels", f"-Wl,-rpath,{out}"]
    else:  # the archive needs the flags the header and the manifest name
        flags = [str(out / "libaotune_kernels.a"), *manifest["link_flags"].split()]
    subprocess.run(
        [CC, "-std=c99", "-Wall", "-Werror", f"-I{out}", "prog.c", "-o", "prog", *flags],
        cwd=tmp_path,
        check=True,
    )
    if link == "static":  # nothing of the library is loaded at run time
        needed = subprocess.run(["ldd", "prog"], cwd=tmp_path, capture_output=True, text=True)
        assert "aotune" not in needed.stdout
    run = subprocess.run(["./prog"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "null: 1 a pointer argument is NULL" in run.stdout
    for k in manifest["kernels"]:
        from aotune.artifact.inputs import read_toml

        w = {r.name: r.workload for r in read_toml(work / "kernels.toml").kernels}[k["name"]]
        got = np.fromfile(tmp_path / f"{k['name']}.out.bin", dtype=np.float32)
        ref = numpy_reference(w, inputs[k["name"]])
        red = int(np.prod([lp.extent for lp in w.loops if lp.kind == "reduction"]))
        a, b = inputs[k["name"]][:2]
        tol = tolerance(a, b, red, ref if w.epilogue.active else None)
        assert np.abs(got.reshape(ref.shape) - ref).max() <= tol, k["name"]


def test_aotune_load_calls_every_kernel(built):
    import aotune

    work, _, _ = built
    lib = aotune.load(work / "out")
    from aotune.artifact.inputs import read_toml

    rng = np.random.default_rng(7)
    for req in read_toml(work / "kernels.toml").kernels:
        k = lib.kernels[req.name]
        inputs = [rng.uniform(-1, 1, p["shape"]).astype(np.float32) for p in k.inputs]
        ref = numpy_reference(req.workload, inputs)
        red = int(np.prod([lp.extent for lp in req.workload.loops if lp.kind == "reduction"]))
        tol = tolerance(inputs[0], inputs[1], red, ref if req.workload.epilogue.active else None)
        got = getattr(lib, req.name)(*inputs)
        assert got.shape == ref.shape and np.abs(got - ref).max() <= tol, req.name
        assert got.ctypes.data % 64 == 0
        out = np.full(ref.shape, np.nan, np.float32)
        assert getattr(lib, req.name)(*inputs, out=out) is out
        assert np.abs(out - ref).max() <= tol
    lib.set_num_threads(1)
    assert lib.num_threads == 1
    lib.shutdown()


def test_a_dropped_library_stops_its_worker_threads(built):
    """Each load is a private copy with its own worker threads, which ctypes never unloads: 20
    loads had left 20 idle pools using CPU."""
    import gc

    import aotune

    if not Path("/proc/self/task").is_dir():
        pytest.skip("counts threads in Linux's /proc")
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    work, _, _ = built
    from aotune.artifact.inputs import read_toml

    requests = read_toml(work / "kernels.toml").kernels
    gc.collect()
    before, most = threads(), 0
    for _ in range(3):
        lib = aotune.load(work / "out")
        lib.set_num_threads(2)
        for req in requests:
            k = lib.kernels[req.name]
            k(*[np.ones(p["shape"], np.float32) for p in k.inputs])
        most = max(most, threads())
        del lib, k
    if most == before:
        pytest.skip("no kernel of the list started a worker thread")
    gc.collect()
    assert threads() == before < most


def test_aotune_load_checks_arguments(built):
    import aotune

    work, _, _ = built
    lib = aotune.load(work / "out")
    a = np.ones((61, 53), np.float32)
    b = np.ones((53, 97), np.float32)
    assert lib.mm(a, b)[0, 0] == 53.0
    cases = [
        ((a.astype(np.float64), b), {}, "dtype float64"),
        ((a[:, :50], b), {}, "shape (61, 50)"),
        ((np.asfortranarray(a), b), {}, "not C-contiguous"),
        ((a,), {}, "takes 2 input arrays"),
        ((a, b, np.zeros((61, 97), np.float32)), {}, "got 3; pass the output as out="),
        ((a, b), {"out": np.zeros((61, 97))}, "(pass np.empty((61, 97), np.float32) and copy"),
        ((a.tolist(), b), {}, "must be a numpy array"),
        ((a, b), {"out": np.zeros((97, 61), np.float32)}, "shape (97, 61)"),
        # the mask was dropped: 53.0 where np.ma.dot gives 52.0
        ((np.ma.masked_array(a, mask=np.eye(61, 53, dtype=bool)), b), {}, "is a masked array"),
    ]
    assert lib.mm(np.ma.masked_array(a), b)[0, 0] == 53.0  # nothing masked: nothing lost
    for args, kw, text in cases:
        with pytest.raises(LibraryError, match=text.replace("(", r"\(").replace(")", r"\)")):
            lib.mm(*args, **kw)
    ro = np.zeros((61, 97), np.float32)
    ro.flags.writeable = False
    with pytest.raises(LibraryError, match="read-only"):
        lib.mm(a, b, out=ro)
    with pytest.raises(LibraryError, match="overlaps an input"):
        big = np.zeros(61 * 97 + 61 * 53, np.float32)
        lib.mm(
            big[: 61 * 53].reshape(61, 53), b, out=big[61 * 52 : 61 * 52 + 61 * 97].reshape(61, 97)
        )
    with pytest.raises(AttributeError, match="no kernel 'nope'"):
        lib.nope  # noqa: B018
    lib.shutdown()


def test_aotune_load_refuses_a_changed_library_and_a_malformed_manifest(built, tmp_path):
    """A library whose files are not the ones its build wrote (a truncated or swapped shared
    object would be mapped and called with the manifest's shapes), or whose manifest is not one
    this aotune writes, is refused with a LibraryError before anything is loaded."""

    import aotune

    work, _, _ = built

    def copy(name: str, change=None) -> Path:
        d = tmp_path / name
        shutil.copytree(work / "out", d)
        if change is not None:
            m = json.loads((d / "manifest.json").read_text())
            change(m)
            (d / "manifest.json").write_text(json.dumps(m))
        return d

    truncated = copy("truncated")
    so = truncated / "libaotune_kernels.so"
    so.write_bytes(so.read_bytes()[:2000])
    with pytest.raises(LibraryError, match="SHA-256 differs"):
        aotune.load(truncated)
    swapped = copy("swapped")
    shutil.copy(swapped / "libaotune_kernels.a", swapped / "libaotune_kernels.so")
    with pytest.raises(LibraryError, match="not the file the build wrote"):
        aotune.load(swapped)

    def first_param(m: dict, **kw) -> None:
        m["kernels"][0]["params"][0].update(kw)

    malformed = [
        (lambda m: m.update(target="host"), "target must be an object"),
        (lambda m: m["target"].pop("arch"), "needs arch"),
        (lambda m: m.update(kernels=None), "kernels must be a list"),
        (lambda m: m["kernels"][0].pop("name"), "kernel 1 has no name"),
        (lambda m: first_param(m, shape=[0, 3]), "params must"),
        (lambda m: first_param(m, dtype="float16"), "params must"),
        (lambda m: first_param(m, role="out"), "exactly one output"),
        (lambda m: m["aotune"].update(format=99), "format 99 is newer"),
        (lambda m: m.update(shared_object="/lib/x86_64-linux-gnu/libc.so.6"), "not a file of it"),
        (lambda m: m.update(shared_object=5), "not a file of it"),
        (lambda m: m["kernels"].append(m["kernels"][0]), "is listed twice"),
        (lambda m: m.update(kernels=[]), "lists no kernels"),
        (lambda m: m.update(shared_object=None), "built with --objects-only"),
        (lambda m: m["kernels"].pop(), r"hashes 'objects/\w+\.o', a kernel's file, and no kernel"),
        (lambda m: m["kernels"][0].update(object=["o"]), "object must name a file of the library"),
        (
            lambda m: (m["files"].pop(m["kernels"][-1]["object"]), m["kernels"].pop()),
            r"\.so holds kernel '\w+', which the manifest does not list",
        ),
        (lambda m: m["kernels"][0].update(name="shutdown"), "not one aotune build writes"),
    ]
    for i, (change, text) in enumerate(malformed):
        with pytest.raises(LibraryError, match=text):
            aotune.load(copy(f"m{i}", change))
    deep = copy("deep")
    (deep / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(aotune.LibraryError, match="nested too deeply"):
        aotune.load(deep)
    with pytest.raises(aotune.LibraryError, match="cannot look at"):
        aotune.load("x" * 100_000)  # longer than any file name: OSError ENAMETOOLONG

    # shapes changed consistently (rows of A and C doubled): the manifest passes its own checks,
    # and the kernel would write past C's 61 rows; the shared object says what it was built for
    def doubled_rows(m: dict) -> None:
        mm = next(k for k in m["kernels"] if k["name"] == "mm")
        for p in mm["params"]:
            if p["role"] in ("in0", "out"):
                p["shape"][0] *= 2

    with pytest.raises(LibraryError, match=r"in0 122x53, in1 53x97, out 122x97, .* for in0 61x53"):
        aotune.load(copy("edited", doubled_rows))

    # roles swapped, shapes kept: the output pointer would go to the bias's 80 floats
    def swapped_roles(m: dict) -> None:
        ffn = next(k for k in m["kernels"] if k["name"] == "ffn_gelu")
        roles = {p["role"]: p for p in ffn["params"]}
        roles["bias"]["role"], roles["out"]["role"] = "out", "bias"

    with pytest.raises(LibraryError, match="ffn_gelu.*the manifest was changed after the build"):
        aotune.load(copy("roles", swapped_roles))
    with pytest.raises(LibraryError, match="takes the directory"):
        aotune.load(None)
    lib = aotune.load(work / "out")
    for n in ("2", None, 2.5, True, 2**32 + 1):
        with pytest.raises(LibraryError, match="whole number of threads"):
            lib.set_num_threads(n)
    with pytest.raises(LibraryError, match="a C int"):
        lib.strerror(2**40)
    lib.shutdown()


def test_library_params_follow_tune_json_tensor_order(built):
    """The function takes the workload's tensors in the order ``tune --json`` lists them."""
    work, _, _ = built
    manifest = json.loads((work / "out" / "manifest.json").read_text())
    entry = next(k for k in manifest["kernels"] if k["name"] == "conv_nhwc")
    tuned = json.loads(
        aotune(
            "tune",
            "conv2d",
            "--shape",
            "2,8,11,11,12,3,3",
            "--pad",
            "1",
            "--stride",
            "2",
            "--layout",
            "NHWC",
            "--budget",
            "16",
            "--no-verify",
            "--no-db",
            "--json",
            cwd=work,
        ).stdout
    )
    tensors = tuned["workload"]["tensors"]
    assert [p["tensor"] for p in entry["params"]] == [t["name"] for t in tensors]
    assert [p["shape"] for p in entry["params"]] == [t["shape"] for t in tensors]
