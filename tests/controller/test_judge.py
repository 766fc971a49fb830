"""The controller judging real, confined refspec processes on two CPU slots (smollm-cpu, shrunk).

One module-scoped home runs Phase 0 once; each test builds a candidate as a real commit in the
workspace (a patch on stock) and asks the controller for a verdict, in the CPU slots' sliced
design. The one-slot (interleaved) design, the GPU's, runs on one CPU core at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot import controller
from specpilot.controller.evaluate import PUBLIC
from specpilot.controller.stats import MIN_LOOK
from specpilot.deployments import Home, SpecPilotError, load_deployment
from specpilot.deployments.registry import SHIPPED
from specpilot.memory_store import connect, records
from specpilot.memory_store.workspace import Workspace
from tests.conftest import phase0, run_cli

pytestmark = [
    pytest.mark.quiet,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="paired runs need two CPU cores"),
]

TINY = "smollm-tiny"


def _tiny_spec(
    home: Home,
    name: str = TINY,
    slots: str = '"cpu:0", "cpu:1"',
    design: str = "auto",
    audit: int = 600,
    requests: int = 3,
    tokens: int = 40,
) -> None:
    text = (SHIPPED / "smollm-cpu.toml").read_text()
    text = text.replace('name = "smollm-cpu"', f'name = "{name}"')
    text = text.replace("sets = { humaneval = 5, mtbench = 2 }", f"sets = {{ humaneval = {requests} }}")
    text = text.replace("max_new_tokens = 64", f"max_new_tokens = {tokens}")
    text = text.replace('slots = ["cpu:0", "cpu:1"]', f"slots = [{slots}]")
    text = re.sub(
        r"(?m)^blocks = .*\n^budget_s = .*\n^max_blocks = .*$",
        f'blocks = 3\nbudget_s = 75\nmax_blocks = 6\ndesign = "{design}"\naudit_positions = {audit}',
        text,
    )
    home.deployments.mkdir(parents=True, exist_ok=True)
    (home.deployments / f"{name}.toml").write_text(text)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """(home, deployment, workspace) with Phase 0 done."""
    home = Home(tmp_path_factory.mktemp("judge") / "home")
    _tiny_spec(home)
    dep = load_deployment(TINY, home)
    ws, _ = Workspace.init(home, dep)
    figures = phase0(dep, home)
    return home, dep, ws, figures


def _candidate(ws: Workspace, name: str, edit, base: str = "system") -> str:
    """Commit `edit(tree_path)` on a fresh worktree from `base`; the candidate's branch name."""
    wt = ws.add_worktree(name, base)
    edit(wt)
    ws.commit_worktree(wt, name)
    return f"cand/{name}"


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path} no longer contains {old!r}: update this fixture"
    path.write_text(text.replace(old, new, 1))


GENERATE = "refspec/generate.py"
STEP = '        if mode == "spec":\n            return self.step('


def test_phase0_figures(judged):
    home, dep, _, figures = judged
    assert figures["delta"] >= 0.125 and figures["delta"] * 8 == int(figures["delta"] * 8)
    # 1 warm-up + 3 measured requests drawn from the pool Phase 0 composed (enough draws for a
    # comparison and an audit of 600 positions, and 2 more: 7 × 4), with neutral ids.
    assert figures["stock"]["positions"] == 4 * 40 and figures["draw"]["pool"] == 7 * (3 + 1)
    assert figures["draw"]["composed"] is True
    assert sorted(figures["draw"]["sources"]) == ["r00", "r01", "r02", "r03"]
    noise = figures["noise"]
    # 3 quiet blocks asked: rounds of a block per core until there are, a disturbed one set aside.
    logs = noise["runs"][0]["block_logs"]
    assert 0.0 <= noise["sigma"] < 0.5 and noise["design"] == "sliced"
    assert len(logs) >= 3 and (len(logs) + noise["set_aside"]) % 2 == 0
    db = connect(home)
    assert records.get_state(db, dep.name, "phase0")["delta"] == figures["delta"]
    assert records.get_state(db, dep.name, "controller_digest") == controller.judge_digest(dep, home)


