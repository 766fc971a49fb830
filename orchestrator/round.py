"""One optimization round, start to finish (ARCHITECTURE §1, paper §3.1).

    Phase 0 (once per deployment) → cost-model report of the current system → the master plans one
    direction per slot → sub-agents implement them in parallel, each in its own worktree → the
    controller judges each patch against the current system → approved patches are combined (a
    combination is judged again, never assumed) → the new system is sealed as stock + memory
    entries and seal-checked → report.

The round's state is saved to the database after every step; `resume` continues a crashed or
killed round from the first unfinished step, so nothing finished is redone or lost. With a Ray
cluster (`cluster.py`) the steps that need device slots run on its nodes; the rest stays here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from specpilot import controller
from specpilot.agents import AgentError, Direction, PlanningContext
from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import Memory, Workspace, connect, git_run, open_memory, records

from . import sealing
from .agents import make_agents
from .roundview import Baseline, RoundState

Progress = Callable[[str, str], None]  # (step, message)


class Round:
    """A round of one deployment, its state persisted in the `rounds` table."""

    def __init__(self, dep: Deployment, home: Home, number: int, state: RoundState, progress: Progress,
                 cluster: Any = None):  # fmt: skip
        self.dep, self.home, self.number, self.state = dep, home, number, state
        self.db = connect(home)
        self.progress = progress
        self.ws, _ = Workspace.init(home, dep)
        self.memory: Memory = open_memory(home)
        self.cluster = cluster  # orchestrator.cluster.Cluster, used through its methods only (it imports us)
        self._judging_s = 0.0  # seconds this process spent in the round's comparisons (round_budget_s)

    # -- bookkeeping ------------------------------------------------------------------------------

    def save(self, status: str | None = None) -> None:
        records.save_round(self.db, self.dep.name, self.number, self.state.to_json(), status)

    def done(self, step: str) -> bool:
        return step in self.state.finished

    def finish(self, step: str) -> None:
        self.state.finished.append(step)
        self.save()

    # -- the steps --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        steps = [("phase0", self.phase0), ("costmodel", self.costmodel), ("plan", self.plan),
                 ("implement", self.implement), ("evaluate", self.evaluate), ("combine", self.combine),
                 ("seal", self.seal), ("report", self.report)]  # fmt: skip
        for name, step in steps:
            if not self.done(name):
                self.progress(name, "")
                step()
                self.finish(name)
        self.save("done")
        return self.state.to_json()

    def phase0(self) -> None:
        if records.get_state(self.db, self.dep.name, "phase0") is None:
            if self.cluster is not None:
                self.progress("phase0", "on a node of the cluster")
                self._on_node("phase0", f"{self.dep.name}:r{self.number}:phase0")
            else:
                controller.run_phase0(self.dep, self.home, progress=lambda m: self.progress("phase0", m))
        self.state.phase0 = records.get_state(self.db, self.dep.name, "phase0")["delta"]

    def costmodel(self) -> None:
        base = self.state.baseline
        key = f"costmodel:{base.tree}"
        report = records.get_state(self.db, self.dep.name, key)
        if report is None:
            self.progress("costmodel", f"profiling and recording {base.tree[:12]}")
            if self.cluster is not None:
                report = self._on_node("costmodel", f"{self.dep.name}:{key}", rev=base.commit,
                                           bundles={"system": self._bundle(base.commit)})  # fmt: skip
            else:
                report = controller.cost_report(self.dep, self.home, base.commit, max_requests=4)
            records.set_state(self.db, self.dep.name, key, report)
        self.state.costmodel = {k: report.get(k) for k in (
            "tau", "c", "speedup", "factors", "ceiling", "largest", "rows_per_step", "budget", "tau_best",
            "best_policy", "notes")}  # fmt: skip

    def plan(self) -> None:
        master, _ = make_agents(self.state.agent, self)
        slots = list(self.dep.devices.slots)
        if self.cluster is not None:  # as asked, else a direction per set of slots judged at once
            width = self.state.width or max(1, self.cluster.slots() // len(slots))
            slots = [f"ray-{i}" for i in range(width)]
        elif len(slots) == 1:  # one device: two directions, implemented side by side, judged in turn on it
            slots = slots * 2
        ctx = PlanningContext(
            deployment=self.dep.name, engine=self.dep.engine, system_tree=self.state.baseline.tree,
            system_entries=self.state.baseline.entries, costmodel=self.state.costmodel,
            memory=sealing.memory_summary(self.memory, self.dep), past=self.past(), slots=slots,
            knobs=sealing.knob_values(self.ws, self.state.baseline.commit, self.memory, self.dep),
            budget={"rounds_left": self.state.rounds_left},
        )  # fmt: skip
        self.state.knobs = ctx.knobs
        try:
            directions = master.plan(ctx)
        finally:  # the master's transcript, tokens and cost, kept even when its answer is refused
            if getattr(master, "record", None):
                self.state.master = master.record
                self.save()
        if len(directions) > len(slots):
            raise AgentError(f"the master planned {len(directions)} directions for {len(slots)} slots")
        self.state.directions = [
            {**d.model_dump(mode="json"), "key": d.key, "slot": slots[i]} for i, d in enumerate(directions)
        ]

    def past(self) -> list[dict[str, Any]]:
        """Every direction judged in this deployment's earlier rounds, with its verdict."""
        out = []
        for r in records.list_rounds(self.db, self.dep.name):
            if r.number == self.number:
                continue
            for i, d in enumerate(r.state.get("directions", [])):
                ev = r.state.get("evaluations", {}).get(str(i), {})
                out.append({"key": d["key"], "title": d["title"], "round": r.number,
                            "baseline_tree": r.state.get("baseline", {}).get("tree"),
                            "approved": ev.get("approved"), "gain": ev.get("gain"), "reasons": ev.get("reasons", [])})  # fmt: skip
        return out

    def implement(self) -> None:
        patches = self.state.patches
        todo = [i for i in range(len(self.state.directions)) if str(i) not in patches]
        if self.cluster is not None:
            return self._on_cluster(todo)
        _, sub = make_agents(self.state.agent, self)
        tools = controller_tools(self)
        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            for i, result in zip(
                todo, pool.map(lambda i: implement_direction(self, sub, tools, i), todo), strict=True
            ):
                self.progress("implement", f"direction {i}: {result.get('summary') or result.get('error')}")
                patches[str(i)] = result
                self.save()

    def _on_cluster(self, todo: list[int]) -> None:
        """Each direction a task on a node: its sub-agent, then its controller pair; results as they come."""
        before = {r.id for r in records.list_runs(self.db, self.dep.name)}
        base = self.state.baseline
        shipped = {"system": self._bundle(base.commit)}
        refs = {self.cluster.submit(self.dep, "direction", f"{self.dep.name}:r{self.number}:d{i}:{base.commit}",
                                    number=self.number, state=self.state.to_json(), index=i, bundles=shipped): i
                for i in todo}  # fmt: skip
        for i, out in self.cluster.as_done(refs):
            if "error" in out:  # the direction fails; the others go on
                out = {"patch": {"error": out["error"]},
                       "evaluation": {"approved": False, "reasons": [f"no verdict: {out['error']}"], "gain": None}}  # fmt: skip
            patch = out["patch"]
            if "branch" in patch:  # the node's commit, the same hash here
                self.cluster.unbundle(self.ws, out["bundle"], patch["branch"])
            self.progress("implement", f"direction {i}: {patch.get('summary') or patch.get('error')} "
                          f"(judged on a node: {'approved' if out['evaluation']['approved'] else 'not approved'})")  # fmt: skip
            self.state.patches[str(i)] = patch
            self.state.evaluations[str(i)] = out["evaluation"]
            self.save()
        self.cluster.fail_orphans(self.db, self.dep, before)

    def _on_node(self, kind: str, key: str, **job: Any) -> dict[str, Any]:
        """One task on a node of the cluster, waited for; runs a dead node left are marked failed."""
        before = {r.id for r in records.list_runs(self.db, self.dep.name)}
        out = self.cluster.call(self.dep, kind, key, **job)
        self.cluster.fail_orphans(self.db, self.dep, before)
        return out

    def _bundle(self, rev: str) -> str | None:
        return self.cluster.bundle(self.ws, rev)

    def evaluate(self) -> None:
        evals = self.state.evaluations
        todo = [i for i in range(len(self.state.directions)) if str(i) not in evals]
        judged = [i for i in todo if "error" not in self.state.patches[str(i)]]
        for i in todo:
            d, patch = self.state.directions[i], self.state.patches[str(i)]
            if "error" in patch:
                evals[str(i)] = {"approved": False, "reasons": [f"no patch: {patch['error']}"], "gain": None}
            else:
                self.progress("evaluate", f"direction {i}: {d['title']}")
                after = len(judged) - judged.index(i) - 1
                evals[str(i)] = self.compare(self.state.baseline.commit, patch["branch"],
                                             lambda m, i=i: self.progress("evaluate", f"direction {i}: {m}"),
                                             budget_s=self.judging_left(after))  # fmt: skip
            self.save()

    def judging_left(self, after: int) -> float | None:
        """What the deployment's round budget leaves the next comparison: the budget less what this
        round's comparisons took, less the time to a first look (Phase 0's noise run took it to reach
        MIN_LOOK blocks) for each of the `after` directions still to judge. None: no round budget."""
        budget = self.dep.controller.round_budget_s
        if budget is None:
            return None
        noise = records.get_state(self.db, self.dep.name, "noise") or {}
        return budget - self._judging_s - after * float(noise.get("look_s", 0.0))

    def compare(
        self,
        baseline: str,
        candidate: str,
        progress: Callable[[str], None] = lambda _: None,
        budget_s: float | None = None,
    ) -> dict[str, Any]:
        """The controller's verdict on `candidate` against `baseline` (here, or on a node), as JSON;
        `budget_s` caps its measuring time (controller.compare), and its seconds count against the round's."""
        t0 = time.monotonic()
        try:
            if self.cluster is None:
                return sealing.evaluation_json(controller.compare(self.dep, self.home, baseline, candidate,
                                                                  budget_s=budget_s, progress=progress))  # fmt: skip
            b, c = (git_run(self.ws.repo_dir, "rev-parse", f"{r}^{{commit}}") for r in (baseline, candidate))
            out = self._on_node("compare", f"{self.dep.name}:r{self.number}:compare:{b}:{c}", baseline=b, candidate=c,
                                budget_s=budget_s, bundles={"baseline": self._bundle(b), "candidate": self._bundle(c)})  # fmt: skip
            return out["evaluation"]
        finally:
            self._judging_s += time.monotonic() - t0

    def combine(self) -> None:
        self.state.combination = sealing.combine(self)

    def seal(self) -> None:
        self.state.result = sealing.seal(self)

    def report(self) -> None:
        """The round's pictures, beside it (`Home.round_dir`), named in its report."""
        try:
            from . import plots  # matplotlib: loaded only by the step that draws
        except ImportError as e:  # a bare environment (the lent GPU machine): the round stands without them
            self.progress("report", f"no pictures: {e} (matplotlib is a dependency: pip install matplotlib)")
            return
        ids = [e["verdict_id"] for e in self.state.evaluations.values() if e.get("verdict_id")]
        if (self.state.combination_eval or {}).get("verdict_id"):
            ids.append(self.state.combination_eval["verdict_id"])
        verdicts = [records.get_verdict(self.db, i) for i in ids]
        title = f"round {self.number} of {self.dep.name}"
        self.state.pictures = plots.round_pictures(self.home.round_dir(self.dep.name, self.number), title,
                                                   self.state.to_json(), verdicts)  # fmt: skip


