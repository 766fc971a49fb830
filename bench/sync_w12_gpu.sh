#!/bin/sh
# Copy what a device run needs into /work/main/.gpu/w12 (ignored by git there); see kernels/w12/NOTES.md.
set -e
src=$(cd "$(dirname "$0")/.." && pwd)
dst=/work/main/.gpu/w12
rm -rf "$dst" && mkdir -p "$dst/specpilot/kernels" "$dst/gputests" "$dst/bench"
cp "$src/kernels/__init__.py" "$dst/specpilot/kernels/"
cp -r "$src/kernels/w12" "$dst/specpilot/kernels/"
rm -rf "$dst/specpilot/kernels/w12/__pycache__"
cp "$src/tests/gpu/test_w12_gpu.py" "$dst/gputests/"  # no __init__: a rootdir-less module
cp "$src/bench/w12_gemm.py" "$src/bench/w12_seeds.json" "$dst/bench/"
du -sh "$dst"
