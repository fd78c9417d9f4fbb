"""Exercises of lesson 03: split and merge heads, the multi-head forward pass, the parameter count
of the layer and the bottom-right causal mask a KV cache needs; four self-check questions and one
experiment (which number of heads gives one head's score matrix a measured rank)."""

from __future__ import annotations

import math

import torch
from einops import rearrange

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.messages import N_, _
from course_utils.attention import (
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)

# Classes that answer an exercise whole (course_tools.grading.shortcuts adds them to what it derives).
TEACHES = {"multi_head_forward": ("course_utils.attention.MultiHeadAttention",)}

# --- split / merge heads ---------------------------------------------------------------------------

SPLIT_SIZES = [(1, 1, 1, 3), (2, 3, 2, 4), (3, 5, 4, 2)]  # B, T, H, d


def _split_cases(gen: torch.Generator) -> list[Case]:
    return [Case(f"x (B={b}, T={t}, H·d={h}·{d}), n_heads={h}", (torch.randn(b, t, h * d, generator=gen), h))
            for b, t, h, d in SPLIT_SIZES]


def _split_hint(case: Case, got, expected) -> str | None:
    x, h = case.args
    b, t = x.shape[:2]
    if close(got, x.reshape(b, h, t, -1)) and not torch.equal(got, expected):
        return _("a bare reshape mixes positions and heads: reshape to (B, T, H, d), then swap T and H")
    if close(got, rearrange(x, "b t (d h) -> b h t d", h=h)):
        return _("head i owns a contiguous block of columns: split the last axis as (h d), not (d h)")
    if isinstance(got, torch.Tensor) and got.shape == (b, t, h, x.shape[-1] // h):
        return _("the head axis goes before the time axis: (B, H, T, d)")
    return None


@exercise(cases=_split_cases, hints=[_split_hint])
def split_into_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """x (B, T, H·d) -> (B, H, T, d): head i takes columns i·d .. (i+1)·d - 1."""
    return split_heads(x, n_heads)


def _merge_cases(gen: torch.Generator) -> list[Case]:
    return [Case(f"x (B={b}, H={h}, T={t}, d={d})", (torch.randn(b, h, t, d, generator=gen),))
            for b, t, h, d in SPLIT_SIZES]


def _merge_hint(case: Case, got, expected) -> str | None:
    x = case.args[0]
    b, h, t, d = x.shape
    if close(got, x.reshape(b, t, h * d)) and not torch.equal(got, expected):
        return _("a bare reshape mixes positions and heads: move H next to d first (B, T, H, d), then merge")
    if close(got, rearrange(x, "b h t d -> b t (d h)")):
        return _("concatenate the heads side by side: merge as (h d), not (d h)")
    return None


@exercise(cases=_merge_cases, hints=[_merge_hint])
def merge_from_heads(x: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, d) -> (B, T, H·d): concat(H_1, ..., H_m) along the features."""
    return merge_heads(x)


# --- the multi-head forward pass -------------------------------------------------------------------


def _mha_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 4, 2), (2, 4, 6, 3), (2, 6, 16, 4)]  # B, T, D, H (d_k = d_v = D / H)
    cases = []
    for b, t, d, h in sizes:
        x = torch.randn(b, t, d, generator=gen)
        W_Q, W_K, W_V, W_O = (torch.randn(d, d, generator=gen) / math.sqrt(d) for _ in range(4))
        cases.append(Case(f"x (B={b}, T={t}, D={d}), n_heads={h}, W_Q, W_K, W_V, W_O ({d}×{d})",
                          (x, W_Q, W_K, W_V, W_O, h)))
    return cases


def _mha(x, W_Q, W_K, W_V, W_O, h, *, scale=True, split=True, with_W_O=True):
    """The multi-head forward pass and its usual mistakes, for the reference and the hints."""
    n = h if split else 1
    q, k, v = (split_heads(x @ W, n) for W in (W_Q, W_K, W_V))
    if not scale:
        q = q * math.sqrt(q.shape[-1])
    out = merge_heads(scaled_dot_product_attention(q, k, v)[0])
    return out @ W_O if with_W_O else out


def _mha_hint(case: Case, got, expected) -> str | None:
    x, W_Q, W_K, W_V, W_O, h = case.args
    if close(got, _mha(*case.args, with_W_O=False)):
        return _("the heads are concatenated but W_O is missing: multiply concat(H_1..H_m) by W_O")
    if x.shape[1] > 1 and h > 1 and close(got, _mha(*case.args, split=False)):
        return _("that is one head of width D: split q, k, v into n_heads heads of width D / n_heads")
    if x.shape[1] > 1 and close(got, _mha(*case.args, scale=False)):
        return _("the scores are not scaled: divide by √d_k with d_k = D / n_heads (the width of one head)")
    if x.shape[1] > 1 and h > 1 and close(got, _scaled_by_full_width(*case.args)):
        return _("scale by the width of one head, √(D / n_heads), not √D")
    return None


def _scaled_by_full_width(x, W_Q, W_K, W_V, W_O, h):
    q, k, v = (split_heads(x @ W, h) for W in (W_Q, W_K, W_V))
    q = q * math.sqrt(q.shape[-1]) / math.sqrt(x.shape[-1])
    return merge_heads(scaled_dot_product_attention(q, k, v)[0]) @ W_O


@exercise(cases=_mha_cases, hints=[_mha_hint])
def multi_head_forward(x: torch.Tensor, W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor,
                       W_O: torch.Tensor, n_heads: int) -> torch.Tensor:
    """x (B, T, D), W_Q, W_K, W_V (D, H·d_k), W_O (H·d_v, D) -> (B, T, D); no masks, no biases."""
    return _mha(x, W_Q, W_K, W_V, W_O, n_heads)


# --- parameter count -------------------------------------------------------------------------------

COUNT_CONFIGS = [(8, 2, 4, 4, True), (768, 12, 64, 64, True), (512, 8, 64, 64, False), (10, 3, 4, 6, True)]


def _count_cases(gen: torch.Generator) -> list[Case]:
    return [Case(f"d_model={d}, n_heads={h}, d_k={dk}, d_v={dv}, bias={b}", (d, h, dk, dv, b))
            for d, h, dk, dv, b in COUNT_CONFIGS]


def _count_hint(case: Case, got, expected) -> str | None:
    d, h, dk, dv, bias = case.args
    no_bias = 2 * d * h * dk + 2 * d * h * dv
    if got == no_bias and bias:
        return _("the weights are right; add the biases of the four layers (2·H·d_k + H·d_v + D)")
    if got == d * (2 * h * dk + h * dv) + (2 * h * dk + h * dv if bias else 0):
        return _("W_O is missing: it has H·d_v × D weights (and D biases)")
    if got == 4 * d * d + (4 * d if bias else 0) and expected != got:
        return _("4d² + 4d holds only when d_k = d_v = D / H; count each matrix from its own shape")
    return None


@exercise(cases=_count_cases, hints=[_count_hint])
def attention_parameter_count(d_model: int, n_heads: int, d_k: int, d_v: int, bias: bool) -> int:
    """Trainable numbers of W_Q, W_K (D → H·d_k), W_V (D → H·d_v), W_O (H·d_v → D), with biases if asked."""
    weights = 2 * d_model * n_heads * d_k + 2 * n_heads * d_v * d_model
    biases = 2 * n_heads * d_k + n_heads * d_v + d_model
    return weights + (biases if bias else 0)


# --- the causal mask of a KV cache -----------------------------------------------------------------

MASK_SIZES = [(1, 1), (1, 6), (3, 7), (5, 5), (4, 2)]


def _mask_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("T={t} new queries, S={s} keys", t=t, s=s), (t, s)) for t, s in MASK_SIZES]


def _mask_hint(case: Case, got, expected) -> str | None:
    T, S = case.args
    if not isinstance(got, torch.Tensor) or got.shape != (T, S):
        return _("one row per query and one column per key: shape (T, S)")
    if got.dtype != torch.bool:
        return _("return a bool tensor, True where the query may attend")
    if torch.equal(got, torch.ones(T, S, dtype=torch.bool).tril()):
        return (_("aligned top-left: the new queries are the last T of S positions, so query t sees keys up to t + S "
                  "- T (tril with diagonal=S-T)"))
    if torch.equal(got, ~expected):
        return _("True must mean may attend; you marked the blocked keys")
    return None


@exercise(cases=_mask_cases, hints=[_mask_hint])
def kv_causal_mask(T: int, S: int) -> torch.Tensor:
    """(T, S) bool: the T newest queries of an S-token sequence; query t may see keys 0..t + S - T."""
    return causal_mask(T, S)


# --- self-check questions ------------------------------------------------------------------------

@question(explain=N_("W_Q maps 512 to 256 columns, cut into 8 heads of 256 / 8 = 32: (B, H, T, d_k) = (2, 8, 10, 32)."),
          hints=[known_wrong({
              (2, 8, 10, 64): N_("64 = 512 / 8 splits the input width; the heads share the 256 columns W_Q produces"),
              (2, 10, 8, 32): N_("the head axis comes before the positions: each head holds a (T, d_k) matrix"),
              (2, 8, 10, 256): N_("the 8 heads share the 256 columns of x W_Q: each is 256 / 8 = 32 wide"),
              (8, 2, 10, 32): N_("the batch axis stays first: (B, H, T, d_k)"),
          })])
def narrow_split_shape() -> tuple:
    """The shape of split_heads(x @ W_Q, 8) for x of shape (B=2, T=10, D=512) and W_Q of shape (512, 256)."""
    return (2, 8, 10, 256 // 8)


@question(explain=N_("four 256 × 256 matrices and no biases: 4·256² = 262,144, the same for any number of heads."),
          hints=[known_wrong({
              4 * 256**2 + 4 * 256: N_("bias=False: the four projections have no bias vectors"),
              4 * (4 * 256**2): N_("the 4 heads share the four matrices: each gets 256 / 4 columns, not its own"),
              3 * 256**2: N_("W_O is missing: it maps the concatenated heads (256) back to 256"),
              256**2: N_("there are four projections, W_Q, W_K, W_V and W_O"),
          })])
def mha_parameters_no_bias() -> int:
    """The parameters of MultiHeadAttention(d_model=256, n_heads=4, bias=False)."""
    return 4 * 256**2


@question(explain=N_("the n × n weights grow with n²: 4,096 tokens are 4 times 1,024, so the matrix is 4² = 16 times "
                     "larger."),
          atol=0.01,
          hints=[known_wrong({
              4: N_("4 times the tokens, but every token is paired with every token: the matrix grows 4 × 4"),
              64: N_("the matrix has n² entries, not n³"),
              2: N_("the length grows 4 times (1,024 → 4,096), not 2 times"),
          })])
def weights_memory_factor() -> float:
    """The factor by which the n × n attention weights grow from n = 1,024 to n = 4,096."""
    return (4096 / 1024) ** 2


@question(explain=N_("every position reads every other directly in one layer: the path does not depend on n."),
          hints=[known_wrong({
              "a": N_("n − 1 steps is the recurrent network, which passes the signal through every position in "
                      "between"),
              "b": N_("log₂ n is a stack of dilated convolutions or a tree; attention needs no stack at all"),
              "d": N_("n² is what attention costs in time and naive memory, not the length of a path"),
          })])
def path_choice() -> str:
    """Multiple choice: how the path from position 0 to the output at n - 1 grows in one attention layer."""
    return "c"


# --- experiment: detect which configuration produced a result -----------------------------------

def _score_rank(n_heads: int, n_tokens: int = 32, d_model: int = 64) -> int:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_tokens, d_model, generator=gen, dtype=torch.float64)
    W_Q, W_K = (torch.randn(d_model, d_model, generator=gen, dtype=torch.float64) / math.sqrt(d_model)
                for _ in range(2))
    d_k = d_model // n_heads
    return int(torch.linalg.matrix_rank((x @ W_Q)[:, :d_k] @ (x @ W_K)[:, :d_k].T))


HEAD_OPTIONS = {"a": 8, "b": 2, "c": 16}
OBSERVED_RANK = 8


@question(explain=N_("head 0's scores q_0 k_0ᵀ are a product of two 32 × d_k matrices, so their rank is min(32, d_k) "
                     "with d_k = 64 / n_heads: 2 heads give 32, 8 heads 8, 16 heads 4."),
          hints=[known_wrong({
              "b": N_("2 heads are 32 wide: the rank is 32 (the 32 tokens are the limit), not 8"),
              "c": N_("16 heads are 64 / 16 = 4 wide: their score matrix has rank 4"),
          })])
def heads_from_rank() -> str:
    """Experiment: which of 8, 2 or 16 heads (d_model = 64, 32 random tokens) gives head 0 a score matrix
    q_0 k_0ᵀ of rank 8, measured for each."""
    return next(k for k, h in HEAD_OPTIONS.items() if _score_rank(h) == OBSERVED_RANK)
