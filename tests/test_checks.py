"""The checks that exercise cells use: verdicts, one-line messages, hints, strict mode."""

import os
import subprocess
import sys

import pytest
import torch
from einops import rearrange

from course_tools.exercises import checks
from course_tools.exercises.checks import PASS, Case, check, compare


def test_reference_passes_every_registered_exercise(monkeypatch):
    from course_tools.exercises import bare_torch, references  # noqa: F401

    # the from-the-metal references are PyTorch's own layers: run them without the learner's guard
    # (tests/test_metal_track.py runs the solution's pieces under it)
    monkeypatch.setattr(bare_torch, "guarded", lambda name: False)
    assert checks.REGISTRY
    checks.LAST.clear()  # no earlier test's failing capstone stage blocks the ones that build on it
    for name, ex in checks.REGISTRY.items():
        if name in ("capstone_training", "metal_training"):  # the reference is the threshold: the verdict needs
            continue  # weights trained for 500 steps (the solution's check cells do that under nbval)
        if name in ("lora_injection", "sft_training", "dpo_training"):  # the verdict judges what the notebook's
            continue  # helper reads off the learner's model; tests/test_lesson13.py passes the solution's through it
        result = checks.run(name, ex.reference, seed=123)
        assert result.status == PASS, result.report()


def test_fresh_seeds_give_fresh_inputs_with_stable_labels():
    a, b = checks.draw("flatten_tokens", 1), checks.draw("flatten_tokens", 2)
    assert [c.label for c in a] == [c.label for c in b]
    assert not torch.equal(a[-1].args[0], b[-1].args[0])


def test_not_attempted_is_reported_not_raised(capsys):
    def stub(x):
        raise NotImplementedError()

    check.flatten_tokens(stub)
    out = capsys.readouterr().out
    assert out.strip() == "flatten_tokens: not attempted yet (the function still raises NotImplementedError)"


def test_wrong_answer_gets_one_line_per_case_with_a_hint(capsys):
    check.pairwise_dots(lambda a, b: torch.einsum("btd,bsd->bst", a, b), seed=0)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "pairwise_dots: 1/3 cases passed (some cases failed)"
    assert len(lines) == 4
    assert "expected shape (2, 3, 5), got (2, 5, 3)" in lines[2] and "hint:" in lines[2]


def test_exceptions_become_one_line(capsys):
    check.mean_over_time(lambda x: x.sum() / 0 if x.numel() > 1 else 1 / 0)
    out = capsys.readouterr().out
    assert "raised ZeroDivisionError: division by zero" in out and "Traceback" not in out


def test_answers_cannot_corrupt_the_reference_inputs():
    def vandal(x):
        x.zero_()
        return rearrange(x, "b t d -> (b t) d")

    result = checks.run("flatten_tokens", vandal, seed=5)
    assert result.passed == 0, "zeroing the input must not zero the reference's copy"


def test_strict_mode_raises_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setattr(checks, "STRICT", True)
    with pytest.raises(checks.CheckFailed) as info:
        check.flatten_tokens(lambda x: x)
    assert info.value._render_traceback_() == [f"CheckFailed: {info.value}"]
    check.flatten_tokens(checks.get("flatten_tokens").reference)  # a pass raises nothing


UNDER_NBGRADER = """
import os
from course_tools.exercises.checks import check, CheckFailed
os.environ["COURSE_CHECKS_STRICT"] = "0"  # what an answer cell could do
os.environ.pop("NBGRADER_EXECUTION", None)
try:
    check.flatten_tokens(lambda x: x)
except CheckFailed:
    print("raised")
"""


