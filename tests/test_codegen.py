from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from aotune.analysis.features import elf_functions, kernel_features, tile_of_function
from aotune.analysis.model import mix_from_schedule
from aotune.analysis.workload import dense, matmul
from aotune.codegen.compile import compile_kernel
from aotune.codegen.runner import (
    PAGE_BYTES,
    HostKernel,
    aligned_copy,
    check_against_numpy,
    numpy_reference,
    random_operands,
)
from aotune.codegen.schedule import (
    column_vector_widths,
    rows_l1_keeps_ahead,
    schedule_from_config,
)
from aotune.constraints.cpu import build_cpu_space
from aotune.errors import FinalCheckError
from aotune.hwspecs.host import host_can_run
from aotune.hwspecs.spec import load_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# AOTUNE_TEST_EXAMPLES raises the number of drawn cases for a long local run (CI keeps the default).
EXAMPLES = int(os.environ.get("AOTUNE_TEST_EXAMPLES", "30"))
awkward = st.one_of(
    st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 61, 64, 97]), st.integers(1, 130)
)
x86_targets = [t for t in ("host", "skylake-avx512", "haswell") if host_can_run(load_target(t))[0]]


@pytest.mark.skipif(not x86_targets, reason="no target this host can run")
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    M=awkward,
    N=awkward,
    K=awkward,
    seed=st.integers(0, 1 << 20),
    target=st.sampled_from(x86_targets or ["host"]),
)
def test_every_generated_kernel_matches_numpy(M, N, K, seed, target):
    hw = load_target(target)
    space = build_cpu_space(matmul(M, N, K), hw)
    (cfg,) = space.sample(1, seed=seed)
    kernel = compile_kernel(schedule_from_config(space, cfg), hw)
    a, b, _ = random_operands(kernel.schedule, seed)
    hk = HostKernel(kernel, hw)
    correct, err, tol = check_against_numpy(hk, a, b)
    assert correct, f"{space.describe_config(cfg)}: max error {err} > {tol}"
    # a second call reuses the workspaces: on other operands it must not keep the first's values
    a2, b2, _ = random_operands(kernel.schedule, seed + 1)
    correct, err, tol = check_against_numpy(hk, a2, b2)
    assert correct, f"{space.describe_config(cfg)}, second call: max error {err} > {tol}"
    # the result is written, not added: an output buffer that holds garbage (a reused ``out``, the
    # timing loop's buffer) gives the same C as a fresh one of zeros
    assert_overwrites_out(hk, a2, b2)


def assert_overwrites_out(
    hk: HostKernel, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None
) -> None:
    """The kernel into an ``out`` full of NaN gives exactly what it gives into a fresh one:
    every element of C is stored, none read before it is (a kernel that adds its first k block
    to C passes every check on a zeroed output)."""
    want = hk(a, b, bias)
    dirty = np.full(want.shape, np.nan, np.float32)
    assert hk(a, b, bias, out=dirty) is dirty
    np.testing.assert_array_equal(dirty, want)


