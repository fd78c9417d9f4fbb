"""Exercises of lesson 13: a LoRA linear layer, merging an adapter, the loss mask of a prompt-answer
pair, the DPO loss and a sequence's log-probability; five self-check questions and one experiment
(the rank of the update that a rank-16 adapter learns on one layer).

The hints name the usual mistakes: α/r forgotten or α alone, B A in the wrong order, the prompt
left in the loss, the mask not shifted with the targets, the reference model left out (or updated),
the sign of the margin, β forgotten.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _
from course_utils import dpo, lora
from course_utils.cpu_threads import torch_threads

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


@question(explain=N_("with π = π_ref both log-ratios are 0, so the margin is 0 and the loss is −log σ(0) = ln 2 ≈ "
                     "0.693, whatever β is."), atol=1e-3,
          hints=[known_wrong({
              0.0: N_("the loss is −log σ(margin) and σ(0) = 1/2, not 1"),
              0.5: N_("that is σ(0); the loss is −log σ(0)"),
              1.0: N_("−log σ(0) = log 2 in nats, not 1"),
          })])
def dpo_loss_at_start() -> float:
    """The DPO loss (nats) at the first step, when the policy is still the reference."""
    return math.log(2)


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


@question(explain=N_("the adapter may use 16 directions but the data only asks for 4: B starts at zero, every step "
                     "moves B A toward the rank-4 residual, so the learned ΔW has four singular values near the true "
                     "ones and the rest below 1% of the largest."),
          hints=[known_wrong({
              16: N_("that is the adapter's rank, an upper bound; count the singular values of (α/r)·B A itself"),
              15: N_("that counts A's singular values: A starts random and full-rank; count those of (α/r)·B A"),
              7: N_("that counts B's singular values alone; the update is the product (α/r)·B A"),
              31: N_("that counts the merged weight W + ΔW, whose W is full-rank; count ΔW = (α/r)·B A alone"),
              32: N_("that counts the merged weight W + ΔW, whose W is full-rank; count ΔW = (α/r)·B A alone"),
          })])
def learned_rank() -> int:
    """Experiment: how many singular values of the update a rank-16 LoRA learned exceed 1% of the largest."""
    with torch_threads(1):
        s = torch.linalg.svdvals(_learned_update())
    return int((s > 0.01 * s[0]).sum())
