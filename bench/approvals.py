"""Known lossless gains against stock, judged by the controller: do they still pass?

    python bench/approvals.py --deployment smollm-cpu --home DIR [--repeat 2] [--json OUT]
                              [--candidates refspec-adaptive-block,drafter.min_ngram=2]
                              [--baseline refspec-tree-verify]

Candidates (each a commit on stock in the deployment's workspace): by default `drafter.min_ngram = 2`
(a knob of refspec.toml) and the `refspec-draft-confidence` entry of the built-in bundle (its delta
applied to stock); `--candidates` names others, entries of the home's memory (`entry@knob=value`
for a variant: refspec-prompt-admission@admission.min_rows=256), or stock's `knob=value`. Each
is a full `controller.compare` against stock (sequential blocks, audit, stored verdict) in the
home's Phase 0 (run first if the home has none). `--baseline` names an entry to judge against
instead of stock (e.g. the shared budget against the equal per-request trees of tree-verify).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specpilot import controller
from specpilot.deployments import Home, load_deployment, set_knob
from specpilot.memory_store import connect, git_bytes, open_memory, records
from specpilot.memory_store.workspace import Workspace
from specpilot.orchestrator.sealing import ensure_builtin


def knob_branch(ws: Workspace, name: str, knob: str, value: int) -> str:
    if f"cand/{name}" not in ws.branches():
        wt = ws.add_worktree(name, "stock")
        set_knob(wt / "refspec.toml", knob, value)
        ws.commit_worktree(wt, f"{knob} = {value}")
    return f"cand/{name}"


def entry_branch(ws: Workspace, home: Home, dep, entry: str, knob: str | None = None) -> str:
    """Stock + the entry's delta (its requirements first), as the memory agent applies it; with
    `knob` ("section.key=value") one knob of the entry's knob file (knobs/<section>.toml) set too."""
    name = entry if knob is None else f"{entry}-{knob.replace('.', '-').replace('_', '-').replace('=', '-')}"
    if f"cand/{name}" not in ws.branches():
        memory = open_memory(home)
        ensure_builtin(memory, dep)
        wt = ws.add_worktree(name, "stock")
        for e in memory.resolve([entry]):
            git_bytes(wt, "apply", "--whitespace=nowarn", "-", input=e.delta.encode())
        if knob is not None:
            key, value = knob.split("=")
            set_knob(wt / "knobs" / f"{key.split('.')[0]}.toml", key, int(value))
        ws.commit_worktree(wt, f"stock + {entry}" + (f" ({knob})" if knob else ""))
    return f"cand/{name}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--deployment", default="smollm-cpu")
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--candidates", default="drafter.min_ngram=2,refspec-draft-confidence")
    ap.add_argument("--baseline", default="stock", help="stock, or an entry of the home's memory")
    args = ap.parse_args()
    home = Home.resolve(args.home)
    dep = load_deployment(args.deployment, home)
    ws, _ = Workspace.init(home, dep)
    if records.get_state(connect(home), dep.name, "phase0") is None:
        controller.run_phase0(dep, home)
    p0 = records.get_state(connect(home), dep.name, "phase0")
    keep = ("stock_tree", "delta", "requests", "stock_equals_ar", "stock_over_ar_by_batch")
    phase0 = {k: p0[k] for k in keep if k in p0}
    print(json.dumps({"phase0": phase0}), flush=True)
    baseline = "stock" if args.baseline == "stock" else entry_branch(ws, home, dep, args.baseline)
    cands = {}
    for c in args.candidates.split(","):
        if "@" in c:  # entry@section.key=value: a variant of the entry
            entry, knob = c.split("@")
            cands[c] = entry_branch(ws, home, dep, entry, knob)
        elif "=" in c:
            knob, value = c.split("=")
            cands[f"{knob} = {value}"] = knob_branch(
                ws, f"{knob.replace('.', '-').replace('_', '-')}-{value}", knob, int(value)
            )
        else:
            cands[c] = entry_branch(ws, home, dep, c)
    rows = []
    for _ in range(args.repeat):
        for label, branch in cands.items():
            t = time.monotonic()
            ev = controller.compare(dep, home, baseline, branch)
            rows.append({"candidate": label, "baseline": args.baseline, "approved": ev.approved, "gain": ev.gain, "lower_bound": ev.lower_bound,
                         "threshold": ev.threshold, "blocks": ev.evidence.get("n"), "seconds": time.monotonic() - t,
                         "changes_output": ev.changes_output, "audit_passed": (ev.evidence.get("audit") or {}).get("passed"),
                         "verdict": ev.id, "reasons": ev.reasons})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(
                    json.dumps({"deployment": dep.name, "phase0": phase0, "rows": rows}, indent=1) + "\n"
                )


if __name__ == "__main__":
    main()
