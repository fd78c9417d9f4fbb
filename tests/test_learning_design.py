"""Every lesson follows the learning design of CONTRIBUTING.md: orientation, predict-then-run,
self-check questions, one experiment with a written explanation, task texts that name what is
practised, and an explained answer after every check."""

import re
from pathlib import Path

import nbformat
import pytest

from course_tools.predict import is_hidden, reveal_span

ROOT = Path(__file__).resolve().parent.parent
# Lessons still being brought to the design (each removes itself when it lands; empty when done).
PENDING: set[str] = set()
LESSONS = sorted(p.name for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb") if p.name[:2] not in PENDING)


def cells(folder: str, name: str) -> list:
    return nbformat.read(ROOT / folder / name, as_version=4).cells


def grading(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def is_check(cell) -> bool:
    return cell.cell_type == "code" and grading(cell).get("grade") and not grading(cell).get("solution")


def is_note(cell) -> bool:
    return cell.cell_type == "markdown" and "solution-note" in cell.metadata.get("tags", [])


@pytest.mark.parametrize("name", LESSONS)
def test_orientation_states_time_prerequisites_and_outcomes(name):
    for folder in ("notebooks", "solutions"):
        first = cells(folder, name)[0].source
        assert "**Time:**" in first, f"{folder}/{name}: the first cell needs a '**Time:**' line"
    first = cells("notebooks", name)[0].source
    for part in ("**Prerequisites:**", "**You will be able to**"):
        assert part in first, f"notebooks/{name}: the first cell needs '{part}'"
    assert re.search(r"measured", first), f"notebooks/{name}: quote the measured compute time"


@pytest.mark.parametrize("name", LESSONS)
def test_at_least_two_predictions_each_revealed(name):
    code = [c.source for c in cells("notebooks", name) if c.cell_type == "code"]
    asked = {m for s in code for m in re.findall(r"^(prediction_\w+) = \.\.\.", s, re.M)}
    revealed = {m for s in code for m in re.findall(r"reveal\(\s*(prediction_\w+)", s)}
    assert len(asked) >= 2, f"notebooks/{name}: {len(asked)} 'prediction_... = ...' cells, need 2"
    assert asked <= revealed, f"notebooks/{name}: never revealed: {sorted(asked - revealed)}"


@pytest.mark.parametrize("name", LESSONS)
def test_self_check_has_three_to_six_questions(name):
    nb = cells("solutions", name)
    start = next((i for i, c in enumerate(nb) if c.cell_type == "markdown"
                  and c.source.startswith("## Self-check")), None)
    assert start is not None, f"solutions/{name}: no '## Self-check' section"
    end = next((i for i, c in enumerate(nb) if i > start and c.cell_type == "markdown"
                and c.source.startswith("## ")), len(nb))
    questions = [c for c in nb[start:end] if c.cell_type == "code" and grading(c).get("solution")
                 and re.fullmatch(r"### BEGIN SOLUTION\n\w+ = .+\n### END SOLUTION", c.source.strip(), re.S)]
    assert 3 <= len(questions) <= 6, f"solutions/{name}: {len(questions)} self-check questions"


@pytest.mark.parametrize("name", LESSONS)
def test_one_experiment_with_a_written_explanation(name):
    nb = cells("solutions", name)
    assert any(c.cell_type == "markdown" and c.source.startswith("## Experiment") for c in nb), \
        f"solutions/{name}: no '## Experiment' section"
    written = [c for c in nb if c.cell_type == "markdown" and grading(c).get("grade") and grading(c).get("solution")]
    assert written, f"solutions/{name}: the experiment needs a manually graded explanation cell"


@pytest.mark.parametrize("name", LESSONS)
def test_every_check_is_explained(name):
    nb = cells("solutions", name)
    for i, cell in enumerate(nb):
        if is_check(cell):
            following = nb[i + 1:i + 3]
            assert any(is_note(c) and c.source.startswith("**Why this answer.**") for c in following), \
                f"solutions/{name}: no 'Why this answer' note after {grading(cell)['grade_id']}"


@pytest.mark.parametrize("name", LESSONS)
def test_every_exercise_says_what_it_practises(name):
    for cell in cells("solutions", name):
        if cell.cell_type == "markdown" and re.match(r"## (Exercise|Experiment)", cell.source):
            assert "*Practises:" in cell.source, f"solutions/{name}: {cell.source.splitlines()[0]!r}"


@pytest.mark.parametrize("name", LESSONS)
def test_no_stored_output_spoils_a_prediction(name):
    """Every code cell between a prediction and its reveal (the reveal included) keeps its stored
    output out of sight: collapsed in JupyterLab, behind a toggle on the website, a fragment or a
    later slide in the slides (``python -m course_tools.predict notebooks/NN_topic.ipynb`` marks them)."""
    nb = cells("notebooks", name)
    span = reveal_span(nb)
    assert any("reveal(" in nb[i].source for i in span), f"notebooks/{name}: no reveal after a prediction"
    shown = [nb[i].get("id") for i in span if not is_hidden(nb[i])]
    assert not shown, f"notebooks/{name}: cells {shown} show a prediction's answer before the learner acts"


def first_output_line(cell) -> str:
    """What JupyterLab 4 shows of a collapsed output: the first line of the first output."""
    for out in cell.get("outputs", []):
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        if text.strip():
            return text.strip().splitlines()[0]
    return ""


def gives_away(line: str, measured: str) -> bool:
    """Whether a line shows a measurement printed by reveal (as 'measured: <repr>')."""
    if measured in ("True", "False"):
        return line.rstrip().endswith(measured)
    try:
        value = float(measured)
    except ValueError:
        return measured in line
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", line.replace(",", ""))]
    return any(abs(n - value) <= 0.005 * max(abs(value), 1e-9) for n in numbers)


# First lines that hold the measured number by coincidence, not as the answer.
INCIDENTAL = {"9bbd5764": "'H=4' is the number of heads; the answer is the factor 4 by which memory grows"}


@pytest.mark.parametrize("name", LESSONS)
def test_collapsed_outputs_do_not_preview_the_answer(name):
    """JupyterLab 4 previews the first line of a collapsed output, so no cell between a prediction
    and its reveal may start its output with the measurement the reveal prints."""
    nb = cells("notebooks", name)
    span = reveal_span(nb)
    group: list[int] = []
    spoiled = []
    for i in span:
        group.append(i)
        if "reveal(" not in nb[i].source:
            continue
        lines = "".join(o.get("text", "") for o in nb[i].outputs).splitlines()
        measured = next((re.sub(r"(: (right|not what happened).*| \(write .*)$", "", ln[len("measured: "):])
                         for ln in lines if ln.startswith("measured: ")), None)
        assert measured is not None, f"notebooks/{name}: cell {nb[i].get('id')} has no stored 'measured:' line"
        spoiled += [f"cell {nb[j].get('id')} previews {measured}: {first_output_line(nb[j])!r}"
                    for j in group
                    if nb[j].get("id") not in INCIDENTAL and gives_away(first_output_line(nb[j]), measured)]
        group = []
    assert not spoiled, f"notebooks/{name}: collapsed outputs give answers away: " + "; ".join(spoiled)
