"""What the grader writes: a row per submission, the terminal table, Markdown feedback, and the
gradebook (CSV and JSON) rewritten atomically after every submission, so that whatever happens
to the run, every student graded so far keeps their row."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_tools.grading.text import clean, csv_cell, file_stem


@dataclass
class ExerciseScore:
    name: str
    points: float
    max_points: float
    status: str  # pass | fail | not attempted | error: ... | timeout | missing answer cell
    lines: list[str] = field(default_factory=list)


@dataclass
class Submission:
    file: str
    student: str
    lesson: str = ""
    status: str = "graded"
    exercises: list[ExerciseScore] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    sandbox: str = ""
    seconds: float = 0.0

    @property
    def total(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)

    def record(self) -> dict:
        """The row as plain data, every text cleaned of control characters."""
        row = asdict(self) | {"total": self.total, "max": self.max_points}
        return json.loads(json.dumps(row), object_hook=_clean_strings)


def _clean_strings(obj: dict) -> dict:
    return {key: ([clean(v, 2000) for v in value] if isinstance(value, list) and all(isinstance(v, str) for v in value)
                  else clean(value, 2000) if isinstance(value, str) else value) for key, value in obj.items()}


def table(sub: Submission) -> str:
    lines = [f"{clean(sub.student, 80)} ({clean(sub.file, 200)}) lesson {clean(sub.lesson, 40) or '?'}: "
             f"{sub.total:g}/{sub.max_points:g} points, {clean(sub.status)}"]
    lines += [f"  flagged: {clean(flag)}" for flag in sub.flags]
    for e in sub.exercises:
        lines.append(f"  {clean(e.name, 28):<28} {e.points:>5g}/{e.max_points:<5g} {clean(e.status)}")
    return "\n".join(lines)


def feedback_markdown(sub: Submission) -> str:
    lines = [f"# Feedback: {clean(sub.student, 80)}", "", f"Lesson {clean(sub.lesson, 40) or 'unknown'} — "
             f"**{sub.total:g} / {sub.max_points:g} points** ({clean(sub.status)}).", ""]
    lines += [f"Flagged: {clean(flag)}" for flag in sub.flags] + ([""] if sub.flags else [])
    for e in sub.exercises:
        lines += [f"## {clean(e.name, 80)}: {e.points:g} / {e.max_points:g} ({clean(e.status)})", "", "```"]
        lines += [clean(line.strip(), 1000).replace("```", "'''") for line in e.lines] or ["(no cases)"]
        lines += ["```", ""]
    return "\n".join(lines)


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step: readers see the old file or the new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def gradebook_csv(subs: list[Submission]) -> str:
    names: list[str] = []
    for sub in subs:
        names += [e.name for e in sub.exercises if e.name not in names]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([csv_cell(c) for c in ["student", "file", "lesson", *names, "total", "max", "status", "flags",
                                           "sandbox"]])
    for sub in subs:
        points = {e.name: f"{e.points:g}" for e in sub.exercises}
        writer.writerow([csv_cell(c) for c in [sub.student, sub.file, sub.lesson, *(points.get(n, "") for n in names),
                                               f"{sub.total:g}", f"{sub.max_points:g}", sub.status,
                                               "; ".join(sub.flags), sub.sandbox]])
    return out.getvalue()


class Gradebook:
    """Collects rows; after each one, rewrites the CSV and JSON files and writes that student's feedback."""

    def __init__(self, csv_path: Path | None, json_path: Path | None, feedback: Path | None = None) -> None:
        self.csv_path, self.json_path, self.feedback = csv_path, json_path, feedback
        self.rows: list[Submission] = []
        self.feedback_names: set[str] = set()
        if feedback:
            feedback.mkdir(parents=True, exist_ok=True)

    def add(self, sub: Submission) -> None:
        self.rows.append(sub)
        rows = sorted(self.rows, key=lambda s: s.file)
        if self.csv_path:
            atomic_write(self.csv_path, gradebook_csv(rows))
        if self.json_path:
            atomic_write(self.json_path, json.dumps([s.record() for s in rows], indent=1, ensure_ascii=False))
        if self.feedback:
            atomic_write(self.feedback / f"{self._feedback_name(sub)}.feedback.md", feedback_markdown(sub))

    def _feedback_name(self, sub: Submission) -> str:
        """A file name from the student's name, unique in this run."""
        stem = file_stem(sub.student)
        name, n = stem, 1
        while name in self.feedback_names:
            n += 1
            name = f"{stem}-{n}"
        self.feedback_names.add(name)
        return name
