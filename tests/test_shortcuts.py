"""The library-shortcut rule (issue 48 item 2, issue 44 item 1): each answer cell is judged for the
exercise it answers, classes count as much as functions, star imports and built names are caught
(by the export or by the static check), an unreadable cell scores 0 with its reason, and the
check's cost is bounded. Static tests here (fast); the run through ``course grade`` of every
solution is ``test_every_solution_scores_full_marks_under_course_grade`` (slow, sandboxed)."""

import copy
import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from test_grade_attacks import _grade, needs_sandbox

from course_tools.grading import cell_summary, export, shortcuts, submission
from course_tools.grading.report import ExerciseScore, Submission

ROOT = Path(__file__).resolve().parent.parent
SHORTCUT_ROUNDTRIP = ("from course_utils import quantize\n\n"
                      "def q8_0_roundtrip(x):\n    return quantize.roundtrip(x, 'q8_0')\n")
LESSONS = sorted(p.stem for p in (ROOT / "solutions").glob("*.ipynb"))


def base(lesson: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "exercises" / f"{lesson}.ipynb", as_version=4)


def judged(lesson: str, answers: dict[str, str] | None = None, start: str = "solutions") -> Submission:
    """``apply`` on the lesson's solution (or blank exercise) with ``answers`` put into their cells,
    every exercise first given full marks: what the rule takes away is what is left to see."""
    nb = nbformat.read(ROOT / start / f"{lesson}.ipynb", as_version=4)
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        grade_id = (cell.metadata.get("nbgrader") or {}).get("grade_id")
        if answers and grade_id in answers:
            cell.source = answers[grade_id]
    parsed = submission.parse(nbformat.writes(nb).encode())
    _, points = submission.exercise_cells(base(lesson))
    sub = Submission(file="x.ipynb", student="x")
    sub.lesson = lesson
    sub.exercises = [ExerciseScore(name, p, p, "ok") for name, p in points.items()]
    sub.flags = ["flagged"] if shortcuts.apply(sub, parsed, base(lesson)) else []
    return sub


def zeroed(sub: Submission) -> dict[str, str]:
    return {e.name: e.status for e in sub.exercises if e.points == 0}


# --- 1. each cell for its own exercise; the course's own solutions keep every point -------------------

@pytest.mark.parametrize("lesson", LESSONS)
def test_the_course_solutions_lose_nothing_to_the_static_check(lesson):
    sub = judged(lesson)
    assert zeroed(sub) == {} and sub.flags == []


def test_an_experiment_using_a_library_function_costs_no_other_exercise():
    # solutions/12's experiment cell (row_vs_block_cost) calls quantize.roundtrip; before, the names of all
    # answer cells were pooled and the hand-written q8_0_roundtrip scored 0
    cell = next(c.source for c in nbformat.read(ROOT / "solutions" / "12_real_llm.ipynb", as_version=4).cells
                if (c.metadata.get("nbgrader") or {}).get("grade_id") == "row_vs_block_cost")
    assert "quantize.roundtrip" in cell
    assert "q8_0_roundtrip" not in zeroed(judged("12_real_llm"))


def test_the_same_call_in_the_exercise_own_cell_still_scores_zero():
    sub = judged("12_real_llm", {"q8_0_roundtrip": SHORTCUT_ROUNDTRIP})
    assert "course_utils.quantize.roundtrip" in zeroed(sub)["q8_0_roundtrip"] and sub.flags


def test_a_binding_in_one_cell_and_the_use_in_another_are_followed():
    sub = judged("12_real_llm", {
        "row_vs_block_cost": "from course_utils.quantize import roundtrip as rt\n\n"
                              "def helper(x):\n    return rt(x, 'q8_0')\n",
        "q8_0_roundtrip": "def q8_0_roundtrip(x):\n    return helper(x)\n"})
    assert "q8_0_roundtrip" in zeroed(sub)


