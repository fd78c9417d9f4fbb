"""`course grade`: fair scores for honest, half-done, broken and tampering submissions.

The fixtures are built here from solutions/ and exercises/ of lesson 00, graded in one folder run
(several submissions at once), and each test reads its row.
"""

import copy
import json
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from course_tools.cli import main
from course_tools.grading import submission as reading
from course_tools.grading.report import PENDING

ROOT = Path(__file__).resolve().parent.parent
LESSON = "00_setup"
SOLUTION = nbformat.read(ROOT / "solutions" / f"{LESSON}.ipynb", as_version=4)
EXERCISE = nbformat.read(ROOT / "exercises" / f"{LESSON}.ipynb", as_version=4)
FUNCTIONS = {"flatten_tokens": 1, "mean_over_time": 1, "pairwise_dots": 2}  # the fixtures' exercises
POINTS = reading.exercise_cells(EXERCISE)[1]  # every scored item: the functions, the questions, the experiment
FULL = int(sum(POINTS.values()))
MANUAL = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"] for c in EXERCISE.cells
          if c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution")}
MAX = FULL + sum(MANUAL.values())  # nbgrader's maximum: the written explanation counts too


def answer_index(nb, grade_id):
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def submission(answers: dict[str, str] | None = None, base=EXERCISE, edit=None):
    """A copy of the fresh exercise notebook with some answer cells replaced."""
    nb = copy.deepcopy(base)
    for grade_id, source in (answers or {}).items():
        nb.cells[answer_index(nb, grade_id)].source = source
    if edit:
        edit(nb)
    return nb


def solution_source(grade_id):
    return SOLUTION.cells[answer_index(SOLUTION, grade_id)].source


RIGHT = {name: solution_source(name) for name in FUNCTIONS}
LOOP = "def flatten_tokens(x):\n    while True:\n        pass\n"
WRONG_FLATTEN = "def flatten_tokens(x):\n    return x.reshape(-1, x.shape[-1]) * 2\n"


def tamper_checks(nb):
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):  # the check cells, not a hand-graded answer
            cell.source = "print('flatten_tokens: 3/3 cases passed (all cases passed)')"
            meta["points"] = 100
    nb.cells.append(nbformat.v4.new_code_cell("from course_tools import checks\nchecks.REGISTRY.clear()"))


MONKEYPATCH = (
    "import course_tools.exercises.checks as checks\n"
    "checks.compare = lambda *a, **k: (True, 'ok')\n"
    "checks.judge = lambda ex, case, got, expected: checks.Outcome('pass', 'ok')\n"
    "import torch\n"
    "torch.allclose = lambda *a, **k: True\n"
    "torch.equal = lambda *a, **k: True\n" + WRONG_FLATTEN
)
WRITER = ("open('pwned.txt', 'w').write('x')\n"
          "import os\nos.makedirs('exercises', exist_ok=True)\nopen('exercises/00_setup.ipynb', 'w').write('{}')\n"
          + RIGHT["flatten_tokens"])
CRASH = "import os\nos._exit(3)\n" + RIGHT["mean_over_time"]
HUGE_PRINT = "print('x' * 5_000_000)\nfor _ in range(2000):\n    print('spam ' * 100)\n" + RIGHT["flatten_tokens"]
MEMORY = ("import torch\n"
          "def mean_over_time(x):\n    big = torch.empty(2**40, dtype=torch.uint8)\n    return big\n")
SYNTAX = "def pairwise_dots(a, b):\n    return a @@ b\n"
DIVIDE = "def mean_over_time(x):\n    return 1 / 0\n"


def duplicate_answer(nb):
    i = answer_index(nb, "flatten_tokens")
    twin = copy.deepcopy(nb.cells[i])
    twin.id = "twin-answer"
    nb.cells.insert(i + 1, twin)


def drop_answer(nb):
    del nb.cells[answer_index(nb, "pairwise_dots")]


def forget_lesson(nb):
    nb.metadata.pop("course", None)