def _burn(seconds: float) -> str:
    return f"        _t = __import__('time'); _end = _t.thread_time() + {seconds}\n        while _t.thread_time() < _end: pass\n"


def _sleepy(ws: Workspace, name: str, base: str = "system", burn_s: float = 0.03) -> str:
    """Stock burning `burn_s` of CPU (30 ms) in every decode step (a step is 30-90 ms on one core): a
    real per-step cost, output unchanged. (A sleep would run on while a sliced system is frozen.)"""
    return _candidate(ws, name, lambda t: _replace(t / GENERATE, STEP, _burn(burn_s) + STEP), base)


def test_removing_a_per_step_cost_is_approved(judged):
    """A sleep-slowed baseline against stock: the candidate is truly faster and must be approved.

    (AR against stock speculative decoding is too close on one shared CPU core to be a stable test.)
    """
    home, dep, ws, _ = judged
    # The audit's power is test_planted_defect's subject; here a top-up of one draw (a round of the
    # sleepy baseline, ~20 s, against four for 600 positions) shows it past the timed outputs. Phase
    # 0 stands: its pool holds the draws of the shipped audit.
    dep = dep.model_copy(update={"controller": dep.controller.model_copy(update={"audit_positions": 200})})
    ev = controller.compare(dep, home, _sleepy(ws, "sleepy-baseline"), "stock")
    assert ev.approved, ev.reasons
    assert ev.gain > 1.1 and ev.lower_bound > 1 + ev.threshold
    assert not ev.changes_output and ev.evidence["design"] == "sliced"
    # Looks come in whole rounds of a block per core (two cores); how many looks a clear gain needs
    # depends on the machine's load, so only the shape is a contract here.
    assert ev.evidence["n"] >= 4 and ev.evidence["n"] % 2 == 0
    # Judged on the pool Phase 0 composed (smollm-cpu as shipped), not on the public sets.
    draw = ev.evidence["draw"]
    assert draw["composed"] is True and draw["held_out"] is False and PUBLIC not in ev.evidence["notes"]
    assert all(s.startswith("comp-") for s in draw["sources"].values())
    _assert_sliced(ev, dep)
    audit = ev.evidence["audit"]
    assert audit["passed"]
    # An approval's audit is topped up with fresh pool requests, none of them timed ones.
    top = audit["top_up"]["sources"]
    assert audit["positions"] >= dep.controller.audit_positions > 4 * 40
    assert set(top) & set(ev.evidence["draw"]["sources"]) == set()
    assert set(top.values()) & set(ev.evidence["draw"]["sources"].values()) == set()


def _assert_sliced(ev, dep) -> None:
    """A round is a block per core, side by side: on each core A and B at once, the requests dealt
    across the cores, each served once by each system; the two systems' turns on a core never
    overlap, and a request's time is the time its system ran."""
    raw = [json.loads(line) for line in Path(ev.evidence["raw"]).read_text().splitlines()]
    runs = [r for r in raw if "system" in r and not r["warmup"]]
    measured = len(ev.evidence["draw"]["sources"]) - dep.controller.warmup_requests
    blocks = sorted({r["block"] for r in runs})
    assert len(blocks) == ev.evidence["n"] and len(blocks) % 2 == 0
    for first in blocks[::2]:
        rnd = [r for r in runs if r["block"] in (first, first + 1)]
        for b in (first, first + 1):
            mine = [r for r in rnd if r["block"] == b]
            assert len({r["slot"] for r in mine}) == 1
            assert sorted(r["id"] for r in mine if r["system"] == "A") == sorted(
                r["id"] for r in mine if r["system"] == "B"
            )
        assert {r["slot"] for r in rnd} == set(dep.devices.slots)
        assert len({r["id"] for r in rnd}) == len([r for r in rnd if r["system"] == "A"]) == measured
    assert all(r["active_s"] <= r["t_done"] - r["t_send"] + 1e-6 for r in runs)
    assert any(r["active_s"] < 0.75 * (r["t_done"] - r["t_send"]) for r in runs), "the core was shared"
    turns = [t for r in raw if "turns" in r for t in r["turns"]]
    assert turns and all(sorted(t["labels"]) == ["A", "B"] for t in turns)
    assert all(t["served_s"]["A"] + t["served_s"]["B"] <= 1.02 * t["wall_s"] for t in turns), turns