def test_a_learner_own_definition_of_a_name_the_lesson_imports_is_theirs():
    # lesson 06's own cells import encoder.mean_pool, which masked_mean_pool teaches
    own = ("import torch\n\ndef mean_pool(h, mask):\n    m = mask.unsqueeze(-1).to(h.dtype)\n"
           "    return (h * m).sum(1) / m.sum(1).clamp(min=1)\n\n"
           "def masked_mean_pool(h, mask):\n    return mean_pool(h, mask)\n")
    assert "masked_mean_pool" not in zeroed(judged("06_transformer_encoder", {"masked_mean_pool": own}))
    library = "def masked_mean_pool(h, mask):\n    return mean_pool(h, mask)\n"
    assert "course_utils.encoder.mean_pool" in zeroed(judged("06_transformer_encoder",
                                                             {"masked_mean_pool": library}))["masked_mean_pool"]


def test_the_graded_function_defined_in_another_cell_is_judged_for_its_exercise():
    sub = judged("12_real_llm", {
        "row_vs_block_cost": "from course_utils import quantize\n\n"
                              "def q8_0_roundtrip(x):\n    return quantize.roundtrip(x, 'q8_0')\n",
        "q8_0_roundtrip": "pass\n"})
    assert "course_utils.quantize.roundtrip" in zeroed(sub)["q8_0_roundtrip"] and sub.flags


# --- 2. classes -------------------------------------------------------------------------------------

def test_classes_an_exercise_teaches_are_taught():
    assert ("course_utils.lora", "LoRALinear") in shortcuts.teaches("13_adapting")["lora_forward"]
    assert ("course_utils.attention", "MultiHeadAttention") in shortcuts.teaches("03_multi_head_attention")[
        "multi_head_forward"]
    capstone = shortcuts.teaches("11_build_your_gpt")
    assert {("course_utils.gpt", "GPT"), ("course_utils.blocks", "FeedForward")} <= capstone["capstone_equivalence"]
    assert ("course_utils.train", "train") in capstone["capstone_training"]


def test_lora_linear_answers_lora_forward_for_zero():
    source = ("import torch\nfrom course_utils.lora import LoRALinear\n\n"
              "def lora_forward(x, W, b, A, B, alpha):\n"
              "    base = torch.nn.Linear(W.shape[1], W.shape[0])\n"
              "    layer = LoRALinear(base, A.shape[0], alpha)\n    return layer(x)\n")
    sub = judged("13_adapting", {"lora_forward": source})
    assert "course_utils.lora.LoRALinear" in zeroed(sub)["lora_forward"] and sub.flags


def test_the_library_sequence_logprobs_answers_lesson13_for_zero():
    # lesson 13's fifth exercise: the learner writes log π(answer | prompt); calling the library's scores 0
    source = ("from course_utils import dpo\n\n"
              "def sequence_logprobs(logits, targets, mask):\n"
              "    return dpo.sequence_logprobs(logits, targets, mask)\n")
    sub = judged("13_adapting", {"sequence_logprobs": source})
    assert "course_utils.dpo.sequence_logprobs" in zeroed(sub)["sequence_logprobs"] and sub.flags