SUBMISSIONS = {
    "full": submission(base=SOLUTION),
    "fresh": submission(),
    "half": submission({"flatten_tokens": RIGHT["flatten_tokens"], "pairwise_dots": RIGHT["pairwise_dots"]}),
    "loop": submission({"flatten_tokens": LOOP, "mean_over_time": RIGHT["mean_over_time"]}),
    "crash": submission({"flatten_tokens": RIGHT["flatten_tokens"], "mean_over_time": CRASH}),
    "errors": submission({"mean_over_time": DIVIDE, "pairwise_dots": SYNTAX,
                          "flatten_tokens": RIGHT["flatten_tokens"]}),
    "printer": submission({"flatten_tokens": HUGE_PRINT}),
    "hungry": submission({"mean_over_time": MEMORY, "flatten_tokens": RIGHT["flatten_tokens"]}),
    "tamper": submission({"flatten_tokens": WRONG_FLATTEN}, edit=tamper_checks),
    "monkey": submission({"flatten_tokens": MONKEYPATCH}),
    "writer": submission({"flatten_tokens": WRITER}),
    "duplicate": submission(RIGHT, edit=duplicate_answer),
    "missing": submission(RIGHT, edit=drop_answer),
    "renamed": submission(RIGHT, edit=forget_lesson),
}
BAD_FILES = {
    "corrupt": b'{"cells": [ this is not json',
    "empty": b"",
    "notnotebook": json.dumps({"hello": "world"}).encode(),
    "unknown": json.dumps(nbformat.v4.new_notebook(metadata={"course": {"lesson": "99_nothing"}})).encode(),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions")
    for name, nb in SUBMISSIONS.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    for name, raw in BAD_FILES.items():
        (folder / f"{name}.ipynb").write_bytes(raw)
    out = tmp_path_factory.mktemp("out")
    args = ["grade", str(folder), "--jobs", "4", "--cell-timeout", "10", "--notebook-timeout", "90",
            "--output-cap", "20000", "--memory-mb", "3072", "--gradebook", str(out / "gradebook.csv"),
            "--json", str(out / "results.json"), "--feedback", str(out / "feedback")]
    assert main(args) == 0
    rows = {r["student"]: r for r in json.loads((out / "results.json").read_text())}
    return {"rows": rows, "out": out, "folder": folder}


@pytest.mark.slow
def test_solutions_get_full_marks(graded):
    row = graded["rows"]["full"]
    assert (row["total"], row["max"], row["pending"], row["lesson"]) == (FULL, MAX, MAX - FULL, LESSON)
    assert {e["status"] for e in row["exercises"]} == {"pass", PENDING}


@pytest.mark.slow
def test_fresh_exercises_get_zero_not_attempted(graded):
    row = graded["rows"]["fresh"]
    assert (row["total"], row["max"], row["status"]) == (0, MAX, "not attempted")
    assert {e["status"] for e in row["exercises"]} == {"not attempted", PENDING}


@pytest.mark.slow
def test_half_done_gets_partial_marks(graded, scores, statuses):
    row = graded["rows"]["half"]
    assert scores(row) == {"flatten_tokens": 1, "mean_over_time": 0, "pairwise_dots": 2}
    assert statuses(row)["mean_over_time"] == "not attempted"


@pytest.mark.slow
def test_infinite_loop_costs_only_that_exercise(graded, scores, statuses):
    row = graded["rows"]["loop"]
    assert statuses(row)["flatten_tokens"] == "timeout"
    assert scores(row) == {"flatten_tokens": 0, "mean_over_time": 1, "pairwise_dots": 0}


@pytest.mark.slow
def test_crashing_kernel_is_reported_and_keeps_the_gradebook_going(graded, statuses):
    row = graded["rows"]["crash"]
    assert row["total"] == 0 and row["status"] == "notebook crashed"
    assert all(s.startswith("error") for s in statuses(row).values())


@pytest.mark.slow
def test_exceptions_are_one_line_statuses(graded, statuses):
    st = statuses(graded["rows"]["errors"])
    assert st["mean_over_time"] == "error: ZeroDivisionError: division by zero"
    assert st["pairwise_dots"].startswith("error: SyntaxError")
    assert st["flatten_tokens"] == "pass"


@pytest.mark.slow
def test_huge_print_is_capped_and_still_graded(graded, scores):
    row = graded["rows"]["printer"]
    assert scores(row)["flatten_tokens"] == 1


@pytest.mark.slow
def test_memory_hungry_answer_loses_only_its_points(graded, scores, statuses):
    row = graded["rows"]["hungry"]
    assert statuses(row)["mean_over_time"].startswith("error: RuntimeError")
    assert scores(row)["flatten_tokens"] == 1 and scores(row)["mean_over_time"] == 0


@pytest.mark.slow
def test_tampered_check_cells_change_nothing(graded, statuses):
    row = graded["rows"]["tamper"]
    assert (row["total"], row["max"]) == (0, MAX)
    assert statuses(row)["flatten_tokens"] == "fail"


@pytest.mark.slow
def test_monkeypatching_inside_the_answer_cannot_raise_the_score(graded, scores, statuses):
    row = graded["rows"]["monkey"]
    assert scores(row)["flatten_tokens"] == 0 and statuses(row)["flatten_tokens"] == "fail"


@pytest.mark.slow
def test_files_written_by_answers_stay_in_a_temporary_folder(graded, scores):
    row = graded["rows"]["writer"]
    assert scores(row)["flatten_tokens"] == 1
    assert not (ROOT / "pwned.txt").exists() and not (graded["folder"] / "pwned.txt").exists()
    assert nbformat.read(ROOT / "exercises" / f"{LESSON}.ipynb", as_version=4).cells


@pytest.mark.slow
def test_duplicate_and_missing_answer_cells(graded, scores, statuses):
    dup = graded["rows"]["duplicate"]
    assert statuses(dup)["flatten_tokens"] == "2 answer cells with grade_id 'flatten_tokens'"
    assert scores(dup) == {"flatten_tokens": 0, "mean_over_time": 1, "pairwise_dots": 2}
    missing = graded["rows"]["missing"]
    assert statuses(missing)["pairwise_dots"] == "missing answer cell"
    assert missing["total"] == 2 and "missing answer cell" in missing["status"]


@pytest.mark.slow
def test_lesson_is_found_from_answer_cells_without_metadata(graded):
    row = graded["rows"]["renamed"]
    assert row["lesson"] == LESSON and row["total"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("name, status", [
    ("corrupt", "not JSON"), ("empty", "empty file"), ("notnotebook", "not a Jupyter notebook"),
    ("unknown", "unknown lesson '99_nothing'"),
])
def test_bad_files_get_a_row_with_a_clear_status(graded, name, status):
    row = graded["rows"][name]
    assert status in row["status"] and row["total"] == 0


@pytest.mark.slow
def test_gradebook_has_one_row_per_submission(graded):
    book = pd.read_csv(graded["out"] / "gradebook.csv")
    assert len(book) == len(SUBMISSIONS) + len(BAD_FILES)
    assert list(book.columns) == ["student", "file", "lesson", *POINTS, *MANUAL, "total", "max", "pending", "status",
                                  "flags", "alike", "seed", "sandbox"]
    full = book.set_index("student").loc["full"]
    assert (full["total"], full["max"], full["pending"]) == (FULL, MAX, MAX - FULL)
    assert {full[name] for name in MANUAL} == {"pending"}


@pytest.mark.slow
def test_feedback_names_the_failing_case(graded):
    text = (graded["out"] / "feedback" / "tamper.feedback.md").read_text()
    assert r"## flatten\_tokens: 0 / 1 (fail)" in text and "max error" in text and "(B=2, T=3, D=4)" in text


def test_grader_fails_only_when_it_cannot_run(tmp_path):
    assert main(["grade", str(tmp_path / "nowhere")]) == 2
    assert main(["grade", str(tmp_path), "--exercises", str(tmp_path / "none")]) == 2


def test_rebuild_keeps_pristine_cells_and_drops_checks(tmp_path):
    tampered = submission({"flatten_tokens": WRONG_FLATTEN}, edit=tamper_checks)
    parsed = reading.parse(json.dumps(tampered).encode())
    rebuilt, problems, _ = reading.rebuild(EXERCISE, parsed, "SETUP")
    sources = [c.source for c in rebuilt.cells if c.cell_type == "code"]
    assert not problems and WRONG_FLATTEN in sources
    assert not any(f"check.{name}(" in s or "REGISTRY" in s for s in sources for name in POINTS)
    assert [c.source for c in rebuilt.cells if c.cell_type == "markdown"] == [
        c.source for c in EXERCISE.cells if c.cell_type == "markdown"]


def test_question_answers_pass_the_kernel_side_as_values(tmp_path):
    from course_tools.grading import kernel_side, results

    (tmp_path / "inputs").mkdir()
    (tmp_path / "out").mkdir()
    namespace = {"answered": (2, 3, 5, 5), "listed": [2, 3], "shape": torch.zeros(2, 3).shape, "letter": "b",
                 "untouched": ...}
    answer = kernel_side.Answerer(str(tmp_path), namespace)
    for name in namespace:
        (tmp_path / "inputs" / results.file_name(name)).write_bytes(results.encode([((), {})]))
        answer(name, name)
    loaded = {n: results.load_results((tmp_path / "out" / results.file_name(n)).read_bytes()) for n in namespace}
    assert loaded["answered"]["results"] == [{"status": "ok", "value": (2, 3, 5, 5)}]
    assert type(loaded["listed"]["results"][0]["value"]) is list  # tuples and lists stay apart
    assert type(loaded["shape"]["results"][0]["value"]) is tuple  # a torch.Size is a tuple, as in the notebook
    assert loaded["letter"]["results"] == [{"status": "ok", "value": "b"}]
    assert loaded["untouched"]["results"] == [{"status": "not attempted"}]


def test_an_answer_the_kernel_side_cannot_carry_is_that_cases_error():
    """A value ``results.plain`` cannot carry (a NumPy array of objects, a complex tensor, a set) is an error
    for its case; the other cases of the exercise are still answered."""
    import numpy as np

    from course_tools.grading import kernel_side

    def answer(kind: str):
        odd = {"objects": np.array([object()]), "complex": torch.ones(2, dtype=torch.complex64), "set": {1}}
        return odd.get(kind, torch.ones(2))

    records = [kernel_side.one_case(answer, (kind,), {}) for kind in ("objects", "complex", "set", "tensor")]
    assert [r["status"] for r in records] == ["error", "error", "error", "ok"]
    assert all(r["message"].startswith("TypeError") for r in records[:3]), records
    assert "tensor of complex64 cannot be graded" in records[1]["message"]
    assert "set cannot be graded" in records[2]["message"]
    assert torch.equal(records[3]["value"], torch.ones(2))
