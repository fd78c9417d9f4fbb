"""Readable reports (issue 48, item 7): an answer cell's own error (a SyntaxError or an error raised when the
cell ran, with its line) is reported for the exercise it answers, also where the answer cell and the exercise
have different names (lesson 11: ``my_generate`` answers ``capstone_sampling``); and the feedback is also a
self-contained HTML page, escaped once, that a browser shows as the text it holds, in English and in Korean.

The grading runs use a stand-in for the sandbox (``RaisingCell``) that answers like a kernel in which one
answer cell raised a SyntaxError; the real sandbox reports the same ``RunReport`` (tests/test_grade.py).
"""

from __future__ import annotations

import copy
import json
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from browser import chromium

from course_tools.cli import main
from course_tools.grading import grade, results, worker
from course_tools.grading.job import RunReport
from course_tools.grading.report import ExerciseScore, Submission, feedback_html
from course_tools.grading.sandbox import RunResult
from course_tools.notebook_exec import execute, make_client

ROOT = Path(__file__).resolve().parent.parent
SYNTAX = "SyntaxError: invalid syntax (<IPY-INPUT>, line 6)"  # as the worker reads it from the kernel
NAME_ERROR = "NameError: name 'generate' is not defined"
HOSTILE_NAME = "Kim <b>&amp; \"O'Neil\" capstone_sampling"  # no "/": a file name


class RaisingCell:
    """The sandbox's public surface: the answer cell ``cell`` raised a SyntaxError, and every case of every
    exercise raised ``NAME_ERROR`` (the function the broken cell was to define is missing)."""

    def __init__(self, cell: str) -> None:
        self.cell = cell

    def check(self) -> None:
        pass

    def describe(self) -> str:
        return "stand-in sandbox"

    def host_paths(self) -> list[tuple[str, str]]:
        return []

    def kernel_jobdir(self, jobdir: Path) -> str:
        return str(jobdir)

    def run(self, jobdir: Path, limits, wall_seconds: float, lesson: str | None = None,
            pristine_sources: list[str] | None = None) -> RunResult:
        nb = nbformat.read(jobdir / "submission.ipynb", as_version=4)
        index = next(i for i, c in enumerate(nb.cells)
                     if c.metadata.get("nbgrader", {}).get("grade_id") == self.cell)
        files = {path.name: results.encode({"kind": "cases", "results": [{"status": "error", "message": NAME_ERROR}]
                                            * len(results.decode(path.read_bytes(), results.UNCAPPED))})
                 for path in (jobdir / "inputs").iterdir()}
        return RunResult(files, RunReport("finished", {str(index): SYNTAX}), killed=False)


def graded(monkeypatch, tmp_path, lesson: str, cell: str, lang: str | None = None) -> tuple[dict, Path]:
    """Grade lesson ``lesson``'s exercise notebook with the stand-in; the row and the feedback folder."""
    monkeypatch.setattr(grade, "make_sandbox", lambda args: RaisingCell(cell))
    nb = copy.deepcopy(nbformat.read(ROOT / "exercises" / f"{lesson}.ipynb", as_version=4))
    if lang:
        nb.metadata["course_edition"] = {"lang": lang}
    folder = tmp_path / "subs"
    folder.mkdir()
    nbformat.write(nb, folder / f"{HOSTILE_NAME}.ipynb")
    assert main(["grade", str(folder), "--out", str(tmp_path / "out")]) == 0
    [row] = json.loads((tmp_path / "out" / "results.json").read_text())
    return row, tmp_path / "out" / "feedback"


def exercise(row: dict, name: str) -> dict:
    return next(e for e in row["exercises"] if e["name"] == name)


def test_a_syntax_error_in_my_generate_is_reported_for_capstone_sampling(monkeypatch, tmp_path):
    row, _ = graded(monkeypatch, tmp_path, "11_build_your_gpt", "my_generate")
    sampling = exercise(row, "capstone_sampling")
    assert sampling["status"] == "error: SyntaxError: invalid syntax (line 6) in the answer cell my_generate"
    assert sampling["lines"][0] == "  ✗ the answer cell my_generate raised SyntaxError: invalid syntax (line 6)"
    # after it, what followed: here every stage's cases raised, so the stage sampling needs is named next
    assert "capstone_shapes" in sampling["lines"][1]
    assert "SyntaxError" not in exercise(row, "capstone_training")["status"]  # another answer cell's exercise


def test_an_exercises_own_answer_cell_names_its_line(monkeypatch, tmp_path):
    row, _ = graded(monkeypatch, tmp_path, "00_setup", "pairwise_dots")
    dots = exercise(row, "pairwise_dots")
    assert dots["status"] == "error: SyntaxError: invalid syntax (line 6)"
    assert dots["lines"][0] == "  ✗ the answer cell pairwise_dots raised SyntaxError: invalid syntax (line 6)"
    assert exercise(row, "flatten_tokens")["status"] == f"error: {NAME_ERROR}"


RUNTIME_ANSWER = ("def pairwise_dots(a, b):\n    return a @ b.T\n\n"
                  "scale = helper_from_nowhere(2)\n")  # raises NameError at line 4, after defining the function


