#!/usr/bin/env bash
# Issue 41's round on the lent GPU, across as many device calls as it takes (each ≤ 10 minutes):
#   run(carry=[".gpu/whl", ".gpu/data", ".gpu/wide", ".gpu/state"], command="bash bench/wide_round.sh 570")
# then, here, after each call: rm -rf .gpu/state && mkdir .gpu/state && tar xzf <files_at>/state.tgz -C .gpu/state
# (the state goes back as one file: the device tool returns ~8 files a call)
# Each call picks up where the last stopped: the controller's GPU drain and scorer-worker tests (once;
# the round stops if they fail), the W12 entry's GPU tests (once), then `specpilot round
# --deployment wide-h200` with the memory agent (Phase 0 on its first call; a round cut short
# resumes), seal-check, refspec's CUDA tests, a hostile candidate against the carryover check
# (bench/hostile_gpu.py) and the W12 pass timing, each when the call has time.
# The SpecPilot home travels as .gpu/state/home.tgz when the machine was given back in between.
set -uo pipefail
deadline=$(( $(date +%s) + ${1:-570} ))
left() { echo $(( deadline - $(date +%s) )); }
source bench/gpu_env.sh >/dev/null 2>&1
state=.gpu/state; mkdir -p "$state"
if [ ! -f /root/sp/home/specpilot.db ] && [ -f "$state/home.tgz" ]; then
  rm -rf /root/sp/home && tar xzf "$state/home.tgz" -C /root/sp && echo "wide_round: home restored from $state/home.tgz"
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee -a "$state/devices.txt"
if ! grep -qs "^rc=0" "$state/drain.log"; then  # the controller's GPU drain and scorer on this device first: either broken spoils every verdict
  timeout 180 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_drain.py tests/gpu/test_scorer_worker_gpu.py > "$state/drain.log" 2>&1
  echo "rc=$?" >> "$state/drain.log"; grep -v '^$' "$state/drain.log" | tail -25
  if ! grep -q "^rc=0" "$state/drain.log"; then
    tar czf "$OUT/state.tgz" -C "$state" .
    echo "wide_round: the GPU drain or scorer-worker test failed (state/drain.log); the round is not started"; exit 1
  fi
fi
if [ ! -f "$state/tests.log" ] && [ "$(left)" -gt 400 ]; then  # once, passed or not: the round goes on
  timeout 150 python3 -m pytest -q tests/gpu/test_w12_entry_gpu.py > "$state/tests.log" 2>&1
  echo "rc=$?" >> "$state/tests.log"; tail -8 "$state/tests.log"
fi
if [ ! -f "$state/round_done" ] && [ "$(left)" -gt 150 ]; then
  steps=round,seal; [ -f "$state/round_ran" ] && steps=seal  # a finished round is not started again
  python3 bench/gpu_round.py --deployment wide-h200 --out "$state/r" --steps $steps --budget-s $(( $(left) - 40 ))
  python3 - "$state" <<'PY'
import json, pathlib, sys
state = pathlib.Path(sys.argv[1])
r = json.loads((state / "r/gpu_round_wide_h200.json").read_text())
if r.get("round_rc") == 0:
    (state / "round_ran").touch()
    if "seal_check_passed" in r:
        (state / "round_done").touch()
PY
fi
if [ -f "$state/round_done" ] && [ ! -f "$state/tests_cuda.log" ] && [ "$(left)" -gt 120 ]; then
  timeout 100 python3 -m pytest -q tests/gpu/test_refspec_cuda.py > "$state/tests_cuda.log" 2>&1
  echo "rc=$?" >> "$state/tests_cuda.log"; tail -5 "$state/tests_cuda.log"
fi
if [ -f "$state/round_done" ] && [ ! -f "$state/hostile_gpu.json" ] && [ "$(left)" -gt 200 ]; then
  # The carryover check on the device: GPU spin queued behind each answer must not be approved.
  (cd bench && timeout $(( $(left) - 30 )) python3 hostile_gpu.py --home /root/sp/home --deployment wide-h200 \
    --only queued-spin-10ms,queued-spin-pair --json "../$state/hostile_gpu.json" 2>&1 | tail -5)
fi
if [ -f "$state/round_done" ] && [ ! -f "$state/w12_pass.json" ] && [ "$(left)" -gt 150 ]; then
  timeout $(( $(left) - 20 )) python3 bench/w12_pass.py --model .gpu/wide/models/wide27b-8l --rounds 2 --rows 1,9 \
    --json "$state/w12_pass.json" 2>&1 | tail -20
fi
tar czf "$state/home.tgz" -C /root/sp home
tar czf "$OUT/state.tgz" -C "$state" .
echo "wide_round: $(left) s left of the call; state: $(ls "$state" | tr '\n' ' ')"
