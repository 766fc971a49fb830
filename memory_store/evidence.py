"""An entry's evidence, checked against the verdicts this store holds.

Evidence items name the verdict that justifies them (`verdict`: its id). On import each such item
is looked up: a verdict this store holds must be of the item's deployment, approved exactly when
the item says so (an item that does not say claims approval), and carry the item's gain and lower
bound (to the 4 decimals evidence is written with). Anything else is an edited or forged claim,
and the import is refused naming the entry, the verdict and the field. A verdict the store does not
hold (a bundle from another home) cannot be checked here: the item is kept and reported unchecked.
"""

from __future__ import annotations

from typing import Any

from .db import Database
from .entry import Entry
from .models import VerdictRow

TOLERANCE = 5e-5  # evidence figures are rounded to 4 decimals


def _contradictions(item: dict[str, Any], verdict: VerdictRow) -> list[str]:
    out = []
    if item.get("deployment", verdict.deployment) != verdict.deployment:
        out.append(f"deployment {item['deployment']!r}, the verdict's is {verdict.deployment!r}")
    if bool(item.get("approved", True)) != verdict.approved:
        said = "approved" if item.get("approved", True) else "rejected"
        out.append(f"says {said}, the verdict was {'approved' if verdict.approved else 'rejected'}")
    for key in ("gain", "lower_bound"):
        if key in item and abs(float(item[key]) - getattr(verdict, key)) > TOLERANCE:
            out.append(f"{key} {float(item[key]):.4f}, the verdict's is {getattr(verdict, key):.4f}")
    return out


def check_evidence(db: Database, entries: list[Entry]) -> tuple[list[str], list[str]]:
    """(contradictions, unchecked): one line per evidence item that contradicts its verdict, and
    `entry: verdict id` for each whose verdict this store does not hold."""
    bad, unchecked = [], []
    with db.session(readonly=True) as s:
        for e in entries:
            for n, item in enumerate(e.evidence):
                vid = item.get("verdict")
                if not vid:
                    continue
                row = s.get(VerdictRow, str(vid))
                if row is None:
                    unchecked.append(f"{e.name}: {str(vid)[:8]}")
                    continue
                bad += [f"entry {e.name!r}, evidence item {n} (verdict {str(vid)[:8]}): {c}"
                        for c in _contradictions(item, row)]  # fmt: skip
    return bad, unchecked
