"""Exercises of lesson 13: a LoRA linear layer, merging an adapter, the loss mask of a prompt-answer
pair, the DPO loss and a sequence's log-probability; LoRA injected into a model the grader builds, the
SFT batch of a chat template, and two short training runs the learner's own loops make (SFT of a small
chat model, then DPO of a grader-trained one), judged on the weights they return; five self-check
questions and one experiment (the rank of the update that a rank-16 adapter learns on one layer, for
three true ranks and three seeds).

The hints name the usual mistakes: α/r forgotten or α alone, B A in the wrong order, the prompt
left in the loss, the mask not shifted with the targets, the reference model left out (or updated),
the sign of the margin, β forgotten.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.lesson13_task import (
    CHAT_END,
    CHAT_SIZES,
    CHAT_TOKENIZER,
    PAD_ID,
    chat_encode,
    chat_numbers,
    chat_prompt,
    formal_numbers,
    probe_model,
)
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _
from course_utils import dpo, lora, sft
from course_utils.cpu_threads import torch_threads
from course_utils.gpt import GPT, GPTConfig
from course_utils.sino_korean import TARGET_CHARS, read_number, read_number_formal

# What the learner's own loops replace, removed from the sandbox while lesson 13 is graded
# (course_tools.grading.shortcuts), beyond what each reference calls.
TEACHES = {
    "lora_injection": ("course_utils.lora.LoRALinear", "course_utils.lora.lora_layers",
                       "course_utils.lora.linear_names", "course_utils.lora.merge_lora"),
    "sft_training": ("course_utils.sft.masked_loss", "course_utils.sft.answer_loss", "course_utils.sft.collate",
                     "course_utils.sft.masked_example", "course_utils.train.train", "course_utils.train.train_step"),
    "dpo_training": ("course_utils.dpo.dpo_loss", "course_utils.dpo.sequence_logprobs",
                     "course_utils.dpo.dpo_loss_as_classification", "course_utils.sft.collate",
                     "course_utils.sft.masked_example", "course_utils.train.train", "course_utils.train.train_step"),
}

# ------------------------------------------------------------------ a LoRA linear layer


def _lora_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for lead, i, o, r, alpha in [((3,), 4, 5, 1, 1.0), ((2, 3), 8, 6, 2, 4.0), ((2, 5), 16, 12, 4, 16.0)]:
        cases.append(Case(f"x {(*lead, i)}, W ({o}, {i}), b ({o},), A ({r}, {i}), B ({o}, {r}), alpha={alpha:g}",
                          (torch.randn(*lead, i, generator=gen), torch.randn(o, i, generator=gen),
                           torch.randn(o, generator=gen), torch.randn(r, i, generator=gen),
                           torch.randn(o, r, generator=gen), alpha)))
    return cases


def _lora_hint(case: Case, got, expected) -> str | None:
    x, W, b, A, B, alpha = case.args
    r = A.shape[0]
    base = x @ W.T + b
    if _close(got, base):
        return _("the low-rank path is missing: add (alpha / rank) · x Aᵀ Bᵀ to the frozen layer's output")
    if r != alpha and _close(got, base + x @ A.T @ B.T):
        return _("α/r forgotten: the update is scaled by alpha / rank")
    if r > 1 and _close(got, base + alpha * x @ A.T @ B.T):
        return _("scale by alpha / rank, not by alpha alone")
    if _close(got, x @ W.T + alpha / r * x @ A.T @ B.T):
        return _("the frozen layer's bias b belongs to the output too")
    return _("the frozen layer's output x Wᵀ + b, plus the low-rank path: x through A, then through B, "
             "scaled by alpha / r (r is the number of rows of A)")


@exercise(cases=_lora_cases, hints=[_lora_hint])
def lora_forward(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 alpha: float) -> torch.Tensor:
    """x (*, I), frozen W (O, I) and b (O,), A (r, I), B (O, r) -> (*, O): x Wᵀ + b + (α/r)·x Aᵀ Bᵀ."""
    base = nn.Linear(W.shape[1], W.shape[0])
    with torch.no_grad():
        base.weight.copy_(W)
        base.bias.copy_(b)
    layer = lora.LoRALinear(base, A.shape[0], alpha)
    with torch.no_grad():
        layer.A.copy_(A)
        layer.B.copy_(B)
        return layer(x)


# ------------------------------------------------------------------ merging an adapter


def _merge_cases(gen: torch.Generator) -> list[Case]:
    return [Case(f"W ({o}, {i}), A ({r}, {i}), B ({o}, {r}), alpha={alpha:g}",
                 (torch.randn(o, i, generator=gen), torch.randn(r, i, generator=gen),
                  torch.randn(o, r, generator=gen), alpha))
            for i, o, r, alpha in [(3, 3, 1, 1.0), (6, 4, 2, 8.0), (10, 7, 3, 6.0)]]


def _merge_hint(case: Case, got, expected) -> str | None:
    W, A, B, alpha = case.args
    r = A.shape[0]
    if isinstance(got, torch.Tensor) and got.shape != W.shape:
        return _("the merged weight has W's shape (O, I): ΔW = B A is (O, r)·(r, I)")
    if r != alpha and _close(got, W + B @ A):
        return _("α/r forgotten: ΔW = (alpha / rank) · B A")
    if W.shape[0] == W.shape[1] and _close(got, W + alpha / r * (B @ A).T):
        return _("ΔW is B A (O, I), not its transpose")
    return _("fold the low-rank path into W: add the product of B and A (an out × in matrix), scaled by alpha / r")


@exercise(cases=_merge_cases, hints=[_merge_hint])
def merge_weight(W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, alpha: float) -> torch.Tensor:
    """The weight (O, I) of the plain linear layer that computes what the adapted one computes."""
    return W + alpha / A.shape[0] * B @ A


# ------------------------------------------------------------------ the loss mask


def _mask_cases(gen: torch.Generator) -> list[Case]:
    del gen  # the cases are fixed sizes; nothing random
    return [Case(N_("prompt {p} tokens, answer {a} tokens, padded to {w}", p=p, a=a, w=w), (p, a, w))
            for p, a, w in [(1, 1, 2), (3, 2, 5), (4, 3, 9), (27, 12, 45)]]


def _shifted(p: int, a: int, w: int, shift: int = 1, prompt: bool = False) -> torch.Tensor:
    """The mask and its usual wrong twins: ``shift=0`` (aligned with the inputs), ``prompt=True``."""
    t = torch.arange(w - 1) + shift
    return (t >= (0 if prompt else p)) & (t < p + a)


def _mask_hint(case: Case, got, expected) -> str | None:
    p, a, w = case.args
    if not isinstance(got, torch.Tensor) or got.dtype != torch.bool:
        return _("return a bool tensor")
    if got.shape == (w,):
        return _("the mask goes with the targets y = ids[1:], which have width − 1 positions")
    if got.shape == expected.shape and torch.equal(got, _shifted(p, a, w, prompt=True)) and p > 1:
        return _("the prompt is left in the loss: only the answer's tokens are to be learned")
    if got.shape == expected.shape and torch.equal(got, _shifted(p, a, w, shift=0)):
        return _("not shifted: position t predicts ids[t + 1], so it is in the loss when ids[t + 1] is an answer token")
    return None


@exercise(cases=_mask_cases, hints=[_mask_hint])
def loss_mask(n_prompt: int, n_answer: int, width: int) -> torch.Tensor:
    """ids = prompt (n_prompt tokens) + answer (n_answer) + padding, ``width`` tokens in all; the model
    reads x = ids[:-1] and is scored on y = ids[1:]. Return the mask (width − 1,) of bools: True
    where y[t] is an answer token."""
    t = torch.arange(width - 1) + 1
    return (t >= n_prompt) & (t < n_prompt + n_answer)


# ------------------------------------------------------------------ the DPO loss


def _dpo_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n, beta in [(1, 0.5), (4, 0.1), (8, 2.0)]:
        pc, pr, rc, rr = (-10 * torch.rand(n, generator=gen) - 1 for _ in range(4))
        cases.append(Case(N_("{n} pairs of sequence log-probabilities, beta={beta:g}", n=n, beta=beta),
                          (pc, pr, rc, rr, beta)))
    return cases


def _dpo_hint(case: Case, got, expected) -> str | None:
    pc, pr, rc, rr, beta = case.args
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        return _("return the mean loss over the pairs, a scalar tensor")
    if _close(got, -F.logsigmoid(beta * (pc - pr)).mean()):
        return (_("the reference is missing: the margin is (log π − log π_ref)(chosen) − (log π − log "
                  "π_ref)(rejected), with π_ref a frozen copy (never updated)"))
    if _close(got, -F.logsigmoid(-beta * ((pc - rc) - (pr - rr))).mean()):
        return _("the sign is reversed: the loss is small when the chosen answer gains more than the rejected one")
    if beta != 1 and _close(got, -F.logsigmoid((pc - rc) - (pr - rr)).mean()):
        return _("β forgotten: multiply the margin by beta inside the sigmoid")
    if len(pc) > 1 and _close(got, -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).sum()):
        return _("average over the pairs (mean), not the sum")
    return _("the margin is how much more the policy than the reference prefers the chosen answer to the rejected one; "
             "the loss is −log σ of β times it (F.logsigmoid), averaged over the pairs")


@exercise(cases=_dpo_cases, hints=[_dpo_hint])
def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """Four (N,) tensors of sequence log-probabilities -> the mean DPO loss (a scalar):
    −log σ(β·[(log π − log π_ref)(chosen) − (log π − log π_ref)(rejected)])."""
    return dpo.dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)


# ------------------------------------------------------------------ sequence log-probabilities


def _logprob_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, v, n_prompt in [(1, 5, 7, 2), (3, 6, 11, 3), (4, 9, 13, 4)]:
        logits = 3 * torch.randn(b, t, v, generator=gen)
        targets = torch.randint(v, (b, t), generator=gen)
        mask = torch.zeros(b, t, dtype=torch.bool)
        for row in range(b):                   # the answer: from the prompt's end to a row's own length
            mask[row, n_prompt - 1:t - row] = True
        cases.append(Case(N_("logits ({b}, {t}, {v}), targets and mask ({b}, {t}), answers of different lengths",
                             b=b, t=t, v=v), (logits, targets, mask)))
    return cases


def _logprob_hint(case: Case, got, expected) -> str | None:
    logits, targets, mask = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _("return one number per sequence, a (B,) tensor: sum over the positions, not over the batch")
    token = torch.gather(logits.log_softmax(-1), -1, targets[..., None])[..., 0]
    if _close(got, token.sum(-1)):
        return _("the prompt and the padding are counted: multiply by the mask (or select its positions) "
                 "before the sum")
    raw = torch.gather(logits, -1, targets[..., None])[..., 0]
    if _close(got, (raw * mask).sum(-1)):
        return _("those are raw logits: take log_softmax over the vocabulary first")
    if _close(got, (token * mask).sum(-1) / mask.sum(-1)):
        return _("a sequence's log-probability is the sum of its tokens' log-probabilities, not their mean")
    return _("log_softmax over the vocabulary, pick each position's target (torch.gather), keep the positions of "
             "the mask and sum them per sequence")


@exercise(cases=_logprob_cases, hints=[_logprob_hint])
def sequence_logprobs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), targets (B, T), mask (B, T) bool -> (B,): log π(answer | prompt), the sum of
    log p(target_t) over the positions where the mask is True."""
    return dpo.sequence_logprobs(logits, targets, mask)


