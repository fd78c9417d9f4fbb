"""Exercises of lesson 08: a batch of windows with shifted targets, perplexity, the warmup +
cosine learning-rate schedule, one BPE merge, and gradient clipping by the global norm; five
self-check questions and one experiment (a learning-rate sweep on a tiny GPT).

The hints rebuild the usual mistakes (targets equal to the inputs, the log left in perplexity, warmup off
by one, clipping each tensor on its own, overlapping merges) and say which one an answer matches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.messages import N_, _
from course_utils import bpe, gpt, train
from course_utils.cpu_threads import torch_threads

# --- a batch of shifted windows ------------------------------------------------------------------


def _window_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n, b, t in [(10, 1, 3), (50, 4, 8), (500, 8, 32)]:
        data = torch.randint(65, (n,), generator=gen)
        starts = torch.randint(n - t, (b,), generator=gen)
        cases.append(Case(N_("data (N={n},), starts (B={b},), block_size T={t}", n=n, b=b, t=t), (data, starts, t)))
    return cases


def _window_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return _("return two tensors, (x, y)")
    x, y = got
    if close(x.float(), expected[0].float()) and isinstance(y, torch.Tensor) and torch.equal(y, x):
        return _("y equals x: the target of position t is the next token, data[start + t + 1]")
    if isinstance(x, torch.Tensor) and x.shape[-1] == expected[0].shape[-1] + 1:
        return _("the windows hold T + 1 tokens; x is the first T of them and y the last T")
    return None


@exercise(cases=_window_cases, hints=[_window_hint])
def shifted_windows(data: torch.Tensor, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """data (N,), starts (B,) -> x (B, T), y (B, T): x[b] = data[s : s+T], y[b] = data[s+1 : s+T+1]."""
    return train.shifted_windows(data, starts, block_size)


# --- perplexity ------------------------------------------------------------------------------------


def _ppl_cases(gen: torch.Generator) -> list[Case]:
    uniform = (torch.zeros(10, 65), torch.randint(65, (10,), generator=gen))
    cases = [Case(N_("uniform logits (N=10, V=65): perplexity = V"), uniform)]
    for n, v in [(1, 2), (8, 10), (50, 84)]:
        cases.append(Case(N_("logits (N={n}, V={v}), targets (N={n},)", n=n, v=v),
                          (torch.randn(n, v, generator=gen) * 2, torch.randint(v, (n,), generator=gen))))
    return cases


def _ppl_hint(case: Case, got, expected) -> str | None:
    logits, targets = case.args
    ce = F.cross_entropy(logits, targets)
    if close(got, ce):
        return _("that is the cross-entropy; perplexity is its exponential, exp(loss)")
    if close(got, 2 ** ce):
        return _("2**loss is for a loss in bits; PyTorch's cross-entropy is in nats, so use exp(loss)")
    if close(got, F.cross_entropy(logits, targets, reduction="none").exp().mean()):
        return _("exponentiate the mean loss, not the mean of per-token exponentials")
    return None


@exercise(cases=_ppl_cases, hints=[_ppl_hint])
def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (N, V), targets (N,) -> scalar: exp(mean cross-entropy), the effective number of choices."""
    return F.cross_entropy(logits, targets).exp()


# --- warmup + cosine -------------------------------------------------------------------------------

_WHERE = {N_("during warmup"): lambda w, m: w // 2, N_("the last warmup step"): lambda w, m: w - 1,
          N_("the first step after warmup"): lambda w, m: w, N_("half way down the cosine"): lambda w, m: (w + m) // 2,
          N_("late in the cosine"): lambda w, m: m - 3, N_("at max_steps"): lambda w, m: m,
          N_("past max_steps"): lambda w, m: m + 5}


