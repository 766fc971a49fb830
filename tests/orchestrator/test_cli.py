"""The CLI as a user runs it: the installed console script in a real subprocess."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_deployments_list_and_show(home):
    rows = json.loads(run_cli("--json", "deployments", "list", check=True).stdout)
    names = {r["name"] for r in rows}
    assert {"smollm-cpu", "smollm-h200", "qwen27b-h100", "qwen27b-rtx6000"} <= names
    shown = run_cli("deployments", "show", "qwen27b-h100", check=True).stdout
    assert "48 Gated DeltaNet" in shown and "sglang==0.5.20" in shown
    data = json.loads(run_cli("--json", "deployments", "show", "smollm-cpu", check=True).stdout)
    assert data["devices"]["slots"] == ["cpu:0", "cpu:1"]


def test_unknown_deployment_is_one_line_exit_2_and_creates_nothing(home):
    proc = run_cli("workspace", "init", "--deployment", "nope", home=home)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown deployment 'nope'" in lines[0]
    assert not home.exists()


def test_malformed_user_spec_is_named(home):
    (home / "deployments").mkdir(parents=True)
    (home / "deployments" / "mine.toml").write_text('name = "mine"\nengine = [\n')
    proc = run_cli("deployments", "list", home=home)
    assert proc.returncode == 2
    assert "mine.toml: TOML syntax error" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_workspace_init_twice_and_status(home):
    first = json.loads(
        run_cli("--json", "workspace", "init", "--deployment", "smollm-cpu", home=home, check=True).stdout
    )
    second = json.loads(
        run_cli("--json", "workspace", "init", "-d", "smollm-cpu", home=home, check=True).stdout
    )
    assert (first["created"], second["created"]) == (True, False)
    assert first["stock_tree"] == second["stock_tree"] == second["system_tree"]
    status = json.loads(run_cli("--json", "workspace", "status", home=home, check=True).stdout)
    assert [s["deployment"] for s in status] == ["smollm-cpu"]
    assert status[0]["system_is_stock"] is True
    assert "smollm-cpu" in run_cli("workspace", "status", home=home, check=True).stdout


def test_home_option_beats_environment(tmp_path, home):
    other = tmp_path / "other"
    run_cli("--home", str(other), "workspace", "init", "-d", "smollm-cpu", home=home, check=True)
    assert (other / "workspaces" / "smollm-cpu" / "repo" / ".git").is_dir()
    assert not home.exists()


def test_unknown_option_is_a_usage_error_not_a_traceback(home):
    proc = run_cli("report", "--nope", home=home)
    assert proc.returncode == 2
    assert "No such option: --nope" in proc.stderr and "Traceback" not in proc.stderr


def test_an_all_digit_id_prefix_is_an_id_not_a_round(home):
    """Verdict ids are hex: an 8-character prefix is all digits ~2% of the time (one failed CI)."""
    proc = run_cli("report", "71761649", home=home)
    assert proc.returncode == 2 and "no verdict or run '71761649'" in proc.stderr, proc.stderr
    proc = run_cli("report", "3", home=home)
    assert proc.returncode == 2 and "rounds exist for no deployment" in proc.stderr, proc.stderr
