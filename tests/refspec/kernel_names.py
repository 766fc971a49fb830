"""The Triton kernels a CUDA model's file launches and the kernel classes its model class names,
read from the source (the CPU machine has no Triton to import the CUDA files with)."""

from __future__ import annotations

import ast
from pathlib import Path


def launched(path: Path) -> set[str]:
    """Names of the kernels launched in path: every call `<module>.<kernel>[grid](...)`."""
    return {
        node.func.value.attr
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Attribute)
    }


def kernel_class(path: Path, cls: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """`cls.KERNEL_CLASS` in path: a dict literal, or `Parent.KERNEL_CLASS | {...}` over `base`."""
    tree = ast.parse(path.read_text())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls).body
    value = next(
        n.value for n in body if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["KERNEL_CLASS"]
    )
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):
        assert base is not None, f"{cls}.KERNEL_CLASS extends its parent's: pass the parent's as base"
        return base | ast.literal_eval(value.right)
    return ast.literal_eval(value)
