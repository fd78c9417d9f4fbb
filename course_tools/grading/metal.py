"""The from-the-metal track's static check: what the answer cells may name while ``torch.nn`` is off limits.

Lesson 11's from-the-metal stages (exercises named ``metal_…``, ``bare_torch.PREFIX``) ask for Linear,
Embedding, LayerNorm, softmax, cross-entropy, AdamW, the schedule and clipping written from tensor
operations. Three defences, each covering what the others cannot:

1. **Run time** (``course_tools.exercises.bare_torch.guard``, in the learner's kernel): while a metal
   stage runs the learner's code, PyTorch's layers, losses and optimisers raise, and every module called
   and every optimiser stepped must be a class defined in the notebook (or ``nn.Module``, the containers,
   ``optim.Optimizer``), checked on its whole MRO. It catches ``nn.Linear`` however it is reached
   (``torch.nn.modules.linear.Linear``, a subclass, ``getattr`` with a built name), ``F.*``,
   ``torch._C._nn.*``, ``torch.softmax``, ``x.softmax``, ``torch.ops.aten.*`` and ``torch.optim.AdamW``.
2. **This module** (in the grader, reading the submission's source; nothing in the kernel can switch it
   off): a reference taken *before* the guard (``lin = F.linear`` at the top of a cell) keeps the real
   function, so the grader reads the answer cells (``cell_summary``, in a child process) and scores
   every metal stage 0, with the submission flagged, when

   * a metal answer cell (grade_id ``metal_…``) reaches a forbidden name (``forbidden``): through imports,
     aliases (``F = torch.nn.functional``, ``lin = F.linear``, ``getattr(torch, "nn")``) and definitions in
     any cell (a helper defined in a base-track cell that calls ``F.cross_entropy``), or a namespace
     passed as a value (``f(nn)``), or a tensor method (``x.softmax``) on anything;
   * a graded function of a metal stage (the lesson's helpers, or the learner's redefinition of one)
     reaches a forbidden name through what it calls, wherever that is defined;
   * a metal answer cell imports anything but ``ALLOWED_IMPORTS``;
   * any answer cell looks names up dynamically (``cell_summary.DYNAMIC_CALLS``/``DYNAMIC_ATTRIBUTES``:
     ``getattr`` with a built name, ``__dict__``, ``sys.modules``, ``eval``), imports an introspection module
     (``INTROSPECTION``: ``gc``, ``sys``, ``importlib``, ...), or names the machinery (``course_tools``,
     ``bare_torch``, ``_course_answer``): those are the ways to undo the run-time guard;
   * an answer cell cannot be read (too long, too deep, a syntax error).
3. **The verdicts** (``references/lesson11.py``, in the grader): values and gradients against PyTorch's,
   AdamW over several steps at changing rates, the trained weights scored in the grader's own model.

What it does not stop: code that computes the same thing by hand-written operations other than the
pieces (that is the point of the track); a learner's piece that passes its stage and is then unused by
their GPT (the GPT stage still has to train). Pure-Python or NumPy arithmetic cannot give the gradients the
stages compare. The run-time guard alone would not stop a captured reference; this check alone would not
stop a name it cannot read, which is why a cell it cannot read scores 0.
"""

from __future__ import annotations

import ast
import re

from course_tools.exercises import bare_torch, checks
from course_tools.grading import shortcuts
from course_tools.messages import N_

FLAG = N_("used what the from-the-metal track forbids (its stages scored 0)")
ALLOWED = {"torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Module", "torch.nn.modules.module.Module",
           "torch.nn.ModuleList", "torch.nn.ModuleDict", "torch.optim.Optimizer", "torch.optim.optimizer.Optimizer",
           "course_utils.data", "course_utils.runtime"}
FORBIDDEN_PREFIXES = ("torch.nn.", "torch.optim.", "torch._", "torch.ops", "course_utils.", "course_tools")
NAMESPACES = {"torch", "torch.nn", "torch.optim", "torch.special", "torch.nn.functional",
              "torch.nn.modules", "torch.nn.utils", "torch.nn.init", "torch.ops", "course_utils"}
