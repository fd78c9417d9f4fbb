"""Exercises of lesson 07: a causal pre-LN GPT block, the next-token loss, GPT's parameter count,
temperature sampling, top-k and top-p filtering, and one attention step with a KV cache; five
self-check questions and one experiment (how many characters top-p keeps on the shipped model).

The hints name the usual mistakes (no shift, the tied unembedding counted twice, the crossing token
dropped, ...); where an answer matches none, the last hint of a function exercise gives the recipe.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import attention_weights, close, known_wrong
from course_tools.messages import N_, _
from course_utils import pretrained
from course_utils.attention import merge_heads, scaled_dot_product_attention, split_heads
from course_utils.counting import count_params
from course_utils.generate import top_k_filter, top_p_filter
from course_utils.gpt import GPTConfig
from course_utils.sampling import inverse_cdf

# ------------------------------------------------------------------ a causal pre-LN block

BLOCK_SIZES = [(1, 1, 8, 2), (2, 5, 8, 2), (2, 7, 12, 3)]  # B, T, D, H


def _block_weights(gen: torch.Generator, d: int) -> dict[str, torch.Tensor]:
    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / math.sqrt(shape[0])

    return {"ln1_gamma": 1 + 0.3 * torch.randn(d, generator=gen), "ln1_beta": 0.3 * torch.randn(d, generator=gen),
            "W_Q": w(d, d), "W_K": w(d, d), "W_V": w(d, d), "W_O": w(d, d),
            "ln2_gamma": 1 + 0.3 * torch.randn(d, generator=gen), "ln2_beta": 0.3 * torch.randn(d, generator=gen),
            "W_in": w(d, 4 * d), "W_out": w(4 * d, d)}


def _block_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("x (B={b}, T={t}, D={d}), n_heads={h}, weights as x @ W", b=b, t=t, d=d, h=h),
                 (torch.randn(b, t, d, generator=gen), _block_weights(gen, d), h))
            for b, t, d, h in BLOCK_SIZES]


def _attend(x: torch.Tensor, w: dict[str, torch.Tensor], n_heads: int, diagonal: int | None = 0) -> torch.Tensor:
    """Causal multi-head attention (mask: key s visible from query t when s <= t + diagonal)."""
    T = x.shape[1]
    q, k, v = (split_heads(x @ w[name], n_heads) for name in ("W_Q", "W_K", "W_V"))  # (B, H, T, d)
    keep = None if diagonal is None else torch.ones(T, T, dtype=torch.bool).tril(diagonal)
    return merge_heads(attention_weights(q, k, keep=keep) @ v) @ w["W_O"]


def _block(x, w, n_heads, norm_first=True, diagonal: int | None = 0):
    def ln(h, i):
        return F.layer_norm(h, h.shape[-1:], w[f"ln{i}_gamma"], w[f"ln{i}_beta"], 1e-5)

    def mlp(h):
        return F.gelu(h @ w["W_in"], approximate="tanh") @ w["W_out"]

    if not norm_first:
        x = ln(x + _attend(x, w, n_heads, diagonal), 1)
        return ln(x + mlp(x), 2)
    x = x + _attend(ln(x, 1), w, n_heads, diagonal)
    return x + mlp(ln(x, 2))


def _block_hint(case: Case, got, expected) -> str | None:
    x, w, h = case.args
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and bool(torch.isnan(got[:, 0]).any()):
        return (_("the first token has no key left to attend to: the mask must let each token see itself (keep the "
                  "diagonal, tril(diagonal=0))"))
    if x.shape[1] > 1 and close(got, _block(x, w, h, diagonal=1)):
        return _("each token sees one token into the future: the mask is off by one (use tril, diagonal=0)")
    if x.shape[1] > 1 and close(got, _block(x, w, h, diagonal=None)):
        return _("no causal mask: a GPT token must not attend to later positions")
    if close(got, _block(x, w, h, norm_first=False)):
        return _("that is post-LN (LN(x + F(x))); GPT-2's pre-LN computes x + F(LN(x)) for both sublayers")
    return None


@exercise(cases=_block_cases, hints=[_block_hint])
def gpt_block(x: torch.Tensor, weights: dict[str, torch.Tensor], n_heads: int) -> torch.Tensor:
    """x (B, T, D) -> (B, T, D): x + Attn(LN1(x)), then x + MLP(LN2(x)), with causal attention.

    Matrices act as ``x @ W`` (W_Q, W_K, W_V, W_O are (D, D), W_in (D, 4D), W_out (4D, D)), no
    biases; LayerNorm eps 1e-5; the MLP uses GELU with the tanh approximation (GPT-2's).
    """
    return _block(x, weights, n_heads)


# ------------------------------------------------------------------ the next-token loss

def _loss_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 2, 5), (2, 6, 11), (3, 9, 7)]
    return [Case(N_("logits (B={b}, T={t}, V={v}), tokens (B={b}, T={t})", b=b, t=t, v=v),
                 (2 * torch.randn(b, t, v, generator=gen), torch.randint(0, v, (b, t), generator=gen)))
            for b, t, v in sizes]


def _loss_hint(case: Case, got, expected) -> str | None:
    logits, tokens = case.args
    V = logits.shape[-1]
    if not isinstance(got, (torch.Tensor, float)):
        return None
    got = float(got)
    if math.isclose(got, float(F.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1))), rel_tol=1e-4):
        return _("no shift: position t must be scored on the token at t + 1 (logits[:, :-1] against tokens[:, 1:])")
    if math.isclose(got, float(F.cross_entropy(logits[:, 1:].reshape(-1, V), tokens[:, :-1].reshape(-1))),
                    rel_tol=1e-4):
        return _("shifted the wrong way: drop the last position's logits and the first token")
    probs = torch.softmax(logits[:, :-1], -1).reshape(-1, V)
    if math.isclose(got, float(F.nll_loss(probs, tokens[:, 1:].reshape(-1))), rel_tol=1e-4):
        return _("take the log of the softmax (cross-entropy is −log p of the right token)")
    return None


@exercise(cases=_loss_cases, hints=[_loss_hint])
def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V) of a model that read tokens (B, T) -> scalar tensor: the mean cross-entropy of
    predicting tokens[:, t + 1] from position t, over all B·(T − 1) predictions."""
    V = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))