# ------------------------------------------------------------------ LoRA injected into the grader's model


def _injection_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for blocks, bias, targets, rank, alpha in [(1, True, ("q", "v"), 2, 4.0),
                                               (2, False, ("attn.o", "up", "norm"), 3, 3.0),
                                               (3, True, ("k", "down", "head"), 4, 16.0)]:
        d = int(torch.randint(6, 17, (1,), generator=gen))
        hidden = int(torch.randint(d + 1, 3 * d, (1,), generator=gen))
        spec = {"vocab": 11, "d": d, "hidden": hidden, "blocks": blocks, "bias": bias,
                "seed": int(torch.randint(2 ** 31, (1,), generator=gen))}
        ids = torch.randint(11, (2, 5), generator=gen)
        quoted = ", ".join(f"'{t}'" for t in targets)
        cases.append(Case(N_("a model of {blocks} block(s) of width {d}, targets {targets}, rank {rank}, "
                             "alpha={alpha:g}", blocks=blocks, d=d, targets=quoted, rank=rank, alpha=alpha),
                          (spec, list(targets), rank, alpha, ids)))
    return cases


def _injection_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    """``got``: what the notebook's ``injected`` read off the model after the learner's ``inject_lora``:
    (returned count, trainable numbers, names of the replaced modules, original parameters still
    trainable, largest output change at init, adapter tensors that received a gradient)."""
    count, names = expected
    if not isinstance(got, (tuple, list)) or len(got) != 6:
        return False, _("injected(...) must return the six values it computes; run its cell unchanged")
    returned, trainable, replaced, unfrozen, gap, with_grad = got
    replaced = sorted(str(n) for n in replaced)
    extra, missing = sorted(set(replaced) - set(names)), sorted(set(names) - set(replaced))
    if extra:
        return False, _("{name} was replaced, but it is not an nn.Linear whose name ends with one of the targets "
                        "(match whole name parts: name == t or name ends with '.' + t)", name=extra[0])
    if missing:
        return False, _("{name} is an nn.Linear whose name ends with a target, but it was not replaced",
                        name=missing[0])
    if int(unfrozen):
        return False, _("{n} of the model's own parameters still train: freeze every parameter first "
                        "(requires_grad_(False)), then add the adapters", n=int(unfrozen))
    if int(trainable) != count:
        return False, _("{got} numbers train, the adapters of these layers have {want}: A is (rank, in), B is "
                        "(out, rank), and nothing else trains", got=int(trainable), want=count)
    if not float(gap) <= 1e-6:
        return False, _("the adapted model's output differs from the base model's at init by {gap:.3g}: start B "
                        "at zero (and keep the base layer's bias)", gap=float(gap))
    if int(with_grad) < len(names):
        return False, _("only {k} of the {n} adapters get a gradient at init: keep A random (B starts at zero)",
                        k=int(with_grad), n=len(names))
    if not isinstance(returned, int) or returned != count:
        return False, _("inject_lora returned {got}; return the number of trainable parameters after injection",
                        got=returned)
    return True, _("{k} layers adapted, {count} trainable numbers, the rest frozen, the output unchanged at init",
                   k=len(names), count=count)