@pytest.mark.parametrize("env, raises", [
    ({"NBGRADER_EXECUTION": "autograde"}, True), ({"NBGRADER_EXECUTION": "validate", "NBGRADER_VALIDATING": "1"}, True),
    ({"COURSE_CHECKS_STRICT": "1"}, True), ({}, False), ({"NBGRADER_EXECUTION": "autograde",
                                                          "COURSE_CHECKS_STRICT": "0"}, True),
])
def test_nbgrader_is_detected_once_at_import_and_cannot_be_switched_off(env, raises):
    clean = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "COURSE_CHECKS_STRICT")}
    done = subprocess.run([sys.executable, "-c", UNDER_NBGRADER], env=clean | env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert ("raised" in done.stdout.splitlines()) is raises, done.stdout


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="flatten_tokens"):
        check.no_such_exercise  # noqa: B018  (the attribute access itself raises)


@pytest.mark.parametrize("got, expected, ok, text", [
    (torch.ones(2, 3), torch.ones(2, 3), True, "max error within"),
    (torch.ones(3, 2), torch.ones(2, 3), False, "expected shape (2, 3), got (3, 2)"),
    (torch.ones(2) + 0.1, torch.ones(2), False, "max error 0.1"),
    ([1, 2], torch.ones(2), False, "expected a tensor of shape (2,), got list"),
    (torch.tensor([True, False]), torch.tensor([True, True]), False, "1 of 2 entries differ"),
    (torch.tensor([float("nan")]), torch.tensor([1.0]), False, "NaN"),
    ((torch.ones(1), 2), (torch.ones(1), 3), False, "item 1: got 2: too small"),
    (torch.tensor(2.5), torch.tensor(1.0), False, "shape () ok, but got 2.5: too large"),
    (4.0, 3.0, False, "got 4: too large"),
    (3.5, 3, False, "got 3.5, not a whole number"),
    (0.30000001, 0.3, True, "within"),
    ("a", "b", False, "your text goes wrong at character 0: '' is followed by 'a'"),
    ("<|im_start|>user", "<|im_start|>system", False, "at character 12: '<|im_start|>' is followed by 'user'"),
    ("<|im_start|>", "<|im_start|>system", False, "stops too early: after character 12, which ends '<|im_start|>'"),
    ("x", 7, False, "expected a number, got str"),
    (True, False, False, "expected False, got True"),
])
def test_compare(got, expected, ok, text):
    verdict, detail = compare(got, expected, atol=1e-5, rtol=1e-4)
    assert verdict is ok and text in detail, detail


def test_case_labels_are_strings():
    for name in checks.REGISTRY:
        for case in checks.draw(name, 0):
            assert isinstance(case, Case) and case.label and "tensor(" not in case.label


