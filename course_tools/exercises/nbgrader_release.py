"""nbgrader's ``generate_assignment`` made to release what ``course assign`` writes to ``exercises/``.

nbgrader alone would hand out too much and break the self-checks: it keeps the "**Why this
answer.**" cells (tagged ``solution-note``) and the header's line about stored outputs, and it turns
every solution region into ``raise NotImplementedError()``, also a question's ``name = value``
(which ``course assign`` turns into ``name = ...  # YOUR ANSWER HERE``, so the notebook runs from
top to bottom). Two preprocessors fix that, plugged in by the ``nbgrader_config.py`` that
``course assign --nbgrader DIR`` writes:

- ``StudentVersion`` (first): drops the ``solution-note`` cells, replaces the stored-outputs line,
  records the lesson in the notebook's metadata for ``course grade`` and opens with the banner
  ``course assign`` writes;
- ``CourseClearSolutions`` (in place of nbgrader's ``ClearSolutions``): each solution region
  becomes exactly the stub ``course assign`` writes.

Importing this module needs nbgrader (the ``grading`` extra); nothing else in the course does.
"""

from __future__ import annotations

from nbgrader.converters import GenerateAssignment
from nbgrader.preprocessors import ClearSolutions, NbGraderPreprocessor

from course_tools.editions import banner
from course_tools.exercises import assign


class StudentVersion(NbGraderPreprocessor):
    """What ``course assign`` changes besides the solution regions."""

    def preprocess(self, nb, resources):
        nb.cells = [c for c in nb.cells if assign.NOTE_TAG not in c.metadata.get("tags", [])]
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = assign.STORED_OUTPUTS.sub(assign.NO_OUTPUTS, cell.source)
        lesson = resources.get("nbgrader", {}).get("notebook")
        if lesson:
            grading = nb.metadata.get("course", {}).get("grading")
            nb.metadata["course"] = {"lesson": lesson, "kind": "exercise", **({"grading": grading} if grading else {})}
            banner.with_banner(nb, banner.text([f"solutions/{lesson}.ipynb"], "course assign", fill_in=True))
        return nb, resources


class CourseClearSolutions(ClearSolutions):
    """nbgrader's ClearSolutions with ``course assign``'s stubs: ``name = ...  # YOUR ANSWER HERE``
    for a region of top-level assignments, nbgrader's own stub for everything else."""

    def _replace_solution_region(self, cell, language: str) -> bool:
        if not any(line.strip() == assign.BEGIN for line in cell.source.split("\n")):
            return False
        cell.source = assign.strip_solution(cell.source, cell.cell_type, f"cell {cell.get('id', '?')}")
        return True


def generate_assignment_preprocessors() -> list[type]:
    """nbgrader's own list for ``generate_assignment`` with the two course preprocessors in."""
    default = list(GenerateAssignment.class_traits()["preprocessors"].default())
    if ClearSolutions not in default:
        raise RuntimeError("this nbgrader's generate_assignment has no ClearSolutions step to replace; "
                           "use nbgrader 0.9 (pip install -e '.[grading]')")
    return [StudentVersion, *(CourseClearSolutions if p is ClearSolutions else p for p in default)]

