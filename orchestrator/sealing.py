"""What a round does with the memory: summarize it for the master, combine approved patches, and
seal the new system as stock + entries (storing the round's own code as a new entry)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specpilot import controller
from specpilot.controller import Slot, checkout, lease
from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import (
    EntryMeta,
    Memory,
    add_entry,
    builtin_bundles,
    git_run,
    git_try,
    import_bundle,
    list_systems,
    records,
    replay,
    seal_check,
    seal_system,
)

if TYPE_CHECKING:
    from specpilot.memory_store import Workspace

    from .roundview import RoundView


def ensure_builtin(memory: Memory, dep: Deployment) -> None:
    """The built-in bundle of the deployment's engine is in the memory (imported once)."""
    path = builtin_bundles().get(dep.engine)
    if path is not None:
        import_bundle(memory, path)


def system_entries(db, dep: Deployment, tree: str) -> list[str]:
    """The entries a sealed system of this deployment was built from ([] for stock)."""
    hits = [s for s in list_systems(db, dep.name) if s.tree == tree]
    return list(hits[-1].entries) if hits else []


# A layer's bf16 bytes above which refspec's CUDA path runs its per-phase kernels, not the persistent
# pass (refspec/cuda_graphs.py's PERSIST_MAX_LAYER_BYTES): where a weight-format mechanism can act.
READ_BOUND_LAYER_BYTES = 64 << 20


def fits_target(options: dict[str, Any], dep: Deployment) -> bool:
    """Whether an entry acts on this deployment: `target = "hybrid"` needs a target with GDN layers,
    `target = "gpu"` GPU slots (a mechanism that can gain only through a GPU kernel), `target =
    "read-bound"` GPU slots and layers of more than READ_BOUND_LAYER_BYTES in bf16 (a mechanism of
    the per-phase kernels' weight reads), `target = "batch"` a batch deployment (a mechanism of
    batch serving)."""
    target = options.get("target")
    if target == "hybrid":
        return dep.target.arch.gdn_layers > 0
    if target == "gpu":
        return dep.devices.kind != "cpu"
    if target == "read-bound":
        a = dep.target.arch
        q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        layer_bytes = 2 * a.hidden * (2 * q + 2 * kv + 3 * a.intermediate)
        return dep.devices.kind != "cpu" and layer_bytes > READ_BOUND_LAYER_BYTES
    if target == "batch":
        return dep.serving.shape == "batch"
    return True


def memory_summary(memory: Memory, dep: Deployment) -> list[dict[str, Any]]:
    """The engine's entries as the master sees them (`applicable`: made on this stock, for this target)."""
    stock = memory.stock_for(dep)
    stock_tree = replay(memory, dep, []).tree
    out = []
    for e in memory.entries(dep.engine):
        out.append({
            "name": e.name, "summary": e.summary, "target_factor": e.target_factor, "requires": e.requires,
            "variants": [v.as_dict() for v in e.variants], "evidence": e.evidence, "contracts": e.contracts,
            "has_code": bool(e.delta), "stock": stock.label,
            "applicable": e.stock_tree == stock_tree and fits_target(e.options, dep),
        })  # fmt: skip
    return out


def knob_values(ws: Workspace, commit: str, memory: Memory, dep: Deployment) -> dict[str, Any]:
    """The system's current value of every knob a variant registry names ("file:section.key")."""
    values: dict[str, Any] = {}
    for e in memory.entries(dep.engine):
        for v in e.variants:
            key = f"{v.file}:{v.knob}"
            if key in values:
                continue
            proc = git_try(ws.repo_dir, "show", f"{commit}:{v.file}")
            if proc.returncode == 0 and v.file.endswith(".toml"):
                section, name = v.knob.split(".", 1)
                values[key] = tomllib.loads(proc.stdout.decode()).get(section, {}).get(name)
    return values


