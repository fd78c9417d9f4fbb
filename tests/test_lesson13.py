"""Lesson 13's exercises where the learner writes the loops (issue 45 item 2): LoRA injected into a model
the grader builds, the SFT batch of the chat template, and the verdicts of the two training stages,
which judge the weights that come back. The solution cells themselves run here (taken from
solutions/13_adapting.ipynb), with the usual mistakes put into them; the full notebook is graded end to
end by nbval and ``course grade``."""

import math
from pathlib import Path

import nbformat
import pytest
import torch

from course_tools.exercises import checks
from course_tools.exercises.references import lesson13 as L
from course_tools.messages import say

ROOT = Path(__file__).resolve().parent.parent


def solution_namespace() -> dict:
    """The solutions notebook's set-up, exercises 5-9 and their given cells, run in one namespace
    (nothing else: no check, no experiment)."""
    nb = nbformat.read(ROOT / "solutions" / "13_adapting.ipynb", as_version=4)
    ns: dict = {}
    exec("import math\nimport torch\nimport torch.nn.functional as F\nfrom torch import nn\n", ns)
    wanted = {"sequence_logprobs", "dpo_loss", "lora_injection", "sft_batch", "sft_training", "dpo_training"}
    for cell in nb.cells:
        grade_id = (cell.metadata.get("nbgrader") or {}).get("grade_id")
        given = cell.cell_type == "code" and cell.source.startswith(("# Given",
                                                                     "from course_tools.exercises.lesson13_task"))
        if grade_id in wanted or given:
            exec(cell.source, ns)
    return ns


@pytest.fixture(scope="module")
def ns():
    return solution_namespace()


def outcomes(name: str, fn, seed: int = 0) -> list[str]:
    return [o.line for o in checks.run(name, fn, seed).outcomes]


def test_the_solution_injects_lora_into_the_grader_models(ns):
    result = checks.run("lora_injection", ns["injected"], seed=3)
    assert result.status == checks.PASS, result.report()


def test_injection_mistakes_are_named(ns):
    LoRA, torch_nn, right = ns["LoRA"], torch.nn, ns["inject_lora"]

    def unfrozen(model, targets, rank, alpha):   # the adapters added, nothing frozen
        for name, m in list(model.named_modules()):
            if isinstance(m, torch_nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent) if parent else model, child, LoRA(m, rank, alpha))
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    def every_match(model, targets, rank, alpha):  # any module named like a target, the norms too
        model.requires_grad_(False)
        for name, m in list(model.named_modules()):
            if name and any(name == t or name.endswith("." + t) for t in targets):
                parent, _, child = name.rpartition(".")
                wrapped = LoRA(m, rank, alpha) if isinstance(m, torch_nn.Linear) else torch_nn.Identity()
                setattr(model.get_submodule(parent) if parent else model, child, wrapped)
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    def random_b(model, targets, rank, alpha):
        count = right(model, targets, rank, alpha)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, LoRA):
                    m.B.normal_()
        return count

    for inject, words in [(unfrozen, "still train"), (every_match, "norm was replaced"),
                          (random_b, "start B at zero")]:
        ns["inject_lora"], original = inject, ns["inject_lora"]
        try:
            lines = outcomes("lora_injection", ns["injected"], seed=1)
        finally:
            ns["inject_lora"] = original
        assert any(words in say(line) for line in lines), (words, lines)


def test_the_solution_builds_the_library_batch_and_mistakes_are_named(ns):
    assert checks.run("sft_batch", ns["sft_batch"], seed=5).status == checks.PASS
    right = ns["sft_batch"]

    def prompt_in(pairs, pad_id):   # every real token in the loss
        return L.sft.collate([L.sft.masked_example(L.chat_encode(L.chat_prompt(m)), L.chat_encode(a + L.CHAT_END))
                              for m, a in pairs], pad_id, mask_prompt=False)

    def on_x(pairs, pad_id):
        x, y, mask = right(pairs, pad_id)
        return x, y, torch.cat([torch.zeros_like(mask[:, :1]), mask[:, :-1]], 1)

    def no_end(pairs, pad_id):
        return L.sft.collate([L.sft.masked_example(L.chat_encode(L.chat_prompt(m)), L.chat_encode(a))
                              for m, a in pairs], pad_id)

    lines = outcomes("sft_batch", prompt_in, seed=2)
    assert any("prompt" in line for line in lines[1:]), lines
    assert any("not with x" in line or "goes with y" in line for line in outcomes("sft_batch", on_x, seed=2))
    assert any("end marker" in line for line in outcomes("sft_batch", no_end, seed=2))


