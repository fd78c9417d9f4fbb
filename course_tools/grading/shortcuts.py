"""Library shortcuts: an exercise answered by calling the ``course_utils`` function it teaches.

Many references are written on top of the course library (``stable_softmax`` returns
``course_utils.attention.softmax(x)``), so a one-line call into the library would pass. Where a
lesson's exercise teaches a library function, that function is *absent while the lesson is
graded*: the course export mounted into the sandbox (``course_tools.grading.export``) has its
definition replaced by one that raises ``SHORTCUT_MESSAGE``, so no way of reaching it from the
kernel (an import, ``importlib``, ``__import__`` with a built string, another module's globals)
finds the real one. The grader also reads the answer cells itself: an answer cell that names a
taught function scores 0 for its exercise and the submission is flagged. Neither check runs in
the learner's kernel, so neither can be switched off from there.

"Taught by lesson NN" is read from the references themselves: every top-level function of a
``course_utils`` module (except the ``cpu_threads`` utility) that an exercise or question of
``course_tools/exercises/references/lessonNN.py`` calls. A function that the lesson's own notebook cells
need, directly or through the library code they call (lesson 06's ``load_minilm`` maps BERT's
keys with ``bert_key_to_encoder``), is kept in the export and caught by the static check only.
"""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path

from course_tools.exercises import REFERENCES
from course_tools.messages import N_

ROOT = Path(__file__).resolve().parents[2]
UTILITIES = {"course_utils.cpu_threads"}  # helpers the references use, taught nowhere
MARKER = "is what this exercise teaches"
SHORTCUT_MESSAGE = "{qualified} " + MARKER + ": write it yourself (the library version is not available while grading)"
FLAG = N_("called a course_utils function that an exercise teaches (scored 0)")
EXERCISE_DECORATORS = {"exercise", "question"}


def _module_functions(module: str) -> set[str]:
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return set()
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def _decorator_name(node: ast.expr) -> str | None:
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _exercise_name(node: ast.FunctionDef) -> str | None:
    """The registered name of an exercise/question function (``name=`` of its decorator, else its own)."""
    for decorator in node.decorator_list:
        if _decorator_name(decorator) in EXERCISE_DECORATORS:
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        return str(keyword.value.value)
                if decorator.args and isinstance(decorator.args[0], ast.Constant):
                    return str(decorator.args[0].value)
            return node.name
    return None


def _library_imports(tree: ast.Module) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """A reference module's top-level imports from ``course_utils``: local name -> (module, function),
    and local name -> module."""
    names: dict[str, tuple[str, str]] = {}
    modules: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "course_utils":
            for alias in node.names:
                local = alias.asname or alias.name
                if node.module == "course_utils":
                    modules[local] = f"course_utils.{alias.name}"
                else:
                    names[local] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("course_utils.") and alias.asname:
                    modules[alias.asname] = alias.name
    return names, modules


@cache
def teaches(lesson: str) -> dict[str, frozenset[tuple[str, str]]]:
    """Exercise name -> the (module, function) pairs of ``course_utils`` its reference calls, for
    lesson ``lesson`` (e.g. "02_self_attention"), read from ``lessonNN.py`` in ``exercises.REFERENCES``."""
    path = ROOT / REFERENCES / f"lesson{lesson[:2]}.py"
    if not path.is_file():  # a moved or missing references file must not turn the shortcut rule off silently
        raise FileNotFoundError(f"no references for lesson {lesson} at {path.relative_to(ROOT)}")
    tree = ast.parse(path.read_text())
    names, modules = _library_imports(tree)
    out: dict[str, frozenset[tuple[str, str]]] = {}
    for node in tree.body:
        name = _exercise_name(node) if isinstance(node, ast.FunctionDef) else None
        if name is None:
            continue
        found: set[tuple[str, str]] = set()
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and inner.id in names:
                found.add(names[inner.id])
            elif isinstance(inner, ast.Attribute) and isinstance(inner.value, ast.Name) and inner.value.id in modules:
                found.add((modules[inner.value.id], inner.attr))
        found = {(m, f) for m, f in found if m not in UTILITIES and f in _module_functions(m)}
        if found:
            out[name] = frozenset(found)
    return out


def taught(lesson: str) -> frozenset[tuple[str, str]]:
    """Every (module, function) of ``course_utils`` that some exercise of ``lesson`` teaches."""
    return frozenset().union(*teaches(lesson).values())