def evaluation_json(ev: controller.Evaluation) -> dict[str, Any]:
    audit = ev.evidence.get("audit") or {}
    return {"verdict_id": ev.id, "run_id": ev.run_id, "approved": ev.approved,
            "changes_output": ev.changes_output, "gain": ev.gain, "lower_bound": ev.lower_bound,
            "sigma": ev.sigma, "threshold": ev.threshold, "unit": ev.unit, "reasons": ev.reasons,
            "audit_passed": audit.get("passed"), "candidate_tree": ev.candidate_tree}  # fmt: skip


def fail_stale_runs(dep: Deployment, home: Home, db) -> None:
    """Runs left `running` by a killed round are marked failed (only when no one holds the slots)."""
    slots = [Slot.parse(s) for s in dep.devices.slots[:2]]
    with contextlib.suppress(SpecPilotError), lease(home, slots, timeout_s=0.0):
        for run in records.list_runs(db, dep.name):
            if run.status == "running":
                records.fail_run(db, run.id, "interrupted: the process running it was killed")


def merge_patches(
    ws: Workspace, name: str, base: str, branches: list[tuple[str, str]]
) -> tuple[str, list[str], dict[str, str]]:
    """Three-way merge of the patch branches (key, branch) onto `base`, in order, into branch
    cand/<name>: (its commit, the keys merged, key -> why it was left out). A branch that conflicts
    with what is merged already is left out and named with its conflicting files; nothing of it
    stays in the tree."""
    repo = ws.repo_dir
    ws.remove_worktree(name)
    wt = ws.add_worktree(name, base)
    applied: list[str] = []
    dropped: dict[str, str] = {}
    for key, branch in branches:
        proc = git_try(wt, "-c", "user.name=specpilot", "-c", "user.email=specpilot@localhost", "merge",
                       "--no-ff", "--no-edit", "-m", f"merge {branch}", branch)  # fmt: skip
        if proc.returncode == 0:
            applied.append(key)
            continue
        files = git_try(wt, "diff", "--name-only", "--diff-filter=U").stdout.decode().split()
        git_try(wt, "merge", "--abort")
        merged = ", ".join(f"direction {k}" for k in applied) or "the system"
        dropped[key] = f"conflicts with {merged} in {', '.join(files) or 'the tree'}"
    commit = git_run(repo, "rev-parse", f"cand/{name}")
    return commit, applied, dropped


def combine(rnd: RoundView) -> dict[str, Any]:
    """The approved patches on the current system: one as is; several merged (three-way), the merge
    judged against the best single patch and kept only when it beats it; every patch left out is
    named with its reason."""
    st, base = rnd.state, rnd.state.baseline
    evals = st.evaluations
    approved = sorted((i for i in evals if evals[i]["approved"]), key=lambda i: -evals[i]["gain"])
    repo = rnd.ws.repo_dir
    if not approved:
        return {"kind": "none", "commit": base.commit, "tree": base.tree, "applied": [], "dropped": {}}

    def single(i: str, dropped: dict[str, str]) -> dict[str, Any]:
        commit = git_run(repo, "rev-parse", st.patches[i]["branch"])
        return {
            "kind": "single",
            "commit": commit,
            "tree": st.patches[i]["tree"],
            "applied": [i],
            "dropped": dropped,
        }

    if len(approved) == 1:
        return single(approved[0], {})
    name = f"r{rnd.number}-combined"
    commit, applied, dropped = merge_patches(rnd.ws, name, base.commit,
                                             [(i, st.patches[i]["branch"]) for i in approved])  # fmt: skip
    best = approved[0]
    if len(applied) == 1:
        return single(best, dropped)
    rnd.progress("combine", f"judging the merge of directions {applied} against direction {best} alone")
    ev = rnd.compare(st.patches[best]["branch"], f"cand/{name}", budget_s=rnd.judging_left(0))
    st.combination_eval = ev
    if ev["approved"]:
        tree = git_run(repo, "rev-parse", f"{commit}^{{tree}}")
        return {"kind": "combined", "commit": commit, "tree": tree, "applied": applied, "dropped": dropped}
    why = merge_left_out(best, ev)
    return single(best, dropped | {i: why for i in applied if i != best})