def _trace(steps: int) -> torch.Tensor:
    return torch.tensor([[1e-3, 0.5]] * steps, dtype=torch.float64)


def _printout(case, scored: str = "answer") -> tuple[torch.Tensor, torch.Tensor]:
    """Losses that fall and an optimiser trace whose first step is the one a loop scoring ``scored`` reports
    (``L.FIRST_STEP_LOSSES``) on the case's fresh model and first batch."""
    settings = case.args[0]
    steps = settings["steps"]
    loss, norm = L.sft_first_step(settings["seed"], settings["batch_size"])[scored]
    losses = torch.tensor([loss] + [2.0] * (steps // 2 - 1) + [0.05] * (steps - steps // 2), dtype=torch.float64)
    trace = torch.tensor([[1e-3, norm]] + [[1e-3, 0.5]] * (steps - 1), dtype=torch.float64)
    return losses, trace


def test_the_sft_verdict_reads_the_weights_not_the_printout():
    case = L._sft_cases(torch.Generator().manual_seed(0))[0]
    falling, trace = _printout(case)
    good = L.sft_reference_state()
    ok, detail = L._sft_verdict(case, ((good, falling), trace), None)
    assert ok, say(detail)
    untrained = L.chat_model(seed=case.args[0]["seed"]).state_dict()
    ok, detail = L._sft_verdict(case, ((untrained, falling), trace), None)   # a printout that lies
    assert not ok and "below" in say(detail)
    ok, detail = L._sft_verdict(case, ((good, falling), trace[:-1]), None)
    assert not ok and "optimizer.step()" in say(detail)


def test_the_sft_verdict_names_what_the_first_step_scored():
    """Weights that read the numbers do not pass when the loop's first step scored the padding or the prompt."""
    case = L._sft_cases(torch.Generator().manual_seed(4))[1]
    _assert_first_step_named(L._sft_verdict, case, L.sft_reference_state(), L.FIRST_STEP_LOSSES, _printout)


def _assert_first_step_named(verdict, case, state, hints, printout):
    """Every way of writing the first step in ``hints`` passes (hint None) or fails naming its hint and
    the first step; the right loss with another gradient (another batch or model) fails naming
    torch.randint. Returns that last printout's losses and trace."""
    for way, hint in hints.items():
        losses, trace = printout(case, way)
        ok, detail = verdict(case, ((state, losses), trace), None)
        if hint is None:
            assert ok, (way, say(detail))
        else:
            assert not ok and say(hint) in say(detail) and "first step" in say(detail), (way, say(detail))
    losses, trace = printout(case)
    trace[0, 1] *= 1.01
    ok, detail = verdict(case, ((state, losses), trace), None)
    assert not ok and "torch.randint" in say(detail), say(detail)
    return losses, trace


# the solution's loss line, and the ways a learner gets the positions wrong
SFT_LOSS = "        loss = F.cross_entropy(logits[mask], y[mask])\n"
SFT_WRONG = {
    "padding in the loss": ("        keep = mask.cumsum(1) > 0  # from the answer on, to the row's end\n"
                            "        loss = F.cross_entropy(logits[keep], y[keep])\n", "the padding is in the loss"),
    "prompt and padding in the loss": ("        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())\n",
                                       "the prompt and the padding are in the loss"),
    "prompt in the loss": ("        last = mask.shape[1] - mask.flip(1).int().argmax(1)  # one past END\n"
                           "        keep = torch.arange(mask.shape[1]) < last[:, None]\n"
                           "        loss = F.cross_entropy(logits[keep], y[keep])\n", "the prompt is in the loss"),
    "ignore_index=pad_id": ("        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=PAD_ID)\n",
                            "ignore_index=pad_id leaves the prompt in the loss"),
}


def _sft_loop(ns: dict, loss_line: str = SFT_LOSS):
    """The solution's sft_trained with its loss line replaced, in a namespace of its own."""
    mine = dict(ns)
    cell = next(c for c in nbformat.read(ROOT / "solutions" / "13_adapting.ipynb", as_version=4).cells
                if (c.metadata.get("nbgrader") or {}).get("grade_id") == "sft_training")
    assert SFT_LOSS in cell.source
    exec(cell.source.replace(SFT_LOSS, loss_line), mine)
    exec("def sft_trained(settings):\n    torch.manual_seed(settings['seed'])\n"
         "    model = GPT(GPTConfig(**CHAT_SIZES))\n    losses = train_sft(model, settings)\n"
         "    return model.state_dict(), torch.tensor([float(v) for v in losses], dtype=torch.float64)\n", mine)
    return mine["sft_trained"]


def _judged(case, sft_trained) -> tuple[bool, str]:
    with checks.optimizer_trace() as steps:
        value = sft_trained(case.args[0])
    ok, detail = L._sft_verdict(case, (value, checks.trace_tensor(steps)), None)
    return ok, say(detail)


def test_real_loops_first_steps_are_told_apart(ns):
    """Three steps of the solution's loop and of each wrong one: the grader's first step equals the loop's."""
    case = L._sft_cases(torch.Generator().manual_seed(8))[0]
    short = checks.Case(case.label, (dict(case.args[0], steps=3),))
    ok, detail = _judged(short, _sft_loop(ns))
    assert not ok and "first step" not in detail and "hardly fell" in detail, detail  # 3 steps learn nothing
    for name, (line, hint) in SFT_WRONG.items():
        ok, detail = _judged(short, _sft_loop(ns, line))
        assert not ok and hint in detail, (name, detail)


@pytest.mark.slow
def test_loops_with_the_padding_or_the_prompt_in_the_loss_fail_though_they_learn_to_read(ns):
    """The full run (about 20 s a loop on one core): the wrong loops learn to read the held-out numbers, as the
    right one does, and passed this check before the first step was judged."""
    case = L._sft_cases(torch.Generator().manual_seed(0))[0]
    ok, detail = _judged(case, _sft_loop(ns))
    assert ok, detail
    for name in ("padding in the loss", "prompt in the loss"):
        line, hint = SFT_WRONG[name]
        ok, detail = _judged(case, _sft_loop(ns, line))
        assert not ok and hint in detail, (name, detail)


def _dpo_printout(case, written: str = "exercise") -> tuple[torch.Tensor, torch.Tensor]:
    """Falling losses and an optimiser trace whose first step is the one a loop with its loss ``written`` so
    (``L.DPO_FIRST_STEP``) reports on the case's first batch."""
    reference_state, settings = case.args
    steps = settings["steps"]
    loss, norm = L.dpo_first_step(reference_state, settings)[written]
    losses = torch.tensor([loss * (1 - 0.9 * k / steps) for k in range(steps)], dtype=torch.float64)
    trace = torch.tensor([[1e-3, norm]] + [[1e-3, 0.5]] * (steps - 1), dtype=torch.float64)
    return losses, trace


def _dpo_judged(case, dpo_trained) -> tuple[bool, str]:
    with checks.optimizer_trace() as steps:
        value = dpo_trained(*case.args)
    ok, detail = L._dpo_verdict(case, (value, checks.trace_tensor(steps)), None)
    return ok, say(detail)


@pytest.fixture(scope="module")
def dpo_case_and_state(ns):
    """A case of the grader and the weights the solution's loop returns for it."""
    case = L._dpo_cases(torch.Generator().manual_seed(0))[0]
    return case, ns["dpo_trained"](*case.args)[0]


def test_the_dpo_verdict_needs_the_preference_learned(ns, dpo_case_and_state):
    case, state = dpo_case_and_state
    reference_state, settings = case.args
    steps = settings["steps"]
    _losses, trace = _dpo_printout(case)
    flat = torch.full((steps,), math.log(2), dtype=torch.float64)  # a printout that claims nothing moved
    ok, detail = L._dpo_verdict(case, ((reference_state, flat), trace), None)
    assert not ok and "below" in say(detail)
    ok, detail = _dpo_judged(case, ns["dpo_trained"])
    assert ok, detail


def test_the_dpo_verdict_names_how_the_first_step_was_written(dpo_case_and_state):
    """Weights that prefer the formal reading do not pass when the loop's first step was another loss."""
    case, state = dpo_case_and_state
    losses, trace = _assert_first_step_named(L._dpo_verdict, case, state, L.DPO_FIRST_STEP, _dpo_printout)
    losses[0] = 0.5  # a policy that does not start as the reference
    ok, detail = L._dpo_verdict(case, ((state, losses), trace), None)
    assert not ok and "should be ln 2" in say(detail), say(detail)


# the solution's loss line, and the ways a learner writes another loss
DPO_LOSS = ('        loss = dpo_loss(logps(policy, chosen), logps(policy, rejected), ref_chosen, ref_rejected, '
            'settings["beta"])\n')
_POLICY = "        pc, pr = logps(policy, chosen), logps(policy, rejected)\n"
_MARGIN = "((pc - ref_chosen) - (pr - ref_rejected))"
DPO_WRONG = {
    "beta left out": (_POLICY + f"        loss = -F.logsigmoid({_MARGIN}).mean()\n", "β is left out"),
    "mean over tokens": ("        n_c, n_r = chosen[2].sum(-1), rejected[2].sum(-1)\n"
                         "        loss = dpo_loss(logps(policy, chosen) / n_c, logps(policy, rejected) / n_r, "
                         'ref_chosen / n_c, ref_rejected / n_r, settings["beta"])\n',
                         "mean token log-probabilities"),
    "beta outside": (_POLICY + f"        loss = -settings['beta'] * F.logsigmoid({_MARGIN}).mean()\n",
                     "β multiplies the loss"),
    "sum over pairs": (_POLICY + f"        loss = -F.logsigmoid(settings['beta'] * {_MARGIN}).sum()\n",
                       "a sum over the pairs"),
    "reference = the policy": ("        ref_chosen, ref_rejected = logps(policy, chosen), logps(policy, rejected)\n"
                               + DPO_LOSS, "the gradient is zero"),
}


def _dpo_loop(ns: dict, loss_line: str = DPO_LOSS):
    """The solution's dpo_trained, its train_dpo's loss line replaced, in a namespace of its own."""
    mine = dict(ns)
    cells = nbformat.read(ROOT / "solutions" / "13_adapting.ipynb", as_version=4).cells
    cell = next(c for c in cells if (c.metadata.get("nbgrader") or {}).get("grade_id") == "dpo_training")
    assert DPO_LOSS in cell.source
    exec(cell.source.replace(DPO_LOSS, loss_line), mine)
    exec(next(c.source for c in cells if c.source.startswith("# Given") and "def dpo_trained" in c.source), mine)
    return mine["dpo_trained"]


def test_real_dpo_loops_first_steps_are_told_apart(ns):
    """Three steps of the solution's loop and of each wrong one: the grader's first step equals the loop's."""
    case = L._dpo_cases(torch.Generator().manual_seed(8))[1]
    short = checks.Case(case.label, (case.args[0], dict(case.args[1], steps=3)))
    ok, detail = _dpo_judged(short, _dpo_loop(ns))
    assert "first step" not in detail, detail
    for name, (line, hint) in DPO_WRONG.items():
        ok, detail = _dpo_judged(short, _dpo_loop(ns, line))
        assert not ok and hint in detail and "first step" in detail, (name, detail)


def test_dpo_loops_without_beta_or_with_mean_token_logprobs_fail_though_they_learn_the_preference(ns):
    """The full run (a few seconds a loop): both loops prefer the formal reading on the held-out pairs as the
    solution's does, and passed this check before the first step was judged."""
    case = L._dpo_cases(torch.Generator().manual_seed(0))[1]
    ok, detail = _dpo_judged(case, _dpo_loop(ns))
    assert ok, detail
    for name in ("beta left out", "mean over tokens"):
        line, hint = DPO_WRONG[name]
        ok, detail = _dpo_judged(case, _dpo_loop(ns, line))
        assert not ok and hint in detail and "prefers the formal reading" not in detail, (name, detail)
