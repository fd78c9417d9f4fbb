"""The exercise pipeline: exercises/ is exactly what `course assign` makes of solutions/."""

import ast
import csv
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course_tools.cli import main
from course_tools.exercises import assign
from course_tools.grading import submission as reading

ROOT = Path(__file__).resolve().parent.parent
ANSWER = {"grade": False, "solution": True, "locked": False, "grade_id": "f", "schema_version": 3}


def test_exercises_are_in_sync_with_solutions(tmp_path):
    written = assign.write_all(ROOT / "solutions", tmp_path)
    assert written, "no solutions found"
    generated = sorted(p.name for p in written)
    committed = sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
    assert generated == committed, "exercises/ and solutions/ hold different lessons: run `course assign`"
    for name in generated:
        same = filecmp.cmp(tmp_path / name, ROOT / "exercises" / name, shallow=False)
        assert same, f"exercises/{name} differs from what `course assign` generates: run it, never edit by hand"


def test_solution_region_becomes_an_indented_stub():
    source = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION\n    return x + y\n    ### END SOLUTION\n"
    stub = assign.strip_solution(source, "code", "test")
    assert stub == "def f(x):\n    y = 1\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"


def test_markdown_answers_become_placeholders():
    stub = assign.strip_solution("Why?\n### BEGIN SOLUTION\nBecause.\n### END SOLUTION", "markdown", "t")
    assert stub == "Why?\nYOUR ANSWER HERE"


@pytest.mark.parametrize("source, message", [
    ("### BEGIN SOLUTION\nx = 1\n", "without ### END"),
    ("x = 1\n### END SOLUTION\n", "without ### BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "nested"),
])
def test_malformed_markers_are_reported(source, message):
    with pytest.raises(assign.AssignError, match=message):
        assign.strip_solution(source, "code", "cell 3")


def test_generate_clears_outputs_keeps_metadata_and_names_the_lesson():
    cell = new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION",
                         metadata={"nbgrader": dict(ANSWER)}, execution_count=2)
    cell.outputs = [nbformat.v4.new_output("stream", text="hi\n")]
    nb = new_notebook(cells=[new_markdown_cell("# L"), cell])
    nb.metadata["course"] = {"mode": "cpu", "device": "cpu"}
    out = assign.build_exercises(nb, "03_topic")
    assert out.metadata["course"] == {"lesson": "03_topic", "kind": "exercise"}
    assert out.cells[1].outputs == [] and out.cells[1].execution_count is None
    assert out.cells[1].metadata["nbgrader"] == ANSWER
    assert "raise NotImplementedError()" in out.cells[1].source
    assert "return x" in nb.cells[1].source, "the solutions notebook itself must not change"


def test_exercises_do_not_claim_stored_outputs():
    header = new_markdown_cell("# 03\n\n*Stored outputs: a `cpu`-mode run.*\n\nMore text.")
    out = assign.build_exercises(new_notebook(cells=[header]), "03_topic")
    assert "Stored outputs" not in out.cells[0].source
    assert out.cells[0].source == f"# 03\n\n{assign.NO_OUTPUTS}\n\nMore text."
    for path in (ROOT / "exercises").glob("*.ipynb"):
        text = "".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        assert "Stored outputs" not in text, f"{path.name} claims stored outputs it does not have"


