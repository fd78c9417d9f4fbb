"""Checks for exercises: run a learner's function on fresh random cases against the reference.

Each exercise is registered once (in ``course_tools.exercises.references``) with a reference function, a
case generator and optional hints that name common mistakes. A check cell calls
``check.<name>(fn)`` and gets one line per case. The grader uses the same pieces, but splits them
across processes: cases are drawn and compared in the grader, the learner's kernel only computes.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from course_tools.exercises import bare_torch
from course_tools.messages import N_, _, say

# N_: the feedback shows them translated (course_tools.messages); the values stay English
PASS, FAIL, NOT_ATTEMPTED, ERROR = N_("pass"), N_("fail"), N_("not attempted"), N_("error")

STRICT = os.environ.get("NBGRADER_EXECUTION") in ("autograde", "validate") or \
    os.environ.get("COURSE_CHECKS_STRICT") == "1"
"""Whether failing checks raise. Decided once, when this module is first imported: nbgrader sets
``NBGRADER_EXECUTION`` while it autogrades or validates, so check cells raise there without any
set-up, and an answer cell that changes the environment later changes nothing.
``COURSE_CHECKS_STRICT=1`` turns it on elsewhere; nothing turns it off."""


@dataclass(frozen=True)
class Case:
    """One input to try: a human label (shapes, options) and the arguments."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


Hint = Callable[[Case, Any, Any], "str | None"]
"""A hint looks at (case, got, expected) and returns a sentence naming a likely mistake, or None."""


@dataclass
class Exercise:
    """An exercise: the reference, how to draw cases, and how strict to be."""

    name: str
    reference: Callable
    cases: Callable[[torch.Generator], list[Case]]
    function: str = ""
    atol: float = 1e-5
    rtol: float = 1e-4
    hints: Sequence[Hint] = ()
    explain: str = ""  # one line printed under a passing check: why the answer is right
    verdict: Callable[[Case, Any, Any], tuple[bool, str]] | None = None
    """Judges (case, got, expected) -> (ok, detail) instead of comparing got with expected; for answers
    the checker must evaluate itself (a trained model's weights: their validation loss)."""
    requires: dict[str, str] = field(default_factory=dict)
    """Exercises this one builds on -> why it means nothing without them: while one of them fails, this
    one scores nothing and its feedback says so first (the capstone's stages judge one model)."""
    traced: bool = False
    """The answer is judged with its optimiser trace: the verdict gets ``(value, trace)``, ``trace`` a
    (steps, 2) tensor of each ``optimizer.step()``'s learning rate and global gradient norm."""

    def __post_init__(self) -> None:
        self.function = self.function or self.name

    @property
    def is_question(self) -> bool:
        """Whether the answer is a value (registered with ``question``), not a function."""
        return self.cases is _your_answer


REGISTRY: dict[str, Exercise] = {}


def exercise(name: str | None = None, *, cases: Callable[[torch.Generator], list[Case]],
             function: str = "", atol: float = 1e-5, rtol: float = 1e-4,
             hints: Sequence[Hint] = (), explain: str = "",
             verdict: Callable[[Case, Any, Any], tuple[bool, str]] | None = None,
             requires: dict[str, str] | None = None, traced: bool = False) -> Callable[[Callable], Callable]:
    """Decorator that registers a reference implementation as an exercise."""

    def register(reference: Callable) -> Callable:
        key = name or reference.__name__
        if key in REGISTRY:
            raise ValueError(f"exercise {key!r} is registered twice")
        REGISTRY[key] = Exercise(key, reference, cases, function, atol, rtol, hints, explain, verdict,
                                 dict(requires or {}), traced)
        return reference

    return register


def _your_answer(gen: torch.Generator) -> list[Case]:
    return [Case(N_("your answer"))]


def question(*, explain: str, hints: Sequence[Hint] = (), atol: float = 1e-5,
             rtol: float = 1e-4) -> Callable[[Callable], Callable]:
    """Decorator that registers a question: an exercise whose answer is a value, not a function.

    The decorated function takes no arguments and returns (or measures) the right answer; the
    learner assigns theirs to a variable of the same name, and ``check.<name>(<name>)`` compares
    the two. An answer left as ``...`` counts as not attempted.
    """
    return exercise(cases=_your_answer, atol=atol, rtol=rtol, hints=hints, explain=explain)


def get(name: str) -> Exercise:
    from course_tools.exercises import references  # noqa: F401  (registers every lesson's exercises)

    if name not in REGISTRY:
        known = ", ".join(sorted(REGISTRY)) or "none"
        raise KeyError(f"no exercise named {name!r}; known exercises: {known}")
    return REGISTRY[name]


