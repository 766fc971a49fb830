"""Which adapter starts a deployment's systems: refspec's JSON-lines processes, or SGLang servers."""

from __future__ import annotations

from specpilot.deployments import Deployment, Home, SpecPilotError

from .engine import EngineAdapter


def adapter_for(dep: Deployment, home: Home) -> EngineAdapter:
    """The adapter that starts the deployment's systems: refspec's JSON lines, or SGLang servers."""
    if dep.engine == "refspec":
        from .refspec_system import RefspecAdapter

        return RefspecAdapter(dep, home)
    if dep.engine == "sglang":
        from .sglang import SglangAdapter

        return SglangAdapter(dep, home)
    raise SpecPilotError(f"deployment {dep.name!r}: engine {dep.engine!r} has no adapter in this version")
