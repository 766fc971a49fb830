"""Where a sub-agent may write: its worktree, and nowhere else; what no agent may read: its
credentials, and the controller's records (`hidden`: the database, raw runs, round reports).

Pure functions over tool calls, used by the PreToolUse hook and the permission callback of a run
(`session.py`). Paths are made absolute against the agent's cwd, `~` is expanded, and symlinks and
`..` are resolved (`os.path.realpath`, which also resolves the existing part of a path that does
not exist yet), so a link inside the worktree that points outside counts as outside.

File tools (Write, Edit, MultiEdit, NotebookEdit) name their target: it is checked exactly. A Bash
command is only text: `bash_writes` finds the writes a reader can see in it (redirections, `tee`,
`cp`/`mv`/`rm`/`mkdir`/`touch`/`ln`/`chmod`..., `dd of=`, `sed -i`, `cd` before them, `bash -c`
strings, git commands that write the repository). It cannot see what a program writes by itself
(`python -c "open('/x', 'w')"`, a script, a Makefile), targets named through variables it does not
know, globs, or command substitution; those are left to the Bash sandbox, which makes everything
but the worktree and a private temp folder read-only. The hook is a fast first line with a clear
message for the agent, not the enforcement of last resort.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

WRITE_TOOLS = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}
READ_TOOLS = {"Read": "file_path", "Glob": "path", "Grep": "path"}
DEVICES = {"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"}

# Commands whose every non-option argument is written (or removed).
_ALL_ARGS = {"rm", "rmdir", "mkdir", "touch", "truncate", "shred", "unlink", "mkfifo", "mknod", "mv", "tee"}
# Commands whose first non-option argument is not a path (a mode, an owner), the rest are.
_AFTER_FIRST = {"chmod", "chown", "chgrp"}
# Commands that write their last argument (the destination), or the value of -t.
_DEST = {"cp", "ln", "install", "rsync"}
# Prefixes that run the rest of the words as a command.
_WRAPPERS = {"sudo", "env", "nice", "nohup", "time", "command", "exec", "builtin", "stdbuf", "ionice"}
# Options of those that take a value word.
_WRAPPER_VALUE_OPTS = {"-n", "-u", "-g", "-c", "-C", "-p", "-o", "-e", "-i"}
_GIT_WRITES = {
    "add", "commit", "stash", "checkout", "switch", "reset", "rebase", "merge", "cherry-pick", "revert", "tag",
    "branch", "gc", "prune", "worktree", "config", "update-ref", "update-index", "notes", "am", "push", "fetch",
    "pull", "clone", "init", "submodule", "remote", "filter-branch", "replace", "symbolic-ref", "rm", "mv",
}  # fmt: skip
_CONTROL = {";", "&&", "||", "|", "&", "|&", "(", ")", "\n", "{", "}"}
_REDIRECTS = {">", ">>", ">|", "&>", "&>>", "<>"}
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][\w.-]*)\1")


def resolve(path: str, cwd: Path, env: dict[str, str] | None = None, follow: bool = True) -> Path | None:
    """`path` as an absolute, symlink-free path; None when it names something unknowable ($X, `...`).

    With `follow=False` the last component is kept as it is (removing a link removes the link, not
    what it points to)."""
    env = env or {}
    path = re.sub(r"\$\{?(HOME|PWD|TMPDIR)\}?", lambda m: env.get(m.group(1), m.group(0)), path)
    if path.startswith("~") and "HOME" in env:
        path = env["HOME"] + path[1:]
    if any(c in path for c in "$`*?[") or path.startswith("~"):
        return None
    full = cwd / path
    # `rm link/` acts on what the link points to: a trailing slash follows the last component.
    if not follow and not path.endswith(("/", "/.")) and full.name not in ("", ".", ".."):
        return Path(os.path.realpath(full.parent)) / full.name
    return Path(os.path.realpath(full))


def inside(path: Path, root: Path) -> bool:
    """Whether the resolved `path` is `root` or lies under it."""
    root = Path(os.path.realpath(root))
    return path == root or root in path.parents


def writable(path: Path, root: Path) -> bool:
    """A write the worktree rules allow: inside the worktree but not its `.git`, or a harmless device."""
    if str(path) in DEVICES or str(path).startswith("/dev/fd/"):
        return True
    root = Path(os.path.realpath(root))
    return inside(path, root) and not inside(path, root / ".git")


def _commands(tokens: list[str]) -> Iterator[list[str]]:
    """Split shell tokens into simple commands at control operators."""
    cmd: list[str] = []
    for t in tokens:
        if t in _CONTROL:
            if cmd:
                yield cmd
            cmd = []
        else:
            cmd.append(t)
    if cmd:
        yield cmd


def _strip_heredocs(command: str) -> str:
    """Drop here-document bodies (text fed to a program, not shell syntax)."""
    out, lines, i = [], command.split("\n"), 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        ends = [m.group(2) for m in _HEREDOC.finditer(line)]
        i += 1
        for end in ends:
            while i < len(lines) and lines[i].strip() != end:
                i += 1
            i += 1
    return "\n".join(out)


def _tokens(command: str) -> list[str] | None:
    lex = shlex.shlex(_strip_heredocs(command).replace("\n", " ; "), posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError:  # unbalanced quotes: not something we can read
        return None


def _args(words: list[str]) -> list[str]:
    return [w for w in words if not w.startswith("-")]


def _unwrap(words: list[str]) -> list[str]:
    """The command words after env assignments and wrappers like `sudo`, `env X=1`, `timeout 5`."""
    i = 0
    while i < len(words):
        w = words[i]
        if re.fullmatch(r"[A-Za-z_]\w*=.*", w):
            i += 1
        elif w in _WRAPPERS or w in ("timeout", "taskset", "xargs"):
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] in _WRAPPER_VALUE_OPTS else 1
            if w in ("timeout", "taskset") and i < len(words):
                i += 1  # the duration / the CPU list
        else:
            break
    return words[i:]


class _Effect(NamedTuple):
    paths: list[str] = []  # written paths, as written
    cwd: str | None = None  # the new directory of `cd DIR`
    git: str | None = None  # why a git command may not run
    nested: str | None = None  # the command string of `bash -c STRING` / `eval ...`
    unlinked: list[str] = []  # removed or renamed away: the last component is the link, not its target


def _effect(words: list[str]) -> _Effect:
    """What one simple command writes, as far as its words show."""
    words = _unwrap(words)
    if not words:
        return _Effect()
    name, rest = os.path.basename(words[0]), words[1:]
    if name in ("cd", "pushd"):
        return _Effect(cwd=rest[0] if rest else "~")
    if name in ("bash", "sh", "zsh", "dash") and "-c" in rest and rest.index("-c") + 1 < len(rest):
        return _Effect(nested=rest[rest.index("-c") + 1])
    if name == "eval":
        return _Effect(nested=" ".join(rest))
    if name in ("rm", "rmdir", "unlink"):
        return _Effect(unlinked=_args(rest))
    if name == "mv":  # the sources go away (a link itself); the destination is written through links
        args = _args(rest)
        return _Effect(args[-1:], unlinked=args[:-1])
    if name in _ALL_ARGS:
        return _Effect(_args(rest))
    if name in _AFTER_FIRST:
        return _Effect(_args(rest)[1:])
    if name in _DEST:
        for j, w in enumerate(rest):
            if w in ("-t", "--target-directory") and j + 1 < len(rest):
                return _Effect([rest[j + 1]])
            if w.startswith("--target-directory="):
                return _Effect([w.split("=", 1)[1]])
        args = _args(rest)
        return _Effect(args[-1:] if len(args) >= 2 else [])
    if name == "dd":
        return _Effect([w[3:] for w in rest if w.startswith("of=")])
    if name in ("sed", "perl") and any(w == "-i" or w.startswith(("-i", "--in-place")) for w in rest):
        args = _args(rest)
        scripted = any(w in ("-e", "-f", "--expression", "--file") for w in rest)
        return _Effect(args if scripted else args[1:])
    if name == "git":
        paths, j = [], 0
        while j < len(rest) and rest[j].startswith("-"):
            if rest[j] in ("-C", "--git-dir", "--work-tree") and j + 1 < len(rest):
                paths.append(rest[j + 1])
                j += 2
            elif rest[j].startswith(("--git-dir=", "--work-tree=")):
                paths.append(rest[j].split("=", 1)[1])
                j += 1
            else:
                j += 1
        sub = rest[j] if j < len(rest) else ""
        staged = any(w in ("--index", "--cached", "--staged") for w in rest)
        if sub in _GIT_WRITES or (sub in ("apply", "restore") and staged):
            return _Effect(git=(
                f"`git {sub}` writes the repository, which is outside your worktree; edit files only "
                "(the round collects your changes from the worktree itself)"))  # fmt: skip
        # These write only the working tree they run in (-C DIR or the current folder).
        return _Effect((paths or ["."])[:1] if sub in ("apply", "restore", "clean", "checkout-index") else [])
    return _Effect()


def bash_writes(
    command: str, cwd: Path, env: dict[str, str] | None = None, depth: int = 0
) -> list[tuple[str, Path | None]]:
    """Every write target visible in `command`: (as written, resolved path or None when unknowable).

    A git command that writes the repository yields ("<git>" + the reason, None).
    """
    tokens = _tokens(command)
    if tokens is None:
        return []
    out: list[tuple[str, Path | None]] = []
    here: Path | None = cwd

    def target(text: str, follow: bool = True) -> None:
        out.append((text, resolve(text, here, env, follow) if here else None))

    for cmd in _commands(tokens):
        words: list[str] = []
        j = 0
        while j < len(cmd):
            t, nxt = cmd[j], (cmd[j + 1] if j + 1 < len(cmd) else None)
            if t in _REDIRECTS or t == ">&":
                if words and words[-1].isdigit():
                    words.pop()  # the fd number of `2>file` (shlex splits it off)
                if nxt is not None and not (t == ">&" and (nxt.isdigit() or nxt == "-")):
                    target(nxt)
                j += 2
            elif t in ("<", "<<", "<<<", "<&"):
                j += 2
            else:
                words.append(t)
                j += 1
        eff = _effect(words)
        if eff.git:
            out.append(("<git>" + eff.git, None))
        for p in eff.paths:
            target(p)
        for p in eff.unlinked:
            target(p, follow=False)
        if eff.nested is not None and depth < 3:
            out += bash_writes(eff.nested, here or cwd, env, depth + 1)
        if eff.cwd is not None:
            here = resolve(eff.cwd, here, env) if here else None
    return out


def check_tool(tool: str, args: dict[str, Any], root: Path, cwd: Path, hidden: Sequence[Path] = (),
               env: dict[str, str] | None = None) -> str | None:  # fmt: skip
    """Why this tool call must be denied, or None when the confinement rules allow it. `hidden`:
    what the agent may not read (its credentials folder, the controller's records)."""
    if tool in WRITE_TOOLS:
        raw = args.get(WRITE_TOOLS[tool])
        if not isinstance(raw, str) or not raw:
            return f"{tool} without a {WRITE_TOOLS[tool]}"
        path = resolve(raw, cwd, env)
        if path is None or not writable(path, root):
            return (
                f"{tool} to {raw!r} is outside your worktree {root} (writes go only there, never to its .git)"
            )
        return None
    if tool in READ_TOOLS and hidden:
        raw = args.get(READ_TOOLS[tool]) or str(cwd)
        path = resolve(str(raw), cwd, env)
        if path is None:
            return f"{tool} of {raw!r} is not allowed (a variable or a glob: what it reads cannot be known)"
        for h in hidden:
            if inside(path, h) or inside(Path(os.path.realpath(h)), path):
                return f"{tool} of {raw!r} is not allowed (it is or contains {h}, which agents may not read)"
        return None
    if tool == "Bash":
        command = args.get("command")
        if not isinstance(command, str):
            return "Bash without a command"
        if args.get("dangerouslyDisableSandbox"):
            return "Bash outside the sandbox is not allowed"
        for text, path in bash_writes(command, cwd, env):
            if text.startswith("<git>"):
                return text[5:]
            if path is not None and not writable(path, root):
                return f"this command writes {text!r}, which is outside your worktree {root}"
        return None
    return None
