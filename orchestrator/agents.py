"""Choosing the agent backend of a round: `memory` (offline) or `claude`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specpilot.deployments import Home, SpecPilotError

if TYPE_CHECKING:
    from specpilot.agents import MemorySubAgent

    from .roundview import RoundView

AGENTS = ("memory", "claude")


def default_agent() -> str:
    """`claude` when an API key is configured, else the offline `memory` agent."""
    from specpilot.agents.claude import key_configured  # imports nothing of the SDK

    return "claude" if key_configured() else "memory"


def agent_options(name: str, home: Home, **overrides: Any) -> dict[str, Any]:
    """The settings a new round of backend `name` keeps in its state; checks the backend can run.

    One clear error before anything starts: the SDK is not installed, no key, no Bash sandbox, or a
    bad setting in `<home>/claude.toml` or the round's options."""
    if name == "memory":
        return {}
    if name != "claude":
        raise SpecPilotError(f"unknown agent {name!r}; use one of {', '.join(AGENTS)}")
    from specpilot.agents import claude

    claude.api_key()  # first: without a key nothing else matters
    for why in (claude.sdk_missing(), claude.sandbox_missing()):
        if why:
            raise SpecPilotError(why)
    return claude.load_options(home.root, **overrides).model_dump()


def make_agents(name: str, rnd: RoundView):
    """(master, sub-agent) of backend `name` for this round."""
    if name == "memory":
        from specpilot.agents import MemoryMaster

        return MemoryMaster(), memory_subagent(rnd)
    if name == "claude":
        return claude_agents(rnd)
    raise SpecPilotError(f"unknown agent {name!r}; use one of {', '.join(AGENTS)}")


def memory_subagent(rnd: RoundView) -> MemorySubAgent:
    """Applies `entry` / `knob` directions exactly: each entry's delta with its missing requirements."""
    from specpilot.agents import MemorySubAgent

    have = set(rnd.state.baseline.entries)
    deltas = {}
    for e in rnd.memory.entries(rnd.dep.engine):
        if e.name not in have:
            try:
                order = rnd.memory.resolve([e.name])
            except SpecPilotError:
                continue
            deltas[e.name] = [(x.name, x.delta) for x in order if x.name not in have]
    return MemorySubAgent(deltas)


def claude_agents(rnd: RoundView):
    """The claude master (read-only over the current system) and sub-agents (one worktree each);
    transcripts go to `<home>/transcripts/<deployment>/round-<n>/`."""
    from specpilot.agents import claude
    from specpilot.controller import protected_paths

    claude.api_key()  # first: without a key nothing else matters
    for why in (claude.sdk_missing(), claude.sandbox_missing()):
        if why:
            raise SpecPilotError(
                why
            )  # a resumed round stops here, resumable, rather than fail every direction
    options = claude.ClaudeOptions.model_validate(rnd.state.agent_options)
    folder = rnd.home.transcripts / rnd.dep.name / f"round-{rnd.number}"
    protected = protected_paths(rnd.dep)
    hidden = rnd.home.records  # the draws' tags and the answers given under them
    master = claude.ClaudeMaster(
        rnd.dep, options, rnd.ws.repo_dir, folder / "master.jsonl", protected, hidden
    )

    def transcript_for(worktree):  # worktrees are named r<round>-d<direction>
        return folder / f"direction-{worktree.name.rsplit('-d', 1)[-1]}.jsonl"

    sub = claude.ClaudeSubAgent(rnd.dep, options, transcript_for, protected,
                                costmodel=rnd.state.costmodel, exact=memory_subagent(rnd), hidden=hidden)  # fmt: skip
    return master, sub