@exercise(cases=_injection_cases, function="injected", verdict=_injection_verdict,
          explain=N_("each chosen nn.Linear is wrapped, never copied: the wrapper holds the frozen layer and adds "
                     "(α/r)·x Aᵀ Bᵀ, which is zero while B is zero, so the model starts where it was."))
def lora_injection(spec: dict, targets: list[str], rank: int, alpha: float, ids: torch.Tensor) -> tuple[int, list[str]]:
    """The trainable count and the names of the layers LoRA replaces in the grader's model."""
    model = probe_model(spec)
    names = lora.add_lora(model, tuple(targets), rank, alpha)
    return lora.trainable_parameters(model), sorted(names)


# ------------------------------------------------------------------ the SFT batch of a chat template

def _batch_cases(gen: torch.Generator) -> list[Case]:
    digits, hangul = "0123456789", TARGET_CHARS

    def text(chars: str, lo: int, hi: int) -> str:
        length = int(torch.randint(lo, hi, (1,), generator=gen))
        return "".join(chars[int(i)] for i in torch.randint(len(chars), (length,), generator=gen))
    cases = []
    for size, lo, hi in [(1, 1, 3), (3, 1, 6), (5, 1, 9)]:
        pairs = [[text(digits, 1, 8), text(hangul, lo, hi)] for _ in range(size)]
        cases.append(Case(N_("{size} pair(s), answers of {lo} to {hi} characters", size=size, lo=lo, hi=hi - 1),
                          (pairs, PAD_ID)))
    return cases


def _batch_hint(case: Case, got, expected) -> str | None:
    pairs, pad = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return _("return three tensors: x, y and the mask")
    x, y, mask = got
    ex, ey, emask = expected
    if not all(isinstance(t, torch.Tensor) for t in got):
        return _("return three tensors: x, y and the mask")
    examples = [sft.masked_example(chat_encode(chat_prompt(m)), chat_encode(a + CHAT_END)) for m, a in pairs]
    if x.shape[1] == ex.shape[1] - 1 and len(pairs) > 0:
        return _("the end marker is part of the answer: encode answer + END, so that the model learns to stop")
    if x.shape != ex.shape:
        return _("x is every sequence but its last position, padded on the right to the longest: width − 1 columns")
    if torch.equal(x, ex) and not torch.equal(y, ey):
        return _("y is the same ids shifted left by one: y[t] = ids[t + 1]")
    if mask.shape == emask.shape and torch.equal(mask, sft.collate(examples, pad, mask_prompt=False)[2]):
        return _("the prompt is in the loss: only the answer's tokens (and its end marker) are targets")
    if mask.shape == emask.shape and torch.equal(mask.bool(), torch.ones_like(emask)):
        return _("the mask keeps everything: False on the prompt and on the padding")
    width = ex.shape[1] + 1
    aligned = torch.zeros(len(pairs), width, dtype=torch.bool)
    for b, (_ids, answer) in enumerate(examples):
        aligned[b, :len(answer)] = torch.tensor(answer)
    if mask.shape == emask.shape and torch.equal(mask.bool(), aligned[:, :-1]):
        return _("the mask goes with y, not with x: position t is in the loss when ids[t + 1] is an answer token")
    if not torch.equal(x, ex):
        return _("x: the prompt's ids, then the answer's (END included), then pad_id up to the longest sequence")
    return None


