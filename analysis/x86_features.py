"""Which CPU features x86-64 machine code needs, read off the instructions with capstone.

Light on purpose (capstone only): ``aotune.load`` reads a library's code with it before running
any of it, ``analysis.features`` a kernel's object code, and a build the features its library
lists (``cpu_features_needed``), so that a library built for ``host`` does not demand every
feature of the build machine, only those its code uses.

capstone's instruction groups alone are not enough: capstone 5 puts no FMA instruction in a
group (``vfmadd231ps`` has none, VEX or EVEX), so the encoding and the mnemonic are read too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# capstone's x86 instruction groups -> the LLVM feature each needs
X86_GROUP_FEATURES = {"avx512": "avx512f", "avx2": "avx2", "fma": "fma", "avx": "avx"}

# the features the vector code generators emit on purpose, which aotune.load checks in the code
VECTOR_FEATURES = frozenset(X86_GROUP_FEATURES.values())

# Extensions whose every instruction is listed here (Intel SDM, AMD APM) and capstone 5 decodes:
# a library lists one of these features only where its code holds one of its instructions.
FEATURE_MNEMONICS: dict[str, frozenset[str]] = {
    name: frozenset(mnemonics.split())
    for name, mnemonics in {
        "adx": "adcx adox",
        "aes": "aesenc aesenclast aesdec aesdeclast aesimc aeskeygenassist vaesenc vaesenclast "
        "vaesdec vaesdeclast vaesimc vaeskeygenassist",
        "vaes": "vaesenc vaesenclast vaesdec vaesdeclast",
        "bmi": "andn bextr blsi blsmsk blsr tzcnt",
        "bmi2": "bzhi mulx pdep pext rorx sarx shlx shrx",
        "clflushopt": "clflushopt",
        "clwb": "clwb",
        "clzero": "clzero",
        "crc32": "crc32",
        "f16c": "vcvtph2ps vcvtps2ph",
        "fsgsbase": "rdfsbase rdgsbase wrfsbase wrgsbase",
        "gfni": "gf2p8affineinvqb gf2p8affineqb gf2p8mulb vgf2p8affineinvqb vgf2p8affineqb "
        "vgf2p8mulb",
        "invpcid": "invpcid",
        "lzcnt": "lzcnt",
        "movbe": "movbe",
        "movdir64b": "movdir64b",
        "movdiri": "movdiri",
        "mwaitx": "monitorx mwaitx",
        "pclmul": "pclmulqdq vpclmulqdq pclmullqlqdq pclmulhqlqdq pclmullqhqdq pclmulhqhqdq "
        "vpclmullqlqdq vpclmulhqlqdq vpclmullqhqdq vpclmulhqhqdq",
        "vpclmulqdq": "vpclmulqdq vpclmullqlqdq vpclmulhqlqdq vpclmullqhqdq vpclmulhqhqdq",
        "pku": "rdpkru wrpkru",
        "popcnt": "popcnt",
        "prfchw": "prefetchw",
        "rdpid": "rdpid",
        "rdrnd": "rdrand",
        "rdseed": "rdseed",
        "sha": "sha1rnds4 sha1nexte sha1msg1 sha1msg2 sha256rnds2 sha256msg1 sha256msg2",
        "shstk": "incsspd incsspq rdsspd rdsspq saveprevssp rstorssp wrssd wrssq wrussd wrussq "
        "setssbsy clrssbsy",
        "sse4a": "extrq insertq movntsd movntss",
        "waitpkg": "umonitor umwait tpause",
        "wbnoinvd": "wbnoinvd",
        "xsave": "xsave xsave64 xrstor xrstor64 xgetbv xsetbv",
        "xsavec": "xsavec xsavec64",
        "xsaveopt": "xsaveopt xsaveopt64",
        "xsaves": "xsaves xsaves64 xrstors xrstors64",
    }.items()
}
_MNEMONIC_FEATURES: dict[str, tuple[str, ...]] = {
    m: tuple(f for f, ms in FEATURE_MNEMONICS.items() if m in ms)
    for m in frozenset().union(*FEATURE_MNEMONICS.values())
}

# FMA3's mnemonics (vfmadd231ps, vfnmsub132sd, vfmaddsub213ps, ...); FMA4's have no digits
_FMA3 = re.compile(r"vfn?m(?:add|sub)(?:sub|add)?(?:132|213|231)[ps][sdh]$")
_MASK_REGISTER = re.compile(r"\bk[0-7]\b")
# registers, not operand sizes: movdir64b's "zmmword ptr" is no AVX-512
_ZMM, _YMM, _XMM = (re.compile(rf"\b{r}mm\d") for r in "zyx")
# VAES and VPCLMULQDQ are the wide forms; a VEX xmm vaesenc needs AES (and AVX) only
_WIDE_ONLY = frozenset({"vaes", "vpclmulqdq"})
# legacy prefixes that may stand before a VEX or EVEX prefix
_LEGACY_PREFIXES = frozenset(b"\x26\x2e\x36\x3e\x64\x65\x66\x67\xf0\xf2\xf3")
# the key under which x86_features_in_code reports bytes it could not decode
UNDECODED = "(undecoded)"


def _is_avx512_family(feature: str) -> bool:
    """AVX-512's features (avx512f, avx512vl, ..., evex512): all of them EVEX-encoded or on mask
    registers."""
    return feature.startswith("avx512") or feature == "evex512"


def instruction_features(mnemonic: str, op_str: str, raw: bytes, groups: Iterable[str]) -> set[str]:
    """The LLVM features one instruction needs, from its groups, encoding, registers and name."""
    needs = {X86_GROUP_FEATURES[g] for g in groups if g in X86_GROUP_FEATURES}
    first = next((b for b in raw if b not in _LEGACY_PREFIXES), 0)
    evex = first == 0x62  # BOUND, 0x62 outside 64-bit mode, does not exist in it
    zmm, ymm = bool(_ZMM.search(op_str)), bool(_YMM.search(op_str))
    wide = evex or zmm or ymm
    needs.update(f for f in _MNEMONIC_FEATURES.get(mnemonic, ()) if wide or f not in _WIDE_ONLY)
    if evex or zmm or _MASK_REGISTER.search(op_str):
        needs.add("avx512f")
        if evex and not zmm:
            # EVEX on xmm or ymm; a scalar one would not need it, but names do not tell them
            # apart safely (vpminsd is packed), so it is claimed
            needs.add("avx512vl")
    elif ymm or (first in (0xC4, 0xC5) and _XMM.search(op_str)):
        needs.add("avx")  # VEX on general registers is BMI's (shlx, andn), not AVX's
    if not evex and _FMA3.match(mnemonic):
        needs.add("fma")
    return needs


def x86_features_in_code(
    chunks: Iterable[bytes], wanted: set[str] | None = None, undecoded: bool = False
) -> dict[str, str]:
    """The features (of ``wanted``, default all it can tell) that the x86-64 machine code in
    ``chunks`` needs, each with the first instruction that needs it. Bytes capstone cannot
    decode (data in a code section, or an instruction newer than capstone: AMX, AVX-512 FP16)
    are stepped over; with ``undecoded`` the first of them shows as ``UNDECODED``."""
    import capstone

    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    md.skipdata = True
    used: dict[str, str] = {}
    for code in chunks:
        for insn in md.disasm(code, 0):
            if insn.id == 0:  # a skipped byte, or an instruction capstone cannot decode
                if undecoded:
                    used.setdefault(UNDECODED, insn.bytes.hex())
                continue
            groups = [insn.group_name(g) for g in insn.groups]
            for feature in sorted(
                instruction_features(insn.mnemonic, insn.op_str, insn.bytes, groups)
            ):
                if (wanted is None or feature in wanted) and feature not in used:
                    used[feature] = f"{insn.mnemonic} {insn.op_str}".strip()
    return used


def cpu_features_needed(listed: Iterable[str], chunks: Iterable[bytes]) -> list[str]:
    """The CPU features a library of the x86-64 code ``chunks`` needs, built for a target whose
    features are ``listed``: those of ``listed`` that cannot be told from the code, and those
    the code shows. An extension of ``FEATURE_MNEMONICS`` (or AVX-512, which is told by its
    encoding) is left out where the code holds none of its instructions; where capstone cannot
    decode some of the code, every listed feature is kept."""
    used = x86_features_in_code(chunks, undecoded=True)
    if used.pop(UNDECODED, None) is not None:
        return sorted(set(listed) | set(used))  # what it needs cannot all be told
    keep = {
        f
        for f in listed
        if f not in FEATURE_MNEMONICS and not (_is_avx512_family(f) and "avx512f" not in used)
    }
    return sorted(keep | set(used))
