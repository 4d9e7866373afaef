"""A CPU spec as TOML text with each value's origin in a comment, and those origins read back.

Roadmap: ``spec_to_toml`` walks the schema (the dataclasses of :mod:`aotune.hwspecs.spec`), so a
field added there is written without a change here, and refuses a spec whose origin map misses a
field: every value of a written spec says where it came from. ``origin_from_toml`` reads those
comments back, keyed by the same field paths (``core.frequency_ghz``, ``caches.L2.latency_cycles``),
for ``hw show`` and for a future ``[origin]`` table in the schema.
"""

from __future__ import annotations

import dataclasses
import math
import re
import textwrap
import typing
from collections.abc import Mapping
from typing import Any

from aotune.errors import HwSpecError
from aotune.files import has_control_character
from aotune.hwspecs.spec import CacheSpec, HwSpec

WIDTH = 100  # comment lines wrap here, as the project's code does
_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=")


def field_paths(spec: HwSpec) -> list[str]:
    """The path of every value in ``spec`` below its top-level strings, in file order:
    ``isa.arch``, ..., ``caches.L1.level``, ..., ``overhead.thread_seconds``."""
    return spec.field_paths()


# keys of an origin map that name no single field: the spec the core model came from
ORIGIN_EXTRA_KEYS = ("core_model",)


def _entry_key(item: Any) -> str:
    """How an array-of-tables entry is named in a field path (caches by level: ``L2``)."""
    if isinstance(item, CacheSpec):
        return f"L{item.level}"
    raise HwSpecError(f"no field-path name for a {type(item).__name__} entry")


def toml_value(value: Any) -> str:
    """``value`` (string, integer, finite float or boolean) as a TOML literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise HwSpecError(f"{value} cannot be written to a spec file; values must be finite")
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    raise HwSpecError(f"a {type(value).__name__} cannot be written to a spec file")


def _toml_string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def comment_text(text: str) -> str:
    """``text`` as a comment holds it: whitespace runs made one space, and control characters
    (those TOML forbids in comments, and any other a terminal would act on) made U+FFFD."""
    words = " ".join(text.split())
    return "".join("\ufffd" if has_control_character(c) else c for c in words)


def _comment(text: str) -> list[str]:
    """``text`` as ``# `` lines of at most WIDTH columns (words are never broken, so joining the
    lines with spaces gives ``comment_text(text)`` back)."""
    words = comment_text(text)
    return [
        "# " + line
        for line in textwrap.wrap(words, WIDTH - 2, break_long_words=False, break_on_hyphens=False)
    ] or ["#"]


def spec_to_toml(spec: HwSpec, origin: Mapping[str, str], header: str = "") -> str:
    """The TOML text of ``spec``: ``header`` as a comment block at the top, then every value with
    ``origin[path]`` as the comment above it. Raises HwSpecError naming a field without an origin
    (or an origin naming no field)."""
    paths = field_paths(spec)
    missing = [p for p in paths if not origin.get(p, "").strip()]
    if missing:
        raise HwSpecError(
            f"no origin for {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; "
            "every value of a written spec must say where it came from"
        )
    extra = sorted(set(origin) - set(paths) - set(ORIGIN_EXTRA_KEYS))
    if extra:
        raise HwSpecError(f"origin names {', '.join(extra[:5])}, which are not fields of the spec")
    lines: list[str] = []
    for i, para in enumerate(p for p in header.split("\n\n") if p.strip()):
        lines += (["#"] if i else []) + _comment(para)
    if lines:
        lines.append("")
    hints = typing.get_type_hints(HwSpec)
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if hints[f.name] in (str, int, float, bool):
            lines.append(f"{f.name} = {toml_value(value)}")
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if dataclasses.is_dataclass(value):
            lines += ["", f"[{f.name}]"]
            lines += _table(value, f.name, origin)
        elif f.name == "caches":
            for item in value:
                lines += ["", f"[[{f.name}]]"]
                lines += _table(item, f"{f.name}.{_entry_key(item)}", origin)
    # the same origins as data, so that ``aotune hw show FILE`` can say where each value came
    # from: as the comments hold them (a spec refuses control characters in its origins)
    lines += ["", "[origin]"]
    lines += [
        f"{_toml_string(k)} = {_toml_string(comment_text(v))}" for k, v in sorted(origin.items())
    ]
    return "\n".join(lines) + "\n"


def _table(obj: Any, prefix: str, origin: Mapping[str, str]) -> list[str]:
    lines = []
    for f in dataclasses.fields(obj):
        lines += _comment(origin[f"{prefix}.{f.name}"])
        lines.append(f"{f.name} = {toml_value(getattr(obj, f.name))}")
    return lines


def origin_from_toml(text: str) -> dict[str, str]:
    """Field path -> the comment right above that value, from a spec file's text (values with no
    comment above them are left out). Array entries are named by their key (caches by level), read
    from the entry's own ``level`` line."""
    found: dict[str, str] = {}
    table: str | None = None
    entry: list[tuple[str, str]] = []  # (key, comment) of the [[...]] entry being read
    entry_level: str | None = None
    pending: list[str] = []

    def close_entry() -> None:
        nonlocal entry, entry_level
        if table is not None and entry and entry_level is not None:
            for key, note in entry:
                found[f"{table}.L{entry_level}.{key}"] = note
        entry, entry_level = [], None

    array = False
    for raw in text.split("\n"):  # not splitlines: a string value may hold U+2028
        line = raw.strip()
        if line.startswith("#"):
            pending.append(line[1:].strip())
            continue
        if not line:
            pending = []
            continue
        if line.startswith("["):
            close_entry()
            array = line.startswith("[[")
            table = line.strip("[] ")
            pending = []
            continue
        m = _KEY.match(line)
        if m and table is not None:
            key = m.group(1)
            note = " ".join(" ".join(pending).split())
            if array:
                if key == "level":
                    entry_level = line.split("=", 1)[1].split("#")[0].strip()
                if note:
                    entry.append((key, note))
            elif note:
                found[f"{table}.{key}"] = note
        pending = []
    close_entry()
    return found


