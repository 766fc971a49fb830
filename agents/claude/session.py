"""One confined agent run through claude-agent-sdk (the bundled Claude Code CLI as a subprocess).

What confines it (docs/ARCHITECTURE.md, "Claude agents", says what each layer does and does not
guarantee):
- the CLI loads no settings, CLAUDE.md or hooks from disk (`setting_sources=[]`) and has exactly the
  built-in tools we list (no Agent/Task/web tools) plus our in-process MCP tools;
- a PreToolUse hook (fail closed: an exception or a bad answer blocks the call) and the permission
  callback both run `confine.check_tool`: file writes only inside the worktree, never its .git;
  Bash commands whose visible writes land elsewhere are denied; reads of the key's folder and of
  the controller's records (`RunSpec.hidden`) denied;
- Bash runs in the CLI's bubblewrap sandbox (required: the run fails if it is unavailable): a
  read-only root, the worktree and a private temp folder writable, no network, the key's folder
  and the controller's records unreadable, its own PID namespace;
- the API key never enters the CLI's environment: the CLI gets it from an `apiKeyHelper` command
  that prints a 0600 file in a private folder and deletes it (the helper runs once: its TTL is set
  beyond any run), so neither Bash nor the transcript can see it; every other variable whose name
  looks like a credential is blanked too. The transcript is scrubbed of the key all the same.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import AgentError
from . import stubs
from .config import ClaudeOptions, api_key, sandbox_missing
from .confine import WRITE_TOOLS, check_tool
from .transcript import Transcript

DISALLOWED = ["Agent", "Task", "WebFetch", "WebSearch", "Skill", "MultiEdit", "NotebookEdit", "TodoWrite"]
_SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)|(_DB_URL|DATABASE_URL|_PG_URL)$", re.I
)


@dataclass
class RunSpec:
    """One agent run: what it is told, where it runs, what it may do."""

    prompt: str
    cwd: Path
    tools: list[str]  # built-in tools, e.g. Read, Edit, Write, Glob, Grep, Bash
    transcript: Path
    options: ClaudeOptions
    write_root: Path | None = None  # the only place it may write; None: nowhere
    system_prompt: str | None = None
    output_schema: dict[str, Any] | None = None
    mcp_tools: list[Any] = field(default_factory=list)  # SdkMcpTool objects of the "controller" server
    slot: str | None = None  # the device slot exported to its environment
    # What it may not read, beside its credentials: the controller's records (the database, raw runs,
    # round reports), which hold judged prompts' tags and the answers given to them.
    hidden: list[Path] = field(default_factory=list)


@dataclass
class AgentRun:
    """What a finished run left: the stored transcript, its cost and usage, and its answer."""

    transcript: Path
    cost_usd: float
    usage: dict[str, Any]
    subtype: str
    result: str | None
    structured: Any
    denials: list[str]
    tool_errors: dict[str, list[str]]

    def record(self) -> dict[str, Any]:
        return {"transcript": str(self.transcript), "cost_usd": self.cost_usd, "usage": self.usage}


def slot_env(slot: str | None) -> tuple[dict[str, str], int | None]:
    """(environment for the slot, CPU core to pin the CLI and its Bash to): cuda:N shows the agent GPU N
    as cuda:0; cpu:N pins to core N."""
    if not slot:
        return {}, None
    kind, _, index = slot.partition(":")
    if kind == "cuda":
        return {"SPECPILOT_SLOT": slot, "SPECPILOT_DEVICE": "cuda:0", "CUDA_VISIBLE_DEVICES": index}, None
    if kind == "cpu":
        return {"SPECPILOT_SLOT": slot, "SPECPILOT_DEVICE": slot, "CUDA_VISIBLE_DEVICES": ""}, int(index)
    raise AgentError(f"unknown device slot {slot!r} (use cuda:N or cpu:N)")


def bundled_cli() -> Path:
    import claude_agent_sdk

    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if path.is_file():
        return path
    found = shutil.which("claude")
    if found is None:
        raise AgentError("no Claude Code CLI: reinstall claude-agent-sdk (its wheel bundles one)")
    return Path(found)


def _pinned_cli(private: Path, core: int) -> Path:
    """A launcher that pins the CLI (hence its Bash commands) to one core before exec."""
    script = private / "claude-pinned"
    code = f"import os,sys; os.sched_setaffinity(0, {{{core}}}); os.execv(sys.argv[1], sys.argv[1:])"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} '
                      f'{shlex.quote(str(bundled_cli()))} "$@"\n')  # fmt: skip
    script.chmod(0o700)
    return script


def cli_env(private: Path, spec: RunSpec) -> dict[str, str]:
    """The environment of the CLI process (merged over ours by the SDK, so blanking is overriding)."""
    env = {k: "" for k in os.environ if _SECRET_NAME.search(k)}
    env.update(slot_env(spec.slot)[0])
    env.update({
        "HOME": str(private / "home"), "CLAUDE_CONFIG_DIR": str(private / "home" / ".claude"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "ANTHROPIC_API_KEY": "", "CLAUDE_CODE_API_KEY_HELPER_TTL_MS": str(10**12),
        # Scrub mode (=1) would strip credentials from Bash itself, but in this CLI it also drops the
        # sandbox's write confinement (measured: writes to /tmp and /root went through); the key is
        # kept out of the environment instead, so scrub mode is forced off.
        "CLAUDE_CODE_SUBPROCESS_ENV_SCRUB": "0",
        "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "MCP_TOOL_TIMEOUT": str(int(spec.options.timeout_s * 1000)),
    })  # fmt: skip
    return env


def _key_helper(private: Path, key: str) -> str:
    """An apiKeyHelper command that hands the key to the CLI once and deletes it."""
    secret = private / "secret"
    secret.mkdir(mode=0o700)
    keyfile = secret / "key"
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    q = shlex.quote(str(keyfile))
    return f"cat {q} && rm -f {q}"


async def _prompt(text: str):
    yield {"type": "user", "message": {"role": "user", "content": text}}


def run(spec: RunSpec) -> AgentRun:
    """Run one agent to its end; raises AgentError (with the run's record) when it fails or overspends.

    Fails closed: without the Bash sandbox no run starts (the CLI is also told to fail if it cannot
    sandbox), whatever tools the run has."""
    import anyio  # a dependency of the SDK (the `claude` extra), like everything run-time here

    key = api_key()
    why = sandbox_missing()
    if why:
        raise AgentError(why)
    return anyio.run(_run, spec, key)


async def _run(spec: RunSpec, key: str) -> AgentRun:  # noqa: C901 - one linear story
    import anyio
    import claude_agent_sdk as sdk

    private = Path(tempfile.mkdtemp(prefix="specpilot-agent-"))
    (private / "home").mkdir()
    secret = private / "secret"
    mcp_names = [f"mcp__controller__{t.name}" for t in spec.mcp_tools]
    known = set(spec.tools) | set(mcp_names) | {"StructuredOutput"}
    paths_env = {"HOME": str(private / "home"), "PWD": str(spec.cwd)}
    transcript = Transcript(spec.transcript, [key])
    denials: list[str] = []
    stderr: deque[str] = deque(maxlen=30)

    def check(tool: str, args: dict[str, Any], cwd: Path) -> str | None:
        if tool not in known:
            return f"the tool {tool} is not available to this agent"
        if tool in WRITE_TOOLS and spec.write_root is None:
            return f"this agent may not write ({tool})"
        return check_tool(tool, args, spec.write_root or spec.cwd, cwd, [secret, *spec.hidden], paths_env)

    def deny(tool: str, args: Any, reason: str, where: str) -> None:
        denials.append(reason)
        transcript.write("denied", {"by": where, "tool": tool, "input": args, "reason": reason})

    async def hook(inp: dict[str, Any], _tool_use_id: str | None, _ctx: Any) -> dict[str, Any]:
        tool, args = inp.get("tool_name", "?"), inp.get("tool_input") or {}
        try:
            reason = check(tool, args, Path(inp.get("cwd") or spec.cwd))
        except Exception as e:  # fail closed: a check that cannot decide denies
            reason = f"the confinement check failed ({type(e).__name__}: {e}), so the call is denied"
        if reason is None:
            return {}
        deny(tool, args, reason, "hook")
        return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                       "permissionDecisionReason": reason}}  # fmt: skip

    async def can_use(tool: str, args: dict[str, Any], _ctx: Any):
        try:
            reason = check(tool, args, spec.cwd)
        except Exception as e:
            reason = f"the confinement check failed ({type(e).__name__}: {e}), so the call is denied"
        if reason is None:
            return sdk.PermissionResultAllow()
        deny(tool, args, reason, "permission")
        return sdk.PermissionResultDeny(message=reason)

    core = slot_env(spec.slot)[1]
    options = sdk.ClaudeAgentOptions(
        cwd=str(spec.cwd), tools=list(spec.tools), setting_sources=[], skills=[], strict_mcp_config=True,
        allowed_tools=[],  # every call goes through can_use_tool as well as the hook
        disallowed_tools=[t for t in DISALLOWED if t not in spec.tools],
        permission_mode="default", can_use_tool=can_use,
        hooks={"PreToolUse": [sdk.HookMatcher(matcher=None, hooks=[hook], on_failure="block")]},  # type: ignore[list-item]
        sandbox={"enabled": True, "failIfUnavailable": True, "autoAllowBashIfSandboxed": True,  # type: ignore[typeddict-unknown-key]
                 "allowUnsandboxedCommands": False, "filesystem": {"denyRead": [str(secret), *(str(p) for p in spec.hidden if p.exists())]}},
        settings=json.dumps({"apiKeyHelper": _key_helper(private, key)}),
        env=cli_env(private, spec), model=spec.options.model, system_prompt=spec.system_prompt,
        max_turns=spec.options.max_turns, max_budget_usd=spec.options.budget_usd,
        output_format={"type": "json_schema", "schema": spec.output_schema} if spec.output_schema else None,
        mcp_servers={"controller": sdk.create_sdk_mcp_server("controller", tools=spec.mcp_tools)} if spec.mcp_tools else {},
        cli_path=_pinned_cli(private, core) if core is not None else None, stderr=stderr.append,
    )  # fmt: skip
    transcript.write("start", {"cwd": str(spec.cwd), "tools": spec.tools, "mcp_tools": mcp_names,
                               "slot": spec.slot, "options": spec.options.model_dump(), "prompt": spec.prompt})  # fmt: skip
    result = None
    names: dict[str, str] = {}
    tool_errors: dict[str, list[str]] = {}
    try:
        with stubs.cleaned(spec.cwd), anyio.fail_after(spec.options.timeout_s):
            async for msg in sdk.query(prompt=_prompt(spec.prompt), options=options):
                transcript.write(type(msg).__name__, msg)
                blocks = getattr(msg, "content", None)
                if isinstance(msg, sdk.AssistantMessage):
                    names.update({b.id: b.name for b in msg.content if isinstance(b, sdk.ToolUseBlock)})
                elif isinstance(msg, sdk.UserMessage) and isinstance(blocks, list):
                    for b in blocks:
                        if isinstance(b, sdk.ToolResultBlock) and b.is_error:
                            text = b.content if isinstance(b.content, str) else json.dumps(b.content)
                            tool_errors.setdefault(names.get(b.tool_use_id, "?"), []).append(
                                transcript.scrub(text)
                            )
                elif isinstance(msg, sdk.ResultMessage):
                    result = msg
    except TimeoutError:
        raise AgentError(f"the agent ran past its time limit ({spec.options.timeout_s:.0f} s)",
                         {"transcript": str(spec.transcript)}) from None  # fmt: skip
    except sdk.ClaudeSDKError as e:
        # The CLI exits non-zero after an error result (a budget stop, too many turns): that result
        # was already read and is judged below; anything else is a failure of the CLI itself.
        if result is None:
            tail = transcript.scrub(" | ".join(stderr))
            raise AgentError(f"the Claude Code CLI failed: {transcript.scrub(str(e))}" + (f" (stderr: {tail})" if tail else ""),
                             {"transcript": str(spec.transcript)}) from None  # fmt: skip
    finally:
        transcript.close()
        shutil.rmtree(private, ignore_errors=True)
    if result is None:
        raise AgentError("the agent run ended without a result message", {"transcript": str(spec.transcript)})
    usage = {**(result.usage or {}), "num_turns": result.num_turns, "model_usage": result.model_usage or {}}
    out = AgentRun(spec.transcript, float(result.total_cost_usd or 0.0), usage, result.subtype, result.result,
                   result.structured_output, denials, tool_errors)  # fmt: skip
    budget = spec.options.budget_usd
    if result.subtype == "error_max_budget_usd" or out.cost_usd > budget:
        raise AgentError(f"stopped: the dollar budget ${budget:.2f} was exceeded (spent ${out.cost_usd:.2f})",
                         out.record())  # fmt: skip
    if result.subtype == "error_max_turns":
        raise AgentError(f"stopped: the turn budget ({spec.options.max_turns} turns) ran out", out.record())
    if result.is_error:
        why = "; ".join(result.errors or []) or result.result or result.subtype
        raise AgentError(f"the agent run failed ({result.subtype}): {transcript.scrub(why)}", out.record())
    return out
