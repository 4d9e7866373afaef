"""Which CPU features x86-64 machine code needs, read off capstone's instruction groups.

Light on purpose (capstone only): ``aotune.load`` reads a library's code with it before running
any of it, and ``analysis.features`` a kernel's object code.
"""

from __future__ import annotations

from collections.abc import Iterable

# capstone's x86 instruction groups -> the LLVM feature each needs
X86_GROUP_FEATURES = {"avx512": "avx512f", "avx2": "avx2", "fma": "fma", "avx": "avx"}


def x86_features_in_code(chunks: Iterable[bytes], wanted: set[str] | None = None) -> dict[str, str]:
    """The features (of ``wanted``, default all of ``X86_GROUP_FEATURES``'s) that the x86-64
    machine code in ``chunks`` needs, each with the first instruction that needs it. Bytes that
    are no instruction (padding, data in a code section) are stepped over."""
    import capstone

    wanted = set(X86_GROUP_FEATURES.values()) if wanted is None else wanted
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.detail = True
    md.skipdata = True
    used: dict[str, str] = {}
    for code in chunks:
        for insn in md.disasm(code, 0):
            if insn.id == 0:  # a skipped byte
                continue
            for group in insn.groups:
                feature = X86_GROUP_FEATURES.get(insn.group_name(group))
                if feature in wanted and feature not in used:
                    used[feature] = f"{insn.mnemonic} {insn.op_str}".strip()
    return used
