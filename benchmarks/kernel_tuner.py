"""Kernel Tuner cache files: kernels other people timed on real GPUs, read as data.

Roadmap: ``read_cache`` reads one cache file (plain or gzipped JSON, including the unterminated
form Kernel Tuner leaves while it is still tuning) into a frozen ``KernelTunerCache``; the
mapping of its parameters to aotune configs lives with the kernel family it belongs to
(``constraints/xgemm.py`` for CLBlast's Xgemm), and the scoring in ``benchmarks/measured.py``.

The format, as Kernel Tuner writes it: top-level ``device_name``, ``kernel_name``,
``problem_size``, ``tune_params_keys``, ``tune_params`` and ``cache``, a map from the
comma-joined parameter values to an entry holding every parameter, ``time`` (the mean of the
runs, in milliseconds) and more. Kernel Tuner writes the header without its two closing braces
and appends one entry and a comma at a time, closing the file only when tuning ends; a failed
configuration carries a string in ``time`` (``"InvalidConfig"``, ``"CompilationFailedConfig"``,
``"RuntimeFailedConfig"``).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotune.errors import MeasurementFileError
from aotune.files import decode_utf8, printable, read_user_file

GZIP_MAGIC = b"\x1f\x8b"
# what Kernel Tuner writes as the time of a configuration that failed (its ErrorConfig kinds)
FAILURE_MARKERS = (
    "InvalidConfig",
    "CompilationFailedConfig",
    "RuntimeFailedConfig",
    "ErrorConfig",
)
WHAT = "Kernel Tuner cache file"
UNKNOWN_DEVICE = "unknown device"  # a file that names no device_name
# a brute-forced space of ~18,000 configs is 4 MB gzipped and 40 MB of JSON
FILE_LIMIT_BYTES = 1 << 30
TEXT_LIMIT_BYTES = 4 << 30


@dataclass(frozen=True)
class MeasuredConfig:
    """One timed configuration: its parameters and its mean time."""

    key: str  # the cache's key: the comma-joined parameter values
    params: tuple[tuple[str, int], ...]
    milliseconds: float

    def as_dict(self) -> dict[str, int]:
        """Parameter name -> value."""
        return dict(self.params)


@dataclass(frozen=True)
class KernelTunerCache:
    """A Kernel Tuner cache file: what was tuned, where, and every timed configuration."""

    path: str
    device_name: str
    kernel_name: str
    problem_size: tuple[int, ...]
    tune_params_keys: tuple[str, ...]
    tune_params: tuple[tuple[str, tuple[int, ...]], ...]
    configs: tuple[MeasuredConfig, ...]
    failed: int  # entries whose time is a failure string, not a measurement
    truncated: bool  # the file ended without its closing braces (tuning still running)


def _text(path: Path) -> str:
    """The file's JSON text, decompressed if it is gzipped (by its magic bytes, not its name)."""
    raw = read_user_file(path, WHAT, MeasurementFileError, FILE_LIMIT_BYTES)
    if raw[:2] == GZIP_MAGIC:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as z:
                raw = z.read(TEXT_LIMIT_BYTES + 1)
        except (OSError, EOFError, zlib.error) as e:
            raise MeasurementFileError(
                f"{path}: the gzip stream is damaged ({e}); copy or download the file again"
            ) from None
        if len(raw) > TEXT_LIMIT_BYTES:
            raise MeasurementFileError(
                f"{path} unpacks to more than {TEXT_LIMIT_BYTES >> 20} MiB; is it a cache file?"
            )
        if raw[:2] == GZIP_MAGIC:
            raise MeasurementFileError(
                f"{path} is gzipped twice: unpack it once (gunzip -c {path} > cache.json.gz)"
            )
        if not raw.strip():
            raise MeasurementFileError(f"{path} unpacks to no text; pass a Kernel Tuner cache file")
    return decode_utf8(raw, path, WHAT, MeasurementFileError)


def _loads(text: str, path: Path) -> Any:
    """``json.loads``, with JSON nested too deeply for the parser, or a number too long for it,
    as a MeasurementFileError (a JSONDecodeError is left to the caller, which may mend a file cut
    off while tuning)."""

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # json keeps the last of a repeated key silently: a config timed twice, or a header
        # field given twice, would change the scores without a word
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise MeasurementFileError(
                    f"{path}: {printable(key)[:120]!r} is given twice in one JSON object (a config "
                    "or field repeated; which one counts is not known): keep one and rerun"
                )
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise MeasurementFileError(
            f"{path} is not a Kernel Tuner cache file (JSON nested too deeply)"
        ) from None
    except ValueError:  # an integer of thousands of digits
        raise MeasurementFileError(
            f"{path} is not a Kernel Tuner cache file (a number of thousands of digits)"
        ) from None


def _parse(text: str, path: Path) -> tuple[dict, bool]:
    """The JSON document, closing it as Kernel Tuner would if it ends unterminated."""
    if not text.strip():
        raise MeasurementFileError(f"{path} is empty; pass a Kernel Tuner cache file")
    try:
        doc = _loads(text, path)
        truncated = False
    except json.JSONDecodeError:
        body = text.rstrip()
        # written while tuning: the header ends in '"cache": {' and every entry in ','
        if body.endswith(","):
            body = body[:-1]
        try:
            doc = _loads(body + "}\n}", path)
        except json.JSONDecodeError as e:
            raise MeasurementFileError(
                f"{path} is not a Kernel Tuner cache file (invalid JSON at line {e.lineno}, "
                f"column {e.colno}, and not a cache cut off after an entry)"
            ) from None
        truncated = True
    if not isinstance(doc, dict):
        raise MeasurementFileError(f"{path} holds a JSON {type(doc).__name__}, not a cache object")
    return doc, truncated


