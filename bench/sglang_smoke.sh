#!/usr/bin/env bash
# SGLang smoke test for a machine with two GPUs: Phase 0 and one paired, slot-swapped comparison.
#
# Nothing SGLang-related has been run on a GPU by the project yet; this script is how to do it.
# CI runs it only on CPU slots against a protocol fake of the server (tests/controller/
# test_sglang_judge.py), which checks the steps, not SGLang (see docs/ARCHITECTURE.md, "SGLang").
#
# Needs:
#   - two CUDA GPUs, the deployment's slots (cuda:0 and cuda:1 in the shipped specs);
#   - `pip install -e '.[sglang]'` in this environment: sglang==0.5.20 and its CUDA dependencies
#     (a CUDA build of torch). Servers run with this interpreter, or with SPECPILOT_SGLANG_PYTHON;
#   - the target and drafter weights downloaded beforehand (servers run with HF_HUB_OFFLINE=1;
#     HF_HOME / HF_HUB_CACHE are passed through), e.g. `huggingface-cli download Qwen/Qwen3.8-27B`;
#   - a copy of the deployment under $SPECPILOT_HOME/deployments/<name>.toml whose target.model is
#     the target's local folder (request files are tokenized offline from its tokenizer.json) and,
#     for GSM8K / MATH500 / MBPP, those sets under $SPECPILOT_HOME/datasets/ or `pip install datasets`.
#
# Usage: bench/sglang_smoke.sh DEPLOYMENT [BLOCKS]
#   1. workspace init: the stock tree from the pinned wheel (pip download --no-deps, then offline);
#   2. workloads fetch: the deployment's request file;
#   3. phase0: stock against its own AR (δ, stock's token-forcing figures), stock noise σ;
#   4. a candidate "smoke-ar": stock with decode.mode = "ar" in specpilot-launch.toml;
#   5. controller compare, AR as baseline and stock as candidate: the deployment's speculative
#      speedup over AR on the controller's clock (the verdict's gain and lower bound are the figures
#      to read), with the token-forcing audit of stock's own output, which must pass. The verdict:
#      approved when stock beats AR by the margin; above 3x the controller flags the gain for review
#      instead (the paper's Qwen3.8-27B stock is ~4x AR); the paper's Gemma-4 EAGLE-3 stock is slower
#      than AR, so that one is rejected;
#   6. report: the verdict. Server logs are under $SPECPILOT_HOME/runs/<run id>/ and runs/scorer/.
set -euo pipefail

dep=${1:?usage: bench/sglang_smoke.sh DEPLOYMENT [BLOCKS]}
blocks=${2:-5}
export SPECPILOT_HOME=${SPECPILOT_HOME:-$PWD/.specpilot}

if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=index,name,memory.total --format=csv; fi
specpilot deployments show "$dep"
specpilot workspace init --deployment "$dep"
specpilot workloads fetch -d "$dep"
specpilot phase0 --deployment "$dep" --blocks "$blocks"

repo="$SPECPILOT_HOME/workspaces/$dep/repo"
wt="$SPECPILOT_HOME/workspaces/$dep/worktrees/smoke-ar"
if ! git -C "$repo" rev-parse -q --verify refs/heads/cand/smoke-ar >/dev/null; then
  git -C "$repo" worktree add -q -B cand/smoke-ar "$wt" stock
  python - "$wt/specpilot-launch.toml" <<'EOF'
import sys
from pathlib import Path
from specpilot.deployments.knobs import set_knob
set_knob(Path(sys.argv[1]), "decode.mode", "ar")
EOF
  git -C "$wt" commit -q -am "smoke: AR (speculative decoding off)"
fi

specpilot controller compare --deployment "$dep" --baseline cand/smoke-ar --candidate stock --blocks "$blocks"
specpilot report
