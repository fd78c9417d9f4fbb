"""Lesson 11's from-the-metal track (issue 44 item 4): the run-time guard (``course_tools.exercises.bare_torch``),
the grader's static check (``course_tools.grading.metal``) and the stages' references and hints
(``references/lesson11.py``, the ``metal_…`` block). Every attack below passes without the defence it
tests: a guard that replaced nothing, a static check that read nothing, a verdict without the hint."""

import copy
import math
import random
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from course_tools.exercises import bare_torch, checks
from course_tools.exercises.bare_torch import ForbiddenOnMetal, guard
from course_tools.exercises.references import lesson11 as L
from course_tools.grading import metal, submission
from course_tools.grading.report import ExerciseScore, Submission

ROOT = Path(__file__).resolve().parent.parent
LESSON = "11_build_your_gpt"


def _mine(cls: type) -> type:
    """A class as if the learner had defined it in the notebook (the kernel's ``__main__``)."""
    cls.__module__ = "__main__"
    return cls


class _Learner(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        return x @ self.weight.T


class _Sgd(torch.optim.Optimizer):
    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.sub_(group["lr"] * p.grad)


_mine(_Learner)
_mine(_Sgd)


# --- 1. the run-time guard -----------------------------------------------------------------------------

def test_a_learner_module_and_optimizer_run_under_the_guard_and_everything_comes_back():
    x = torch.randn(2, 3)
    model = _Learner()
    optimizer = _Sgd(model.parameters())
    linear = F.linear
    with guard():
        model(x).sum().backward()
        optimizer.step()
    assert F.linear is linear and torch.Tensor.softmax is not None and "softmax" not in torch.Tensor.__dict__
    assert nn.Linear(3, 2)(x).shape == (2, 2) and x.softmax(-1).shape == (2, 3)


class _LinearSubclass(nn.Linear):
    def forward(self, x):  # no F call at all: only the class check can see it
        return x @ self.weight.T + self.bias


_mine(_LinearSubclass)
ATTACKS = {
    "nn.Linear": lambda x: nn.Linear(3, 3)(x),
    "torch.nn.modules.linear.Linear": lambda x: torch.nn.modules.linear.Linear(3, 3)(x),
    "a subclass of nn.Linear that calls no F": lambda x: _LinearSubclass(3, 3)(x),
    "F.linear": lambda x: F.linear(x, torch.randn(3, 3)),
    "torch._C._nn.linear": lambda x: torch._C._nn.linear(x, torch.randn(3, 3)),
    "F through a built attribute name": lambda x: getattr(torch.nn, "func" + "tional").linear(x, torch.randn(3, 3)),
    "torch.softmax": lambda x: torch.softmax(x, -1),
    "Tensor.softmax": lambda x: x.softmax(-1),
    "Tensor.log_softmax": lambda x: x.log_softmax(-1),
    "torch.logsumexp": lambda x: torch.logsumexp(x, -1),
    "torch.special.logsumexp": lambda x: torch.special.logsumexp(x, -1),
    "torch.ops.aten._log_softmax": lambda x: torch.ops.aten._log_softmax(x, -1, False),
    "torch.layer_norm": lambda x: torch.layer_norm(x, (3,)),
    "F.cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([0, 1])),
    "torch.nn.utils.clip_grad_norm_": lambda x: torch.nn.utils.clip_grad_norm_([nn.Parameter(x)], 1.0),
    "torch.optim.AdamW": lambda x: _stepped(torch.optim.AdamW),
    "a subclass of torch.optim.Adam": lambda x: _stepped(_mine(type("MyAdam", (torch.optim.Adam,), {}))),
}


def _stepped(optimizer_class: type) -> None:
    p = nn.Parameter(torch.randn(3))
    p.grad = torch.ones(3)
    optimizer_class([p]).step()


@pytest.mark.parametrize("attack", ATTACKS)
def test_pytorch_layers_losses_and_optimizers_raise_under_the_guard(attack):
    x = torch.randn(2, 3)
    ATTACKS[attack](x)  # outside the guard it works
    with pytest.raises(ForbiddenOnMetal, match="not available on the from-the-metal track"), guard():
        ATTACKS[attack](x)


def test_an_optimizer_built_before_the_guard_still_cannot_step_inside_it():
    p = nn.Parameter(torch.randn(3))
    optimizer = torch.optim.AdamW([p])
    p.grad = torch.ones(3)
    with pytest.raises(ForbiddenOnMetal, match="AdamW"), guard():
        optimizer.step()


def test_undoing_the_guard_inside_it_is_an_error_on_leaving():
    real = F.linear
    with pytest.raises(ForbiddenOnMetal, match="guard was changed"), guard():
        F.linear = real
    assert F.linear is real


def test_only_metal_exercises_are_guarded():
    assert bare_torch.guarded("metal_adamw") and not bare_torch.guarded("capstone_training")
    stages = [n for n in checks.REGISTRY if n.startswith("metal_")]
    assert len(stages) == 9 and all(bare_torch.guarded(n) for n in stages)


def test_the_notebook_check_runs_the_learner_code_under_the_guard():
    def cheating(x, dim, grad):
        leaf = x.clone().requires_grad_(True)
        out = torch.softmax(leaf, dim)
        (out * grad).sum().backward()
        return out.detach(), leaf.grad

    result = checks.run("metal_softmax", cheating, seed=0)
    assert result.status == checks.FAIL and "torch.softmax is not available" in result.report()


# --- 2. the static check --------------------------------------------------------------------------------

def _solution() -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "solutions" / f"{LESSON}.ipynb", as_version=4)