def test_sleep_slowed_candidate_is_rejected(judged):
    home, dep, ws, _ = judged
    # With no time left in a round's budget: the fewest blocks a verdict takes, planned as such; a
    # clear rejection (its upper bound under the bar) is not called undecided by the budget.
    ev = controller.compare(dep, home, "system", _sleepy(ws, "slow"), budget_s=0.0)
    assert not ev.approved and ev.gain < 1.0
    assert any("lower bound" in r for r in ev.reasons), ev.reasons
    assert ev.evidence["k_max"] == MIN_LOOK < dep.controller.max_blocks
    assert not any("judging budget" in n for n in ev.evidence["notes"]), ev.evidence["notes"]
    # Beside a slow candidate the baseline runs at its own speed: no "baseline slowed" finding (its
    # record is per request, so a draw of quicker or slower prompts is not read as a slowdown).
    assert not any("baseline ran" in r for r in ev.reasons), ev.reasons


def test_fake_timing_fields_gain_nothing(judged):
    """A candidate that claims tiny timings in its stats and lines is judged on the controller's clock."""
    home, dep, ws, _ = judged

    def lie(t: Path) -> None:
        _replace(t / GENERATE, '        return {"steps": self.steps, "new_tokens": self.new_tokens, "tau": self.tau}',
                 '        return {"steps": self.steps, "new_tokens": self.new_tokens, "tau": 99.0, '
                 '"elapsed_s": 1e-6, "tokens_per_s": 1e9, "t_done": 0.0}')  # fmt: skip

    fake = _candidate(ws, "fake", lie)
    ev = controller.compare(dep, home, "system", fake, blocks=3)
    assert not ev.approved
    assert 0.7 < ev.gain < 1.3
    raw = [json.loads(line) for line in Path(ev.evidence["raw"]).read_text().splitlines()]
    assert any(
        r["claims"].get("tokens_per_s") == 1e9 for r in raw if r["system"] == "B"
    )  # stored, never used


# Stock serve leaves with os._exit (no atexit handlers, no teardown), so the exit work rides on
# the candidate's own wrapper of os._exit, which the protected serve module calls by name.
LATE = """import os, sys, time
sys.stderr.write("stderr is " + os.readlink("/proc/self/fd/2") + "\\n")
def _late(code, _exit=os._exit):
    t = time.process_time()
    while time.process_time() - t < 4:
        pass
    _exit(code)
os._exit = _late
class Engine:"""


WARM = """_FIRST = [1]


def parse_request(obj: object) -> Request:
    if _FIRST:  # the first request after ready is the controller's warm-up: served, never timed
        _FIRST.pop()
        _t = __import__("time")
        _end = _t.thread_time() + 10
        while _t.thread_time() < _end:
            pass
"""


def test_work_while_not_timed_is_a_violation(judged):
    """A candidate computing in its exit window (after its last timed request, in the shutdown
    grace: work that could only serve a timed copy of it elsewhere) and in its warm-up request
    (served, never timed) is named twice, not approved; and its stderr is a pipe, so no log name
    tells it which kind of run it is in."""
    home, dep, ws, _ = judged

    def edit(t: Path) -> None:
        _replace(t / GENERATE, "class Engine:", LATE)
        _replace(t / "refspec/runtime.py", "def parse_request(obj: object) -> Request:\n", WARM)

    late = _candidate(ws, "late", edit)
    ev = controller.compare(dep, home, "system", late, blocks=2)
    assert not ev.approved
    assert any("outside its turns" in r and "work while not timed" in r for r in ev.reasons), ev.reasons
    assert any("on its warm-up request" in r and "work while not timed" in r for r in ev.reasons), ev.reasons
    logs = list(Path(ev.evidence["raw"]).with_suffix("").glob("b*-B-*.log"))
    assert logs and all("stderr is pipe:[" in log.read_text() for log in logs)


