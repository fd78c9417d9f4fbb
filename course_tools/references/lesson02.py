"""Exercises of lesson 02: a stable softmax, the weights of one query, one attention head,
causal attention and a padding mask from lengths; four self-check questions and one experiment
(where the unscaled softmax saturates).

The hints rebuild the usual mistakes (wrong softmax axis, no √d_k, mask applied after the softmax,
the mask turned upside down) and say which one an answer matches.
"""

from __future__ import annotations

import math

import torch

from course_tools.checks import Case, exercise, question
from course_tools.references._shared import attention_weights, close, known_wrong
from course_utils.attention import causal_mask, padding_mask, scaled_dot_product_attention, softmax


def _has_nan(got) -> bool:
    return isinstance(got, torch.Tensor) and got.is_floating_point() and bool(torch.isnan(got).any())


# --- stable softmax --------------------------------------------------------------------------------


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 1, 1.0), (2, 3, 4, 1.0), (2, 4, 5, 30.0), (1, 3, 6, 500.0)]
    return [Case(f"x of shape (B={b}, T={t}, S={s}), scores of size ~{scale:g}",
                 (torch.randn(b, t, s, generator=gen) * scale + scale,))
            for b, t, s, scale in sizes]


def _softmax_hint(case: Case, got, expected) -> str | None:
    x = case.args[0]
    if _has_nan(got) or (isinstance(got, torch.Tensor) and torch.isinf(got).any()):
        return "exp overflowed: subtract each row's maximum before exp (the result does not change)"
    for dim in (0, 1):
        if x.shape[dim] > 1 and close(got, torch.softmax(x, dim=dim)):
            return f"you normalised over axis {dim}; each query's row of scores is the last axis (dim=-1)"
    if close(got, x.exp()):
        return "you forgot to divide by the sum of the exponentials"
    return None


@exercise(cases=_softmax_cases, hints=[_softmax_hint])
def stable_softmax(x: torch.Tensor) -> torch.Tensor:
    """x (B, T, S) -> (B, T, S): softmax over the last axis, exact even for scores in the hundreds."""
    return softmax(x, dim=-1)


# --- the weights of one query ----------------------------------------------------------------------


def _one_query_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 4), (3, 4), (5, 16), (7, 64)]
    return [Case(f"q (d_k={d},), K (S={s}, d_k={d})",
                 (torch.randn(d, generator=gen), torch.randn(s, d, generator=gen)))
            for s, d in sizes]


def _scaling_hint(case: Case, got, expected) -> str | None:
    q, K = case.args
    if close(got, attention_weights(q[None], K, scale=False)[0]):
        return "the scores are not scaled: divide q·k by √d_k before the softmax"
    if close(got, torch.softmax(K @ q / q.shape[-1], dim=-1)):
        return "you divided by d_k; divide by its square root √d_k"
    if close(got, K @ q / math.sqrt(q.shape[-1])):
        return "those are the scaled scores; apply the softmax to turn them into weights"
    return None


@exercise(cases=_one_query_cases, hints=[_scaling_hint])
def query_weights(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """q (d_k,), K (S, d_k) -> (S,): how much the query attends to each key, softmax(K q / √d_k)."""
    return softmax(K @ q / math.sqrt(q.shape[-1]), dim=-1)


# --- one head --------------------------------------------------------------------------------------


def _head_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 4, 2, 3), (2, 3, 6, 4, 4), (3, 5, 8, 16, 5)]  # B, T, D, d_k, d_v
    return [Case(f"x (B={b}, T={t}, D={d}), W_Q and W_K ({d}×{dk}), W_V ({d}×{dv})",
                 (torch.randn(b, t, d, generator=gen), torch.randn(d, dk, generator=gen),
                  torch.randn(d, dk, generator=gen), torch.randn(d, dv, generator=gen)))
            for b, t, d, dk, dv in sizes]


