"""What a hostile submission can do to the grader's reports, and to the scoring, short of running:
each attack class of issue 27 that lands on the report side, written for these tests.

Most tests hand the grader a stand-in for the sandbox (``Hostile``) that answers like a kernel under
the submission's control: it sends back whatever records, exception texts and file contents the
attack wants, through the same results contract. So they need no bubblewrap and take seconds; the
real sandbox's side is tested in ``test_grade.py`` and ``test_grade_attacks.py``.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import stat
import sys
from pathlib import Path

import markdown_it
import nbformat
import pytest
import torch
from test_grade import EXERCISE, LESSON, SOLUTION

from course_tools.cli import main
from course_tools.exercises import checks
from course_tools.grading import channel, grade, report, results
from course_tools.grading.job import RunReport
from course_tools.grading.report import ExerciseScore, Gradebook, Submission, feedback_markdown, gradebook_csv
from course_tools.grading.sandbox import RunResult
from course_tools.grading.text import clean, file_name, redact

ROOT = Path(__file__).resolve().parent.parent
LESSON01 = nbformat.read(ROOT / "solutions" / "01_word_embeddings.ipynb", as_version=4)
LESSON01.metadata["course"] = {"lesson": "01_word_embeddings", "kind": "exercise"}  # as course assign writes it
FORMAT_AND_SEPARATORS = "\u2028\u2029\u200b\u200d\u200e\u202e\u2066\u2069\ufeff\U000e0041\U000e007f\u00ad"


def render(markdown: str) -> str:
    """The HTML a Markdown viewer makes of a feedback file (CommonMark with raw HTML on, plus tables
    and strike-through, as on GitHub)."""
    return markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown)


# --- a stand-in sandbox whose "kernel" sends back what the attack chooses -----------------------


def results_file(records: list[dict]) -> bytes:
    return results.encode({"kind": "cases", "results": records})


class Hostile:
    """Sandbox's public surface (check, describe, host_paths, kernel_jobdir, run), answering every
    exercise with ``message`` raised, and recording the limits each run was given."""

    def __init__(self, message: str = "no") -> None:
        self.message, self.runs = message, []

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
        self.runs.append({"cell": limits.cell_timeout, "notebook": limits.notebook_timeout, "wall": wall_seconds})
        files = {path.name: results_file([{"status": "error", "message": self.message}]
                                         * len(results.decode(path.read_bytes(), results.UNCAPPED)))
                 for path in (jobdir / "inputs").iterdir()}
        return RunResult(files, RunReport("finished"), killed=False)


@pytest.fixture
def hostile(monkeypatch):
    """``course grade`` with the stand-in sandbox; returns it."""
    sandbox = Hostile()
    monkeypatch.setattr(grade, "make_sandbox", lambda args: sandbox)
    return sandbox


def grade_folder(tmp_path, notebooks: dict[str, nbformat.NotebookNode | bytes], *options) -> dict:
    folder = tmp_path / "subs"
    folder.mkdir(parents=True)
    for name, nb in notebooks.items():
        if isinstance(nb, bytes):
            (folder / f"{name}.ipynb").write_bytes(nb)
        else:
            nbformat.write(nb, folder / f"{name}.ipynb")
    assert main(["grade", str(folder), "--out", str(tmp_path / "out"), *options]) == 0
    return {r["student"]: r for r in json.loads((tmp_path / "out" / "results.json").read_text())}


# --- feedback injection -------------------------------------------------------------------------

INJECTION = ("<img src=x onerror=alert(1)> ![pixel](https://tracker.example/p.png) **9/9 pass** "
             "<script>steal()</script> [click](javascript:alert(1)) | a | b | ~~gone~~ $\\color{green}{pass}$")


def test_student_text_renders_as_text_in_feedback(hostile, tmp_path):
    hostile.message = "RuntimeError: " + INJECTION + " ``` </pre> ````"
    name = "<img src=y onerror=alert(2)>**pass**"
    grade_folder(tmp_path, {name: EXERCISE})
    [path] = (tmp_path / "out" / "feedback").glob("*.feedback.md")
    html = render(path.read_text())
    for forbidden in ("<img", "<script", "<strong>", "<a ", "<table", "<del", "<pre><code>\n</code></pre>"):
        assert forbidden not in html, forbidden
    assert "onerror=alert(1)" in html and "**9/9 pass**" in html  # still there, as text


def test_code_blocks_cannot_be_closed_by_the_lines_they_hold():
    sub = Submission("f", "s", exercises=[ExerciseScore("e", 0, 1, "fail", ["x", "```", "<img src=z onerror=1>"])])
    html = render(feedback_markdown(sub))
    assert "<img" not in html and html.count("<pre>") == 1


# --- feedback file names ------------------------------------------------------------------------

def test_no_name_takes_another_students_feedback_file(tmp_path):
    book = Gradebook(None, None, tmp_path / "feedback")
    impostor = Submission("subs/kim lee.ipynb", "kim lee", status="not JSON")
    genuine = Submission("subs/kim_lee.ipynb", "kim_lee", exercises=[ExerciseScore("e", 9, 9, "pass")])
    book.add(impostor)  # finishes first
    book.add(genuine)
    assert "9 of 9 points" in (tmp_path / "feedback" / "kim_lee.feedback.md").read_text()
    assert "not JSON" in (tmp_path / "feedback" / "kim%20lee.feedback.md").read_text()


@pytest.mark.parametrize("names", [
    ["kim lee", "kim_lee", "kim%20lee", "kim-2", "kim~2", "kim"],
    [".hidden", "%2Ehidden", "..", "a/b", "a%2Fb", "", "%00"],
    ["김민수", "김민수 ", "e\u0301", "\u00e9", "x" * 300, "x" * 299 + "y"],
    ["Kim", "kim", "KIM", "kIm", "\u00c9", "\u00e9", "X" * 300, "x" * 300, "Kim^1", "ǅ"],
])
def test_file_names_are_one_to_one_and_safe(names):
    stems = [file_name(n) for n in names]
    assert len({stem.casefold() for stem in stems}) == len(names), stems  # distinct even ignoring case
    for stem in stems:
        assert stem and "/" not in stem and not stem.startswith(".") and len(stem.encode()) <= 100
    assert file_name("김민수") == "김민수" and file_name("kim_lee") == "kim_lee"


# --- format and separator characters ------------------------------------------------------------

def test_format_and_separator_characters_reach_no_report(tmp_path):
    forged = f"zz{FORMAT_AND_SEPARATORS}forged,9,9,graded"
    sub = Submission(f"subs/{forged}.ipynb", forged, status="fail" + FORMAT_AND_SEPARATORS + "\ud800",
                     exercises=[ExerciseScore("e", 0, 9, "error: " + FORMAT_AND_SEPARATORS, ["  ✗ " + forged])])
    text = gradebook_csv([sub]) + json.dumps(sub.record(), ensure_ascii=False) + feedback_markdown(sub)
    assert not any(ch in text for ch in FORMAT_AND_SEPARATORS + "\ud800")
    assert len(gradebook_csv([sub]).splitlines()) == 2  # a header and one row, however the file is split
    Gradebook(tmp_path / "book.csv", tmp_path / "r.json", tmp_path / "fb").add(sub)  # writes as UTF-8
    assert clean("tab\tand\nnew line", lines=True) == "tab\tand\nnew line"


# --- host paths, account names and sandbox command lines ----------------------------------------

def test_feedback_names_nothing_of_the_grading_machine(hostile, tmp_path):
    import getpass

    hostile.message = (f"OSError: {ROOT / 'course_utils' / '__init__.py'} {sys.executable} "
                       f"{os.path.join(os.path.expanduser('~'), '.ssh', 'id_rsa')} /tmp/course-grade-job-x1/out "
                       f"bwrap failed: /usr/bin/bwrap --unshare-all --ro-bind {sys.prefix} {sys.prefix} --seccomp 9")
    grade_folder(tmp_path, {"s": EXERCISE})
    text = (tmp_path / "out" / "feedback" / "s.feedback.md").read_text()
    for secret in (str(ROOT), sys.prefix, os.path.expanduser("~"), "--unshare-all", "--ro-bind", "/tmp/course-grade"):
        assert secret not in text, secret
    assert "<course>/course\\_utils/\\_\\_init\\_\\_.py" in text or "&lt;course&gt;/course\\_utils" in text
    user = getpass.getuser()
    if user != "root":
        assert user not in text
    assert redact("a square root") == "a square root"


# --- scoring ------------------------------------------------------------------------------------

def test_counts_are_compared_as_integers():
    ex = checks.get("gpt_param_count")
    for case in checks.draw("gpt_param_count", 0):
        V, max_len, d, L = case.args
        right = ex.reference(*case.args)
        assert checks.judge(ex, case, float(right), right).status == checks.PASS
        assert checks.judge(ex, case, float(right - 2 * d), right).status == checks.FAIL  # final LayerNorm forgotten
        assert checks.judge(ex, case, torch.tensor(float(right - 2 * d), dtype=torch.float64), right).status \
            == checks.FAIL
    assert checks.compare(64.0, 64, 0.5, 1e-4)[0] and not checks.compare(64.3, 64, 0.5, 1e-4)[0]
    assert checks.compare(10**400, 10**400, 0, 0)[0]


def _raw_sum_analogy(E, a, b, c):
    """The common lesson-01 mistake: b - a + c of the raw vectors, scored by cosine."""
    scores = torch.nn.functional.normalize(E, dim=1) @ (E[b] - E[a] + E[c])
    scores[[a, b, c]] = -float("inf")
    return scores.argmax()


def _dot_analogy(E, a, b, c):
    """The other: dot products with the right target instead of cosines."""
    unit = torch.nn.functional.normalize(E, dim=1)
    scores = E @ (unit[b] - unit[a] + unit[c])
    scores[[a, b, c]] = -float("inf")
    return scores.argmax()


# seeds whose five random cases all let the raw-sum mistake through before the cases were fixed
ONCE_LUCKY = [33, 58, 79, 124, 210, 220, 231, 283, 316, 324, 351, 366]


@pytest.mark.parametrize("mistake", [_raw_sum_analogy, _dot_analogy])
def test_the_common_analogy_mistakes_fail_on_every_draw(mistake):
    ex = checks.get("analogy_3cosadd")
    for seed in ONCE_LUCKY + list(range(20)):
        outcomes = [checks.judge(ex, c, mistake(*c.args), ex.reference(*c.args))
                    for c in checks.draw("analogy_3cosadd", seed)]
        assert checks.result_status(outcomes) == checks.FAIL, seed


# --- the lesson a submission claims ---------------------------------------------------------------

def test_a_submission_of_another_lesson_is_flagged_and_graded_as_the_class(hostile, tmp_path, capsys):
    rows = grade_folder(tmp_path, {"other": LESSON01, "mine": SOLUTION}, "--lesson", "00")
    max_points = rows["mine"]["max"]
    assert rows["other"]["lesson"] == LESSON and rows["other"]["max"] == max_points  # not lesson 01's 16
    assert any("claims lesson '01_word_embeddings'" in flag for flag in rows["other"]["flags"])
    assert rows["mine"]["flags"] == []
    capsys.readouterr()
    grade_folder(tmp_path / "again", {"other": LESSON01, "mine": SOLUTION})
    assert "WARNING: submissions of 2 lessons" in capsys.readouterr().out
    assert main(["grade", str(tmp_path / "subs"), "--lesson", "42", "--out", str(tmp_path / "x")]) == 2


def test_claims_in_metadata_that_contradict_the_answer_cells_are_flagged(hostile, tmp_path):
    relabelled = copy.deepcopy(LESSON01)
    relabelled.metadata["course"] = {"lesson": LESSON, "kind": "exercise"}
    rows = grade_folder(tmp_path, {"relabelled": relabelled}, "--lesson", LESSON)
    assert any("none of its answer cells belongs" in flag for flag in rows["relabelled"]["flags"])


# --- seeds -----------------------------------------------------------------------------------------

def test_every_row_records_the_seed_that_regrades_it(hostile, tmp_path):
    rows = grade_folder(tmp_path, {"a": EXERCISE, "b": EXERCISE})
    seeds = {rows[n]["seed"] for n in "ab"}
    assert all(isinstance(s, int) for s in seeds) and len(seeds) == 2  # fresh per submission
    with open(tmp_path / "out" / "gradebook.csv", newline="") as f:
        assert {int(r["seed"]) for r in csv.DictReader(f)} == seeds
    seed = rows["a"]["seed"]
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    parsed = grade.submission.parse(json.dumps(EXERCISE).encode())
    job = grade.prepare(EXERCISE, parsed, job_dir, str(job_dir), seed)
    for name, cases in job.cases.items():  # the re-grade's inputs are the graded ones
        again = checks.draw(name, seed)
        assert [c.label for c in cases] == [c.label for c in again]
        assert all(torch.equal(x, y) for c, d in zip(cases, again, strict=True)
                   for x, y in zip(c.args, d.args, strict=True) if isinstance(x, torch.Tensor))
    regraded = grade_folder(tmp_path / "re", {"a": EXERCISE}, "--seed", str(seed))
    assert regraded["a"]["seed"] == seed


# --- time budgets ----------------------------------------------------------------------------------

def test_a_class_budget_caps_every_submission(hostile, tmp_path, capsys):
    grade_folder(tmp_path, {f"s{i}": EXERCISE for i in range(20)}, "--class-budget", "10", "--jobs", "2")
    share = 10 * 60 * 2 / 20
    assert "at most 60 s per submission" in capsys.readouterr().out
    assert all(r["notebook"] <= share and r["cell"] <= share and r["wall"] <= share + grade.WALL_GRACE
               for r in hostile.runs) and len(hostile.runs) == 20
    # the worst a class can take: 20 submissions, 2 at a time, each within its share and the grace
    assert 20 / 2 * (share + grade.WALL_GRACE) <= 10 * 60 * 1.25


def test_a_lesson_may_set_its_own_limits_and_the_instructor_overrides_them(hostile, tmp_path):
    slow = copy.deepcopy(EXERCISE)  # the lesson's exercise notebook, as course assign writes it
    slow.metadata["course"]["grading"] = {"cell_timeout": 240, "notebook_timeout": 900}
    (tmp_path / "exercises").mkdir()
    nbformat.write(slow, tmp_path / "exercises" / f"{LESSON}.ipynb")
    pristine = ["--exercises", str(tmp_path / "exercises")]
    grade_folder(tmp_path, {"s": EXERCISE}, *pristine)
    grade_folder(tmp_path / "told", {"s": EXERCISE}, "--cell-timeout", "30", *pristine)
    grade_folder(tmp_path / "budget", {"s": EXERCISE}, "--class-budget", "5", *pristine)  # 300 s for one
    assert [(r["cell"], r["notebook"]) for r in hostile.runs] == [(240, 900), (30, 900), (240, 300)]


# --- where the gradebook goes ----------------------------------------------------------------------

def test_gradebook_goes_to_out_readable_by_the_group(hostile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grade_folder(tmp_path, {"s": EXERCISE})
    out = tmp_path / "out"
    files = [out / "gradebook.csv", out / "results.json", *(out / "feedback").iterdir()]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o040 for p in files)  # group-readable
    assert not any(stat.S_IMODE(p.stat().st_mode) & 0o007 for p in files)  # not world-readable
    assert not (tmp_path / "gradebook.csv").exists()
    assert main(["grade", str(tmp_path / "subs")]) == 0  # no --out: beside the folder, not here
    assert (tmp_path / "subs.graded" / "gradebook.csv").exists() and not (tmp_path / "gradebook.csv").exists()


def test_hand_graded_answers_are_reported_with_their_text(hostile, tmp_path):
    written = copy.deepcopy(EXERCISE)
    [cell] = [c for c in written.cells if c.metadata.get("nbgrader", {}).get("grade")
              and c.metadata["nbgrader"].get("solution")]
    cell.source = "The spread falls like 1/√T, **so**: <b>T = 100</b>.\u2028"
    rows = grade_folder(tmp_path, {"w": written})
    [manual] = [e for e in rows["w"]["exercises"] if e["status"] == report.PENDING]
    assert manual["answer"] == "The spread falls like 1/√T, **so**: <b>T = 100</b>." and manual["points"] == 0
    assert rows["w"]["pending"] == manual["max_points"] == cell.metadata["nbgrader"]["points"]
    text = (tmp_path / "out" / "feedback" / "w.feedback.md").read_text()
    assert "1/√T" in text and "<b>" not in render(text).replace("&lt;b&gt;", "")


def test_channel_files_are_what_the_stand_in_sends():
    """The stand-in speaks the real contract: its files load as results."""
    data = results_file([{"status": "error", "message": "x"}])
    assert results.load_results(data)["results"] == [{"status": "error", "message": "x"}]
    assert channel.FILE_CAP > len(data)