# A file no system reads: the residency of its pages in the machine's page cache is what a jailed
# process can leave behind for the next one (a read that fails rather than wait for the disk tells
# whether a page is cached; evicting one needs only read access).
CHANNEL = Path(__import__("pydoc_data.topics").topics.__file__)
PAGES = CHANNEL.stat().st_size // 4096
CARRY = f"""        _os = __import__("os")
        self._at = __import__("zlib").crc32(str(input_ids).encode()) % {PAGES} * 4096
        _fd = _os.open({str(CHANNEL)!r}, _os.O_RDONLY)
        _os.posix_fadvise(_fd, 0, 0, _os.POSIX_FADV_RANDOM)  # a miss reads back that page alone, no neighbours
        try:
            self._seen = not _os.preadv(_fd, [bytearray(1)], self._at, _os.RWF_NOWAIT)
        except BlockingIOError:
            self._seen = True  # evicted: a process before this one served this prompt
        _os.close(_fd)
"""
MARK = f"""        _os = __import__("os")
        _fd = _os.open({str(CHANNEL)!r}, _os.O_RDONLY)
        _os.posix_fadvise(_fd, self._at, 4096, _os.POSIX_FADV_DONTNEED)  # (a probe's miss may read it back in)
        _os.close(_fd)
"""


def test_a_candidate_faster_on_requests_it_served_before_is_caught(judged):
    """The page-cache channel through the jail, used as a replay would: the candidate marks each
    prompt it serves by evicting a page of CHANNEL picked by the prompt's hash (at every step), and
    skips the baseline's per-step cost on a prompt whose page it finds evicted. Every block serves the same
    draw, so it runs as the baseline on each request's first serve and faster on every repeat (a
    candidate carrying its answers would draft them there). The repeat check names it."""
    home, dep, ws, _ = judged
    base = _sleepy(ws, "sleepy-always", burn_s=0.08)
    burn = "".join("    " + line + "\n" for line in _burn(0.08).splitlines())

    def carry(t: Path) -> None:
        _replace(
            t / GENERATE,
            "        check_prompt(input_ids, self.model.args.vocab)\n",
            "        check_prompt(input_ids, self.model.args.vocab)\n" + CARRY,
        )
        _replace(t / GENERATE, STEP, MARK + "        if not self._seen:\n" + burn + STEP)

    cand = _candidate(ws, "repeat-carrier", carry)
    CHANNEL.read_bytes()  # every page cached: nothing served yet
    ev = controller.compare(dep, home, base, cand, blocks=6)  # three rounds of a block per core
    assert not ev.approved
    assert any("on the requests it had served before" in r for r in ev.reasons), ev.reasons
    first, later = ev.evidence["block_gains"][:2], ev.evidence["block_gains"][2:]
    assert max(first) < 1.1 < 1.3 < min(later), ev.evidence["block_gains"]  # the channel carried


def test_planted_defect_is_rejected_by_the_audit(judged):
    """fixtures/planted_defect.patch: a small bias added to some logits before the verify argmax,
    on a candidate that is also faster (against a sleep-slowed baseline), so only the audit stops it.

    The defect changes about one HumanEval request in two within 40 tokens, so the run's four
    requests show nothing ~9% of the time: the audit's top-up (≥ 600 positions, 15 requests in
    draws shaped as the timed one; all unchanged ~3e-5 of the time) is what sees it."""
    home, dep, ws, _ = judged
    patch = (Path(__file__).parent / "fixtures" / "planted_defect.patch").read_bytes()
    defect = _candidate(
        ws, "defect", lambda t: subprocess.run(["git", "apply", "-"], cwd=t, input=patch, check=True)
    )
    ev = controller.compare(dep, home, _sleepy(ws, "sleepy-base-2", "stock"), defect)
    assert not ev.approved
    audit = ev.evidence["audit"]
    assert not audit["passed"] and audit["mismatches"] > 0 == audit["stock_mismatches"]
    assert any(r.startswith("audit:") for r in ev.reasons)
    # Scored over the top-up too: the timed requests may all come out unchanged, and only the added
    # requests show the defect; whether the output changes is decided on all of them.
    assert audit["positions"] >= dep.controller.audit_positions
    assert ev.changes_output and ev.evidence["changed_requests"]


