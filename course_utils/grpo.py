"""GRPO (group relative policy optimisation, DeepSeekMath 2024): reinforcement learning without a value network.

The language model is a policy π_θ: a completion o of a prompt q is a sequence of actions (tokens).
For each prompt GRPO samples a *group* of G completions, scores each with a reward r_i (e.g. an
answer check, ``course_utils.rewards``), and uses the group itself as the baseline: the advantage of
completion i is A_i = (r_i − mean(r)) / std(r) over its group, the same for each of its tokens. PPO
would learn a value network for that baseline; the group's mean replaces it. The loss of DeepSeekMath
(eq. 3), minimised here, is

    L = −1/G Σ_i 1/|o_i| Σ_t [ min(ρ_t A_i, clip(ρ_t, 1 − ε, 1 + ε) A_i) − β·KL_t ],
    ρ_t = π_θ(o_t | q, o_<t) / π_old(o_t | q, o_<t),
    KL_t = π_ref/π_θ − log(π_ref/π_θ) − 1   (the k3 estimator of KL(π_θ ‖ π_ref), ≥ 0 for every token),

where π_old sampled the group (ρ = 1 at the first step on it; the clip stops later steps on the same
group from moving far) and π_ref is the frozen model before RL. At ρ = 1 the gradient of the
surrogate is REINFORCE's, A·∇log π. The 1/|o_i| per completion is one choice of normaliser: DAPO
divides by the number of tokens in the batch and Dr. GRPO by a constant, since 1/|o_i| weighs each
token of a short completion more (a long wrong answer is pushed down less per token).

Here: ``sample_group`` (G completions per prompt, batched, with the course's KV cache), ``completion_logprobs``
(log π of each completion token, the (B, T) inputs of the loss), ``group_advantages`` and ``grpo_loss``.

Shapes: ``P`` prompts, ``G`` completions per prompt, ``B`` = P·G rows, ``T`` prompt length (in
``sample_group``) or completion length (in the loss), ``N`` completion length, ``V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from course_utils.attention import ModelKVCache
from course_utils.generate import sample_next

Normalisation = Literal["sequence", "token", "constant"]


@dataclass(frozen=True)
class GroupSample:
    """G completions for each of P prompts: row p·G + g is completion g of prompt p.

    ``prompts`` (B, T) repeats each prompt G times (the rows the completions continue);
    ``completions`` (B, N) holds the sampled ids, the stop token included, then the stop token again
    as padding; ``mask`` (B, N) is True on the completion's own tokens (up to and including its stop
    token), False on the padding after it. A completion that never stopped fills all N positions."""

    prompts: torch.Tensor
    completions: torch.Tensor
    mask: torch.Tensor
    G: int
    stop_token: int | None = None

    def token_lists(self) -> list[list[int]]:
        """Each row's completion as a list of ids (its masked tokens, less the final stop token),
        ready for ``tokenizer.decode``."""
        lists = []
        for row, n in zip(self.completions.tolist(), self.mask.sum(-1).tolist(), strict=True):
            ids = row[:n]
            lists.append(ids[:-1] if ids and ids[-1] == self.stop_token else ids)
        return lists


def _check_group_args(prompts: torch.Tensor, G: int, max_new_tokens: int, max_len: int) -> None:
    if prompts.dim() != 2 or prompts.shape[1] == 0 or prompts.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"prompts must be (P, T) integer token ids with T >= 1, got shape {tuple(prompts.shape)} "
                         f"and dtype {prompts.dtype}; prompts of different lengths go in separate calls")
    if G < 1:
        raise ValueError(f"G must be >= 1 completions per prompt, got {G}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prompts.shape[1] + max_new_tokens > max_len:
        raise ValueError(f"the prompts ({prompts.shape[1]} tokens) plus {max_new_tokens} new tokens exceed the "
                         f"context of {max_len} tokens; shorten the prompts or lower max_new_tokens")


@torch.no_grad()
def sample_group(model: nn.Module, prompts: torch.Tensor, G: int, max_new_tokens: int,
                 stop_token: int | None = None, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, seed: int | None = None) -> GroupSample:
    """Sample G completions of each prompt in ``prompts`` (P, T) in one batch of P·G rows -> ``GroupSample``.

    The P prompts are run once (the prefill) and their KV cache is repeated G times, so a group
    shares its prompt's keys and values; then every row draws one token per step with the rules
    of ``course_utils.generate`` (temperature, top-k, top-p; temperature 0 is greedy). A row that
    writes ``stop_token`` leaves the batch: its cache rows are dropped, so later steps compute only
    the rows still writing, and the loop ends when none is left or after ``max_new_tokens``.
    With ``seed`` the draws come from a private generator (one uniform number per running row per
    step), so the same call gives the same group. ``model(idx, kv_cache=...)`` must return
    ``(logits (B, T, V), _)`` and have ``config.max_len`` and ``config.n_layers`` (a course GPT does);
    the prompts must share one length T, and T + max_new_tokens must fit in ``max_len``.
    """
    config: Any = model.config  # any model with a config holding max_len and n_layers
    _check_group_args(prompts, G, max_new_tokens, config.max_len)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    B = prompts.shape[0] * G
    pad = 0 if stop_token is None else stop_token
    out = torch.full((B, max_new_tokens), pad, dtype=prompts.dtype, device=prompts.device)
    written = torch.zeros(B, dtype=torch.long, device=prompts.device)  # tokens each row has written
    cache = ModelKVCache(config.n_layers)
    was_training = model.training
    model.eval()
    try:
        logits, _ = model(prompts, kv_cache=cache)  # (P, T, V): each prompt once
        repeat = torch.arange(prompts.shape[0], device=prompts.device).repeat_interleave(G)
        for layer in cache.layers:
            layer.select(repeat)  # (P, ...) -> (P·G, ...): row p·G + g continues prompt p
        last = logits[:, -1, :][repeat]
        running = torch.arange(B, device=prompts.device)  # the row of `out` each batch row writes to
        for step in range(max_new_tokens):
            nxt = sample_next(last, temperature, top_k, top_p, generator)
            out[running, step] = nxt
            written[running] += 1
            if stop_token is not None:
                going = nxt != stop_token
                if not bool(going.any()):
                    break
                if not bool(going.all()):  # drop the rows that just stopped, from the batch and the cache
                    keep = going.nonzero().squeeze(1)
                    for layer in cache.layers:
                        layer.select(keep)
                    running, nxt = running[keep], nxt[keep]
            if step + 1 < max_new_tokens:
                logits, _ = model(nxt[:, None], kv_cache=cache)
                last = logits[:, -1, :]
    finally:
        model.train(was_training)
    N = int(written.max())
    mask = torch.arange(N, device=prompts.device) < written[:, None]
    return GroupSample(prompts[repeat], out[:, :N], mask, G, stop_token)


def completion_logprobs(model: nn.Module, prompts: torch.Tensor, completions: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
    """log π(completion token | prompt, earlier completion tokens), (B, N), for prompts (B, T) and
    completions (B, N): one forward pass over prompt + completion, read at the N positions that
    predict the completion's tokens. With gradients when called outside ``torch.no_grad`` (the
    policy's log-probabilities); inside it for π_old and π_ref. ``temperature`` divides the logits
    as the sampler did, so π_old is the distribution the completions were drawn from.
    Padding after a stop token gets finite values that the loss's mask removes."""
    if prompts.dim() != 2 or completions.dim() != 2 or prompts.shape[0] != completions.shape[0]:
        raise ValueError(f"prompts {tuple(prompts.shape)} and completions {tuple(completions.shape)} must be (B, T) "
                         "and (B, N) with the same B; pass GroupSample.prompts (each prompt repeated G times)")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to define log-probabilities, got {temperature}")
    T = prompts.shape[1]
    logits, _ = model(torch.cat([prompts, completions], dim=1))  # (B, T + N, V)
    logits = logits[:, T - 1:-1].float() / temperature  # position T − 1 + n predicts completion token n
    return torch.gather(logits.log_softmax(-1), -1, completions[..., None])[..., 0]