def _lr_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for label, where in _WHERE.items():
        warmup = int(torch.randint(4, 20, (), generator=gen))
        max_steps = warmup + int(torch.randint(20, 200, (), generator=gen))
        lr = float(torch.empty(()).uniform_(1e-4, 3e-3, generator=gen))
        cases.append(Case(N_("step {label}", label=label), (where(warmup, max_steps), max_steps, lr, lr / 10, warmup)))
    return cases


def _lr_hint(case: Case, got, expected) -> str | None:
    step, max_steps, lr, min_lr, warmup = case.args
    if step < warmup and close(got, lr * step / warmup):
        return _("warmup is off by one: step 0 should already get lr/warmup, so use (step + 1) / warmup")
    if step >= max_steps and close(got, lr):
        return _("after max_steps the rate stays at min_lr")
    if step >= warmup and close(got, 0.5 * (1 + math.cos(math.pi * (step - warmup) / (max_steps - warmup))) * lr):
        return _("the cosine should end at min_lr, not 0: min_lr + 0.5·(1 + cos(π·progress))·(lr − min_lr)")
    return None


@exercise(cases=_lr_cases, hints=[_lr_hint])
def lr_schedule(step: int, max_steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """The learning rate at ``step``: linear warmup to ``lr``, then a cosine down to ``min_lr``."""
    return train.lr_at(step, max_steps, lr, min_lr, warmup)


# --- one BPE merge ---------------------------------------------------------------------------------


def _merge_cases(gen: torch.Generator) -> list[Case]:
    cases = [Case(N_("ids with a run of three equal tokens: merges must not overlap"), ([7, 7, 7, 1], (7, 7), 256)),
             Case(N_("the pair at the very end"), ([3, 1, 2], (1, 2), 300)),
             Case(N_("no occurrence"), ([1, 3, 1, 3], (3, 3), 256))]
    for n, k in ((10, 2), (40, 5)):
        # random tokens 0..2 around k copies of the pair (3, 4), plus a reversed (4, 3) that must stay
        ids = torch.randint(0, 3, (n,), generator=gen).tolist()
        for slot in range(k):
            ids[slot * 3:slot * 3] = [3, 4]
        ids += [4, 3]
        cases.append(Case(N_("{n} random ids with {k} copies of the pair", n=n, k=k), (ids, (3, 4), 256)))
    return cases


def _merge_hint(case: Case, got, expected) -> str | None:
    ids, pair, new_id = case.args
    if isinstance(got, (list, tuple)) and len(got) < len(expected):
        return _("merged overlapping pairs: after a match, skip both tokens (i += 2) before looking again")
    if isinstance(got, (list, tuple)) and list(got) == list(ids) and list(ids) != expected:
        return _("nothing was merged: compare ids[i], ids[i + 1] with the pair and append new_id on a match")
    return None


@exercise(cases=_merge_cases, hints=[_merge_hint])
def bpe_merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace each occurrence of ``pair`` in ``ids``, scanning left to right without overlaps, by ``new_id``."""
    return bpe.merge(ids, pair, new_id)


# --- gradient clipping -----------------------------------------------------------------------------


def _clip_cases(gen: torch.Generator) -> list[Case]:
    def grads(*shapes, scale=1.0):
        return [torch.randn(*s, generator=gen) * scale for s in shapes]

    return [Case(N_("one gradient of shape (3, 4), norm far above max_norm=1"), (grads((3, 4), scale=5.0), 1.0)),
            Case(N_("gradients (5,), (2, 3), (4, 4), global norm above max_norm=1"),
                 (grads((5,), (2, 3), (4, 4)), 1.0)),
            Case(N_("gradients (2, 2), (3,), norm below max_norm=100: unchanged"), (grads((2, 2), (3,)), 100.0)),
            Case(N_("gradients (8, 8), (8,), max_norm=0.5"), (grads((8, 8), (8,), scale=0.3), 0.5))]


def _clip_hint(case: Case, got, expected) -> str | None:
    gs, max_norm = case.args
    if not isinstance(got, (list, tuple)) or len(got) != len(gs):
        return None
    per_tensor = [g * min(1.0, max_norm / (g.norm() + 1e-6)) for g in gs]
    if all(close(a, b) for a, b in zip(got, per_tensor, strict=True)) and len(gs) > 1:
        return _("each tensor was clipped on its own; use one global norm over all gradients together")
    total = torch.sqrt(sum((g ** 2).sum() for g in gs))
    if all(close(a, g * max_norm / total) for a, g in zip(got, gs, strict=True)) and total < max_norm:
        return _("gradients below max_norm must stay unchanged: scale by min(1, max_norm / norm)")
    return None


@exercise(cases=_clip_cases, hints=[_clip_hint])
def clip_gradients(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Scale all gradients together so their global L2 norm is at most ``max_norm`` (as
    ``torch.nn.utils.clip_grad_norm_`` does: factor min(1, max_norm / (norm + 1e-6)))."""
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    scale = min(1.0, max_norm / (float(total) + 1e-6))
    return [g * scale for g in grads]


# --- self-check questions ------------------------------------------------------------------------

def _near(table: dict[float, str], atol: float) -> Callable:
    """A hint for numeric answers typed with a few digits: the misconception of the nearest known
    wrong value within ``atol``."""

    def hint(case: Case, got, expected) -> str | None:
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return None
        return next((why for wrong, why in table.items() if abs(got - wrong) <= atol), None)

    return hint


@question(explain=N_("the validation loss turns up while the training loss keeps falling: from about step 2,000 the "
                     "model fits its own training text better at the expense of unseen text, it overfits; the "
                     "checkpoint with the lowest validation loss is the one to keep."),
          hints=[known_wrong({
              "b": N_("a learning rate too high makes the training loss jump or diverge; here it falls steadily"),
              "c": N_("a model too small could not push the training loss down to 1.1 while validation rises"),
              "d": N_("a validation text of other works raises the whole validation curve; it does not make it turn "
                      "up in the middle of the run"),
          })])
def loss_curve_choice() -> str:
    """Multiple choice: what a training loss falling steadily to 1.1 while the validation loss falls to 1.6
    at step 2,000 and then rises to 1.9 by step 6,000 implies."""
    return "a"


@question(explain=N_("windows overlap, so with a random split most validation windows would share their text with "
                     "training windows: the validation loss would measure recall, not prediction of unseen text."),
          hints=[known_wrong({
              "a": N_("speed is the same either way: sampling a window costs one slice"),
              "c": N_("the last 10 % is harder (other works), but that is a side effect the lesson measures, not the "
                      "reason for the split"),
              "d": N_("that is what the lesson's held-out chunks are for; a split by position exists so that no "
                      "validation text was trained on"),
          })])
def split_choice() -> str:
    """Multiple choice: why the split is by position, not by shuffling windows."""
    return "b"


@question(explain=N_("12 windows × 64 tokens per micro-batch, 4 micro-batches per step, on each of 2 processes: 12 · "
                     "64 · 4 · 2 = 6,144 tokens per optimiser step."),
          atol=0.5,
          hints=[known_wrong({
              768: N_("768 is one micro-batch on one process; the step also sums the 4 micro-batches on both GPUs"),
              3072: N_("that is one GPU's share; DDP averages the gradients of both processes, so the step sees both"),
              1536: N_("gradient accumulation adds the 4 micro-batches of each process to one step"),
              24576: N_("the context length counts once: each window gives 64 predictions"),
          })])
def tokens_per_step() -> int:
    """Predicted tokens per optimiser step: batch 12, context 64, grad_accum 4, 2 DDP processes."""
    return 12 * 64 * 4 * 2


@question(explain=N_("the course's AdamW decays the matrices (embeddings and linear layers) and leaves biases and "
                     "LayerNorm gains alone: shrinking a gain or a bias towards 0 has no regularising purpose."),
          hints=[known_wrong({
              "a": N_("decaying LayerNorm gains pulls them towards 0 and silently shrinks every normalised "
                      "activation: the course decays the matrices only"),
              "b": N_("it is the other way round: the matrices are decayed, the 1-D parameters are not"),
              "d": N_("decoupled weight decay is a separate shrink step, not the learning rate"),
          })])
def decayed_params() -> str:
    """Multiple choice: which parameters the course's AdamW applies weight decay to."""
    return "c"


@question(explain=N_("6 N FLOPs per token = 6 · 10⁸, times 2 · 10⁵ tokens/s = 1.2 · 10¹⁴ FLOP/s = 120 TFLOP/s; 120 / "
                     "312 = 38.5 % of the bf16 peak."),
          atol=0.5,
          hints=[_near({12.8: "2N counts the forward pass only; training adds the backward pass (4N): 6N in all",
                        25.6: "4N is the backward pass alone; training costs forward + backward = 6N per token",
                        76.9: "that divides by the TF32 peak (156); the run is in bf16, whose peak is 312",
                        0.38: "the question asks for a percentage: multiply the fraction by 100"}, atol=0.3)])
def mfu_percent() -> float:
    """MFU in % of a 100M-parameter model at 200,000 tokens/s on a 312 TFLOP/s (bf16) GPU, 6N per token."""
    return 100 * 6 * 100e6 * 200e3 / 312e12


# --- experiment: a learning-rate sweep -------------------------------------------------------------

BIGRAM_V = 32
LR_GRID = (1e-4, 1e-3, 1e-2, 1e-1)


def bigram_tokens(n: int, seed: int = 0) -> torch.Tensor:
    """(n,) tokens of a fixed random bigram language over BIGRAM_V symbols: each token depends
    only on the one before it, so a trained model's loss can fall to the chain's entropy. The
    experiment cell of solutions/08 defines the same function (the grader hides this module)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.softmax(2.0 * torch.randn(BIGRAM_V, BIGRAM_V, generator=gen), dim=-1)
    successors = torch.multinomial(table, n, replacement=True, generator=gen).tolist()
    tokens, state = [], 0
    for i in range(n):
        state = successors[state][i]
        tokens.append(state)
    return torch.tensor(tokens)


def loss_after_training(lr: float, data: torch.Tensor, seed: int = 0) -> float:
    """The validation loss (last 2,000 tokens) of the smoke-size GPT after 60 steps of batch 16 at peak ``lr``."""
    torch.manual_seed(seed)
    model = gpt.GPT(replace(gpt.GPTConfig.preset("smoke"), vocab_size=BIGRAM_V))
    cfg = train.TrainConfig(batch_size=16, max_iters=60, warmup_iters=6, lr=lr, min_lr=lr / 10, eval_interval=60,
                            eval_iters=4, seed=seed, compile=False, dtype="float32")
    return train.train(model, data[:-2000], data[-2000:], cfg, progress=False).val_loss


@question(explain=N_("60 Adam steps move each weight by at most about 60·lr: at 1e-4 the loss has barely left ln 32 "
                     "and at 1e-3 it has only started down; at 0.1 the steps overshoot and the loss ends near ln 32 "
                     "again; 0.01 gets within a few tenths of the chain's entropy."),
          hints=[known_wrong({
              1e-4: N_("1e-4 gives the highest loss: did you take the max, or did every run train at the same rate "
                       "(check that your function passes lr and min_lr = lr/10 to the schedule)?"),
              1e-3: N_("1e-3 has not gone far in 60 steps: compare the losses after the 60 steps, not earlier"),
              1e-1: N_("at 0.1 the loss ends back near ln 32 ≈ 3.47: pick the lowest final validation loss"),
          })])
def best_lr() -> float:
    """Experiment: the peak learning rate in LR_GRID with the lowest validation loss after 60 steps."""
    data = bigram_tokens(20_000)
    with torch_threads(1):  # a tiny model: one thread is fastest, and on a busy machine far faster
        return min(LR_GRID, key=lambda lr: loss_after_training(lr, data))
