"""Where a target's core model comes from (issue 21): the host's own built-in spec, another CPU's
by vector ISA with a pointer to `hw calibrate`, or a calibration; said by `hw show`, by `tune`
and in its JSON (`target.core_model_from`)."""

from __future__ import annotations

import json
import re

import llvmlite.binding as llvm
import pytest
from aotune.cli import main
from aotune.errors import HwSpecError
from aotune.hwspecs import calibrate as cal
from aotune.hwspecs import host
from aotune.hwspecs.spec import SPEC_DIR, load_target
from aotune.hwspecs.spec_toml import field_paths, with_value
from aotune.search.database import spec_hash

X86 = {"avx2": True, "fma": True, "avx512f": True}


@pytest.mark.parametrize(
    "cpu, features, arch, base, says",
    [
        ("znver4", X86, "x86_64", "znver4", "its built-in spec: LLVM names this CPU znver4"),
        ("znver5", X86, "x86_64", "znver5", "its built-in spec: LLVM names this CPU znver5"),
        (
            "emeraldrapids",
            X86,
            "x86_64",
            "emeraldrapids",
            "its built-in spec: LLVM names this CPU emeraldrapids",
        ),
        ("znver6", X86, "x86_64", "skylake-avx512", "no built-in spec for znver6"),
        ("alderlake", {"avx2": True, "fma": True}, "x86_64", "haswell", "closest by vector ISA"),
        ("neoverse-v2", {"neon": True}, "aarch64", "neoverse-n1", "no built-in spec"),
    ],
)
def test_the_host_takes_its_own_spec_or_the_closest_and_says_which(cpu, features, arch, base, says):
    name, why = host._base_spec_name(cpu, features, arch)
    assert name == base and says in why
    if name != cpu:  # another CPU's core: say so, and what would measure this one's
        assert "not this CPU's" in why and "aotune hw calibrate" in why


def test_a_cpu_without_avx2_and_fma_is_refused_with_the_fix():
    with pytest.raises(HwSpecError, match="write a spec file for it and pass --target"):
        host._base_spec_name("bonnell", {"sse4.2": True}, "x86_64")


@pytest.fixture
def unknown_host(monkeypatch):
    """The host as LLVM would name an AVX-512 CPU aotune has no spec for."""
    if llvm.get_process_triple().split("-")[0] != "x86_64":
        pytest.skip("the host is not x86-64")
    if not dict(llvm.get_host_cpu_features()).get("avx512f"):
        pytest.skip("the host has no AVX-512")
    host.detect_host.cache_clear()
    monkeypatch.setattr(llvm, "get_host_cpu_name", lambda: "sapphirerapids")
    yield
    host.detect_host.cache_clear()


def test_an_unknown_host_says_whose_core_model_it_took_everywhere(unknown_host, capsys):
    spec = host.detect_host()
    assert spec.isa.llvm_cpu == "sapphirerapids"
    assert spec.core_model_from.startswith("skylake-avx512 (no built-in spec for sapphirerapids")
    assert main(["hw", "show", "host"]) == 0
    shown = capsys.readouterr().out
    assert f"core model: {spec.core_model_from}" in shown and "hw calibrate" in shown
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--no-verify"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["core_model_from"] == spec.core_model_from
    assert main(argv) == 0
    said = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert f"core model: {spec.core_model_from}" in said


