"""What the grader writes: a row per submission, the terminal table, feedback (Markdown, and the same as a
self-contained HTML page), and the gradebook (CSV and JSON) rewritten atomically after every submission,
so that whatever happens to the run, every student graded so far keeps their row."""

from __future__ import annotations

import csv
import html
import io
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from course_tools.grading.text import clean, code_block, csv_cell, file_name, markdown_text, redact
from course_tools.messages import N_, SOURCE, say

PENDING = N_("pending: graded by hand")  # the status of a manually graded answer (nbgrader's written answers)
FILE_MODE = 0o640  # the gradebook and feedback: the instructor writes, the instructor's group reads
DIR_MODE = 0o750


@dataclass
class ExerciseScore:
    name: str
    points: float
    max_points: float
    status: str  # pass | fail | not attempted | error: ... | timeout | missing answer cell | PENDING
    lines: list[str] = field(default_factory=list)
    answer: str = ""  # a manually graded answer's text, for the instructor who grades it

    @property
    def pending(self) -> bool:
        return self.status == PENDING


@dataclass
class Submission:
    file: str
    student: str
    lesson: str = ""
    status: str = "graded"
    exercises: list[ExerciseScore] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    alike: list[str] = field(default_factory=list)  # rows to read with this one (grading.alike): not in feedback
    sandbox: str = ""
    seconds: float = 0.0
    seed: int | None = None  # the cases' seed: `course grade FILE --seed SEED` draws the same cases again
    lang: str = SOURCE  # the language of the submission's edition: its feedback is written in it

    @property
    def total(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        """Every point of the lesson, the hand-graded ones included (nbgrader's maximum)."""
        return sum(e.max_points for e in self.exercises)

    @property
    def pending(self) -> float:
        return sum(e.max_points for e in self.exercises if e.pending)

    def record(self) -> dict:
        """The row as plain data, every text cleaned of control, format and separator characters."""
        row = asdict(self) | {"total": self.total, "max": self.max_points, "pending": self.pending}
        return json.loads(json.dumps(row), object_hook=_clean_strings)


def _clean_one(key: str, value: str) -> str:
    return clean(value, 5000, lines=True) if key == "answer" else clean(value, 2000)


def _clean_strings(obj: dict) -> dict:
    return {key: ([clean(v, 2000) for v in value] if isinstance(value, list) and all(isinstance(v, str) for v in value)
                  else _clean_one(key, value) if isinstance(value, str) else value) for key, value in obj.items()}


def _points(sub: Submission) -> str:
    pending = f", {sub.pending:g} pending hand grading" if sub.pending else ""
    return f"{sub.total:g}/{sub.max_points:g} points{pending}"


def table(sub: Submission) -> str:
    lines = [f"{clean(sub.student, 80)} ({clean(sub.file, 200)}) lesson {clean(sub.lesson, 40) or '?'}: "
             f"{_points(sub)}, {clean(sub.status)}" + (f" (seed {sub.seed})" if sub.seed is not None else "")]
    lines += [f"  flagged: {clean(flag)}" for flag in sub.flags]
    lines += [f"  alike: {clean(finding)}" for finding in sub.alike]
    for e in sub.exercises:
        lines.append(f"  {clean(e.name, 28):<28} {e.points:>5g}/{e.max_points:<5g} {clean(e.status)}")
    return "\n".join(lines)


def feedback_markdown(sub: Submission) -> str:
    """The student's report. Everything in it that the submission could influence (its file name,
    exception messages, answers) is escaped, so it renders as the text it is, and redacted, so it
    names nothing of the grading machine (folders, the account, the sandbox's command line)."""

    def text(value: object, limit: int = 500) -> str:
        return markdown_text(redact(clean(value, 4 * limit)), limit)

    def status(value: str) -> str:  # the status stays English in the gradebook; here it is translated
        return text(say(value, sub.lang))

    lang, lesson = sub.lang, text(sub.lesson, 40) or say(N_("unknown"), sub.lang)
    points = dict(lesson=lesson, total=f"{sub.total:g}", max=f"{sub.max_points:g}", status=status(sub.status))
    lines = [say(N_("# Feedback: {student}", student=text(sub.student, 80)), lang), "",
             say(N_("Lesson {lesson}: {total} of {max} points, {pending} more to be graded by hand ({status}).",
                    pending=format(sub.pending, "g"), **points), lang) if sub.pending else
             say(N_("Lesson {lesson}: {total} of {max} points ({status}).", **points), lang), ""]
    lines += [say(N_("Flagged: {flag}", flag=status(flag)), lang) for flag in sub.flags] + ([""] if sub.flags else [])
    for e in sub.exercises:
        got = say(N_("pending"), lang) if e.pending else f"{e.points:g}"
        lines += [f"## {text(e.name, 80)}: {got} / {e.max_points:g} ({status(e.status)})", ""]
        body = e.answer.splitlines() if e.pending else e.lines
        lines += code_block([redact(line.strip() if not e.pending else line) for line in body]) + [""]
    if sub.seed is not None:
        lines += [say(N_("Cases drawn with seed {seed}.", seed=sub.seed), lang), ""]
    return "\n".join(lines)


PAGE_STYLE = """body{font:16px/1.5 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
main{max-width:60rem;margin:0 auto;padding:1.5rem}h1{font-size:1.6rem;margin:.2rem 0 .6rem}
h2{font-size:1.1rem;margin:1.6rem 0 .4rem;overflow-wrap:anywhere}.status{font-weight:normal;color:#55607a}
pre{background:#fff;border:1px solid #d8dce4;border-radius:6px;padding:.7rem .9rem;white-space:pre-wrap;
overflow-wrap:anywhere;font:14px/1.45 ui-monospace,monospace;margin:0}.ok{color:#17703a}.bad{color:#b3261e}
.flag{color:#8a4b00}.seed{color:#55607a;margin-top:2rem}"""


def _page_line(line: str) -> str:
    """One line of a case report, escaped, coloured by its mark (✓ passed, ✗ failed)."""
    escaped = html.escape(line, quote=True)
    mark = line.lstrip()[:1]
    return f'<span class="ok">{escaped}</span>' if mark == "✓" else \
        f'<span class="bad">{escaped}</span>' if mark == "✗" else escaped


def feedback_html(sub: Submission) -> str:
    """The student's report as a self-contained HTML page (no script, nothing loaded: its policy forbids it),
    with what ``feedback_markdown`` says. Every text is cleaned, redacted and HTML-escaped once, so a name
    with ``<``, ``&`` or quotes reads as it is written, with no Markdown escape shown."""

    def text(value: object, limit: int = 500) -> str:
        return redact(clean(value, limit))

    def status(value: str) -> str:
        return text(say(value, sub.lang))

    def esc(value: str) -> str:
        return html.escape(value, quote=True)

    lang, lesson = sub.lang, text(sub.lesson, 40) or say(N_("unknown"), sub.lang)
    title = say(N_("# Feedback: {student}", student=text(sub.student, 80)), lang).removeprefix("# ")
    points = dict(lesson=lesson, total=f"{sub.total:g}", max=f"{sub.max_points:g}", status=status(sub.status))
    summary = say(N_("Lesson {lesson}: {total} of {max} points, {pending} more to be graded by hand ({status}).",
                     pending=format(sub.pending, "g"), **points), lang) if sub.pending else \
        say(N_("Lesson {lesson}: {total} of {max} points ({status}).", **points), lang)
    body = [f"<h1>{esc(title)}</h1>", f"<p>{esc(summary)}</p>"]
    body += [f'<p class="flag">{esc(say(N_("Flagged: {flag}", flag=status(flag)), lang))}</p>' for flag in sub.flags]
    for e in sub.exercises:
        got = say(N_("pending"), lang) if e.pending else f"{e.points:g}"
        lines = [clean(line, 5000, lines=True) for line in e.answer.splitlines()] if e.pending else \
            [clean(line.strip(), 1000) for line in e.lines]
        body += [f'<section><h2>{esc(text(e.name, 80))}: {esc(got)} / {e.max_points:g} '
                 f'<span class="status">({esc(status(e.status))})</span></h2>',
                 "<pre>" + "\n".join(_page_line(redact(line)) for line in lines or ["(no cases)"]) + "</pre></section>"]
    if sub.seed is not None:
        body.append(f'<p class="seed">{esc(say(N_("Cases drawn with seed {seed}.", seed=sub.seed), lang))}</p>')
    head = ['<meta charset="utf-8">', '<meta name="viewport" content="width=device-width, initial-scale=1">',
            """<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">""",
            f"<title>{esc(title)}</title>", f"<style>{PAGE_STYLE}</style>"]
    return "\n".join(["<!DOCTYPE html>", f'<html lang="{esc(lang)}">', "<head>", *head, "</head>", "<body><main>",
                      *body, "</main></body>", "</html>", ""])


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step: readers see the old file or the new, never half.
    The file is readable by the owner's group (``FILE_MODE``), not only by the owner."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
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
    writer.writerow([csv_cell(c) for c in ["student", "file", "lesson", *names, "total", "max", "pending", "status",
                                           "flags", "alike", "seed", "sandbox"]])
    for sub in subs:
        points = {e.name: "pending" if e.pending else f"{e.points:g}" for e in sub.exercises}
        writer.writerow([csv_cell(c) for c in [sub.student, sub.file, sub.lesson, *(points.get(n, "") for n in names),
                                               f"{sub.total:g}", f"{sub.max_points:g}", f"{sub.pending:g}",
                                               sub.status, "; ".join(sub.flags), "; ".join(sub.alike),
                                               "" if sub.seed is None else sub.seed, sub.sandbox]])
    return out.getvalue()


class Gradebook:
    """Collects rows; after each one, rewrites the CSV and JSON files and writes that student's feedback
    (``NAME.feedback.md`` and, to open in a browser, ``NAME.feedback.html``)."""

    def __init__(self, csv_path: Path | None, json_path: Path | None, feedback: Path | None = None) -> None:
        self.csv_path, self.json_path, self.feedback = csv_path, json_path, feedback
        self.rows: list[Submission] = []
        self.feedback_names: dict[str, str] = {}  # file stem -> the student it belongs to
        for folder in (csv_path.parent if csv_path else None, json_path.parent if json_path else None, feedback):
            if folder is not None:
                folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)

    def add(self, sub: Submission) -> None:
        self.rows.append(sub)
        rows = sorted(self.rows, key=lambda s: s.file)
        if self.csv_path:
            atomic_write(self.csv_path, gradebook_csv(rows))
        if self.json_path:
            atomic_write(self.json_path, json.dumps([s.record() for s in rows], indent=1, ensure_ascii=False))
        if self.feedback:
            stem = self._feedback_name(sub)
            atomic_write(self.feedback / f"{stem}.feedback.md", feedback_markdown(sub))
            atomic_write(self.feedback / f"{stem}.feedback.html", feedback_html(sub))

    def _feedback_name(self, sub: Submission) -> str:
        """The file stem of a student's feedback: an encoding of the name that no other name has
        (``text.file_name``), so no submission can take another's file, whatever order they finish
        in. The same name graded twice in one run (two files from different folders) gets ``~2``,
        which no encoded name contains."""
        stem = file_name(sub.student)
        name, n = stem, 1
        while self.feedback_names.get(name, sub.file) != sub.file:
            n += 1
            name = f"{stem}~{n}"
        self.feedback_names[name] = sub.file
        return name
