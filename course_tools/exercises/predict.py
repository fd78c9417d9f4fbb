"""Predict, then run: compare a learner's written prediction with what a cell measured.

Not graded. The lesson stores its notebook with the prediction left at ``...``; ``reveal`` then
prints the measurement and the reason, so the stored output is the same in every run mode as long
as the measurement printed is (otherwise the cell starts with ``# NBVAL_IGNORE_OUTPUT``).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from course_tools.messages import SOURCE, _, say, speaking


def _plain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.item() if x.numel() == 1 else tuple(x.tolist())
    if isinstance(x, (torch.Size, list)):
        return tuple(x)
    return x


def _matches(prediction: Any, measured: Any, tolerance: float) -> bool:
    if isinstance(measured, (int, float)) and not isinstance(measured, bool):
        return isinstance(prediction, (int, float)) and math.isclose(prediction, measured, abs_tol=tolerance)
    return prediction == measured


def judge(prediction: Any, measured: Any, tolerance: float = 0.0) -> bool:
    """Whether a written prediction matches the measurement (False if none was written)."""
    prediction, measured = _plain(prediction), _plain(measured)
    return prediction not in (Ellipsis, None) and _matches(prediction, measured, tolerance)


def reveal(prediction: Any, measured: Any, why: str, tolerance: float = 0.0) -> None:
    """Print the prediction against the measurement (numbers within ``tolerance`` count as right)
    and one sentence on why. Returns nothing, so the cell shows only the printed lines.

    The first line never holds the measurement: JupyterLab shows the first line of a collapsed
    output (see :func:`hide_reveals`), so the answer stays out of sight until the learner opens it.
    The lines are in the learner's language (``course_tools.messages``), ``why`` included."""
    prediction, measured = _plain(prediction), _plain(measured)
    if prediction is Ellipsis or prediction is None:
        print("\n".join(unanswered(repr(measured), why)))
        return
    right = _matches(prediction, measured, tolerance)
    print(_("your prediction: {prediction}", prediction=repr(prediction)))
    if right and tolerance:
        print(_("measured: {measured}: right (within {tolerance:g})", measured=repr(measured), tolerance=tolerance))
    elif right:
        print(_("measured: {measured}: right", measured=repr(measured)))
    else:
        print(_("measured: {measured}: not what happened", measured=repr(measured)))
    print(_("why: {why}", why=say(why)))


def unanswered(measured: str, why: str) -> list[str]:
    """The lines of a reveal whose prediction was left at ``...``, in the current language
    (``measured``: the measurement's repr)."""
    return [_("your prediction: none yet (write it in the cell above, then run this cell again)"),
            _("measured: {measured}", measured=measured), _("why: {why}", why=say(why))]


def stored_reveal(text: str, why: str) -> str | None:
    """A cell's stored output that ends with a reveal's lines (what ``reveal`` printed in English for a
    prediction left at ``...``, the way lessons are stored), those lines printed again in the current
    language; None when ``text`` does not end with them. The measurement is the one value they hold:
    what stands where ``unanswered`` puts it in the English lines."""
    with speaking(SOURCE):
        english = unanswered("\0", why)
    before, _mark, after = english[1].partition("\0")
    lines = text.rstrip("\n").split("\n")
    head, tail = lines[:-3], lines[-3:]
    if len(tail) != 3 or tail[0] != english[0] or tail[2] != english[2] or \
            not (tail[1].startswith(before) and tail[1].endswith(after)):
        return None
    measured = tail[1][len(before):len(tail[1]) - len(after)]
    return "\n".join(head + unanswered(measured, why)) + "\n"


PREDICTION = re.compile(r"^prediction_\w+ = \.\.\.", re.M)
REVEAL_MARKS = "hide-output"  # MyST-NB's tag: the website shows the outputs behind a toggle
CODE_MARKS = "hide-input"  # the reveal's own code holds the reason, and with it often the answer
BEHIND_A_CLICK = ("fragment", "subslide", "slide", "skip")  # slide types that show nothing before a click


def reveal_span(cells: list) -> list[int]:
    """The indices of the code cells that would spoil a prediction: every code cell after a
    ``prediction_... = ...`` cell up to and including the cell that calls ``reveal(``."""
    span, open_ = [], False
    for i, cell in enumerate(cells):
        if cell.cell_type != "code":
            continue
        if PREDICTION.search(cell.source):
            open_ = True
        elif open_:
            span.append(i)
            open_ = "reveal(" not in cell.source
    return span


def is_hidden(cell) -> bool:
    """Whether a cell's stored outputs stay out of sight until the learner acts: collapsed in
    JupyterLab, behind a toggle on the website, a fragment (or a later slide, or no slide) in the slides.
    A cell that calls ``reveal(`` hides its code too (its ``why=`` states the answer)."""
    slide = cell.metadata.get("slideshow", {}).get("slide_type")
    jupyter, tags = cell.metadata.get("jupyter", {}), cell.metadata.get("tags", [])
    code_hidden = "reveal(" not in cell.source or (jupyter.get("source_hidden") is True and CODE_MARKS in tags)
    return (jupyter.get("outputs_hidden") is True and REVEAL_MARKS in tags and slide in BEHIND_A_CLICK
            and code_hidden)


def hide_reveals(nb) -> int:
    """Mark every cell of :func:`reveal_span` hidden (see :func:`is_hidden`); returns how many
    cells changed. ``course assign`` need not do this: it clears the outputs of exercises anyway."""
    changed = 0
    for i in reveal_span(nb.cells):
        cell = nb.cells[i]
        if is_hidden(cell):
            continue
        cell.metadata.setdefault("jupyter", {})["outputs_hidden"] = True
        tags = cell.metadata.setdefault("tags", [])
        for tag in (REVEAL_MARKS, CODE_MARKS) if "reveal(" in cell.source else (REVEAL_MARKS,):
            if tag not in tags:
                tags.append(tag)
        if "reveal(" in cell.source:
            cell.metadata["jupyter"]["source_hidden"] = True
        slide = cell.metadata.setdefault("slideshow", {})
        if slide.get("slide_type") not in BEHIND_A_CLICK:
            slide["slide_type"] = "fragment"
        changed += 1
    return changed


if __name__ == "__main__":  # python -m course_tools.exercises.predict notebooks/NN_topic.ipynb ...
    import sys

    import nbformat

    for path in sys.argv[1:]:
        book = nbformat.read(path, as_version=4)
        if hide_reveals(book):
            nbformat.write(book, path)
