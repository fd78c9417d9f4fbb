"""The capstone's grading (course_tools/exercises/references/lesson11.py): the name mapping, the hints that name
the usual mistakes, the verdicts of the stages that judge instead of comparing, and the lesson's
grading limits. The full notebooks are graded end to end in tests/test_grade.py's way by nbval and by
``course grade`` (see the lesson's report); these tests are the fast, exact part."""

import dataclasses
import math
from pathlib import Path

import nbformat
import pytest
import torch

from course_tools.exercises import checks
from course_tools.exercises.references import lesson11 as L
from course_tools.grading.job import Limits
from course_tools.messages import say
from course_utils import gpt

ROOT = Path(__file__).resolve().parent.parent

SIZES = {"vocab_size": 11, "max_len": 8, "n_layers": 2, "n_heads": 2, "d_model": 16}


def reference_gpt(sizes=SIZES, activation=L.ACTIVATION):
    torch.manual_seed(0)
    return gpt.GPT(gpt.GPTConfig(activation=activation, **sizes)).eval()


def test_names_map_both_ways_and_only_the_norms():
    state = reference_gpt().state_dict()
    learner = L.to_learner_names(state)
    assert "blocks.1.norm2.weight" in learner and "final_norm.bias" in learner
    assert not any(k.endswith(("gamma", "beta")) for k in learner)
    assert "blocks.0.attn.W_Q.weight" in learner and "token_embedding.weight" in learner
    assert list(L.to_reference_names(learner)) == list(state)


def test_shapes_hint_names_the_untied_head_and_a_saved_mask():
    case = checks.draw("capstone_shapes", 0)[3]
    expected = L.capstone_shapes(*case.args)
    untied = (expected[0], expected[1], [*expected[2], "lm_head.weight (11, 16)"])
    assert "tied" in L._shapes_hint(case, untied, expected)
    buffered = (expected[0], expected[1], [*expected[2], "blocks.0.attn.mask (8, 8)"])
    assert "persistent=False" in L._shapes_hint(case, buffered, expected)
    renamed = (expected[0], expected[1], [e.replace("W_Q", "query") for e in expected[2]])
    assert "name the submodules" in L._shapes_hint(case, renamed, expected)


@pytest.mark.parametrize("kind, mistake, words", [
    ("ffn", {"activation": "gelu_tanh"}, "tanh"),
    ("block", {"activation": "relu"}, "ReLU"),
    ("block", {"norm_first": False}, "post-LN"),
    ("attention", {"causal": False}, "causal mask"),
    ("gpt", {"causal": False}, "causal mask"),
])
def test_equivalence_hints_name_the_mistake(kind, mistake, words):
    case = next(c for c in checks.draw("capstone_equivalence", 1) if c.args[0] == kind)
    _, sizes, state, x = case.args
    expected = L.capstone_equivalence(*case.args)
    wrong = L._run_reference(kind, sizes, state, x, **mistake)
    assert not torch.allclose(wrong, expected, atol=1e-4)
    result = checks.judge(checks.get("capstone_equivalence"), case, wrong, expected)
    assert result.status == checks.FAIL and words in result.line


def test_equivalence_hint_for_unscaled_scores():
    case = next(c for c in checks.draw("capstone_equivalence", 2) if c.args[0] == "attention")
    _, sizes, state, x = case.args
    got = L._unscaled_attention(sizes, state, x)
    assert "√d_head" in L._equivalence_hint(case, got, L.capstone_equivalence(*case.args))


def test_no_peeking_passes_a_causal_model_and_names_a_missing_mask():
    case = checks.draw("capstone_no_peeking", 3)[0]
    sizes, idx, changed = case.args
    model = reference_gpt(sizes)
    with torch.no_grad():
        causal = (model(idx)[0], model(changed)[0])
        peeking = (L.reference_forward("gpt", model, idx, causal=False),
                   L.reference_forward("gpt", model, changed, causal=False))
    assert L._peeking_verdict(case, causal, None)[0]
    ok, detail = L._peeking_verdict(case, peeking, None)
    assert not ok and "peeks at the future" in detail
    assert not L._peeking_verdict(case, causal[0], None)[0]  # one tensor, not two


def contract_trace(settings, norm=0.5):
    """The optimiser trace of a loop that keeps the contract: its schedule, gradients within grad_clip."""
    steps, lr, warmup = settings["steps"], settings["lr"], settings["warmup_steps"]
    lrs = [L.reference_lr(s, steps, lr, warmup) for s in range(steps)]
    return torch.tensor([[lr, norm] for lr in lrs], dtype=torch.float64)


