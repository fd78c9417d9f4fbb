"""Exercises of lesson 08: a batch of windows with shifted targets, perplexity, the warmup +
cosine learning-rate schedule, one BPE merge, and gradient clipping by the global norm.

The hints rebuild the usual mistakes (targets equal to the inputs, the log left in perplexity, warmup off
by one, clipping each tensor on its own, overlapping merges) and say which one an answer matches.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_tools.checks import Case, exercise
from course_tools.references._shared import close
from course_utils import bpe, train

# --- a batch of shifted windows ------------------------------------------------------------------


def _window_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n, b, t in [(10, 1, 3), (50, 4, 8), (500, 8, 32)]:
        data = torch.randint(65, (n,), generator=gen)
        starts = torch.randint(n - t, (b,), generator=gen)
        cases.append(Case(f"data (N={n},), starts (B={b},), block_size T={t}", (data, starts, t)))
    return cases


def _window_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return "return two tensors, (x, y)"
    x, y = got
    if close(x.float(), expected[0].float()) and isinstance(y, torch.Tensor) and torch.equal(y, x):
        return "y equals x: the target of position t is the next token, data[start + t + 1]"
    if isinstance(x, torch.Tensor) and x.shape[-1] == expected[0].shape[-1] + 1:
        return "the windows hold T + 1 tokens; x is the first T of them and y the last T"
    return None


@exercise(cases=_window_cases, hints=[_window_hint])
def shifted_windows(data: torch.Tensor, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """data (N,), starts (B,) -> x (B, T), y (B, T): x[b] = data[s : s+T], y[b] = data[s+1 : s+T+1]."""
    return train.shifted_windows(data, starts, block_size)


# --- perplexity ------------------------------------------------------------------------------------


def _ppl_cases(gen: torch.Generator) -> list[Case]:
    uniform = (torch.zeros(10, 65), torch.randint(65, (10,), generator=gen))
    cases = [Case("uniform logits (N=10, V=65): perplexity = V", uniform)]
    for n, v in [(1, 2), (8, 10), (50, 84)]:
        cases.append(Case(f"logits (N={n}, V={v}), targets (N={n},)",
                          (torch.randn(n, v, generator=gen) * 2, torch.randint(v, (n,), generator=gen))))
    return cases


def _ppl_hint(case: Case, got, expected) -> str | None:
    logits, targets = case.args
    ce = F.cross_entropy(logits, targets)
    if close(got, ce):
        return "that is the cross-entropy; perplexity is its exponential, exp(loss)"
    if close(got, 2 ** ce):
        return "2**loss is for a loss in bits; PyTorch's cross-entropy is in nats, so use exp(loss)"
    if close(got, F.cross_entropy(logits, targets, reduction="none").exp().mean()):
        return "exponentiate the mean loss, not the mean of per-token exponentials"
    return None


@exercise(cases=_ppl_cases, hints=[_ppl_hint])
def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (N, V), targets (N,) -> scalar: exp(mean cross-entropy), the effective number of choices."""
    return F.cross_entropy(logits, targets).exp()


# --- warmup + cosine -------------------------------------------------------------------------------

_WHERE = {"during warmup": lambda w, m: w // 2, "the last warmup step": lambda w, m: w - 1,
          "the first step after warmup": lambda w, m: w, "half way down the cosine": lambda w, m: (w + m) // 2,
          "late in the cosine": lambda w, m: m - 3, "at max_steps": lambda w, m: m,
          "past max_steps": lambda w, m: m + 5}


def _lr_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for label, where in _WHERE.items():
        warmup = int(torch.randint(4, 20, (), generator=gen))
        max_steps = warmup + int(torch.randint(20, 200, (), generator=gen))
        lr = float(torch.empty(()).uniform_(1e-4, 3e-3, generator=gen))
        cases.append(Case(f"step {label}", (where(warmup, max_steps), max_steps, lr, lr / 10, warmup)))
    return cases


