"""Approval reports in the terminal: one verdict, or a list of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specpilot.memory_store import VerdictRecord


def verdict_json(v: VerdictRecord) -> dict[str, Any]:
    """A verdict as plain data."""
    data = dataclasses.asdict(v)
    data["created_at"] = v.created_at.isoformat()
    return data


def _pct(x: float) -> str:
    return f"{x - 1:+.2%}"


def verdict_panel(v: dict[str, Any], title: str | None = None) -> Panel:
    ok = v["approved"]
    head = Text("APPROVED" if ok else "REJECTED", style="bold green" if ok else "bold red")
    ev = v.get("evidence") or {}
    table = Table.grid(padding=(0, 2))
    table.add_column(style="dim")
    table.add_column()
    table.add_row("baseline", v["baseline_tree"][:12])
    table.add_row("candidate", v["candidate_tree"][:12])
    if not ev.get("refused"):
        table.add_row("gain", f"{v['gain']:.4f}x ({_pct(v['gain'])})")
        table.add_row("95% lower bound", f"{v['lower_bound']:.4f}x ({_pct(v['lower_bound'])})")
        table.add_row("stock noise σ", f"{v['sigma']:.2%}")
        table.add_row("threshold", f"lower bound > {v['threshold']:.2%}")
        table.add_row("unit", f"{v['unit']} (n = {ev.get('n', '?')})")
        if ev.get("block_gains"):
            table.add_row("per-block gains", "  ".join(f"{g:.3f}" for g in ev["block_gains"]))
        changed = ev.get("changed_requests") or []
        table.add_row(
            "output", f"changes on {len(changed)} request(s)" if changed else "identical to the baseline"
        )
    audit = ev.get("audit")
    if audit:
        table.add_row(
            "token forcing",
            f"mismatch {audit['rate']:.2%} ({audit['mismatches']}/{audit['positions']}) vs stock "
            f"{audit['stock_rate']:.2%} ({audit['stock_mismatches']}/{audit['stock_positions']}); "
            f"≥2δ events {audit['large']} vs stock {audit['stock_large']} (δ = {audit['delta']:.3f}); "
            f"unexplained {audit['unexplained']}",
        )
    parts: list[Any] = [head, table]
    reasons = v.get("reasons") or []
    if reasons:
        parts.append(Text("reasons:", style="bold"))
        parts += [Text(f"  • {r}") for r in reasons]
    for note in ev.get("notes") or []:
        parts.append(Text(f"  note: {note}", style="dim"))
    events = (audit or {}).get("events") or []
    if events:
        parts.append(Text("large mismatches (first 5):", style="bold"))
        for e in events[:5]:
            ctx = f" …{e['context']}…" if e.get("context") else ""
            why = "explained (stock too)" if e["explained"] else "unexplained"
            parts.append(Text(f"  {e['id']} @{e['position']}: token {e['token']} vs argmax {e['argmax']}, "
                              f"margin {e['margin']:.3f}, {why}{ctx}"))  # fmt: skip
    return Panel(Group(*parts), title=title or f"verdict {str(v.get('id'))[:8]}", expand=False)


def verdict_list(rows: Sequence[dict[str, Any]]) -> Group:
    """Verdicts, each a line naming it and a hanging-indented line of figures and the first reason,
    so the list reads at 80 columns as on a wide terminal."""
    lines: list[Any] = [Text("Verdicts", style="bold")]
    for v in rows:
        ok = v["approved"]
        head = Text(f"{str(v['id'])[:8]}  ")
        head.append("approved" if ok else "rejected", style="green" if ok else "red")
        head.append(f"  {v['deployment']}  candidate {v['candidate_tree'][:12]}")
        figures = f"gain {v['gain']:.3f}, lower bound {v['lower_bound']:.3f}, bar +{v['threshold']:.2%}"
        lines += [head, _indented(figures + (f"; {v['reasons'][0]}" if v["reasons"] else ""))]
    return Group(*lines)


def print_verdict(con: Console, v: dict[str, Any], title: str | None = None) -> None:
    con.print(verdict_panel(v, title))


def _indented(text: str, style: str = "") -> Padding:
    """A line that wraps under its own indent (a hanging indent), not under the panel's edge."""
    return Padding(Text(text, style=style), (0, 0, 0, 2))


