"""Exercises of lesson 02: a stable softmax, the weights of one query, one attention head,
causal attention and a padding mask from lengths; four self-check questions and one experiment
(how much entropy the √d_k scaling gives back).

The hints rebuild the usual mistakes (wrong softmax axis, no √d_k, mask applied after the softmax,
the mask turned upside down) and say which one an answer matches.
"""

from __future__ import annotations

import math

import torch

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import attention_weights, close, known_wrong
from course_tools.messages import N_, _
from course_utils.attention import causal_mask, padding_mask, scaled_dot_product_attention, softmax


def _has_nan(got) -> bool:
    return isinstance(got, torch.Tensor) and got.is_floating_point() and bool(torch.isnan(got).any())


# --- stable softmax --------------------------------------------------------------------------------


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 1, 1.0), (2, 3, 4, 1.0), (2, 4, 5, 30.0), (1, 3, 6, 500.0)]
    return [Case(N_("x of shape (B={b}, T={t}, S={s}), scores of size ~{scale:g}", b=b, t=t, s=s, scale=scale),
                 (torch.randn(b, t, s, generator=gen) * scale + scale,))
            for b, t, s, scale in sizes]


def _softmax_hint(case: Case, got, expected) -> str | None:
    x = case.args[0]
    if _has_nan(got) or (isinstance(got, torch.Tensor) and torch.isinf(got).any()):
        return _("exp overflowed: subtract each row's maximum before exp (the result does not change)")
    for dim in (0, 1):
        if x.shape[dim] > 1 and close(got, torch.softmax(x, dim=dim)):
            return _("you normalised over axis {dim}; each query's row of scores is the last axis (dim=-1)", dim=dim)
    if close(got, x.exp()):
        return _("you forgot to divide by the sum of the exponentials")
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
        return _("the scores are not scaled: divide q·k by √d_k before the softmax")
    if close(got, torch.softmax(K @ q / q.shape[-1], dim=-1)):
        return _("you divided by d_k; divide by its square root √d_k")
    if close(got, K @ q / math.sqrt(q.shape[-1])):
        return _("those are the scaled scores; apply the softmax to turn them into weights")
    return None


@exercise(cases=_one_query_cases, hints=[_scaling_hint])
def query_weights(q: torch.Tensor, K: torch.Tensor) -> torch.Tensor:
    """q (d_k,), K (S, d_k) -> (S,): how much the query attends to each key, softmax(K q / √d_k)."""
    return softmax(K @ q / math.sqrt(q.shape[-1]), dim=-1)


# --- one head --------------------------------------------------------------------------------------


def _head_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 4, 2, 3), (2, 3, 6, 4, 4), (3, 5, 8, 16, 5)]  # B, T, D, d_k, d_v
    return [Case(N_("x (B={b}, T={t}, D={d}), W_Q and W_K ({d}×{dk}), W_V ({d}×{dv})", b=b, t=t, d=d, dk=dk, dv=dv),
                 (torch.randn(b, t, d, generator=gen), torch.randn(d, dk, generator=gen),
                  torch.randn(d, dk, generator=gen), torch.randn(d, dv, generator=gen)))
            for b, t, d, dk, dv in sizes]


def _head_hint(case: Case, got, expected) -> str | None:
    x, W_Q, W_K, W_V = case.args
    q, k = x @ W_Q, x @ W_K
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return _("return a pair (out, weights)")
    out, weights = got
    if close(weights, attention_weights(q, k, scale=False)):
        return _("the scores are not scaled: divide q kᵀ by √d_k before the softmax")
    if x.shape[1] > 1 and close(weights, attention_weights(q, k, softmax_dim=-2)):
        return _("softmax over the wrong axis: each query's row (dim=-1) must sum to one")
    if close(out, expected[1] @ x) or close(out, expected[1] @ k):
        return _("the weighted sum must run over the values v = x W_V, not over x or the keys")
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
        return (_("the mask was applied after the softmax: set the blocked scores to -inf first, then take the "
                  "softmax"))
    if T > 1 and close(got, attention_weights(q, k, keep=tri.T) @ v):
        return _("the mask is upside down: query t may see keys 0..t (torch.tril), not t..T-1")
    if any(close(got, attention_weights(q, k, scale=False, keep=tri, mask_after_softmax=after_softmax) @ v)
           for after_softmax in (False, True)):
        return _("the scores are not scaled: divide q kᵀ by √d_k")
    if T > 1 and close(got, attention_weights(q, k) @ v):
        return _("no mask was applied: block the future keys (s > t) before the softmax")
    if T > 1 and close(got, attention_weights(q, k, keep=tri, softmax_dim=-2) @ v):
        return _("softmax over the wrong axis: normalise over the keys (dim=-1)")
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
        cases.append(Case(N_("{b} lengths, max_len={max_len}", b=b, max_len=max_len), (lengths, max_len)))
    return cases


def _padding_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _("the mask has one row per sequence and max_len columns: shape (B, max_len)")
    if got.dtype != torch.bool:
        return _("return a bool tensor (compare positions with lengths), not 0/1 numbers")
    if torch.equal(got, ~expected):
        return _("True must mark the real tokens (may attend), False the padding")
    lengths, max_len = case.args
    if torch.equal(got, torch.arange(max_len) <= lengths[:, None]):
        return _("off by one: positions 0..length-1 are real, so use <, not <=")
    return None


@exercise(cases=_lengths_cases, hints=[_padding_hint])
def lengths_to_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """lengths (B,) of int -> (B, max_len) bool, True at the first lengths[b] positions of row b."""
    return padding_mask(lengths, max_len)


# --- self-check questions ------------------------------------------------------------------------

