"""A demanding user's probe of ``aotune.load`` and of the files aotune writes: every bad argument a
library kernel can be handed gets the right answer or a LibraryError naming it, a library whose
manifest was edited cannot call what is not a kernel or code this CPU cannot run, and no output
replaces what a command reads or a file made while it worked."""

from __future__ import annotations

import errno
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest
from aotune.errors import ConfigError, LibraryError

from .test_build import CC

needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to link the library")

KERNELS_TOML = """
[[kernel]]
name = "mm"
op = "matmul"
shape = "13x17x11"

[[kernel]]
name = "ffn"
op = "dense"
shape = "6x20x12"
bias = true
activation = "relu"

[[kernel]]
name = "sq"
op = "matmul"
shape = "8x8x8"
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """A three-kernel library, built as fast as a build goes (a few seconds)."""
    if CC is None:
        pytest.skip("no C compiler to link the library")
    work = tmp_path_factory.mktemp("probe")
    (work / "k.toml").write_text(KERNELS_TOML)
    args = ["build", "k.toml", "-o", "lib", "--db", "t.db", "--budget", "4", "--top-k", "1"]
    args += ["--no-verify", "--jobs", "1", "--strategy", "random"]
    done = subprocess.run(
        [sys.executable, "-m", "aotune", *args], cwd=work, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return work / "lib"


def _edited(library: Path, where: Path, edit) -> Path:
    """A copy of the library whose manifest ``edit`` changed in place."""
    out = where / "edited"
    shutil.copytree(library, out)
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _offset_view(a: np.ndarray, offset_bytes: int) -> np.ndarray:
    """``a``'s values in a C-contiguous float32 array starting ``offset_bytes`` into a buffer."""
    raw = bytearray(a.nbytes + offset_bytes)
    view = np.frombuffer(raw, np.float32, count=a.size, offset=offset_bytes).reshape(a.shape)
    view[...] = a
    return view


class _Sub(np.ndarray):
    """An ndarray subclass, as libraries hand out."""


# ---- calling the kernels -----------------------------------------------------------------------


@needs_cc
def test_every_bad_argument_is_a_library_error_that_names_it(library: Path):
    import aotune

    lib = aotune.load(library)
    a, b = np.ones((13, 11), np.float32), np.ones((11, 17), np.float32)
    out = np.zeros((13, 17), np.float32)
    ro = out.copy()
    ro.flags.writeable = False
    wide = np.ones((13, 22), np.float32)
    cases = [
        ((a.astype(np.float64), b), {}, "dtype float64"),
        ((a.astype(np.int32), b), {}, "dtype int32"),
        ((a, b.astype(np.float16)), {}, r"argument b \(in1\) has dtype float16"),
        ((a.astype(">f4"), b), {}, "dtype >f4"),
        ((a, b), {"out": out.astype(np.float64)}, r"argument c \(out\) has dtype float64"),
        ((b, a), {}, r"shape \(11, 17\); the kernel was built for \(13, 11\)"),
        ((a.ravel(), b), {}, r"shape \(143,\)"),  # the right size, the wrong rank
        ((a[None], b), {}, r"shape \(1, 13, 11\)"),
        ((np.zeros((0, 11), np.float32), b), {}, r"shape \(0, 11\)"),
        ((np.array(1.0, np.float32), b), {}, r"shape \(\)"),
        ((np.float32(1.0), b), {}, "must be a numpy array .* got float32"),
        ((a.tolist(), b), {}, "must be a numpy array .* got list"),
        ((None, b), {}, "got NoneType"),
        ((a,), {}, "takes 2 input arrays"),
        ((a, b, out), {}, "takes 2 input arrays"),
        ((wide[:, ::2], b), {}, "not C-contiguous"),
        ((np.ascontiguousarray(a.T).T, b), {}, "not C-contiguous"),
        ((np.asfortranarray(a), b), {}, "not C-contiguous"),
        ((a[::-1], b), {}, "not C-contiguous"),
        ((np.broadcast_to(a[0], a.shape), b), {}, "not C-contiguous"),
        ((np.lib.stride_tricks.as_strided(a, a.shape, (2**40, 4)), b), {}, "not C-contiguous"),
        ((a, b), {"out": np.asfortranarray(out)}, "argument c .* not C-contiguous"),
        ((a, b), {"out": ro}, "read-only"),
        ((a, b), {"out": a}, r"argument c \(out\) has shape \(13, 11\)"),
        # a keyword that is not out= (a TypeError from Python's call machinery until now)
        ((a, b), {"output": out}, r"by position and out=, not output="),
    ]
    for args, kw, text in cases:
        with pytest.raises(LibraryError, match=text):
            lib.mm(*args, **kw)
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    with pytest.raises(LibraryError, match="overlaps an input"):
        lib.sq(x, np.eye(8, dtype=np.float32), out=x)  # C is A
    lib.shutdown()


