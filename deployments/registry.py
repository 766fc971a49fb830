"""Finding deployments by name: the shipped specs, shadowed by the user's under the home."""

from __future__ import annotations

from pathlib import Path

from .errors import SpecPilotError
from .home import Home
from .spec import Deployment, load_deployment_file

SHIPPED = Path(__file__).resolve().parent


def deployment_files(home: Home | None = None) -> dict[str, Path]:
    """Name -> spec file; a user spec in `<home>/deployments/` shadows a shipped one."""
    files = {p.stem: p for p in sorted(SHIPPED.glob("*.toml"))}
    if home is not None and home.deployments.is_dir():
        files.update({p.stem: p for p in sorted(home.deployments.glob("*.toml"))})
    return dict(sorted(files.items()))


def load_deployment(name: str, home: Home | None = None) -> Deployment:
    """A deployment by name, or by path to a TOML file."""
    if name.endswith(".toml"):
        return load_deployment_file(Path(name))
    files = deployment_files(home)
    if name not in files:
        known = ", ".join(files) or "(none)"
        raise SpecPilotError(
            f"unknown deployment {name!r}; known: {known} "
            "(or pass the path of a .toml file, or add one under <home>/deployments/)"
        )
    return load_deployment_file(files[name])
