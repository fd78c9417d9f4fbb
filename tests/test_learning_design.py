"""Every lesson follows the learning design of CONTRIBUTING.md: orientation, predict-then-run,
self-check questions, one experiment with a written explanation, task texts that name what is
practised, and an explained answer after every check."""

import re
from pathlib import Path

import nbformat
import pytest

from course_tools.exercises.predict import is_hidden, reveal_span

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted(p.name for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


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
    later slide in the slides (``python -m course_tools.exercises.predict notebooks/NN_topic.ipynb`` marks them)."""
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
INCIDENTAL = {"9bbd5764": "'H=4' is the number of heads; the answer is the factor 4 by which memory grows",
              "cd6c664c": "'99.8%' is the model's exact match; the answer is the share of digit syllables (99.5%) "
                          "that put their strongest weight on their own digit"}


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


# --- self-check questions that need reasoning --------------------------------------------------------
# A question "needs reasoning" when its answer is printed nowhere in the lesson (notebook prose and
# stored outputs) and cannot be read off a formula or table of the lesson with the lesson's own numbers:
# it takes a computation for a configuration the lesson does not show, or an inference from what it
# measured. Recall (which option is pre-LN?) and plug-in shapes do not count. The names below are the
# questions judged so; the test checks the half that a machine can: none of their answers is printed.
REASONING = {
    "00": {"merged_heads_shape", "pattern_for_shape", "einsum_products"},
    "01": {"tied_skipgram_parameters", "initial_loss_k10", "rows_with_gradient", "noise_draw_ratio"},
    "02": {"cross_scores_shape", "over_scaled_variance", "mask_for_pattern", "uniform_weight"},
    "03": {"narrow_split_shape", "mha_parameters_no_bias", "weights_memory_factor"},
    "04": {"rms_of_constant", "plain_gradient_factor", "ffn_parameters"},
    "05": {"pe_norm_squared", "frequency_ratio", "alibi_slope"},
    "06": {"six_head_queries_shape", "twelve_block_parameters", "pooled_first_coordinate"},
    "07": {"reshaped_block_params", "nucleus_count", "kv_numbers_per_token_medium"},
    "08": {"loss_curve_choice", "tokens_per_step", "mfu_percent"},
    "09": {"rmsnorm_equals_layernorm", "gqa_kv_head", "swiglu_equal_width", "kv_bytes_40_layers",
           "mqa_params_saved"},
    "10": {"predictions_scored", "batched_beam_candidates", "reading_101010"},
    "11": {"capstone_params_added", "capstone_diagnosis", "capstone_top_k_prob"},
    "12": {"smollm2_360m_bits", "kv_cache_megabytes", "top_p_second_prob", "unpermuted_positions",
           "q4_1_zero"},
    "13": {"smollm2_lora_parameters", "answer_positions", "both_zero_choice", "both_rose_loss",
           "dpo_start_gradient"},
    "14": {"lone_right_advantage", "clipped_negative_choice", "k3_token_kl", "wasted_groups"},
    "15": {"identical_position_patch", "uniform_induction_score", "selectivity_choice", "mean_ablation_change"},
}


def registered_questions() -> dict[str, dict[str, object]]:
    """lesson -> {question name: Exercise} for every self-check question (experiments left out)."""
    from course_tools.exercises import checks, references  # noqa: F401  (registers every lesson)

    out: dict[str, dict[str, object]] = {}
    for name, ex in checks.REGISTRY.items():
        if ex.is_question and not (ex.reference.__doc__ or "").startswith("Experiment"):
            out.setdefault(ex.reference.__module__.rsplit("lesson", 1)[1], {})[name] = ex
    return out


def distinctive(value) -> bool:
    """Whether an answer is specific enough that finding it printed (or twice) is no coincidence:
    numbers of three or more digits or with a fractional part, shapes, words."""
    if isinstance(value, bool) or (isinstance(value, str) and len(value) == 1):
        return False
    if isinstance(value, (int, float)):
        return abs(value) >= 100 or value != int(value) and len(f"{value:.4g}".strip("0.-")) >= 2
    return True


def printed_forms(value) -> list[str]:
    """How an answer would appear if a lesson printed it (only distinctive answers)."""
    if not distinctive(value):
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, tuple):
        return [str(value), str(list(value))]
    if isinstance(value, float) and value != int(value):
        return [f"{value:.4g}", f"{value:.3f}"]
    n = int(value)
    return [str(n), f"{n:,}"]


def lesson_text(lesson: str) -> str:
    name = next(n for n in LESSONS if n.startswith(lesson))
    parts = []
    for cell in cells("notebooks", name):
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


@pytest.mark.parametrize("lesson", sorted(REASONING))
def test_half_the_self_check_needs_reasoning_and_no_answer_is_printed(lesson):
    questions = registered_questions()[lesson]
    unknown = sorted(REASONING[lesson] - set(questions))
    assert not unknown, f"lesson {lesson}: no such questions: {unknown}"
    assert 2 * len(REASONING[lesson]) >= len(questions), \
        f"lesson {lesson}: {len(REASONING[lesson])} of {len(questions)} self-check questions need reasoning"
    text = lesson_text(lesson)
    printed = [(q, form) for q in sorted(REASONING[lesson]) for form in printed_forms(questions[q].reference())
               if re.search(r"(?<![\d.,])" + re.escape(form) + r"(?![\d])", text)]
    assert not printed, f"lesson {lesson}: answers printed in notebooks/: {printed}"


def test_no_two_lessons_ask_the_same_question():
    import difflib

    seen = [(lesson, name, ex.reference.__doc__ or "", ex.reference())
            for lesson, qs in registered_questions().items() for name, ex in qs.items()]
    for i, (la, na, da, va) in enumerate(seen):
        for lb, nb_, db, vb in seen[i + 1:]:
            if la == lb:
                continue
            similar = difflib.SequenceMatcher(None, da, db).ratio()
            assert similar < 0.7, f"{la}:{na} and {lb}:{nb_} ask nearly the same question ({similar:.2f})"
            if distinctive(va) and not isinstance(va, str):
                assert va != vb, f"{la}:{na} and {lb}:{nb_} have the same answer {va}: the same question twice?"


def test_multiple_choice_letters_are_balanced():
    """Across the course every letter a-d is the right answer about equally often (no 'b' habit);
    experiments that answer with a letter count too."""
    from course_tools.exercises import checks, references  # noqa: F401

    letter_questions = [ex for qs in registered_questions().values() for ex in qs.values()]
    letter_questions += [ex for ex in checks.REGISTRY.values()  # experiments answered with a letter
                         if ex.is_question and (ex.reference.__doc__ or "").startswith("Experiment: which")]
    letters = [answer for ex in letter_questions
               for answer in [ex.reference()] if isinstance(answer, str) and answer in ("a", "b", "c", "d")]
    counts = {letter: letters.count(letter) for letter in "abcd"}
    assert len(letters) >= 8 and max(counts.values()) - min(counts.values()) <= 2, \
        f"right letters over {len(letters)} multiple-choice questions: {counts}"


def test_experiments_vary_their_template():
    """At most two lessons' experiments search a grid for the smallest value that passes a threshold."""
    from course_tools.exercises import checks, references  # noqa: F401

    grid = sorted(ex.reference.__module__[-2:] for ex in checks.REGISTRY.values() if ex.is_question
                  and (ex.reference.__doc__ or "").startswith("Experiment: the smallest"))
    assert len(grid) <= 2, f"lessons {grid} all ask for the smallest value on a grid"