@question(explain=N_("each of the 5 queries gets one score per key, and here there are 7 keys: (B, H, T, S) = (2, 3, "
                     "5, 7); d_k is summed away."),
          hints=[known_wrong({
              (2, 3, 5, 5): N_("the keys have their own length S = 7: one score per (query, key) pair, (B, H, T, S)"),
              (2, 3, 7, 5): N_("the queries index the rows: (B, H, T, S), T = 5 before S = 7"),
              (2, 3, 5, 8): N_("the product sums over d_k: each (query, key) pair gives one number, so d_k disappears"),
              (2, 5, 7): N_("each head has its own score matrix: the H = 3 axis stays"),
          })])
def cross_scores_shape() -> tuple:
    """The shape of q @ k.transpose(-2, -1) for q (B=2, H=3, T=5, d_k=8) and k (B=2, H=3, S=7, d_k=8)."""
    return tuple((torch.zeros(2, 3, 5, 8) @ torch.zeros(2, 3, 7, 8).transpose(-2, -1)).shape)


@question(explain=N_("q·k has variance d_k = 64; dividing by d_k divides the variance by d_k² = 4,096: 64 / 4,096 = "
                     "1/64 ≈ 0.0156, so the scores are nearly equal and the softmax nearly uniform."),
          atol=1e-3,
          hints=[known_wrong({
              1: N_("1 is the variance after dividing by √d_k; dividing by d_k shrinks it further"),
              0.125: N_("0.125 = 1/8 is the standard deviation of q·k / 64; the variance is its square"),
              64: N_("64 is the variance before any scaling"),
          })])
def over_scaled_variance() -> float:
    """The variance of q·k / d_k (divided by d_k, not √d_k) for d_k = 64 independent N(0, 1) entries."""
    return 64 / 64**2


WEIGHT_PATTERN_MASKS = {
    "a": torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool),
    "b": torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1]], dtype=torch.bool),
    "c": torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool),
    "d": torch.tensor([[1, 1, 0], [1, 1, 1], [0, 1, 1]], dtype=torch.bool),
}
WEIGHT_PATTERN = torch.tensor([[1, 0, 0], [1 / 2, 1 / 2, 0], [0, 1 / 2, 1 / 2]])


@question(explain=N_("with equal scores every allowed key gets the same share, so the weights show the mask: query 2 "
                     "splits its weight between keys 1 and 2 only, a causal window of two keys."),
          hints=[known_wrong({
              "a": N_("(a) is the full causal mask: query 2 would split its weight over 3 keys, 1/3 each"),
              "b": N_("(b) lets each query see only itself: every weight would be 1 on the diagonal"),
              "d": N_("(d) lets query 0 see key 1 too: its row would be 1/2, 1/2, 0"),
          })])
def mask_for_pattern() -> str:
    """Multiple choice: which 3 × 3 mask, with all scores equal, gives the weights WEIGHT_PATTERN."""
    scores = torch.zeros(3, 3)
    return next(k for k, m in WEIGHT_PATTERN_MASKS.items()
                if torch.allclose(softmax(scores.masked_fill(~m, float("-inf")), dim=-1), WEIGHT_PATTERN))


@question(explain=N_("equal scores give equal weights, and the 16 weights sum to one: 1/16 = 0.0625."), atol=1e-4,
          hints=[known_wrong({
              1: N_("the weights of one query sum to one over the keys; equal scores share it"),
              0: N_("equal scores do not cancel out: the softmax shares the weight equally"),
              0.5: N_("there are 16 keys, not 2"),
              0.25: N_("1/4 = 1/√16; the weights are 1/16 each: they sum to one"),
          })])
def uniform_weight() -> float:
    """The weight of each key when all 16 scores of one query are equal."""
    return 1 / 16


# --- experiment: compare two variants ------------------------------------------------------------

def _entropies(d_k: int = 128, n_queries: int = 4_000, n_keys: int = 16) -> dict[str, float]:
    """Mean entropy (nats) of one query's weights over 16 keys: scores unscaled, / √d_k, / d_k."""
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(n_queries, 1, d_k, generator=gen), torch.randn(n_queries, n_keys, d_k, generator=gen)
    scores = (q @ k.transpose(-2, -1))[:, 0]
    def entropy(p: torch.Tensor) -> float:
        return float(-(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean())
    return {"raw": entropy(softmax(scores, dim=-1)), "scaled": entropy(softmax(scores / math.sqrt(d_k), dim=-1)),
            "over": entropy(softmax(scores / d_k, dim=-1))}


def _entropy_slips(case, got, expected) -> str | None:
    if not isinstance(got, (int, float)) or isinstance(got, bool):
        return None
    h = _entropies()
    if got < 0:
        return _("subtract the unscaled entropy from the scaled one: the scaling spreads the weights, so it is "
                 "positive")
    if abs(got - (math.log(16) - h["raw"])) < 0.05:
        return _("ln 16 is the entropy of uniform weights; measure the scaled weights, they are not uniform")
    if abs(got - (h["over"] - h["raw"])) < 0.05:
        return _("that divides by d_k; the scaled variant divides by √d_k")
    return None


@question(explain=N_("unscaled scores have standard deviation √128 ≈ 11: the softmax puts almost everything on one "
                     "key (entropy about 0.28 nats); scaled, the scores have variance 1 and the weights keep about "
                     "2.36 of ln 16 ≈ 2.77 nats. The scaling gives back about 2.08 nats."),
          atol=0.05, hints=[_entropy_slips])
def entropy_recovered() -> float:
    """Experiment: at d_k = 128, the mean entropy (nats) of one query's softmax over 16 keys with the scores
    divided by √d_k, minus the same with unscaled scores (random N(0, 1) queries and keys)."""
    h = _entropies()
    return h["scaled"] - h["raw"]