def test_read_only_masked_and_misplaced_operands():
    """Addresses come from ctypes' buffer view, which refuses read-only arrays: those take
    numpy's route and compute the same; a mask is honoured or refused, never dropped."""
    hw = load_target("host")
    space = build_cpu_space(matmul(13, 21, 9), hw)
    (cfg,) = space.sample(1, seed=3)
    hk = HostKernel(compile_kernel(schedule_from_config(space, cfg), hw), hw)
    a, b, _ = random_operands(hk.kernel.schedule, 3)
    want = hk(a, b)
    np.testing.assert_allclose(want, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    ro_a, ro_b = a.copy(), b.copy()
    ro_a.flags.writeable = ro_b.flags.writeable = False
    np.testing.assert_array_equal(hk(ro_a, ro_b), want)
    np.testing.assert_array_equal(hk(np.ma.masked_array(a), b), want)  # nothing masked
    with pytest.raises(FinalCheckError, match="mask cannot be honoured"):
        hk(np.ma.masked_array(a, mask=np.eye(13, 9, dtype=bool)), b)
    ro_out = np.zeros_like(want)
    ro_out.flags.writeable = False
    with pytest.raises(FinalCheckError, match="read-only"):
        hk(a, b, out=ro_out)
    odd = np.zeros(want.size * 4 + 1, np.uint8)[1:].view(np.float32).reshape(want.shape)
    with pytest.raises(FinalCheckError, match="not aligned"):
        hk(a, b, out=odd)


class _OneElementOff(HostKernel):
    """A kernel whose output is finite but wrong in one element."""

    def __call__(self, *args: np.ndarray | None) -> np.ndarray:
        c = super().__call__(*args)
        c[3, 5] += 1.0
        return c


def test_non_finite_or_wrong_results_are_caught():
    hw = load_target("host")
    space = build_cpu_space(matmul(8, 16, 8), hw)
    kernel = compile_kernel(schedule_from_config(space, space.solve()), hw)
    a, b, _ = random_operands(kernel.schedule)
    assert check_against_numpy(HostKernel(kernel, hw), a, b)[0]
    correct, err, tol = check_against_numpy(_OneElementOff(kernel, hw), a, b)
    assert not correct and err > tol and err == pytest.approx(1.0, abs=1e-3)
    a[0, 0] = np.nan
    correct, _, _ = check_against_numpy(HostKernel(kernel, hw), a, b)
    assert not correct


def test_measured_operands_start_on_a_page_or_a_cache_line():
    """The model assumes line-aligned operands, and large ones at one offset within a page; the
    measured ones are (numpy promises only 16 B): a page for a page or more, else a line."""
    hw = load_target("host")
    N = max(1000, 4 * PAGE_BYTES // 13)  # B (13 x N) spans pages on any page size
    space = build_cpu_space(matmul(37, N, 13), hw)
    sched = schedule_from_config(space, space.solve())
    a, b, _ = random_operands(sched, 3)
    hk = HostKernel(compile_kernel(sched, hw), hw)
    c = hk(a, b)
    out = aligned_copy(np.zeros((37, N), np.float32))  # the bench's output buffer
    assert a.nbytes < PAGE_BYTES <= min(b.nbytes, c.nbytes)
    for x, align in ((a, 64), (b, PAGE_BYTES), (c, PAGE_BYTES), (out, PAGE_BYTES)):
        assert x.ctypes.data % align == 0 and x.flags.c_contiguous and x.dtype == np.float32
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    # a user's arrays may start anywhere a float can: the kernel is as correct there, only slower
    for shift in (1, 2, 3):
        a_off = np.empty(a.size + shift, np.float32)[shift:].reshape(a.shape)
        b_off = np.empty(b.size + shift, np.float32)[shift:].reshape(b.shape)
        a_off[...], b_off[...] = a, b
        assert a_off.ctypes.data % 16 and b_off.ctypes.data % 16  # not even numpy's alignment
        np.testing.assert_allclose(hk(a_off, b_off), a @ b, rtol=1e-4, atol=1e-4)


def test_cross_compiles_for_aarch64_without_running():
    hw = load_target("neoverse-n1")
    space = build_cpu_space(matmul(64, 64, 64), hw)
    cfg = space.parse_config(
        "mr=4,nr=16,kc=64,mc=16,nc=64,order=nkm,pack_a=1,pack_b=1,unroll=2,par=m,threads=4"
    )
    kernel = compile_kernel(schedule_from_config(space, cfg), hw)
    assert kernel.triple.startswith("aarch64")
    assert "fmla" in kernel.asm
    assert "ukernel_4x16" in elf_functions(kernel.object_code)
    feats = kernel_features(kernel, "aarch64")
    assert feats.loop.fma % (4 * 4) == 0 and feats.loop.fma > 0
    if not host_can_run(hw)[0]:
        with pytest.raises(FinalCheckError, match="aarch64"):
            HostKernel(kernel, hw)


@pytest.mark.parametrize("target", ["znver5", "skylake-avx512"])
def test_a_pack_copies_one_element_at_a_time_not_by_scatters(target):
    """A's pack stores each element mr floats from the last: LLVM made those stores scatters, which
    ran slower than a scalar copy (Zen 5, 2048^3, 6 x 64 tiles repacked per row block: 268 ->
    403 GFLOP/s side by side). The copy is its own function, the only one kept scalar; a one-row
    pack is contiguous and keeps its vectors."""
    hw = load_target(target)
    space = build_cpu_space(matmul(96, 256, 256), hw)
    cfg = "mr={},nr=32,kc=64,mc={},nc=64,order=nkm,pack_a=1,pack_b=1,unroll=2,par=m,threads=1"
    strided = compile_kernel(schedule_from_config(space, space.parse_config(cfg.format(6, 6))), hw)
    assert "vscatter" not in strided.asm
    assert {"pack_a", "ukernel_6x32"} <= set(elf_functions(strided.object_code))
    assert "noimplicitfloat" in strided.llvm_ir
    one_row = compile_kernel(schedule_from_config(space, space.parse_config(cfg.format(1, 8))), hw)
    assert "noimplicitfloat" not in one_row.llvm_ir


def test_x86_features_count_the_micro_kernel_fmas():
    hw = load_target("skylake-avx512")
    space = build_cpu_space(matmul(128, 128, 128), hw)
    cfg = space.parse_config(
        "mr=6,nr=32,kc=128,mc=48,nc=128,order=nkm,pack_a=1,pack_b=1,unroll=4,par=m,threads=2"
    )
    kernel = compile_kernel(schedule_from_config(space, cfg), hw)
    loop = kernel_features(kernel, "x86_64").loop
    assert loop.function == "ukernel_6x32"
    assert loop.fma > 0 and loop.fma % 12 == 0  # 6 rows x 2 vectors per k step
    assert loop.spills == 0
    assert "zmm" in kernel.asm


def test_column_tails_use_the_narrowest_vector_that_holds_them():
    from aotune.analysis.workload import dense
    from aotune.codegen.schedule import column_vector_widths

    assert column_vector_widths(49, 16) == (16, 16, 16, 1)
    assert column_vector_widths(20, 16) == (16, 4)
    assert column_vector_widths(5, 16) == (8,)
    assert column_vector_widths(32, 16) == (16, 16)
    assert column_vector_widths(3, 4) == (4,)
    hw = load_target("skylake-avx512")
    space = build_cpu_space(matmul(8, 17, 8), hw)
    cfg = space.parse_config(
        "mr=2,nr=16,kc=8,mc=8,nc=32,order=nkm,pack_a=0,pack_b=0,unroll=1,par=m,threads=1"
    )
    funcs = elf_functions(compile_kernel(schedule_from_config(space, cfg), hw).object_code)
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    tail = [f"{i.mnemonic} {i.op_str}" for i in md.disasm(funcs["ukernel_2x1"], 0)]
    assert any(t.startswith("vfmadd") and t.split()[0].endswith("ss") for t in tail), (
        tail
    )  # one lane: scalar FMA
    assert not any("zmm" in t for t in tail)
    if not host_can_run(hw)[0]:
        pytest.skip("the assembly is checked; running it needs AVX-512")
    # every tail width, masked and not, with each epilogue on the narrow vectors, against numpy
    for n, act in (
        (1, "relu"),
        (2, "gelu"),
        (3, "sigmoid"),
        (4, "none"),
        (7, "gelu"),
        (8, "relu"),
        (13, "sigmoid"),
        (20, "gelu"),
        (49, "relu"),
    ):
        sp = build_cpu_space(dense(5, n, 11, bias=True, activation=act), hw)
        for c in sp.sample(2, seed=n):
            hk = HostKernel(compile_kernel(schedule_from_config(sp, c), hw), hw)
            a, b, bias = random_operands(hk.kernel.schedule, n)
            correct, err, tol = check_against_numpy(hk, a, b, bias)
            assert correct, f"N={n} {act} {sp.describe_config(c)}: {err} > {tol}"


@pytest.mark.skipif(not x86_targets, reason="no target this host can run")
@pytest.mark.parametrize("act", ["relu", "gelu", "sigmoid", "none"])
def test_a_nan_in_an_input_row_stays_nan_through_every_activation(act):
    """numpy keeps a NaN through each activation (``np.maximum(nan, 0)`` is nan); the kernel's
    epilogue must too: a relu built on maxnum returned 0 there, a silently wrong output."""
    hw = load_target(x86_targets[0])
    space = build_cpu_space(dense(4, 13, 5, bias=True, activation=act), hw)
    for cfg in space.sample(3, seed=5):
        hk = HostKernel(compile_kernel(schedule_from_config(space, cfg), hw), hw)
        a, b, bias = random_operands(hk.kernel.schedule, 5)
        a[1, 2] = np.nan
        got, ref = hk(a, b, bias), numpy_reference(hk.kernel.schedule, a, b, bias)
        assert np.isnan(ref[1]).all()
        assert np.isnan(got[1]).all(), (act, space.describe_config(cfg), got[1])
        np.testing.assert_allclose(np.delete(got, 1, 0), np.delete(ref, 1, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not x86_targets, reason="no x86 host")
def test_a_spec_whose_cpu_name_implies_avx512_is_not_run_where_the_cpu_lacks_it():
    """A hand-edited spec, llvm_cpu 'znver4' but llvm_features '+avx2,+fma': LLVM emits
    AVX-512 for the CPU name, so the object code, not the feature string, says what the kernel
    needs; run on a CPU without it, the process would die of SIGILL with no message."""
    from aotune.analysis.features import x86_features_used
    from aotune.hwspecs.host import detect_host
    from aotune.hwspecs.spec_toml import with_value

    haswell = load_target("haswell")
    edited = with_value(haswell, "isa.llvm_cpu", "znver4")
    assert "avx512f" not in edited.isa.llvm_features
    space = build_cpu_space(matmul(8, 8, 8), edited)
    kernels = [compile_kernel(schedule_from_config(space, c), edited) for c in space.sample(8, 1)]
    # LLVM picks EVEX where it gains, e.g. an FMA with its broadcast folded in (``{1to8}``)
    kernel = next(k for k in kernels if "avx512f" in x86_features_used(k.object_code))
    plain = compile_kernel(kernel.schedule, haswell)
    assert "avx512f" not in x86_features_used(plain.object_code)
    if "+avx512f" in detect_host().isa.llvm_features.split(","):
        hk = HostKernel(kernel, edited)  # this CPU has it: the kernel runs, and is right
        assert check_against_numpy(hk, *random_operands(kernel.schedule, 1))[0]
    else:
        with pytest.raises(FinalCheckError, match="uses avx512f .* this CPU lacks"):
            HostKernel(kernel, edited)


def test_side_by_side_timing_keeps_each_functions_fastest_round():
    """A burst of other work during one round does not decide the time: a function that takes
    20 ms in its first round and 2 ms in its second is timed at its second round's median."""
    import time

    from aotune.codegen.runner import time_side_by_side

    calls = []

    def slow_then_fast() -> None:
        calls.append(1)
        time.sleep(0.02 if len(calls) <= 4 else 0.002)  # round 1: warm-up + 3 runs

    ((seconds, runs, spread),) = time_side_by_side(
        [slow_then_fast], min_runs=3, min_seconds=0.0, rounds=2, warmup_seconds=0.0
    )
    assert runs == 6
    assert 0.002 <= seconds < 0.01
    assert spread > 1.0  # the slow round still shows in the spread


def _fmas_in_loops(code: bytes) -> tuple[int, list[str]]:
    """(FMAs in ``code``'s loops, those of them with an index register in their memory
    operand)."""
    import capstone
    from aotune.analysis.features import ISA_TABLES, _loops
    from capstone import x86

    table = ISA_TABLES["x86_64"]
    md = capstone.Cs(table.cs_arch, table.cs_mode)
    md.detail = True
    insns = list(md.disasm(code, 0))
    loops = _loops(insns, table)
    fmas = [
        i
        for i in insns
        if i.mnemonic.startswith(table.fma_prefixes)
        and any(lo <= i.address <= hi for lo, hi in loops)
    ]
    indexed = [
        f"{i.mnemonic} {i.op_str}"
        for i in fmas
        if any(op.type == x86.X86_OP_MEM and op.mem.index != 0 for op in i.operands)
    ]
    return len(fmas), indexed


def test_indexed_fma_scan_finds_an_indexed_fma_in_a_loop():
    # vfmadd231ps zmm0, zmm10, dword ptr [rdi + rcx*4]{1to16}; jmp back to it
    looped = bytes.fromhex("62f22d58b8048febf7")
    fma = "vfmadd231ps zmm0, zmm10, dword ptr [rdi + rcx*4]{1to16}"
    assert _fmas_in_loops(looped) == (1, [fma])
    # the same FMA at base + displacement, and the indexed one outside any loop
    assert _fmas_in_loops(bytes.fromhex("62f22d58b84701ebf7")) == (1, [])
    assert _fmas_in_loops(bytes.fromhex("62f22d58b8048fc3")) == (0, [])


@settings(
    max_examples=max(1, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(seed=st.integers(0, 10_000), shape=st.sampled_from([(1024, 1024, 1024), (61, 127, 33)]))
def test_micro_kernel_fmas_read_memory_at_base_plus_displacement(seed, shape):
    # an FMA with an index register in its memory operand runs slower on Intel cores (README,
    # stop 91), so each operand is stepped in a register of its own (gathered A keeps one);
    # A read in place, k stride 1, is the case LLVM folded into an index
    hw = load_target("emeraldrapids")
    space = build_cpu_space(matmul(*shape), hw)
    in_place = space.parse_config(
        "mr=10,nr=16,kc=32,mc=10,nc=48,order=nkm,pack_a=0,pack_b=1,unroll=2,par=n,threads=1"
    )
    for i, cfg in enumerate([in_place, *space.sample(2, seed=seed)]):
        s = schedule_from_config(space, cfg)
        funcs = elf_functions(compile_kernel(s, hw).object_code)
        checked = []
        for name, code in funcs.items():
            tile = tile_of_function(name)
            if tile is None:
                continue
            fmas, indexed = _fmas_in_loops(code)
            # the k loop and its remainder as scheduled; a small loop LLVM unrolls further on
            # its own may still fold an index into the copies' addresses (README, stop 91)
            vectors = tile[0] * len(column_vector_widths(tile[1], s.lanes))
            if 0 < fmas <= vectors * (s.unroll + (s.unroll > 1)):
                checked.append(name)
                assert not indexed, (space.describe_config(cfg), name, indexed)
        assert i > 0 or f"ukernel_{s.mr}x{s.nr}" in checked  # A read in place, checked


@pytest.mark.skipif(not x86_targets, reason="no target this host can run")
def test_unpacked_b_rows_are_prefetched_ahead_and_counted_as_prefetches():
    hw = load_target(x86_targets[0])
    space = build_cpu_space(matmul(20, 1000, 300), hw)
    # three vectors of B per k step, as many rows as the host's vector registers hold beside them
    lanes = hw.isa.vector_bits // 32
    mr = 5 if hw.isa.vector_registers >= 32 else 3
    nr = 3 * lanes
    base = (f"mr={mr},nr={nr},kc=64,mc={4 * mr},nc={2 * nr},order=nkm,pack_a=0,unroll=1,par=m,"
            "threads=1")  # fmt: skip
    unpacked = schedule_from_config(space, space.parse_config(base + ",pack_b=0"))
    packed = schedule_from_config(space, space.parse_config(base + ",pack_b=1"))
    # prefetch_ahead_cycles ahead at mr x 3 FMAs per k step, at the core's FMA rate for the width,
    # as far as L1 keeps the rows fetched ahead (B rows 1000 elements apart)
    fma_rate = hw.core.fma_units * min(1.0, hw.core.fma_width_bits / hw.isa.vector_bits)
    steps = mr * 3 / fma_rate
    lead = -(-hw.memory.prefetch_ahead_cycles // steps)
    assert (
        unpacked.b_prefetch_rows == min(lead, rows_l1_keeps_ahead(hw, nr, 1000))
        and packed.b_prefetch_rows == 0
    )
    kernel = compile_kernel(unpacked, hw)
    per_row = -(-nr // 16)  # one prefetch per 64-byte line of the row
    assert kernel.asm.count("prefetcht0") >= per_row
    # a packed B is not prefetched; where kc is long enough for the host's tile, the kernel
    # prefetches its C tile instead (prefetchw, ``c_prefetch_steps``: AVX-512's wider tile)
    assert "prefetch" not in compile_kernel(dataclasses.replace(packed, c_prefetch_steps=0), hw).asm
    with_pf = kernel_features(kernel, "x86_64").loop
    without = kernel_features(
        compile_kernel(dataclasses.replace(unpacked, b_prefetch_rows=0), hw), "x86_64"
    ).loop
    # LLVM may unroll either loop further: counts are compared per k step
    ksteps, ksteps_without = with_pf.fma // (3 * mr), without.fma // (3 * mr)
    assert ksteps > 0 and ksteps_without > 0
    # a prefetch is counted as what it is, not as a load: it returns no data
    assert (
        with_pf.prefetches == per_row * ksteps
        and without.prefetches == 0
        and with_pf.scalar_loads * ksteps_without == without.scalar_loads * ksteps
        and with_pf.stores * ksteps_without == without.stores * ksteps
    )
    # the config-only mix counts the same prefetches per k step
    assert mix_from_schedule(unpacked, hw).prefetches == per_row
    assert mix_from_schedule(packed, hw).prefetches == 0
    a, b, _ = random_operands(unpacked, 1)
    assert check_against_numpy(HostKernel(kernel, hw), a, b)[0]
    # rows a whole L1 way apart (N=1024: 4 KiB) share one set group: prefetched into L2 instead,
    # unless this core's L2 prefetch fills L1 too
    aliasing_space = build_cpu_space(matmul(20, 1024, 300), hw)
    aliasing = schedule_from_config(aliasing_space, aliasing_space.parse_config(base + ",pack_b=0"))
    fills_l1 = hw.memory.l2_prefetch_fills_l1
    assert (unpacked.b_prefetch_level, aliasing.b_prefetch_level) == (1, 1 if fills_l1 else 2)
    assert ("prefetcht1" in compile_kernel(aliasing, hw).asm) != fills_l1
    assert "prefetcht1" not in kernel.asm


def test_b_rows_are_prefetched_no_further_ahead_than_their_l1_sets_keep_them():
    """A row fetched ahead is evicted by the next line fetched into its set: rows 1536 bytes apart
    fall in 8 of Zen 3's 64 L1 sets, one row in 8 per set, so 8 rows ahead; 2048 bytes apart in 2
    sets, 2; 64 bytes of rows 4000 bytes apart straddle two lines every other row, up to 2 lines
    per set in 64 rows, 32; rows 2112 bytes apart spread over all 64 sets and keep the full lead."""
    from aotune.codegen.schedule import b_prefetch_rows

    hw = load_target("znver3")
    assert [rows_l1_keeps_ahead(hw, 16, n) for n in (384, 512, 1000, 528)] == [8, 2, 32, 64]
    lead = b_prefetch_rows(hw, 6, 16, False)
    assert lead == 58 and b_prefetch_rows(hw, 6, 16, False, 528) == lead

    def prefetch(n: int, pack_a: int) -> int:
        space = build_cpu_space(matmul(96, n, 512), hw)
        cfg = (f"mr=6,nr=16,kc=128,mc=6,nc=144,order=nkm,pack_a={pack_a},pack_b=0,unroll=4,"
               "par=n,threads=1")  # fmt: skip
        return schedule_from_config(space, space.parse_config(cfg)).b_prefetch_rows

    assert (prefetch(384, 0), prefetch(384, 1), prefetch(528, 0)) == (8, 8, lead)
    # rows a whole way apart fall into one set; Zen 3's L2 prefetch fills L1 as well, so they are
    # prefetched into L1 and capped to one row ahead; on a core whose L2 prefetch stops at L2
    # they go there, the full lead ahead
    assert hw.memory.l2_prefetch_fills_l1 and rows_l1_keeps_ahead(hw, 16, 1024) == 1
    assert prefetch(1024, 0) == 1
    hw = dataclasses.replace(hw, memory=dataclasses.replace(hw.memory, l2_prefetch_fills_l1=False))
    assert prefetch(1024, 0) == lead


def test_small_tiles_count_the_prefetch_lead_in_fma_latencies():
    """A tile of fewer vector FMAs a k step than the pipes hold in flight runs a step per FMA
    latency, not per issue slot: 300 cycles ahead is 75 rows for a 1 x 16 or 3 x 16 tile on Zen 5
    (4-cycle FMAs), not 600 or 200 (Zen 5, 3 x 16 over rows 16 KiB apart, prefetched into L2:
    11.9 cycles a k step 200 rows ahead, 9.0 at 75). Tiles that fill the pipes keep theirs."""
    from aotune.codegen.schedule import b_prefetch_rows

    hw = load_target("znver5")
    ahead, latency = hw.memory.prefetch_ahead_cycles, hw.core.fma_latency_cycles
    assert (ahead, latency) == (300, 4)
    assert [b_prefetch_rows(hw, mr, 16, False) for mr in (1, 3, 8, 10)] == [75, 75, 75, 60]
    assert b_prefetch_rows(hw, 5, 32, False) == 60


@pytest.mark.parametrize("N", [1, 17, 33, 63, 1000])
def test_b_panels_copied_as_vectors_are_zero_past_n(N):
    """The vector copy masks the loads of B's last panel: columns past N must be packed as zeros
    (the micro-kernel multiplies all nr of them), and stale workspace must not leak in."""
    hw = load_target("host")
    if not host_can_run(hw)[0]:
        pytest.skip("host cannot run its own kernels")
    space = build_cpu_space(matmul(9, N, 21), hw)
    nr = hw.isa.vector_bits // 32  # one vector: the panel's last one is masked at N
    sched = schedule_from_config(
        space,
        space.parse_config(
            f"mr=3,nr={nr},kc=8,mc=9,nc={min(4 * nr, -(-N // nr) * nr)},"
            "order=mkn,pack_a=0,pack_b=1,unroll=1,par=m,threads=1"
        ),
    )
    assert sched.b_pack_copies_vectors
    hk = HostKernel(compile_kernel(sched, hw), hw)
    a, b, _ = random_operands(sched, 5)
    hk._ws[0][1][:] = np.nan  # a poisoned workspace: any column not written would show
    correct, err, tol = check_against_numpy(hk, a, b)
    assert correct, f"N={N}: max error {err} > {tol}"


@pytest.mark.skipif(not x86_targets, reason="no target this host can run")
@pytest.mark.parametrize("activation", ["gelu", "sigmoid"])
def test_activations_match_numpy_over_their_whole_input_range(activation):
    """The epilogue's exp is an inline polynomial, not libm: gelu and sigmoid of x = 1 * b[n] for
    x from -200 to 200 (the saturated ends, both sides of 0, tiny values, every vector lane)
    match numpy's float64 formulas to float32 accuracy; NaN stays NaN."""
    from aotune.analysis.workload import dense
    from aotune.codegen.runner import apply_activation

    hw = load_target(x86_targets[0])
    x = np.concatenate(
        [np.linspace(-200, 200, 4001), np.linspace(-3, 3, 6001), [0.0, 1e-30, -1e-30, 1e-7]]
    ).astype(np.float32)
    space = build_cpu_space(dense(1, x.size + 1, 1, bias=True, activation=activation), hw)
    hk = HostKernel(compile_kernel(schedule_from_config(space, space.solve()), hw), hw)
    b = np.append(x, np.float32("nan"))[None, :]
    got = hk(np.ones((1, 1), np.float32), b, np.zeros(x.size + 1, np.float32))[0]
    want = apply_activation(x.astype(np.float64), activation)
    # a few ulps of the result, plus what gelu's 1 + tanh(u) loses to cancellation where tanh is
    # near -1 (float32 eps of 1, times 0.5 |x|): the formula's, as with libm's expf before
    bound = 8 * np.spacing(np.abs(want).astype(np.float32)) + 1e-37
    if activation == "gelu":
        bound += np.finfo(np.float32).eps * np.abs(x)
    err = np.abs(got[:-1] - want)
    assert np.all(err <= bound), (x[np.argmax(err / bound)], (err / bound).max())
    assert np.isnan(got[-1])
    if activation == "sigmoid":  # where float32's e^-x overflows, numpy's float32 formula gives
        # 0 (the kernel gave 1 / (1 + e^88) = 6e-39 until stop 104)
        assert np.all(got[:-1][x < -88.73] == 0.0)


def _c_prefetches(kernel_ir: str, function: str) -> int:
    """Write prefetches (``llvm.prefetch`` with rw = 1) in one micro-kernel's LLVM IR."""
    body = kernel_ir.split(f'define internal void @"{function}"(')[1].split("\n}\n")[0]
    return body.count("i32 1, i32 3, i32 1)")


@pytest.mark.parametrize("K", [300, 97])
def test_a_call_long_enough_prefetches_its_c_tile_before_its_last_steps(K):
    """C is added and stored after the last k step; a call of kc >= the prefetch lead fetches its
    tile's lines that many steps before (two loops with the prefetches between), one per line of
    each row and the row's last element's; a shorter call does not. Either way the kernel matches
    numpy, with K's last block shorter than the lead (K = 300, kc = 256: 44 steps) and the tile's
    rows starting inside a line (N = 37)."""
    from aotune.codegen.schedule import c_prefetch_steps

    hw = load_target("haswell")
    space = build_cpu_space(matmul(13, 37, K), hw)
    lead = c_prefetch_steps(hw, 6, 16, 256)
    cycles_per_step = max(6 * 2 / hw.core.fma_units, hw.core.fma_latency_cycles)
    assert lead == -(-hw.memory.prefetch_ahead_cycles // cycles_per_step) and 44 < lead <= 97
    assert c_prefetch_steps(hw, 6, 16, lead - 1) == 0 and c_prefetch_steps(hw, 6, 16, lead) == lead
    kc = min(K, 256)
    cfg = f"mr=6,nr=16,kc={kc},mc=12,nc=32,order=nkm,pack_a=1,pack_b=1,unroll=8,par=m,threads=1"
    s = schedule_from_config(space, space.parse_config(cfg))
    assert s.c_prefetch_steps == (lead if kc >= lead else 0)
    kernel = compile_kernel(s, hw)
    # 16 columns from a row start inside a line span two lines: the first and the last element's
    assert _c_prefetches(kernel.llvm_ir, "ukernel_6x16") == (6 * 2 if s.c_prefetch_steps else 0)
    assert _c_prefetches(kernel.llvm_ir, "ukernel_1x5") == (1 * 2 if s.c_prefetch_steps else 0)
    assert ("klast" in kernel.llvm_ir) == bool(s.c_prefetch_steps)
    if host_can_run(hw)[0]:
        hk = HostKernel(kernel, hw)
        a, b, _ = random_operands(s, 3)
        correct, err, tol = check_against_numpy(hk, a, b)
        assert correct, f"{cfg}: max error {err} > {tol}"
        assert_overwrites_out(hk, a, b)


@pytest.mark.parametrize("M", [301, 37])
def test_a_pack_prefetches_rows_ahead_only_where_a_comes_from_beyond_the_last_level(M):
    """A's copy reads one row at a time; where A outgrows the last level's share of a core
    (Haswell: 1 MiB), it prefetches the row it copies two rows later (kc = 256 elements at a store
    a cycle, 300 cycles of lead), clipped to the block's last row. The kernel matches numpy with
    a partial last k block (1009 = 3 x 256 + 241) and an m tail (301 = 50 x 6 + 1)."""
    from aotune.codegen.schedule import a_pack_prefetch_rows

    hw = load_target("haswell")
    space = build_cpu_space(matmul(M, 37, 1009), hw)
    cfg = "mr=6,nr=16,kc=256,mc=24,nc=32,order=nkm,pack_a=1,pack_b=1,unroll=4,par=m,threads=2"
    s = schedule_from_config(space, space.parse_config(cfg))
    assert s.a_pack_prefetch_rows == (2 if M * 1009 * 4 > 1 << 20 else 0)
    assert a_pack_prefetch_rows(hw, True, 1, 16, 1 << 21) == -(-300 // 16)
    assert a_pack_prefetch_rows(hw, True, 7, 256, 1 << 21) == 0  # k not contiguous: no rows
    assert a_pack_prefetch_rows(hw, False, 1, 256, 1 << 21) == 0
    kernel = compile_kernel(s, hw)
    pack = kernel.llvm_ir.split('define internal void @"pack_a"(')[1].split("\n}\n")[0]
    assert ("i32 0, i32 3, i32 1)" in pack) == bool(s.a_pack_prefetch_rows)
    if host_can_run(hw)[0]:
        hk = HostKernel(kernel, hw)
        a, b, _ = random_operands(s, 5)
        correct, err, tol = check_against_numpy(hk, a, b)
        assert correct, f"{cfg}: max error {err} > {tol}"
