"""The records the controller and orchestrator write (CONTRACTS §7): runs, verdicts, rounds and
per-deployment state. Each function is one transaction and returns plain dataclasses."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from specpilot.deployments import SpecPilotError

from .db import Database
from .models import DeploymentStateRow, RoundRow, RunRow, VerdictRow, now

# quick: a sub-agent's quick_measure (one paired block on the tuning requests, never a verdict)
RUN_KINDS = ("paired", "noise", "audit", "phase0", "profile", "record", "quick")
RUN_STATUSES = ("running", "done", "failed")
UNITS = ("blocks", "requests")


@dataclass(frozen=True)
class RunRecord:
    id: str
    deployment: str
    kind: str
    baseline_tree: str
    candidate_tree: str | None
    status: str
    raw_path: str | None
    summary: dict[str, Any] | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class VerdictRecord:
    id: str
    deployment: str
    run_id: str | None
    baseline_tree: str
    candidate_tree: str
    approved: bool
    changes_output: bool
    gain: float
    lower_bound: float
    sigma: float
    threshold: float
    unit: str
    reasons: list[str]
    evidence: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class RoundRecord:
    deployment: str
    number: int
    status: str
    state: dict[str, Any]
    created_at: datetime
    updated_at: datetime


def _fields(row: Any, cls: type) -> dict[str, Any]:
    return {k: getattr(row, k) for k in cls.__dataclass_fields__}


# -- runs ------------------------------------------------------------------------------------


def add_run(
    db: Database,
    deployment: str,
    kind: str,
    baseline_tree: str,
    candidate_tree: str | None = None,
    raw_path: str | None = None,
) -> str:
    """Record a run that starts now (status "running"); its id."""
    if kind not in RUN_KINDS:
        raise ValueError(f"run kind {kind!r} is not one of {RUN_KINDS}")
    run_id = str(uuid.uuid4())
    with db.session() as s:
        s.add(
            RunRow(
                id=run_id,
                deployment=deployment,
                kind=kind,
                baseline_tree=baseline_tree,
                candidate_tree=candidate_tree,
                status="running",
                raw_path=raw_path,
                created_at=now(),
            )
        )
    return run_id


def _finish(db: Database, run_id: str, status: str, **values: Any) -> RunRecord:
    with db.session() as s:
        row = s.get(RunRow, run_id)
        if row is None:
            raise SpecPilotError(f"no run {run_id!r} in {db.url}")
        if row.status != "running":
            raise SpecPilotError(f"run {run_id} is already {row.status}")
        row.status, row.finished_at = status, now()
        for k, v in values.items():
            if v is not None:
                setattr(row, k, v)
        return RunRecord(**_fields(row, RunRecord))


def finish_run(
    db: Database, run_id: str, summary: dict[str, Any] | None = None, raw_path: str | None = None
) -> RunRecord:
    """Mark a run done with its summary."""
    return _finish(db, run_id, "done", summary=summary, raw_path=raw_path)


def fail_run(db: Database, run_id: str, error: str) -> RunRecord:
    """Mark a run failed with what went wrong."""
    return _finish(db, run_id, "failed", error=error)


def get_run(db: Database, run_id: str) -> RunRecord:
    with db.session(readonly=True) as s:
        row = s.get(RunRow, run_id)
        if row is None:
            raise SpecPilotError(f"no run {run_id!r} in {db.url}")
        return RunRecord(**_fields(row, RunRecord))


def list_runs(db: Database, deployment: str | None = None, kind: str | None = None) -> list[RunRecord]:
    with db.session(readonly=True) as s:
        q = select(RunRow).order_by(RunRow.created_at)
        if deployment is not None:
            q = q.where(RunRow.deployment == deployment)
        if kind is not None:
            q = q.where(RunRow.kind == kind)
        return [RunRecord(**_fields(r, RunRecord)) for r in s.scalars(q)]


# -- verdicts --------------------------------------------------------------------------------


def add_verdict(
    db: Database,
    *,
    deployment: str,
    run_id: str | None,
    baseline_tree: str,
    candidate_tree: str,
    approved: bool,
    changes_output: bool,
    gain: float,
    lower_bound: float,
    sigma: float,
    threshold: float,
    unit: str,
    reasons: list[str],
    evidence: dict[str, Any],
) -> VerdictRecord:
    """Store a verdict with its evidence (only the controller calls this); the stored record."""
    if unit not in UNITS:
        raise ValueError(f"unit {unit!r} is not one of {UNITS}")
    rec = VerdictRecord(
        id=str(uuid.uuid4()),
        deployment=deployment,
        run_id=run_id,
        baseline_tree=baseline_tree,
        candidate_tree=candidate_tree,
        approved=approved,
        changes_output=changes_output,
        gain=gain,
        lower_bound=lower_bound,
        sigma=sigma,
        threshold=threshold,
        unit=unit,
        reasons=list(reasons),
        evidence=dict(evidence),
        created_at=now(),
    )
    with db.session() as s:
        s.add(VerdictRow(**_fields(rec, VerdictRecord)))
    return rec


def get_verdict(db: Database, verdict_id: str) -> VerdictRecord:
    with db.session(readonly=True) as s:
        row = s.get(VerdictRow, verdict_id)
        if row is None:
            raise SpecPilotError(f"no verdict {verdict_id!r} in {db.url}")
        return VerdictRecord(**_fields(row, VerdictRecord))


def list_verdicts(db: Database, deployment: str | None = None) -> list[VerdictRecord]:
    with db.session(readonly=True) as s:
        q = select(VerdictRow).order_by(VerdictRow.created_at)
        if deployment is not None:
            q = q.where(VerdictRow.deployment == deployment)
        return [VerdictRecord(**_fields(r, VerdictRecord)) for r in s.scalars(q)]


# -- rounds ----------------------------------------------------------------------------------


def start_round(db: Database, deployment: str, state: dict[str, Any] | None = None) -> RoundRecord:
    """A new round numbered one past the deployment's last (status "running")."""
    for _ in range(5):  # two starters racing on PostgreSQL: the loser retries with the next number
        try:
            with db.session() as s:
                last = s.scalar(select(func.max(RoundRow.number)).where(RoundRow.deployment == deployment))
                t = now()
                row = RoundRow(
                    deployment=deployment,
                    number=(last or 0) + 1,
                    status="running",
                    state=dict(state or {}),
                    created_at=t,
                    updated_at=t,
                )
                s.add(row)
                s.flush()
                return RoundRecord(**_fields(row, RoundRecord))
        except IntegrityError:
            continue
    raise SpecPilotError(
        f"could not number a new round of {deployment!r}: other processes keep starting rounds"
    )


