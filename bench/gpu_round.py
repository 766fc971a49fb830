"""The loop on one GPU, end to end: refspec against HF, a round, seal-check, A/A comparisons.

    python bench/gpu_round.py --out DIR [--steps speed,round,seal,judge,entries] [--aa 10] [--gain3 10] [--budget-s 540]
                              [--entries refspec-tlv,...]

Run after `source bench/gpu_env.sh` on the lent H200 (bench/gpu_prepare.sh says how the weights
and packages get there). `--deployment` picks the one-GPU refspec deployment (smollm-h200 by
default; wide-h200, the read-bound target). Steps, each written to DIR/gpu_round_<deployment>.json
as it finishes:
- speed: bench/refspec_cuda.py on the smollm-h200 requests with the real SmolLM2 weights: refspec
  AR and stock spec ms per token (CUDA graphs), HF Transformers `generate` on the same prompts;
- round: `specpilot round --deployment smollm-h200` (memory agent), its wall time and verdicts;
- seal: `specpilot seal-check --all`;
- judge: `--aa` A/A comparisons (stock against a no-op commit of stock, the copy as candidate and
  as baseline in turn) and `--gain3` of a calibrated 3% gain, alternating, in the one-GPU design
  (keys aa_*, gain3_*);
- entries: each of `--entries` (built from stock by `specpilot memory replay`, committed as
  `cand/entry-<name>`) judged against stock by `controller.compare`, with its audit.
Steps stop starting once the budget is spent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEP = "smollm-h200"


def set_deployment(name: str) -> None:
    global DEP
    DEP = name


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from specpilot.orchestrator.cli import main; main()", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", default="speed,round,seal,judge")
    ap.add_argument("--aa", type=int, default=10, help="A/A comparisons of the judge step")
    ap.add_argument("--gain3", type=int, default=0, help="calibrated 3%% comparisons of the judge step")
    ap.add_argument(
        "--speed-repeats", type=int, default=1, help="serve the speed step's prompts this many times"
    )
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--entries", default="", help="memory entries the entries step judges against stock")
    ap.add_argument("--deployment", default=DEP, help="a one-GPU refspec deployment (smollm-h200, wide-h200)")
    args = ap.parse_args()
    set_deployment(args.deployment)
    t_start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - t_start)  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    result_file = args.out / f"gpu_round_{DEP.replace('-', '_')}.json"
    res: dict = json.loads(result_file.read_text()) if result_file.is_file() else {}

    def save() -> None:
        result_file.write_text(json.dumps(res, indent=1))

    from specpilot.deployments import Home, load_deployment
    from specpilot.deployments.workloads import request_file

    home = Home.resolve()
    dep = load_deployment(DEP, home)
    steps = args.steps.split(",")
    if "speed" in steps and left() > 60:
        req = request_file(dep, home)
        from specpilot.controller.refspec_system import weights_folder

        folder = weights_folder(dep, home)
        t = time.monotonic()
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "refspec_cuda.py"), "--model", str(folder),
                               "--requests", str(req), "--prompts", "12", "--tokens", str(dep.workload.max_new_tokens), "--repeats", str(args.speed_repeats),
                               "--json", str(args.out / "refspec_cuda_smollm_h200.json")],
                              capture_output=True, text=True, timeout=max(60, left()))  # fmt: skip
        print(proc.stdout[-3000:], proc.stderr[-2000:], flush=True)
        if proc.returncode == 0:
            sp = json.loads((args.out / "refspec_cuda_smollm_h200.json").read_text())
            res |= {"ar_ms_per_token": sp["ar"]["ms_per_token"], "spec_ms_per_token": sp["spec"]["ms_per_token"],
                    "hf_ar_ms_per_token": sp.get("hf_ar_ms_per_token"), "spec_speedup_over_ar": sp["spec_speedup_over_ar"],
                    "tau": sp["spec"]["tau"], "ar_step_ms": sp["ar_step_ms"], "spec_equals_ar": sp["spec_equals_ar"],
                    "speed_s": time.monotonic() - t}  # fmt: skip
        save()
    if "round" in steps and left() > 120:
        from specpilot.memory_store import connect, records

        last = records.get_round(connect(home), DEP)
        again = ["--resume", str(last.number)] if last is not None and last.status != "done" else []
        t = time.monotonic()
        try:  # a round cut short by the budget is saved step by step: the next call resumes it
            proc = cli("round", "--deployment", DEP, "--agent", "memory", *again, timeout=max(60, left()))
            rc, log = proc.returncode, proc.stdout + "\n" + proc.stderr
        except subprocess.TimeoutExpired as e:  # its output comes as bytes on POSIX, whatever `text` says
            text_of = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
            rc, log = "timeout", f"{text_of(e.stdout)}\n{text_of(e.stderr)}"
        # wall seconds of this call's part of the round, summed over the calls that resumed it
        res["round_wall_s"] = (res.get("round_wall_s", 0) if again else 0) + time.monotonic() - t
        res["round_rc"], res["round_resumed"] = rc, bool(again)
        (args.out / "round.log").write_text(log)
        print(log[-5000:], flush=True)
        rep = cli("--json", "report", "-d", DEP, timeout=120)
        if rep.returncode == 0:
            (args.out / "round_report.json").write_text(rep.stdout)
        text = cli("report", "-d", DEP, timeout=120)
        (args.out / "round_report.txt").write_text(text.stdout)
        db = connect(home)
        last = records.get_round(db, DEP)
        if last is not None:
            evs = last.state.get("evaluations", {})
            res["verdicts"] = [{"entry": d.get("entry") or d.get("title"), "gain": evs.get(str(i), {}).get("gain"),
                                "lower_bound": evs.get(str(i), {}).get("lower_bound"),
                                "approved": evs.get(str(i), {}).get("approved"),
                                "reasons": evs.get(str(i), {}).get("reasons")}
                               for i, d in enumerate(last.state.get("directions", []))]  # fmt: skip
            noise = records.get_state(db, DEP, "noise") or {}
            res["phase0_sigma"] = noise.get("sigma")
        save()
    if "seal" in steps and left() > 20:
        proc = cli("seal-check", "--all", timeout=max(20, left()))
        res["seal_check_passed"] = proc.returncode == 0
        res["seal_check_tail"] = proc.stdout[-1500:]
        save()
    if "judge" in steps:
        judge(dep, home, res, args, left, save)
    if "entries" in steps:
        for name in filter(None, args.entries.split(",")):
            if left() > 45:
                judge_entry(dep, home, name, res, args.out)
                save()
    res["total_s"] = time.monotonic() - t_start
    save()
    print(json.dumps({k: v for k, v in res.items() if k not in ("seal_check_tail", "aa_rows")}, indent=1))


def aa_copy(dep, home) -> str:
    """Phase 0 (if not run) and `cand/aa-copy`: stock with one comment added (another tree hash)."""
    from controller_aa import aa_copy as copy  # bench/ is this script's folder

    from specpilot import controller
    from specpilot.memory_store import connect, records
    from specpilot.memory_store.workspace import Workspace

    ws, _ = Workspace.init(home, dep)
    if records.get_state(connect(home), dep.name, "phase0") is None:
        controller.run_phase0(dep, home)
    return copy(ws)


def judge(dep, home, res: dict, args, left, save) -> None:
    """A/A (stock against a copy of stock differing by one comment) and a calibrated 3% gain (stock
    against stock with a CPU burn per decode step worth 3% of its step, bench/controller_aa.py),
    alternating, `--aa` and `--gain3` comparisons, so a run cut short by its budget has both."""
    from controller_aa import slowed

    from specpilot import controller
    from specpilot.memory_store import connect, records
    from specpilot.memory_store.workspace import Workspace

    db = connect(home)
    copy, slow = aa_copy(dep, home), slowed(Workspace.init(home, dep)[0], dep, home, 0.03)
    pairs = {  # A/A alternates which side the copy is on: a lean that follows the copy is the copy's own
        "aa": lambda n: ("stock", copy) if n % 2 == 0 else (copy, "stock"),
        "gain3": lambda n: (slow, "stock"),
    }
    want = {"aa": args.aa, "gain3": args.gain3}
    while left() > 60:
        todo = [k for k in ("aa", "gain3") if len(res.get(f"{k}_rows", [])) < want[k]]
        if not todo:
            break
        kind = min(todo, key=lambda k: len(res.get(f"{k}_rows", [])) / want[k])
        rows = res.setdefault(f"{kind}_rows", [])
        t = time.monotonic()
        base, cand = pairs[kind](len(rows))
        ev = controller.compare(dep, home, base, cand)
        raw = Path(ev.evidence.get("raw", ""))
        if raw.is_file():  # per request: send/done times and every token's arrival, for the noise study
            shutil.copy(raw, args.out / f"{kind}-{len(rows) + 1}.jsonl")
        rows.append({"baseline": base, "candidate": cand, "gain": ev.gain, "lower_bound": ev.lower_bound, "approved": ev.approved, "threshold": ev.threshold,
                     "sigma": ev.sigma, "blocks": ev.evidence.get("n"), "seconds": time.monotonic() - t,
                     "reasons": ev.reasons})  # fmt: skip
        print(f"{kind} {len(rows)}: gain {ev.gain:.4f} LB {ev.lower_bound:.4f} bar {ev.threshold:.2%} "
              f"{'APPROVED' if ev.approved else 'rejected'} {rows[-1]['seconds']:.0f}s {ev.reasons}", flush=True)  # fmt: skip
        noise = records.get_state(db, dep.name, "noise") or {}
        res[f"{kind}_comparisons"] = len(rows)
        res[f"{kind}_approved"] = sum(bool(r["approved"]) for r in rows)
        res[f"{kind}_median_s"] = statistics.median(r["seconds"] for r in rows)
        res |= {"aa_sigma": noise.get("sigma"), "aa_pooled_block_sd": noise.get("pooled_sd")}
        save()


def gpu_turns(raw: Path) -> dict:
    """Per system (A baseline, B candidate), from a comparison's raw record: its turns, those the
    GPU watch saw throttled (by reason) and its SM clock range: whose turns a disturbance hit; and
    the turns after which the GPU was drained, those with kernels seen past the answer."""
    out: dict = {}
    for line in raw.read_text().splitlines() if raw.is_file() else []:
        for turn in json.loads(line).get("turns", []):
            for label, g in turn.get("gpu", {}).items():
                s = out.setdefault(label, {"turns": 0, "throttled": {}})
                s["turns"] += 1
                for why in g.get("throttle", []):
                    s["throttled"][why] = s["throttled"].get(why, 0) + 1
                if "busy_after_answer_s" in g:
                    s["drained"] = s.get("drained", 0) + 1
                    s["busy_after_answer"] = s.get("busy_after_answer", 0) + (g["busy_after_answer_s"] != 0.0)
                    s["drain_s"] = round(s.get("drain_s", 0.0) + g.get("drain_s", 0.0), 3)
                if g.get("sm_mhz_min") is not None:
                    s["sm_mhz_min"] = min(s.get("sm_mhz_min", g["sm_mhz_min"]), g["sm_mhz_min"])
                    s["sm_mhz_max"] = max(s.get("sm_mhz_max", g["sm_mhz_max"]), g["sm_mhz_max"])
    return out


def judge_entry(dep, home, name: str, res: dict, out: Path) -> None:
    """Stock against stock + the entry (and its requirements), one `controller.compare` with its audit."""
    from specpilot import controller
    from specpilot.memory_store import open_memory
    from specpilot.memory_store.workspace import Workspace
    from specpilot.orchestrator.sealing import ensure_builtin

    ws, _ = Workspace.init(home, dep)
    ensure_builtin(open_memory(home), dep)
    aa_copy(dep, home)  # Phase 0 first, if this home has none
    branch = f"cand/entry-{name}"
    if branch not in ws.branches():
        tree = out / f"entry-{name}"
        proc = cli("memory", "replay", "-d", DEP, "--entries", name, "--out", str(tree), timeout=300)
        if proc.returncode != 0:
            res.setdefault("entry_verdicts", []).append(
                {"entry": name, "error": proc.stdout[-800:] + proc.stderr[-800:]}
            )
            return
        wt = ws.add_worktree(f"entry-{name}", "stock")
        for p in wt.iterdir():
            if p.name != ".git":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        shutil.copytree(tree, wt, dirs_exist_ok=True)
        ws.commit_worktree(wt, f"memory entry {name} on stock")
        shutil.rmtree(tree)
    t = time.monotonic()
    ev = controller.compare(dep, home, "stock", branch)
    row = {"entry": name, "verdict": ev.id, "gain": ev.gain, "lower_bound": ev.lower_bound, "approved": ev.approved,
           "threshold": ev.threshold, "sigma": ev.sigma, "blocks": ev.evidence.get("n"),
           "seconds": time.monotonic() - t, "audit": ev.evidence.get("audit"), "reasons": ev.reasons}  # fmt: skip
    if row["audit"] is None:  # the compare audits only an approval or a changed output: audit it alone
        t = time.monotonic()
        audit = controller.audit_system(dep, home, branch)
        row["standalone_audit"] = {k: audit.get(k) for k in ("passed", "rate", "mismatches", "positions",
                                   "stock_rate", "stock_mismatches", "stock_positions", "large", "stock_large",
                                   "p_large", "unexplained", "reasons")} | {"seconds": time.monotonic() - t}  # fmt: skip
    row["changed_requests"] = ev.evidence.get("changed_requests")
    row["gpu_turns"] = gpu_turns(Path(ev.evidence["raw"])) if ev.evidence.get("raw") else None
    res.setdefault("entry_verdicts", []).append(row)
    print(json.dumps(row, indent=1, default=str), flush=True)


if __name__ == "__main__":
    main()
