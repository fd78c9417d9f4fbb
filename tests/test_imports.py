"""No import circles in ``course_utils`` and ``course_tools``, counting the imports inside functions.

A function-level import hides a circle from Python (the module is imported when the function runs, after
both modules exist) but not from the reader: two modules that need each other are one module in two
files. This walks every module's syntax tree with ``ast``, takes every import wherever it stands (top
level, functions, ``if TYPE_CHECKING``), and fails naming the circle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("course_utils", "course_tools")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> its file, for every ``.py`` file of PACKAGES (a package is its ``__init__``)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` imports anywhere in ``tree``.
    ``from package import thing`` imports the submodule ``package.thing`` when there is one, else ``package``."""
    here = name.split(".") if is_package else name.split(".")[:-1]  # what a relative import starts from
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*here[:len(here) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `torch.nn` -> nothing; `a.b.name` -> the module `a.b`
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports."""
    files = module_files(root)
    return {name: imported(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", set(files))
            for name, path in files.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Circles of ``graph``, each as [a, b, ..., a]: a depth-first search closes one whenever it meets
    a module still on its path, so every set of modules that import each other shows at least one."""
    done: set[str] = set()
    path: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        if node in path:
            found.append([*path[path.index(node):], node])
            return
        if node in done:
            return
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        path.pop()
        done.add(node)

    for start in sorted(graph):
        visit(start)
    return found


def test_no_module_imports_itself_round_a_circle():
    found = [" -> ".join(circle) for circle in circles(import_graph())]
    assert found == [], "import circles (move what the modules share into a module of its own):\n" + "\n".join(found)


def test_the_walk_sees_imports_inside_functions_and_relative_ones(tmp_path):
    (tmp_path / "course_utils").mkdir()
    (tmp_path / "course_tools" / "cli").mkdir(parents=True)
    (tmp_path / "course_utils" / "__init__.py").write_text("")
    (tmp_path / "course_tools" / "__init__.py").write_text("")
    (tmp_path / "course_tools" / "cli" / "__init__.py").write_text("from . import a\n")
    (tmp_path / "course_tools" / "cli" / "a.py").write_text("from course_tools.cli.b import f\n")
    (tmp_path / "course_tools" / "cli" / "b.py").write_text("def f():\n    from .a import g\n")
    graph = import_graph(tmp_path)
    assert graph["course_tools.cli"] == {"course_tools.cli.a"}
    assert graph["course_tools.cli.b"] == {"course_tools.cli.a"}
    assert circles(graph) == [["course_tools.cli.a", "course_tools.cli.b", "course_tools.cli.a"]]
    (tmp_path / "course_tools" / "cli" / "b.py").write_text("def f():\n    import course_utils\n")
    assert circles(import_graph(tmp_path)) == []


@pytest.mark.parametrize("graph", [{"a": {"a"}}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}])
def test_circles_names_the_modules_round_the_circle(graph):
    [circle] = circles(graph)
    assert circle[0] == circle[-1] and set(circle) == set(graph)
