"""``course assign``: generate the student notebooks in ``exercises/`` from ``solutions/``.

Each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes nbgrader's stub
(``# YOUR CODE HERE`` + ``raise NotImplementedError()``, same indentation); outputs are cleared, and
so is the solutions' line about its stored outputs (an exercise notebook has none); the nbgrader
cell metadata is kept, and the notebook records which lesson it is for the grader.
A region of top-level assignments only (a question's answer, ``name = value``) becomes
``name = ...`` instead, so the student notebook still runs from top to bottom; cells tagged
``solution-note`` (the explanations of the answers) are dropped.

``course assign --nbgrader DIR`` also lays out an nbgrader course folder (``nbgrader_config.py`` and
``source/NN_topic/NN_topic.ipynb``) whose ``nbgrader generate_assignment`` releases the same student
notebooks (``course_tools.exercises.nbgrader_release``).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import re
import shutil
from pathlib import Path

import nbformat

from course_tools.editions import banner
from course_tools.grading.job import Limits

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
MARKDOWN_STUB = "YOUR ANSWER HERE"
ANSWER_STUB = "{name} = ...  # YOUR ANSWER HERE"
ASSIGNMENT = re.compile(r"([A-Za-z_]\w*) = (?!=)")
NOTE_TAG = "solution-note"  # cells of solutions/ that explain an answer; students do not get them
# the solutions' "*Stored outputs: ...*" line, which is not true of an exercise notebook
STORED_OUTPUTS = re.compile(r"^\*Stored outputs:[^\n]*\*$", re.MULTILINE)
NO_OUTPUTS = "*No stored outputs: run the cells from the top; each check prints its verdict.*"
# the nbgrader_config.py of `course assign --nbgrader DIR`: nbgrader imports nbgrader_release (which needs
# nbgrader) when it reads it; this module only writes the text
NBGRADER_CONFIG = (
    "# nbgrader configuration written by `course assign --nbgrader` (course_tools/exercises/nbgrader_release.py):\n"
    '''# generate_assignment releases what `course assign` writes to exercises/ (no "Why this answer" notes,
# the self-check placeholders kept). Needs the course on the Python path: pip install -e '.[grading]'.
from course_tools.exercises.nbgrader_release import generate_assignment_preprocessors

c = get_config()  # noqa: F821  (nbgrader's config loader defines it)
c.GenerateAssignment.preprocessors = generate_assignment_preprocessors()
# Seconds per cell under autograde: the largest of the lessons' own limits (course grade's per-lesson
# cell_timeout); nbgrader's default of 30 s stops a correct capstone's training cell.
c.Execute.timeout = {timeout}
''')


class AssignError(ValueError):
    """A solutions notebook whose markers or metadata are malformed."""


def stub(region: list[str], indent: str, cell_type: str) -> list[str]:
    """What replaces one solution region: ``name = ...`` lines for top-level assignments only,
    else nbgrader's stub."""
    if cell_type != "code":
        return [indent + MARKDOWN_STUB]
    names = [ASSIGNMENT.match(line) for line in region]
    if not indent and region and all(names):
        return [ANSWER_STUB.format(name=m.group(1)) for m in names]
    return [indent + s for s in CODE_STUB]


def strip_solution(source: str, cell_type: str, where: str) -> str:
    """Replace every solution region of one cell's source by its stub."""
    out: list[str] = []
    region: list[str] | None = None
    indent = ""
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN:
            if region is not None:
                raise AssignError(f"{where}: nested {BEGIN}")
            region, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if region is None:
                raise AssignError(f"{where}: {END} without {BEGIN}")
            out += stub(region, indent, cell_type)
            region = None
        elif region is not None:
            region.append(line)
        else:
            out.append(line)
    if region is not None:
        raise AssignError(f"{where}: {BEGIN} without {END}")
    return "\n".join(out)


def lesson_of(path: Path) -> str:
    if not re.fullmatch(r"\d\d_[a-z0-9_]+", path.stem):
        raise AssignError(f"{path.name}: lesson notebooks are named NN_topic.ipynb")
    return path.stem