def test_a_question_is_checked_on_its_value_with_a_hint_and_no_giveaway(capsys):
    check.cross_scores_shape((2, 3, 7, 5))
    out = capsys.readouterr().out
    assert out.startswith("cross_scores_shape: not right yet\n  ✗ your answer: (2, 3, 7, 5) is not the answer")
    assert "(2, 3, 5, 7)" not in out, "a wrong answer must not be told the right one"
    check.cross_scores_shape(torch.Size([2, 3, 5, 7]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "cross_scores_shape: right" and lines[2].startswith("  why: ")


def test_a_question_left_at_its_placeholder_is_not_answered(capsys):
    check.mask_for_pattern(...)
    assert capsys.readouterr().out.strip() == "mask_for_pattern: not answered yet (replace the ... by your answer)"
    assert checks.run("mask_for_pattern", lambda: ...).status == checks.NOT_ATTEMPTED


def test_letters_and_numbers_of_questions(capsys):
    check.mask_for_pattern("C")  # the right letter in upper case
    assert "write just the letter, in lower case: 'c'" in capsys.readouterr().out
    assert checks.run("uniform_weight", lambda: 0.06251).status == PASS  # numeric answers have a tolerance
    assert checks.run("uniform_weight", lambda: 0.2).status == checks.FAIL


@pytest.fixture
def fresh_kernel():
    """No multiple-choice answer committed yet (``checks.FIRST`` lives as long as the kernel)."""
    checks.FIRST.clear()
    yield
    checks.FIRST.clear()


def wrong_letters(name: str) -> dict[str, str]:
    """A multiple-choice question's wrong options and the hint of each."""
    from course_tools.messages import say

    return {wrong: say(why) for wrong, why in checks.get(name).hints[0].table.items()}


def test_a_multiple_choice_retry_lists_no_other_options_hint(fresh_kernel, capsys):
    """Issue 45 item 6: trying every letter teaches nothing the first answer's feedback did not. The first
    answer gets its own hint and then the full explanation; later answers get right or not right only."""
    ex = checks.get("mask_for_pattern")
    hints = wrong_letters("mask_for_pattern")
    first, *others = sorted(hints)
    check.mask_for_pattern(first)
    out = capsys.readouterr().out
    assert hints[first] in out and "why: " + ex.explain in out and "'a', is recorded" in out
    for letter in [*others, ex.reference()]:
        check.mask_for_pattern(letter)
        out = capsys.readouterr().out
        assert not any(hint in out for hint in hints.values()), out
        assert "why:" not in out and "hint" not in out and "your first answer, 'a', is the one that counts" in out


def test_a_multiple_choice_check_counts_the_first_committed_answer(fresh_kernel, monkeypatch, capsys):
    monkeypatch.setattr(checks, "STRICT", True)
    with pytest.raises(checks.CheckFailed):
        check.mask_for_pattern("a")
    with pytest.raises(checks.CheckFailed, match="your first answer, 'a', is the one that counts"):
        check.mask_for_pattern("c")  # right, but not first
    checks.FIRST.clear()  # another kernel: a right first answer passes, and a later wrong one does not undo it
    check.mask_for_pattern("c")
    check.mask_for_pattern("a")


def test_a_right_first_answer_reads_as_before(fresh_kernel, capsys):
    """The stored outputs of every solutions notebook's self-checks stay as they are."""
    check.mask_for_pattern("c")
    assert capsys.readouterr().out == checks.run("mask_for_pattern", lambda: "c").report() + "\n"


def test_a_capital_letter_is_no_answer_and_singles_out_no_option(fresh_kernel, capsys):
    """Only the right letter in capitals used to get the lower-case hint: a one-query oracle."""
    for letter in "ABCD":
        check.mask_for_pattern(letter)
        assert capsys.readouterr().out.strip() == \
            f"mask_for_pattern: write just the letter, in lower case: {letter.lower()!r}"
        ex = checks.get("mask_for_pattern")
        line = checks.judge(ex, checks.Case("your answer"), letter, ex.reference()).line
        assert "write just the letter" in line  # the grader's feedback too, for every letter
    assert not checks.FIRST


def test_the_multiple_choice_messages_are_korean_too(fresh_kernel, capsys):
    from course_tools import messages

    messages.use("ko")
    try:
        check.mask_for_pattern("a")
        check.mask_for_pattern("b")
        out = capsys.readouterr().out
    finally:
        messages.use("en")
    assert "첫 답 'a'" in out and "your first answer" not in out


def test_explanations_are_printed_only_on_a_pass():
    ex = checks.get("norm_axis")
    assert ex.is_question and ex.explain
    assert checks.run("norm_axis", lambda: "c").report().endswith("why: " + ex.explain)
    assert "why:" not in checks.run("norm_axis", lambda: "a").report()
    assert not checks.get("flatten_tokens").is_question


@pytest.mark.parametrize("got, expected", [
    ("<|im_start|>user", "<|im_start|>system\nYou are a helpful AI assistant"), (1, 124_439_808),
    (0.5, 2.1640425613334453),
    (torch.tensor(0.0), torch.tensor(0.27734)), ([256, 1], [263, 1]),
])
def test_a_wrong_answer_is_not_told_the_expected_value(got, expected):
    ok, detail = compare(got, expected, atol=1e-5, rtol=1e-4)
    shown = {str(expected), repr(expected), "system", "124439808", "2.16", "0.277", "263"}
    assert not ok and not any(text in detail for text in shown), detail
