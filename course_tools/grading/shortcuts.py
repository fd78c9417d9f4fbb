"""Library shortcuts: an exercise answered by calling the ``course_utils`` function or class it teaches.

Many references are written on top of the course library (``stable_softmax`` returns
``course_utils.attention.softmax(x)``, ``lora_forward`` builds a ``LoRALinear``), so a one-line call
into the library would pass. Where a lesson's exercise teaches a library function or class, it is
*absent while the lesson is graded*: the course export mounted into the sandbox
(``course_tools.grading.export``) has its definition replaced by one that raises
``SHORTCUT_MESSAGE`` (a function when called, a class when built; a subclass of the stub inherits
nothing), so no way of reaching it from the kernel (an import, a star import, ``importlib``,
``__import__`` with a built string, another module's globals) finds the real one.

The grader also reads the answer cells itself (``apply``), each for the exercise it answers: an
answer cell that names what its own exercise teaches scores 0 for that exercise and the submission
is flagged; an experiment cell that uses a library function costs no other exercise anything.
Names are followed through imports (star imports included), simple aliases and definitions in any
cell (``rt = quantize.roundtrip`` in one cell, ``rt(x)`` in another). Where a taught name has to
stay in the export (below), the static check is all there is, so a cell that looks names up
dynamically (``getattr`` with a built name, ``import_module``, ``__dict__``, ...) scores 0 too.
The cells are read in a child process (``cell_summary``) with a memory cap, a time limit and caps
on a cell's size and depth: a cell it cannot read scores 0 with the reason as its status (never a
skipped rule). Neither check runs in the learner's kernel, so neither can be switched off there.

"Taught by lesson NN" is read from the references themselves: every top-level function or class
(not a dataclass: a record computes nothing) of a ``course_utils`` module (except the
``cpu_threads`` utility) that an exercise or question of ``course_tools/exercises/references/lessonNN.py``
calls, plus what its ``TEACHES`` literal registers (the capstone builds its model in a helper).
A name that the lesson's own notebook cells need, directly or through the library code they call
(lesson 12's experiment runs ``quantize.roundtrip``), is kept in the export and caught by the
static check only.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from course_tools.exercises import REFERENCES, checks
from course_tools.messages import N_

ROOT = Path(__file__).resolve().parents[2]
UTILITIES = {"course_utils.cpu_threads"}  # helpers the references use, taught nowhere
MARKER = "is what this exercise teaches"
SHORTCUT_MESSAGE = "{qualified} " + MARKER + ": write it yourself (the library version is not available while grading)"
FLAG = N_("called a course_utils function that an exercise teaches (scored 0)")
EXERCISE_DECORATORS = {"exercise", "question"}


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(_decorator_name(d) == "dataclass" for d in node.decorator_list)


@cache
def _module_definitions(module: str) -> frozenset[str]:
    """The top-level functions and classes ``module`` defines; a dataclass (a configuration or a
    record: it holds values and computes nothing an exercise asks for) is not counted."""
    path = ROOT / Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return frozenset()
    return frozenset(n.name for n in ast.parse(path.read_text()).body
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                     or (isinstance(n, ast.ClassDef) and not _is_dataclass(n)))


def _decorator_name(node: ast.expr) -> str | None:
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _is_question(node: ast.FunctionDef) -> bool:
    return any(_decorator_name(d) == "question" for d in node.decorator_list)


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


def _registered(tree: ast.Module, lesson: str) -> dict[str, tuple[str, ...]]:
    """A references module's ``TEACHES`` literal: exercise name (or a pattern ending in ``*``, such as
    ``"capstone_*"``: every exercise of the lesson whose name starts so, its questions left out, since a
    question's answer is a value) -> qualified ``course_utils`` names it teaches beyond those its reference
    calls (the capstone's reference builds its model in a helper, and its training loop calls no library)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TEACHES" for t in node.targets):
            registered = ast.literal_eval(node.value)
            for names in registered.values():
                for qualified in names:
                    module, _, name = qualified.rpartition(".")
                    if name not in _module_definitions(module):
                        raise ValueError(f"lesson{lesson[:2]}.py TEACHES names {qualified}, which course_utils does "
                                         "not define: correct the name or remove it")
            return registered
    return {}


@cache
def teaches(lesson: str) -> dict[str, frozenset[tuple[str, str]]]:
    """Exercise name -> the (module, function or class) pairs of ``course_utils`` it teaches, for
    lesson ``lesson`` (e.g. "02_self_attention"): those its reference in ``lessonNN.py`` (in
    ``exercises.REFERENCES``) calls or instantiates, and those the module's ``TEACHES`` registers."""
    path = ROOT / REFERENCES / f"lesson{lesson[:2]}.py"
    if not path.is_file():  # a moved or missing references file must not turn the shortcut rule off silently
        raise FileNotFoundError(f"no references for lesson {lesson} at {path.relative_to(ROOT)}")
    tree = ast.parse(path.read_text())
    names, modules = _library_imports(tree)
    registered = _registered(tree, lesson)
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
        found = {(m, f) for m, f in found if m not in UTILITIES and f in _module_definitions(m)}
        patterns = [] if _is_question(node) else [key for key in registered if key.endswith("*")
                                                   and name.startswith(key[:-1])]
        found |= {tuple(q.rsplit(".", 1)) for key in (*patterns, name) for q in registered.get(key, ())}
        if found:
            out[name] = frozenset(found)
    return out


def taught(lesson: str) -> frozenset[tuple[str, str]]:
    """Every (module, function or class) of ``course_utils`` that some exercise of ``lesson`` teaches."""
    return frozenset().union(*teaches(lesson).values())


def _identifiers(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


@cache
def _library_uses() -> dict[str, set[str]]:
    """Each top-level function or class of ``course_utils`` (by name) -> the names its body uses; the
    subpackages' ``__init__.py`` count too (``pretrained.load`` builds a ``gpt.GPT``)."""
    uses: dict[str, set[str]] = {}
    folder = ROOT / "course_utils"
    for path in sorted(folder.glob("*.py")) + sorted(folder.glob("*/__init__.py")):
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
    """Module -> the functions and classes the export for ``lesson`` replaces with a refusal."""
    out: dict[str, set[str]] = {}
    for module, function in taught(lesson) - used_by_notebook(lesson, pristine_sources):
        out.setdefault(module, set()).add(function)
    return out


def stub_source(source: str, module: str, functions: set[str]) -> str:
    """``source`` with each top-level ``def`` or ``class`` in ``functions`` (decorators included)
    replaced by one that raises: a function when called, a class when instantiated (a subclass of
    the stub inherits nothing of the course's class)."""
    lines = source.splitlines(keepends=True)
    spans = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in functions:
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            spans.append((start, node.end_lineno, node.name, isinstance(node, ast.ClassDef)))
    for start, end, name, is_class in sorted(spans, reverse=True):
        message = SHORTCUT_MESSAGE.format(qualified=f"{module}.{name}")
        if is_class:
            stub = (f"class {name}:  # removed while grading\n    def __new__(cls, *args, **kwargs):\n"
                    f"        raise RuntimeError({message!r})\n")
        else:
            stub = f"def {name}(*args, **kwargs):  # removed while grading\n    raise RuntimeError({message!r})\n"
        lines[start - 1:end] = [stub]
    return "".join(lines)


def pristine_sources(nb) -> list[str]:
    """The sources of a pristine exercise notebook's own code cells (not answers, not checks)."""
    sources = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader") or {}
        if cell.cell_type == "code" and not meta.get("solution") and not meta.get("grade"):
            sources.append(cell.source)
    return sources


# --- the static check: each answer cell, for the exercise it answers ------------------------------

SUMMARY_SCRIPT = Path(__file__).with_name("cell_summary.py")
SUMMARY_SECONDS = 20.0  # the whole submission's cells; a genuine notebook's take well under a second
ALIAS_ROUNDS = 8  # definitions that call definitions that call the library, followed this deep


def summaries(sources: list[str], seconds: float = SUMMARY_SECONDS) -> list[dict]:
    """Each cell's summary (``cell_summary.summarise``), read in a child process with a memory cap
    and ``seconds`` for all of them; a cell not read in time gets a timeout status."""
    process = subprocess.Popen([sys.executable, "-I", str(SUMMARY_SCRIPT)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        out, _ = process.communicate("".join(json.dumps(s) + "\n" for s in sources), timeout=seconds)
        late = f"could not be read by the static check (it stopped, exit status {process.returncode})"
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        late = f"could not be read by the static check in {seconds:g} s"
    read = [json.loads(line) for line in out.splitlines()[:len(sources)]]
    return read + [{"ok": False, "status": late}] * (len(sources) - len(read))


def _star_names(module: str) -> set[str]:
    """What ``from module import *`` binds, as far as a shortcut goes: its public definitions, or
    for the package itself its modules."""
    if module == "course_utils":
        return {p.stem for p in (ROOT / "course_utils").glob("*.py") if not p.stem.startswith("_")}
    return {n for n in _module_definitions(module) if not n.startswith("_")}


def _environment(cells: list[dict]) -> dict[str, str]:
    """Local name -> the ``course_utils`` module or definition it is bound to by these cells' imports."""
    env = {"course_utils": "course_utils"}
    for cell in cells:
        for kind, target, alias in cell["imports"]:
            if target.split(".")[0] != "course_utils":
                continue
            if target.endswith(".*"):
                module = target[:-2]
                env.update({name: f"{module}.{name}" for name in _star_names(module)})
            elif kind == "import":
                env[alias or "course_utils"] = target if alias else "course_utils"
            else:
                env[alias or target.rsplit(".", 1)[1]] = target
    return env


class NameReach:
    """What the dotted names of a submission reach across all its cells: through imports (``env``: local
    name -> qualified name), simple aliases (``rt = quantize.roundtrip``) and definitions that use a name
    that reaches something (``def f(x): return rt(x)``), followed to a fixed point, so that a binding in one
    cell and a use in another are still seen. A learner's own definition of a name the lesson imported is
    theirs (it is dropped from ``env`` unless an answer imports it). Subclasses say what a name reaches
    by itself (``hits``): the taught names here, the metal track's forbidden ones in ``grading.metal``."""

    def __init__(self, env: dict[str, str], answer_imports: set[str], answers: list[dict],
                 statements: list[tuple[list[str], list[str]]]) -> None:
        self.env = env
        for cell in answers:
            for bound, _ in cell["statements"]:
                for name in set(bound) - answer_imports:
                    self.env.pop(name, None)
        self.carries: dict[str, set[str]] = {}  # a defined name -> what it reaches
        for _ in range(ALIAS_ROUNDS):
            changed = False
            for bound, uses in statements:
                if len(bound) == 1 and len(uses) == 1 and bound[0] not in self.env:
                    target = self._qualified(uses[0])
                    if target is not None:
                        self.env[bound[0]], changed = target, True
                reached = set().union(*(self.reach(u) for u in uses)) if uses else set()
                for name in bound:
                    if not reached <= self.carries.get(name, set()):
                        self.carries.setdefault(name, set()).update(reached)
                        changed = True
            if not changed:
                break

    def _qualified(self, dotted: str) -> str | None:
        head, _, rest = dotted.partition(".")
        return None if head not in self.env else self.env[head] + ("." + rest if rest else "")

    def hits(self, dotted: str, qualified: str | None) -> set[str]:
        """What ``dotted`` (``qualified`` through the imports, None if it is not imported) reaches by itself."""
        raise NotImplementedError

    def reach(self, dotted: str) -> set[str]:
        return set(self.carries.get(dotted.partition(".")[0], ())) | self.hits(dotted, self._qualified(dotted))

    def cell(self, summary: dict) -> set[str]:
        return set().union(*(self.reach(u) for _, uses in summary["statements"] for u in uses))


class _Resolver(NameReach):
    """What the dotted names of a submission reach among ``taught`` (``course_utils`` names)."""

    def __init__(self, pristine: list[dict], answers: list[dict], taught: frozenset[str]) -> None:
        self.taught = taught
        super().__init__(_environment([*pristine, *answers]), set(_environment(answers)), answers,
                         [s for cell in [*pristine, *answers] for s in cell["statements"]])

    def hits(self, dotted: str, qualified: str | None) -> set[str]:
        if qualified is None:
            return set()
        return {t for t in self.taught if qualified == t or qualified.startswith(t + ".")}


def _zero(score, reason: str) -> None:
    score.points = 0
    score.status = f"error: {reason}"
    score.lines = [*score.lines, f"  ✗ {reason}"]


@dataclass
class _Verdicts:
    """What the static check found, by exercise."""

    called: dict[str, set[str]] = field(default_factory=dict)  # the taught names its cells reach
    reasons: dict[str, str] = field(default_factory=dict)  # why else it scores 0 (the first one found)
    unflagged: set[str] = field(default_factory=set)  # its only reason is a cell that does not parse


def _judge_cell(grade_id: str, summary: dict, per_exercise: dict[str, set[str]], kept: set[str],
                graded: set[str], resolver: _Resolver, out: _Verdicts) -> None:
    """One answer cell, for the exercise it answers (a cell that is not an exercise: for every
    exercise that teaches what it reaches)."""
    charged = [grade_id] if grade_id in graded else [n for n in per_exercise if n in graded]
    if not summary["ok"]:
        blind = [] if summary["status"].startswith("does not parse") else [
            n for n in per_exercise if per_exercise[n] & kept and n in graded]
        for name in dict.fromkeys([*charged, *blind]):
            out.reasons.setdefault(name, f"the answer cell {grade_id!r} {summary['status']} (scored 0)")
        if not blind:
            out.unflagged.update(charged)  # a SyntaxError is the learner's slip: it fails at run time too
        return
    reached = resolver.cell(summary)
    for name in charged:
        hits = reached & per_exercise.get(name, set())
        reachable = per_exercise.get(name, set()) & kept
        if hits:
            out.called.setdefault(name, set()).update(hits)
        elif summary["dynamic"] and reachable:
            how = ", ".join(summary["dynamic"])
            out.reasons.setdefault(name, f"the answer looks names up dynamically ({how}), which can reach "
                                         f"{', '.join(sorted(reachable))}, which this exercise teaches (scored 0)")


def apply(sub, parsed, base) -> bool:
    """Score 0 on every exercise of ``sub`` whose own answer cell names a function or class it teaches
    (or whose graded function, wherever it is defined, reaches one; or whose cell looks names up
    dynamically while one is still in the export, or cannot be read by the static check), or whose
    run hit a removed one; True if any did for a reason other than a SyntaxError (the caller flags
    the submission).

    ``base`` is the pristine notebook: it says which answer cells are code (a written explanation is
    never parsed) and which imports the lesson's own cells make. An answer cell whose grade_id is not
    an exercise (the capstone's ``my_gpt``) counts for every exercise that teaches what it reaches."""
    per_exercise = {name: {f"{m}.{f}" for m, f in pairs} for name, pairs in teaches(sub.lesson).items()}
    kept = {f"{m}.{f}" for m, f in used_by_notebook(sub.lesson, pristine_sources(base))}
    code = {(c.metadata.get("nbgrader") or {}).get("grade_id") for c in base.cells if c.cell_type == "code"}
    cells = [(grade_id, source) for grade_id, sources in parsed.answers.items() if grade_id in code
             for source in sources]
    read = summaries([*pristine_sources(base), *(source for _, source in cells)])
    answers = read[len(read) - len(cells):]
    resolver = _Resolver([s for s in read[:len(read) - len(cells)] if s["ok"]], [s for s in answers if s["ok"]],
                         frozenset().union(*per_exercise.values()))
    scores = {score.name: score for score in sub.exercises}
    found = _Verdicts()
    for (grade_id, _), summary in zip(cells, answers, strict=True):
        _judge_cell(grade_id, summary, per_exercise, kept, set(scores), resolver, found)
    for name in set(per_exercise) & set(scores):  # the graded function itself, wherever a cell defines it
        hits = resolver.carries.get(checks.get(name).function, set()) & per_exercise[name]
        if hits:
            found.called.setdefault(name, set()).update(hits)
    reasons = {**found.reasons, **{name: f"the answer calls {', '.join(sorted(hits))}, which this exercise "
                                         "teaches (scored 0)" for name, hits in found.called.items()}}
    for score in sub.exercises:
        if score.name not in reasons and MARKER in score.status:
            reasons[score.name] = "the answer calls a removed library function, which this exercise teaches (scored 0)"
    flagged = {name for name in reasons if name in found.called or name not in found.unflagged}
    for name, reason in reasons.items():
        if name in flagged or scores[name].points:  # a cell that does not parse and scored 0 keeps the run's status
            _zero(scores[name], reason)
    return bool(flagged)