def fresh_seed() -> int:
    """A new seed per check run, so expected outputs cannot be memorised."""
    return secrets.randbits(31)


def draw(name: str, seed: int) -> list[Case]:
    """Draw the cases of an exercise with a given seed (the grader stores them)."""
    return get(name).cases(torch.Generator().manual_seed(seed))


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return _("tensor of shape {x_shape}", x_shape=tuple(x.shape))
    if isinstance(x, (tuple, list)):
        return _("{kind} of {length}", kind=type(x).__name__, length=len(x))
    return type(x).__name__


TEXT_CONTEXT = 20  # characters of the learner's own text shown around where it goes wrong


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _compare_exact(got: torch.Tensor, expected: torch.Tensor) -> tuple[bool, str]:
    if expected.dtype == torch.bool and got.dtype != torch.bool:
        return False, _("expected a bool tensor, got dtype {got_dtype}", got_dtype=got.dtype)
    wrong = int((got.to(expected.dtype) != expected).sum())
    if wrong:
        return False, _("{wrong} of {expected_numel} entries differ", wrong=wrong, expected_numel=expected.numel())
    return True, _("shape {expected_shape}, all entries equal", expected_shape=tuple(expected.shape))


def _compare_close(got: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float) -> tuple[bool, str]:
    g, e = got.detach().double(), expected.detach().double()
    nan_g, nan_e = torch.isnan(g), torch.isnan(e)
    if not torch.equal(nan_g, nan_e):
        return False, _("NaN in {nan_g_sum} entries where the reference has {nan_e_sum}", nan_g_sum=int(nan_g.sum()),
                        nan_e_sum=int(nan_e.sum()))
    g, e = torch.where(nan_e, 0.0, g), torch.where(nan_e, 0.0, e)
    err = (g - e).abs()
    max_err = float(err.max()) if err.numel() else 0.0
    if bool((err <= atol + rtol * e.abs()).all()):
        return True, _("shape {expected_shape}, max error within {atol:g}", expected_shape=tuple(expected.shape),
                       atol=atol)
    if e.numel() == 1:  # one number: its error and the learner's value would give the expected one away
        return False, _("shape {expected_shape} ok, but got {got}: {direction}", expected_shape=tuple(expected.shape),
                        got=_fmt(float(g.flatten()[0])), direction=_direction(float(g.flatten()[0]),
                                                                              float(e.flatten()[0])))
    return False, _("shape {expected_shape} ok, but max error {max_err} (tolerance {atol:g})",
                    expected_shape=tuple(expected.shape), max_err=_fmt(max_err), atol=atol)


def _compare_tensor(got: Any, expected: torch.Tensor, atol: float, rtol: float) -> tuple[bool, str]:
    if not isinstance(got, torch.Tensor):
        return False, _("expected a {describe_expected}, got {describe_got}", describe_expected=_describe(expected),
                        describe_got=_describe(got))
    if got.shape != expected.shape:
        return False, _("expected shape {expected_shape}, got {got_shape}", expected_shape=tuple(expected.shape),
                        got_shape=tuple(got.shape))
    if expected.dtype == torch.bool or not expected.is_floating_point():
        return _compare_exact(got, expected)
    return _compare_close(got, expected, atol, rtol)


def _compare_sequence(got: Any, expected: tuple | list, atol: float, rtol: float) -> tuple[bool, str]:
    if not isinstance(got, (tuple, list)) or len(got) != len(expected):
        return False, _("expected a {describe_expected}, got {describe_got}", describe_expected=_describe(expected),
                        describe_got=_describe(got))
    details = []
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        ok, detail = compare(g, e, atol, rtol)
        if not ok:
            return False, _("item {i}: {detail}", i=i, detail=detail)
        details.append(detail)
    return True, "; ".join(details) if len(details) <= 2 else _("all {len_details} items match",
                                                                len_details=len(details))


def _direction(got: float, expected: float) -> str:
    """How a wrong number is wrong, without the right one: too large or too small."""
    return _("too large") if got > expected else _("too small")


