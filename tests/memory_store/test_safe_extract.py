"""Extracting `git archive` tars: the "data" filter where Python has it, the same refusals by hand
on Python 3.11 releases before 3.11.4 (simulated here by hiding `tarfile.data_filter`)."""

from __future__ import annotations

import io
import tarfile

import pytest

from specpilot.deployments import SpecPilotError
from specpilot.memory_store.gittree import safe_extract


def _tar(*members: tuple[str, bytes | None, str | None]) -> tarfile.TarFile:
    """A tar of (name, file bytes or None for a folder, symlink target or None)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return tarfile.open(fileobj=buf)


@pytest.fixture(params=["data-filter", "by-hand"])
def python(request, monkeypatch):
    if request.param == "by-hand":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


def test_a_source_tree_extracts(python, tmp_path):
    safe_extract(
        _tar(("pkg", None, None), ("pkg/a.py", b"x = 1\n", None), ("pkg/b.py", None, "a.py")), tmp_path
    )
    assert (tmp_path / "pkg" / "a.py").read_text() == "x = 1\n"
    assert (tmp_path / "pkg" / "b.py").readlink().as_posix() == "a.py"


@pytest.mark.parametrize("member", [("../evil.py", b"x", None), ("pkg/out", None, "../../etc/passwd")])
def test_escaping_members_are_refused(python, tmp_path, member):
    with pytest.raises((SpecPilotError, tarfile.FilterError)):
        safe_extract(_tar(member), tmp_path / "out")
    assert not (tmp_path / "evil.py").exists()
