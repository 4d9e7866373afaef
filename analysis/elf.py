"""Section headers and code of ELF64 little-endian files, read with ``struct`` alone: shared by
the analysis of a kernel's object, a build's manifest and ``aotune.load``, which reads a library
before running any of it."""

from __future__ import annotations

import struct


def elf_sections(data: bytes) -> list[tuple[int, ...]]:
    """The section headers of the ELF64 little-endian file ``data`` (name, type, flags, address,
    offset, size, link, info, alignment, entry size each); none where it is not such a file or
    its header table lies outside it."""
    if data[:6] != b"\x7fELF\x02\x01":
        return []
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        if shentsize != 64 or shoff + 64 * shnum > len(data):
            return []
        return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)]
    except struct.error:
        return []


def x86_code_sections(data: bytes) -> list[bytes]:
    """The executable sections of the x86-64 ELF file ``data`` (none where it is not one)."""
    return [
        data[offset : offset + size]
        for _, kind, flags, _, offset, size, *_ in elf_sections(data)
        if kind == 1 and flags & 0x4 and offset + size <= len(data)  # PROGBITS, EXECINSTR
    ]
