"""The C header of a CPU library: one documented function per kernel, and the runtime's API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aotune
from aotune.artifact import runtime
from aotune.artifact.names import Names


def _dims(shape: Sequence[int]) -> str:
    return "".join(f"[{d}]" for d in shape)


def kernel_declaration(entry: dict[str, Any], names: Names = Names()) -> str:
    """The comment and prototype of one kernel, from its manifest entry."""
    lines = [f"/* {entry['name']}: {entry['workload']['describe']}"]
    for p in entry["params"]:
        lines.append(
            f" *   {p['role']:<4} {p['name']:<6} float{_dims(p['shape'])}  row-major, "
            f"{'written' if p['role'] == 'out' else 'read'}"
        )
    out = next(p["name"] for p in entry["params"] if p["role"] == "out")
    # the workload's notation reads `+=` over the reduction; the call does not add to `out`
    lines.append(f" * Every element of {out} is overwritten, not added to.")
    cfg = ",".join(f"{k}={v}" for k, v in entry["config"].items())
    lines.append(f" * Tuned for {entry['target']['name']}:")
    lines += [f" *   {cfg[i : i + 90]}" for i in range(0, len(cfg), 90)]
    pred = entry["predicted_seconds"]
    lines.append(
        f" * Predicted {pred * 1e3:.4g} ms ({entry['workload']['flops'] / pred / 1e9:.1f} GFLOP/s)"
        + (
            f", measured {entry['measured_seconds'] * 1e3:.4g} ms on the build machine"
            if entry.get("measured_seconds")
            else ""
        )
        + "."
    )
    lines.append(
        f" * Returns {names.macro}_OK, or a {names.macro}_ERR_* code (see "
        f"{names.api('strerror')}). */"
    )
    args = ", ".join(
        f"{'float' if p['role'] == 'out' else 'const float'} *{p['name']}" for p in entry["params"]
    )
    lines.append(f"int {entry['name']}({args});")
    # two libraries that both define this name would link, and the program would call one of
    # them for both: a second header declaring it stops the compile instead
    guard = names.kernel_macro(entry["name"])
    return "\n".join(
        [
            f"#ifdef {guard}",
            f'#error "two aotune libraries declare the kernel {entry["name"]}: a program '
            'calls only one of them; build the other with another kernel name"',
            "#endif",
            f'#define {guard} "{names.library}.h"',
            *lines,
        ]
    )


def header_text(
    entries: Sequence[dict[str, Any]],
    target: dict[str, Any],
    names: Names = Names(),
    linked: bool = True,
) -> str:
    """The whole header for a library of ``entries`` built for ``target``, its global names from
    ``names`` (``linked``: a .so and .a were linked, not only the objects written)."""
    macro = names.macro
    codes = "\n".join(
        f"#define {names.error_macro(name):<20} {code}  /* {text} */"
        for code, (name, text) in enumerate(runtime.ERRORS)
    )
    kernels = "\n\n".join(kernel_declaration(e, names) for e in entries)
    guard = f"{macro}_KERNELS_H"
    lib = names.library
    link_how = (
        f"Link the shared object with\n * -l{lib}, or the archive with lib{lib}.a -lpthread."
        if linked
        else f"Link the objects in objects/\n * (each kernel's and {names.prefix}_runtime.o) "
        "with -lpthread."
    )
    api = names.api
    return f"""/* {lib}.h: kernels generated ahead of time by aotune {aotune.__version__}
 * for {target["name"]} ({target["triple"]}). Do not edit: 'aotune build' writes this file.
 *
 * Every function computes one whole kernel call on float32 arrays, C order (row-major),
 * any alignment (64-byte aligned inputs are fastest). The library starts and owns its worker
 * threads; calls from several threads are safe and take turns. {link_how}
 */
#ifndef {guard}
#define {guard}

#ifdef __cplusplus
extern "C" {{
#endif

{codes}

/* Threads one call may use, the caller included (n >= 1; default: the CPUs online).
 * Returns {macro}_OK or {macro}_ERR_THREADS. */
int {api("set_num_threads")}(int n);
/* The current setting. */
int {api("get_num_threads")}(void);
/* Stops and joins the worker threads; a later call starts them again. */
void {api("shutdown")}(void);
/* A sentence for a return code. */
const char *{api("strerror")}(int rc);

{kernels}

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""
