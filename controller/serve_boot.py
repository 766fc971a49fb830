"""A refspec system's first code: the protected serve module run from its own bytes, not imported.

Protecting `refspec/serve.py` by path (systems.py) keeps a candidate's diff off it, but an import
can be served from anywhere: a `sys.meta_path` hook installed by the package's `__init__`, or a
`sitecustomize` on the path, could hand `python -m refspec.serve` another source. So the system
starts as `python -I -u -B -c BOOT /system/refspec/serve.py SHA256 ARGS...`: isolated mode reads
no PYTHON* variable, no user site and no `sitecustomize` of the system's tree; BOOT checks the
file's hash against the controller's export, compiles it before any of the system's code has run,
puts /system on the path and runs that code object as `__main__` (package `refspec`, so its
relative imports resolve). What the system's own modules then do inside the process they share
with it is theirs; the controller's clock and the audit judge it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ENTRY = "refspec/serve.py"

BOOT = r"""
import hashlib, sys, types
path, want = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    src = f.read()
if hashlib.sha256(src).hexdigest() != want:
    sys.stderr.write(f"boot: {path} is not the serve module the controller exported\n")
    raise SystemExit(121)
code = compile(src, path, "exec", dont_inherit=True)
sys.path.insert(0, "/system")
sys.argv = [path, *sys.argv[3:]]
main = types.ModuleType("__main__")
main.__file__, main.__package__, main.__spec__ = path, "refspec", None
sys.modules["__main__"] = main
exec(code, main.__dict__)
"""


def boot_command(python: str, tree: Path, system_root: str) -> list[str]:
    """The interpreter's argv that runs the tree's serve module from its verified bytes (append
    serve's own arguments)."""
    digest = hashlib.sha256((tree / ENTRY).read_bytes()).hexdigest()
    return [python, "-I", "-u", "-B", "-c", BOOT, f"{system_root}/{ENTRY}", digest]