def group_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: A = (r − mean) / (std + eps) within each group (row).

    The group's mean is the baseline (no value network). ``std`` is the sample standard deviation
    (n − 1, as TRL computes it) and ``eps`` (TRL's 1e-4) keeps a group whose rewards are all equal
    at A = 0: such a group carries no signal. ``scale=False`` leaves out the division (Dr. GRPO: the
    std gives the groups that are almost all right or all wrong the largest advantages)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (P, G), one row per prompt, got shape {tuple(rewards.shape)}; "
                         "for P·G rewards in prompt order use rewards.view(-1, G)")
    if rewards.shape[1] < 2:
        raise ValueError(f"a group needs G >= 2 completions per prompt, got G = {rewards.shape[1]}; with one "
                         "completion its reward is its own baseline and every advantage is 0: sample more")
    rewards = rewards.float()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    return centred / (rewards.std(dim=1, keepdim=True) + eps) if scale else centred


def _check_loss_args(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                     advantages: torch.Tensor, mask: torch.Tensor, beta: float) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be (B, T) per-token log-probabilities, got shape {tuple(logp.shape)}")
    for name, x in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)} but logp has {tuple(logp.shape)}; "
                             "both must be (B, T) over the same completion tokens")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), one per completion, got shape "
                         f"{tuple(advantages.shape)}; flatten group_advantages' (P, G) with .view(-1)")
    if ref_logp is None and beta != 0:
        raise ValueError(f"beta = {beta} weighs a KL to the reference model: pass ref_logp, or set beta = 0")


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float = 0.2, beta: float = 0.04, *,
              clip_eps_high: float | None = None, norm: Normalisation = "sequence", max_tokens: int | None = None,
              kl_importance_weight: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's loss (to minimise) and the statistics a run plots: ``(loss, {"kl", "clip_fraction"})``.

    ``logp`` (B, T) are the policy's per-token log-probabilities (with gradients), ``old_logp`` (B, T)
    those of the policy that sampled (ρ = exp(logp − old_logp)), ``ref_logp`` (B, T) the frozen
    reference's (None allowed when beta = 0), ``advantages`` (B,) one per completion, ``mask`` (B, T)
    True (or 1) on completion tokens. Per token: −min(ρA, clip(ρ, 1 − ε, 1 + ε_high)·A) + β·KL_k3,
    with ε_high = ``clip_eps_high`` or ``clip_eps`` (DAPO raises it to 0.28). ``kl_importance_weight``
    multiplies each token's KL_k3 by ρ (DeepSeek-V3.2; TRL's ``use_bias_correction_kl``, on by default
    there): the tokens were drawn from π_old, and ρ reweights them to π_θ, so the KL's gradient is that
    of KL(π_θ ‖ π_ref); ρ carries gradient, so this changes the gradient even at ρ = 1. Then ``norm``:

    - ``"sequence"``: mean over each completion's tokens, then over the B completions (DeepSeekMath;
      TRL's ``loss_type="grpo"``);
    - ``"token"``: sum over every token of the batch / their number (DAPO; TRL's default ``"dapo"``);
    - ``"constant"``: sum / (B · ``max_tokens``) (Dr. GRPO; TRL's ``"dr_grpo"``), ``max_tokens`` the
      generation budget (default T: pad the batch to max_new_tokens to keep it fixed).

    ``kl`` is the mean KL term over the masked tokens (NaN without ``ref_logp``); ``clip_fraction``
    the share of masked tokens whose clipped term is the one taken (ρ > 1 + ε_high with A > 0, or
    ρ < 1 − ε with A < 0), so that they get no gradient. Masked positions must hold finite numbers."""
    _check_loss_args(logp, old_logp, ref_logp, advantages, mask, beta)
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not (0 <= eps_low < 1 and eps_high >= 0):
        raise ValueError(f"clip_eps must be in [0, 1) and clip_eps_high >= 0, got {clip_eps} and {clip_eps_high}")
    m = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    A = advantages.to(logp.dtype)[:, None]  # (B, 1): every token of a completion shares its advantage
    per_token = -torch.min(ratio * A, ratio.clamp(1 - eps_low, 1 + eps_high) * A)
    kl = None
    if ref_logp is not None:
        log_ref_ratio = ref_logp - logp
        kl = torch.exp(log_ref_ratio) - log_ref_ratio - 1  # k3: unbiased for KL(π_θ ‖ π_ref), never negative
        if kl_importance_weight:
            kl = kl * ratio
        if beta != 0:
            per_token = per_token + beta * kl
    total = (per_token * m).sum(-1)  # (B,)
    if norm == "sequence":
        loss = (total / m.sum(-1).clamp(min=1)).mean()
    elif norm == "token":
        loss = total.sum() / m.sum().clamp(min=1)
    elif norm == "constant":
        budget = logp.shape[1] if max_tokens is None else max_tokens
        if budget < logp.shape[1]:
            raise ValueError(f"max_tokens = {budget} is shorter than the completions (T = {logp.shape[1]}); "
                             "pass the generation budget, max_new_tokens")
        loss = total.sum() / (logp.shape[0] * budget)
    else:
        raise ValueError(f"norm must be 'sequence', 'token' or 'constant', got {norm!r}")
    with torch.no_grad():
        tokens = m.sum().clamp(min=1)
        clipped = ((ratio > 1 + eps_high) & (A > 0)) | ((ratio < 1 - eps_low) & (A < 0))
        stats = {"kl": float("nan") if kl is None else ((kl * m).sum() / tokens).item(),
                 "clip_fraction": ((clipped * m).sum() / tokens).item()}
    return loss, stats