def _compare_number(got: Any, expected: int | float, atol: float, rtol: float) -> tuple[bool, str]:
    """A number against the reference: the learner's own value and, when wrong, only whether it is too
    large or too small (the expected value printed would let a lookup table pass a fixed case)."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return False, _("expected a number, got {describe_got}", describe_got=_describe(got))
    if isinstance(expected, int):  # a count: exact, also when it comes as a float (124439808.0)
        if isinstance(got, float) and not got.is_integer():
            return False, _("got {got}, not a whole number", got=_fmt(got))
        if int(got) == expected:  # the learner's own value: a pass gives nothing away
            return True, _("expected {expected}, got {got}", expected=expected, got=got)
        return False, _("got {got}: {direction}", got=int(got), direction=_direction(got, expected))
    if math.isclose(got, expected, rel_tol=rtol, abs_tol=atol):
        return True, _("value within {atol:g}", atol=atol)
    return False, _("got {got}: {direction}", got=_fmt(got), direction=_direction(got, expected))


def _compare_text(got: Any, expected: str) -> tuple[bool, str]:
    """A string against the reference: where the learner's text first differs and what it holds there,
    never the expected text."""
    if not isinstance(got, str):
        return False, _("expected a string, got {describe_got}", describe_got=_describe(got))
    if got == expected:
        return True, _("the text is right")
    shorter = min(len(got), len(expected))
    at = next((i for i in range(shorter) if got[i] != expected[i]), shorter)
    if at == len(got):
        return False, _("your text stops too early: after character {at}, which ends {tail!r}", at=at,
                        tail=got[max(0, at - TEXT_CONTEXT):])
    return False, _("your text goes wrong at character {at}: {before!r} is followed by {after!r}", at=at,
                    before=got[max(0, at - TEXT_CONTEXT):at], after=got[at:at + TEXT_CONTEXT])


def compare(got: Any, expected: Any, atol: float, rtol: float) -> tuple[bool, str]:
    """Compare an answer with the reference; return (ok, one-line detail). The detail says what is wrong
    (a shape, how many entries, where a text goes wrong, whether a number is too large) and never the
    expected value itself, but for a bool or None."""
    if isinstance(expected, torch.Tensor):
        return _compare_tensor(got, expected, atol, rtol)
    if isinstance(expected, (tuple, list)):
        return _compare_sequence(got, expected, atol, rtol)
    if isinstance(expected, str):
        return _compare_text(got, expected)
    if isinstance(expected, bool) or expected is None:  # two values (or one): naming it gives nothing away
        return (got == expected), _("expected {expected!r}, got {got!r}", expected=expected, got=got)
    if isinstance(expected, (int, float)):
        return _compare_number(got, expected, atol, rtol)
    ok = bool(got == expected)
    return ok, _("equal") if ok else _("{got} is not right", got=_short(got))


@dataclass
class Outcome:
    """What happened to one case: status, and the line shown to the learner."""

    status: str
    line: str


@dataclass
class CheckResult:
    """The result of checking one exercise."""

    name: str
    status: str  # pass | fail | not attempted | error
    outcomes: list[Outcome]
    explain: str = ""
    question: bool = False
    blocked: str = ""  # why it does not count while an exercise it builds on fails (``unmet``)
    choice: bool = False  # a multiple-choice question (the answer is one lower-case letter): ``committed``

    @property
    def passed(self) -> int:
        return sum(o.status == PASS for o in self.outcomes)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def summary(self) -> str:
        """The first line, in the learner's language (``course_tools.messages``)."""
        if self.status == NOT_ATTEMPTED and self.question:
            return _("{name}: not answered yet (replace the ... by your answer)", name=self.name)
        if self.status == NOT_ATTEMPTED:
            return _("{name}: not attempted yet (the function still raises NotImplementedError)", name=self.name)
        if self.blocked:
            return _("{name}: {blocked}", name=self.name, blocked=self.blocked)
        if self.question:
            return _("{name}: right", name=self.name) if self.status == PASS else \
                _("{name}: not right yet", name=self.name)
        if self.status == PASS:
            return _("{name}: {passed}/{total} cases passed (all cases passed)", name=self.name,
                        passed=self.passed, total=self.total)
        return _("{name}: {passed}/{total} cases passed (some cases failed)", name=self.name,
                    passed=self.passed, total=self.total)

    def report(self) -> str:
        lines = [self.summary()]
        if self.blocked:  # its cases ran on a model the stages before judged wrong: their hints would mislead
            lines.append("  ✗ " + held_back(self.passed, self.total))
        elif self.status != NOT_ATTEMPTED:
            lines += [o.line for o in self.outcomes]
        if self.status == PASS and self.explain:
            lines.append("  " + _("why: {why}", why=say(self.explain)))
        return "\n".join(lines)


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def error_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def judge(ex: Exercise, case: Case, got: Any, expected: Any, hints: bool = True) -> Outcome:
    """Compare one answer with the reference and phrase the result, with a hint if one fits
    (``hints=False``: none tried, for answers too large to hand to a hint)."""
    try:
        ok, detail = ex.verdict(case, got, expected) if ex.verdict else compare(got, expected, ex.atol, ex.rtol)
    except Exception as exc:  # a malformed answer must not crash the check
        ok, detail = False, _("could not compare: {error}", error=error_line(exc))
    if ex.is_question:  # the detail of a comparison would give the right answer away
        answer = _short(got)
        detail = _("{answer} is right", answer=answer) if ok else _("{answer} is not the answer", answer=answer)
    detail, label = say(detail), say(case.label)
    if ok:
        return Outcome(PASS, f"  ✓ {label}: {detail}")
    for hint in ex.hints if hints else ():
        try:
            text = hint(case, got, expected)
        except Exception:
            text = None
        if text:
            detail = _("{detail} — hint: {hint}", detail=detail, hint=say(text))
            break
    return Outcome(FAIL, f"  ✗ {label}: {detail}")