def test_a_cell_that_raises_at_run_time_names_its_line(tmp_path):
    """The worker reads the line of the answer cell from the kernel's traceback: its first frame is the cell
    itself, even when the error comes from a function defined in an earlier cell."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def half(x):\n    return 1 / x\n"),
        nbformat.v4.new_code_cell("a = 1\n\ndef g():\n    return half(0)\n\nb = g()\n"),
        nbformat.v4.new_code_cell(RUNTIME_ANSWER),
        nbformat.v4.new_code_cell("1 +* 2\n"),
    ])
    execute(make_client(nb, tmp_path, cell_timeout=60, allow_errors=True))
    assert worker.cell_errors(nb) == {"1": "ZeroDivisionError: division by zero (line 6)",
                                      "2": "NameError: name 'helper_from_nowhere' is not defined (line 4)",
                                      "3": "SyntaxError: invalid syntax (<IPY-INPUT>, line 1)"}


def test_the_line_survives_a_long_message():
    long = {"output_type": "error", "ename": "ValueError", "evalue": "x" * 5000,
            "traceback": ["\x1b[31m---\x1b[39m", "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[3]\x1b[39m"
                          "\x1b[32m, line 12\x1b[39m\n\x1b[32m---> \x1b[39m\x1b[32m12\x1b[39m f()\n",
                          "File /x/y.py:3, in f()\n", "ValueError: xxx"]}
    text = worker.error_text(long)
    assert text.endswith(" (line 12)") and len(text) < 300  # grade.answer_cell_error keeps 300 characters


@pytest.mark.slow
def test_a_run_time_error_in_an_answer_cell_is_graded_with_its_line(tmp_path):
    """End to end, in the real sandbox: the function the cell defined before raising is still checked
    (its cases pass), the exercise's status is the cell's error with its line, first in its feedback."""
    nb = copy.deepcopy(nbformat.read(ROOT / "exercises" / "00_setup.ipynb", as_version=4))
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "pairwise_dots")
    cell.source = RUNTIME_ANSWER
    folder = tmp_path / "subs"
    folder.mkdir()
    nbformat.write(nb, folder / "student.ipynb")
    assert main(["grade", str(folder), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    [row] = json.loads((tmp_path / "out" / "results.json").read_text())
    dots = exercise(row, "pairwise_dots")
    error = "NameError: name 'helper_from_nowhere' is not defined (line 4)"
    assert dots["status"] == f"error: {error}" and dots["points"] == 0
    assert dots["lines"][0] == f"  ✗ the answer cell pairwise_dots raised {error}"


class Text(HTMLParser):
    """The text a browser shows of a page (outside <head>), and the tags of its body."""

    def __init__(self) -> None:
        super().__init__()
        self.text, self.tags, self.head = [], [], False

    def handle_starttag(self, tag, attrs):
        self.head = self.head or tag == "head"
        if not self.head:
            self.tags.append(tag)

    def handle_endtag(self, tag):
        self.head = self.head and tag != "head"

    def handle_data(self, data):
        if not self.head:
            self.text.append(data)


def shown(page: str) -> tuple[str, set[str]]:
    parser = Text()
    parser.feed(page)
    return "".join(parser.text), set(parser.tags)


def test_the_html_page_shows_names_and_errors_as_written(monkeypatch, tmp_path):
    row, feedback = graded(monkeypatch, tmp_path, "11_build_your_gpt", "my_generate")
    [page] = feedback.glob("*.feedback.html")
    assert list(feedback.glob("*.feedback.md")) == [page.with_suffix(".md")]  # beside the Markdown
    text, tags = shown(page.read_text(encoding="utf-8"))
    assert f"Feedback: {HOSTILE_NAME}" in text
    assert "capstone_sampling: 0 / 2 (error: SyntaxError: invalid syntax (line 6) in the answer cell my_generate)" \
        in text
    assert "name 'generate' is not defined" in text
    for escape in ("\\_", "&#x27;", "&amp;amp;", "&lt;", "\\("):
        assert escape not in text, escape
    assert tags <= {"html", "body", "main", "h1", "h2", "p", "section", "pre", "span"}, tags  # no <b> from the name


def test_the_html_page_of_a_korean_submission_is_korean(monkeypatch, tmp_path):
    row, feedback = graded(monkeypatch, tmp_path, "11_build_your_gpt", "my_generate", lang="ko")
    [page] = feedback.glob("*.feedback.html")
    source = page.read_text(encoding="utf-8")
    text, _ = shown(source)
    assert '<html lang="ko">' in source and "피드백" in text and "답안 셀 my_generate" in text, text[:600]


def test_the_page_loads_nothing_and_runs_nothing():
    sub = Submission(file="x.ipynb", student="<script>alert(1)</script><img src=x onerror=alert(2)>",
                     lesson="00_setup", exercises=[ExerciseScore("flatten_tokens", 0, 1, "fail",
                                                                 ["  ✗ <iframe src=//evil>: expected shape"])])
    page = feedback_html(sub)
    assert "default-src 'none'" in page
    _, tags = shown(page)
    assert not tags & {"script", "img", "iframe", "a", "link"}


@pytest.mark.parametrize("lang", [None, "ko"])
def test_a_browser_shows_the_page_as_its_text(monkeypatch, tmp_path, lang):
    """Opened in Chromium from its file: no request leaves the page, no error, and the visible text is
    the name and the error as written (no Markdown or HTML escape)."""
    from playwright.sync_api import sync_playwright

    _, feedback = graded(monkeypatch, tmp_path, "11_build_your_gpt", "my_generate", lang=lang)
    [page_file] = feedback.glob("*.feedback.html")
    requests, errors = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium("the feedback page check"), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1000, "height": 800})
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(page_file.as_uri(), wait_until="load")
        text = page.inner_text("body")
        browser.close()
    assert requests == [page_file.as_uri()] and errors == []
    assert HOSTILE_NAME in text and "capstone_sampling" in text and "'generate'" in text
    assert "\\_" not in text and "&#x27;" not in text
    if lang == "ko":
        assert "피드백" in text
