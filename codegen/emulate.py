"""Final check of cross-built CPU kernels under user-mode emulation (qemu-user), vs numpy.

A kernel built for an ISA this machine cannot run (AArch64 from x86) is checked the way a host
kernel is, on the same inputs and against the same numpy reference and tolerance (``runner.py``),
only executed by ``qemu-<arch>``:

    kernels ─► each object's entry symbols renamed (<arch>-linux-gnu-objcopy), so several link
               into one program; a generated C driver that reads the operands from files, runs
               each kernel's launch plan (``launch.py``: padded copy, then the shares) on pthreads
               with every thread's own workspaces, and writes the outputs
            ─► <arch>-linux-gnu-gcc -static ─► qemu-<arch> -cpu <the target's core if qemu models
               it> ─► outputs vs numpy_reference, within tolerance

Emulation says whether a kernel computes the right numbers on the target's ISA, never how fast: an
instruction emulated in software costs nothing like it does in silicon, so no time is taken and
speed stays predicted only. Nothing in the search calls this module (the search measures nothing);
``final_check_emulated`` is the final check's entry, ``check_emulated`` the batched one tests use.

Roadmap: a cross-built library (``aotune build``) links with ``Emulator.cc`` the same way; its C
test program then runs through :func:`run_program`.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from aotune.codegen.compile import Kernel
from aotune.codegen.executions import count_execution
from aotune.codegen.launch import LaunchPlan, launch_plan
from aotune.codegen.runner import Operands, numpy_reference, tolerance
from aotune.errors import FinalCheckError
from aotune.hwspecs.host import detect_host
from aotune.hwspecs.spec import HwSpec

# Per ISA: the GNU triplet of Debian's cross tools and Debian's name for the architecture (its
# packages: gcc-<triplet>, libc6-dev-<debian arch>-cross). Only ISAs whose kernels have been run
# under qemu are listed.
CROSS_TOOLS = {"aarch64": ("aarch64-linux-gnu", "arm64")}
ALIGN_BYTES = 64  # operands, outputs, workspaces and padded copies start on a cache line, as on x86
DEFAULT_TIMEOUT_SECONDS = 600.0
WHY_NO_TIME = (
    "an emulated run's time says nothing about the target's speed (each instruction is emulated "
    "in software), so none is taken: speed is predicted only"
)


@dataclass(frozen=True)
class Emulator:
    """The tools that build and run a program for a foreign ISA on this machine."""

    arch: str
    qemu: str  # path of qemu-<arch>
    cpu: str  # qemu's -cpu model: the target's core where qemu models it, else "max"
    cc: str  # the cross C compiler, with a C library to link statically
    objcopy: str

    def describe(self) -> str:
        """How kernels run, e.g. ``qemu-aarch64 -cpu neoverse-n1``."""
        return f"{Path(self.qemu).name} -cpu {self.cpu}"


@dataclass(frozen=True)
class EmulatedCheck:
    """A kernel's final check under emulation: correctness only, no time."""

    correct: bool
    max_abs_error: float
    tolerance: float
    emulator: str  # e.g. "qemu-aarch64 -cpu neoverse-n1"
    emulated: bool = True


@dataclass(frozen=True, eq=False)
class EmulatedRun:
    """One kernel to run under emulation on its operands (A, B, bias or None)."""

    kernel: Kernel
    operands: Operands
    label: str = ""  # names the kernel in an error (default: its place in the batch)


def install_hint(arch: str) -> str:
    """The Debian packages that provide emulation and cross-linking for ``arch``."""
    triplet, debian_arch = CROSS_TOOLS[arch]
    packages = f"qemu-user gcc-{triplet} libc6-dev-{debian_arch}-cross"
    return f"install them with: apt-get install --no-install-recommends {packages}"