@exercise(cases=_batch_cases, hints=[_batch_hint])
def sft_batch(pairs: list[list[str]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(message, answer) pairs -> x, y, mask (B, T): the chat template around each message, the answer and
    END after it, padded on the right with ``pad_id``; y is x shifted by one; the mask is True where y is
    an answer token."""
    return sft.collate([sft.masked_example(chat_encode(chat_prompt(m)), chat_encode(a + CHAT_END))
                        for m, a in pairs], pad_id)


# ------------------------------------------------------------------ a short SFT run, the learner's own loop

SFT_SETTINGS = {"steps": 300, "batch_size": 64, "lr": 3e-3}
SFT_EXACT = 0.6  # held-out exact match to reach; the solution reached 82.5% to 98.5% in the seeds tried
HELD_OUT_READINGS = 200  # held-out numbers the grader reads with the trained model


def chat_model(state: dict | None = None, seed: int = 0) -> GPT:
    """The small chat model (CHAT_SIZES): fresh from ``seed``, or holding ``state``."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**CHAT_SIZES))
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def readings(model: nn.Module, numbers: list[int], max_new: int = 12) -> list[str]:
    """Greedy answers of the chat model to the prompts of ``numbers`` (prompts of one length batched)."""
    model.eval()
    out = {}
    for length in sorted({len(str(n)) for n in numbers}):
        group = [n for n in numbers if len(str(n)) == length]
        seq = torch.tensor([chat_encode(chat_prompt(str(n))) for n in group])
        start = seq.shape[1]
        for _step in range(max_new):
            seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], dim=1)
        for n, row in zip(group, seq[:, start:], strict=True):
            out[n] = CHAT_TOKENIZER.decode(row.tolist()).split(CHAT_END)[0]
    return [out[n] for n in numbers]


def exact_match(model: nn.Module, numbers: list[int], reading=read_number) -> float:
    return sum(s == reading(n) for s, n in zip(readings(model, numbers), numbers, strict=True)) / len(numbers)


def _trained_state(got: Any) -> tuple[dict | None, list[float] | None, Any]:
    """((state, losses), trace) as the traced verdicts receive it."""
    value, trace = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], dict):
        losses = value[1]  # a float64 tensor (a list of hundreds of numbers is over the sandbox's result caps)
        if isinstance(losses, torch.Tensor) and losses.ndim == 1 and losses.is_floating_point():
            return value[0], [float(v) for v in losses.tolist()], trace
    return None, None, trace


def _loop_problem(state, losses, trace, steps: int) -> str | None:
    if state is None:
        return _("the function must return (model.state_dict(), the loop's losses as a tensor); run its cell unchanged")
    if not isinstance(trace, torch.Tensor) or trace.ndim != 2 or trace.shape[0] != steps:
        counted = trace.shape[0] if isinstance(trace, torch.Tensor) and trace.ndim == 2 else 0
        return _("the grader counted {counted} optimizer.step() calls; the settings ask for exactly {steps}",
                 counted=counted, steps=steps)
    if len(losses) != steps:
        return _("return one loss per step: {got} values for {steps} steps", got=len(losses), steps=steps)
    if not all(math.isfinite(v) for v in losses):
        return _("a loss is not finite: the run diverged")
    return None