def implement_direction(rnd, sub, tools, i: int, slot: str | None = None) -> dict[str, Any]:
    """Direction i of the round, implemented by `sub` in a fresh worktree (its quick measures on
    `slot`, else the direction's) and committed: its patch record."""
    d = rnd.state.directions[i]
    name = f"r{rnd.number}-d{i}"
    rnd.ws.remove_worktree(name)  # a leftover of a killed run is redone from scratch
    wt = rnd.ws.add_worktree(name, rnd.state.baseline.commit)
    direction = Direction.model_validate({k: v for k, v in d.items() if k not in ("key", "slot")})
    try:
        patch = sub.implement(direction, wt, slot or d["slot"], tools)
    except (AgentError, SpecPilotError) as e:  # a failed run still has a transcript and a cost
        return {"error": str(e), **getattr(e, "record", {})}
    tree = rnd.ws.commit_worktree(wt, f"round {rnd.number}: {direction.title}")
    if tree == rnd.state.baseline.tree:
        return {"error": "the patch is empty"}
    return {"branch": f"cand/{name}", "tree": tree, "summary": patch.summary, "cost_usd": patch.cost_usd,
            "transcript": str(patch.transcript) if patch.transcript else None, "usage": patch.usage}  # fmt: skip


@dataclass
class NodeRound:
    """A round as a cluster node sees it: the head's state, this node's home and workspace."""

    dep: Deployment
    home: Home
    ws: Workspace
    number: int
    state: RoundState
    memory: Memory = field(init=False)
    progress: Progress = lambda *_: None

    def __post_init__(self) -> None:
        self.memory = open_memory(self.home)
        if isinstance(self.state, dict):
            self.state = RoundState.from_json(self.state)

    def implement_one(self, i: int) -> dict[str, Any]:
        _, sub = make_agents(self.state.agent, self)
        return implement_direction(self, sub, controller_tools(self), i, self.dep.devices.slots[0])