def _head_hint(case: Case, got, expected) -> str | None:
    x, W_Q, W_K, W_V = case.args
    q, k = x @ W_Q, x @ W_K
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return "return a pair (out, weights)"
    out, weights = got
    if close(weights, attention_weights(q, k, scale=False)):
        return "the scores are not scaled: divide q kᵀ by √d_k before the softmax"
    if x.shape[1] > 1 and close(weights, attention_weights(q, k, softmax_dim=-2)):
        return "softmax over the wrong axis: each query's row (dim=-1) must sum to one"
    if close(out, expected[1] @ x) or close(out, expected[1] @ k):
        return "the weighted sum must run over the values v = x W_V, not over x or the keys"
    return None


@exercise(cases=_head_cases, hints=[_head_hint])
def attention_head(x: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor,
                   W_V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, T, D), W_Q, W_K (D, d_k), W_V (D, d_v) -> (out (B, T, d_v), weights (B, T, T))."""
    return scaled_dot_product_attention(x @ W_Q, x @ W_K, x @ W_V)


# --- causal attention ------------------------------------------------------------------------------


def _qkv_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 2, 2), (2, 4, 8, 3), (3, 6, 16, 5)]  # B, T, d_k, d_v
    return [Case(f"q, k (B={b}, T={t}, d_k={dk}), v (B={b}, T={t}, d_v={dv})",
                 (torch.randn(b, t, dk, generator=gen) * 2, torch.randn(b, t, dk, generator=gen) * 2,
                  torch.randn(b, t, dv, generator=gen)))
            for b, t, dk, dv in sizes]


def _causal_hint(case: Case, got, expected) -> str | None:
    q, k, v = case.args
    T = q.shape[-2]
    tri = causal_mask(T)
    after = attention_weights(q, k, keep=tri, mask_after_softmax=True)
    if T > 1 and (close(got, after @ v) or close(got, (after / after.sum(-1, keepdim=True)) @ v)):
        return ("the mask was applied after the softmax: set the blocked scores to -inf first, "
                "then take the softmax")
    if T > 1 and close(got, attention_weights(q, k, keep=tri.T) @ v):
        return "the mask is upside down: query t may see keys 0..t (torch.tril), not t..T-1"
    if any(close(got, attention_weights(q, k, scale=False, keep=tri, mask_after_softmax=after_softmax) @ v)
           for after_softmax in (False, True)):
        return "the scores are not scaled: divide q kᵀ by √d_k"
    if T > 1 and close(got, attention_weights(q, k) @ v):
        return "no mask was applied: block the future keys (s > t) before the softmax"
    if T > 1 and close(got, attention_weights(q, k, keep=tri, softmax_dim=-2) @ v):
        return "softmax over the wrong axis: normalise over the keys (dim=-1)"
    return None


@exercise(cases=_qkv_cases, hints=[_causal_hint])
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q, k (B, T, d_k), v (B, T, d_v) -> (B, T, d_v): each position attends to itself and the past."""
    return scaled_dot_product_attention(q, k, v, causal=True)[0]


# --- padding mask ----------------------------------------------------------------------------------


def _lengths_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, max_len in [(1, 1), (3, 5), (6, 9)]:
        lengths = torch.randint(0, max_len + 1, (b,), generator=gen)
        lengths[0] = max_len  # the longest sequence has no padding
        cases.append(Case(f"{b} lengths, max_len={max_len}", (lengths, max_len)))
    return cases


def _padding_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return "the mask has one row per sequence and max_len columns: shape (B, max_len)"
    if got.dtype != torch.bool:
        return "return a bool tensor (compare positions with lengths), not 0/1 numbers"
    if torch.equal(got, ~expected):
        return "True must mark the real tokens (may attend), False the padding"
    lengths, max_len = case.args
    if torch.equal(got, torch.arange(max_len) <= lengths[:, None]):
        return "off by one: positions 0..length-1 are real, so use <, not <="
    return None


