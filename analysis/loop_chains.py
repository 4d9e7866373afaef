"""Loop-carried chains through the stack: how many spilled values a k loop's longest chain
stores and reloads per iteration.

Roadmap: an accumulator the register allocator spilled is stored to a stack slot and reloaded in
a later pass; its chain of FMAs then waits, each time, on the store's forwarding as well as on
the FMA (stop 123: packed 9- to 13-row x 8 tiles on Zen 3, 0.5 to 4 spills a k step, all ran
4.6-6.4 cycles a k step over their FMAs, whatever the count). ``stack_round_trips`` follows the
data through vector registers and stack slots over many passes of the loop body and reports how
fast the chain with the most reloads grows: a spilled value reloaded outside any chain (a B
vector, a pointer) adds nothing, a value that only rotates through registers neither.
``stack_traffic`` also names the slots the loop both stores and reloads (a spilled value's); an
access to any other slot is to a value kept on the stack, which the model prices apart.
The per-ISA facts (how a register and a stack slot are written, which instructions accumulate)
are in ``features.ISA_TABLES``; the model turns the count into cycles with the core's
store-forwarding latency.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import capstone
    from aotune.analysis.features import IsaTable

# passes of the body followed: the growth between the half and the end is the steady rate (a
# chain that rotates through registers may need a few passes to come round)
PASSES = 16

Location = tuple[str, int]  # ("v", register number) or (stack register, byte offset)
Uses = tuple[list[Location], list[Location]]  # (read, written) by one instruction


def split_operands(op_str: str) -> list[str]:
    """Operands of a disassembled instruction: commas inside ``[...]`` or ``{...}`` do not
    split."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(op_str):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(op_str[start:i].strip())
            start = i + 1
    tail = op_str[start:].strip()
    return [*out, tail] if tail else out


def _registers(operand: str, t: IsaTable) -> list[Location]:
    return [("v", int(m)) for m in re.findall(t.vector_register_pattern, operand)]


def _slot(operand: str, t: IsaTable) -> Location | None:
    m = re.search(t.stack_slot_pattern, operand)
    if m is None:
        return None
    return m["base"], int((m["off"] or "0").replace(" ", ""), 0)


def _uses(insn: capstone.CsInsn, t: IsaTable) -> Uses:
    """(locations read, locations written) of one instruction: vector registers and stack slots
    only, the chains a k loop's FMAs form."""
    m, ops = insn.mnemonic, split_operands(insn.op_str)
    if not ops:
        return [], []
    accumulates = any(m.startswith(p) for p in t.accumulating_prefixes)
    if any(m.startswith(p) for p in t.comparing_prefixes):
        slots = [s for op in ops if (s := _slot(op, t)) is not None]
        return [r for op in ops for r in _registers(op, t)] + slots, []
    if t.memory_from_operands:
        dest, sources = ops[0], ops[1:]
        if "[" in dest:  # a store, or an operation on memory that reads it first
            slot = _slot(dest, t)
            reads = [r for op in sources for r in _registers(op, t)]
            plain = any(m.startswith(p) for p in t.overwriting_store_prefixes)
            if slot is not None and not plain:
                return [*reads, slot], [slot]
            return reads, [slot] if slot is not None else []
        slots = [s for op in sources if (s := _slot(op, t)) is not None]
        reads = [r for op in sources for r in _registers(op, t)]
        written = _registers(dest, t)
        return (written if accumulates else []) + reads + slots, written
    memory = [op for op in ops if op.startswith("[")]
    registers = [r for op in ops if not op.startswith("[") for r in _registers(op, t)]
    slot = _slot(memory[0], t) if memory else None
    if memory and any(m.startswith(p) for p in t.store_prefixes):
        return registers, _register_slots(slot, ops, len(registers))
    if memory and any(m.startswith(p) for p in t.load_prefixes):
        return _register_slots(slot, ops, len(registers)), registers
    written = _registers(ops[0], t)
    reads = [r for op in ops[1:] for r in _registers(op, t)]
    return (written if accumulates else []) + reads, written


def _register_slots(slot: Location | None, ops: Sequence[str], count: int) -> list[Location]:
    """The stack slots of a load or store of ``count`` registers (AArch64's ``ldp``/``stp``
    move two, at consecutive offsets of the registers' width)."""
    if slot is None:
        return []
    width = {"q": 16, "d": 8, "s": 4, "h": 2}.get(ops[0][:1], 16)
    return [(slot[0], slot[1] + i * width) for i in range(count)]


def _is_slot(x: Location) -> bool:
    return x[0] != "v"


@dataclass(frozen=True)
class StackTraffic:
    """What a k loop's body does through the stack, each instruction read once."""

    round_trips: float  # stack reloads per iteration on the chain through the most of them
    paired: frozenset[Location]  # slots the loop both stores and reloads: spilled values'
    slots: tuple[frozenset[Location], ...]  # the slots each instruction of the body touches

    def keeps_on_stack(self, index: int) -> bool:
        """Whether instruction ``index`` touches a value kept on the stack (a slot the loop does
        not both store and reload, or an address that is no fixed slot) rather than a spilled
        value, whose price is its chain's."""
        touched = self.slots[index]
        return not touched or not touched <= self.paired


def stack_traffic(body: Sequence[capstone.CsInsn], t: IsaTable) -> StackTraffic:
    """The stack traffic of the loop ``body``: its chains' round trips, its paired slots."""
    uses = [_uses(i, t) for i in body]
    slots = tuple(frozenset(filter(_is_slot, (*reads, *writes))) for reads, writes in uses)
    read = {x for reads, _ in uses for x in reads if _is_slot(x)}
    written = {x for _, writes in uses for x in writes if _is_slot(x)}
    return StackTraffic(_round_trips(uses) if read else 0.0, frozenset(read & written), slots)


def stack_round_trips(body: Sequence[capstone.CsInsn], t: IsaTable) -> float:
    """Stack stores reloaded per iteration of the loop ``body`` along its loop-carried chain with
    the most of them (0 where no chain passes through the stack)."""
    return stack_traffic(body, t).round_trips


def _round_trips(uses: Sequence[Uses]) -> float:
    """Follows the reloads along every chain over ``PASSES`` passes of the body: the growth of the
    longest between the half and the end is the steady rate per iteration."""
    depth: dict[Location, int] = {}  # stack reloads along the longest chain into a value
    stored: set[Location] = set()  # slots a store of the loop wrote (a reload waits on it)
    marks: list[int] = []

    def arriving(r: Location) -> int:
        return depth.get(r, 0) + (r in stored)  # a reload of a slot the loop stored: one more

    for _ in range(PASSES):
        for reads, writes in uses:
            trips = max(map(arriving, reads), default=0)
            for w in writes:
                depth[w] = trips
                if _is_slot(w):
                    stored.add(w)
        marks.append(max(depth.values(), default=0))
    half = PASSES // 2
    return (marks[-1] - marks[half - 1]) / (PASSES - half)