@functools.cache
def _qemu_cpus(qemu: str) -> frozenset[str]:
    """CPU models ``qemu -cpu help`` lists (empty when it cannot be asked)."""
    try:
        listed = subprocess.run(
            [qemu, "-cpu", "help"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(m.group(1) for m in re.finditer(r"^\s+(\S+)", listed, re.MULTILINE))


@functools.cache
def _static_libc_links(cc: str) -> bool:
    """Whether ``cc`` links a static C program with pthreads (its C library is installed)."""
    with tempfile.TemporaryDirectory(prefix="aotune-emu-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(
            "#include <pthread.h>\n#include <stdio.h>\n"
            'int main(void) { return printf("%p\\n", (void *)pthread_self()) < 0; }\n'
        )
        try:
            done = subprocess.run(
                [cc, "-static", "-pthread", str(src), "-o", str(Path(tmp) / "probe")],
                capture_output=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return done.returncode == 0


def find_emulator(hw: HwSpec) -> Emulator:
    """The emulator and cross tools for ``hw``'s ISA, or a FinalCheckError saying what is missing
    and which packages to install."""
    arch = hw.isa.arch
    if arch == detect_host().isa.arch:
        raise FinalCheckError(f"emulation is for a foreign ISA only, and this host is {arch} too")
    if arch not in CROSS_TOOLS:
        raise FinalCheckError(
            f"no emulated check for {arch} kernels yet (emulated: {', '.join(CROSS_TOOLS)})"
        )
    triplet, _ = CROSS_TOOLS[arch]
    tools = {
        name: shutil.which(name)
        for name in (f"qemu-{arch}", f"{triplet}-gcc", f"{triplet}-objcopy")
    }
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        raise FinalCheckError(
            f"{' and '.join(missing)} not found, needed to run {arch} kernels under emulation; "
            + install_hint(arch)
        )
    qemu, cc, objcopy = (str(path) for path in tools.values())
    if not _static_libc_links(cc):
        raise FinalCheckError(
            f"{triplet}-gcc cannot link a static program (is the {arch} C library missing?); "
            + install_hint(arch)
        )
    cpu = hw.isa.llvm_cpu if hw.isa.llvm_cpu in _qemu_cpus(qemu) else "max"
    return Emulator(arch, qemu, cpu, cc, objcopy)


def can_emulate(hw: HwSpec) -> tuple[bool, str]:
    """Whether ``hw``'s kernels can be checked under emulation here, and if not, why."""
    try:
        find_emulator(hw)
    except FinalCheckError as e:
        return False, str(e)
    return True, ""


# ---- the generated C driver ----------------------------------------------------------------------

_PRELUDE = r"""/* Generated by aotune (codegen/emulate.py): kernels run as HostKernel runs them */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*entry_fn)(float *, float *, float *, float *, int64_t, int64_t, float *, float *);

struct call { /* one share: one thread's call of a function with the entry's signature */
    entry_fn fn;
    float *p[4];
    int64_t lo, hi;
    float *ws[2];
};

static const char *dir;

static void die(const char *what, const char *name) {
    fprintf(stderr, "aotune-emu: %s %s\n", what, name);
    exit(3);
}

static void *run_call(void *arg) {
    struct call *c = arg;
    c->fn(c->p[0], c->p[1], c->p[2], c->p[3], c->lo, c->hi, c->ws[0], c->ws[1]);
    return NULL;
}

/* One phase of a call: share 0 on this thread, the others on a pthread each; then wait for all. */
static void run_phase(struct call *calls, int n) {
    pthread_t tid[n];
    for (int i = 1; i < n; i++)
        if (pthread_create(&tid[i - 1], NULL, run_call, &calls[i])) die("cannot start", "thread");
    run_call(&calls[0]);
    for (int i = 1; i < n; i++) pthread_join(tid[i - 1], NULL);
}

/* n floats on a cache line (+ offset floats), every one set to fill */
static float *buffer(size_t n, float fill, size_t offset) {
    size_t bytes = ((n + offset) * sizeof(float) + ALIGN - 1) / ALIGN * ALIGN;
    float *p = aligned_alloc(ALIGN, bytes ? bytes : ALIGN);
    if (!p) die("out of memory for", "a buffer");
    for (size_t i = 0; i < n + offset; i++) p[i] = fill;
    return p + offset;
}

static void release(float *p, size_t offset) { free(p - offset); }

static float *load(const char *name, size_t n, size_t offset) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    float *p = buffer(n, 0.0f, offset);
    if (fread(p, sizeof(float), n, f) != n || fgetc(f) != EOF) die("wrong size:", path);
    fclose(f);
    return p;
}

static void save(const char *name, const float *p, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, sizeof(float), n, f) != n || fclose(f)) die("cannot write", path);
}
"""


def _c_ptr(buffer: str | None) -> str:
    return buffer if buffer is not None else "NULL"


def _job_c(i: int, run: EmulatedRun, operand_set: int, calls: int, offset: int) -> str:
    """C of job ``i``: load the operands, allocate the plan's buffers, run ``calls`` calls (each
    into a fresh output filled with NaN, so an element the kernel never writes fails the check),
    save each output."""
    s = run.kernel.schedule
    plan: LaunchPlan = launch_plan(s)
    a_shape, b_shape, c_shape = s.shapes
    sizes = [int(np.prod(a_shape)), int(np.prod(b_shape)), int(np.prod(c_shape))]
    fn, pad = f"aotune_emu_{i}", f"aotune_emu_{i}_pad"
    lines = [
        f"extern void {fn}(float *, float *, float *, float *, int64_t, int64_t, float *, float *);"
    ]
    if plan.pad_operand:
        lines.append(
            f"extern void {pad}(float *, float *, float *, float *, int64_t, int64_t, float *, "
            "float *);"
        )
    lines += [
        f"static void job_{i}(void) {{",
        f'    float *A = load("a{operand_set}.f32", {sizes[0]}, {offset});',
        f'    float *B = load("b{operand_set}.f32", {sizes[1]}, {offset});',
        (
            f'    float *bias = load("bias{operand_set}.f32", {c_shape[-1]}, {offset});'
            if s.bias
            else "    float *bias = NULL;"
        ),
        f"    float *ws_a[{plan.threads}], *ws_b[{plan.threads}];",
        f"    for (int t = 0; t < {plan.threads}; t++) {{",
        f"        ws_a[t] = buffer({plan.ws_a_elems}, 0.0f, 0);",
        f"        ws_b[t] = buffer({plan.ws_b_elems}, 0.0f, 0);",
        "    }",
    ]
    if plan.pad_operand:
        # zeroed once and reused by every call, as the host runner does
        lines.append(f"    float *padded[{plan.pad_buffers}];")
        lines.append(
            f"    for (int p = 0; p < {plan.pad_buffers}; p++) "
            f"padded[p] = buffer({plan.pad_elems}, 0.0f, 0);"
        )
        src = "A" if plan.pad_operand == "a" else "B"
        lines.append(
            f"    static int64_t pad_rows[{max(1, len(plan.pad_rows))}] = "
            f"{{{', '.join(str(int(r)) for r in plan.pad_rows) or '0'}}};"
        )
        pad_calls = ", ".join(
            f"{{{pad}, {{{src}, padded[{b}], (float *)pad_rows, NULL}}, {lo}, {hi}, "
            "{NULL, NULL}}"
            for b, lo, hi in plan.pad_shares
        )
    shares = []
    for t, (lo, hi) in enumerate(plan.shares):
        a_op, b_op = "A", "B"
        if plan.pad_operand == "a":
            a_op = f"padded[{plan.padded_of_share[t]}]"
        elif plan.pad_operand == "b":
            b_op = f"padded[{plan.padded_of_share[t]}]"
        shares.append(
            f"{{{fn}, {{{a_op}, {b_op}, C, bias}}, {lo}, {hi}, {{ws_a[{t}], ws_b[{t}]}}}}"
        )
    lines += [
        f"    for (int rep = 0; rep < {calls}; rep++) {{",
        f'        fprintf(stderr, "aotune-emu: job {i} call %d\\n", rep);',
        f'        float *C = buffer({sizes[2]}, __builtin_nanf(""), {offset});',
    ]
    if plan.pad_operand:
        lines += [
            f"        struct call pads[] = {{{pad_calls}}};",
            f"        run_phase(pads, {len(plan.pad_shares)});",
        ]
    lines += [
        f"        struct call shares[] = {{{', '.join(shares)}}};",
        f"        run_phase(shares, {plan.threads});",
        "        char name[64];",
        f'        snprintf(name, sizeof name, "c{i}_%d.f32", rep);',
        f"        save(name, C, {sizes[2]});",
        f"        release(C, {offset});",
        "    }",
        f"    release(A, {offset});",
        f"    release(B, {offset});",
        f"    if (bias) release(bias, {offset});",
        f"    for (int t = 0; t < {plan.threads}; t++) {{",
        "        release(ws_a[t], 0);",
        "        release(ws_b[t], 0);",
        "    }",
    ]
    if plan.pad_operand:
        lines.append(f"    for (int p = 0; p < {plan.pad_buffers}; p++) release(padded[p], 0);")
    lines += ["}"]
    return "\n".join(lines)


def driver_source(
    runs: Sequence[EmulatedRun], operand_sets: Sequence[int], calls: int, offset: int
) -> str:
    """The C driver that runs every job in order (``main(argc, argv)``: argv[1] is the data
    directory)."""
    jobs = [_job_c(i, r, o, calls, offset) for i, (r, o) in enumerate(zip(runs, operand_sets))]
    main = ["int main(int argc, char **argv) {", '    if (argc != 2) die("usage:", "prog DIR");']
    main += ["    dir = argv[1];"] + [f"    job_{i}();" for i in range(len(runs))]
    main += ["    return 0;", "}"]
    return "\n\n".join([f"#define ALIGN {ALIGN_BYTES}\n" + _PRELUDE, *jobs, "\n".join(main)]) + "\n"


# ---- building and running ------------------------------------------------------------------------


def _tool(cmd: list[str], what: str, timeout: float) -> None:
    """Run a build tool; its failure is one FinalCheckError line."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise FinalCheckError(f"{what} did not finish in {timeout:g} s") from None
    except OSError as e:
        raise FinalCheckError(f"{what} could not start: {e.strerror}") from None
    if done.returncode != 0:
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), "")
        first = first or (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise FinalCheckError(f"{what} failed: {first.strip()}")


def run_program(
    emu: Emulator, program: Path, args: Sequence[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a static program for ``emu``'s ISA under qemu; a crash, a non-zero exit or a timeout is
    one FinalCheckError line (the last ``aotune-emu:`` line of its stderr says where it was)."""
    cmd = [emu.qemu, "-cpu", emu.cpu, str(program), *args]
    count_execution(f"program under {emu.describe()}")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        where = _last_step(e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or "")
        raise FinalCheckError(
            f"the emulated check did not finish in {timeout:g} s under {emu.describe()}{where}; "
            "emulation runs far slower than the target: pass --no-verify for this size"
        ) from None
    except OSError as e:
        raise FinalCheckError(f"{emu.describe()} could not start: {e.strerror}") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        said = next((ln for ln in reversed(lines) if not ln.startswith("aotune-emu: job")), "")
        why = (
            f"killed by signal {-done.returncode}"
            if done.returncode < 0
            else f"exit {done.returncode}"
        )
        raise FinalCheckError(
            f"the emulated check failed under {emu.describe()}{_last_step(done.stderr)}: {why}"
            + (f" ({said.strip()})" if said else "")
        )
    return done


def _named(message: str, runs: Sequence[EmulatedRun]) -> str:
    """``message`` with "kernel #i" replaced by run i's label, where it has one."""

    def label(m: re.Match[str]) -> str:
        i = int(m.group(1))
        return runs[i].label if i < len(runs) and runs[i].label else m.group(0)

    return re.sub(r"kernel #(\d+)", label, message)


def _last_step(stderr: str) -> str:
    steps = re.findall(r"aotune-emu: job (\d+) call (\d+)", stderr)
    return f" in kernel #{steps[-1][0]}, call {steps[-1][1]}" if steps else ""


def run_emulated(
    runs: Sequence[EmulatedRun],
    calls: int = 1,
    offset_floats: int = 0,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[list[np.ndarray]]:
    """Run every kernel of ``runs`` ``calls`` times in one emulated program; the outputs (float32,
    in C's shape) per run, per call.

    Inputs and outputs start ``offset_floats`` floats after a cache line (0: on one, as the host
    check and the model assume). Several runs may share operand arrays; each is written once.
    """
    if not runs:
        return []
    arches = {r.kernel.hw.isa.arch for r in runs}
    if len(arches) > 1:
        raise FinalCheckError(f"one emulated program runs one ISA; got {', '.join(sorted(arches))}")
    emu = find_emulator(runs[0].kernel.hw)
    triplet = CROSS_TOOLS[emu.arch][0]
    with tempfile.TemporaryDirectory(prefix="aotune-emu-") as tmp:
        work = Path(tmp)
        operand_ids: dict[tuple[int, ...], int] = {}
        operand_sets = []
        for r in runs:
            key = tuple(id(x) for x in r.operands)
            if key not in operand_ids:
                operand_ids[key] = n = len(operand_ids)
                a, b, bias = r.operands
                _write(work / f"a{n}.f32", a, r.kernel.schedule.shapes[0])
                _write(work / f"b{n}.f32", b, r.kernel.schedule.shapes[1])
                if bias is not None:
                    _write(work / f"bias{n}.f32", bias, (r.kernel.schedule.shapes[2][-1],))
            operand_sets.append(operand_ids[key])
        objects = []
        for i, r in enumerate(runs):
            raw, obj = work / f"k{i}.raw.o", work / f"k{i}.o"
            raw.write_bytes(r.kernel.object_code)
            renames = [f"--redefine-sym={r.kernel.entry}=aotune_emu_{i}"]
            if r.kernel.schedule.pad_copy is not None:
                renames.append(f"--redefine-sym={r.kernel.entry}_pad=aotune_emu_{i}_pad")
            _tool([emu.objcopy, *renames, str(raw), str(obj)], f"{triplet}-objcopy", 120)
            objects.append(str(obj))
        (work / "driver.c").write_text(driver_source(runs, operand_sets, calls, offset_floats))
        program = work / "check"
        _tool(
            [emu.cc, "-O1", "-static", "-pthread", "-o", str(program), str(work / "driver.c")]
            + objects
            + ["-lm"],
            f"{triplet}-gcc (linking the emulated check)",
            300,
        )
        try:
            run_program(emu, program, [str(work)], timeout)
        except FinalCheckError as e:  # name the kernel that was running, as the caller knows it
            raise FinalCheckError(_named(str(e), runs)) from None
        return [
            [
                np.fromfile(work / f"c{i}_{c}.f32", dtype=np.float32).reshape(
                    r.kernel.schedule.shapes[2]
                )
                for c in range(calls)
            ]
            for i, r in enumerate(runs)
        ]


def _write(path: Path, x: np.ndarray, shape: tuple[int, ...]) -> None:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != tuple(shape):
        raise FinalCheckError(f"kernel was built for an operand of shape {shape}; got {x.shape}")
    x.tofile(path)


def check_emulated(
    runs: Sequence[EmulatedRun],
    calls: int = 1,
    offset_floats: int = 0,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[EmulatedCheck]:
    """Run ``runs`` under emulation (one program) and check every call's output against the
    float64 numpy reference with the host check's tolerance."""
    outputs = run_emulated(runs, calls, offset_floats, timeout)
    if not runs:
        return []
    label = find_emulator(runs[0].kernel.hw).describe()
    checks = []
    for r, outs in zip(runs, outputs):
        s = r.kernel.schedule
        a, b, bias = r.operands
        with np.errstate(over="ignore"):
            ref = numpy_reference(s, a, b, bias)
        tol = tolerance(a, b, s.K, ref if s.has_epilogue else None)
        errs = [float(np.abs(got - ref).max(initial=0.0)) for got in outs]
        finite = all(bool(np.isfinite(got).all()) for got in outs)
        err = float(np.max(errs))  # NaN where an output is NaN, as in the host check
        checks.append(EmulatedCheck(finite and err <= tol, err, tol, label))
    return checks


def final_check_emulated(
    kernels: Sequence[Kernel],
    a: np.ndarray,
    b: np.ndarray,
    bias: np.ndarray | None = None,
    labels: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[EmulatedCheck]:
    """The final check of foreign-ISA kernels: all in one emulated program on the same inputs,
    each compared with numpy (``labels`` name them in an error). Never called by the search."""
    named = list(labels) + [""] * (len(kernels) - len(labels))
    runs = [EmulatedRun(k, (a, b, bias), label) for k, label in zip(kernels, named)]
    return check_emulated(runs, timeout=timeout)