def controller_tools(rnd: Round):
    from specpilot.agents import LocalControllerTools

    return LocalControllerTools(rnd.dep, rnd.home, rnd.state.baseline.commit)


def start_or_resume(dep: Deployment, home: Home, agent: str, resume: int | None, progress: Progress,
                    agent_options: dict[str, Any] | None = None, rounds_left: int = 0,
                    cluster: Any = None, width: int | None = None) -> Round:  # fmt: skip
    """A new round from the current sealed system, or round `resume` where it stopped (with the agent
    and agent options it started with); its device work on `cluster`'s nodes when given."""
    db = connect(home)
    ws, _ = Workspace.init(home, dep)
    sealing.ensure_builtin(open_memory(home), dep)
    if resume is not None:
        rec = records.get_round(db, dep.name, resume)
        if rec is None:
            raise SpecPilotError(
                f"deployment {dep.name!r} has no round {resume}; `specpilot report` lists rounds"
            )
        sealing.fail_stale_runs(dep, home, db)
        return Round(dep, home, rec.number, RoundState.from_json(rec.state), progress, cluster)
    last = records.get_round(db, dep.name)
    if last is not None and last.status != "done":
        raise SpecPilotError(
            f"round {last.number} of {dep.name!r} did not finish; continue it with "
            f"`specpilot round --deployment {dep.name} --resume {last.number}`"
        )
    commit = git_run(ws.repo_dir, "rev-parse", "system")
    base = Baseline(commit, ws.system_tree, sealing.system_entries(db, dep, ws.system_tree))
    state = RoundState(agent, base, agent_options=agent_options or {}, rounds_left=rounds_left, width=width)
    rec = records.start_round(db, dep.name, state.to_json())
    return Round(dep, home, rec.number, RoundState.from_json(rec.state), progress, cluster)