def _lr_hint(case: Case, got, expected) -> str | None:
    step, max_steps, lr, min_lr, warmup = case.args
    if step < warmup and close(got, lr * step / warmup):
        return "warmup is off by one: step 0 should already get lr/warmup, so use (step + 1) / warmup"
    if step >= max_steps and close(got, lr):
        return "after max_steps the rate stays at min_lr"
    if step >= warmup and close(got, 0.5 * (1 + math.cos(math.pi * (step - warmup) / (max_steps - warmup))) * lr):
        return "the cosine should end at min_lr, not 0: min_lr + 0.5·(1 + cos(π·progress))·(lr − min_lr)"
    return None


@exercise(cases=_lr_cases, hints=[_lr_hint])
def lr_schedule(step: int, max_steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """The learning rate at ``step``: linear warmup to ``lr``, then a cosine down to ``min_lr``."""
    return train.lr_at(step, max_steps, lr, min_lr, warmup)


# --- one BPE merge ---------------------------------------------------------------------------------


def _merge_cases(gen: torch.Generator) -> list[Case]:
    cases = [Case("ids with a run of three equal tokens: merges must not overlap", ([7, 7, 7, 1], (7, 7), 256)),
             Case("the pair at the very end", ([3, 1, 2], (1, 2), 300)),
             Case("no occurrence", ([1, 3, 1, 3], (3, 3), 256))]
    for n, k in ((10, 2), (40, 5)):
        # random tokens 0..2 around k copies of the pair (3, 4), plus a reversed (4, 3) that must stay
        ids = torch.randint(0, 3, (n,), generator=gen).tolist()
        for slot in range(k):
            ids[slot * 3:slot * 3] = [3, 4]
        ids += [4, 3]
        cases.append(Case(f"{n} random ids with {k} copies of the pair", (ids, (3, 4), 256)))
    return cases


def _merge_hint(case: Case, got, expected) -> str | None:
    ids, pair, new_id = case.args
    if isinstance(got, (list, tuple)) and len(got) < len(expected):
        return "merged overlapping pairs: after a match, skip both tokens (i += 2) before looking again"
    if isinstance(got, (list, tuple)) and list(got) == list(ids) and list(ids) != expected:
        return "nothing was merged: compare ids[i], ids[i + 1] with the pair and append new_id on a match"
    return None


@exercise(cases=_merge_cases, hints=[_merge_hint])
def bpe_merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace each occurrence of ``pair`` in ``ids``, scanning left to right without overlaps, by ``new_id``."""
    return bpe.merge(ids, pair, new_id)


# --- gradient clipping -----------------------------------------------------------------------------


def _clip_cases(gen: torch.Generator) -> list[Case]:
    def grads(*shapes, scale=1.0):
        return [torch.randn(*s, generator=gen) * scale for s in shapes]

    return [Case("one gradient of shape (3, 4), norm far above max_norm=1", (grads((3, 4), scale=5.0), 1.0)),
            Case("gradients (5,), (2, 3), (4, 4), global norm above max_norm=1", (grads((5,), (2, 3), (4, 4)), 1.0)),
            Case("gradients (2, 2), (3,), norm below max_norm=100: unchanged", (grads((2, 2), (3,)), 100.0)),
            Case("gradients (8, 8), (8,), max_norm=0.5", (grads((8, 8), (8,), scale=0.3), 0.5))]


def _clip_hint(case: Case, got, expected) -> str | None:
    gs, max_norm = case.args
    if not isinstance(got, (list, tuple)) or len(got) != len(gs):
        return None
    per_tensor = [g * min(1.0, max_norm / (g.norm() + 1e-6)) for g in gs]
    if all(close(a, b) for a, b in zip(got, per_tensor, strict=True)) and len(gs) > 1:
        return "each tensor was clipped on its own; use one global norm over all gradients together"
    total = torch.sqrt(sum((g ** 2).sum() for g in gs))
    if all(close(a, g * max_norm / total) for a, g in zip(got, gs, strict=True)) and total < max_norm:
        return "gradients below max_norm must stay unchanged: scale by min(1, max_norm / norm)"
    return None


@exercise(cases=_clip_cases, hints=[_clip_hint])
def clip_gradients(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """Scale all gradients together so their global L2 norm is at most ``max_norm`` (as
    ``torch.nn.utils.clip_grad_norm_`` does: factor min(1, max_norm / (norm + 1e-6)))."""
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    scale = min(1.0, max_norm / (float(total) + 1e-6))
    return [g * scale for g in grads]