def value_at(spec: HwSpec, path: str) -> Any:
    """The value at field path ``path`` of ``spec`` (``core.fma_units``, ``caches.L2.size_kib``)."""
    parts = path.split(".")
    obj: Any = spec
    for i, part in enumerate(parts):
        if isinstance(obj, tuple):
            obj = next((x for x in obj if _entry_key(x) == part), None)
            if obj is None:
                raise HwSpecError(f"{path}: {spec.name} has no entry {part}")
            continue
        if not dataclasses.is_dataclass(obj) or part not in {
            f.name for f in dataclasses.fields(obj)
        }:
            raise HwSpecError(f"{path}: no field {'.'.join(parts[: i + 1])} in the CPU spec schema")
        obj = getattr(obj, part)
    return obj


def with_value(spec: Any, path: str, value: Any) -> Any:
    """``spec`` with the value at ``path`` replaced (a new object; ``spec`` is frozen)."""
    head, _, rest = path.partition(".")
    if isinstance(spec, tuple):
        if not any(_entry_key(x) == head for x in spec):
            raise HwSpecError(f"{path}: no entry {head}")
        return tuple(with_value(x, rest, value) if _entry_key(x) == head else x for x in spec)
    if head not in {f.name for f in dataclasses.fields(spec)}:
        raise HwSpecError(f"{path}: no field {head} in {type(spec).__name__}")
    new = with_value(getattr(spec, head), rest, value) if rest else value
    return dataclasses.replace(spec, **{head: new})


def differing_paths(spec: HwSpec, other: HwSpec) -> list[str]:
    """The field paths whose values differ between two CPU specs, in ``spec``'s file order. Specs
    whose cache levels differ have no field-by-field comparison: a HwSpecError names the level."""
    levels = [c.level for c in spec.caches], [c.level for c in other.caches]
    if levels[0] != levels[1]:
        raise HwSpecError(
            f"{spec.name} has cache levels {levels[0]} and {other.name} {levels[1]}: specs are "
            "compared field by field only with the same cache levels"
        )
    return [p for p in spec.field_paths() if value_at(spec, p) != value_at(other, p)]


def values_changed_text(changed: list[str]) -> str:
    """``2 values changed (memory.l2_kib, compute.sms)``: what a copy of a built-in spec
    changed, at most three paths named."""
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if changed[3:] else "")
    return f"{len(changed)} value{'s' if changed[1:] else ''} changed ({shown})"


def mark_builtin_copy(spec: HwSpec, builtin: Any) -> HwSpec:
    """A spec file that keeps a built-in's name (a copy made to edit), with what it changed said
    so: a changed value whose origin is still the built-in's claim gets one naming the built-in's
    value, and the core model is the file's (``core_model_from`` would otherwise name the
    built-in) unless the file states its own. An exact copy is returned as it is. The text names
    no path, so the spec's hash stays its content's."""
    origin = dict(spec.origin)
    own_model = origin.get("core_model")
    if not isinstance(builtin, HwSpec):
        note = f"the spec file (it takes the name of the built-in {builtin.kind} spec {spec.name})"
        origin["core_model"] = own_model or note
        return dataclasses.replace(spec, origin=tuple(origin.items()))
    try:
        changed = differing_paths(spec, builtin)
    except HwSpecError:  # other cache levels: no field-by-field comparison
        changed, what = [], "other cache levels"
    else:
        if not changed:
            return spec
        what = values_changed_text(changed)
    for path in changed:
        if spec.origin_of(path) == builtin.origin_of(path):  # the copy kept the built-in's claim
            origin[path] = (
                f"set in the spec file (the built-in {spec.name} has {value_at(builtin, path)!r})"
            )
    if own_model == dict(builtin.origin).get("core_model"):
        origin["core_model"] = f"the spec file: the built-in {spec.name} with {what}"
    return dataclasses.replace(spec, origin=tuple(origin.items()))