def _fell(losses: list[float]) -> tuple[float, float]:
    tenth = max(1, len(losses) // 10)
    return statistics.fmean(losses[:tenth]), statistics.fmean(losses[-tenth:])


# The loss of a loop's first step, on the fresh model of the case's seed and the first batch the contract draws,
# is fixed by which positions the loop scores: the grader computes it for the mask (the exercise) and for the usual
# mistakes, and compares the loss and the gradient norm that the learner's first step reported (the optimiser trace).
# The exercise's verdict on the trained weights alone cannot see the padding or the prompt in the loss: such loops
# still learn to read the numbers. At random weights every position costs about ln V, so the losses alone can come
# close (over the 1,000 seeds a case can draw, a wrong loss came within 1e-4 of a right one on up to 7 seeds); the
# two together keep every wrong way on every seed at least 29 times a tolerance away, while the right loss written
# four ways (1 or 2 threads) stayed within 7.2e-7 of the loss and 1e-8 (relative) of the norm.
FIRST_STEP_LOSS_TOL = 1e-4  # absolute, on losses near ln V ≈ 3.6; float32 round-off between two ways of writing
FIRST_STEP_NORM_TOL = 1e-3  # relative; the right loss written differently moves either by about 1e-6
FIRST_STEP_LOSSES = {  # the positions scored -> the hint when the learner's first step matches it
    "answer": None,  # the exercise: the mean over the mask's positions
    "answer, per sequence": None,  # the mean over each sequence's answer, then over the batch: also only answers
    "everything": N_("the prompt and the padding are in the loss: take the cross-entropy over the mask's positions "
                     "only (logits[mask], y[mask])"),
    "answer and padding": N_("the padding is in the loss: the positions after an answer's END are pad_id filler; "
                             "take the cross-entropy over the mask's positions only (logits[mask], y[mask])"),
    "prompt and answer": N_("the prompt is in the loss: the model would learn to write the user's turn too; take "
                            "the cross-entropy over the mask's positions only (logits[mask], y[mask])"),
    "all but pad_id": N_("ignore_index=pad_id leaves the prompt in the loss (and drops its spaces: pad_id is the "
                         "space's id); take the cross-entropy over the mask's positions only (logits[mask], y[mask])"),
    "answer, summed": N_("that is a sum over the answer tokens: the loss is their mean, so that the step size does "
                         "not grow with the batch"),
}


def sft_first_step(seed: int, batch_size: int) -> dict[str, tuple[float, float]]:
    """{positions scored: (loss, global gradient norm)} of the first step of an SFT loop on the chat model fresh
    from ``seed``, with the contract's first batch (``batch_size`` numbers drawn by a generator seeded with
    ``seed``), for each way of scoring in ``FIRST_STEP_LOSSES``."""
    numbers = _first_batch(chat_numbers()[0], batch_size, seed)
    x, y, mask = sft_batch([[str(n), read_number(n)] for n in numbers], PAD_ID)
    real = torch.arange(y.shape[1]) <= (mask * torch.arange(y.shape[1])).amax(1, keepdim=True)  # up to END
    model = chat_model(seed=seed)
    with torch_threads(1):
        per_token = F.cross_entropy(model(x)[0].transpose(1, 2), y, reduction="none")
        return _losses_and_norms({name: _scored(name, per_token, y, mask, real) for name in FIRST_STEP_LOSSES},
                                 model)


def _first_batch(train: list[int], batch_size: int, seed: int) -> list[int]:
    """The numbers of a loop's first batch under the exercises' sampling rule: ``batch_size`` indices into
    ``train`` drawn by torch.randint with a generator seeded with ``seed``."""
    picks = torch.randint(len(train), (batch_size,), generator=torch.Generator().manual_seed(seed))
    return [train[i] for i in picks.tolist()]


def _losses_and_norms(losses: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """{name: (loss, global norm of its gradient over ``model``'s trainable parameters, in float64)}; the
    losses share one graph, kept until the last."""
    params = [p for p in model.parameters() if p.requires_grad]
    out = {}
    for name, loss in losses.items():
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        out[name] = (float(loss.detach()), math.sqrt(sum(float(g.double().square().sum()) for g in grads
                                                         if g is not None)))
    return out


def _same_first_step(got: tuple[float, float], expected: tuple[float, float], norm_floor: float = 0.0) -> bool:
    """Whether a reported first step (loss, gradient norm) is ``expected``: the loss within FIRST_STEP_LOSS_TOL,
    the norm within FIRST_STEP_NORM_TOL of it (relative) plus ``norm_floor`` (for an expected norm of zero)."""
    return abs(got[0] - expected[0]) <= FIRST_STEP_LOSS_TOL and \
        abs(got[1] - expected[1]) <= FIRST_STEP_NORM_TOL * expected[1] + norm_floor


def _scored(name: str, per_token: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, real: torch.Tensor) \
        -> torch.Tensor:
    """The loss of a batch's per-token cross-entropies (B, T) scored as ``name`` says (``FIRST_STEP_LOSSES``)."""
    if name == "answer, per sequence":
        return ((per_token * mask).sum(1) / mask.sum(1)).mean()
    if name == "answer, summed":
        return per_token[mask].sum()
    keep = {"answer": mask, "everything": torch.ones_like(mask), "answer and padding": mask | ~real,
            "prompt and answer": real, "all but pad_id": y != PAD_ID}[name]
    return per_token[keep].mean()


def _first_step_problem(settings: dict, losses: list[float], trace: torch.Tensor) -> str | None:
    """None when the loop's first step scored the answers' positions only, else why not (a hint)."""
    got = (losses[0], float(trace[0, 1]))
    expected = sft_first_step(settings["seed"], settings["batch_size"])
    if any(_same_first_step(got, expected[name]) for name, hint in FIRST_STEP_LOSSES.items() if hint is None):
        return None
    for name, hint in FIRST_STEP_LOSSES.items():
        if hint is not None and _same_first_step(got, expected[name]):
            return _(hint)
    return _("your first step's loss and gradient are not those of the mean cross-entropy over the mask's positions "
             "on the fresh model and the first batch: draw the numbers with torch.randint and the generator seeded "
             "with settings[\"seed\"], build the batch with your sft_batch, and score only the mask's positions")


def _sft_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("a fresh chat model, seed {seed}, {steps} steps of {batch_size} pairs, lr {lr:g}", seed=seed,
                    **SFT_SETTINGS), (dict(SFT_SETTINGS, seed=seed),))
            for seed in (int(s) for s in torch.randint(1000, (2,), generator=gen))]


def _sft_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    settings = case.args[0]
    state, losses, trace = _trained_state(got)
    wrong = _loop_problem(state, losses, trace, settings["steps"])
    if wrong:
        return False, wrong
    wrong = _first_step_problem(settings, losses, trace)
    if wrong:
        return False, _("{wrong} (judged on your first step, where the model is the fresh one of the case's seed)",
                        wrong=wrong)
    try:
        model = chat_model(state)
    except (RuntimeError, ValueError, TypeError):
        return False, _("the weights that came back do not fit the chat model of CHAT_SIZES: train the model "
                        "sft_trained builds, in place")
    held = list(chat_numbers()[1][:HELD_OUT_READINGS])
    first, last = _fell(losses)
    before = exact_match(chat_model(seed=settings["seed"]), held)
    exact = exact_match(model, held)
    said = _("your loss fell from {first:.3f} to {last:.3f} (first and last tenth of the steps); the grader's "
             "greedy readings of {n} held-out numbers: {before:.1%} before, {exact:.1%} after",
             first=first, last=last, n=len(held), before=before, exact=exact)
    if not last < 0.25 * first:
        return False, _("{said} — the loss hardly fell: zero the gradients every step, step the optimiser after "
                        "backward(), and score only the mask's positions", said=said)
    if exact < SFT_EXACT:
        return False, _("{said}, below {need:.0%} — is the mask the one of sft_batch (the answer's tokens only), "
                        "and the loss the mean over those positions?", said=said, need=SFT_EXACT)
    return True, said


