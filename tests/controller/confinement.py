"""The skip every confined-run test shares: where the machine cannot confine, say why."""

from __future__ import annotations

import pytest

from specpilot.controller.confine import check_available
from specpilot.deployments import SpecPilotError


def _why() -> str | None:
    try:
        check_available()
    except SpecPilotError as e:
        return str(e)
    return None


CONFINE = _why()
needs_confinement = pytest.mark.skipif(CONFINE is not None, reason=f"cannot confine here: {CONFINE}")