def _base() -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "exercises" / f"{LESSON}.ipynb", as_version=4)


def _parsed(edits: dict[str, tuple[str, str]]) -> submission.Parsed:
    """The solution with ``edits`` (grade_id -> (old text, new text)) made in its answer cells."""
    nb = copy.deepcopy(_solution())
    for cell in nb.cells:
        grade_id = (cell.metadata.get("nbgrader") or {}).get("grade_id")
        if grade_id in edits:
            old, new = edits[grade_id]
            assert old in cell.source, (grade_id, old)
            cell.source = cell.source.replace(old, new)
    return submission.parse(nbformat.writes(nb).encode())


SOFTMAX = ("    shifted = x - x.amax(dim, keepdim=True).detach()  # the largest term becomes exp(0) = 1\n"
           "    e = shifted.exp()\n    return e / e.sum(dim, keepdim=True)\n")
LINEAR = "        return x @ self.weight.T + self.bias\n"
STATIC_ATTACKS = {
    "an alias taken before the guard": {"metal_layers": (LINEAR, "        return lin(x, self.weight, self.bias)\n"
                                                                 "lin = F.linear\n")},
    "an alias of the module": {"metal_losses": (SOFTMAX, "    return G.softmax(x, dim)\nG = torch.nn.functional\n")},
    "getattr with a constant name": {"metal_losses": (SOFTMAX, "    return getattr(torch.nn, 'functional')"
                                                              ".softmax(x, dim)\n")},
    "torch.nn.modules.linear": {"metal_layers": (LINEAR, "        return lin(x)\n"
                                                         "lin = torch.nn.modules.linear.Linear(3, 3)\n")},
    "torch._C._nn.linear": {"metal_layers": (LINEAR, "        return torch._C._nn.linear(x, self.weight, "
                                                     "self.bias)\n")},
    "torch.ops.aten": {"metal_losses": (SOFTMAX, "    return torch.ops.aten._softmax(x, dim, False)\n")},
    "a tensor method": {"metal_losses": (SOFTMAX, "    return x.softmax(dim)\n")},
    "torch.sys.modules": {"metal_losses": (SOFTMAX, "    return sm(x, dim)\n"
                                                    "sm = torch.sys.modules['torch.nn.functional'].softmax\n")},
    "a namespace passed as a value": {"metal_losses": (SOFTMAX, "    return sm(x, dim)\n\ndef pick(m):\n"
                                                               "    return m.functional.softmax\nsm = pick(nn)\n")},
    "an import in a metal cell": {"metal_losses": (SOFTMAX, "    from torch.nn.functional import softmax as s\n"
                                                            "    return s(x, dim)\n")},
    "a helper defined in a base-track cell": {
        "my_training_loop": ("def get_batch(", "def _ce(logits, targets):\n"
                                               "    return F.cross_entropy(logits, targets)\n\n\ndef get_batch("),
        "metal_losses": ("    m = logits.amax(-1, keepdim=True).detach()\n", "    return _ce(logits, targets)\n")},
    "a piece redefined in a base-track cell": {
        "my_generate": ("@torch.no_grad()\n", "def softmax(x, dim):\n    return F.softmax(x, dim)\n\n\n"
                                              "@torch.no_grad()\n")},
    "course_utils' own softmax": {"metal_losses": (SOFTMAX, "    return cu_attention.softmax(x, dim)\n"
                                                            "from course_utils import attention as cu_attention\n")},
    "a built name in a base-track cell": {"my_generate": ("@torch.no_grad()\n", "sm = getattr(F, 'soft' + 'max')\n\n"
                                                                                "@torch.no_grad()\n")},
    "gc in a base-track cell": {"my_generate": ("@torch.no_grad()\n", "import gc\n\n@torch.no_grad()\n")},
    "the grading machinery named": {"my_generate": ("@torch.no_grad()\n",
                                                    "from course_tools.exercises import bare_torch\n"
                                                    "bare_torch.guard = None\n\n@torch.no_grad()\n")},
    "eval of a string": {"my_generate": ("@torch.no_grad()\n", "sm = eval('F.soft' + 'max')\n\n@torch.no_grad()\n")},
}


