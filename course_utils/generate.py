"""Decoding: turn a language model's next-token logits into text, one token at a time.

The rules (greedy, temperature, top-k, top-p) reshape the distribution over the vocabulary
before one token is drawn from it; ``generate`` repeats that, feeding each new token back in.
An ``attention.ModelKVCache`` keeps every layer's keys and values so each step only computes the new token.

Shapes: ``B`` batch, ``T`` sequence length, ``V`` vocabulary, ``H`` heads, ``S`` cached positions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import runtime
from course_utils.attention import ModelKVCache
from course_utils.sampling import inverse_cdf


def _check_logits(logits: torch.Tensor) -> None:
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have a vocabulary axis last, e.g. (B, V); got shape {tuple(logits.shape)}")


def _check_rules(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k is not None and top_k <= 0:
        raise ValueError(f"top_k must be a positive number of tokens to keep (or None for all), got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(..., V) -> (..., V): logits below the k-th largest set to -inf (ties at the k-th are kept)."""
    _check_logits(logits)
    _check_rules(1.0, k, None)
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """(..., V) -> (..., V): keep the smallest set of most likely tokens whose probability reaches p.

    The token whose probability carries the running sum across p is kept (so the top token always
    survives); every token after it is set to -inf.
    """
    _check_logits(logits)
    _check_rules(1.0, None, p)
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # probability of the tokens ranked above
    drop_sorted = mass_before >= p
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def next_token_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities after temperature, then top-k, then top-p.

    Temperature 0 puts all mass on the arg-max (greedy decoding).
    """
    _check_logits(logits)
    _check_rules(temperature, top_k, top_p)
    logits = logits.float()
    if temperature == 0:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return torch.softmax(logits, dim=-1)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) probabilities -> (B,) token ids, by inverting the cumulative distribution.

    One uniform number per row is drawn, whatever the probabilities, so a seeded generator gives
    the same stream of draws for equal inputs. Tokens with probability 0 are never chosen.
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be (B, V), got shape {tuple(probs.shape)}; use probs.view(-1, V)")
    if bool((probs < 0).any()) or not bool(torch.isfinite(probs).all()):
        raise ValueError("probs must be finite and non-negative; pass softmax(logits), not the logits")
    exact = runtime.exact_dtype(probs.device)  # float64, or float32 on MPS (no float64 there)
    u = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device="cpu")
    return inverse_cdf(torch.cumsum(probs.to(exact), dim=-1), u.to(probs.device, exact))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) logits -> (B,) next-token ids under the decoding rules; temperature 0 is greedy."""
    if temperature == 0:
        _check_rules(temperature, top_k, top_p)
        return logits.argmax(dim=-1)
    return sample_from_probs(next_token_probs(logits, temperature, top_k, top_p), generator)


@torch.no_grad()
def generate(model: nn.Module, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             stop_token: int | None = None, use_cache: bool = True) -> torch.Tensor:
    """Continue ``idx`` (B, T) by up to ``max_new_tokens`` tokens -> (B, T + n).

    ``model(idx, kv_cache=...)`` must return ``(logits (B, T, V), _)`` and have ``config.max_len`` and
    ``config.n_layers`` (``course_utils.gpt.GPT`` does). Only the last position's logits are used.
    With ``seed`` the draws come from a private generator, so the same call gives the same text.
    Generation stops early once every row has produced ``stop_token`` (finished rows repeat it).
    Past the context window the oldest tokens are dropped and the cache is no longer used, since
    learned positions cannot slide; outputs with and without the cache stay the same.
    """
    _check_rules(temperature, top_k, top_p)
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (B, T) token ids with T >= 1, got shape {tuple(idx.shape)}; "
                         "for one prompt use idx[None]")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    config: Any = model.config  # any model with a config holding max_len and n_layers
    max_len = config.max_len
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    cacheable = use_cache and idx.shape[1] <= max_len and config.n_layers > 0  # a bigram model has no keys
    cache = ModelKVCache(config.n_layers) if cacheable else None
    was_training = model.training
    model.eval()
    out = idx
    finished = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    try:
        for _ in range(max_new_tokens):
            if cache is not None and len(cache) + 1 > max_len:
                cache = None  # window full: recompute the last max_len tokens from now on
            if cache is None:
                logits, _ = model(out[:, -max_len:])
            else:
                logits, _ = model(out[:, len(cache):], kv_cache=cache)
            nxt = sample_next(logits[:, -1, :], temperature, top_k, top_p, generator)
            if stop_token is not None:
                nxt = torch.where(finished, torch.full_like(nxt, stop_token), nxt)
                finished |= nxt == stop_token
            out = torch.cat([out, nxt[:, None]], dim=1)
            if stop_token is not None and bool(finished.all()):
                break
    finally:
        model.train(was_training)
    return out