# ------------------------------------------------------------------ counting parameters

def _count_cases(gen: torch.Generator) -> list[Case]:
    # fixed sizes: the check prints the counts, and stored notebook outputs must not change run to run
    return [Case(N_("GPT-2 small: V=50257, max_len=1024, d=768, L=12"), (50257, 1024, 768, 12)),
            Case(N_("GPT-2 medium: V=50257, max_len=1024, d=1024, L=24"), (50257, 1024, 1024, 24)),
            Case(N_("the Shakespeare model: V=84, max_len=256, d=384, L=6"), (84, 256, 384, 6))]


def _count_hint(case: Case, got, expected) -> str | None:
    V, max_len, d, L = case.args
    if not isinstance(got, int):
        return _("return a Python int")
    misses = {V * d: "the unembedding is tied to the token embedding: count V·d once",
              -L * 13 * d: "the biases and the two LayerNorms add 13d per block",
              -2 * d: "the final LayerNorm adds 2d (γ and β)",
              -max_len * d: "the learned position table adds max_len·d",
              -V * d: "the token embedding adds V·d"}
    if got - expected in misses:
        return misses[got - expected]
    if got == 12 * L * d * d:
        return _("12·L·d² is only the block matrices; add embeddings, biases and norms")
    return None


@exercise(cases=_count_cases, hints=[_count_hint])
def gpt_param_count(V: int, max_len: int, d: int, L: int) -> int:
    """The exact number of parameters of a GPT-2-style model: vocabulary V, context max_len, width d,
    L blocks (MLP width 4d, biases everywhere, tied unembedding)."""
    return count_params(GPTConfig(vocab_size=V, max_len=max_len, n_layers=L, n_heads=1, d_model=d))


# ------------------------------------------------------------------ sampling with a temperature

def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return inverse_cdf(torch.cumsum(weights.double(), dim=-1), u)


def _temperature_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, v, temp in [(4, 6, 1.0), (8, 10, 0.5), (8, 10, 2.0), (3, 7, 0.0)]:
        logits = 2 * torch.randn(b, v, generator=gen)
        u = torch.rand(b, generator=gen)
        label = N_("logits (B={b}, V={v}), temperature {temp:g} (greedy)", b=b, v=v, temp=temp) if temp == 0 \
            else f"logits (B={b}, V={v}), temperature {temp:g}"
        cases.append(Case(label, (logits, temp, u)))
    return cases


