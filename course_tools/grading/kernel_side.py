"""Runs inside the learner's kernel while grading: call the learner's function on the grader's
cases and save the plain outputs for the grader to judge.

Nothing here decides a score. The learner's code shares this kernel and may change anything in
it; the grader treats what comes back as untrusted data (``course_tools.grading.results``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from course_tools.exercises import bare_torch, checks
from course_tools.grading import results

MESSAGE_CHARS = 300  # of an error's one line, kept in the record the grader reads


def one_case(fn: Callable, args: tuple, kwargs: dict) -> dict:
    """The learner's answer to one case as a result record, by the notebook check's own rule
    (``checks.attempt``): ok with its value, not attempted, or an error with its one line."""
    with checks.optimizer_trace() as steps:  # what a training loop did, for the exercises judged on it
        status, value = checks.attempt(fn, args, kwargs)
    if status == checks.ATTEMPT_OK:
        try:  # e.g. a NumPy array of objects: that case is an error, the exercise's other cases still count
            record = {"status": status, "value": results.plain(value)}
            return record | {"trace": checks.trace_tensor(steps)} if steps else record
        except Exception as exc:
            status, value = checks.ATTEMPT_ERROR, checks.error_line(exc)
    if status == checks.ATTEMPT_ERROR:
        return {"status": status, "message": value[:MESSAGE_CHARS]}
    return {"status": status}


class Answerer:
    """``_course_answer(name, function)`` in the rebuilt notebook: answer every case of one
    exercise with ``namespace[function]`` and save the records to ``jobdir/out/NAME.safetensors``."""

    def __init__(self, jobdir: str, namespace: dict) -> None:
        self.jobdir = jobdir
        self.namespace = namespace

    def __call__(self, name: str, function: str) -> None:
        with open(os.path.join(self.jobdir, "inputs", results.file_name(name)), "rb") as f:
            cases = results.decode(f.read(), results.UNCAPPED)  # the grader's own file
        fn = self.namespace.get(function)
        if fn is not None and not callable(fn):  # a question: the answer is the variable's value
            fn = checks.returning(fn)
        if not callable(fn):
            answers: dict = {"kind": "missing", "function": function}
        else:
            try:
                with bare_torch.guard() if bare_torch.guarded(name) else contextlib.nullcontext():
                    answers = {"kind": "cases", "results": [one_case(fn, args, kwargs) for args, kwargs in cases]}
            except KeyboardInterrupt:  # the worker interrupts a cell that runs past its time limit
                answers = {"kind": "timeout"}
            except bare_torch.ForbiddenOnMetal as exc:  # the guard was undone: no case of it counts
                error = {"status": checks.ATTEMPT_ERROR, "message": checks.error_line(exc)[:MESSAGE_CHARS]}
                answers = {"kind": "cases", "results": [error for _ in cases]}
        with open(os.path.join(self.jobdir, "out", results.file_name(name)), "wb") as f:
            f.write(results.encode(answers))
