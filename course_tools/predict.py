"""Predict, then run: compare a learner's written prediction with what a cell measured.

Not graded. The lesson stores its notebook with the prediction left at ``...``; ``reveal`` then
prints the measurement and the reason, so the stored output is the same in every run mode as long
as the measurement printed is (otherwise the cell starts with ``# NBVAL_IGNORE_OUTPUT``).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _plain(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.item() if x.numel() == 1 else tuple(x.tolist())
    if isinstance(x, (torch.Size, list)):
        return tuple(x)
    return x


def _matches(prediction: Any, measured: Any, tolerance: float) -> bool:
    if isinstance(measured, (int, float)) and not isinstance(measured, bool):
        return isinstance(prediction, (int, float)) and math.isclose(prediction, measured, abs_tol=tolerance)
    return prediction == measured


def judge(prediction: Any, measured: Any, tolerance: float = 0.0) -> bool:
    """Whether a written prediction matches the measurement (False if none was written)."""
    prediction, measured = _plain(prediction), _plain(measured)
    return prediction not in (Ellipsis, None) and _matches(prediction, measured, tolerance)


def reveal(prediction: Any, measured: Any, why: str, tolerance: float = 0.0) -> None:
    """Print the prediction against the measurement (numbers within ``tolerance`` count as right)
    and one sentence on why. Returns nothing, so the cell shows only the printed lines."""
    prediction, measured = _plain(prediction), _plain(measured)
    if prediction is Ellipsis or prediction is None:
        print(f"measured: {measured!r} (write your prediction first, then run this cell again)")
        print(f"why: {why}")
        return
    right = _matches(prediction, measured, tolerance)
    close = f" (within {tolerance:g})" if tolerance and right else ""
    verdict = "right" if right else "not what happened"
    print(f"your prediction {prediction!r}, measured {measured!r}: {verdict}{close}")
    print(f"why: {why}")