def test_protected_path_is_refused_without_running(judged):
    home, dep, ws, _ = judged
    touch = _candidate(ws, "touch-serve", lambda t: (t / "refspec/serve.py").write_text(
        (t / "refspec/serve.py").read_text() + "\n# harmless?\n"))  # fmt: skip
    ev = controller.compare(dep, home, "system", touch)
    assert not ev.approved and ev.run_id is None
    assert "protected paths: refspec/serve.py" in ev.reasons[0]


def test_a_module_shadowing_the_protected_one_is_refused(judged):
    """A package refspec/serve/ would be imported in place of refspec/serve.py: the module is protected."""
    home, dep, ws, _ = judged

    def shadow(t: Path) -> None:
        (t / "refspec/serve").mkdir()
        (t / "refspec/serve/__init__.py").write_text("from ..runtime import *\n")
        (t / "refspec/serve/__main__.py").write_text("print('{\"ready\": true}')\n")

    ev = controller.compare(dep, home, "system", _candidate(ws, "shadow", shadow))
    assert not ev.approved and ev.run_id is None and "refspec/serve/__init__.py" in ev.reasons[0]


def test_a_gitattributes_anywhere_is_refused(judged):
    """`git archive` applies a tree's .gitattributes (`ident`, `export-subst`): exports of the same
    tree would then hold other bytes than the tree that was judged."""
    home, dep, ws, _ = judged

    def attrs(t: Path) -> None:
        (t / "refspec/.gitattributes").write_text("*.py ident export-subst\n")

    ev = controller.compare(dep, home, "system", _candidate(ws, "attrs", attrs))
    assert not ev.approved and ev.run_id is None and "refspec/.gitattributes" in ev.reasons[0]


def test_crashing_candidate_is_a_failed_run_not_a_hang(judged):
    home, dep, ws, _ = judged
    crash = _candidate(
        ws, "crash", lambda t: _replace(t / GENERATE, "class Engine:", "raise SystemExit(3)\nclass Engine:")
    )
    ev = controller.compare(dep, home, "system", crash)
    assert not ev.approved
    assert "failed" in ev.reasons[0] and "exited with code" in ev.reasons[0]
    assert records.get_run(connect(home), ev.run_id).status == "failed"


def test_stock_audit_passes_and_report_renders(judged):
    home, dep, _, _ = judged
    data = controller.audit_system(dep, home, "stock")
    assert data["passed"] and data["mismatches"] == data["stock_mismatches"]
    proc = run_cli("report", home=home.root, check=True)
    assert "rejected" in proc.stdout
    listed = json.loads(run_cli("--json", "report", home=home.root, check=True).stdout)
    shown = run_cli("report", listed[-1]["id"][:8], home=home.root, check=True).stdout
    assert "REJECTED" in shown or "APPROVED" in shown


def test_changed_controller_refuses_to_judge(judged):
    home, dep, _, _ = judged
    db = connect(home)
    good = records.get_state(db, dep.name, "controller_digest")
    records.set_state(db, dep.name, "controller_digest", "0" * 64)
    try:
        with pytest.raises(SpecPilotError, match="the judge changed since Phase 0"):
            controller.compare(dep, home, "system", "stock")
    finally:
        records.set_state(db, dep.name, "controller_digest", good)