ALLOWED_IMPORTS = {"math", "torch", "typing", "collections", "dataclasses", "functools", "itertools"}
INTROSPECTION = {"gc", "sys", "importlib", "builtins", "inspect", "ctypes", "types", "runpy", "code", "codeop",
                 "pickle", "marshal", "operator", "torch._dynamo"}
MACHINERY = re.compile(r"course_tools|bare_torch|_course_answer|ForbiddenOnMetal|_global_forward_pre_hooks|"
                       r"_global_optimizer_pre_hooks")
METHOD_LIKE = {"eval", "exec", "compile"}  # also methods of a module (model.eval()): only a bare call counts
OWN_OBJECTS = {"self", "model", "module"}  # self.modules() is a module's own submodules, not sys.modules


def forbidden(qualified: str) -> bool:
    """Whether a fully qualified name is off limits on the metal track (the torch names of
    ``bare_torch``'s guard, every non-data ``course_utils`` name, a namespace as a value)."""
    if qualified in ALLOWED or any(qualified.startswith(a + ".") for a in ALLOWED):
        return False
    if qualified in NAMESPACES or qualified.startswith(FORBIDDEN_PREFIXES):
        return True
    head, _, name = qualified.rpartition(".")
    if qualified.split(".")[0] == "torch" and len(qualified.split(".")) > 1 and \
            qualified.split(".")[1] in INTROSPECTION | {"os"}:  # torch.sys.modules[...] reaches any module
        return True
    return (head == "torch" and name in bare_torch.TORCH_FUNCTIONS) or \
        (head == "torch.special" and name in bare_torch.SPECIAL_FUNCTIONS)


def _method(dotted: str) -> str | None:
    """A forbidden tensor method read off anything (``x.softmax``, ``type(x).logsumexp``)."""
    parts = dotted.split(".")
    return f"Tensor.{parts[-1]}" if len(parts) > 1 and parts[-1] in bare_torch.TENSOR_METHODS else None


def _environment(cells: list[dict]) -> tuple[dict[str, str], set[str]]:
    """Local name -> the module or attribute its import binds (every package, not only torch), and the
    modules star-imported."""
    env, stars = {}, set()
    for cell in cells:
        for kind, target, alias in cell["imports"]:
            if target.endswith(".*"):
                stars.add(target[:-2])
            elif kind == "import":
                env[alias or target.split(".")[0]] = target if alias else target.split(".")[0]
            else:
                env[alias or target.rsplit(".", 1)[1]] = target
    return env, stars


class _Reach(shortcuts.NameReach):
    """What each dotted name of the submission reaches among forbidden names, across all its cells."""

    def __init__(self, pristine: list[dict], answers: list[dict], definitions: set[str]) -> None:
        # the lesson's own top-level variables (its comparisons hold PyTorch's layers) carry nothing: only
        # its functions and classes, which the graded helpers call, are followed
        statements = [s for cell in pristine for s in cell["statements"] if set(s[0]) <= definitions] + \
            [s for cell in answers for s in cell["statements"]]
        super().__init__(_environment([*pristine, *answers])[0], set(_environment(answers)[0]), answers, statements)

    def hits(self, dotted: str, qualified: str | None) -> set[str]:
        found = {qualified} if qualified is not None and forbidden(qualified) else set()
        method = _method(dotted)
        return found | {method} if method else found


def _dynamic(summary: dict, source: str) -> list[str]:
    """The cell's dynamic lookups, less two that a genuine model cell writes as methods:
    ``model.eval()`` (only a bare ``eval(``/``exec(``/``compile(`` counts) and ``self.modules()``
    (``modules`` counts when read off anything else, as in ``sys.modules``)."""
    found = []
    for name in summary["dynamic"]:
        if name in METHOD_LIKE and not re.search(rf"(?<![\w.]){name}\s*\(", source):
            continue
        if name == "modules" and all(u.split(".")[0] in OWN_OBJECTS for _, uses in summary["statements"] for u in uses
                                     if u.endswith(".modules") or ".modules." in u):
            continue
        found.append(name)
    return found


