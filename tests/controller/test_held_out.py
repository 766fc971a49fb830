"""Held-out prompts (controller/held_out.py, deployments/workloads/held_out.py): the operator's own
prompts, judged in place of the public sets, kept in the controller's records.

Real SmolLM2 tokenizer and chat template, a real SQLite home, the real CLI; no timing.
"""

from __future__ import annotations

import json
import re

import pytest

from specpilot import controller
from specpilot.controller.context import draw_requests, more_requests
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.workloads import VARIANT, load_chat_template, target_folder
from specpilot.memory_store import connect, records
from tests.conftest import run_cli

SOURCE = re.compile(r"^held-(?P<set>humaneval|mtbench)-(?P<id>[^#]+)#(?P<tag>[0-9a-f]{8})$")


def _prompts(code: int = 12, chat: int = 6) -> list[dict]:
    rows = [{"set": "humaneval", "id": f"c{i}", "prompt": f"Write a Python function `f{i}(xs)` that returns "
             f"the {i}th smallest value of xs, or None when xs has fewer than {i} values."} for i in range(code)]  # fmt: skip
    rows += [{"set": "mtbench", "turns": [f"Plan a {i + 2}-day walk through a city you like.", "Shorter."]}
             for i in range(chat)]  # fmt: skip
    return rows


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _smollm(home) -> tuple[Home, object]:
    """smollm-cpu judging on the public sets where no held-out prompts are registered."""
    h = Home.resolve(home)
    dep = load_deployment("smollm-cpu", h)
    return h, dep.model_copy(update={"controller": dep.controller.model_copy(update={"prompts": "public"})})


def test_draws_come_from_the_held_out_prompts_alone(home, tmp_path):
    h, dep = _smollm(home)
    db = connect(h)
    records.set_state(db, dep.name, "phase0", {"delta": 1.0})  # measured on the public sets
    got = controller.held_out.store(dep, h, _write(tmp_path / "mine.jsonl", _prompts()))
    assert got == {"humaneval": 12, "mtbench": 6}
    # Phase 0 was measured on other prompts: the next round measures it again.
    assert records.get_state(db, dep.name, "phase0") is None
    # A line without an id is known by its line number.
    texts = {
        f"held-{r['set']}-{r.get('id', n)}": (r.get("turns") or [r["prompt"]])[0]
        for n, r in enumerate(_prompts(), 1)
    }
    template = load_chat_template(target_folder(dep, h))
    reqs, draw = draw_requests(dep, h)
    assert draw["held_out"] is True and draw["pool"] == 18
    counts = {"humaneval": 0, "mtbench": 0}
    for q in reqs:
        m = SOURCE.match(draw["sources"][q.id])
        assert m, draw["sources"][q.id]
        counts[m["set"]] += 1
        # Rendered like a public prompt: its first turn under the secret tag, the target's template.
        turn = texts[draw["sources"][q.id].split("#")[0]]
        want = template.encode(VARIANT.format(tag=m["tag"], turn=turn), dep.workload.system_prompt, False)
        assert q.input_ids == want
    w = dep.workload.sets
    assert counts["humaneval"] >= w["humaneval"] and counts["mtbench"] >= w["mtbench"]
    assert len(reqs) == sum(w.values()) + dep.controller.warmup_requests
    # An audit's further draw: held-out prompts the first did not use.
    more, extra = more_requests(dep, h, set(draw["sources"].values()))
    assert extra["held_out"] and not {s.split("#")[0] for s in extra["sources"].values()} & {
        s.split("#")[0] for s in draw["sources"].values()
    }
    assert controller.held_out.clear(dep, h) is True
    assert draw_requests(dep, h)[1]["held_out"] is False
    assert controller.held_out.clear(dep, h) is False


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{"set": "gsm8k", "prompt": "1+1?"}], "each line needs `set`, one of humaneval, mtbench"),
        ([{"set": "humaneval"}], "each line needs `set` and `turns`"),
        ([{"set": "humaneval", "turns": [""]}], "each line needs `set` and `turns`"),
        ([{"set": "humaneval", "id": "a", "prompt": "x"}] * 2, "ids are not unique"),
        (_prompts(code=4), "too few held-out prompts for one draw (humaneval: 4 of 5"),
        (_prompts(code=5, chat=2), "7 of 8 in all"),
    ],
)
def test_bad_held_out_prompts_are_one_clear_error_and_store_nothing(home, tmp_path, rows, says):
    h, dep = _smollm(home)
    db = connect(h)
    records.set_state(db, dep.name, "phase0", {"delta": 1.0})
    with pytest.raises(SpecPilotError, match=re.escape(says)):
        controller.held_out.store(dep, h, _write(tmp_path / "bad.jsonl", rows))
    assert records.get_state(db, dep.name, "held_out") is None
    assert records.get_state(db, dep.name, "phase0") == {"delta": 1.0}


def test_the_cli_stores_them_and_never_shows_their_text(home, tmp_path):
    src = _write(tmp_path / "mine.jsonl", _prompts())
    out = run_cli("workloads", "held-out", "add", src, "-d", "smollm-cpu", home=home, check=True).stdout
    assert "judged on 18 held-out prompts (humaneval 12, mtbench 6)" in " ".join(out.split())
    shown = run_cli(
        "--json", "workloads", "held-out", "show", "-d", "smollm-cpu", home=home, check=True
    ).stdout
    assert json.loads(shown) == {"deployment": "smollm-cpu", "held_out": {"humaneval": 12, "mtbench": 6}}
    assert "smallest" not in shown
    bad = run_cli(
        "workloads", "held-out", "add", str(tmp_path / "missing.jsonl"), "-d", "smollm-cpu", home=home
    )
    assert bad.returncode != 0 and "cannot read the held-out prompts" in bad.stdout + bad.stderr
    gone = run_cli("workloads", "held-out", "remove", "-d", "smollm-cpu", home=home, check=True).stdout
    assert "removed" in gone and "composes" in gone  # smollm-cpu's own judged prompts, without a set
