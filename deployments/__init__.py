"""Deployment specs, their loader, the home layout and the stock trees (bottom layer)."""

from .errors import SpecPilotError, differing
from .home import Home
from .knobs import set_knob
from .registry import deployment_files, load_deployment
from .spec import SLOT_RE, Arch, Deployment, load_deployment_file

__all__ = [
    "SLOT_RE",
    "Arch",
    "Deployment",
    "Home",
    "SpecPilotError",
    "deployment_files",
    "differing",
    "load_deployment",
    "load_deployment_file",
    "set_knob",
]
