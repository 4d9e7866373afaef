"""What x86-64 instructions need, read by capstone from real encodings: the features a library
lists and ``aotune.load`` checks rest on it."""

from __future__ import annotations

import capstone
import pytest
from aotune.analysis.x86_features import (
    cpu_features_needed,
    instruction_features,
    x86_features_in_code,
)

# (encoding, its assembly as capstone prints it, the features it needs)
CASES = [
    ("c4e27db8c1", "vfmadd231ps ymm0, ymm0, ymm1", {"fma", "avx"}),
    ("c4e279a8c1", "vfmadd213ps xmm0, xmm0, xmm1", {"fma", "avx"}),
    ("62f27d48b8c1", "vfmadd231ps zmm0, zmm0, zmm1", {"avx512f"}),
    ("62e27d28b8c1", "vfmadd231ps ymm16, ymm0, ymm1", {"avx512f", "avx512vl"}),
    ("c5fc58c1", "vaddps ymm0, ymm0, ymm1", {"avx"}),
    ("c5f890c8", "kmovw k1, k0", {"avx512f"}),
    ("c4e2f9f7c0", "shlx rax, rax, rax", {"bmi2"}),
    ("f3480fbcc0", "tzcnt rax, rax", {"bmi"}),
    ("f30fb8c0", "popcnt eax, eax", {"popcnt"}),
    ("0f0d08", "prefetchw byte ptr [rax]", {"prfchw"}),
    ("0f01fc", "clzero", {"clzero"}),
    ("0f1808", "prefetcht0 byte ptr [rax]", set()),
    ("4801d8", "add rax, rbx", set()),
    # an operand's size is no register: movdir64b moves 64 bytes, on no AVX-512 unit
    ("660f38f803", "movdir64b rax, zmmword ptr [rbx]", {"movdir64b"}),
    # VEX.128 AES and PCLMUL need AES or PCLMUL (with AVX), not the wide VAES / VPCLMULQDQ
    ("c4e271dcc2", "vaesenc xmm0, xmm1, xmm2", {"aes", "avx"}),
    ("c4e37544c200", "vpclmulqdq ymm0, ymm1, ymm2, 0", {"pclmul", "vpclmulqdq", "avx"}),
]


def _one(hexcode: str) -> capstone.CsInsn:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    return next(md.disasm(bytes.fromhex(hexcode), 0))


@pytest.mark.parametrize("hexcode,text,needs", CASES)
def test_each_instruction_needs_what_the_manuals_say(hexcode: str, text: str, needs: set):
    """Hand-checked against the Intel SDM and AMD APM; capstone 5 gives the FMA ones no group,
    so a scan by groups alone found none of them."""
    insn = _one(hexcode)
    assert f"{insn.mnemonic} {insn.op_str}".strip() == text
    groups = [insn.group_name(g) for g in insn.groups]
    assert instruction_features(insn.mnemonic, insn.op_str, insn.bytes, groups) == needs


def test_the_scan_names_the_first_instruction_of_each_feature_and_keeps_to_what_is_wanted():
    code = bytes.fromhex("4801d8c5fc58c1c4e27db8c1c4e27db8c1")
    assert x86_features_in_code([code]) == {
        "avx": "vaddps ymm0, ymm0, ymm1",
        "fma": "vfmadd231ps ymm0, ymm0, ymm1",
    }
    assert x86_features_in_code([code], {"fma"}) == {"fma": "vfmadd231ps ymm0, ymm0, ymm1"}


def test_a_library_lists_the_spec_features_the_code_cannot_show_and_those_it_shows():
    """An extension whose instructions the code never holds (sse4a, popcnt here) and AVX-512
    without an EVEX instruction are left out; what the code cannot tell apart (cx16, the
    AVX-512 family once EVEX is used) stays as the spec lists it."""
    listed = ["avx2", "fma", "sse4a", "popcnt", "cx16", "avx512f", "avx512vl", "avx512bw"]
    vex_only = bytes.fromhex("c4e27db8c1f30fb8c0")
    assert cpu_features_needed(listed, [vex_only]) == ["avx", "avx2", "cx16", "fma", "popcnt"]
    # bytes capstone cannot decode (here 0f 04, no instruction; in capstone 5, AVX-512 FP16's
    # or AMX's too) may be an instruction that needs anything listed
    undecoded = bytes.fromhex("c4e27db8c10f04")
    assert cpu_features_needed(listed, [undecoded]) == sorted({*listed, "avx"})
    evex = bytes.fromhex("62f27d48b8c1")
    assert cpu_features_needed(listed, [evex]) == [
        "avx2", "avx512bw", "avx512f", "avx512vl", "cx16", "fma",
    ]  # fmt: skip