def test_lesson13_loops_built_from_the_library_score_zero():
    # issue 45 item 2: the learner writes LoRA injection, the SFT batch and the two training loops; the
    # library's versions answer none of them
    sub = judged("13_adapting", {
        "lora_injection": "from course_utils import lora\n\n"
                          "def inject_lora(model, targets, rank, alpha):\n"
                          "    lora.add_lora(model, targets, rank, alpha)\n"
                          "    return lora.trainable_parameters(model)\n",
        "sft_batch": "from course_utils.sft import collate, masked_example\n\n"
                     "def sft_batch(pairs, pad_id):\n"
                     "    return collate([masked_example(encode(prompt_of(m)), encode(a + END)) for m, a in pairs], "
                     "pad_id)\n",
        "sft_training": "import course_utils.sft as s\n\ndef train_sft(model, settings):\n"
                        "    return [s.masked_loss(model(x)[0], y, m).item() for x, y, m in []]\n",
        "dpo_training": "from course_utils import dpo\n\ndef train_dpo(policy, reference, settings):\n"
                        "    return [dpo.dpo_loss(*[None] * 4, 0.1)]\n"})
    got = zeroed(sub)
    assert "course_utils.lora.add_lora" in got["lora_injection"]
    assert "course_utils.sft.collate" in got["sft_batch"] or "course_utils.sft.masked_example" in got["sft_batch"]
    assert "course_utils.sft.masked_loss" in got["sft_training"]
    assert "course_utils.dpo.dpo_loss" in got["dpo_training"] and sub.flags
    taught = shortcuts.teaches("13_adapting")
    assert {("course_utils.lora", "add_lora"), ("course_utils.lora", "LoRALinear")} <= taught["lora_injection"]
    assert ("course_utils.train", "train") in taught["sft_training"]
    assert ("course_utils.dpo", "sequence_logprobs") in taught["dpo_training"]


def test_a_capstone_built_from_course_classes_scores_zero_on_the_stages_it_touches():
    sub = judged("11_build_your_gpt", {
        "my_attention": "from course_utils.attention import MultiHeadAttention\n\n"
                        "class CausalSelfAttention(MultiHeadAttention):\n    pass\n",
        "my_training_loop": "import course_utils.train as t\n\ndef train_gpt(model, data, settings):\n"
                            "    return t.train(model, data, None)\n"})
    got = zeroed(sub)
    assert {"capstone_shapes", "capstone_equivalence", "capstone_no_peeking", "capstone_training",
            "capstone_sampling"} <= set(got)
    assert "course_utils.train.train" in got["capstone_training"]
    assert "course_utils.train.train" not in got["capstone_sampling"]
    # the cells touch the model and the loop, not the answers to questions nor the from-the-metal track
    assert not {"capstone_params_added", "capstone_diagnosis", "metal_linear", "metal_training"} & set(got)


def test_a_llama_built_from_course_classes_scores_zero_on_the_stages_it_touches():
    # lesson 12's part 2 (issue 45): the learner's LLaMA, cache and decoding loop; a submission that builds them
    # from course_utils classes and functions loses every llama_* stage it touches, and is flagged
    sub = judged("12_real_llm", {
        "my_llama": "from course_utils.gpt import GPT\n\nclass Llama(GPT):\n    pass\n",
        "my_decoding": "from course_utils import generate as g\n\n"
                       "def next_token_probs(logits, temperature, top_p):\n"
                       "    return g.next_token_probs(logits, temperature, top_p=top_p)\n"})
    got = zeroed(sub)
    assert {"llama_forward", "llama_smollm2", "llama_kv_cache", "llama_top_p", "llama_generate"} <= set(got)
    assert "course_utils.gpt.GPT" in got["llama_forward"] and sub.flags
    assert "course_utils.generate.next_token_probs" in got["llama_top_p"]
    # part 1, the questions and the experiment are not touched by these cells
    assert not {"dequantize_q4_1", "chatml_prompt", "smollm2_360m_bits", "unpermuted_positions",
                "row_vs_block_cost"} & set(got)


def test_the_mapping_written_with_the_library_permutation_scores_zero():
    source = ("from course_utils.positional import rope_halves_to_pairs\n\n"
              "def map_tensor(name, weight, n_heads, n_kv_heads):\n"
              "    return name, rope_halves_to_pairs(weight, n_heads)\n")
    got = zeroed(judged("12_real_llm", {"my_mapping": source}))
    assert "course_utils.positional.rope_halves_to_pairs" in got["llama_mapping"]


