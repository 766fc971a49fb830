"""Deployment specs, their loader, the home layout and the stock trees (bottom layer)."""

from .errors import SpecPilotError
from .home import Home
from .registry import deployment_files, load_deployment
from .spec import Arch, Deployment, load_deployment_file

__all__ = [
    "Arch",
    "Deployment",
    "Home",
    "SpecPilotError",
    "deployment_files",
    "load_deployment",
    "load_deployment_file",
]
