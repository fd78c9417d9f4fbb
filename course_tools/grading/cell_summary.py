"""What the static shortcut check needs from answer cells, read in a child process with a memory cap.

``course_tools.grading.shortcuts`` runs this file as a script (``python -I cell_summary.py``, the
standard library only) and sends it the code answer cells as JSON lines; it answers one JSON line
per cell, in order, as soon as that cell is read. A cell the parser cannot read (a SyntaxError, a
MemoryError, a RecursionError), one longer than ``MAX_CHARS`` or nested deeper than ``MAX_DEPTH``
gets ``{"ok": false, "status": ...}``; the grader scores it 0 and says why. The parent times the
whole read and ends this process when it runs over, so no cell can cost the grader more than that
time, and the address-space cap keeps a parse from taking the grader's memory.

Everything below is linear in the cell's size: one walk for depths, one for the names (each
attribute chain is read once, from its outermost node).
"""

from __future__ import annotations

import ast
import json
import resource
import sys

MAX_CHARS = 50_000  # a genuine answer cell is a few thousand characters
MAX_DEPTH = 200  # syntax-tree depth; a genuine cell stays under 40
MEMORY_BYTES = 1024 * 2**20
# Calls and attributes that reach a name the source does not spell: the static check cannot
# follow them, so they count as a shortcut where a taught function is still in the export.
DYNAMIC_CALLS = {"getattr", "__import__", "import_module", "vars", "globals", "locals", "eval", "exec",
                 "compile", "attrgetter", "methodcaller", "__getattribute__", "find_spec", "spec_from_file_location"}
DYNAMIC_ATTRIBUTES = {"__dict__", "__globals__", "__builtins__", "modules", "__closure__", "__code__",
                      "__subclasses__", "__mro__", "__bases__", "__wrapped__", "f_globals", "f_locals"}


def _depth(tree: ast.AST) -> int:
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _constant_getattr(node: ast.AST) -> bool:
    """``getattr(a, "b")``: an attribute read with its name spelled out."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for an attribute chain on a name (``getattr(a, "b")`` read as ``a.b``), else None."""
    parts = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif _constant_getattr(node):
            parts.append(node.args[1].value)
            node = node.args[0]
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts))
        else:
            return None


def _inner(node: ast.AST) -> ast.AST | None:
    """The node a chain link reads from (the ``a`` of ``a.b`` or of ``getattr(a, "b")``)."""
    if isinstance(node, ast.Attribute):
        return node.value
    if _constant_getattr(node):
        return node.args[0]
    return None


def _uses(node: ast.AST) -> tuple[set[str], set[str]]:
    """The dotted names a statement reads (outermost chains only) and its dynamic lookups."""
    nodes = list(ast.walk(node))
    inner = {id(_inner(n)) for n in nodes if _inner(n) is not None}
    uses, dynamic = set(), set()
    for n in nodes:
        if isinstance(n, ast.Call):
            func = n.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in DYNAMIC_CALLS and not _constant_getattr(n):
                dynamic.add(name)
        if isinstance(n, ast.Attribute) and n.attr in DYNAMIC_ATTRIBUTES:
            dynamic.add(n.attr)
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            continue  # an assignment target is not a use
        if isinstance(n, (ast.Attribute, ast.Name, ast.Call)) and id(n) not in inner:
            dotted = _dotted(n)
            if dotted:
                uses.add(dotted)
    return uses, dynamic


def _bound(node: ast.stmt) -> list[str]:
    """The names a top-level statement binds (definitions and assignment targets)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
        node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def summarise(source: str) -> dict:
    """One cell: its imports, the names each top-level statement binds and reads, its dynamic lookups."""
    if len(source) > MAX_CHARS:
        return {"ok": False, "status": f"too long for the static check ({len(source):,} characters; "
                                       f"limit {MAX_CHARS:,})"}
    try:
        tree = ast.parse(source)
        if _depth(tree) > MAX_DEPTH:
            return {"ok": False, "status": f"nested too deeply for the static check (depth over {MAX_DEPTH})"}
        imports, statements, dynamic = [], [], set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports += [["import", a.name, a.asname] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imports += [["from", f"{node.module}.{a.name}" if a.name != "*" else f"{node.module}.*", a.asname]
                            for a in node.names]
        for node in tree.body:
            uses, found = _uses(node)
            dynamic |= found
            statements.append([_bound(node), sorted(uses)])
    except SyntaxError as exc:
        return {"ok": False, "status": f"does not parse (SyntaxError, line {exc.lineno}: {exc.msg})"}
    except (MemoryError, RecursionError) as exc:
        return {"ok": False, "status": f"could not be read by the static check ({type(exc).__name__})"}
    return {"ok": True, "imports": imports, "statements": statements, "dynamic": sorted(dynamic)}


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    for line in sys.stdin:
        try:
            summary = summarise(json.loads(line))
        except MemoryError:
            summary = {"ok": False, "status": "could not be read by the static check (MemoryError)"}
        sys.stdout.write(json.dumps(summary) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
