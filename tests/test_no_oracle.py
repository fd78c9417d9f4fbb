"""Feedback is no oracle (issue 48, item 3): what a check prints about a wrong answer says what is wrong (a
shape, how many entries, where a text goes wrong, whether a number is too large) and never the expected
output, so a learner who reads the feedback of one wrong submission and answers the next with a lookup
table of what it printed still fails.

The attacks work on ``checks.run``, which prints the same lines as ``course grade`` (the grader judges each
case with ``checks.judge``): one wrong answer with one seed, then a lookup table checked with another seed,
as the grader draws a fresh one per submission. Lesson 11's exercises (the capstone) are tested in
``test_lesson11.py``.
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import pytest
import torch
from test_korean_feedback import _perturbed

from course_tools.exercises import checks, references  # noqa: F401  (registers every exercise)
from course_tools.messages import say

QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
FIRST_SEED, GRADER_SEED = 0, 987_654


def printed(report: str) -> dict[str, list[Any]]:
    """What the learner reads in a report, by case: every quoted string (as the value it spells) and
    every number after the label."""
    seen: dict[str, list[Any]] = {}
    for line in report.splitlines()[1:]:
        label, _, detail = line.strip()[2:].partition(": ")
        values: list[Any] = []
        for text in QUOTED.findall(detail):
            try:
                values.append(ast.literal_eval(text))
            except (ValueError, SyntaxError):
                continue
        values += [float(n) for n in NUMBER.findall(detail)]
        seen[label] = values
    return seen


def lookup_table(name: str, wrong: Any) -> Any:
    """Read the feedback of one wrong submission; answer every case with the longest text it printed for
    that case's label (a prompt), else the largest number (an expected count or loss)."""
    seen = printed(checks.run(name, wrong, seed=FIRST_SEED).report())

    def answer(*args, **kwargs):
        label = next(case.label for case in checks.draw(name, FIRST_SEED) if case.args == args)
        values = seen.get(say(label), [])
        texts = [v for v in values if isinstance(v, str)]
        if texts:
            return max(texts, key=len)
        numbers = [v for v in values if isinstance(v, float)]
        return max(numbers) if numbers else None

    return answer


def lookup_by_label(name: str, wrong: Any) -> Any:
    """The same table, keyed by the position of the case (the labels are the same on every draw)."""
    report = checks.run(name, wrong, seed=FIRST_SEED).report()
    seen = list(printed(report).values())
    calls = iter(range(len(seen)))

    def answer(*args, **kwargs):
        values = seen[next(calls) % len(seen)]
        texts = [v for v in values if isinstance(v, str)]
        return max(texts, key=len) if texts else None

    return answer


def test_chatml_prompts_cannot_be_read_off_one_feedback():
    wrong = lambda messages: "<|im_start|>"  # noqa: E731  (a first try that gets nothing right)
    report = checks.run("chatml_prompt", wrong, seed=FIRST_SEED).report()
    expected = [checks.call(checks.get("chatml_prompt").reference, case) for case in checks.draw("chatml_prompt",
                                                                                               FIRST_SEED)]
    assert all(prompt not in report and repr(prompt) not in report for prompt in expected), report
    assert "your text stops too early" in report
    for seed in (FIRST_SEED, GRADER_SEED):  # the same seed again, and the grader's
        assert checks.run("chatml_prompt", lookup_by_label("chatml_prompt", wrong), seed=seed).status != checks.PASS


def test_chatml_prompts_are_drawn_per_seed():
    prompts = {seed: [str(case.args) for case in checks.draw("chatml_prompt", seed)] for seed in range(20)}
    assert len({tuple(p) for p in prompts.values()}) >= 15  # a table of some seeds' prompts misses the others
    assert [c.label for c in checks.draw("chatml_prompt", 1)] == [c.label for c in checks.draw("chatml_prompt", 2)]


@pytest.mark.parametrize("name", ["gpt_param_count", "llama_block_params", "bits_per_byte",
                                  "attention_parameter_count"])
