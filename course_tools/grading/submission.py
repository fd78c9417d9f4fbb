"""Reading a submitted notebook without trusting it, and rebuilding it for grading.

A submission is only read for two things: the lesson it claims and the source of each answer
cell. Size, and how many values the JSON would build, are checked before it is parsed (16 MB of
empty lists in the metadata made the parse build five million objects and doubled the grader's peak
memory), the cell count after; every field is type-checked, and every problem becomes a
``SubmissionError`` whose message is the student's status line.
"""

from __future__ import annotations

import json
import os
import re
import stat
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_tools import messages
from course_tools.grading.text import clean

MAX_BYTES = 16 * 2**20
MAX_CELLS = 2000
MAX_JSON_VALUES = 200_000  # a lesson notebook with its outputs holds under 3,000; this bounds the parse to ~40 MB
JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
MAX_SOURCE = 200_000  # characters per answer cell
GRADER_CELL = "course_grade"  # metadata key on the cells the grader adds or times
# Naming the references in an answer cell is flagged even when the import is hidden at run time.
REFERENCE_NAMES = re.compile(r"course_tools\s*\.\s*references|course_utils\s*\.\s*exercises|\breferences\s*\.\s*lesson")


_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}  # characters a reader cannot see, or that have no glyph
NOT_UTF8 = messages.N_("file name is not UTF-8: its bytes are shown as \\xNN")


class SubmissionError(ValueError):
    """A file that cannot be graded as a submission; the message is the report line."""


@dataclass
class Parsed:
    """What the grader takes from a submission: the claimed lesson, answer sources by grade_id, and the
    language of its edition (only a known code; anything else is English)."""

    lesson: str | None
    answers: dict[str, list[str]] = field(default_factory=dict)
    lang: str = messages.SOURCE


def _undecodable(name: str) -> bool:
    """Whether ``name`` (from ``os.listdir``) holds bytes UTF-8 cannot decode (as U+DC80..U+DCFF)."""
    return any(0xDC80 <= ord(ch) <= 0xDCFF for ch in name)


def readable(name: str) -> str:
    """``name`` as ``os.listdir`` gives it, in one line that shows every character and loses none.
    A name that is not UTF-8 (a byte that does not decode is a lone surrogate U+DC80..U+DCFF) is shown
    as its bytes: printable ASCII stays, every other byte becomes ``\\xNN`` (no fragment of it is read
    as UTF-8, which would be a guess). In a UTF-8 name, a character a reader cannot see (control,
    format, separator, unassigned) becomes ``\\uNNNN`` (or ``\\UNNNNNNNN``). A backslash is doubled
    in both. Reversible (only a name that is not UTF-8 shows ``\\x``), so two different names never
    read the same because of what cannot be seen."""
    if _undecodable(name):
        raw = name.encode("utf-8", "surrogateescape")
        return "".join("\\\\" if b == 0x5C else chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in raw)
    out = []
    for ch in name:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in _HIDDEN:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def student_name(path: Path) -> tuple[str, str | None]:
    """The student's name for the gradebook and feedback: the file's stem, ``readable`` and
    NFC-normalised (macOS writes names decomposed, NFD; Linux keeps what the archive held), and a
    note when the name is not UTF-8 (an archive from Korean Windows holds CP949 names), with the
    name as CP949 reads it when it does; else None."""
    stem = path.stem
    name = unicodedata.normalize("NFC", readable(stem))
    if not _undecodable(stem):
        return name, None
    try:
        guess = unicodedata.normalize("NFC", stem.encode("utf-8", "surrogateescape").decode("cp949"))
    except UnicodeDecodeError:
        return name, NOT_UTF8
    if readable(guess) != guess:
        return name, NOT_UTF8
    return name, messages.N_("file name is not UTF-8: its bytes are shown as \\xNN; read as CP949 (Korean Windows) "
                             "it is {guess!r}", guess=guess)


def read_bytes(path: str, limit: int = MAX_BYTES) -> bytes:
    """A regular file's bytes, refusing links, pipes, devices and anything over ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise SubmissionError(f"unreadable file ({type(exc).__name__})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError("not a regular file")
        if info.st_size > limit:
            raise SubmissionError(f"file too large ({info.st_size} bytes; limit {limit})")
        return os.read(fd, limit + 1)
    finally:
        os.close(fd)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        source = "".join(source)
    if not isinstance(source, str):
        raise SubmissionError("a cell's source is neither text nor a list of lines")
    return source


def _answer_id(cell: object) -> str | None:
    """The grade_id of an answer cell (nbgrader ``solution`` metadata), else None; wrong types raise."""
    if not isinstance(cell, dict):
        raise SubmissionError("a cell is not a JSON object")
    meta = cell.get("metadata", {})
    nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
    if nbg is None or not isinstance(nbg, dict):
        return None  # plain cells, and nbgrader metadata that is not an object, are simply not answers
    grade_id = nbg.get("grade_id")
    if nbg.get("solution") is not True or not isinstance(grade_id, str) or not grade_id:
        return None
    return grade_id[:200]


def json_values(raw: bytes) -> int:
    """At most how many values (and keys) ``json.loads(raw)`` would build, counted without parsing:
    outside strings, every value but the first follows a comma or opens a container's first item."""
    outside = JSON_STRING.sub(b"", raw)
    return outside.count(b",") + outside.count(b"[") + outside.count(b"{") + 1


