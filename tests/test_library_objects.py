"""The library's objects alone: one kernel object + the runtime, linked by the system's compiler,
called through ctypes exactly as a C program calls it."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest
from aotune.analysis.workload import build_workload
from aotune.artifact.backends import numpy_reference
from aotune.artifact.cpu import compile_library_kernel, compile_runtime
from aotune.artifact.runtime import ERROR_CODES, ERRORS, UNKNOWN_ERROR
from aotune.codegen.runner import tolerance
from aotune.codegen.schedule import schedule_from_config
from aotune.constraints.cpu import build_cpu_space
from aotune.hwspecs.spec import load_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "12"))
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
needs_cc = pytest.mark.skipif(CC is None, reason="no C compiler to link a shared object")
small = st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31])


def _link(tmp_path, name, workload, schedule, hw):
    obj = compile_library_kernel(name, workload, schedule, hw)
    (tmp_path / f"{name}.o").write_bytes(obj.object_code)
    (tmp_path / "rt.o").write_bytes(compile_runtime(hw))
    so = tmp_path / f"lib{name}.so"
    subprocess.run(
        [CC, "-shared", "-o", str(so), str(tmp_path / f"{name}.o"), str(tmp_path / "rt.o")]
        + ["-lpthread"],
        check=True,
    )
    lib = ctypes.CDLL(str(so), mode=ctypes.RTLD_LOCAL)
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * len(obj.params)
    lib.aotune_strerror.restype = ctypes.c_char_p
    return lib, fn, obj


def _unaligned(shape, rng):
    """Random float32 data whose first element sits 4 bytes past a 64-byte boundary."""
    n = int(np.prod(shape))
    raw = np.empty(n + 32, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4 + 1
    view = raw[start : start + n].reshape(shape)
    view[...] = rng.uniform(-1, 1, shape)
    return view


def workloads(draw_sizes):
    return st.one_of(
        st.builds(lambda m, n, k: build_workload("matmul", f"{m}x{n}x{k}"), small, small, small),
        st.builds(
            lambda m, n, k, act: build_workload("dense", f"{m}x{n}x{k}", bias=True, activation=act),
            small,
            small,
            small,
            st.sampled_from(["relu", "gelu", "sigmoid", "none"]),
        ),
        st.builds(
            lambda b, m, n, k: build_workload("batch_matmul", f"{b}x{m}x{n}x{k}"),
            st.sampled_from([1, 3]),
            small,
            small,
            small,
        ),
        st.builds(
            lambda c, hw_, k, pad, stride, layout: build_workload(
                "conv2d",
                f"1,{c},{hw_},{hw_},{k},3,3",
                pad=pad,
                stride=stride,
                layout=layout,
            ),
            st.sampled_from([1, 3, 8]),
            st.sampled_from([3, 5, 9]),
            st.sampled_from([1, 5, 16]),
            st.sampled_from([0, 1]),
            st.sampled_from([1, 2]),
            st.sampled_from(["NCHW", "NHWC"]),
        ),
        st.builds(
            lambda c, hw_, layout: build_workload(
                "depthwise_conv2d", f"1,{c},{hw_},{hw_},3,3", pad=1, layout=layout
            ),
            st.sampled_from([1, 4, 17]),
            st.sampled_from([3, 7]),
            st.sampled_from(["NCHW", "NHWC"]),
        ),
    )


@needs_cc
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(w=workloads(small), seed=st.integers(0, 1 << 16))
def test_library_function_matches_numpy_for_any_config(tmp_path_factory, w, seed):
    """Any valid config of any operator, linked as a library function, matches numpy on
    unaligned inputs, with one thread, with more threads than shares and after a shutdown."""
    hw = load_target("host")
    space = build_cpu_space(w, hw)
    (cfg,) = space.sample(1, seed=seed)
    sched = schedule_from_config(space, cfg)
    tmp = tmp_path_factory.mktemp("lib")
    lib, fn, obj = _link(tmp, "kern", w, sched, hw)
    rng = np.random.default_rng(seed)
    inputs = [_unaligned(p.shape, rng) for p in obj.params if p.role != "out"]
    ref = numpy_reference(w, inputs)
    red = int(np.prod([lp.extent for lp in w.loops if lp.kind == "reduction"]))
    tol = tolerance(inputs[0], inputs[1], red, ref if w.epilogue.active else None)
    try:
        for threads in (1, 3, 1):
            assert lib.aotune_set_num_threads(threads) == 0
            out = _unaligned(obj.params[-1].shape, rng)
            out[...] = np.nan  # every element must be written
            rc = fn(*[a.ctypes.data for a in inputs], out.ctypes.data)
            assert rc == 0
            err = float(np.abs(out - ref).max())
            assert np.isfinite(out).all() and err <= tol, (space.describe_config(cfg), err, tol)
            lib.aotune_shutdown()  # a later call starts the workers again
    finally:
        lib.aotune_shutdown()


@needs_cc
def test_return_codes_and_strerror(tmp_path):
    hw = load_target("host")
    w = build_workload("dense", "9x20x7", bias=True)
    space = build_cpu_space(w, hw)
    lib, fn, obj = _link(tmp_path, "ffn", w, schedule_from_config(space, space.solve()), hw)
    a, b, bias, c = (np.ones(p.shape, np.float32) for p in obj.params)
    assert [p.role for p in obj.params] == ["in0", "in1", "bias", "out"]
    ptrs = [x.ctypes.data for x in (a, b, bias, c)]
    assert fn(*ptrs) == 0
    np.testing.assert_allclose(c, 8.0)
    for i in range(4):  # any NULL pointer is refused before anything runs
        bad = list(ptrs)
        bad[i] = None
        assert fn(*bad) == ERROR_CODES["AOTUNE_ERR_NULL"]
    # an output overlapping an input: refused (one element of overlap is enough)
    big = np.zeros(a.size + c.size, np.float32)
    overlapping = [big.ctypes.data, ptrs[1], ptrs[2], big.ctypes.data + 4 * (a.size - 1)]
    assert fn(*overlapping) == ERROR_CODES["AOTUNE_ERR_OVERLAP"]
    adjacent = [big.ctypes.data, ptrs[1], ptrs[2], big.ctypes.data + 4 * a.size]
    assert fn(*adjacent) == 0
    assert lib.aotune_set_num_threads(0) == ERROR_CODES["AOTUNE_ERR_THREADS"]
    assert lib.aotune_set_num_threads(2) == 0 and lib.aotune_get_num_threads() == 2
    for code, (_, text) in enumerate(ERRORS):
        assert lib.aotune_strerror(code).decode() == text
    assert lib.aotune_strerror(99).decode() == UNKNOWN_ERROR
    lib.aotune_shutdown()


def defined_globals(obj: bytes) -> set[str]:
    """Names of the global (or weak) symbols an ELF64 little-endian object defines."""
    import struct

    (shoff,) = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum, _ = struct.unpack_from("<HHH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab_sec = sections[sec[6]]
        strtab = obj[strtab_sec[4] : strtab_sec[4] + strtab_sec[5]]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, st_info, st_other, st_shndx = struct.unpack_from("<IBBH", obj, off)
            if st_info >> 4 in (1, 2) and st_shndx != 0:  # GLOBAL or WEAK, defined here
                names.add(strtab[st_name : strtab.index(b"\0", st_name)].decode())
    return names


def test_kernel_objects_export_only_their_function():
    """Internal symbols (micro-kernels, packing, shares, buffers) never clash between kernels:
    a kernel's object defines its function and the record of the shapes it was built for (which
    aotune.load checks the manifest against), nothing else."""
    hw = load_target("host")
    w = build_workload("conv2d", "1,4,6,6,8,3,3", pad=1)
    space = build_cpu_space(w, hw)
    obj = compile_library_kernel("conv_a", w, schedule_from_config(space, space.solve()), hw)
    assert defined_globals(obj.object_code) == {"conv_a", "aotune.interface.conv_a"}
    runtime_syms = defined_globals(compile_runtime(hw))
    assert {"aotune_set_num_threads", "aotune_shutdown", "aotune_strerror"} <= runtime_syms
    assert all(s.startswith(("aotune_", "__aotune_")) for s in runtime_syms)