def test_other_load_on_a_slot_disturbs_the_turn(judged, tmp_path):
    """A busy loop pinned to one slot's core while both systems serve: that slot is flagged, the other not."""
    from specpilot.controller.adapters import adapter_for
    from specpilot.controller.context import slots_of, tuning_requests, workspace
    from specpilot.controller.period import run_period
    from specpilot.controller.systems import checkout

    home, dep, _, _ = judged
    ws = workspace(home, dep)
    stock = checkout(ws.repo_dir, "stock", ws.systems_cache)
    s0, s1 = slots_of(dep)
    spin = f"import os\nos.sched_setaffinity(0, {{{s1.index}}})\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    reqs = tuning_requests(dep, home, limit=2)
    try:
        period = run_period(adapter_for(dep, home), {"A": stock, "B": stock}, {"A": s0, "B": s1},
                            [{"A": reqs, "B": reqs}], tmp_path, "load")  # fmt: skip
    finally:
        busy.kill()
        busy.wait()
    [turn] = period.turns
    assert turn.load["B"]["foreign_share"] > 0.3, turn.load
    assert turn.load["A"]["foreign_share"] < 0.1, turn.load
    assert len(period.disturbances) == 1 and period.disturbances[0].startswith(f"other load on {s1}:")


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory):
    """The interleaved design (the GPU's, one device) on one CPU core, Phase 0 done."""
    home = Home(tmp_path_factory.mktemp("one-slot") / "home")
    # The audit's top-up is the sliced tests' subject; here the timed outputs (2 x 24) are its material
    # (72 positions took a top-up draw of the sleepy baseline, ~11 s).
    _tiny_spec(home, "smollm-one", '"cpu:0"', "interleaved", audit=48, requests=2, tokens=24)
    dep = load_deployment("smollm-one", home)
    ws, _ = Workspace.init(home, dep)
    return home, dep, ws, phase0(dep, home)


def test_one_slot_design_takes_turns_and_approves_a_real_gain(one_slot):
    """Both systems loaded on cpu:0, one serving while the other is frozen, in ABBA order."""
    home, dep, ws, figures = one_slot
    assert figures["noise"]["design"] == "interleaved"
    # 100 ms a step, a gain of ~1.5: this design's σ comes from three A/A blocks of three requests
    # on one core, and on a CI VM whose host is busy the same request's CPU time differs by up to
    # 8% from one turn to the next (no steal, no foreign load: the retained records of a failed CI
    # run), so σ came out at 3.7-4.8% and the threshold 1% + 2σ at 8-11%. 30 ms a step (a gain of
    # ~1.15) sat inside that band; the approval must not hang on a quiet host.
    ev = controller.compare(dep, home, _sleepy(ws, "sleepy", burn_s=0.1), "stock")
    assert ev.approved, ev.reasons
    assert ev.evidence["design"] == "interleaved" and ev.gain > 1.1
    raw = [json.loads(line) for line in Path(ev.evidence["raw"]).read_text().splitlines()]
    turns = [t for r in raw if "turns" in r for t in r["turns"]]
    assert all(len(t["labels"]) == 1 for t in turns), "one system generates at a time"
    # After the warm-up turns, a turn per request in ABBA order: X r1, Y r1, Y r2, X r2, ...
    blocks = [r["turns"][2:] for r in raw if "turns" in r]
    for turns in blocks:
        order = "".join(t["labels"][0] for t in turns)
        x, y = order[0], order[1]
        assert {x, y} == {"A", "B"} and order == "".join(
            (x + y, y + x)[i % 2] for i in range(len(order) // 2)
        ), order
    for b in {r["block"] for r in raw if "system" in r}:  # a request's two runs are adjacent
        runs = sorted((r for r in raw if r.get("block") == b and "system" in r and not r["warmup"]),
                      key=lambda r: r["t_send"])  # fmt: skip
        ids = [r["id"] for r in runs]
        assert ids[0::2] == ids[1::2] and len(set(ids)) == len(ids) // 2, ids
    served = {r["system"] for r in raw if "system" in r}
    assert served == {"A", "B"} and {r["slot"] for r in raw if "slot" in r} == {"cpu:0"}