def build_exercises(solution: nbformat.NotebookNode, lesson: str) -> nbformat.NotebookNode:
    """The exercise notebook for one solutions notebook (a new object; the input is not changed)."""
    nb = copy.deepcopy(solution)
    nb.cells = [c for c in nb.cells if NOTE_TAG not in c.metadata.get("tags", [])]
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        where = f"{lesson} cell {index}"
        grader = cell.metadata.get("nbgrader")
        if grader:
            grade_id = grader.get("grade_id")
            if not grade_id or grade_id in seen:
                raise AssignError(f"{where}: nbgrader cells need a unique grade_id, got {grade_id!r}")
            seen.add(grade_id)
        if BEGIN in cell.source:
            if not (grader and grader.get("solution")):
                raise AssignError(f"{where}: a cell with {BEGIN} needs nbgrader metadata with solution: true")
            cell.source = strip_solution(cell.source, cell.cell_type, where)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        else:
            cell.source = STORED_OUTPUTS.sub(NO_OUTPUTS, cell.source)
        cell.metadata.pop("execution", None)
    grading = solution.metadata.get("course", {}).get("grading")  # a lesson's own time limits for course grade
    nb.metadata["course"] = {"lesson": lesson, "kind": "exercise", **({"grading": grading} if grading else {})}
    return nb


def write_all(solutions: Path, exercises: Path) -> list[Path]:
    """Regenerate ``exercises/`` from every ``solutions/NN_topic.ipynb``; return the files written."""
    exercises.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(solutions.glob("*.ipynb")):
        nb = build_exercises(nbformat.read(src, as_version=4), lesson_of(src))
        banner.with_banner(nb, banner.text([f"solutions/{src.name}"], "course assign", fill_in=True))
        dest = exercises / src.name
        nbformat.write(nb, dest)
        written.append(dest)
    return written


def cell_timeout(solutions: Path) -> int:
    """The largest per-cell time limit any lesson grades with: ``course grade``'s default, or a lesson's own
    ``course.grading.cell_timeout`` (lesson 11's training cell needs minutes)."""
    own = [nbformat.read(src, as_version=4).metadata.get("course", {}).get("grading", {}).get("cell_timeout", 0)
           for src in sorted(solutions.glob("*.ipynb"))]
    return max([Limits.cell_timeout] + [int(seconds) for seconds in own])


def write_nbgrader(solutions: Path, course: Path) -> list[Path]:
    """An nbgrader course folder at ``course``: ``nbgrader_config.py`` (the course's release
    preprocessors; an existing config of your own is left alone, with an error naming the two lines
    to add) and ``source/NN_topic/NN_topic.ipynb``, every solutions notebook as nbgrader's source."""
    if importlib.util.find_spec("nbgrader") is None:  # the config's preprocessors (nbgrader_release) need it
        raise ImportError("nbgrader is not installed")
    course.mkdir(parents=True, exist_ok=True)
    config = course / "nbgrader_config.py"
    if config.exists() and not config.read_text().startswith(NBGRADER_CONFIG.splitlines()[0]):
        raise AssignError(f"{config} is your own: add `from course_tools.exercises.nbgrader_release import "
                          "generate_assignment_preprocessors` and `c.GenerateAssignment.preprocessors = "
                          "generate_assignment_preprocessors()` to it, or pass another folder")
    config.write_text(NBGRADER_CONFIG.replace("{timeout}", str(cell_timeout(solutions))))
    written = [config]
    for src in sorted(solutions.glob("*.ipynb")):
        dest = course / "source" / lesson_of(src) / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        written.append(dest)
    return written


def main(args: argparse.Namespace) -> int:
    root = Path(args.root)
    written = write_all(root / "solutions", root / "exercises")
    if args.nbgrader:
        try:
            written += write_nbgrader(root / "solutions", Path(args.nbgrader))
        except (AssignError, ImportError) as exc:
            fix = "; install it with pip install -e '.[grading]'" if isinstance(exc, ImportError) else ""
            raise SystemExit(f"course assign: {exc}{fix}") from None
    for path in written:
        print(f"wrote {path.relative_to(root) if path.is_relative_to(root) else path}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("assign", help="generate exercises/ from solutions/ (solution regions become stubs)")
    p.add_argument("--root", default=".", help="course folder holding solutions/ and exercises/ (default: .)")
    p.add_argument("--nbgrader", metavar="DIR", help="also lay out an nbgrader course folder in DIR whose "
                   "`nbgrader generate_assignment NN_topic` releases exactly exercises/NN_topic.ipynb")
    p.set_defaults(func=main)
