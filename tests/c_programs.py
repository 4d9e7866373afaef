"""A C program that calls every kernel of a built library on inputs written by Python."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_inputs(work: Path, manifest: dict, seed: int = 1) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    inputs = {}
    for k in manifest["kernels"]:
        arrays = [
            rng.uniform(-1, 1, p["shape"]).astype(np.float32)
            for p in k["params"]
            if p["role"] != "out"
        ]
        for p, a in zip(k["params"], arrays):
            a.tofile(work / f"{k['name']}.{p['role']}.bin")
        inputs[k["name"]] = arrays
    return inputs


def c_program(manifest: dict) -> str:
    """A C program that reads each kernel's inputs from files, calls it, writes its output."""
    lines = [
        "#include <stdio.h>",
        "#include <stdlib.h>",
        '#include "aotune_kernels.h"',
        "static float *load(const char *path, size_t n) {",
        '  float *p = malloc(n * sizeof(float)); FILE *f = fopen(path, "rb");',
        "  if (!f || fread(p, sizeof(float), n, f) != n) { perror(path); exit(3); }",
        "  fclose(f); return p;",
        "}",
        "int main(void) {",
        "  int rc;",
    ]
    for k in manifest["kernels"]:
        args = []
        for p in k["params"]:
            n = int(np.prod(p["shape"]))
            var = f"{k['name']}_{p['role']}"
            if p["role"] == "out":
                lines.append(f"  float *{var} = calloc({n}, sizeof(float));")
            else:
                lines.append(f'  float *{var} = load("{k["name"]}.{p["role"]}.bin", {n});')
            args.append(var)
        out = args[-1]
        n_out = int(np.prod(k["params"][-1]["shape"]))
        lines += [
            f"  rc = {k['name']}({', '.join(args)});",
            '  if (rc != AOTUNE_OK) { fprintf(stderr, "%s\\n", aotune_strerror(rc)); return 4; }',
            f'  {{ FILE *f = fopen("{k["name"]}.out.bin", "wb");',
            f"    fwrite({out}, sizeof(float), {n_out}, f); fclose(f); }}",
        ]
    first = manifest["kernels"][0]
    nulls = ", ".join(["NULL"] * len(first["params"]))
    lines += [
        f"  rc = {first['name']}({nulls});",
        '  printf("null: %d %s\\n", rc, aotune_strerror(rc));',
        '  printf("threads: %d\\n", aotune_get_num_threads());',
        "  aotune_shutdown();",
        "  return 0;",
        "}",
    ]
    return "\n".join(lines) + "\n"
