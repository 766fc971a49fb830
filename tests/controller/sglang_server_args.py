"""The command-line flags of an SGLang stock tree, read statically from its source (no import).

SGLang 0.5.20 declares its server arguments as annotated fields `name: A[type, "help" | Arg(...)]`
of the classes in `srt/arg_groups/fields/*.py` (turned into `--name-with-dashes`, aliases and
`cli_name` from `Arg`; a bool becomes a bare `store_true` switch; `no_cli=True` has no flag), plus a
few `parser.add_argument("--...")` calls in `srt/server_args.py`. Importing the package needs its
GPU dependencies, so the tests read the same declarations with `ast` instead.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Flag:
    switch: bool  # a bare store_true switch (no value)
    choices: tuple[str, ...] | None  # allowed values when the source lists them


def _module_lists(tree: ast.Module) -> dict[str, list[str]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            values = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = [str(v) for v in values]
    return out


def _unwrap_optional(t: ast.expr) -> ast.expr:
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "Optional":
        return t.slice
    return t


def _literal(t: ast.expr) -> tuple[str, ...] | None:
    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "Literal":
        elts = t.slice.elts if isinstance(t.slice, ast.Tuple) else [t.slice]
        return tuple(str(e.value) for e in elts if isinstance(e, ast.Constant))
    return None


def _added_flag(node: ast.AST) -> str | None:
    """The flag of a `parser.add_argument("--flag", ...)` call, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
    ):
        first = node.args[0] if node.args else None
        if isinstance(first, ast.Constant) and str(first.value).startswith("--"):
            return str(first.value)
    return None


def server_flags(stock: Path) -> dict[str, Flag]:
    """`--flag` -> Flag for every command-line argument of the tree's `sglang.launch_server`."""
    srt = stock / "python" / "sglang" / "srt"
    lists = _module_lists(ast.parse((srt / "arg_groups" / "choices.py").read_text()))
    flags: dict[str, Flag] = {}
    for path in sorted((srt / "arg_groups" / "fields").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            ann = node.annotation
            if not (
                isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"
            ):
                continue
            typ, meta = ann.slice.elts[0], ann.slice.elts[1]
            kw: dict[str, ast.expr] = {}
            if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
                kw = {k.arg: k.value for k in meta.keywords if k.arg}
            elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
                continue  # no CLI metadata: not a command-line flag
            if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                continue
            inner = _unwrap_optional(typ)
            switch = "action" not in kw and isinstance(inner, ast.Name) and inner.id == "bool"
            choices = _literal(inner)
            if isinstance(kw.get("choices"), ast.List):
                choices = tuple(str(e.value) for e in kw["choices"].elts if isinstance(e, ast.Constant))
            elif isinstance(kw.get("choices"), ast.Name):
                choices = tuple(lists.get(kw["choices"].id, [])) or None
            name = kw["cli_name"].value if isinstance(kw.get("cli_name"), ast.Constant) else None
            names = [name or "--" + node.target.id.replace("_", "-")]
            if isinstance(kw.get("aliases"), ast.List):
                names += [e.value for e in kw["aliases"].elts if isinstance(e, ast.Constant)]
            for n in names:
                flags[n] = Flag(switch, choices)
    for node in ast.walk(ast.parse((srt / "server_args.py").read_text())):
        name = _added_flag(node)
        if name is not None:
            action = next((k.value for k in node.keywords if k.arg == "action"), None)
            switch = action is not None and (
                not isinstance(action, ast.Constant) or action.value == "store_true"
            )
            flags[name] = Flag(switch, None)
    return flags


def check_command(cmd: list[str], flags: dict[str, Flag]) -> list[str]:
    """What in a `python -m sglang.launch_server ...` command SGLang's parser would refuse."""
    problems, args, i = [], cmd[3:], 0
    while i < len(args):
        name = args[i]
        flag = flags.get(name)
        if flag is None:
            problems.append(f"{name}: not a server argument")
            i += 1
            continue
        if flag.switch:
            i += 1
            continue
        if i + 1 >= len(args) or args[i + 1].startswith("--"):
            problems.append(f"{name}: needs a value")
            i += 1
            continue
        if flag.choices is not None and args[i + 1] not in flag.choices:
            problems.append(f"{name} {args[i + 1]}: not one of {list(flag.choices)}")
        i += 2
    return problems
