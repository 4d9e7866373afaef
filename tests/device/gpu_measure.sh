#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: time the kernels of a bundle that
# `python -m aotune.benchmarks.gpu_device prepare DIR` made on any machine (no GPU needed there).
# Needs only python3 with numpy and cuda-python here, not an installed aotune.
# Usage: tests/device/gpu_measure.sh DIR OUT   (then `... gpu_device score DIR --out OUT`)
set -uo pipefail
dir=${1:?bundle directory}
out=${2:?output directory}
root=$(cd "$(dirname "$0")/../.." && pwd)
pkg=$(mktemp -d)
ln -s "$root" "$pkg/aotune"  # the repository root is the aotune package
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit,memory.total \
    --format=csv >"$out/smi.txt" 2>&1
cat "$out/smi.txt"
python3 -c "import sys, numpy, cuda.bindings as c; print(sys.version.split()[0], 'numpy', \
numpy.__version__, 'cuda-bindings', c.__version__)" 2>&1 | tee "$out/versions.txt"
python3 -m aotune.benchmarks.gpu_device measure "$dir" --out "$out" 2>&1 | tee "$out/log.txt"