@needs_cc
def test_awkward_but_valid_arrays_give_numpys_answer(library: Path):
    """Misaligned by an element or a byte, read-only inputs, a size-1 dimension with any stride,
    subclasses and an unmasked masked array: each computed right (float64 reference)."""
    import aotune

    lib = aotune.load(library)
    rng = np.random.default_rng(3)
    a = rng.uniform(-1, 1, (13, 11)).astype(np.float32)
    b = rng.uniform(-1, 1, (11, 17)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    frozen = a.copy()
    frozen.flags.writeable = False
    for args, out in [
        ((_offset_view(a, 4), _offset_view(b, 4)), _offset_view(np.zeros((13, 17)), 4)),
        ((_offset_view(a, 1), _offset_view(b, 3)), _offset_view(np.zeros((13, 17)), 2)),
        ((frozen, b), None),
        ((a.view(_Sub), b.view(_Sub)), None),
        ((np.ma.masked_array(a), b), None),
    ]:
        got = lib.mm(*args, out=out)
        assert out is None or got is out
        assert np.abs(got - ref).max() < 1e-5
    bias = rng.uniform(-1, 1, 20).astype(np.float32)
    x = rng.uniform(-1, 1, (6, 12)).astype(np.float32)
    w = rng.uniform(-1, 1, (12, 20)).astype(np.float32)
    odd = np.lib.stride_tricks.as_strided(bias[None], (1, 20), (2**40, 4))[0]
    got = lib.ffn(x, w, odd)
    assert np.abs(got - np.maximum(x.astype(np.float64) @ w + bias, 0)).max() < 1e-5
    lib.shutdown()


@needs_cc
def test_a_library_and_its_kernels_pickle_as_their_directory(library: Path):
    """Handing a kernel to a process pool pickles it: ctypes' 'objects containing pointers
    cannot be pickled' until now; it travels as the library's directory, loaded again."""
    import aotune

    lib = aotune.load(library)
    a, b = np.ones((13, 11), np.float32), np.ones((11, 17), np.float32)
    again = pickle.loads(pickle.dumps(lib.mm))
    assert again.library is not lib and again.name == "mm"
    assert again(a, b)[0, 0] == 11.0
    assert set(pickle.loads(pickle.dumps(lib)).kernels) == {"mm", "ffn", "sq"}
    lib.shutdown()
    again.library.shutdown()


# ---- loading -----------------------------------------------------------------------------------


@needs_cc
@pytest.mark.parametrize(
    "name, says",
    [
        ("printf", "defines no kernel 'printf'"),  # dlsym found libc's: printf(a, b, c)
        ("free", "defines no kernel 'free'"),
        ("aotune_shutdown", "not one aotune build writes"),  # a void function: rc garbage
        ("_init", "has no kernel '_init'"),  # in the .so, and local
        ("x" * 5000, "is not a C identifier"),
    ],
)
def test_a_manifest_naming_a_function_that_is_no_kernel_is_refused(
    library: Path, tmp_path: Path, name: str, says: str
):
    import aotune

    def rename(m: dict) -> None:
        m["kernels"][0]["name"] = name

    with pytest.raises(LibraryError, match=says) as e:
        aotune.load(_edited(library, tmp_path, rename))
    assert len(str(e.value)) < 400


@needs_cc
def test_code_this_cpu_cannot_run_is_refused_whatever_the_manifest_lists(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A manifest whose cpu_features were edited (or written before aotune read them from the
    code) loaded, on a CPU without AVX, code that dies of SIGILL: the code is read now."""
    import aotune
    import aotune.hwspecs.host as host

    real = host.detect_host().isa
    if real.arch != "x86_64":
        pytest.skip("x86 code")
    plain = [f for f in real.llvm_features.split(",") if f not in ("+avx", "+avx2", "+fma")]
    plain = [f for f in plain if not f.startswith("+avx512")]
    fake = types.SimpleNamespace(isa=types.SimpleNamespace(arch="x86_64", llvm_features=""))
    fake.isa.llvm_features = ",".join(plain)
    monkeypatch.setattr(host, "detect_host", lambda: fake)

    def listed_as_plain(m: dict) -> None:
        m["target"]["cpu_features"] = ["sse2"]

    with pytest.raises(LibraryError, match=r"needs CPU features this machine lacks \(avx"):
        aotune.load(_edited(library, tmp_path, listed_as_plain))


def _host_without(monkeypatch: pytest.MonkeyPatch, dropped) -> None:
    """This host as aotune sees it, less the features for which ``dropped(name)`` is true."""
    import aotune.hwspecs.host as host

    real = host.detect_host().isa
    kept = [f for f in real.llvm_features.split(",") if not dropped(f[1:])]
    fake = types.SimpleNamespace(
        isa=types.SimpleNamespace(arch=real.arch, llvm_features=",".join(kept))
    )
    monkeypatch.setattr(host, "detect_host", lambda: fake)


@needs_cc
def test_fma_code_is_refused_where_the_cpu_has_avx2_but_not_fma(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """capstone 5 puts ``vfmadd231ps`` in no instruction group: the code scan missed every FMA,
    and a library whose manifest did not list fma loaded (and died of SIGILL) on such a CPU."""
    import aotune
    import aotune.hwspecs.host as host

    features = host.detect_host().isa.llvm_features.split(",")
    if "+fma" not in features or "+avx512f" in features:
        pytest.skip("FMA code is VEX-encoded on x86 CPUs with FMA and without AVX-512")
    _host_without(monkeypatch, lambda f: f == "fma")

    def fma_unlisted(m: dict) -> None:
        m["target"]["cpu_features"] = [f for f in m["target"]["cpu_features"] if f != "fma"]

    with pytest.raises(LibraryError, match=r"lacks \(fma: 'vfmadd"):
        aotune.load(_edited(library, tmp_path, fma_unlisted))


@needs_cc
def test_a_host_library_lists_only_the_features_its_code_uses(
    library: Path, monkeypatch: pytest.MonkeyPatch
):
    """A library built for ``host`` listed every feature of the build machine (``sse4a`` and
    ``clzero`` on a Zen 3), so another AVX2 CPU refused it though its code uses none of them.
    It now lists what the code uses: a CPU without any extension the code never touches loads
    it, and its kernels run right."""
    import aotune
    import aotune.hwspecs.host as host
    from aotune.analysis.elf import x86_code_sections
    from aotune.analysis.x86_features import FEATURE_MNEMONICS, x86_features_in_code

    real = host.detect_host().isa
    if real.arch != "x86_64":
        pytest.skip("x86 code")
    listed = set(json.loads((library / "manifest.json").read_text())["target"]["cpu_features"])
    code = [c for o in (library / "objects").iterdir() for c in x86_code_sections(o.read_bytes())]
    assert listed & set(FEATURE_MNEMONICS) <= set(x86_features_in_code(code))
    assert not listed & {"sse4a", "clzero", "sha", "rdrnd", "xsave"}
    assert "avx512f" in listed or "avx512vl" not in listed
    assert {"avx2", "fma"} <= listed or "+avx2" not in real.llvm_features
    _host_without(
        monkeypatch,
        lambda f: (f in FEATURE_MNEMONICS or f.startswith("avx512")) and f not in listed,
    )
    lib = aotune.load(library)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((13, 11), np.float32), rng.standard_normal((11, 17), np.float32)
    np.testing.assert_allclose(lib.mm(a, b), a @ b, rtol=1e-4, atol=1e-4)


@needs_cc
@pytest.mark.parametrize("which", ["manifest.json", "libaotune_kernels.so"])
def test_a_pipe_in_a_library_is_refused_not_waited_on(library: Path, tmp_path: Path, which):
    """A FIFO (or a link to /dev/zero) as the manifest or the shared object blocked
    aotune.load for ever (or read until the memory ran out)."""
    lib = tmp_path / "lib"
    shutil.copytree(library, lib)
    (lib / which).unlink()
    os.mkfifo(lib / which)
    code = f"import aotune; aotune.load({str(lib)!r})"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"aotune.load waited on a FIFO as {which}")
    assert "LibraryError" in done.stderr and "not a regular file" in done.stderr


# ---- writing files -----------------------------------------------------------------------------


def test_an_output_never_takes_the_name_of_a_databases_journal(tmp_path: Path):
    """``tune --emit-asm t.db-wal --force --db t.db`` wrote the assembly where SQLite keeps the
    database's write-ahead log; the next open of the database deleted it (or, with another
    build sharing the file, the log's records were lost)."""
    from aotune.files import refuse_outputs_over_inputs

    db = tmp_path / "t.db"
    db.write_bytes(b"SQLite format 3\0")
    (tmp_path / "link.db").symlink_to(db)
    for output, database in [
        ("t.db-wal", db),
        ("t.db-shm", db),
        ("t.db-journal", db),
        ("t.db-wal", tmp_path / "link.db"),  # SQLite may name the log after the link's target
    ]:
        with pytest.raises(ConfigError, match="where SQLite keeps the journal"):
            refuse_outputs_over_inputs(
                {"--emit-asm": str(tmp_path / output)},
                {"the tuning database": str(database)},
                ConfigError,
            )
    refuse_outputs_over_inputs(  # another name is fine
        {"--emit-asm": str(tmp_path / "t.db-wal.s")}, {"the tuning database": str(db)}, ConfigError
    )


def test_the_cli_refuses_an_emit_over_the_databases_log(tmp_path: Path):
    args = ["tune", "matmul", "--shape", "8x8x8", "--no-verify", "--db", "t.db"]
    done = subprocess.run(
        [sys.executable, "-m", "aotune", *args, "--emit-asm", "t.db-wal", "--force"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "where SQLite keeps the journal" in done.stderr
    assert not (tmp_path / "t.db-wal").exists()


def test_a_file_made_while_aotune_worked_is_not_replaced_without_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """check_writable looks before the work (a minute of calibration, a search) and the write
    comes after it: a file another run or the user made at that name in between was replaced
    without a word (the rename replaces whatever is there)."""
    from aotune import files

    target = tmp_path / "spec.toml"
    real_mkstemp = tempfile.mkstemp

    def mkstemp_then_someone_writes(*args, **kw):
        made = real_mkstemp(*args, **kw)
        target.write_text("hand edited\n")  # after the check, before the rename
        return made

    monkeypatch.setattr(files.tempfile, "mkstemp", mkstemp_then_someone_writes)
    with pytest.raises(ConfigError, match="was made while aotune worked; pass --force"):
        files.write_new_file(target, "calibrated\n", False, ConfigError)
    assert target.read_text() == "hand edited\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.toml"]  # no temporary left
    monkeypatch.setattr(files.tempfile, "mkstemp", real_mkstemp)
    files.write_new_file(tmp_path / "new.toml", "x\n", False, ConfigError)
    assert (tmp_path / "new.toml").read_text() == "x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.toml", "spec.toml"]


def test_a_write_failing_midway_leaves_the_old_file_and_no_partial_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Regression cover (no defect found): a disk that fills half way through."""
    from aotune import files

    old = tmp_path / "plot.png"
    old.write_bytes(b"old")
    real_fdopen = os.fdopen

    class HalfWritten:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: HalfWritten(real_fdopen(fd, mode)))
    for path, force in ((old, True), (tmp_path / "new.png", False)):
        with pytest.raises(ConfigError, match="No space left on device"):
            files.write_new_file(path, b"x" * 1000, force, ConfigError)
    monkeypatch.undo()
    assert old.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_a_calibration_that_cannot_be_written_at_the_end_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``hw calibrate -o F`` checks F before minutes of measuring; a file made at F meanwhile
    (another calibration, the user) made the write fail at the end and the measurements were
    lost: they are kept in a new temporary file that the error names."""
    from aotune.errors import CalibrationError
    from aotune.hwspecs import calibrate as cal
    from aotune.hwspecs.spec import load_spec_file, load_target

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the kept file goes
    spec = load_target("znver3")
    c = cal.named(cal.Calibration(spec, {p: "assumed: test" for p in spec.field_paths()}), "me")
    out = tmp_path / "out"
    out.mkdir()
    path = out / "me.toml"
    cal.check_output(str(path), force=False)
    path.write_text("hand edited\n")  # while the probes ran
    with pytest.raises(CalibrationError, match="exists; pass --force") as e:
        cal.write_spec(c, str(path), force=False)
    assert path.read_text() == "hand edited\n"
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("aotune-calibrated-")]
    assert len(kept) == 1 and str(kept[0]) in str(e.value)
    assert load_spec_file(kept[0]) == c.spec
