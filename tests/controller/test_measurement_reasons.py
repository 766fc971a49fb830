"""Which measurements carry no verdict: other load on the slots, or a spread stock's A/A run never shows."""

from __future__ import annotations

import math

from specpilot.controller.evaluate import _measurement_reasons
from specpilot.controller.paired import PairedRun
from specpilot.controller.stats import RequestSpeeds, within_request_spread


def _run(block_shifts: list[float], disturbances: list[str] = ()) -> PairedRun:
    """Six requests with uneven gains; each block shifted by its log offset."""
    gains = [0.0, 0.05, 0.1, 0.2, 0.3, 0.02]
    blocks = [[RequestSpeeds(10.0, 12.0, 10.0 * math.exp(g + s), 12.0 * math.exp(g + s)) for g in gains]
              for s in block_shifts]  # fmt: skip
    return PairedRun(blocks=blocks, disturbances=list(disturbances))


STOCK = {"within_var": 0.01**2, "within_df": 12}


def _reasons(run: PairedRun, noise: dict) -> list[str]:
    return _measurement_reasons(run, within_request_spread(run.blocks), noise)


def test_a_steady_measurement_has_no_objection():
    assert _reasons(_run([0.0, 0.004]), STOCK) == []


def test_a_disturbed_period_is_named():
    reasons = _reasons(_run([0.0, 0.0], ["other load on cpu:1: 9.8 of 20.0 s (49%)"]), STOCK)
    assert reasons == [
        "measurement disturbed: other load on cpu:1: 9.8 of 20.0 s (49%); rerun on a quiet machine"
    ]


def test_blocks_far_apart_are_too_noisy():
    (reason,) = _reasons(_run([0.0, 0.15]), STOCK)
    assert reason.startswith(
        "measurement too noisy: the same requests vary 10.6% between blocks against 1.0%"
    )


def test_a_noise_run_without_the_spread_objects_to_nothing():
    """Noise stored before the spread was recorded: only the load check applies."""
    assert _reasons(_run([0.0, 0.15]), {"sigma": 0.01}) == []
