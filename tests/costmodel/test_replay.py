"""Exact replay of τ on hand-built recordings (see builders.step_lattice for the hand computation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specpilot.costmodel.recording import load_records, parse_record
from specpilot.costmodel.replay import oracle_accept, replay, replay_table, topk_shape
from specpilot.deployments import SpecPilotError
from specpilot.kernels.tree import Lattice

from .builders import GREEDY, humaneval_record, mtbench_record, record, step_lattice, write_records


@pytest.fixture
def records(tmp_path: Path):
    return load_records(write_records(tmp_path / "rec.jsonl", [humaneval_record(), mtbench_record()]))


# Per step on the humaneval record: accepted drafts -> τ = accepted + 1; 12 greedy tokens.
# 1 accepted: τ 2, 6 steps.  2 accepted: τ 3, 4 steps.  3 accepted: τ 4, 3 steps.
@pytest.mark.parametrize(
    ("policy", "budget", "tau"),
    [
        ("chain", 8, 2.0),  # g0 then the wrong Y
        ("best_first_marginal", 4, 2.0),  # g0, g0 Y, g0 Y g2, g0 Y Z
        ("best_first_marginal", 5, 3.0),  # + g0 g1
        ("best_first_marginal", 6, 4.0),  # + g0 g1 g2
        ("best_first", 1, 2.0),  # g0
        ("best_first", 2, 3.0),  # + g0 g1 (cond)
        ("best_first", 3, 4.0),  # + g0 g1 g2
        ("topk", 8, 3.0),  # k 4, depth 2: g0, X | g0 g1, X Y, g0 Y, X g1
        ("topk", 16, 4.0),  # k 5, depth 3: adds g0 g1 g2
        ("oracle", None, 4.0),  # g0, g1, g2 are all in the marginal top-16
    ],
)
def test_replay_by_hand(records, policy: str, budget: int | None, tau: float) -> None:
    r = replay(records, policy, budget)
    assert r.per_set["humaneval"] == tau
    assert r.per_set["mtbench"] == 1.0  # empty lattices: AR steps
    he_steps = round(len(GREEDY) / tau)
    assert (r.tokens, r.steps) == (12 + 5, he_steps + 5)
    assert r.tau == pytest.approx(17 / (he_steps + 5))


def test_topk_shapes() -> None:
    assert topk_shape(8, 3) == (4, 2)
    assert topk_shape(16, 3) == (5, 3)  # depth 4 passes the block: depth 3, width 16 // 3
    assert topk_shape(2, 8) == (2, 1)
    assert topk_shape(16, 8) == (4, 4)  # the paper's top-4 tree at 16 nodes
    assert topk_shape(32, 8) == (4, 8)
    assert topk_shape(64, 8) == (8, 8)


def test_table_and_best_tree(records) -> None:
    table = replay_table(records, budgets=[2, 8])
    assert table.tau("chain", 8) == pytest.approx(17 / 11)
    policy, tau = table.best_tree(8)
    assert tau == pytest.approx(17 / 8) and policy == "best_first"  # conditioned wins ties by order
    d = table.to_dict()
    json.dumps(d)
    assert d["tau"]["oracle"] == pytest.approx(17 / 8)
    assert d["per_set"]["chain@8"] == {"humaneval": 2.0, "mtbench": 1.0}
    assert d["set_sizes"] == {"humaneval": 1, "mtbench": 1}


def test_the_last_step_is_cut_at_the_end_of_the_run(tmp_path: Path) -> None:
    rec = record("x-1", [5, 6], [{"tokens": [[5], [6], [7]], "logp": [[-0.1]] * 3, "cond": []}] * 2)
    r = replay([parse_record(rec, "test")], "chain", 8)
    assert (r.tokens, r.steps) == (2, 1)


def test_oracle_accept_definition() -> None:
    lat = Lattice.coerce(step_lattice(GREEDY, 0))
    assert oracle_accept(lat, GREEDY) == 3
    assert oracle_accept(lat, GREEDY, top=1) == 1  # g1 is second at position 1
    assert oracle_accept(lat, [100, 2, 3]) == 3  # Y, Z are candidates too
    assert oracle_accept(lat, [100]) == 1  # never past the target


def test_bad_recordings_are_named(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(humaneval_record()) + "\n{not json\n")
    with pytest.raises(SpecPilotError, match=r"bad.jsonl:2: not JSON"):
        load_records(p)
    short = humaneval_record()
    short["lattices"] = short["lattices"][:3]
    p.write_text(json.dumps(short) + "\n")
    with pytest.raises(SpecPilotError, match="3 lattices for 12 greedy tokens"):
        load_records(p)
    missing = humaneval_record()
    del missing["greedy"]
    p.write_text(json.dumps(missing) + "\n")
    with pytest.raises(SpecPilotError, match="missing greedy"):
        load_records(p)
    p.write_text("\n")
    with pytest.raises(SpecPilotError, match="no records"):
        load_records(p)
    with pytest.raises(SpecPilotError, match="no such recording"):
        load_records(tmp_path / "absent.jsonl")


def test_sets_come_from_the_request_file(tmp_path: Path, records) -> None:
    from specpilot.costmodel.recording import label_sets

    reqs = tmp_path / "req.jsonl"
    lines = [{"id": "humaneval-0", "set": "code-set", "input_ids": [1], "max_new_tokens": 12}]
    reqs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert [r.set for r in records] == ["humaneval", "mtbench"]  # the id's prefix by default
    label_sets(records, reqs)
    assert [r.set for r in records] == ["code-set", "mtbench"]
    assert replay(records, "chain", 8).per_set == {"code-set": 2.0, "mtbench": 1.0}