def test_the_solution_has_no_violation_and_its_model_eval_calls_are_not_dynamic():
    assert metal.violations(_base(), _parsed({})) == []
    assert "model.eval()" in "".join(c.source for c in _solution().cells if c.cell_type == "code")


@pytest.mark.parametrize("attack", STATIC_ATTACKS)
def test_the_static_check_finds_each_attack(attack):
    found = metal.violations(_base(), _parsed(STATIC_ATTACKS[attack]))
    assert found, attack


def test_apply_zeroes_every_metal_stage_and_only_those():
    parsed = _parsed(STATIC_ATTACKS["an alias taken before the guard"])
    _, points = submission.exercise_cells(_base())
    sub = Submission(file="x.ipynb", student="x", lesson=LESSON)
    sub.exercises = [ExerciseScore(name, p, p, "ok") for name, p in points.items()]
    assert metal.apply(sub, parsed, _base())
    zero = {e.name for e in sub.exercises if e.points == 0}
    assert zero == {n for n in points if n.startswith("metal_")} and len(zero) == 9
    assert all("from-the-metal track" in e.status and "torch.nn.functional.linear" in e.status
               for e in sub.exercises if e.name in zero)


def test_forbidden_names():
    assert metal.forbidden("torch.nn.functional.linear") and metal.forbidden("torch.optim.AdamW")
    assert metal.forbidden("torch.nn") and metal.forbidden("torch.softmax") and metal.forbidden("torch._C._nn.linear")
    assert not metal.forbidden("torch.nn.Parameter") and not metal.forbidden("torch.optim.Optimizer")
    assert not metal.forbidden("torch.randn") and not metal.forbidden("torch.erf") and not metal.forbidden("math.sqrt")


# --- 3. the stages' references and hints ------------------------------------------------------------------

def test_adamw_with_l2_decay_gets_the_decoupling_hint():
    case = checks.draw("metal_adamw", 0)[0]
    params, grads, lrs, options = case.args
    expected = L.metal_adamw(*case.args)
    coupled = L._optimised(torch.optim.Adam, params, grads, lrs, options)
    ok, _ = checks.compare(coupled, expected, 1e-5, 1e-4)
    assert not ok and "AdamW decays the weights directly" in L._adamw_hint(case, coupled, expected)