@exercise(cases=_sft_cases, function="sft_trained", verdict=_sft_verdict, traced=True,
          requires={"sft_batch": N_("the loop trains on the batches of your sft_batch")},
          explain=N_("300 steps of 64 pairs, with only the answers' tokens in the loss, take a model from random "
                     "weights to reading most held-out numbers."))
def sft_training(settings: dict) -> float:
    """The exact match the grader's readings must reach (judged by ``_sft_verdict``)."""
    return SFT_EXACT


# ------------------------------------------------------------------ a short DPO run, the learner's own loop

DPO_SETTINGS = {"steps": 40, "batch_size": 32, "lr": 1e-3, "beta": 0.1}
DPO_PREFERS = 0.9  # held-out pairs whose chosen answer the policy must score above the rejected one
DPO_HELD_PAIRS = 150


@lru_cache(maxsize=1)
def sft_reference_state() -> dict[str, torch.Tensor]:
    """The grader's SFT model: the chat model trained with the library (300 steps of 64 pairs, seed 0)."""
    train, _held = chat_numbers()
    model = chat_model(seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_SETTINGS["lr"])
    g = torch.Generator().manual_seed(0)
    with torch_threads(1):
        for _step in range(SFT_SETTINGS["steps"]):
            picks = torch.randint(len(train), (SFT_SETTINGS["batch_size"],), generator=g).tolist()
            x, y, mask = sft_batch([[str(train[i]), read_number(train[i])] for i in picks], PAD_ID)
            loss = sft.masked_loss(model(x)[0], y, mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def preference(policy: nn.Module, reference: nn.Module, numbers: list[int], beta: float) -> dict[str, float]:
    """DPO's measures on (formal, everyday) pairs of ``numbers``: the library's ``preference_report``."""
    chosen = sft_batch([[str(n), read_number_formal(n)] for n in numbers], PAD_ID)
    rejected = sft_batch([[str(n), read_number(n)] for n in numbers], PAD_ID)

    def logps(model: nn.Module, batch) -> torch.Tensor:
        x, y, mask = batch
        return dpo.sequence_logprobs(model.eval()(x)[0], y, mask)
    pc, pr = logps(policy, chosen), logps(policy, rejected)
    rc, rr = logps(reference, chosen), logps(reference, rejected)
    report = dpo.preference_report(pc, pr, rc, rr, beta)
    report["reference_prefers_chosen"] = (rc > rr).float().mean().item()
    report["loss"] = float(dpo.dpo_loss(pc, pr, rc, rr, beta))
    return report


def _dpo_cases(gen: torch.Generator) -> list[Case]:
    state = sft_reference_state()
    return [Case(N_("the grader's SFT model as reference, seed {seed}, {steps} steps of {batch_size} pairs, lr {lr:g}, "
                    "beta={beta:g}", seed=seed, **DPO_SETTINGS), (state, dict(DPO_SETTINGS, seed=seed)))
            for seed in (int(s) for s in torch.randint(1000, (2,), generator=gen))]


# The first DPO step is fixed too: the policy is the reference, so the right loss is ln 2 and its gradient that of
# β/2·(log π(chosen) − log π(rejected)) on the first batch the exercise's sampling rule draws. The weights alone do
# not tell β left out, or the tokens' mean log-probability in place of their sum, from the exercise (both reached
# 98.7-100% preference on the seeds tried, and passed); the gradient norm does. Over all 1,000 seeds a case can
# draw, the solution's loop (one thread) gave the grader's loss and norm exactly; the nearest mistake is the tokens'
# mean, whose norm is 0.13-0.19 of the right one (at least 813 norm tolerances away); β left out is 10 times it,
# the sum over pairs 32 times, β outside the sigmoid has the right norm but a loss 0.624 away, and a reference
# that moves with the policy gives a zero gradient. The tolerances are exercise 8's.
DPO_FIRST_STEP = {  # the loss written as -> the hint when the learner's first step matches it
    "exercise": None,
    "beta left out": N_("β is left out: the loss is −log σ(β·margin), with β = settings[\"beta\"] inside the "
                        "sigmoid"),
    "beta outside": N_("β multiplies the loss instead of the margin: −log σ(β·margin), with β inside the sigmoid"),
    "sum over pairs": N_("that is a sum over the pairs: the loss is their mean, so that the step size does not grow "
                         "with the batch"),
    "mean over tokens": N_("those are the answers' mean token log-probabilities: a sequence's log-probability is "
                           "the sum over its answer tokens (your sequence_logprobs)"),
    "reference moves": N_("the gradient is zero: the reference's log-probabilities moved with the policy's; compute "
                          "them with the frozen reference, under torch.no_grad()"),
}


def dpo_first_step(reference_state: dict, settings: dict) -> dict[str, tuple[float, float]]:
    """{loss written as: (loss, global gradient norm)} of a DPO loop's first step: the policy a copy of
    ``reference_state``, the first batch the exercise's rule draws (``settings["batch_size"]`` numbers of
    FORMAL_TRAIN by a generator seeded with ``settings["seed"]``), for each way in ``DPO_FIRST_STEP``."""
    numbers = _first_batch(formal_numbers()[0], settings["batch_size"], settings["seed"])
    chosen = sft_batch([[str(n), read_number_formal(n)] for n in numbers], PAD_ID)
    rejected = sft_batch([[str(n), read_number(n)] for n in numbers], PAD_ID)
    policy = chat_model(reference_state).train()
    beta = settings["beta"]
    with torch_threads(1):
        pc, pr = (dpo.sequence_logprobs(policy(x)[0], y, mask) for x, y, mask in (chosen, rejected))
        rc, rr = pc.detach(), pr.detach()
        tokens_c, tokens_r = chosen[2].sum(-1), rejected[2].sum(-1)
        losses = {"exercise": dpo.dpo_loss(pc, pr, rc, rr, beta),
                  "beta left out": -F.logsigmoid((pc - rc) - (pr - rr)).mean(),
                  "beta outside": -beta * F.logsigmoid((pc - rc) - (pr - rr)).mean(),
                  "sum over pairs": -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).sum(),
                  "mean over tokens": dpo.dpo_loss(pc / tokens_c, pr / tokens_r, rc / tokens_c, rr / tokens_r, beta),
                  "reference moves": dpo.dpo_loss(pc, pr, pc, pr, beta)}
        return _losses_and_norms(losses, policy)