def test_solution_markers_need_nbgrader_metadata_and_unique_ids():
    bare = new_notebook(cells=[new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")])
    with pytest.raises(assign.AssignError, match="solution: true"):
        assign.build_exercises(bare, "01_x")
    twice = new_notebook(cells=[new_code_cell("x = 1", metadata={"nbgrader": dict(ANSWER)}),
                                new_code_cell("y = 1", metadata={"nbgrader": dict(ANSWER)})])
    with pytest.raises(assign.AssignError, match="unique grade_id"):
        assign.build_exercises(twice, "01_x")


def test_course_assign_command_writes_exercises(tmp_path):
    from course_tools.cli import main

    (tmp_path / "solutions").mkdir()
    nb = new_notebook(cells=[new_code_cell("### BEGIN SOLUTION\nx = 1\nprint(x)\n### END SOLUTION",
                                           metadata={"nbgrader": dict(ANSWER)})])
    nbformat.write(nb, tmp_path / "solutions" / "05_demo.ipynb")
    assert main(["assign", "--root", str(tmp_path)]) == 0
    out = nbformat.read(tmp_path / "exercises" / "05_demo.ipynb", as_version=4)
    assert out.cells[0].id == "generated-banner" and "`solutions/05_demo.ipynb`" in out.cells[0].source
    assert out.cells[1].source == "# YOUR CODE HERE\nraise NotImplementedError()"
    with pytest.raises(assign.AssignError, match="NN_topic"):
        assign.lesson_of(Path("setup.ipynb"))


def test_a_question_answer_becomes_a_placeholder_that_runs():
    source = "# shape of q kᵀ?\n### BEGIN SOLUTION\nscores_shape = (2, 3, 5, 5)\nbest = 'b'\n### END SOLUTION\n"
    stub = assign.strip_solution(source, "code", "test")
    assert stub == "# shape of q kᵀ?\nscores_shape = ...  # YOUR ANSWER HERE\nbest = ...  # YOUR ANSWER HERE\n"
    for not_only_assignments in ("x = 1\nprint(x)", "x == 1", "    x = 1"):
        source = f"### BEGIN SOLUTION\n{not_only_assignments}\n### END SOLUTION"
        assert "raise NotImplementedError()" in assign.strip_solution(source, "code", "test")


def test_solution_notes_are_dropped_for_students():
    note = new_markdown_cell("Why: because.", metadata={"tags": [assign.NOTE_TAG]})
    other = new_markdown_cell("Kept.", metadata={"tags": ["other"]})
    out = assign.build_exercises(new_notebook(cells=[new_markdown_cell("# 03"), note, other]), "03_topic")
    assert [c.source for c in out.cells] == ["# 03", "Kept."]
    for path in (ROOT / "exercises").glob("*.ipynb"):
        cells = nbformat.read(path, as_version=4).cells
        assert not any(assign.NOTE_TAG in c.metadata.get("tags", []) for c in cells), path.name


# --- nbgrader: its release is exercises/, its autograde scores like course grade -----------------------

def _nbgrader_problem() -> str | None:
    try:
        import nbgrader  # noqa: F401
    except ImportError:
        return "nbgrader is not installed (pip install -e '.[grading]')"
    return None


needs_nbgrader = pytest.mark.skipif(_nbgrader_problem() is not None and not os.environ.get("CI"),
                                    reason=str(_nbgrader_problem()))


def nbgrader(course: Path, *args: str) -> None:
    """Run nbgrader for real, in ``course`` (where `course assign --nbgrader` put its config). nbgrader
    runs its database migrations as the command ``alembic``: the scripts of this interpreter's
    environment go first on PATH, so a virtual environment that was not activated still finds it."""
    scripts = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COURSE_MODE": "smoke", "OMP_NUM_THREADS": "1",
           "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")])}
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, capture_output=True,
                          text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if "| ERROR]" in line or "Traceback" in line]
    assert done.returncode == 0 and not errors, done.stderr[-3000:]


@pytest.fixture(scope="module")
def nbgrader_course(tmp_path_factory):
    if _nbgrader_problem():
        pytest.fail(f"CI must run nbgrader: {_nbgrader_problem()}")
    course = tmp_path_factory.mktemp("nbgrader-course")
    assert main(["assign", "--root", str(ROOT), "--nbgrader", str(course)]) == 0
    nbgrader(course, "generate_assignment", "*", "--force")  # every lesson, in one nbgrader run
    return course