def test_clipping_each_parameter_gets_the_global_norm_hint():
    case = checks.draw("metal_clipping", 0)[0]
    grads, max_norm = case.args
    expected = L.metal_clipping(*case.args)
    per_parameter = [g * min(1.0, max_norm / (float(g.norm()) + 1e-6)) for g in grads]
    assert "global" in L._clipping_hint(case, (expected[0], per_parameter), expected)


def test_a_naive_softmax_fails_on_large_logits_with_the_stability_hint():
    def naive(x, dim, grad):
        leaf = x.clone().requires_grad_(True)
        out = leaf.exp() / leaf.exp().sum(dim, keepdim=True)
        (out * grad).sum().backward()
        return out.detach(), leaf.grad

    result = checks.run("metal_softmax", naive, seed=0)
    assert result.status == checks.FAIL and "subtract the maximum" in result.report()



# LayerNorm: ways a learner writes a correct layer, and the bugs the cases are there to catch. Each is a
# learner's class (``_mine``); the check loads the case's weight and bias into it, as the notebook's
# metal_layer_norm_run does.
class _Norm(nn.Module):  # a learner's class, like every subclass below (``_mine``)
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps, self.weight, self.bias = eps, nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return self.normalised(x) * self.weight + self.bias


_mine(_Norm)


def _norm(name, normalised):
    return _mine(type(name, (_Norm,), {"normalised": lambda self, x: normalised(x, self.eps)}))


def _two_pass(x, eps):  # the solution's way
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + eps)


def _step_by_step(x, eps):  # sums over D, a product for the square, a reciprocal then a multiply
    d = x.shape[-1]
    centred = x - x.sum(-1, keepdim=True) / d
    return centred * (1.0 / ((centred * centred).sum(-1, keepdim=True) / d + eps).sqrt())


def _var_mean(x, eps):
    var, mean = torch.var_mean(x, -1, unbiased=False, keepdim=True)
    return (x - mean) * torch.rsqrt(var + eps)


def _welford(x, eps):  # one pass over the features, the running mean and sum of squared deviations
    mean, m2 = torch.zeros_like(x[..., :1]), torch.zeros_like(x[..., :1])
    for k in range(x.shape[-1]):
        value = x[..., k:k + 1]
        delta = value - mean
        mean = mean + delta / (k + 1)
        m2 = m2 + delta * (value - mean)
    return (x - mean) / torch.sqrt(m2 / x.shape[-1] + eps)


