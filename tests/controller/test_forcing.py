from __future__ import annotations

import pytest
from scipy import stats as sps

from specpilot.controller.forcing import ScoredOutput, allowed_mismatches, audit, calibrate_delta


def test_delta_rounds_up_to_eighths():
    assert calibrate_delta([0.05, 0.232]) == 0.25  # the paper's 0.232 nat -> 1/4
    assert calibrate_delta([0.125]) == 0.125
    assert calibrate_delta([0.126]) == 0.25
    assert calibrate_delta([]) == 0.125  # no divergence: the smallest step


def _out(rid, n, mism):
    """n positions; `mism` maps position -> margin of a mismatch there."""
    tokens = list(range(n))
    argmax = [t if i not in mism else t + 1000 for i, t in enumerate(tokens)]
    margins = [mism.get(i, 0.0) for i in range(n)]
    return ScoredOutput(rid, tokens, argmax, margins)


def test_stock_against_itself_passes():
    stock = [_out("a", 400, {10: 0.01}), _out("b", 400, {})]
    res = audit(stock, stock, delta=0.125)
    assert res.passed
    assert (res.mismatches, res.positions, res.rate) == (1, 800, 1 / 800)
    assert res.events == []


def test_rate_excess_rejects():
    stock = [_out("a", 1000, {})]
    cand = [_out("a", 1000, {i: 0.05 for i in range(0, 1000, 150)})]  # 7 small mismatches: 0.7%
    res = audit(cand, stock, delta=0.125)
    assert not res.passed and "allows at most 0" in res.reasons[0]
    assert res.events == []  # all below 2δ


def test_where_stock_is_exact_one_departure_rejects_but_a_tie_does_not():
    """The issue's defect: 2 of 448 positions against stock's 0 of 512 — the old 0.5-point
    allowance passed it. Stock's rate is 0, so the tolerance is 0; an exact tie is no departure."""
    stock = [_out("s", 512, {})]
    assert not audit([_out("c", 448, {7: 0.4, 300: 0.02})], stock, delta=0.125).passed
    assert not audit([_out("c", 448, {7: 0.02})], stock, delta=0.125).passed
    assert audit([_out("c", 448, {7: 1e-5})], stock, delta=0.125).passed


def test_the_tolerance_scales_with_stock_rate_and_the_positions():
    """At stock's rate the candidate passes; its tolerance is a binomial bound on as many positions."""
    stock = [_out("s", 1000, {i: 0.01 for i in range(0, 1000, 100)})]  # 1.0%
    at_rate = [_out("c", 4000, {i: 0.01 for i in range(0, 4000, 100)})]  # 40 of 4000: stock's rate
    assert allowed_mismatches(4000, 10, 1000) > 40 and audit(at_rate, stock, delta=0.125).passed
    twice = [_out("c", 4000, {i: 0.01 for i in range(0, 4000, 50)})]  # 80 of 4000
    assert not audit(twice, stock, delta=0.125).passed
    assert allowed_mismatches(100, 10, 1000) < allowed_mismatches(4000, 10, 1000)
    assert allowed_mismatches(4000, 0, 1000) == 0


def test_large_events_use_a_one_sided_fisher_test_and_are_explained_against_stock():
    stock = [_out("a", 2000, {5: 0.3})]
    cand = [_out("a", 2000, {5: 0.3, **{i: 1.0 for i in range(100, 2000, 200)}})]  # 11 large, 1 explained
    res = audit(cand, stock, delta=0.125)
    expected_p = sps.fisher_exact([[11, 1989], [1, 1999]], alternative="greater").pvalue
    assert res.p_large == pytest.approx(expected_p)
    assert expected_p < 0.05 and any("Fisher" in r for r in res.reasons)
    assert len(res.events) == 11 and len(res.unexplained) == 10
    assert [e.position for e in res.events if e.explained] == [5]


def test_an_events_context_names_ids_past_the_tokenizer(tmp_path):
    """wide-h200's target has 248,320 ids over SmolLM2's 49,152-token tokenizer: such an id in an
    event's context reads ⟨id⟩, not an empty string."""
    from tokenizers import Tokenizer

    from specpilot.controller.audit import contexts
    from specpilot.controller.forcing import AuditResult, Event
    from specpilot.deployments import Home, load_deployment
    from specpilot.deployments.workloads import target_folder

    dep, home = load_deployment("wide-h200"), Home(tmp_path)  # the cache is the suite's (SPECPILOT_CACHE)
    tok = Tokenizer.from_file(str(target_folder(dep, home) / "tokenizer.json"))
    hello = tok.encode("Hello world", add_special_tokens=False).ids
    out = {"r1": [*hello, 200000, *hello, 7]}
    ev = Event(id="r1", position=len(hello) * 2 + 1, token=7, argmax=123456, margin=1.0, explained=False)
    res = AuditResult(positions=10, mismatches=1, rate=0.1, stock_positions=10, stock_mismatches=0, stock_rate=0.0,
                      delta=0.125, events=[ev], stock_events=0, p_large=0.5, reasons=[])  # fmt: skip
    [d] = contexts(dep, home, res, out)
    assert d["context"] == f"Hello world⟨200000⟩Hello world[{tok.decode([7])}|⟨123456⟩]"