def _dpo_first_step_problem(reference_state: dict, settings: dict, losses: list[float], trace: torch.Tensor) \
        -> str | None:
    """None when the loop's first step is the exercise's DPO loss on the first batch, else why not (a hint)."""
    got = (losses[0], float(trace[0, 1]))
    expected = dpo_first_step(reference_state, settings)
    for name, hint in DPO_FIRST_STEP.items():
        if _same_first_step(got, expected[name], norm_floor=1e-6):  # 1e-6: the reference-moves loss's zero norm
            return None if hint is None else _(hint)
    if abs(got[0] - math.log(2)) > FIRST_STEP_LOSS_TOL:
        return _("your first loss is {loss:.4f}; it should be ln 2 = 0.6931, since the policy starts as a copy of the "
                 "reference: compare log-probabilities against the frozen reference, −log σ(β·margin)", loss=got[0])
    return _("your first step's loss and gradient are not those of the DPO loss on the first batch: draw the numbers "
             "of FORMAL_TRAIN with torch.randint and the generator seeded with settings[\"seed\"], score both "
             "batches with your sequence_logprobs, and take your dpo_loss against the frozen reference")


def _dpo_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    reference_state, settings = case.args
    state, losses, trace = _trained_state(got)
    wrong = _loop_problem(state, losses, trace, settings["steps"])
    if wrong:
        return False, wrong
    wrong = _dpo_first_step_problem(reference_state, settings, losses, trace)
    if wrong:
        return False, _("{wrong} (judged on your first step, where the policy is still the reference)", wrong=wrong)
    try:
        policy = chat_model(state)
    except (RuntimeError, ValueError, TypeError):
        return False, _("the weights that came back do not fit the chat model of CHAT_SIZES: train the policy "
                        "dpo_trained builds, in place")
    reference = chat_model(reference_state)
    held = formal_numbers()[1][:DPO_HELD_PAIRS]
    r = preference(policy, reference, held, settings["beta"])
    first, last = _fell(losses)
    said = _("your loss fell from {first:.3f} to {last:.3f}; on {n} held-out pairs the policy prefers the formal "
             "reading in {prefers:.1%} (the reference in {before:.1%}), log π(chosen) moved {dc:+.2f} and log "
             "π(rejected) {dr:+.2f} against the reference, held-out DPO loss {loss:.3f}",
             first=first, last=last, n=len(held), prefers=r["policy_prefers_chosen"],
             before=r["reference_prefers_chosen"], dc=r["chosen_logratio"], dr=r["rejected_logratio"], loss=r["loss"])
    if r["policy_prefers_chosen"] < DPO_PREFERS or not last < first:
        return False, _("{said} — below {need:.0%}: is the margin the chosen log-ratio minus the rejected one, "
                        "with the reference frozen and β inside the sigmoid?", said=said, need=DPO_PREFERS)
    return True, said


@exercise(cases=_dpo_cases, function="dpo_trained", verdict=_dpo_verdict, traced=True,
          requires={"sft_batch": N_("the loop scores the batches of your sft_batch"),
                    "sequence_logprobs": N_("the loop compares your sequence log-probabilities"),
                    "dpo_loss": N_("the loop minimises your DPO loss")},
          explain=N_("DPO moves the policy's log-ratio of the formal reading above that of the everyday one; the "
                     "reference, frozen, keeps the loss at ln 2 until the policy moves."))
def dpo_training(reference_state: dict, settings: dict) -> float:
    """The share of held-out pairs the policy must prefer right (judged by ``_dpo_verdict``)."""
    return DPO_PREFERS


# ------------------------------------------------------------------ self-check questions
@question(explain=N_("each adapted matrix trains r·(in + out) numbers whatever its direction: 4·(576 + 1,536) = "
                     "8,448; three matrices a block (gate, up, down) make 25,344, × 30 blocks = 760,320."),
          hints=[known_wrong({
              506880: N_("SwiGLU's feed-forward network has three matrices: the gate, the up and the down projection"),
              25344: N_("that is one block; the adapters are on all 30"),
              322560: N_("each adapter has two matrices: A (r × in) and B (out × r), r·(in + out) numbers"),
              437760: N_("each adapter has two matrices: A (r × in) and B (out × r), r·(in + out) numbers"),
              79626240: N_("LoRA does not train W itself: r·(in + out) numbers per matrix, not in · out"),
          })])
def smollm2_lora_parameters() -> int:
    """Trainable parameters of rank-4 LoRA on the three feed-forward matrices of all 30 SmolLM2 blocks."""
    return 30 * 3 * 4 * (576 + 1536)