class _HandWritten(torch.autograd.Function):
    """LayerNorm with its backward written out: dx = (g·w − mean(g·w) − x̂·mean(g·w·x̂)) / σ."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        centred = x - x.mean(-1, keepdim=True)
        inv_std = 1.0 / torch.sqrt((centred * centred).mean(-1, keepdim=True) + eps)
        x_hat = centred * inv_std
        ctx.save_for_backward(x_hat, inv_std, weight)
        return x_hat * weight + bias

    @staticmethod
    def backward(ctx, g):
        x_hat, inv_std, weight = ctx.saved_tensors
        gw = g * weight
        dx = inv_std * (gw - gw.mean(-1, keepdim=True) - x_hat * (gw * x_hat).mean(-1, keepdim=True))
        rows = tuple(range(g.dim() - 1))
        return dx, (g * x_hat).sum(rows), g.sum(rows), None


class _HandWrittenNorm(_Norm):
    def forward(self, x):
        return _HandWritten.apply(x, self.weight, self.bias, self.eps)


_mine(_HandWrittenNorm)
LAYER_NORMS = {
    "two passes": _norm("TwoPass", _two_pass),
    "step by step": _norm("StepByStep", _step_by_step),
    "torch.var_mean and rsqrt": _norm("VarMean", _var_mean),
    "Tensor.var(unbiased=False)": _norm("Var", lambda x, eps: (x - x.mean(-1, keepdim=True)) / (
        x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()),
    "Welford": _norm("Welford", _welford),
    "the backward by hand": _HandWrittenNorm,
}
# bug -> (the case index that must catch it on every seed, words of the hint that names its fix)
LAYER_NORM_BUGS = {
    "one-pass variance E[x²] − μ²": (_norm("OnePass", lambda x, eps: (x - x.mean(-1, keepdim=True)) / torch.sqrt(
        (x * x).mean(-1, keepdim=True) - x.mean(-1, keepdim=True) ** 2 + eps)), 2, "average (x − μ)² instead"),
    "one-pass variance with sums": (_norm("OnePassSums", lambda x, eps: (x - x.sum(-1, keepdim=True) / x.shape[-1]) / (
        (x ** 2).sum(-1, keepdim=True) / x.shape[-1] - (x.sum(-1, keepdim=True) / x.shape[-1]) ** 2 + eps).sqrt()),
        2, "average (x − μ)² instead"),
    "unbiased variance": (_norm("Unbiased", lambda x, eps: (x - x.mean(-1, keepdim=True)) / (
        x.var(-1, keepdim=True) + eps).sqrt()), None, "divides the variance by D − 1"),
    "eps outside the root": (_norm("EpsOutside", lambda x, eps: (x - x.mean(-1, keepdim=True)) / (
        x.var(-1, unbiased=False, keepdim=True).sqrt() + eps)), 1, "epsilon goes inside the square root"),
}
# The grader draws every submission's cases with a fresh 31-bit seed (and a notebook check with another):
# small seeds and seeds from the whole range.
LAYER_NORM_SEEDS = list(range(50)) + random.Random(2026).sample(range(2**31), 150)


def _layer_norm_answer(norm_class):
    def run(x, weight, bias, grad):
        module = norm_class(x.shape[-1])
        module.load_state_dict({"weight": weight, "bias": bias})
        leaf = x.clone().requires_grad_(True)
        out = module(leaf)
        (out * grad).sum().backward()
        return out.detach(), leaf.grad, module.weight.grad, module.bias.grad
    return run


def _of_tolerance(got, expected) -> float:
    """The largest error of ``got`` as a multiple of the check's tolerance, atol + rtol·|expected| (1 is the
    edge of passing; NaN counts as infinitely far)."""
    ex = checks.get("metal_layer_norm")
    worst = 0.0
    for g, e in zip(got, expected, strict=True):
        error = torch.nan_to_num((g.double() - e.double()).abs(), nan=math.inf)
        worst = max(worst, float((error / (ex.atol + ex.rtol * e.double().abs())).max()))
    return worst


@pytest.fixture(scope="module")
def layer_norm_errors():
    """{variant: [[error as a multiple of the tolerance, per case] per seed]} for the correct variants and the bugs,
    with the check's own verdict and line per case."""
    variants = dict(LAYER_NORMS) | {name: bug[0] for name, bug in LAYER_NORM_BUGS.items()}
    errors = {name: [] for name in variants}
    ex = checks.get("metal_layer_norm")
    for seed in LAYER_NORM_SEEDS:
        cases = checks.draw("metal_layer_norm", seed)
        expected = [L.metal_layer_norm(*case.args) for case in cases]
        for name, norm_class in variants.items():
            with guard():
                answers = [checks.call(_layer_norm_answer(norm_class), case) for case in cases]
            errors[name].append([(_of_tolerance(got, exp), checks.judge(ex, case, got, exp))
                                 for case, got, exp in zip(cases, answers, expected, strict=True)])
    return errors


def test_layer_norm_cases_pass_every_correct_layer_far_within_the_tolerance(layer_norm_errors):
    # measured over 3,000 seeds: at most 0.09 of the tolerance on the float32 cases, 0.008 on the one far from zero
    for name in LAYER_NORMS:
        for seed, per_case in zip(LAYER_NORM_SEEDS, layer_norm_errors[name], strict=True):
            assert all(outcome.status == checks.PASS for _, outcome in per_case), (name, seed, per_case)
            assert max(r for r, _ in per_case) < 0.2, (name, seed)
            assert per_case[2][0] < 0.02, (name, seed)  # float64 far from zero: round-off leaves nothing to see


