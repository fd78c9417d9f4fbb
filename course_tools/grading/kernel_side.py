"""Runs inside the learner's kernel while grading: call the learner's function on the grader's
cases and save the plain outputs for the grader to judge.

Nothing here decides a score. The learner's code shares this kernel and may change anything in
it; the grader treats what comes back as untrusted data (``course_tools.grading.channel``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from course_tools.exercises import checks


def plain(value: Any) -> Any:
    """A value that ``torch.load(weights_only=True)`` can read: tensors, numbers, strings,
    lists, tuples and dicts of them (NumPy values become tensors or Python numbers)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


MESSAGE_CHARS = 300  # of an error's one line, kept in the record the grader reads


def one_case(fn: Callable, args: tuple, kwargs: dict) -> dict:
    """The learner's answer to one case as a result record, by the notebook check's own rule
    (``checks.attempt``): ok with its value, not attempted, or an error with its one line."""
    status, value = checks.attempt(fn, args, kwargs)
    if status == checks.ATTEMPT_OK:
        try:  # e.g. a NumPy array of objects: that case is an error, the exercise's other cases still count
            return {"status": status, "value": plain(value)}
        except Exception as exc:
            status, value = checks.ATTEMPT_ERROR, checks.error_line(exc)
    if status == checks.ATTEMPT_ERROR:
        return {"status": status, "message": value[:MESSAGE_CHARS]}
    return {"status": status}


class Answerer:
    """``_course_answer(name, function)`` in the rebuilt notebook: answer every case of one
    exercise with ``namespace[function]`` and save the records to ``jobdir/out/name.pt``."""

    def __init__(self, jobdir: str, namespace: dict) -> None:
        self.jobdir = jobdir
        self.namespace = namespace

    def __call__(self, name: str, function: str) -> None:
        cases = torch.load(os.path.join(self.jobdir, "inputs", name + ".pt"), weights_only=True)
        fn = self.namespace.get(function)
        if fn is not None and not callable(fn):  # a question: the answer is the variable's value
            fn = checks.returning(fn)
        if not callable(fn):
            results: dict = {"kind": "missing", "function": function}
        else:
            try:
                results = {"kind": "cases", "results": [one_case(fn, args, kwargs) for args, kwargs in cases]}
            except KeyboardInterrupt:  # the worker interrupts a cell that runs past its time limit
                results = {"kind": "timeout"}
        torch.save(results, os.path.join(self.jobdir, "out", name + ".pt"))
