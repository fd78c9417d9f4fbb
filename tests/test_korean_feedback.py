"""Korean feedback, whole: a wrong answer to any exercise or question of lessons 00-15, checked with
the messages in Korean, gets feedback with no English words outside code and no particle left as a
pair ("은(는)", "(으)로").

What counts as code or a value, not as English (``english_words``):

- a span in backticks or quotes (a string's repr: the learner's answer, the reference's text);
- a word joined to code by ``_``, ``.``, a digit, ``(``, ``[`` or ``=`` (``W_Q``, ``nn.GELU``, ``top_k=1``,
  ``d_k``, ``bf16``, ``f(cdf, u)``), or standing next to an operator (``lr / 2``, ``total = ...``, ``woman − man``);
- a single letter (``x``, ``T``, ``V``); a word, or a hyphenated compound, with a capital after its
  first letter (``GPT``, ``NaN``, ``LayerNorm``, ``pre-LN``);
- the exercise's own names: its name, its function's and the reference's parameters (``memory``, ``ids``);
- ``CODE_WORDS``: Python's and PyTorch's names and the units that the Korean lessons write in Latin letters.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import pytest
import torch

from course_tools import messages
from course_tools.exercises import checks, references  # noqa: F401  (registers every exercise)

# Python's and PyTorch's names, math's functions and units, that Korean text keeps as they are
CODE_WORDS = {"True", "False", "None", "inf", "nan", "dtype", "int", "float", "bool", "str", "tuple", "list",
              "dict", "softmax", "logits", "einsum", "rearrange", "ln", "log", "exp", "sin", "cos", "mod",
              "nats", "bits"}
QUOTED = re.compile(r"`[^`]*`|'[^'\n]*'|\"[^\"\n]*\"")
OPERATOR = r"[=+\-*/@·−×<>]"
WORD = re.compile(rf"(?<![\w.(\[])(?<!{OPERATOR} )(?<!{OPERATOR})[A-Za-z][A-Za-z-]*(?![\w.(\[=])(?! ?{OPERATOR})")
PAIRED = re.compile(r"\((?:은|는|이|가|을|를|와|과|으)\)")


def english_words(text: str, names: frozenset[str] = frozenset()) -> list[str]:
    """The English words of ``text`` by the rule above; ``names``: the exercise's own."""
    text = QUOTED.sub(" ", text)
    words = []
    for m in WORD.finditer(text):
        word = m.group().strip("-")
        if len(word) <= 1 or any(c.isupper() for c in word[1:]) or word in CODE_WORDS | names:
            continue
        words.append(word)
    return words


def particle_pairs(text: str) -> list[str]:
    """Particles left as a pair ("을(를)", "(으)로") or as a bare alternative ("(는)")."""
    return PAIRED.findall(text)


def own_names(name: str) -> frozenset[str]:
    """An exercise's name, its function's and its reference's parameters: code in its feedback."""
    ex = checks.get(name)
    return frozenset({name, ex.function, *inspect.signature(ex.reference).parameters})


def _perturbed(value: Any) -> Any:
    """A wrong answer of the same kind as ``value``: every number moved, the shapes kept."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            return ~value
        if value.is_floating_point():
            return value + 0.5 + value.abs()
        return value + 1
    if isinstance(value, tuple):  # the last item only: a pair that must differ in one place (no peeking)
        return (*value[:-1], _perturbed(value[-1])) if value else value
    if isinstance(value, list):
        return [_perturbed(v) for v in value]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 7
    if isinstance(value, float):
        return value * 1.5 + 1.0 if math.isfinite(value) else 0.0
    if isinstance(value, str):
        return "z" if value != "z" else "y"
    return None


def wrong_answer(ex: checks.Exercise) -> Any:
    """One wrong answer: a question's first known wrong answer, else the reference's output perturbed."""
    if ex.is_question:
        for hint in ex.hints:
            table = getattr(hint, "table", None)
            if table:
                return next(iter(table))
        return _perturbed(ex.reference())
    return lambda *args, **kwargs: _perturbed(ex.reference(*args, **kwargs))


def korean_report(name: str) -> str:
    ex = checks.get(name)
    answer = wrong_answer(ex)
    fn = answer if callable(answer) else checks.returning(answer)
    checks.LAST.clear()  # each exercise's own feedback, not that of a capstone stage blocked by an earlier one
    with messages.speaking("ko"):
        return checks.run(name, fn, seed=0).report()


def lesson_of(name: str) -> str:
    module = checks.get(name).reference.__module__
    return module.rsplit("lesson", 1)[-1]


NAMES = sorted(checks.REGISTRY)  # capstone_training too: a wrong answer is refused before any training
LESSONS = sorted({lesson_of(n) for n in NAMES})


def test_the_rule_tells_english_from_code():
    assert english_words("x of shape (B=2, T=3)") == ["of", "shape"]
    assert english_words("모양 (2, 3)의 x: `some code` W_Q, nn.GELU(), top_k=1, GPT, NaN, LayerNorm, bf16") == []
    assert english_words("d_model=8: all 3 items match") == ["all", "items", "match"]
    assert english_words("기대한 값 'You are', 힌트: total = scores + lr / 2, pre-LN, 'woman' − man") == []
    assert english_words("memory (B=1, S=2), some beams done", frozenset({"memory"})) == ["some", "beams", "done"]
    assert particle_pairs("Block을(를) 확인 (으)로 (는)") == ["(를)", "(으)", "(는)"]
    assert particle_pairs("위치 0..4는, 항목 (2, 3)을 (B=1)") == []


def test_every_lesson_has_exercises():
    assert LESSONS == [f"{n:02d}" for n in range(16)]


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_wrong_answer_gets_korean_feedback(lesson, capsys):
    reports = {name: korean_report(name) for name in NAMES if lesson_of(name) == lesson}
    problems = []
    for name, report in reports.items():
        assert "✗" in report or "맞지 않" in report, f"{name}: the wrong answer passed:\n{report}"
        for line in report.splitlines():
            if english_words(line, own_names(name)) or particle_pairs(line):
                problems.append(f"{name}: {english_words(line, own_names(name))} {particle_pairs(line)} in: {line}")
    with capsys.disabled():  # one report per lesson, for the record
        name = next((n for n in sorted(reports) if not checks.get(n).is_question), sorted(reports)[0])
        print(f"\n--- lesson {lesson}, {name}, a wrong answer:\n{reports[name]}")
    assert problems == []
