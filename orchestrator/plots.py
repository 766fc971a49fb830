"""Pictures of a round, saved beside it (`Home.round_dir`) and named in its report.

    verdict-<id>.png   one verdict: every request's gain ratio B/A by block, the block gains, the
                       95% lower bound and the bar it had to clear
    round.png          the cost model's τ (accepted tokens per step) and c (relative step cost),
                       the three ceiling factors, and each direction's gain against its bar

matplotlib draws off-screen (Agg); nothing is shown, only files written (atomically).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specpilot.memory_store import VerdictRecord  # noqa: E402

GREEN, RED, GREY, BLUE = "#2e7d32", "#c62828", "#757575", "#1565c0"


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def verdict_png(v: VerdictRecord, path: Path) -> Path | None:
    """The verdict's per-request gains (None when it measured no block: a refusal or a failure)."""
    ev = v.evidence or {}
    per_block = ev.get("request_gains") or [[g] for g in ev.get("block_gains") or []]
    if not per_block:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for k, gains in enumerate(per_block):
        xs = [k + (j - (len(gains) - 1) / 2) * 0.5 / max(1, len(gains)) for j in range(len(gains))]
        ax.scatter(xs, gains, s=14, color=GREY, alpha=0.7, label="request" if k == 0 else None, zorder=2)
    blocks = ev.get("block_gains") or []
    ax.scatter(range(len(blocks)), blocks, s=60, marker="D", color=BLUE, label="block gain", zorder=3)
    ax.axhline(1.0, color="black", lw=0.8)
    bar = 1 + v.threshold
    color = GREEN if v.approved else RED
    ax.axhline(v.gain, color=color, lw=1.2, label=f"gain {v.gain:.4f}")
    ax.axhline(v.lower_bound, color=color, ls="--", lw=1.2, label=f"95% lower bound {v.lower_bound:.4f}")
    ax.axhline(bar, color="black", ls=":", lw=1.2, label=f"bar 1 + {v.threshold:.2%}")
    ax.set_xticks(range(len(per_block)))
    ax.set_xlabel("block")
    ax.set_ylabel("speed ratio candidate / baseline")
    verdict = "approved" if v.approved else "rejected"
    ax.set_title(f"verdict {v.id[:8]}: {verdict} ({v.unit}, n = {ev.get('n', len(blocks))})", fontsize=10)
    ax.legend(fontsize=7, loc="best", framealpha=0.8)
    return _save(fig, path)


def round_png(st: dict[str, Any], path: Path, title: str) -> Path | None:
    """τ and c, the ceiling factors, and the directions' gains with their lower bounds and bars."""
    cm = st.get("costmodel")
    evals = [(i, e) for i, e in sorted(st.get("evaluations", {}).items(), key=lambda x: int(x[0]))
             if e.get("gain") and e.get("lower_bound") and e.get("threshold")]  # fmt: skip
    if not cm and not evals:
        return None
    fig, (left, mid, right) = plt.subplots(
        1, 3, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1, 1.2, 1.6]}
    )
    if cm:
        left.bar(["τ", "c"], [cm["tau"], cm["c"]], color=[BLUE, GREY])
        for x, y in enumerate([cm["tau"], cm["c"]]):
            left.annotate(f"{y:.2f}", (x, y), ha="center", va="bottom", fontsize=8)
        left.set_title(f"speedup over AR = τ / c = {cm['speedup']:.2f}x", fontsize=9)
        f = cm.get("factors") or {}
        names = ["tree", "kernel", "outside"]
        vals = [f.get(n, 0.0) for n in names]
        mid.bar(names, vals, color=[RED if n == cm.get("largest") else GREY for n in names])
        for x, y in enumerate(vals):
            mid.annotate(f"{y:.2f}x", (x, y), ha="center", va="bottom", fontsize=8)
        mid.axhline(1.0, color="black", lw=0.8)
        mid.set_title(f"ceiling factors (largest: {cm.get('largest')})", fontsize=9)
    for ax in (left, mid):
        ax.tick_params(labelsize=8)
    if evals:
        for k, (_, e) in enumerate(evals):
            color = GREEN if e["approved"] else RED
            right.errorbar([k], [e["gain"]], yerr=[[e["gain"] - e["lower_bound"]], [0]], fmt="o", color=color,
                           capsize=4, label="gain and 95% lower bound" if k == 0 else None)  # fmt: skip
            right.plot([k - 0.3, k + 0.3], [1 + e["threshold"]] * 2, color="black", ls=":",
                       label="bar" if k == 0 else None)  # fmt: skip
        right.axhline(1.0, color="black", lw=0.8)
        right.set_xticks(range(len(evals)), [f"direction {i}" for i, _ in evals], fontsize=8)
        right.set_title("directions: speed ratio against the baseline", fontsize=9)
        right.legend(fontsize=7, loc="best")
    else:
        right.axis("off")
    fig.suptitle(title, fontsize=10, y=1.04)
    return _save(fig, path)


def round_pictures(folder: Path, title: str, st: dict[str, Any], verdicts: list[VerdictRecord]) -> list[str]:
    """Every picture of a round, written under `folder`; their paths."""
    out = [round_png(st, folder / "round.png", title)]
    out += [verdict_png(v, folder / f"verdict-{v.id[:8]}.png") for v in verdicts]
    return [str(p) for p in out if p is not None]