def parse(raw: bytes) -> Parsed:
    """The lesson and answer cells of a notebook file's bytes, or SubmissionError."""
    if not raw.strip():
        raise SubmissionError("empty file")
    values = json_values(raw)
    if values > MAX_JSON_VALUES:
        raise SubmissionError(f"too many JSON values ({values}; limit {MAX_JSON_VALUES}): "
                              "submit the notebook as the course gave it, without added metadata")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SubmissionError(f"not JSON ({type(exc).__name__}): not a notebook file") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list) or "nbformat" not in data:
        raise SubmissionError("JSON but not a Jupyter notebook (no cells/nbformat)")
    if len(data["cells"]) > MAX_CELLS:
        raise SubmissionError(f"too many cells ({len(data['cells'])}; limit {MAX_CELLS})")
    meta = data.get("metadata")
    course = meta.get("course") if isinstance(meta, dict) else None
    lesson = course.get("lesson") if isinstance(course, dict) else None
    edition = meta.get("course_edition") if isinstance(meta, dict) else None
    lang = messages.known(edition.get("lang") if isinstance(edition, dict) else None)
    parsed = Parsed(lesson if isinstance(lesson, str) else None, lang=lang)
    for cell in data["cells"]:
        grade_id = _answer_id(cell)
        if grade_id is not None:
            source = _source(cell)
            if len(source) > MAX_SOURCE:
                raise SubmissionError(f"answer cell {clean(grade_id, 60)!r} too long ({len(source)} characters)")
            parsed.answers.setdefault(grade_id, []).append(source)
    return parsed


def exercise_cells(nb: nbformat.NotebookNode) -> tuple[list[str], dict[str, float]]:
    """A pristine notebook's answer grade_ids, and each graded exercise's points by name."""
    answers: list[str] = []
    points: dict[str, float] = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        grade_id = meta.get("grade_id")
        if meta.get("solution") and grade_id:
            answers.append(grade_id)
        elif meta.get("grade") and grade_id and grade_id.endswith("_check"):
            points[grade_id[: -len("_check")]] = float(meta.get("points", 0))
    return answers, points


def answer_cells(nb: nbformat.NotebookNode) -> dict[str, list[str]]:
    """Each graded exercise's answer cells, by grade_id: its own (a cell whose grade_id is its name), else
    the answer cells written since the check cell before the last group of answers (lesson 11:
    ``my_generate`` answers ``capstone_sampling``; ``my_attention``, ``my_block`` and ``my_gpt`` answer the
    three checks after them). An error of these cells is the exercise's own error in the report."""
    cells = [cell.get("metadata", {}).get("nbgrader") or {} for cell in nb.cells]
    answers = {meta.get("grade_id") for meta in cells if meta.get("solution") and not meta.get("grade")}
    found: dict[str, list[str]] = {}
    group: list[str] = []
    checked = False  # whether a check cell came after the group: the next answer cell starts a new one
    for meta in cells:
        grade_id = meta.get("grade_id")
        if grade_id in answers:
            group, checked = ([], False) if checked else (group, checked)
            group.append(grade_id)
        elif meta.get("grade") and grade_id and grade_id.endswith("_check"):
            name = grade_id[: -len("_check")]
            found[name] = [name] if name in answers else list(group)
            checked = True
    return found


def identify_lesson(parsed: Parsed, pristine: dict[str, nbformat.NotebookNode]) -> str:
    """The lesson from the metadata ``course assign`` writes, else from the answer cells' ids."""
    if parsed.lesson in pristine:
        return parsed.lesson
    ids = set(parsed.answers)
    matches = [name for name, nb in pristine.items() if ids and ids <= set(exercise_cells(nb)[0])]
    if len(matches) == 1:
        return matches[0]
    named = f" {clean(parsed.lesson, 60)!r}" if parsed.lesson else ""
    raise SubmissionError(f"unknown lesson{named}: no exercise notebook matches its answer cells")


def names_references(parsed: Parsed) -> bool:
    """Whether any answer cell names the exercise references (flagged in the gradebook)."""
    return any(REFERENCE_NAMES.search(s) for sources in parsed.answers.values() for s in sources)


def rebuild(pristine: nbformat.NotebookNode, parsed: Parsed, setup: str) -> tuple[nbformat.NotebookNode,
                                                                                     dict[str, str], dict[str, int]]:
    """The pristine notebook with the learner's answer cells in, check cells out, ``setup`` first.
    Returns (notebook, problem per exercise, index of each exercise's answer cell). Answer cells
    are marked to run under the per-cell time limit."""
    problems: dict[str, str] = {}
    cells = [nbformat.v4.new_code_cell(setup)]
    answer_index: dict[str, int] = {}
    for cell in pristine.cells:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if meta.get("grade") and not meta.get("solution"):
            continue  # the check cells: the grader does the checking
        cell = nbformat.from_dict(dict(cell))
        grade_id = meta.get("grade_id")
        if meta.get("solution") and grade_id:
            found = parsed.answers.get(grade_id, [])
            if len(found) == 1:
                cell.source = found[0]
            elif not found:
                problems[grade_id] = messages.N_("missing answer cell")
            else:
                problems[grade_id] = messages.N_("{count} answer cells with grade_id {grade_id!r}", count=len(found),
                                                 grade_id=grade_id)
            cell.metadata = {**cell.metadata, GRADER_CELL: "timed"}
            answer_index[grade_id] = len(cells)
        cells.append(cell)
    return nbformat.v4.new_notebook(cells=cells, metadata=pristine.metadata), problems, answer_index
