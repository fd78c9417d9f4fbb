"""Direct preference optimisation (DPO, Rafailov et al. 2023): learn from pairs (chosen, rejected).

RLHF maximises reward minus β·KL(π ‖ π_ref). Its optimum is π*(y|x) ∝ π_ref(y|x)·exp(r(x, y)/β), so
a reward is implied by any policy: r(x, y) = β·log(π(y|x) / π_ref(y|x)) + β·log Z(x). Put that
reward in the Bradley–Terry model of preferences, P(chosen ≻ rejected) = σ(r_c − r_r): log Z(x)
cancels, and the negative log-likelihood of the observed preferences is

    L = −log σ(β·[(log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r))]),

a loss on four sequence log-probabilities; no reward model, no sampling. With m the bracket,
dL/dm = −β·σ(−β·m): pairs the policy already orders well (m ≫ 0) push little, wrong ones push by
about β. ``π_ref`` is frozen (a copy of the model before DPO): its log-probabilities are computed
once, without gradients.

Shapes: ``B`` pairs (or sequences), ``T`` positions, ``V`` vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sequence_logprobs(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log π(answer | prompt) per sequence, (B,): the sum of log p(target_t) over the positions
    where ``mask`` (B, T) is True (the answer's tokens; the prompt and padding are False).

    ``logits`` (B, T, V) at position t predict ``targets[:, t]`` (the inputs shifted by one)."""
    if logits.shape[:2] != targets.shape or targets.shape != mask.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, targets {tuple(targets.shape)} and mask "
                         f"{tuple(mask.shape)} must agree on (B, T)")
    token_logp = torch.gather(logits.float().log_softmax(-1), -1, targets.clamp_min(0)[..., None])[..., 0]
    return (token_logp * mask).sum(-1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """The mean DPO loss over B pairs; each argument is a (B,) tensor of sequence log-probabilities.
    ``logsigmoid`` computes log σ(z) without overflow for large |z| (``softplus(−z)`` would too, but
    PyTorch's softplus switches to the identity above 20 and its gradient is then rounded to 1)."""
    if not beta > 0:
        raise ValueError(f"beta must be positive (it scales the implied reward), got {beta!r}")
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()


def dpo_loss_as_classification(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
                               ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """The same loss written a second way: Bradley–Terry is a two-way softmax over the implied
    rewards (r_c, r_r), and the chosen answer is class 0, so L is their cross-entropy."""
    rewards = torch.stack([implied_reward(policy_chosen, ref_chosen, beta),
                           implied_reward(policy_rejected, ref_rejected, beta)], dim=-1)  # (B, 2)
    return F.cross_entropy(rewards, torch.zeros(len(rewards), dtype=torch.long))


def dpo_gradient(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                 ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """dL/d log π(y_c) and dL/d log π(y_r), each (B,), by hand: with m the margin,
    dL/dm = −β σ(−βm) / B, and m has +1 on log π(y_c) and −1 on log π(y_r)."""
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    d_margin = -beta * torch.sigmoid(-beta * margin) / len(margin)
    return d_margin, -d_margin


def implied_reward(policy: torch.Tensor, ref: torch.Tensor, beta: float) -> torch.Tensor:
    """r = β·(log π − log π_ref), (B,): the reward DPO's policy implies (up to β·log Z(x))."""
    return beta * (policy - ref)


def preference_report(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
                      ref_rejected: torch.Tensor, beta: float) -> dict[str, float]:
    """Preference accuracy (the share of pairs whose implied reward ranks the chosen answer first),
    the mean reward margin r_c − r_r, the share of pairs where log π(chosen) > log π(rejected) (no
    reference), and each answer's mean log-ratio to the reference, log π(y) − log π_ref(y): DPO's loss
    sees only their difference, so these two say whether the chosen answer rose or both fell."""
    r_c = implied_reward(policy_chosen, ref_chosen, beta)
    r_r = implied_reward(policy_rejected, ref_rejected, beta)
    return {"reward_accuracy": (r_c > r_r).float().mean().item(),
            "reward_margin": (r_c - r_r).mean().item(),
            "policy_prefers_chosen": (policy_chosen > policy_rejected).float().mean().item(),
            "chosen_logratio": (policy_chosen - ref_chosen).mean().item(),
            "rejected_logratio": (policy_rejected - ref_rejected).mean().item()}


def token_kl(policy_logits: torch.Tensor, ref_logits: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean KL(π ‖ π_ref) in nats over the next-token distributions at the positions of ``mask``
    (B, T): how far the tuned model has moved from the reference, on the same prefixes."""
    logp, logq = policy_logits.float().log_softmax(-1), ref_logits.float().log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)  # (B, T)
    return ((kl * mask).sum() / mask.sum()).item()
