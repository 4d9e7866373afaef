from __future__ import annotations

import re
from pathlib import Path

import pytest
from aotune.errors import HwSpecError
from aotune.hwspecs.spec import SPEC_DIR, builtin_names, load_spec_file, load_target


def test_builtin_specs_load_with_the_facts_the_issue_names():
    assert {"skylake-avx512", "haswell", "neoverse-n1"} <= set(builtin_names())
    skx = load_target("skylake-avx512")
    assert (skx.isa.vector_registers, skx.isa.vector_bits, skx.core.fma_units) == (32, 512, 2)
    assert skx.cache(1).size_kib == 32 and skx.cache(2).size_kib == 1024
    assert load_target("haswell").isa.vector_registers == 16
    n1 = load_target("neoverse-n1")
    assert (n1.isa.arch, n1.isa.vector_registers, n1.isa.vector_bits) == ("aarch64", 32, 128)


def _spec_text() -> str:
    return (SPEC_DIR / "haswell.toml").read_text()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda t: t.replace("vector_registers = 16\n", ""),
            "missing key 'vector_registers' (integer)",
        ),
        (
            lambda t: t.replace("vector_registers", "vector_regsiters"),
            "unknown key 'vector_regsiters'",
        ),
        (lambda t: t.replace("vector_bits = 256", 'vector_bits = "wide"'), "expected integer"),
        (lambda t: re.sub(r"\[memory\][^\[]*", "", t), "missing key 'memory' (table)"),
        (
            lambda t: t.replace("usable_fraction = 0.8", "usable_fraction = 1.5"),
            "usable_fraction = 1.5 is out of range; allowed 0.01..1",
        ),
        (lambda t: t + "\n[[[", "not valid TOML"),
        (lambda t: "", "missing key 'kind' ('cpu' or 'gpu')"),
        (
            lambda t: t.replace("size_kib = 8192", "size_kib = 128"),
            "cache L3 (128 KiB) is smaller than L2 (256 KiB)",
        ),
        (
            lambda t: t.replace("latency_cycles = 12", "latency_cycles = 2"),
            "cache L2's latency (2 cycles) is below L1's (4)",
        ),
        (
            lambda t: t.replace("latency_cycles = 230", "latency_cycles = 20"),
            "memory.latency_cycles (20) is below cache L3's latency (40)",
        ),
        (
            lambda t: t.replace("misses_in_flight = 10\n", ""),
            "missing key 'misses_in_flight' (number)",
        ),
        (
            lambda t: t.replace("misses_in_flight = 10", "misses_in_flight = 0.5"),
            "misses_in_flight = 0.5 is out of range; allowed 1..1024",
        ),
        (
            lambda t: t.replace("shared_by_cores = 4", "shared_by_cores = 9"),
            "cache L3 is shared by 9 cores, more than the 4 the spec has",
        ),
        (
            lambda t: t.replace("fma_width_bits = 256", "fma_width_bits = 512"),
            "core.fma_width_bits = 512 is wider than isa.vector_bits = 256",
        ),
        (
            lambda t: t.replace("vector_bits = 256", "vector_bits = 512").replace(
                "fma_width_bits = 256", "fma_width_bits = 512"
            ),
            "isa.vector_bits = 512, but isa.llvm_features (+avx2,+fma) does not give +avx512f",
        ),
        (
            lambda t: t.replace('description = "', 'description = "two\\u001b[2Jlines ', 1),
            "description holds the control character U+001B (an escape)",
        ),
        (  # a bidirectional override is not an escape: the message names what it is
            lambda t: t.replace('description = "', 'description = "ab\\u202e', 1),
            "description holds the control character U+202E (RIGHT-TO-LEFT OVERRIDE)",
        ),
        (
            lambda t: t.replace("vector_registers = 16", "vector_registers = 64"),
            "isa.vector_registers = 64, but x86_64 names only 32",
        ),
        (
            lambda t: t.replace("general_registers = 16", "general_registers = 31"),
            "isa.general_registers = 31, but x86_64 names only 16",
        ),
        (
            lambda t: t.replace("size_kib = 8192", "size_kib = 99999999"),
            "allowed 1..1048576",
        ),
        (
            lambda t: t.replace('kind = "cpu"', 'kind = "gpu"'),
            "kind = 'gpu', but its caches, core, isa, origin, overhead belong to a cpu spec",
        ),
        (  # the object code is read as ELF64: another OS's triple failed only at the reader
            lambda t: t.replace("x86_64-unknown-linux-gnu", "x86_64-pc-windows-msvc"),
            "isa.triple 'x86_64-pc-windows-msvc' is not a 64-bit Linux triple",
        ),
        (
            lambda t: t.replace("x86_64-unknown-linux-gnu", "x86_64-unknown-linux-gnux32"),
            "is not a 64-bit Linux triple",
        ),
        (  # hw show and tune print origins: an escape in one would reach the terminal
            lambda t: t.replace("[origin]\n", '[origin]\ncore_model = "\\u001b]0;x\\u0007"\n'),
            "origin.'core_model': holds the control character U+001B (an escape)",
        ),
        (
            lambda t: t.replace("[origin]\n", '[origin]\n"core.cores" = "two\\r\\nlines"\n'),
            "origin.'core.cores': holds the control character U+000D (a carriage return)",
        ),
        (  # a typo in an origin key leaves the value it was meant for without an origin
            lambda t: t.replace("[origin]\n", '[origin]\n"core.frequency_ghx" = "datasheet"\n'),
            "[origin] key 'core.frequency_ghx' names no value of the spec",
        ),
    ],
)
def test_broken_spec_names_file_key_and_type(tmp_path: Path, mutate, expected):
    path = tmp_path / "broken.toml"
    path.write_text(mutate(_spec_text()))
    with pytest.raises(HwSpecError) as info:
        load_spec_file(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_unknown_target_lists_known_ones():
    with pytest.raises(HwSpecError, match="unknown target 'pentium'.*haswell"):
        load_target("pentium")


@pytest.mark.parametrize("name", ["H100", "Znver5", "HOST"])
def test_a_built_in_name_in_the_wrong_case_is_pointed_to(name: str):
    with pytest.raises(HwSpecError, match=f"did you mean {name.lower()}"):
        load_target(name)


def test_host_detection_reads_cores_and_caches(host):
    import os

    assert host.core.cores == len(os.sched_getaffinity(0))
    assert host.isa.vector_bits in (128, 256, 512)
    assert host.cache(1).size_kib >= 16
    assert host.name == "host"


def test_a_spec_saved_with_a_byte_order_mark_or_another_suffix_loads(tmp_path: Path, monkeypatch):
    """Editors that save a UTF-8 byte-order mark, and spec files named *.txt, are still specs."""
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + _spec_text().encode())
    assert load_spec_file(bom) == load_spec_file(SPEC_DIR / "haswell.toml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text(_spec_text())
    assert load_target("mine.txt") == load_spec_file(SPEC_DIR / "haswell.toml")


def test_an_unknown_llvm_cpu_says_where_to_find_a_known_one(tmp_path: Path):
    path = tmp_path / "cpu.toml"
    path.write_text(_spec_text().replace('llvm_cpu = "haswell"', 'llvm_cpu = "qqqqqqq"'))
    with pytest.raises(HwSpecError, match="not a CPU LLVM knows.*'aotune hw show host' names"):
        load_spec_file(path)
    path.write_text(_spec_text().replace('llvm_cpu = "haswell"', 'llvm_cpu = "haswel"'))
    with pytest.raises(HwSpecError, match="did you mean haswell"):
        load_spec_file(path)


@pytest.mark.parametrize(
    "spec, features",
    [
        ("skylake-avx512", "+avx512bw,+avx512vl,+avx512dq"),  # each implies avx512f
        ("skylake-avx512", "-prefer-256-bit"),  # a tuning flag: the CPU name decides
        ("haswell", "+fma,+f16c"),  # fma implies avx
    ],
)
def test_vector_features_implied_by_others_are_accepted(tmp_path: Path, spec, features):
    text = (SPEC_DIR / f"{spec}.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(re.sub(r'llvm_features = ".*"', f'llvm_features = "{features}"', text))
    assert load_spec_file(path).isa.llvm_features == features


@pytest.mark.parametrize(
    "spec, feature, why",
    [
        ("haswell", "-sse2", "passes and returns floats in SSE registers"),
        ("haswell", "-sse", "passes and returns floats in SSE registers"),
        ("haswell", "+soft-float", "no floating-point registers"),  # LLVM aborted the process
        ("znver4", "+egpr", "capstone"),  # ranked as "no FMA instruction found"
        ("znver4", "+ndd", "capstone"),
        ("neoverse-n1", "-neon", "NEON vectors"),
    ],
)
def test_features_no_kernel_can_use_are_refused_by_name(tmp_path: Path, spec, feature, why):
    text = (SPEC_DIR / f"{spec}.toml").read_text()
    path = tmp_path / "f.toml"
    path.write_text(re.sub(r'llvm_features = "(.*)"', rf'llvm_features = "\1,{feature}"', text))
    with pytest.raises(HwSpecError) as info:
        load_spec_file(path)
    said = str(info.value)
    assert f"isa.llvm_features has {feature}, which aotune cannot use" in said and why in said
    assert "remove it" in said


def test_host_features_aotune_cannot_use_are_left_off():
    from aotune.hwspecs.host import usable_host_features

    on = {"avx512f": True, "egpr": True, "ndd": False, "fma": True}
    assert usable_host_features(on, "x86_64") == {
        "avx512f": True,
        "egpr": False,
        "ndd": False,
        "fma": True,
    }
    assert usable_host_features({"neon": True}, "aarch64") == {"neon": True}


def test_a_cpu_name_that_does_not_give_the_vector_width_is_refused(tmp_path: Path):
    """With no vector extension listed the CPU name decides the code: LLVM is asked what it
    gives (a Haswell said to have 512-bit vectors would get ymm code timed as zmm code)."""
    plain = _spec_text().replace('llvm_features = "+avx2,+fma"', 'llvm_features = ""')
    path = tmp_path / "plain.toml"
    path.write_text(plain)
    assert load_spec_file(path).isa.vector_bits == 256  # haswell's own width: accepted
    wide = plain.replace("vector_bits = 256", "vector_bits = 512").replace(
        "vector_registers = 16", "vector_registers = 32"
    )
    path.write_text(wide.replace("fma_width_bits = 256", "fma_width_bits = 512"))
    said = r"vector_bits = 512, but LLVM's code for isa.llvm_cpu 'haswell' with isa.llvm_features"
    with pytest.raises(HwSpecError, match=said + r" '' uses 256-bit vectors; set vector_bits"):
        load_spec_file(path)
    path.write_text(plain.replace('llvm_cpu = "haswell"', 'llvm_cpu = "x86-64"'))
    with pytest.raises(HwSpecError, match="uses 128-bit vectors; set vector_bits = 128"):
        load_spec_file(path)


@pytest.mark.parametrize(
    "name, fmas",
    [("emeraldrapids", 2.0), ("znver5", 2.0), ("znver4", 1.0), ("haswell", 2.0)],
)
def test_vector_fmas_per_cycle_is_the_pipes_at_the_widest_vector(name: str, fmas: float):
    """Zen 4's two 256-bit pipes take one 512-bit FMA a cycle between them; the others' pipes
    are as wide as their vectors."""
    assert load_target(name).vector_fmas_per_cycle == fmas


def test_a_built_in_name_typed_as_a_file_that_is_not_there_is_pointed_to_the_name(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HwSpecError, match=r"'haswell.toml' here; .* named haswell, without"):
        load_target("haswell.toml")
    (tmp_path / "haswell.toml").write_text((SPEC_DIR / "haswell.toml").read_text())
    assert load_target("haswell.toml").name == "haswell"  # a file of that name is the user's