def test_a_built_in_and_a_calibrated_target_name_their_own_core_model(tmp_path, capsys):
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--no-verify", "--json"]
    assert main([*argv, "--target", "haswell"]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["core_model_from"] == "haswell"
    spec = load_target("znver4")
    origin = {p: f"measured: a probe for {p}" for p in field_paths(spec)}
    origin["core_model"] = "calibrated by aotune hw calibrate on 2026-11-28 (AMD EPYC, znver4)"
    path = tmp_path / "mine.toml"
    cal.write_spec(cal.named(cal.Calibration(spec, origin), "mine"), str(path), force=False)
    assert main([*argv, "--target", str(path)]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert target["core_model_from"] == origin["core_model"] and target["name"] == "mine"
    # predict's and space's JSON name the target as tune's does
    config = "mr=4,nr=16,kc=16,mc=16,nc=16,order=nmk,pack_a=0,pack_b=0,unroll=1,par=n,threads=1"
    shape = ["matmul", "--shape", "16x16x16", "--target", str(path), "--json"]
    assert main(["predict", *shape, "--config", config]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == target
    assert main(["space", *shape]) == 0
    assert json.loads(capsys.readouterr().out)["target"] == target


def test_timings_set_against_another_cores_predictions_are_warned_about():
    """Timing this host against a built-in spec of another core (accuracy, tune's measured column,
    bench) says so, naming both cores and the fix; a spec of this core and a GPU's say nothing."""
    from aotune.benchmarks.measured import _warn_if_other_core

    here = host.detect_host()
    other = next(
        load_target(name)
        for name in ("haswell", "skylake-avx512", "znver4", "znver3")
        if load_target(name).isa.llvm_cpu != here.isa.llvm_cpu
    )
    text = host.other_core_warning(other, "the samples time")
    assert text and other.isa.llvm_cpu in text and here.isa.llvm_cpu in text
    assert "--target host" in text and "hw calibrate" in text
    assert host.other_core_warning(here, "the samples time") is None
    assert host.other_core_warning(load_target("a100"), "the samples time") is None
    said: list[str] = []
    _warn_if_other_core(other, said.append, "the configs time")
    _warn_if_other_core(here, said.append, "the configs time")
    assert len(said) == 1 and said[0].startswith(f"target {other.name} models")


def _copy_of(name: str, tmp_path, edit=lambda text: text, file: str = "copy.toml"):
    text = (SPEC_DIR / f"{name}.toml").read_text()
    path = tmp_path / file
    path.write_text(edit(text))
    return path


def test_an_edited_copy_of_a_built_in_says_what_it_changed(tmp_path, capsys):
    """A built-in spec copied to edit, its name kept: the values it changed name the built-in's,
    its core model is the file's (not the built-in's), everywhere the origin is shown; the text
    names no path, so the same content elsewhere keeps the same hash."""
    edit = lambda t: t.replace("tlb_miss_cycles = 10\n", "tlb_miss_cycles = 12\n")  # noqa: E731
    path = _copy_of("znver4", tmp_path, edit)
    spec, builtin = load_target(str(path)), load_target("znver4")
    assert spec.name == "znver4" and spec.memory.tlb_miss_cycles == 12
    assert spec.core_model_from == (
        "the spec file: the built-in znver4 with 1 value changed (memory.tlb_miss_cycles)"
    )
    assert spec.origin_of("memory.tlb_miss_cycles") == (
        "set in the spec file (the built-in znver4 has 10)"
    )
    assert spec.origin_of("core.frequency_ghz") == builtin.origin_of("core.frequency_ghz")
    elsewhere = load_target(str(_copy_of("znver4", tmp_path, edit, "other-name.toml")))
    assert spec_hash(elsewhere) == spec_hash(spec) != spec_hash(builtin)
    assert main(["hw", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"core model: {spec.core_model_from}" in shown
    assert "(the built-in znver4 has 10)" in shown
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--no-verify", "--json"]
    assert main([*argv, "--target", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["core_model_from"] == spec.core_model_from


def test_an_exact_copy_of_a_built_in_is_the_built_in(tmp_path):
    copy, builtin = load_target(str(_copy_of("znver4", tmp_path))), load_target("znver4")
    assert copy == builtin and copy.core_model_from == "znver4"


def test_a_copy_keeps_the_origins_it_states_itself(tmp_path):
    """A calibration renamed to a built-in's name keeps its own origins and core model: only
    claims the copy kept from the built-in are replaced."""
    spec = load_target("znver4")
    origin = {p: f"measured: a probe for {p}" for p in field_paths(spec)}
    origin["core_model"] = "calibrated by aotune hw calibrate on 2026-12-01 (AMD EPYC, znver4)"
    changed = with_value(spec, "memory.latency_cycles", 400)
    path = tmp_path / "cal.toml"
    cal.write_spec(cal.Calibration(changed, origin), str(path), force=False)
    loaded = load_target(str(path))
    assert loaded.name == "znver4" and loaded.memory.latency_cycles == 400
    assert loaded.core_model_from == origin["core_model"]
    said = loaded.origin_of("memory.latency_cycles")
    assert said == "measured: a probe for memory.latency_cycles"


def test_a_cpu_spec_named_like_a_built_in_gpu_says_whose_name_it_took(tmp_path):
    edit = lambda t: t.replace('name = "znver4"', 'name = "h200"')  # noqa: E731
    spec = load_target(str(_copy_of("znver4", tmp_path, edit)))
    assert spec.kind == "cpu" and spec.name == "h200"
    assert spec.core_model_from == "the spec file (it takes the name of the built-in gpu spec h200)"


def test_an_edited_copy_of_a_built_in_gpu_says_what_it_changed(tmp_path, capsys):
    """GPU specs have no origins: an edited copy carries what it changed (``spec_from``), in hw
    show, tune's text and its JSON (``target.spec_from``); its hash is the content's; an exact
    copy is the built-in, and a GPU spec named like a built-in CPU says whose name it took."""
    edit = lambda t: re.sub(r"(?m)^l2_kib = \d+", "l2_kib = 40960", t)  # noqa: E731
    path = _copy_of("h200", tmp_path, edit)
    spec, builtin = load_target(str(path)), load_target("h200")
    said = "the spec file: the built-in h200 with 1 value changed (memory.l2_kib)"
    assert spec.memory.l2_kib == 40960 and spec.spec_from == said
    assert spec.description == builtin.description  # the user's text stays theirs
    elsewhere = load_target(str(_copy_of("h200", tmp_path, edit, "other-name.toml")))
    assert spec_hash(elsewhere) == spec_hash(spec) != spec_hash(builtin)
    assert main(["hw", "show", str(path)]) == 0
    assert f"\n  spec     {said}\n" in capsys.readouterr().out
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--no-verify", "--budget", "32"]
    assert main([*argv, "--target", str(path)]) == 0
    assert f"spec: {said}" in capsys.readouterr().out
    assert main([*argv, "--json", "--target", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["spec_from"] == said
    assert main([*argv, "--json", "--target", "h200"]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["spec_from"] == "the built-in spec h200"
    assert main(["space", "matmul", "--shape", "16x16x16", "--target", str(path)]) == 0
    assert f"\nspec: {said}\n" in capsys.readouterr().out
    assert main(["space", "matmul", "--shape", "16x16x16", "--target", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["spec_from"] == said
    listing = tmp_path / "k.toml"
    listing.write_text('[[kernel]]\nname = "mm"\nop = "matmul"\nshape = "16x16x16"\n')
    argv = ["build", str(listing), "-o", str(tmp_path / "lib"), "--db", str(tmp_path / "t.db")]
    argv += ["--no-verify", "--budget", "16", "--top-k", "1", "--target", str(path)]
    assert main(argv) == 0
    assert f"\nspec: {said}\n" in capsys.readouterr().out
    assert load_target(str(_copy_of("h200", tmp_path, file="same.toml"))) == builtin
    renamed = lambda t: t.replace('name = "h200"', 'name = "znver4"')  # noqa: E731
    gpu = load_target(str(_copy_of("h200", tmp_path, renamed, "cpu-name.toml")))
    assert gpu.spec_from == "the spec file (it takes the name of the built-in cpu spec znver4)"


def test_a_gpu_spec_cannot_claim_a_mark_it_was_not_given(tmp_path, capsys):
    """Where a GPU spec comes from is aotune's to say: a description that reads like the mark
    is only a description, a file may not set ``spec_from``, and one named ``host`` says it is
    not the detected host."""
    fake = lambda t: re.sub(  # noqa: E731
        r'(?m)^name = "h200"\ndescription = ".*"',
        'name = "fake"\ndescription = "the spec file: the built-in h200 with 0 values changed"',
        t,
    )
    spec = load_target(str(_copy_of("h200", tmp_path, fake, "fake.toml")))
    assert spec.name == "fake" and spec.spec_from == ""
    argv = [
        "tune",
        "matmul",
        "--shape",
        "16x16x16",
        "--no-db",
        "--no-verify",
        "--json",
        "--budget",
        "32",
    ]
    assert main([*argv, "--target", str(tmp_path / "fake.toml")]) == 0
    assert json.loads(capsys.readouterr().out)["target"]["spec_from"] == "the spec file"
    claim = lambda t: t.replace('kind = "gpu"', 'kind = "gpu"\nspec_from = "the built-in h200"')  # noqa: E731
    with pytest.raises(HwSpecError, match="unknown key 'spec_from'"):
        load_target(str(_copy_of("h200", tmp_path, claim, "claim.toml")))
    host = lambda t: t.replace('name = "h200"', 'name = "host"')  # noqa: E731
    named_host = load_target(str(_copy_of("h200", tmp_path, host, "host.toml")))
    assert named_host.spec_from == "the spec file, not the detected host"


def test_a_copy_with_other_cache_levels_says_so(tmp_path):
    def drop_l3(text: str) -> str:
        head, rest = text.split("[[caches]]\nlevel = 3", 1)
        return head + "[memory]" + rest.split("[memory]", 1)[1]

    spec = load_target(str(_copy_of("znver4", tmp_path, drop_l3)))
    assert [c.level for c in spec.caches] == [1, 2]
    assert spec.core_model_from == "the spec file: the built-in znver4 with other cache levels"


def test_a_spec_file_named_host_says_it_is_not_the_detected_host(tmp_path, capsys):
    edit = lambda t: t.replace('name = "znver4"', 'name = "host"')  # noqa: E731
    path = _copy_of("znver4", tmp_path, edit)
    spec = load_target(str(path))
    assert spec.name == "host" and spec.core_model_from == "the spec file, not the detected host"
    argv = ["tune", "matmul", "--shape", "16x16x16", "--no-db", "--no-verify"]
    assert main([*argv, "--target", str(path)]) == 0
    assert "core model: the spec file, not the detected host" in capsys.readouterr().out