def test_a_removed_class_refuses_to_be_built_and_its_subclass_inherits_nothing(tmp_path):
    lesson = "11_build_your_gpt"
    folder = export.make(lesson, shortcuts.pristine_sources(base(lesson)))
    try:
        code = ("from course_utils.attention import MultiHeadAttention\n"
                "class Mine(MultiHeadAttention):\n    pass\n"
                "print(hasattr(Mine, 'forward'))\n"
                "try:\n    MultiHeadAttention(16, 4)\nexcept RuntimeError as exc:\n    print(exc)\n")
        done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(folder)}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(folder)
    assert done.stdout.splitlines() == ["False", shortcuts.SHORTCUT_MESSAGE.format(
        qualified="course_utils.attention.MultiHeadAttention")], done.stderr[-500:]


# --- 3. star imports and built names ---------------------------------------------------------------

def test_a_star_import_is_followed():
    sub = judged("12_real_llm", {"q8_0_roundtrip": "from course_utils.quantize import *\n\n"
                                                   "def q8_0_roundtrip(x):\n    return roundtrip(x, 'q8_0')\n"})
    assert "course_utils.quantize.roundtrip" in zeroed(sub)["q8_0_roundtrip"]


def test_a_built_name_scores_zero_where_the_taught_function_is_still_in_the_export():
    # lesson 12 keeps quantize.roundtrip in the export (its own experiment needs it): the static check decides
    assert ("course_utils.quantize", "roundtrip") in shortcuts.used_by_notebook(
        "12_real_llm", shortcuts.pristine_sources(base("12_real_llm")))
    source = ("from course_utils.quantize import *\nfrom importlib import import_module\n\n"
              "def q8_0_roundtrip(x):\n"
              "    return getattr(import_module('course_utils.' + 'quantize'), 'round' + 'trip')(x, 'q8_0')\n")
    status = zeroed(judged("12_real_llm", {"q8_0_roundtrip": source}))["q8_0_roundtrip"]
    assert "dynamically" in status and "course_utils.quantize.roundtrip" in status


def test_a_built_name_is_left_to_the_export_where_the_taught_function_is_removed():
    # lesson 13's dpo_loss is removed from the export: a built name there finds only the refusal, whose
    # message the rule reads from the run (the sandboxed test in test_sandbox_attacks covers the run)
    assert "dpo_loss" in shortcuts.removed("13_adapting", shortcuts.pristine_sources(base("13_adapting")))[
        "course_utils.dpo"]
    source = ("import importlib\n\ndef dpo_loss(*args):\n"
              "    return getattr(importlib.import_module('course_utils.dpo'), 'dpo_' + 'loss')(*args)\n")
    assert "dpo_loss" not in zeroed(judged("13_adapting", {"dpo_loss": source}))


# --- 4. a cell the check cannot read scores 0, with its reason --------------------------------------

def test_a_syntax_error_scores_that_exercise_zero_with_its_line():
    sub = judged("12_real_llm", {"q8_0_roundtrip": "def q8_0_roundtrip(x):\n    return (x\n"})
    status = zeroed(sub)["q8_0_roundtrip"]  # (graded, the run's own SyntaxError status stays: the cell defined nothing)
    assert "does not parse (SyntaxError, line 2" in status and sub.flags == []  # a slip, not a shortcut


def test_a_long_written_explanation_is_never_parsed():
    # a markdown answer of 100,000 characters: before, ast.parse ran on it and raised MemoryError, and the
    # rule was skipped for the whole submission ("grader error")
    sub = judged("12_real_llm", {"row_vs_block_cost_explanation": "-" * 100_000 + "1",
                                 "q8_0_roundtrip": SHORTCUT_ROUNDTRIP})
    assert set(zeroed(sub)) == {"q8_0_roundtrip"}


def test_a_cell_the_parser_runs_out_of_memory_on_scores_zero_not_skipped():
    nested = "x = " + "-" * 20_000 + "1\n"  # CPython's parser runs out of stack: MemoryError
    deep = "y = a" + ".b" * 300 + "\n"  # parses, but deeper than the check reads
    sub = judged("12_real_llm", {"q8_0_roundtrip": nested + "def q8_0_roundtrip(x):\n    return x\n",
                                 "smollm2_360m_bits": deep + "def smollm2_360m_bits():\n    return 5.46\n"})
    got = zeroed(sub)
    assert "MemoryError" in got["q8_0_roundtrip"] and "nested too deeply" in got["smollm2_360m_bits"] and sub.flags


