"""What the exercise references share: one test of an answer against a built alternative, and the
builders of the wrong answers several lessons' hints look for (unscaled scores, the softmax over
the wrong axis, the mask applied after the softmax)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from course_tools.exercises.checks import is_letter
from course_tools.messages import _

ATOL, RTOL = 1e-4, 1e-3  # the tolerance of a hint's comparison; the checker's own is in checks.compare


def close(got: Any, alt: torch.Tensor | float) -> bool:
    """Whether ``got`` equals ``alt`` (a reference, or a known wrong answer) up to the hint tolerance.

    Tensors: same shape, floating point, equal to ATOL/RTOL (compared in float64, so bf16 answers
    work). Numbers: relative 1e-4, absolute 1e-6; a one-element tensor counts as its number.
    """
    if isinstance(alt, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.shape == alt.shape and got.is_floating_point()
                and bool(torch.allclose(got.double(), alt.double(), atol=ATOL, rtol=RTOL)))
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    return isinstance(got, (int, float)) and math.isclose(got, alt, rel_tol=1e-4, abs_tol=1e-6)


def attention_weights(q: torch.Tensor, k: torch.Tensor, *, scale: bool = True, softmax_dim: int = -1,
                      keep: torch.Tensor | None = None, mask_after_softmax: bool = False) -> torch.Tensor:
    """q (..., T, d_k), k (..., S, d_k) -> weights (..., T, S): softmax(q kᵀ / √d_k), or a usual mistake.

    ``keep`` is a boolean mask (True = may attend) set to -inf before the softmax, or with
    ``mask_after_softmax`` multiplied into the weights afterwards; ``scale=False`` leaves out √d_k;
    ``softmax_dim=-2`` normalises over the queries instead of the keys.
    """
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if keep is not None and not mask_after_softmax:
        scores = scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=softmax_dim)
    return weights * keep if keep is not None and mask_after_softmax else weights


def _same_answer(got: Any, wrong: Any) -> bool:
    if isinstance(wrong, (int, float)) and not isinstance(wrong, bool):
        return close(got, wrong)
    if isinstance(wrong, tuple) and isinstance(got, (tuple, list)):
        return tuple(got) == wrong
    return type(got) is type(wrong) and got == wrong


def near_wrong(table: dict[float, str], atol: float) -> Callable[[Any, Any, Any], str | None]:
    """The hint of a numeric question answered with a few digits: the misconception of the known wrong
    value within ``atol`` of the answer (``known_wrong`` compares to 1e-4, too close for a number the
    learner rounds)."""

    def hint(case: Any, got: Any, expected: Any) -> str | None:
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return None
        return next((why for wrong, why in table.items() if abs(got - wrong) <= atol), None)

    hint.table = table  # the known wrong answers, for the tests that try them
    return hint


def known_wrong(table: dict[Any, str]) -> Callable[[Any, Any, Any], str | None]:
    """The hint of a question: the misconception behind each known wrong answer (a number, a
    tuple, a letter), and the form of a letter written in capitals or with spaces."""

    def hint(case: Any, got: Any, expected: Any) -> str | None:
        form = got.strip().lower() if isinstance(got, str) else None
        # any letter written so, not only the right one: the hint must not single out the right letter
        letters = is_letter(expected) and is_letter(form)
        if isinstance(expected, str) and form not in (None, got) and (form == expected or letters):
            return _("write just the letter, in lower case: {got_strip_lower!r}", got_strip_lower=form)
        return next((why for wrong, why in table.items() if _same_answer(got, wrong)), None)

    hint.table = table  # the known wrong answers, for the tests that try them
    return hint