def _clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def call(fn: Callable, case: Case) -> Any:
    """Call a function on a private copy of a case's inputs (answers may modify them)."""
    return fn(*_clone(case.args), **_clone(case.kwargs))


ATTEMPT_OK, ATTEMPT_NONE, ATTEMPT_ERROR = "ok", "not attempted", "error"


def attempt(fn: Callable, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """A learner's answer to one case, by the one rule the notebook's check and the grader share:
    ``("ok", value)``; ``("not attempted", None)`` when it raises NotImplementedError (the exercise's
    stub) or returns ``...`` (a question's placeholder); ``("error", error_line)`` when it raises."""
    try:
        value = fn(*args, **kwargs)
    except NotImplementedError:
        return ATTEMPT_NONE, None
    except Exception as exc:
        return ATTEMPT_ERROR, error_line(exc)
    return (ATTEMPT_NONE, None) if value is Ellipsis else (ATTEMPT_OK, value)


@contextmanager
def optimizer_trace() -> Iterator[list[tuple[float, float]]]:
    """Records, for every ``optimizer.step()`` of any ``torch.optim.Optimizer`` (subclasses too) while
    the block runs, the first parameter group's learning rate and the global norm of the gradients it
    is about to apply (after any clipping): what the loop really did, step by step."""
    steps: list[tuple[float, float]] = []

    def record(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad.detach().double() for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        steps.append((float(optimizer.param_groups[0]["lr"]), norm))

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield steps
    finally:
        handle.remove()


def trace_tensor(steps: list[tuple[float, float]]) -> torch.Tensor:
    """An optimiser trace as a (steps, 2) float64 tensor: learning rate, gradient norm."""
    return torch.tensor(steps, dtype=torch.float64).reshape(len(steps), 2)


def returning(value: Any) -> Callable[[], Any]:
    """A question's answer is a value, not a function: this function returns it, so it is checked like one."""
    return lambda: value


def not_attempted(case: Case) -> Outcome:
    return Outcome(NOT_ATTEMPTED, "  · " + _("{label}: not attempted yet", label=say(case.label)))


def raised(case: Case, error: str) -> Outcome:
    """The outcome of an answer that raised ``error`` (one line: the type and the message's first line)."""
    return Outcome(ERROR, "  ✗ " + _("{label}: raised {error}", label=say(case.label), error=error))


def result_status(outcomes: list[Outcome]) -> str:
    if outcomes and all(o.status == NOT_ATTEMPTED for o in outcomes):
        return NOT_ATTEMPTED
    return PASS if outcomes and all(o.status == PASS for o in outcomes) else FAIL


LAST: dict[str, str] = {}
"""The status of each exercise's latest check in this kernel, for the exercises that build on it."""


def unmet(ex: Exercise, statuses: dict[str, str]) -> str | None:
    """The line that opens the feedback of ``ex`` while an exercise it requires has not passed, else None
    (the first such exercise in ``ex.requires``' order; one never checked counts as not passed only
    when ``statuses`` holds it)."""
    for required, why in ex.requires.items():
        if required in statuses and statuses[required] != PASS:
            return _("{required} failed: fix that first; {why}", required=required, why=say(why))
    return None


def held_back(passed: int, total: int) -> str:
    """The line that stands for a blocked exercise's own cases (``unmet``): their count, not their details."""
    return _("its own cases: {passed}/{total} passed; their details and hints are shown once the stages it builds on "
             "pass", passed=passed, total=total)


def run(name: str, fn: Callable, seed: int | None = None) -> CheckResult:
    """Check ``fn`` against exercise ``name`` on cases drawn with ``seed`` (fresh if None)."""
    ex = get(name)
    cases = draw(name, fresh_seed() if seed is None else seed)
    outcomes, choice = [], False
    for case in cases:
        expected = call(ex.reference, case)
        choice = choice or (ex.is_question and is_letter(expected))
        with optimizer_trace() as steps, \
                bare_torch.guard() if bare_torch.guarded(name) else contextlib.nullcontext():
            status, got = attempt(fn, _clone(case.args), _clone(case.kwargs))
        if status == ATTEMPT_NONE:
            outcomes.append(not_attempted(case))
        elif status == ATTEMPT_ERROR:
            outcomes.append(raised(case, got))
        else:
            outcomes.append(judge(ex, case, (got, trace_tensor(steps)) if ex.traced else got, expected))
    status = LAST[name] = result_status(outcomes)
    blocked = unmet(ex, LAST) if status != NOT_ATTEMPTED else None
    return CheckResult(name, FAIL if blocked else status, outcomes, ex.explain, ex.is_question, blocked or "",
                       choice)


def is_letter(x: Any) -> bool:
    """Whether ``x`` is a multiple-choice answer as the questions write it: one lower-case letter."""
    return isinstance(x, str) and len(x) == 1 and x.isalpha() and x.islower()


FIRST: dict[str, tuple[str, str]] = {}
"""The first committed answer to each multiple-choice question in this kernel, and its status: the one
the check counts (``committed``)."""


def committed(result: CheckResult, answer: Any) -> tuple[str, str]:
    """The feedback on a multiple-choice answer and the status the check counts. The first answer (one
    lower-case letter) is recorded; it gets its verdict, the hint of its misconception and then the full
    explanation, right or wrong. A later, different answer is told only right or not right: no option's
    hint and no explanation again, so trying every letter teaches nothing the first answer's feedback
    did not, and the first answer is the one that counts. A letter not written as one lower-case letter
    is not an answer yet (whichever letter it is: no hint that singles out the right one)."""
    if isinstance(answer, str) and not is_letter(answer) and is_letter(answer.strip().lower()):
        return _("{name}: write just the letter, in lower case: {letter!r}", name=result.name,
                 letter=answer.strip().lower()), NOT_ATTEMPTED
    text = _short(answer)
    first, status = FIRST.setdefault(result.name, (text, result.status))
    if text == first:  # the first answer, or the same one again (a right one: the feedback as for any question)
        lines = [result.report()]
        if result.status != PASS:
            if result.explain:
                lines.append("  " + _("why: {why}", why=say(result.explain)))
            lines.append("  · " + _("your first answer, {answer}, is recorded: it is the one that counts; a "
                                    "different answer now is told only right or not right", answer=first))
        return "\n".join(lines), status
    if result.status == PASS:
        return _("{name}: {answer} is right; your first answer, {first}, is the one that counts (its feedback and "
                 "the explanation were shown after it)", name=result.name, answer=text, first=first), status
    return _("{name}: {answer} is not the answer; your first answer, {first}, is the one that counts (its feedback "
             "and the explanation were shown after it)", name=result.name, answer=text, first=first), status


class CheckFailed(AssertionError):
    """Raised in strict mode (under nbgrader, or ``COURSE_CHECKS_STRICT=1``) by a failing check.
    IPython shows only this one line instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"CheckFailed: {self}"]


class _Checker:
    """``check.<exercise>(fn)`` prints one line per case; strict mode raises on anything but a pass."""

    def __getattr__(self, name: str) -> Callable[[Callable], None]:
        if name.startswith("_"):
            raise AttributeError(name)
        get(name)  # fail fast with the list of known exercises

        def checker(fn: Any, seed: int | None = None) -> None:
            answer = fn
            if not callable(fn):  # a question's answer: the value itself
                fn = returning(fn)
            result = run(name, fn, seed)
            text, status = result.report(), result.status
            if result.choice and status != NOT_ATTEMPTED:
                text, status = committed(result, answer)
            print(text)
            if STRICT and status != PASS:
                raise CheckFailed(result.summary() if status == result.status else text.splitlines()[0])

        checker.__name__ = name
        return checker

    def __dir__(self) -> list[str]:
        from course_tools.exercises import references  # noqa: F401

        return sorted(REGISTRY)


check = _Checker()