def test_fixed_cases_print_no_expected_number(name):
    """Fixed cases (GPT-2 small, ...) of numbers: a lookup table of what one wrong answer's feedback printed
    fails on the same cases."""
    wrong = lambda *args: 1  # noqa: E731
    table = lookup_table(name, wrong)
    assert checks.run(name, table, seed=FIRST_SEED).passed == 0
    assert "too small" in checks.run(name, wrong, seed=FIRST_SEED).report()


def test_dpo_loss_feedback_gives_neither_the_value_nor_the_code():
    ex = checks.get("dpo_loss")
    wrong = lambda pc, pr, rc, rr, beta: torch.zeros(())  # noqa: E731
    report = checks.run("dpo_loss", wrong, seed=FIRST_SEED).report()
    for case in checks.draw("dpo_loss", FIRST_SEED):
        assert f"{float(checks.call(ex.reference, case)):.3g}" not in report, report
    assert code_answers("dpo_loss", report) == []


def code_answers(name: str, report: str) -> list[str]:
    """The hints of ``report`` whose text after "one way:" runs as the answer's body and passes the check."""
    ex = checks.get(name)
    names = list(inspect.signature(ex.reference).parameters)
    params = ", ".join(names)
    short = "".join(f"    {''.join(w[0] for w in n.split('_'))} = {n}\n" for n in names if "_" in n)  # pc, rr
    found = []
    for hint in re.findall(r"one way: (.*)$", report, flags=re.MULTILINE):
        statements = [part.strip() for part in hint.split(";")]
        if not statements[-1].startswith("return"):
            statements[-1] = "return " + statements[-1]
        body = "\n    ".join(statements)
        source = f"def answer({params}):\n{short}    {body}\n"
        scope: dict = {"torch": torch, "F": torch.nn.functional}
        try:
            exec(compile(source, "<hint>", "exec"), scope)
            if checks.run(name, scope["answer"], seed=GRADER_SEED).status == checks.PASS:
                found.append(hint)
        except Exception:
            continue
    return found


def _shown(value: Any) -> list[str]:
    """How an expected value of a non-trivial case would read in a report (a bool, None, a short text or a
    small integer is trivial: it can be guessed)."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, float) and value in (0.0, 1.0):  # a verifiable reward (lesson 14): two values, guessed
        return []  # as a bool is, and "0" or "1" is in nearly every line, so the substring test says nothing
    if isinstance(value, str):
        return [value, repr(value), repr(value)[1:-1]] if len(value) >= 4 else []
    if isinstance(value, int):
        return [str(value)] if abs(value) >= 10 else []
    if isinstance(value, float):
        return [f"{value:.3g}", f"{value:.4f}"]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        return _shown(value.item())
    if isinstance(value, (list, tuple)):
        return [text for v in value for text in _shown(v)]
    return []


WRONG = {"perturbed": None, "none": lambda *a, **k: None, "zero": lambda *a, **k: 0, "text": lambda *a, **k: "x"}
FUNCTIONS = sorted(name for name, ex in checks.REGISTRY.items()
                   if not ex.is_question and not ex.reference.__module__.endswith("lesson11"))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_no_feedback_prints_the_expected_output(name):
    """Every exercise of lessons 00-10 and 12-15: four wrong answers (the reference's output perturbed, None,
    0, a string) get feedback that contains no expected output of a case (beyond what its label says)."""
    ex = checks.get(name)
    leaks = []
    for kind, wrong in WRONG.items():
        fn = wrong or (lambda *a, **k: _perturbed(ex.reference(*a, **k)))
        result = checks.run(name, fn, seed=FIRST_SEED)
        for case, outcome in zip(checks.draw(name, FIRST_SEED), result.outcomes, strict=True):
            expected = checks.call(ex.reference, case)
            leaks += [f"{kind}: {outcome.line}" for text in _shown(expected)
                      if text in outcome.line and text not in case.label]
    assert leaks == []


@pytest.mark.parametrize("name", FUNCTIONS)
def test_no_hint_is_the_answer_as_code(name):
    ex = checks.get(name)
    wrong = lambda *a, **k: _perturbed(ex.reference(*a, **k))  # noqa: E731
    assert code_answers(name, checks.run(name, wrong, seed=FIRST_SEED).report()) == []