def test_training_verdict_scores_the_weights_itself():
    vocab, tail = L.shakespeare_splits()
    assert vocab == 84 and len(tail) == 252_700  # the corpus's last 5 %
    case = checks.draw("capstone_training", 4)[1]
    trace = contract_trace(case.args[1])
    untrained = L.to_learner_names(reference_gpt(dict(L.TRAIN_SIZES, vocab_size=vocab)).state_dict())
    ok, detail = L._training_verdict(case, (untrained, trace), L.THRESHOLD)
    assert not ok and "hardly learned" in detail and "never receives" in detail  # about ln 84 = 4.43
    missing = {k: v for k, v in untrained.items() if k != "final_norm.bias"}
    ok, detail = L._training_verdict(case, (missing, trace), L.THRESHOLD)
    assert not ok and "missing final_norm.bias" in detail
    nan = dict(untrained, **{"final_norm.bias": torch.full((64,), math.nan)})
    assert "not finite" in L._training_verdict(case, (nan, trace), L.THRESHOLD)[1]


def test_training_is_judged_over_two_grader_seeds_and_a_clipping_case():
    cases = checks.draw("capstone_training", 5)
    seeds = [c.args[1]["seed"] for c in cases if len(c.args) == 2]
    assert len(seeds) == L.TRAINING_SEEDS >= 2 and len(set(seeds)) == len(seeds)
    assert [len(c.args) for c in cases] == [3, 2, 2]  # the clipping case first: `trained` ends as a real run


def test_sampling_verdict_checks_form_and_the_greedy_path():
    cases = checks.draw("capstone_sampling", 5)
    greedy_case = next(c for c in cases if c.args[2].shape[1] + c.args[3] > c.args[0]["max_len"])
    expected = L.capstone_sampling(*greedy_case.args)
    assert L._sampling_verdict(greedy_case, expected, expected)[0]
    uncropped = expected.clone()
    uncropped[:, -1] = (uncropped[:, -1] + 1) % greedy_case.args[0]["vocab_size"]
    ok, detail = L._sampling_verdict(greedy_case, uncropped, expected)
    assert not ok and "idx[:, -max_len:]" in detail
    assert "prompt" in L._sampling_verdict(greedy_case, expected[:, 1:], expected)[1]
    assert "prompt is not kept" in L._sampling_verdict(greedy_case, expected.flip(1), expected)[1]
    assert "integer" in L._sampling_verdict(greedy_case, expected.float(), expected)[1]


def test_self_check_answers():
    def count(**changes):
        return sum(p.numel() for p in reference_gpt(dict(L.TRAIN_SIZES, vocab_size=84, **changes)).parameters())

    assert count() == 109_568
    assert L.capstone_params_added() == count(max_len=256, n_heads=8) - count() == 192 * 64
    assert count(n_heads=8) == count()  # the heads split d_model: the question's trap
    assert math.isclose(L.capstone_top_k_prob(), 1 / (1 + math.e), rel_tol=1e-6)
    assert L.capstone_diagnosis() == "c"
    assert math.isclose(L.capstone_lr_mid(), 0.0055)


@pytest.mark.parametrize("name", ["capstone_params_added", "capstone_diagnosis", "capstone_top_k_prob",
                                  "capstone_lr_mid", "peeking_verdict"])
def test_every_known_wrong_answer_is_wrong_and_gets_its_own_hint(name):
    ex = checks.get(name)
    table = ex.hints[0].table
    right = ex.reference()
    assert table and right not in table
    for wrong, why in table.items():
        outcome = checks.judge(ex, checks.Case("your answer"), wrong, right)
        assert outcome.status == checks.FAIL, (name, wrong)
        assert say(why) in outcome.line, (name, wrong, outcome.line)


def test_the_lesson_raises_the_grading_limits_and_only_for_itself():
    def metadata(stem: str) -> dict:
        return nbformat.read(ROOT / "exercises" / f"{stem}.ipynb", as_version=4).metadata
    base = Limits(cell_timeout=60, notebook_timeout=600)
    raised = base.for_lesson(metadata("11_build_your_gpt"), explicit=set())
    assert (raised.cell_timeout, raised.notebook_timeout) == (600, 1200)
    assert base.for_lesson(metadata("00_setup"), explicit=set()) == base
    asked = dataclasses.replace(base, cell_timeout=900)  # the instructor's --cell-timeout wins
    assert asked.for_lesson(metadata("11_build_your_gpt"), explicit={"cell_timeout"}).cell_timeout == 900