def test_layer_norm_cases_fail_every_bug_on_every_seed_far_outside_the_tolerance_with_its_hint(layer_norm_errors):
    correct = max(r for name in LAYER_NORMS for per_case in layer_norm_errors[name] for r, _ in per_case)
    for name, (_, catcher, hint) in LAYER_NORM_BUGS.items():
        for seed, per_case in zip(LAYER_NORM_SEEDS, layer_norm_errors[name], strict=True):
            caught = per_case if catcher is None else [per_case[catcher]]
            for r, outcome in caught:
                assert outcome.status == checks.FAIL and hint in outcome.line, (name, seed, outcome.line)
                assert r > 50 and r > 500 * correct, (name, seed, r, correct)  # measured: at least 136 and 1,580×


def test_layer_norm_far_from_zero_case_is_float64_and_the_small_spread_case_is_float32():
    x_plain, x_small, x_far = (case.args[0] for case in checks.draw("metal_layer_norm", 7))
    assert x_plain.dtype == x_small.dtype == torch.float32 and x_far.dtype == torch.float64
    assert float(x_small.std()) < 0.02 and L._far_from_zero(x_far) and not L._far_from_zero(x_plain)


def test_a_layer_norm_with_another_bug_gets_no_cancellation_hint():
    # the weight left out: the rows are not rescaled copies of the answer, so no hint about the variance
    no_weight = _mine(type("NoWeight", (_Norm,), {"forward": lambda self, x: _two_pass(x, self.eps) + self.bias}))
    result = checks.run("metal_layer_norm", _layer_norm_answer(no_weight), seed=3)
    assert result.status == checks.FAIL and "average (x − μ)²" not in result.report()

def test_the_schedule_reference_is_pytorchs_and_equals_the_capstone_formula():
    for case in checks.draw("metal_schedule", 3):
        steps, lr, warmup, at = case.args
        torch_rates = L.metal_schedule(*case.args)
        formula = [lr * (s + 1) / warmup if s < warmup else lr / 10 + 0.45 * lr * (
            1 + torch.cos(torch.tensor(torch.pi * (s - warmup) / (steps - warmup), dtype=torch.float64)))
            for s in at]
        assert torch.allclose(torch_rates, torch.tensor([float(r) for r in formula], dtype=torch.float64))


def test_every_schedule_case_checks_seven_distinct_steps():
    # the report prints each case's shape, and a stored notebook compares it: a repeated step would print (6,)
    for seed in range(200):
        for case in L._schedule_cases(torch.Generator().manual_seed(seed)):
            steps, _lr, warmup, at = case.args
            fixed = {0, warmup // 2, warmup - 1, warmup, warmup + (steps - warmup) // 2, steps - 1}
            drawn = set(at) - fixed
            assert len(set(at)) == len(at) == 7 and at == sorted(at) and fixed < set(at), (seed, at)
            assert len(drawn) == 1 and warmup < drawn.pop() < steps - 1, (seed, at)


def test_the_solution_pieces_pass_every_metal_stage_under_the_guard():
    namespace = {"__name__": "__main__"}  # classes defined here count as the learner's (the kernel's __main__)
    exec("import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F", namespace)
    for cell in _solution().cells:
        grade_id = (cell.metadata.get("nbgrader") or {}).get("grade_id", "")
        if (grade_id.startswith("metal_") and cell.metadata["nbgrader"].get("solution")) or \
                cell.source.startswith("def _value_and_grads"):
            exec(cell.source, namespace)
    for name in [n for n in checks.REGISTRY if n.startswith("metal_") and n != "metal_training"]:
        result = checks.run(name, namespace[checks.get(name).function], seed=5)
        assert result.status == checks.PASS, result.report()


def test_a_submission_without_the_track_is_not_flagged_for_it():
    parsed = _parsed(STATIC_ATTACKS["gc in a base-track cell"])
    _, points = submission.exercise_cells(_base())
    sub = Submission(file="x.ipynb", student="x", lesson=LESSON)
    sub.exercises = [ExerciseScore(name, 0 if name.startswith("metal_") else p, p, "ok") for name, p in points.items()]
    assert not metal.apply(sub, parsed, _base())
    assert all(e.status == "ok" for e in sub.exercises)