def test_cells_not_read_in_time_get_a_timeout_status():
    read = shortcuts.summaries(["x = 1\n"] * 3, seconds=0.001)
    assert [s["status"] for s in read] == ["could not be read by the static check in 0.001 s"] * 3


def test_a_failure_of_the_reader_blinds_the_check_so_kept_exercises_score_zero(monkeypatch):
    real = shortcuts.summaries

    def one_lost(sources, seconds=shortcuts.SUMMARY_SECONDS):
        out = real(sources, seconds)
        return [*out[:-1], {"ok": False, "status": "could not be read by the static check (MemoryError)"}]

    monkeypatch.setattr(shortcuts, "summaries", one_lost)
    got = zeroed(judged("12_real_llm"))
    assert "q8_0_roundtrip" in got and "MemoryError" in got["q8_0_roundtrip"]


# --- 5. the cost is bounded -------------------------------------------------------------------------

def test_a_cell_over_the_size_limit_is_refused_with_a_status():
    source = "# " + "x" * cell_summary.MAX_CHARS + "\ndef smollm2_360m_bits():\n    return 5.46\n"
    status = zeroed(judged("12_real_llm", {"smollm2_360m_bits": source}))["smollm2_360m_bits"]
    assert "too long for the static check" in status


def test_deep_attribute_chains_are_read_in_linear_time():
    # eight cells of a.b.b.b… under the size cap: before, each chain was walked from every link (quadratic:
    # 219 s for 1.5 MB in the red team's run); now each is read once. The bound is on the summarising
    # process's CPU time, not the wall clock, so a loaded machine does not fail it (1.7 s CPU measured at
    # load 3; the quadratic walk is two orders of magnitude more), and the wall-clock limit is lifted here
    chain = "y = a" + ".b" * (cell_summary.MAX_DEPTH - 10) + "\n"
    cell = chain * (cell_summary.MAX_CHARS // len(chain))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    read = shortcuts.summaries([cell] * 8, seconds=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert all(s["ok"] for s in read)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert 0 < cpu < 15, f"{cpu:.1f} s of CPU to summarise 8 chains of depth {cell_summary.MAX_DEPTH - 10}"


def test_a_chain_too_deep_for_the_parser_gets_a_status():
    read = cell_summary.summarise("y = a" + ".b" * 5000 + "\n")
    assert read == {"ok": False, "status": "could not be read by the static check (RecursionError)"}


def test_the_summary_answers_json_lines_in_order():
    out = subprocess.run([sys.executable, "-I", str(shortcuts.SUMMARY_SCRIPT)], input=json.dumps("import os\n") + "\n",
                         capture_output=True, text=True, timeout=60)
    assert json.loads(out.stdout)["imports"] == [["import", "os", None]]


# --- the course's own solutions under `course grade` -----------------------------------------------

@pytest.mark.slow
@needs_sandbox
def test_every_solution_scores_full_marks_under_course_grade(tmp_path):
    """All 14 solutions graded in one folder run, as an instructor would: every automatic point (the
    written explanations wait for the instructor), nothing flagged. Before the per-cell rule,
    solutions/12 scored 11/14, flagged (its experiment cell's quantize.roundtrip cost q8_0_roundtrip)."""
    folder = tmp_path / "class"
    folder.mkdir()
    for lesson in LESSONS:
        shutil.copyfile(ROOT / "solutions" / f"{lesson}.ipynb", folder / f"{lesson}.ipynb")
    rows, _ = _grade(folder, tmp_path / "out", "--jobs", "2", "--seed", "5")
    got = {name: (row["total"], row["max"] - row["pending"], row["flags"], row["status"]) for name, row in rows.items()}
    assert sorted(got) == LESSONS
    assert all(total == full and flags == [] for total, full, flags, _ in got.values()), got