REQUIRED = ("kernel_name", "tune_params_keys", "cache")


# a kernel parameter (a tile size, a vector width, a switch) beyond this is no real config
MAX_PARAM = 1 << 20


def _int_param(value: object, name: str, key: str, path: Path) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value != int(value)
    ):
        raise MeasurementFileError(
            f"{path}: entry {key!r} has {name}={_json_text(value)}; aotune maps only integer "
            "parameters"
        )
    if not 0 <= value <= MAX_PARAM:
        raise MeasurementFileError(
            f"{path}: entry {key!r} has {name}={str(value)[:24]}; a kernel parameter is an "
            f"integer in 0..{MAX_PARAM}: the file is damaged"
        )
    return int(value)


LABEL_CHARS = 120  # a device or kernel name is printed: longer is not a name


def _label(text: str) -> str:
    """A name from the file as it may be printed: characters a terminal would act on (escapes,
    bidirectional overrides) shown as '?', and at most ``LABEL_CHARS`` of them."""
    shown = printable(text)
    return shown if len(shown) <= LABEL_CHARS else shown[: LABEL_CHARS - 3] + "..."


def _json_text(value: object) -> str:
    """A value as the file writes it, shortened: the string "64" in quotes, unlike 64."""
    try:
        text = json.dumps(value)
    except ValueError:  # NaN and infinities, which Python's JSON reads but strict JSON has not
        text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


def _problem_size(value: object, path: Path) -> tuple[int, ...]:
    """The file's problem size: a list of positive integers (a bare one for a 1-D problem)."""
    size = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(size, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size
    ):
        raise MeasurementFileError(
            f"{path}: problem_size is {value!r}, not a list of positive integers (Kernel Tuner "
            "writes the problem's sizes, e.g. [4096, 4096]); fix it in the file"
        )
    return tuple(size)


def read_cache(path: str | Path) -> KernelTunerCache:
    """Read a Kernel Tuner cache file (plain or gzipped, closed or still being written)."""
    path = Path(path)
    doc, truncated = _parse(_text(path), path)
    missing = [k for k in REQUIRED if k not in doc]
    if missing and "results" in doc and "schema_version" in doc:
        # Kernel Tuner's T4 output (store_output_file), as the auto-tuning benchmark hub
        # publishes beside its caches: it names no kernel, device or problem size
        raise MeasurementFileError(
            f"{path} is a T4 results file (schema {_json_text(doc['schema_version'])}), which "
            "names no kernel, device or problem size; pass the Kernel Tuner cache file of the "
            "same run (tune_kernel's cache=...) instead"
        )
    if missing:
        raise MeasurementFileError(
            f"{path} lacks {', '.join(missing)}: not a Kernel Tuner cache file"
        )
    keys = doc["tune_params_keys"]
    cache = doc["cache"]
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise MeasurementFileError(f"{path}: tune_params_keys is not a list of names")
    if not isinstance(cache, Mapping):
        raise MeasurementFileError(f"{path}: cache is not an object of entries")
    configs, failed = [], 0
    for key, entry in cache.items():
        if not isinstance(entry, Mapping):
            raise MeasurementFileError(f"{path}: entry {key!r} is not an object")
        absent = [k for k in (*keys, "time") if k not in entry]
        if absent:
            raise MeasurementFileError(f"{path}: entry {key!r} lacks {', '.join(absent)}")
        t = entry["time"]
        if isinstance(t, str):
            if t not in FAILURE_MARKERS:
                raise MeasurementFileError(
                    f"{path}: entry {key!r} has time {t!r}; a time is a positive number of ms, "
                    f"or one of Kernel Tuner's failure markers ({', '.join(FAILURE_MARKERS)})"
                )
            failed += 1
            continue
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise MeasurementFileError(
                f"{path}: entry {key!r} has time {t!r}; a time is a positive number of ms"
            )
        params = tuple((k, _int_param(entry[k], k, key, path)) for k in keys)
        configs.append(MeasuredConfig(str(key), params, float(t)))
    tune_params = doc.get("tune_params", {})
    if not isinstance(tune_params, Mapping):
        raise MeasurementFileError(
            f"{path}: tune_params is a JSON {type(tune_params).__name__}, not an object of "
            "parameter values"
        )
    device = doc.get("device_name")
    return KernelTunerCache(
        path=str(path),
        device_name=_label(device) if isinstance(device, str) and device else UNKNOWN_DEVICE,
        kernel_name=_label(str(doc["kernel_name"])),
        problem_size=_problem_size(doc.get("problem_size", []), path),
        tune_params_keys=tuple(keys),
        tune_params=tuple(
            (str(k), tuple(v) if isinstance(v, list) else (v,)) for k, v in tune_params.items()
        ),
        configs=tuple(configs),
        failed=failed,
        truncated=truncated,
    )