def _imports_problem(summary: dict, metal_cell: bool) -> str | None:
    for _kind, target, _alias in summary["imports"]:
        module = target[:-2] if target.endswith(".*") else target
        if module.split(".")[0] in INTROSPECTION or module in INTROSPECTION:
            return f"imports {module}, which can undo the track's run-time guard"
        if metal_cell and (module.split(".")[0] not in ALLOWED_IMPORTS or forbidden(module)):
            return f"imports {module}; the track's cells import only {', '.join(sorted(ALLOWED_IMPORTS))}"
    return None


def violations(base, parsed) -> list[str]:
    """Why the metal stages of this submission score 0 (empty: they stand on their run)."""
    code = {(c.metadata.get("nbgrader") or {}).get("grade_id") for c in base.cells if c.cell_type == "code"}
    cells = [(grade_id, source) for grade_id, sources in parsed.answers.items() if grade_id in code
             for source in sources]
    pristine_sources = shortcuts.pristine_sources(base)
    read = shortcuts.summaries([*pristine_sources, *(source for _, source in cells)])
    pristine, answers = read[:len(pristine_sources)], read[len(pristine_sources):]
    found = []
    for (grade_id, source), summary in zip(cells, answers, strict=True):
        metal_cell = bare_torch.guarded(grade_id)
        if not summary["ok"]:
            found.append(f"the answer cell {grade_id!r} {summary['status']}")
            continue
        if MACHINERY.search(source):
            found.append(f"the answer cell {grade_id!r} names the grading machinery")
        dynamic = _dynamic(summary, source)
        if dynamic:
            found.append(f"the answer cell {grade_id!r} looks names up dynamically ({', '.join(dynamic)})")
        problem = _imports_problem(summary, metal_cell)
        if problem:
            found.append(f"the answer cell {grade_id!r} {problem}")
    reach = _Reach([s for s in pristine if s["ok"]], [s for s in answers if s["ok"]], _definitions(pristine_sources))
    for (grade_id, _), summary in zip(cells, answers, strict=True):
        if bare_torch.guarded(grade_id) and summary["ok"]:
            hits = reach.cell(summary)
            if hits:
                found.append(f"the answer cell {grade_id!r} uses {', '.join(sorted(hits))}")
    for function in _metal_functions(base):
        hits = reach.carries.get(function, set())
        if hits:
            found.append(f"{function} reaches {', '.join(sorted(hits))}")
    return list(dict.fromkeys(found))


def _definitions(sources: list[str]) -> set[str]:
    """The functions and classes the lesson's own (trusted) cells define at their top level."""
    return {node.name for source in sources for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _metal_functions(base) -> list[str]:
    """The graded functions of the metal stages of the lesson ``base`` is the pristine notebook of."""
    names = []
    for cell in base.cells:
        meta = cell.metadata.get("nbgrader") or {}
        if meta.get("grade") and not meta.get("solution") and bare_torch.guarded(str(meta.get("grade_id", ""))):
            names.append(checks.get(str(meta["grade_id"]).removesuffix("_check")).function)
    return names


def apply(sub, parsed, base) -> bool:
    """Score 0 on every metal stage of ``sub`` when ``violations`` finds anything (the first reason is
    its status); True if it did (the caller flags the submission). A submission that scored nothing on
    the track (it did not take it) is left as it is: its base-track cells may use what the track forbids."""
    metal = [score for score in sub.exercises if bare_torch.guarded(score.name)]
    if not any(score.points for score in metal):  # a learner who left the track out is not flagged for it
        return False
    found = violations(base, parsed)
    if not found:
        return False
    reason = f"from-the-metal track: {found[0]} (scored 0)"
    for score in metal:
        shortcuts._zero(score, reason)
    return True