@exercise(cases=_lengths_cases, hints=[_padding_hint])
def lengths_to_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """lengths (B,) of int -> (B, max_len) bool, True at the first lengths[b] positions of row b."""
    return padding_mask(lengths, max_len)


# --- self-check questions ------------------------------------------------------------------------

@question(explain="each of the 5 queries gets one score per key (5 keys), in each of the 3 heads of each of "
                  "the 2 sequences: d_k is summed away.",
          hints=[known_wrong({
              (2, 3, 5, 8): "the product sums over d_k: each (query, key) pair gives one number, so d_k disappears",
              (2, 3, 8, 8): "that contracts over T: transpose the last two axes of k, not of q",
              (2, 5, 3, 5): "the heads stay where they are: (B, H, T, S)",
              (2, 5, 5): "each head has its own score matrix: the H = 3 axis stays",
          })])
def scores_shape() -> tuple:
    """The shape of q @ k.transpose(-2, -1) for q, k of shape (B=2, H=3, T=5, d_k=8)."""
    return (2, 3, 5, 5)


@question(explain="q·k sums 64 independent products of variance 1, and variances of independent terms add: 64.",
          atol=0.5,
          hints=[known_wrong({
              8: "8 = √64 is the standard deviation; the variance is its square",
              1: "1 is the variance after dividing by √d_k; the question asks before the scaling",
              4096: "the variances of the 64 independent products add up: 64 × 1, not 64²",
          })])
def unscaled_variance() -> float:
    """The variance of q·k for q, k with d_k = 64 independent entries of mean 0 and variance 1."""
    return 64.0


@question(explain="row t may attend to keys 0..t: the lower triangle with its diagonal (torch.tril).",
          hints=[known_wrong({
              "a": "in (a) row 0 sees every key: that lets each query see the future (the mask is upside down)",
              "c": "in (c) no position sees itself; a causal mask keeps the diagonal (key t for query t)",
              "d": "in (d) each position sees only itself; a causal mask also keeps the past",
          })])
def causal_choice() -> str:
    """Multiple choice: which of four 3 × 3 masks (True = may attend) is causal."""
    return "b"


@question(explain="equal scores give equal weights, and the 8 weights sum to one: 1/8 = 0.125.", atol=1e-3,
          hints=[known_wrong({
              1: "the weights of one query sum to one over the keys; equal scores share it",
              0: "equal scores do not cancel out: the softmax shares the weight equally",
              0.5: "there are 8 keys, not 2",
          })])
def uniform_weight() -> float:
    """The weight of each key when all 8 scores of one query are equal."""
    return 1 / 8


# --- experiment ----------------------------------------------------------------------------------

def _mean_max_weight(d_k: int, n_queries: int = 4_000, n_keys: int = 16) -> float:
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(n_queries, 1, d_k, generator=gen), torch.randn(n_queries, n_keys, d_k, generator=gen)
    return float(softmax(q @ k.transpose(-2, -1), dim=-1).amax(dim=-1).mean())


@question(explain="unscaled scores have standard deviation √d_k: the gap between the best key and the rest "
                  "grows with it, and the mean largest weight passes 0.9 between d_k = 128 (about 0.89) and 256.",
          hints=[known_wrong({
              128: "at d_k = 128 the mean largest weight is about 0.89, just under 0.9: average over more queries",
              1024: "d_k = 1024 is the notebook's last row; a smaller d_k already passes 0.9",
              512: "a smaller d_k already passes 0.9: measure every power of two, from 1 up",
              64: "at d_k = 64 the mean largest weight is about 0.85: are your scores scaled by √d_k? They must not be",
          })])
def smallest_saturating_d_k() -> int:
    """Experiment: the smallest d_k in 1, 2, 4, ..., 1024 at which the unscaled softmax over 16 keys
    puts more than 0.9 on its largest weight, on average over random N(0, 1) queries and keys."""
    return next(d for d in (2**i for i in range(11)) if _mean_max_weight(d) > 0.9)