@question(explain=N_("the gradient of A is (α/r)·Bᵀ·(…) and the gradient of B is (α/r)·(…)·A: with both zero, both "
                     "gradients are zero and the adapter never moves."),
          hints=[known_wrong({
              "a": (N_("both zero starts the model unchanged, but dL/dA has a factor B and dL/dB a factor A: look at "
                       "what they are at step 0")),
              "c": N_("0 · 0 = 0: the model would start unchanged"),
              "d": N_("nothing grows: with zero gradients nothing moves at all"),
          })])
def both_zero_choice() -> str:
    """Multiple choice: what happens if A and B both start at zero."""
    return "b"


@question(explain=N_("with π = π_ref the margin m is 0; ∂L/∂m = −σ(−m) = −1/2 there, and m holds log π(chosen) "
                     "with +β and log π(rejected) with −β: the chosen answer is pushed up and the rejected one down, "
                     "each with weight β/2, from the first step. The push shrinks as the margin grows."),
          hints=[known_wrong({
              "a": N_("the margin is multiplied by β, and the slope of −log σ(m) is −σ(−m): −1/2 at m = 0, not −1"),
              "c": N_("−log σ(m) is not flat at m = 0: its slope there is −1/2; a loss can start at ln 2 and still "
                      "have a gradient"),
              "d": N_("log π(rejected) is in the margin with a minus sign: it gets the same weight, pushed the other "
                      "way"),
          })])
def dpo_start_gradient() -> str:
    """Multiple choice: the DPO loss's derivatives with respect to log π(chosen) and log π(rejected) at step 1."""
    return "b"


@question(explain=N_("the 9 answer tokens (the reading and the end marker) are predicted by the 9 positions before "
                     "them; the 23 prompt tokens are given and the 12 pads are no tokens at all."),
          hints=[known_wrong({
              43: N_("the prompt and the padding are left in the loss: only the answer's tokens are targets"),
              31: N_("the prompt is left in the loss: only the answer is to be learned"),
              8: N_("the end marker is an answer token too: the model must learn where to stop"),
              10: N_("the first target is ids[1]: the position before the answer's first token predicts it, and "
                     "nothing after the end marker is an answer token"),
              23: N_("those are the prompt's tokens, the ones left out"),
          })])
def answer_positions() -> int:
    """Positions in the SFT loss for a 23-token prompt and a 9-token answer padded to 44 tokens."""
    return 9


@question(explain=N_("the margin is (+1) − (+3) = −2 nats, so βm = −1 and the loss is −log σ(−1) = log(1 + e) ≈ "
                     "1.313: more than ln 2, because the rejected answer gained more than the chosen one, although "
                     "both rose."), atol=1e-3,
          hints=[known_wrong({
              0.313: N_("that is −log σ(+1): the margin is the chosen log-ratio minus the rejected one, here −2"),
              0.127: N_("the two log-ratios are subtracted, not added: m = (+1) − (+3)"),
              2.127: N_("β multiplies the margin inside the sigmoid: −log σ(β·m), with β = 0.5"),
              0.693: N_("that is the loss at the start, when both log-ratios are 0"),
          })])
def both_rose_loss() -> float:
    """The DPO loss (nats, β = 0.5) of a pair whose chosen log-ratio is +1 and rejected log-ratio +3."""
    return math.log(1 + math.e)


# ------------------------------------------------------------------ the experiment


def _learned_update(rank: int = 16, seed: int = 0, true_rank: int = 4, steps: int = 300) -> torch.Tensor:
    """ΔW (32, 32) that a rank-``rank`` LoRA learns on one 32 × 32 layer trained toward W + ΔW, where the
    true ΔW has rank ``true_rank``: the draws and the training the experiment's text prescribes."""
    g = torch.Generator().manual_seed(seed)
    D = 32
    base = nn.Linear(D, D)
    with torch.no_grad():
        base.weight.copy_(torch.randn(D, D, generator=g) / math.sqrt(D))
        base.bias.zero_()
    delta = torch.randn(D, true_rank, generator=g) @ torch.randn(true_rank, D, generator=g) / math.sqrt(D)
    x = torch.randn(256, D, generator=g)
    with torch.no_grad():
        y = base(x) + x @ delta.T
    torch.manual_seed(seed)
    layer = lora.LoRALinear(base, rank, alpha=2.0 * rank)
    opt = torch.optim.Adam([layer.A, layer.B], lr=1e-2)
    for _step in range(steps):
        loss = F.mse_loss(layer(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return layer.delta_weight()


TRUE_RANKS, SEEDS = (1, 4, 8), (0, 1, 2)


@question(explain=N_("in every row the adapter uses as many directions as the true update has, whatever the seed: B "
                     "starts at zero and each step moves B A along the residual, a matrix of the true rank, so the "
                     "directions the data never asks for stay below 1% of the largest."),
          hints=[known_wrong({
              ((16, 16, 16),) * 3: N_("that is the adapter's rank, an upper bound; count the singular values of "
                                      "(α/r)·B A itself"),
              ((15, 15, 15),) * 3: N_("that counts A's singular values: A starts random and full-rank; count those "
                                      "of (α/r)·B A"),
              ((32, 32, 32),) * 3: N_("that counts the merged weight W + ΔW, whose W is full-rank; count "
                                      "ΔW = (α/r)·B A alone"),
          })])
def learned_ranks() -> tuple[tuple[int, ...], ...]:
    """Experiment: for each true rank (rows: 1, 4, 8) and seed (columns: 0, 1, 2), how many singular values of the
    update a rank-16 LoRA learned exceed 1% of the largest."""
    with torch_threads(1):
        return tuple(tuple(_rank_of(_learned_update(seed=seed, true_rank=rank)) for seed in SEEDS)
                     for rank in TRUE_RANKS)


def _rank_of(update: torch.Tensor) -> int:
    s = torch.linalg.svdvals(update)
    return int((s > 0.01 * s[0]).sum())
