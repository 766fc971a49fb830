"""A round's device work on many hosts: Ray places it, one PostgreSQL keeps everything else.

    specpilot round --deployment D --ray ADDRESS

The head (the `specpilot round` process) plans, merges and seals as on one host; what needs device
slots — Phase 0, the cost-model profile, each direction (its sub-agent, then its controller pair),
the judgement of a merge — runs as a Ray task on a node with free slots. A node offers each slot
as a custom resource `specpilot-slot:<slot>` and their count as `specpilot-slots`
(`node_resources`, for `ray start --resources`); a task asks for as many `specpilot-slots` as the
deployment lists and, on its node, claims that many of the node's own slots.

Nodes share nothing but the database: each keeps its workspace in a home of its own
(`$SPECPILOT_HOME/nodes/<node id>`, or `./.specpilot/nodes/...`), and commits travel as git bundles
over the stock commit every workspace of a deployment holds alike (its identity and dates are
fixed, so the same stock files give the same commit on every host). The database must be the
head's PostgreSQL: the task is given its URL.

A node that dies takes its tasks with it; Ray runs them again elsewhere (`max_retries`). Each task
stores its result in the database under a key of its own before it returns, and a retried task
that finds it returns it as is, so a verdict reached before the node died is neither lost nor
judged a second time; a run the dead node left `running` is marked failed by the head once the
step's tasks are all done (`fail_orphans`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specpilot.deployments import Deployment, Home, SpecPilotError
from specpilot.memory_store import Workspace, connect, git_bytes, git_run, records

RESOURCE = "specpilot-slots"
SLOT_PREFIX = "specpilot-slot:"
RETRIES = 3  # runs of a task whose node died, after the first


def node_resources(slots: list[str]) -> dict[str, float]:
    """The Ray resources a SpecPilot node offers for its device slots (`ray start --resources`)."""
    return {RESOURCE: float(len(slots)), **{SLOT_PREFIX + s: 1.0 for s in slots}}


# -- commits between workspaces --------------------------------------------------------------------


def bundle(ws: Workspace, rev: str) -> str | None:
    """The commits of `rev` over stock as a git bundle (base64), or None when `rev` is stock."""
    sha = git_run(ws.repo_dir, "rev-parse", f"{rev}^{{commit}}")
    if not git_run(ws.repo_dir, "rev-list", f"stock..{sha}"):
        return None
    ref = f"refs/specpilot/ship/{sha}"
    git_run(ws.repo_dir, "update-ref", ref, sha)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.bundle"
        git_run(ws.repo_dir, "bundle", "create", str(path), ref, "^stock")
        return base64.b64encode(path.read_bytes()).decode()


def unbundle(ws: Workspace, data: str | None, branch: str | None = None) -> None:
    """Take a bundle's commits into `ws` (and point `branch` at its tip)."""
    if data is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b.bundle"
        path.write_bytes(base64.b64decode(data))
        heads = git_bytes(ws.repo_dir, "bundle", "list-heads", str(path)).decode().split()
        ref = heads[1]
        git_run(ws.repo_dir, "fetch", "--no-tags", str(path), f"+{ref}:{ref}")
        if branch is not None:
            git_run(ws.repo_dir, "branch", "-f", branch, heads[0])


# -- on a node -------------------------------------------------------------------------------------


@contextlib.contextmanager
def claim(home: Home, slots: list[str], k: int) -> Iterator[list[str]]:
    """Hold `k` of this node's `slots` (Ray counted them free; these locks say which) for the task."""
    locks = home.root / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        mine = []
        for s in slots:
            fh = stack.enter_context(open(locks / f"claim-{s.replace(':', '-')}.lock", "a+"))
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            mine.append(s)
            if len(mine) == k:
                yield mine
                return
        raise SpecPilotError(f"this node has {len(mine)} of the {k} slots a task needs free ({slots})")


def _node() -> tuple[Home, list[str]]:
    """This node's home and device slots (from its Ray resources)."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    slots = sorted(r[len(SLOT_PREFIX) :] for r in node["Resources"] if r.startswith(SLOT_PREFIX))
    base = Home.resolve(None).root
    return Home(base / "nodes" / node_id[:16]), slots


def node_job(job: dict[str, Any]) -> dict[str, Any]:
    """A Ray task: one piece of a round's device work on this node (see `run_job` for the kinds)."""
    os.environ["SPECPILOT_DB_URL"] = job["db_url"]  # the head's database, whatever the node's own
    home, slots = _node()
    db = connect(home)
    done = records.get_state(db, job["deployment"]["name"], f"cluster:{job['key']}")
    if done is not None:  # an earlier run of this task finished before its node died
        return done
    spec = job["deployment"]
    with claim(home, slots, len(spec["devices"]["slots"])) as mine:
        dep = Deployment.model_validate({**spec, "devices": {**spec["devices"], "slots": mine}})
        ws, _ = Workspace.init(home, dep)
        for data in job.get("bundles", {}).values():  # the commits the work names, by hash
            unbundle(ws, data)
        result = run_job(job["kind"], dep, home, ws, job)
    records.set_state(db, dep.name, f"cluster:{job['key']}", result)
    return result