def _identifiers(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


@cache
def _library_uses() -> dict[str, set[str]]:
    """Each top-level function or class of ``course_utils`` (by name) -> the names its body uses."""
    uses: dict[str, set[str]] = {}
    for path in sorted((ROOT / "course_utils").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                uses.setdefault(node.name, set()).update(_identifiers(node) - {node.name})
    return uses


def library_entries(source: str) -> set[str]:
    """The ``course_utils`` names a cell uses: imported from it, or read off a module imported from it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    modules, names = {"course_utils"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or "course_utils" for a in node.names if a.name.split(".")[0] == "course_utils"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "course_utils":
            names |= {a.name for a in node.names}
            modules |= {a.asname or a.name for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                names.add(node.attr)
    return names


def needed_by_notebook(sources: list[str]) -> set[str]:
    """The library names these cells use, with everything those use in turn inside ``course_utils``."""
    needed = set().union(*(library_entries(source) for source in sources))
    uses, frontier = _library_uses(), set(needed)
    while frontier:
        frontier = set().union(*(uses.get(name, set()) for name in frontier)) - needed
        needed |= frontier
    return needed


def worked_answers(lesson: str) -> list[str]:
    """The answer cells of the course's own solution to ``lesson`` (``solutions/``, where present):
    a genuine experiment trains with library code that may use a taught function inside."""
    path = ROOT / "solutions" / f"{lesson}.ipynb"
    if not path.is_file():
        return []
    cells = json.loads(path.read_text()).get("cells", [])
    return ["".join(c.get("source", "")) for c in cells
            if (c.get("metadata", {}).get("nbgrader") or {}).get("solution")]


def used_by_notebook(lesson: str, pristine_sources: list[str]) -> frozenset[tuple[str, str]]:
    """The taught functions that the lesson's own cells, or its worked solution's answers, need
    directly or through other library code: they must stay in the export."""
    needed = needed_by_notebook([*pristine_sources, *worked_answers(lesson)])
    return frozenset((m, f) for m, f in taught(lesson) if f in needed)


def removed(lesson: str, pristine_sources: list[str]) -> dict[str, set[str]]:
    """Module -> the functions the export for ``lesson`` replaces with a refusal."""
    out: dict[str, set[str]] = {}
    for module, function in taught(lesson) - used_by_notebook(lesson, pristine_sources):
        out.setdefault(module, set()).add(function)
    return out


def stub_source(source: str, module: str, functions: set[str]) -> str:
    """``source`` with each top-level ``def`` in ``functions`` (decorators included) replaced by one that raises."""
    lines = source.splitlines(keepends=True)
    spans = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            spans.append((start, node.end_lineno, node.name))
    for start, end, name in sorted(spans, reverse=True):
        message = SHORTCUT_MESSAGE.format(qualified=f"{module}.{name}")
        stub = f"def {name}(*args, **kwargs):  # removed while grading\n    raise RuntimeError({message!r})\n"
        lines[start - 1:end] = [stub]
    return "".join(lines)


def named_in_answer(source: str, lesson: str) -> set[str]:
    """The taught functions an answer cell's source names: imported from ``course_utils``, or read as
    an attribute of ``course_utils`` or of a module the cell imported from it. (Built names and
    other indirect routes are the export's job; this check only adds the flag and the zero.)"""
    qualified = {f"{m}.{f}" for m, f in taught(lesson)}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    modules = {"course_utils": "course_utils"}  # local name -> module, for this cell
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "course_utils":
                    modules[a.asname or "course_utils"] = a.name if a.asname else "course_utils"
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "course_utils":
            for a in node.names:
                modules[a.asname or a.name] = f"{node.module}.{a.name}"
    found = set(modules.values()) & qualified
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = [node.attr]
            base = node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                dotted = ".".join([modules[base.id], *reversed(chain)])
                found |= {q for q in qualified if dotted == q or dotted.startswith(q + ".")}
    return found


def pristine_sources(nb) -> list[str]:
    """The sources of a pristine exercise notebook's own code cells (not answers, not checks)."""
    sources = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader") or {}
        if cell.cell_type == "code" and not meta.get("solution") and not meta.get("grade"):
            sources.append(cell.source)
    return sources


def apply(sub, parsed) -> bool:
    """Score 0 on every exercise of ``sub`` whose taught function its answer cells name, or whose run
    hit a removed function; True if any did (the caller flags the submission)."""
    named = set().union(*(named_in_answer(src, sub.lesson) for srcs in parsed.answers.values() for src in srcs))
    hit = False
    for score in sub.exercises:
        functions = {f"{m}.{f}" for m, f in teaches(sub.lesson).get(score.name, ())}
        if functions & named or MARKER in score.status:
            called = ", ".join(sorted(functions & named)) or "a removed library function"
            score.points = 0
            score.status = f"error: the answer calls {called}, which this exercise teaches (scored 0)"
            score.lines = [*score.lines, f"  ✗ {score.status[7:]}"]
            hit = True
    return hit