def _temperature_hint(case: Case, got, expected) -> str | None:
    logits, temp, u = case.args
    if isinstance(got, torch.Tensor) and got.shape == (*expected.shape, 1):
        return _("return one token id per row, shape (B,): drop the trailing axis of size 1")
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    if temp == 0:
        return _("temperature 0 means greedy: return logits.argmax(-1)")
    if torch.equal(got, logits.argmax(-1)):
        return _("that is greedy decoding; draw from the distribution with u")
    if torch.equal(got, _inverse_cdf(torch.softmax(logits, -1), u)):
        return _("the temperature is missing: divide the logits by it before the softmax")
    if torch.equal(got, _inverse_cdf(torch.softmax(logits * temp, -1), u)):
        return _("divide the logits by the temperature, do not multiply")
    if torch.equal(got, inverse_cdf(torch.cumsum(logits.double() / temp, dim=-1), u)):
        return (_("the cumulative sum must run over probabilities (softmax first), not over logits: sampling from "
                  "raw logits is not sampling from the model's distribution"))
    return (_("one way: probs = softmax(logits / temperature), cdf = probs.cumsum(-1), then torch.searchsorted(cdf, "
              "u[:, None], right=True) finds each row's first index with cdf > u"))


@exercise(cases=_temperature_cases, hints=[_temperature_hint])
def sample_with_temperature(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """logits (B, V), uniform numbers u (B,) in [0, 1) -> token ids (B,).

    p = softmax(logits / temperature); token = the first index whose cumulative probability exceeds
    u. Temperature 0 means greedy (arg-max).
    """
    if temperature == 0:
        return logits.argmax(-1)
    return _inverse_cdf(torch.softmax(logits / temperature, dim=-1), u)


# ------------------------------------------------------------------ top-k and top-p

def _filter_cases(gen: torch.Generator, values: list) -> list[Case]:
    return [Case(f"logits (B={b}, V={v}), {name}={val}", (1.5 * torch.randn(b, v, generator=gen), val))
            for (b, v), (name, val) in zip([(2, 5), (4, 12), (6, 30)], values, strict=True)]


def _k_cases(gen: torch.Generator) -> list[Case]:
    return _filter_cases(gen, [("k", 1), ("k", 3), ("k", 10)])


def _top_k_hint(case: Case, got, expected) -> str | None:
    logits, k = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    sums_to_one = torch.allclose(got.sum(-1), torch.ones(got.shape[0]), atol=1e-4)
    if torch.equal(got > 0, expected > 0) and not sums_to_one:
        return _("renormalise: the kept probabilities must sum to 1 (softmax over the kept logits)")
    if int((got > 0).sum(-1)[0]) != k:
        return _("keep exactly the k={k} largest logits per row, set the rest to -inf", k=k)
    return (_("one way: torch.topk(logits, k).values[:, -1:] is each row's k-th largest logit; set the logits below "
              "it to -inf and take the softmax"))


@exercise(cases=_k_cases, hints=[_top_k_hint])
def top_k_probs(logits: torch.Tensor, k: int) -> torch.Tensor:
    """logits (B, V) -> probabilities (B, V): only the k most likely tokens keep probability,
    renormalised to sum to 1."""
    return torch.softmax(top_k_filter(logits, k), dim=-1)


def _p_cases(gen: torch.Generator) -> list[Case]:
    return _filter_cases(gen, [("p", 0.7), ("p", 0.8), ("p", 0.95)])


def _kept_without_crossing_token(logits: torch.Tensor, p: float) -> torch.Tensor:
    """The tokens a common wrong answer keeps: it drops the token that carries the sum past p."""
    sorted_p, order = torch.softmax(logits, -1).sort(dim=-1, descending=True)
    drop_sorted = sorted_p.cumsum(-1) >= p
    drop_sorted[:, 0] = False
    return ~drop_sorted.scatter(-1, order, drop_sorted)


def _top_p_hint(case: Case, got, expected) -> str | None:
    logits, p = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    if torch.equal(got > 0, _kept_without_crossing_token(logits, p)):
        return (_("the token whose probability carries the sum past p was dropped: keep a token while the mass of "
                  "the tokens ranked above it is below p"))
    if torch.equal(got > 0, expected > 0):
        return _("the right tokens are kept; renormalise their probabilities to sum to 1")
    return (_("one way: sort the probabilities in decreasing order, keep a token while cumsum − its own probability "
              "is below p, put the decision back in vocabulary order (scatter with the sort's indices), zero the "
              "rest and renormalise"))


@exercise(cases=_p_cases, hints=[_top_p_hint])
def top_p_probs(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits (B, V) -> probabilities (B, V) under nucleus (top-p) sampling: the smallest set of most
    likely tokens whose probabilities sum to at least p keeps its mass, renormalised."""
    return torch.softmax(top_p_filter(logits, p), dim=-1)


# ------------------------------------------------------------------ one step with a KV cache

def _kv_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, h, s, d in [(1, 1, 1, 4), (2, 3, 5, 8), (1, 4, 9, 16)]:
        def r(*shape):
            return torch.randn(*shape, generator=gen)

        cases.append(Case(N_("q, k_new, v_new (B={b}, H={h}, 1, d={d}), caches (B={b}, H={h}, S={s}, d={d})", b=b,
                             h=h, d=d, s=s),
                          (r(b, h, 1, d), r(b, h, 1, d), r(b, h, 1, d), r(b, h, s, d), r(b, h, s, d))))
    return cases


def _kv_hint(case: Case, got, expected) -> str | None:
    q, k_new, v_new, k_cache, v_cache = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return _("return a tuple (out, k_all, v_all)")
    out = got[0]
    if close(out, attention_weights(q, k_cache) @ v_cache):
        return _("the new token must also attend to itself: append k_new and v_new before attending")
    if close(out, attention_weights(q, expected[1], scale=False) @ expected[2]):
        return _("scale the scores by 1/√d")
    if isinstance(got[1], torch.Tensor) and close(got[1], torch.cat([k_new, k_cache], dim=-2)):
        return _("append the new key at the end (the newest position is last): torch.cat([k_cache, k_new], dim=-2)")
    return None


@exercise(cases=_kv_cases, hints=[_kv_hint])
def kv_attention_step(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One generation step of one attention layer. q, k_new, v_new (B, H, 1, d) belong to the new
    token; k_cache, v_cache (B, H, S, d) to the S earlier ones. Returns (out (B, H, 1, d),
    k_all (B, H, S+1, d), v_all (B, H, S+1, d)): the new token attends to every position, itself
    included; no mask is needed since nothing later exists yet."""
    k_all = torch.cat([k_cache, k_new], dim=-2)
    v_all = torch.cat([v_cache, v_new], dim=-2)
    return scaled_dot_product_attention(q, k_all, v_all)[0], k_all, v_all


# ------------------------------------------------------------------ self-check questions

@question(explain=N_("training scores every position at once: one row of V = 84 logits for each of the 4 × 16 "
                     "positions."),
          hints=[known_wrong({
              (4, 84): N_("that is generation, which reads only the last position; in training every position "
                          "predicts its next token"),
              (4, 15, 84): N_("the model returns logits at all 16 positions; it is the loss that leaves out the last "
                              "one"),
              (4, 16): N_("each position gets one score per vocabulary entry: the V = 84 axis stays"),
              (4, 16, 16): N_("T × T is the attention inside a block; the output has one score per vocabulary entry"),
          })])
def logits_shape() -> tuple:
    """The shape of a GPT's logits (V = 84) for training tokens of shape (B, T) = (4, 16)."""
    return (4, 16, 84)


@question(explain=N_("the blocks hold about 12·L·d²: twice as many blocks, each a quarter as large (d enters "
                     "squared), give half the parameters."), atol=0.02,
          hints=[known_wrong({
              1: N_("the width enters squared: halving d quarters every block, doubling L only doubles their number"),
              2: N_("halving d does not halve a block: its 12d² falls to a quarter"),
              0.25: N_("that is one block; there are now twice as many of them: 2 × 1/4"),
              4: N_("halving d divides each block by four, it does not multiply it"),
          })])
def reshaped_block_params() -> float:
    """The factor by which 12·L·d² changes when L doubles and d halves."""
    return 0.5


@question(explain=N_("about 2 FLOPs per weight in the forward pass (a multiply and an add) and about twice that in "
                     "the backward pass: 2N + 4N = 6N per token."), atol=0.3,
          hints=[known_wrong({
              2: N_("2N is the forward pass alone; training also runs the backward pass, about twice as costly"),
              3: N_("training costs 3 × the forward pass, and the forward pass already costs 2 FLOPs per weight"),
              4: N_("the backward pass costs about 4N, and the forward pass (2N) still runs before it"),
              1: N_("one multiply and one add per weight is already 2 FLOPs, in the forward pass alone"),
          })])
def training_flops_per_param() -> float:
    """Training FLOPs per token and per parameter (short context): C ≈ 6ND."""
    return 6.0


@question(explain=N_("the running total is 0.5, 0.7, 0.85: the third token carries it across p = 0.8 and stays; the "
                     "fourth is not needed."),
          hints=[known_wrong({
              2: N_("the third token carries the total from 0.7 across 0.8: top-p keeps the crossing token"),
              4: N_("after three tokens the total is 0.85, already at least 0.8: the fourth is not needed"),
              5: N_("top-p cuts the tail: the kept tokens only need to reach p = 0.8"),
              1: N_("0.5 alone is below 0.8: keep adding tokens until the total reaches p"),
          })])
def nucleus_count() -> int:
    """How many of the sorted probabilities 0.5, 0.2, 0.15, 0.1, 0.05 top-p with p = 0.8 keeps."""
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    return int((top_p_filter(probs.log(), 0.8) > float("-inf")).sum())


@question(explain=N_("every block keeps one key and one value of width d = 1,024 per token (the 16 heads split d, "
                     "they do not multiply it): 2 × 24 × 1,024 = 49,152 numbers."), atol=0.5,
          hints=[known_wrong({
              24_576: N_("a cache holds keys and values: two vectors per block and token"),
              18_432: N_("that is GPT-2 small (12 blocks of 768); medium has 24 blocks of 1,024"),
              2_048: N_("every one of the 24 blocks keeps its own key and value"),
              786_432: N_("the 16 heads split d = 1,024 into 16 × 64; they do not multiply it"),
          })])
def kv_numbers_per_token_medium() -> int:
    """Numbers a KV cache of GPT-2 medium (L = 24, d = 1,024, 16 heads) stores per token."""
    return 2 * 24 * 1024


# ------------------------------------------------------------------ experiment: the width of the nucleus

NUCLEUS_WINDOWS = 16  # the first 16 windows of the shipped model's fixed validation slice: 2,048 positions
NUCLEUS_P = 0.9


@functools.lru_cache(maxsize=1)
def _shipped_positions() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-character probabilities (N, V) of the shipped model over the experiment's positions, and
    whether each position's input character (N,) and target character (N,) is a space."""
    lm, chars = pretrained.load("shakespeare_char_small")
    x, y = pretrained.fixed_slice(chars, lm.config.max_len, NUCLEUS_WINDOWS)
    with torch.no_grad():
        probs = torch.softmax(lm(x)[0], dim=-1).flatten(0, 1)
    space = chars.encode(" ")[0]
    return probs, (x == space).flatten(), (y == space).flatten()


def _nucleus_means(sizes: torch.Tensor, where: torch.Tensor) -> tuple[float, float]:
    sizes = sizes.double()
    return round(sizes[where].mean().item(), 1), round(sizes[~where].mean().item(), 1)


def _kept_counts(probs: torch.Tensor, p: float) -> torch.Tensor:
    """(N, V) -> (N,): how many tokens top-p keeps at each position (the crossing token included)."""
    sorted_probs = probs.sort(dim=-1, descending=True).values
    return ((sorted_probs.cumsum(-1) - sorted_probs) < p).sum(-1)


def _pair_close(got, alt: tuple[float, float]) -> bool:
    return (isinstance(got, (tuple, list)) and len(got) == 2
            and all(isinstance(g, (int, float)) and abs(g - a) <= 0.15 for g, a in zip(got, alt, strict=True)))


def _nucleus_hint(case: Case, got, expected) -> str | None:
    probs, after_space, before_space = _shipped_positions()
    sorted_probs = probs.sort(dim=-1, descending=True).values
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return _("set a tuple of two numbers: (mean after a space, mean after any other character)")
    if _pair_close(got, expected[::-1]):
        return _("the two numbers are swapped: first the positions after a space, then the others")
    if _pair_close(got, _nucleus_means((sorted_probs.cumsum(-1) < NUCLEUS_P).sum(-1), after_space)):
        return (_("the token that carries the running total across p was dropped; top-p keeps it (a token stays "
                  "while the mass ranked above it is below p)"))
    if _pair_close(got, _nucleus_means(_kept_counts(probs, NUCLEUS_P), before_space)):
        return (_("that splits the positions by the character to be predicted; the question is about the character "
                  "the model has just read (the input x)"))
    if _pair_close(got, _nucleus_means(((probs.cumsum(-1) - probs) < NUCLEUS_P).sum(-1), after_space)):
        return _("sort each row's probabilities in decreasing order before the running total")
    return None


@question(explain=N_("after a space the next word is open and the nucleus holds about 17 characters; inside a word "
                     "the spelling narrows it to about 5: top-p adapts its cut to the model's certainty, top-k does "
                     "not."), atol=0.15, hints=[_nucleus_hint])
def nucleus_sizes() -> tuple[float, float]:
    """Experiment: the mean number of characters top-p (p = 0.9) keeps on the shipped model over the first
    16 windows of its fixed validation slice, at positions whose input character is a space and at all
    others, each rounded to one decimal."""
    probs, after_space, _ = _shipped_positions()
    return _nucleus_means(_kept_counts(probs, NUCLEUS_P), after_space)