def _direction_lines(i: int, d: dict[str, Any], ev: dict[str, Any] | None) -> list[Any]:
    """One direction of a round: what it tried, then its verdict and why, as wrapping lines."""
    where = ", ".join(x for x in (f"factor {d['target_factor']}", d.get("slot") and f"slot {d['slot']}") if x)
    lines: list[Any] = [Text(f"direction {i}: {d['title']} ({where})", style="bold")]
    if ev is None:
        return [*lines, _indented("pending: not judged yet", "yellow")]
    head = Text("APPROVED" if ev["approved"] else "REJECTED", style="green" if ev["approved"] else "red")
    if ev.get("gain"):
        figures = [f"gain {ev['gain']:.3f} ({_pct(ev['gain'])})"]
        if ev.get("lower_bound"):
            figures.append(f"lower bound {ev['lower_bound']:.3f} ({_pct(ev['lower_bound'])})")
        if ev.get("threshold"):
            figures.append(f"bar +{ev['threshold']:.2%}")
        head.append("  " + ", ".join(figures))
    else:
        head.append("  with no figures: nothing was measured to a verdict")
    lines.append(Padding(head, (0, 0, 0, 2)))
    reasons = ev.get("reasons") or ["clears the bar; audit passed"]
    return lines + [_indented(f"why: {r}") for r in reasons]


def round_panel(deployment: str, number: int, status: str, st: dict[str, Any]) -> Panel:
    """The approval report of one round."""
    parts: list[Any] = []
    base = st.get("baseline", {})
    res = st.get("result") or {}
    parts.append(Text(f"agent {st.get('agent')}, status {status}; system {base.get('tree', '?')[:12]}"
                      f" (entries: {', '.join(base.get('entries') or []) or 'stock'})"))  # fmt: skip
    cm = st.get("costmodel")
    if cm:
        f = cm.get("factors") or {}
        parts.append(Text(f"cost model: accept length τ {cm['tau']:.2f}, step cost c {cm['c']:.2f}, "
                          f"speedup over AR {cm['speedup']:.2f}x"))  # fmt: skip
        parts.append(Text(f"ceiling factors: tree {f.get('tree', 0):.2f} · kernel {f.get('kernel', 0):.2f} · "
                          f"outside {f.get('outside', 0):.2f} → largest: {cm['largest']}"))  # fmt: skip
    evals = st.get("evaluations", {})
    for i, d in enumerate(st.get("directions", [])):
        parts += _direction_lines(i, d, evals.get(str(i)))
    parts += agent_runs(st)
    comb = st.get("combination")
    if comb:
        parts.append(
            Text(f"combination: {comb['kind']}, directions {', '.join(comb.get('applied') or []) or 'none'}")
        )
        for i, why in (comb.get("dropped") or {}).items():
            parts.append(
                Text(f"left out: direction {i} ({st['directions'][int(i)]['title']}): {why}", style="yellow")
            )
    if res:
        if res.get("changed"):
            ok = all(r.get("ok") for r in res.get("seal_check", []))
            parts.append(Text(
                f"new system {res['tree'][:12]} = stock + {', '.join(res['entries'])}; new entries "
                f"{', '.join(res.get('new_entries') or []) or 'none'}; seal-check {'passed' if ok else 'FAILED'}",
                style="bold green" if ok else "bold red"))  # fmt: skip
        else:
            parts.append(Text("no direction approved: the system is unchanged", style="bold"))
    pictures = st.get("pictures") or []
    if pictures:
        folder = Path(pictures[0]).parent
        parts.append(Text(f"pictures: {', '.join(Path(p).name for p in pictures)} in {folder}"))
    return Panel(Group(*parts), title=f"round {number} of {deployment}", expand=False)


def _tokens(usage: dict[str, Any]) -> str:
    fresh = usage.get("input_tokens") or 0
    cached = (usage.get("cache_read_input_tokens") or 0) + (usage.get("cache_creation_input_tokens") or 0)
    out = f"{fresh + cached:,} in / {usage.get('output_tokens') or 0:,} out"
    return out + (f", {usage['num_turns']} turns" if usage.get("num_turns") else "")


def agent_runs(st: dict[str, Any]) -> list[Text]:
    """Tokens, dollars and the stored transcript of each agent run of a round (claude agent), one
    line each and a total; none when no run has any (the memory agent)."""
    rows = [("master", st["master"])] if st.get("master") else []
    rows += [(f"direction {i}", p) for i, p in sorted(st.get("patches", {}).items(), key=lambda x: int(x[0]))
             if p.get("transcript") or p.get("cost_usd")]  # fmt: skip
    if not rows:
        return []
    lines = [Text("agent runs:", style="bold")]
    for name, r in rows:
        lines.append(Text(f"  {name}: {_tokens(r.get('usage') or {})}, ${r.get('cost_usd') or 0:.2f}; "
                          f"transcript {r.get('transcript') or '-'}"))  # fmt: skip
    lines.append(Text(f"  total ${sum(r.get('cost_usd') or 0 for _, r in rows):.2f}"))
    return lines