def merge_left_out(best: str, ev: dict[str, Any]) -> str:
    """Why a merge judged against direction `best` alone was not kept: its gain, or, where the
    controller gave no verdict (gain 0), the controller's reasons."""
    why = "; ".join(ev.get("reasons") or [])
    if not ev["gain"]:
        return f"the merge with direction {best} got no verdict against it alone ({why or 'no reason given'})"
    gain = f"gain {ev['gain']:.3f}, lower bound {ev['lower_bound']:.3f}"
    return f"the merge with direction {best} did not beat it alone ({gain}{': ' + why if why else ''})"


def seal(rnd: RoundView) -> dict[str, Any]:
    """Seal the new system as stock + entries, seal-check it, and make it the current system."""
    st, dep, memory = rnd.state, rnd.dep, rnd.memory
    comb, base = st.combination, st.baseline
    if comb["kind"] == "none":
        return {"changed": False, "commit": base.commit, "tree": base.tree, "entries": base.entries}
    dirs = [st.directions[int(i)] for i in comb["applied"]]
    entries = list(base.entries)
    for d in dirs:
        if d.get("entry"):
            entries += [e.name for e in memory.resolve([d["entry"]]) if e.name not in entries]
    new_entries: list[str] = []
    try:
        reproduced = replay(memory, dep, entries).tree == comb["tree"]
    except SpecPilotError:
        reproduced = False
    if not reproduced:  # the round's own code (a retune, a merge) becomes an entry of its own
        name = f"{dep.name}-round{rnd.number}"
        if name not in memory.by_name():
            _store_round_entry(rnd, name, entries, dirs, comb)
        entries.append(name)
        new_entries.append(name)
    system = seal_system(memory, dep, entries, comb["tree"])
    results = seal_check(memory, systems=[system])
    failed = [r.detail for r in results if not r.ok]
    if failed:
        raise SpecPilotError(f"the new system does not pass seal-check: {'; '.join(failed)}")
    for d, i in zip(dirs, comb["applied"], strict=True):
        if d.get("entry"):
            ev = st.evaluations[i]
            memory.add_evidence(d["entry"], {"deployment": dep.name, "round": rnd.number, "gain": ev["gain"],
                                             "lower_bound": ev["lower_bound"], "verdict": ev["verdict_id"]})  # fmt: skip
    rnd.ws.set_system(comb["commit"])
    return {"changed": True, "commit": comb["commit"], "tree": comb["tree"], "entries": entries,
            "new_entries": new_entries, "seal_check": [r.as_dict() for r in results]}  # fmt: skip


def _store_round_entry(rnd: RoundView, name: str, requires: list[str], dirs: list[dict], comb: dict) -> None:
    evals = rnd.state.evaluations
    variants, evidence, factors = [], [], set()
    for d, i in zip(dirs, comb["applied"], strict=True):
        ev = evals[i]
        factors.add(d["target_factor"])
        item = {"deployment": rnd.dep.name, "round": rnd.number, "gain": ev["gain"],
                "lower_bound": ev["lower_bound"], "verdict": ev["verdict_id"], "direction": d["title"]}  # fmt: skip
        if d.get("knob"):
            k = d["knob"]
            old = rnd.state.knobs.get(f"{k['file']}:{k['knob']}")
            values = [v for v in (old, k["value"]) if v is not None]
            variants.append({"knob": k["knob"], "file": k["file"], "values": values, "default": k["value"]})
            item |= {"knob": k["knob"], "value": k["value"]}
        evidence.append(item)
    changes = any(evals[i]["changes_output"] for i in comb["applied"])
    meta = EntryMeta.model_validate({
        "summary": f"round {rnd.number} of {rnd.dep.name}: " + "; ".join(d["title"] for d in dirs),
        "target_factor": factors.pop() if len(factors) == 1 else "none", "variants": variants,
        "contracts": ["output changes: approved at the higher bar"] if changes else ["lossless: same tokens as the baseline"],
        "evidence": evidence, "limits": [f"measured on {rnd.dep.name} only"],
    })  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="specpilot-round-"))
    try:
        tree = checkout(rnd.ws.repo_dir, comb["commit"], tmp)
        add_entry(rnd.memory, name, tree.path, rnd.memory.stock_for(rnd.dep), requires=requires, meta=meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
