# Copyright 2026 the hf-dflash authors. Apache-2.0.
"""The Python standard library's documented public functions on this machine (``ast``-parsed signatures, docstrings
and sources) as a source of code prompts.
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from pathlib import Path

from transformers.utils import logging

logger = logging.get_logger(__name__)

SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "turtledemo",
              "ensurepip", "venv", "tkinter", "distutils"}


@functools.cache
def stdlib_documented_functions() -> tuple[tuple[ast.FunctionDef, str, str], ...]:
    """(node, docstring, whole source) of the standard library's public documented top-level functions, module by
    module in path order; read once per process."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(root.rglob("*.py")):
        if SKIP_PARTS & set(path.relative_to(root).parts) or path.name.startswith("_"):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and ast.get_docstring(node):
                found.append((node, ast.get_docstring(node), ast.get_source_segment(source, node)))
    return tuple(found)


def stdlib_functions(exclude_names: set[str]) -> list[tuple[str, str, str]]:
    """(signature `name(args)`, first docstring line, full cleaned docstring) of public documented functions."""
    found, seen = [], set()
    for node, doc, _ in stdlib_documented_functions():
        if node.name in exclude_names:
            continue
        first = doc.strip().splitlines()[0].strip()
        if not 20 <= len(first) <= 160 or not first[0].isupper() or first.endswith(":"):
            continue
        if node.name in seen:
            continue
        seen.add(node.name)
        args = ast.unparse(node.args)
        signature = f"{node.name}({args})"
        if len(signature) > 100:
            continue
        body = "\n".join(doc.strip().splitlines()[:12])
        found.append((signature, first if first.endswith(".") else first + ".", body))
    logger.info(f"stdlib: {len(found)} documented public functions")
    return found



MAX_CODE_LINES, MAX_CODE_CHARS = 40, 1500


def code_edit_sources(exclude_names: set[str]) -> list[tuple[str, str]]:
    """(name, whole source) of the documented public standard-library functions of 4 to MAX_CODE_LINES lines and at
    most MAX_CODE_CHARS characters, the first of each name, none named in `exclude_names`."""
    found, seen = [], set(exclude_names)
    for node, _, code in stdlib_documented_functions():
        if node.name in seen or not code or not 4 <= len(code.splitlines()) <= MAX_CODE_LINES:
            continue
        if len(code) <= MAX_CODE_CHARS:
            seen.add(node.name)
            found.append((node.name, code))
    return found