def run_job(kind: str, dep: Deployment, home: Home, ws: Workspace, job: dict[str, Any]) -> dict[str, Any]:
    """phase0 | costmodel (of `rev`) | compare (`baseline` against `candidate`) | direction (a
    sub-agent implements direction `index` of the round `state`, the controller judges it)."""
    from specpilot import controller

    from . import sealing

    if kind == "phase0":
        return controller.run_phase0(dep, home)
    if kind == "costmodel":
        return controller.cost_report(dep, home, job["rev"], max_requests=4)
    if kind == "compare":
        ev = controller.compare(dep, home, job["baseline"], job["candidate"], budget_s=job.get("budget_s"))
        return {"evaluation": sealing.evaluation_json(ev)}
    if kind == "direction":
        from .round import NodeRound

        rnd = NodeRound(dep, home, ws, job["number"], job["state"])
        patch = rnd.implement_one(job["index"])
        out: dict[str, Any] = {"patch": patch}
        if "error" in patch:
            out["evaluation"] = {"approved": False, "reasons": [f"no patch: {patch['error']}"], "gain": None}
        else:
            ev = controller.compare(dep, home, rnd.state.baseline.commit, patch["branch"])
            out["evaluation"] = sealing.evaluation_json(ev)
            out["bundle"] = bundle(ws, patch["branch"])
        return out
    raise SpecPilotError(f"unknown cluster job {kind!r}")


# -- on the head -----------------------------------------------------------------------------------


class Cluster:
    """The head's handle on a Ray cluster of SpecPilot nodes."""

    def __init__(self, address: str, db_url: str):
        try:
            import ray
        except ImportError:
            raise SpecPilotError("--ray needs Ray: pip install 'specpilot[ray]'") from None
        if not db_url.startswith("postgresql"):
            raise SpecPilotError(
                "--ray needs the memory in PostgreSQL shared by every node: set SPECPILOT_DB_URL to a "
                f"postgresql:// URL the nodes can reach (now {db_url.split(':', 1)[0]})"
            )
        self.ray, self.db_url = ray, db_url
        ray.init(address=address, namespace="specpilot", log_to_driver=False, ignore_reinit_error=True)
        self.task = ray.remote(max_retries=RETRIES, retry_exceptions=False)(node_job)

    def slots(self) -> int:
        """Device slots the cluster's nodes offer, in all."""
        return int(self.ray.cluster_resources().get(RESOURCE, 0))

    def most_on_one_node(self) -> int:
        """The most device slots one live node offers (a task needs all of its slots on one node)."""
        return int(max((n["Resources"].get(RESOURCE, 0) for n in self.ray.nodes() if n["Alive"]), default=0))

    def submit(self, dep: Deployment, kind: str, key: str, **job: Any):
        """Start a task (a Ray object ref); its result is stored under `key` before it returns."""
        need = len(dep.devices.slots)
        if (most := self.most_on_one_node()) < need:  # else Ray would keep the task pending for ever
            raise SpecPilotError(
                f"no node of the Ray cluster offers {need} '{RESOURCE}' (the most on one node: {most}); deployment "
                f"{dep.name!r} needs them on one node: start nodes with --resources "
                f"'{{\"{RESOURCE}\": {need}, ...}}' (node_resources)"
            )
        payload = {
            "kind": kind,
            "key": key,
            "deployment": dep.model_dump(mode="json"),
            "db_url": self.db_url,
            **job,
        }
        return self.task.options(resources={RESOURCE: need}).remote(payload)

    def call(self, dep: Deployment, kind: str, key: str, **job: Any) -> dict[str, Any]:
        return self.ray.get(self.submit(dep, kind, key, **job))

    # What the head's Round calls (round.py does not import this module: this module imports it).
    def bundle(self, ws: Workspace, rev: str) -> str | None:
        return bundle(ws, rev)

    def unbundle(self, ws: Workspace, data: str | None, branch: str | None = None) -> None:
        unbundle(ws, data, branch)

    def fail_orphans(self, db, dep: Deployment, before: set[str]) -> None:
        fail_orphans(db, dep, before)

    def as_done(self, refs: dict[Any, Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
        """(tag, result) of the tasks `refs` (ref -> tag) in the order they finish; a task that failed
        (an error in it, or its node dead more than RETRIES times) gives {"error": why}."""
        left = list(refs)
        while left:
            ready, left = self.ray.wait(left, num_returns=1)
            try:
                out = self.ray.get(ready[0])
            except self.ray.exceptions.RayError as e:
                out = {"error": f"its task failed on the cluster: {str(e).strip().splitlines()[-1]}"}
            yield refs[ready[0]], out


def fail_orphans(db, dep: Deployment, before: set[str]) -> None:
    """Runs started since `before` (the ids then) and still `running` once no task of the step is
    left: their node died mid-run (the task ran again elsewhere)."""
    for run in records.list_runs(db, dep.name):
        if run.status == "running" and run.id not in before:
            records.fail_run(db, run.id, "interrupted: its node died (the task ran again on another node)")