@pytest.mark.slow
@needs_nbgrader
@pytest.mark.parametrize("lesson", sorted(p.stem for p in (ROOT / "exercises").glob("*.ipynb")))
def test_nbgrader_releases_exactly_the_exercises(nbgrader_course, lesson):
    """What nbgrader hands out equals exercises/ in every cell a student sees: no "Why this answer"
    note, the self-check placeholders kept (not `raise NotImplementedError()`), no stored-outputs claim."""
    released = nbformat.read(nbgrader_course / "release" / lesson / f"{lesson}.ipynb", as_version=4)
    exercise = nbformat.read(ROOT / "exercises" / f"{lesson}.ipynb", as_version=4)
    assert [(c.cell_type, c.source) for c in released.cells] == [(c.cell_type, c.source) for c in exercise.cells]
    assert [c.get("outputs", []) for c in released.cells] == [c.get("outputs", []) for c in exercise.cells]
    assert released.metadata["course"] == exercise.metadata["course"]  # course grade finds the lesson
    assert not any("**Why this answer.**" in c.source for c in released.cells)


@pytest.mark.slow
@needs_nbgrader
def test_nbgrader_autograde_scores_a_solution_full_and_a_fresh_exercise_zero(nbgrader_course):
    lesson = "00_setup"
    for student, folder in (("ann", "solutions"), ("bob", "exercises")):
        (nbgrader_course / "submitted" / student / lesson).mkdir(parents=True)
        shutil.copyfile(ROOT / folder / f"{lesson}.ipynb", nbgrader_course / "submitted" / student / lesson /
                        f"{lesson}.ipynb")
    nbgrader(nbgrader_course, "autograde", lesson, "--create")
    nbgrader(nbgrader_course, "export")
    with open(nbgrader_course / "grades.csv", newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == lesson}
    pristine = nbformat.read(ROOT / "exercises" / f"{lesson}.ipynb", as_version=4)
    automatic = sum(reading.exercise_cells(pristine)[1].values())
    by_hand = sum(c.metadata["nbgrader"]["points"] for c in pristine.cells
                  if c.metadata.get("nbgrader", {}).get("grade") and c.metadata["nbgrader"].get("solution"))
    assert float(rows["ann"]["score"]) == automatic  # every check passes; the explanation waits for a person
    assert float(rows["bob"]["score"]) == 0
    assert float(rows["ann"]["max_score"]) == automatic + by_hand  # the maximum course grade reports too


def test_an_instructors_own_nbgrader_config_is_left_alone(tmp_path):
    pytest.importorskip("nbgrader")
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    with pytest.raises(assign.AssignError, match="is your own"):
        assign.write_nbgrader(ROOT / "solutions", tmp_path)
    assert (tmp_path / "nbgrader_config.py").read_text() == "c = get_config()\n"


def test_the_nbgrader_config_sets_the_lessons_own_cell_timeout(tmp_path):
    """nbgrader's default of 30 s per cell stops a correct capstone's training cell; the config takes the largest
    of the lessons' own limits (lesson 11: 600 s)."""
    pytest.importorskip("nbgrader")
    assign.write_nbgrader(ROOT / "solutions", tmp_path)
    config = (tmp_path / "nbgrader_config.py").read_text()
    lesson11 = nbformat.read(ROOT / "solutions" / "11_build_your_gpt.ipynb", as_version=4)
    seconds = lesson11.metadata["course"]["grading"]["cell_timeout"]
    assert seconds >= 600 and f"c.Execute.timeout = {seconds}\n" in config
    ast.parse(config)  # still a valid Python file


@pytest.mark.parametrize("page", ["instructors.md", "instructors.ko.md"])
def test_the_nbgrader_section_states_what_an_instructor_must_know_first(page):
    """Issue 48 item 6: before autograding, an instructor reads that nbgrader needs the environment activated
    (it runs ``alembic`` by name), that the config sets the cell time limit, and that an answer cell can switch
    the strict checks off (nbgrader runs answers and checks in one kernel: a blank lesson-11 notebook with
    ``checks.STRICT = False`` in its first answer cell autogrades 29/30)."""
    text = (ROOT / "docs" / "pages" / page).read_text()
    section = text[text.index("nbgrader generate_assignment") - 2000:]
    for needed in ("alembic", "c.Execute.timeout", "checks.STRICT = False", "course grade"):
        assert needed in section, (page, needed)
