"""The fixtures the unit tests share: exercise checks run with a fixed seed, small seeded models, the lesson
corpus, and readers of ``course grade``'s result rows.

The session's environment (smoke mode, offline hubs, one thread per worker, the retried kernel start) is set
by the ``conftest.py`` at the repository root, which the notebook tests need too. The helpers here are
fixtures that return a function, so a test asks for one by name and a test file never imports another's.
"""

from collections.abc import Callable
from typing import Any

import pytest
import torch

from course_tools.exercises import checks
from course_utils import data
from course_utils.gpt import GPT, GPTConfig

# The sizes of the tiny GPT the tests build: 2 layers, 4 heads of 8 dimensions, 40 tokens, 32 positions.
TINY_GPT = {"vocab_size": 40, "max_len": 32, "n_layers": 2, "n_heads": 4, "d_model": 32}
# The seed of every exercise check a test runs (a notebook's check draws a fresh one each time).
CHECK_SEED = 0


@pytest.fixture
def tiny_gpt() -> Callable[..., GPT]:
    """``tiny_gpt(seed=0, **changes)``: a GPT of ``TINY_GPT``'s sizes with ``changes`` to its config, its
    weights drawn after ``torch.manual_seed(seed)`` (same seed, same model), in eval mode (no dropout)."""

    def build(seed: int = 0, **changes: Any) -> GPT:
        torch.manual_seed(seed)
        return GPT(GPTConfig(**TINY_GPT | changes)).eval()

    return build


@pytest.fixture
def run_exercise() -> Callable[[str, Callable], checks.CheckResult]:
    """``run_exercise(name, answer)``: exercise ``name``'s check of ``answer`` on the cases drawn with
    ``CHECK_SEED``, as a ``CheckResult`` (``.status``, ``.report()`` with every case's line and hint)."""

    def run(name: str, answer: Callable) -> checks.CheckResult:
        return checks.run(name, answer, seed=CHECK_SEED)

    return run


@pytest.fixture
def first_hint(run_exercise) -> Callable[[str, Callable], str]:
    """``first_hint(name, answer)``: the hint of the first case ``answer`` fails (the sentence after
    "hint: "); fails the test if no case carries one."""

    def hint(name: str, answer: Callable) -> str:
        lines = [o.line for o in run_exercise(name, answer).outcomes if "hint:" in o.line]
        assert lines, f"{name}: no failing case carries a hint"
        return lines[0].split("hint: ", 1)[1]

    return hint


def _function_exercises(row: dict, field: str) -> dict[str, Any]:
    """``field`` of each function exercise in a results row (questions, experiments and written answers
    left out: the grading tests submit functions)."""
    return {e["name"]: e[field] for e in row["exercises"]
            if e["name"] in checks.REGISTRY and not checks.REGISTRY[e["name"]].is_question}


@pytest.fixture
def statuses() -> Callable[[dict], dict[str, str]]:
    """``statuses(row)``: exercise name -> status ("pass", "fail", "timeout", "error: ...") of a row of
    ``course grade``'s results.json, for its function exercises."""
    return lambda row: _function_exercises(row, "status")


@pytest.fixture
def scores() -> Callable[[dict], dict[str, float]]:
    """``scores(row)``: exercise name -> points of a row of ``course grade``'s results.json, for its
    function exercises."""
    return lambda row: _function_exercises(row, "points")


@pytest.fixture
def leaked(statuses) -> Callable[[dict, str], str]:
    """``leaked(row, name)``: what a reporter answer (an answer that raises ``RuntimeError("seen " + what)``)
    saw inside the sandbox, read from its status line."""

    def seen(row: dict, name: str) -> str:
        status = statuses(row)[name]
        assert "RuntimeError: seen " in status, status
        return status.split("RuntimeError: seen ", 1)[1]

    return seen


@pytest.fixture(scope="session")
def corpus() -> str:
    """The course's pinned Shakespeare text (``course_utils.data.shakespeare``), read once per session."""
    return data.shakespeare()