def save_round(
    db: Database, deployment: str, number: int, state: dict[str, Any], status: str | None = None
) -> RoundRecord:
    """Replace a round's state (each finished step, for --resume) and optionally its status."""
    with db.session() as s:
        row = s.scalar(select(RoundRow).where(RoundRow.deployment == deployment, RoundRow.number == number))
        if row is None:
            raise SpecPilotError(f"no round {number} of deployment {deployment!r}")
        row.state, row.updated_at = dict(state), now()
        if status is not None:
            row.status = status
        return RoundRecord(**_fields(row, RoundRecord))


def get_round(db: Database, deployment: str, number: int | None = None) -> RoundRecord | None:
    """Round `number` of the deployment, or its latest when `number` is None; None if there is none."""
    with db.session(readonly=True) as s:
        q = select(RoundRow).where(RoundRow.deployment == deployment)
        q = q.where(RoundRow.number == number) if number is not None else q.order_by(RoundRow.number.desc())
        row = s.scalars(q.limit(1)).first()
        return None if row is None else RoundRecord(**_fields(row, RoundRecord))


def round_deployments(db: Database) -> list[str]:
    """The deployments that have rounds, by name."""
    with db.session(readonly=True) as s:
        return list(s.scalars(select(RoundRow.deployment).distinct().order_by(RoundRow.deployment)))


def list_rounds(db: Database, deployment: str) -> list[RoundRecord]:
    with db.session(readonly=True) as s:
        q = select(RoundRow).where(RoundRow.deployment == deployment).order_by(RoundRow.number)
        return [RoundRecord(**_fields(r, RoundRecord)) for r in s.scalars(q)]


# -- deployment state ------------------------------------------------------------------------


def get_state(db: Database, deployment: str, key: str, default: Any = None) -> Any:
    """A per-deployment value (Phase 0's δ, stock mismatch rate, σ), or `default`."""
    with db.session(readonly=True) as s:
        row = s.get(DeploymentStateRow, (deployment, key))
        return default if row is None else row.value


def set_state(db: Database, deployment: str, key: str, value: Any) -> None:
    """Set (insert or replace) a per-deployment value."""
    for _ in range(3):  # a concurrent first insert of the same key on PostgreSQL: retry as update
        try:
            with db.session() as s:
                row = s.get(DeploymentStateRow, (deployment, key))
                if row is None:
                    s.add(DeploymentStateRow(deployment=deployment, key=key, value=value, updated_at=now()))
                else:
                    row.value, row.updated_at = value, now()
            return
        except IntegrityError:
            continue
    raise SpecPilotError(
        f"could not set {key!r} of deployment {deployment!r}: concurrent writers kept colliding"
    )


def all_state(db: Database, deployment: str) -> dict[str, Any]:
    with db.session(readonly=True) as s:
        q = select(DeploymentStateRow).where(DeploymentStateRow.deployment == deployment)
        return {r.key: r.value for r in s.scalars(q)}
