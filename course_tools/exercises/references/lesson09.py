"""Exercises of lesson 09: SwiGLU, RoPE on queries and keys, grouped-query attention, one KV-cache
step with grouped-query attention, and the parameter count of a LLaMA-style block; five self-check
questions and one experiment (how many powers of ten of gradient a stack without residual
connections loses at initialisation)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _
from course_utils.counting import block_parameter_count
from course_utils.cpu_threads import torch_threads
from course_utils.gpt import GPT, GPTConfig
from course_utils.positional import apply_rope


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


# ------------------------------------------------------------------ SwiGLU

def _swiglu_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, d, f in [(1, 2, 4, 6), (2, 5, 8, 16), (3, 4, 12, 32)]:
        scale = 1 / math.sqrt(d)
        cases.append(Case(f"x (B={b}, T={t}, D={d}), W_gate, W_in (D, F={f}), W_out (F, D)",
                          (_randn(gen, b, t, d), scale * _randn(gen, d, f), scale * _randn(gen, d, f),
                           _randn(gen, f, d) / math.sqrt(f))))
    return cases


def _swiglu_hint(case: Case, got, expected) -> str | None:
    x, w_gate, w_in, w_out = case.args
    if _close(got, (F.silu(x @ w_in) * (x @ w_gate)) @ w_out):
        return _("gate and value are swapped: the SiLU goes on x @ W_gate, which multiplies x @ W_in")
    if _close(got, F.silu((x @ w_gate) * (x @ w_in)) @ w_out):
        return _("apply the SiLU to the gate x @ W_gate alone, then multiply by x @ W_in")
    if _close(got, (F.gelu(x @ w_gate) * (x @ w_in)) @ w_out):
        return _("SwiGLU uses the SiLU (swish) x·σ(x), not the GELU")
    if _close(got, (torch.sigmoid(x @ w_gate) * (x @ w_in)) @ w_out):
        return _("SiLU is x·σ(x), not σ(x) alone (F.silu)")
    return _("F.silu computes the SiLU; apply it to x @ W_gate, multiply by x @ W_in element by element, then @ W_out")


@exercise(cases=_swiglu_cases, hints=[_swiglu_hint])
def swiglu(x: torch.Tensor, W_gate: torch.Tensor, W_in: torch.Tensor, W_out: torch.Tensor) -> torch.Tensor:
    """x (B, T, D) -> (B, T, D): (SiLU(x W_gate) ⊙ x W_in) W_out, LLaMA's gated feed-forward network."""
    return (F.silu(x @ W_gate) * (x @ W_in)) @ W_out


# ------------------------------------------------------------------ RoPE on q and k

def _rope_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("q, k (B={b}, H={h}, T={t}, d={d}), base {base:g}", b=b, h=h, t=t, d=d, base=base),
                 (_randn(gen, b, h, t, d), _randn(gen, b, h, t, d), base))
            for b, h, t, d, base in [(1, 1, 3, 2, 10000.0), (2, 2, 6, 8, 10000.0), (1, 4, 9, 16, 500.0)]]


def _rope_scores(q, k, base, rotate_k=True, scale=True, halves=False):
    d = q.shape[-1]
    pos = torch.arange(q.shape[-2])
    if halves:
        perm = torch.arange(d).view(2, d // 2).t().flatten()  # neighbours -> halves layout
        inv = torch.argsort(perm)
        q_r = apply_rope(q[..., perm], pos, base)[..., inv]
        k_r = apply_rope(k[..., perm], pos, base)[..., inv]
    else:
        q_r, k_r = apply_rope(q, pos, base), apply_rope(k, pos, base) if rotate_k else k
    return q_r @ k_r.transpose(-2, -1) / (math.sqrt(d) if scale else 1.0)


def _rope_hint(case: Case, got, expected) -> str | None:
    q, k, base = case.args
    if q.shape[-2] > 1 and _close(got, _rope_scores(q, k, base, rotate_k=False)):
        return _("rotate the keys too: RoPE turns both q and k by the angle of their own position")
    if _close(got, _rope_scores(q, k, base, scale=False)):
        return _("divide the scores by √d as in ordinary attention")
    if q.shape[-1] > 2 and _close(got, _rope_scores(q, k, base, halves=True)):
        return _("that pairs feature j with j + d/2 (Hugging Face's halves); here pairs are neighbours (2i, 2i+1)")
    if q.shape[-2] > 1 and _close(got, q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])):
        return _("no rotation was applied: rotate pair i of position p by the angle p·base^(−2i/d)")
    return (_("build the (T, d/2) angles p·base^(−2i/d) in float64 (exact for large p), rotate the even and odd "
              "features x[..., 0::2], x[..., 1::2] of q and of k, interleave them back, then q_rot k_rotᵀ / √d"))


@exercise(cases=_rope_cases, hints=[_rope_hint])
def rope_scores(q: torch.Tensor, k: torch.Tensor, base: float) -> torch.Tensor:
    """q, k (B, H, T, d), token t at position t -> attention scores (B, H, T, T) = q_rot k_rotᵀ / √d,
    where each neighbour pair (2i, 2i+1) of q and k is rotated by the angle position · base^(−2i/d)."""
    return _rope_scores(q, k, base)


# ------------------------------------------------------------------ grouped-query attention

def _attend(q, k, v, causal=True, scale=True):
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    if causal:
        scores = scores.masked_fill(~torch.ones(T, S, dtype=torch.bool).tril(S - T), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _gqa_cases(gen: torch.Generator) -> list[Case]:
    return [Case(f"q (B={b}, H={h}, T={t}, d={d}), k, v (B={b}, H_kv={g}, T={t}, d={d})",
                 (_randn(gen, b, h, t, d), _randn(gen, b, g, t, d), _randn(gen, b, g, t, d)))
            for b, h, g, t, d in [(1, 2, 1, 3, 4), (2, 4, 2, 5, 8), (1, 6, 3, 7, 8), (2, 8, 2, 4, 4)]]


def _gqa_hint(case: Case, got, expected) -> str | None:
    q, k, v = case.args
    group = q.shape[1] // k.shape[1]
    if k.shape[1] > 1 and group > 1 and _close(got, _attend(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1))):
        return (_("query head i must read key/value head i // group (neighbouring heads share): use "
                  "repeat_interleave(group, dim=1), not repeat, which gives i % H_kv"))
    full_k, full_v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if _close(got, _attend(q, full_k, full_v, causal=False)):
        return _("apply the causal mask: token t may only attend to positions up to t")
    if _close(got, _attend(q, full_k, full_v, scale=False)):
        return _("divide the scores by √d")
    return (_("give each query head its key/value head: k.repeat_interleave(H // H_kv, dim=1) (same for v), or "
              "reshape q to (B, H_kv, H // H_kv, T, d) and broadcast; then ordinary causal attention"))


@exercise(cases=_gqa_cases, hints=[_gqa_hint])
def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention: q (B, H, T, d), k and v (B, H_kv, T, d) with H_kv dividing H
    -> (B, H, T, d). Query head i uses key/value head i // (H / H_kv)."""
    group = q.shape[1] // k.shape[1]
    return _attend(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1))


# ------------------------------------------------------------------ one KV-cache step with GQA

def _step_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, h, g, s, d in [(1, 2, 1, 1, 4), (2, 4, 2, 5, 8), (1, 8, 2, 9, 4)]:
        cases.append(Case(N_("q (B={b}, H={h}, 1, d={d}), k_new, v_new (B={b}, H_kv={g}, 1, d={d}), caches (B={b}, "
                             "H_kv={g}, S={s}, d={d})", b=b, h=h, d=d, g=g, s=s),
                          (_randn(gen, b, h, 1, d), _randn(gen, b, g, 1, d), _randn(gen, b, g, 1, d),
                           _randn(gen, b, g, s, d), _randn(gen, b, g, s, d))))
    return cases


def _step_hint(case: Case, got, expected) -> str | None:
    q, k_new, v_new, k_cache, v_cache = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return _("return a tuple (out, k_all, v_all)")
    group = q.shape[1] // k_new.shape[1]
    if isinstance(got[1], torch.Tensor) and got[1].shape[1] == q.shape[1] and group > 1:
        return (_("the cache must keep only the H_kv key/value heads (that is GQA's saving); repeat them for the "
                  "query heads only when attending"))
    if _close(got[0], gqa_attention(q, k_cache, v_cache)):
        return _("append k_new and v_new before attending: the new token attends to itself too")
    return None


@exercise(cases=_step_cases, hints=[_step_hint])
def gqa_cache_step(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One generation step with grouped-query attention. q (B, H, 1, d) is the new token's query;
    k_new, v_new (B, H_kv, 1, d) its key and value; k_cache, v_cache (B, H_kv, S, d) the earlier
    tokens'. Returns (out (B, H, 1, d), k_all (B, H_kv, S+1, d), v_all (B, H_kv, S+1, d))."""
    k_all = torch.cat([k_cache, k_new], dim=-2)
    v_all = torch.cat([v_cache, v_new], dim=-2)
    return gqa_attention(q, k_all, v_all), k_all, v_all


# ------------------------------------------------------------------ parameters of a LLaMA-style block

def _count_cases(gen: torch.Generator) -> list[Case]:
    # fixed, published sizes: the check prints them, and stored outputs must not change run to run
    return [Case("LLaMA-2 7B: D=4096, H=32, H_kv=32, F=11008", (4096, 32, 32, 11008)),
            Case("LLaMA-2 70B: D=8192, H=64, H_kv=8, F=28672", (8192, 64, 8, 28672)),
            Case("LLaMA-3 8B: D=4096, H=32, H_kv=8, F=14336", (4096, 32, 8, 14336)),
            Case(N_("a small one: D=64, H=4, H_kv=1, F=170"), (64, 4, 1, 170))]


def _count_hint(case: Case, got, expected) -> str | None:
    D, H, H_kv, F_ = case.args
    if not isinstance(got, int):
        return _("return a Python int")
    kv = H_kv * D // H
    misses = {2 * D * (D - kv): "W_K and W_V are D × (H_kv·D/H) under grouped-query attention, not D × D",
              2 * D: "RMSNorm has only a gain γ (d numbers), no shift β",
              -D * F_: "SwiGLU has three matrices (W_gate, W_in, W_out), 3·D·F",
              -2 * D: "count the two RMSNorms of the block (γ of size d each)",
              2 * D + 2 * kv + 2 * F_ + D: "a LLaMA block has no biases"}
    return misses.get(got - expected)


@exercise(cases=_count_cases, hints=[_count_hint])
def llama_block_params(d_model: int, n_heads: int, n_kv_heads: int, d_ff: int) -> int:
    """Parameters of one LLaMA-style block: RMSNorm, attention with n_kv_heads key/value heads
    (head size d_model/n_heads), RMSNorm, SwiGLU of width d_ff; no biases."""
    return block_parameter_count(d_model, d_ff, "swiglu", bias=False, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                 norm="rmsnorm")


# ------------------------------------------------------------------ self-check questions

@question(explain=N_("RMSNorm is LayerNorm without subtracting the mean and without β: on a vector whose mean is "
                     "already 0 (and with β = 0 and the same γ) the two compute the same thing."),
          hints=[known_wrong({
              "a": N_("RMSNorm does not subtract the mean: a vector with a large mean comes out differently"),
              "c": N_("unit variance is not enough: RMSNorm divides by √(mean(x²)) = √(variance + mean²)"),
              "d": N_("they agree whenever the mean is already 0: subtracting it then changes nothing"),
          })])
def rmsnorm_equals_layernorm() -> str:
    """Multiple choice: when do RMSNorm and LayerNorm (β = 0, same γ, same ε) give the same output?"""
    return "b"


@question(explain=N_("the GELU MLP has 2·D·4D = 8D² weights, SwiGLU 3·D·F: equal for F = 8D/3 = 2,048 at D = 768."),
          hints=[known_wrong({
              3072: N_("that is the GELU MLP's width 4D; SwiGLU has three D × F matrices, so it must be narrower"),
              1536: N_("F = 2D gives 6D² weights, fewer than the 8D² of the GELU MLP"),
          })])
def swiglu_equal_width() -> int:
    """The SwiGLU width F that matches the weights (no biases) of a GELU MLP of width 4D, at D = 768."""
    return 8 * 768 // 3


@question(explain=N_("a group of H/H_kv = 4 neighbouring query heads shares a key/value head: 13 // 4 = 3."),
          hints=[known_wrong({
              5: N_("13 % 8 pairs head i with i mod H_kv (what repeat gives); neighbouring heads share: i // (H/H_kv)"),
              1: N_("13 // 8 divides by H_kv; the group size is H / H_kv = 4"),
              13: N_("with 8 key/value heads there is no head 13: the 32 query heads share 8"),
          })])
def gqa_kv_head() -> int:
    """Which key/value head (counted from 0) does query head 13 read, with H = 32 and H_kv = 8?"""
    return 13 // (32 // 8)


@question(explain=N_("2 (key and value) · 40 layers · 8 key/value heads · 128 numbers per head · 2 bytes = 163,840 "
                     "bytes (160 KiB) per token."),
          hints=[known_wrong({
              81_920: N_("count both the key and the value of every head"),
              131_072: N_("that is LLaMA-3 8B's 32 layers; this model has 40"),
              819_200: N_("GQA caches the H_kv = 8 key/value heads, not the 40 query heads"),
              327_680: N_("bf16 takes 2 bytes per number, not 4"),
              4_096: N_("that is one layer; multiply by the 40 layers"),
          })])
def kv_bytes_40_layers() -> int:
    """Bytes of KV cache per token in bf16 of a model with L = 40 layers, H = 40 query heads, H_kv = 8
    key/value heads and d_head = 128."""
    return 2 * 40 * 8 * 128 * 2


@question(explain=N_("W_K and W_V shrink from 64 × 64 to 64 × 16 (1 head of 16): 2 · 64 · 48 = 6,144 fewer weights "
                     "per block, 18,432 in the 3 blocks."),
          hints=[known_wrong({
              12_288: N_("that is the ladder's 2 key/value heads; with 1 each of W_K and W_V keeps only 16 columns"),
              6_144: N_("that is one block; the ladder's model has 3"),
              9_216: N_("W_V shrinks too, not only W_K"),
              18_624: N_("the rung has no biases: count the weights only"),
          })])
def mqa_params_saved() -> int:
    """Parameters saved in the ladder's model (D = 64, H = 4, L = 3, no biases) by 1 key/value head (multi-query
    attention) instead of 4."""
    return 3 * 2 * 64 * (64 - 16)


# ------------------------------------------------------------------ experiment: gradients without residuals

def _gradient_at_positions(residual: bool, seed: int, n_layers: int = 3) -> float:
    """Norm of the loss gradient at the position table of a freshly initialised ladder model
    (D = 64, H = 4, no normalisation) on one random batch of 8 windows of 32 tokens."""
    config = GPTConfig(vocab_size=65, max_len=32, n_layers=n_layers, n_heads=4, d_model=64, norm="none",
                       residual=residual)
    torch.manual_seed(seed)
    model = GPT(config)
    gen = torch.Generator().manual_seed(seed)
    idx, targets = torch.randint(0, 65, (2, 8, 32), generator=gen)
    logits, _ = model(idx)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    return model.position_embedding.weight.grad.norm().item()


@question(explain=N_("each block without the x + path multiplies the gradient by about 10⁻⁴ (its weight matrices of "
                     "GPT-2's N(0, 0.02) scale it down several times); three blocks give about 10⁻¹², while the "
                     "residual path carries it through unchanged."),
          hints=[known_wrong({
              4: N_("that is one block (L = 1); the ladder's stack has L = 3"),
              8: N_("that is two blocks (L = 2); the ladder's stack has L = 3"),
              -12: N_("the ratio is the wrong way round: with residual connections divided by without"),
              0: N_("the two models must differ: one with residual=False, one with residual=True, from the same seed"),
          })])
def no_residual_gradient_orders() -> int:
    """Experiment: log10 of (gradient norm at the position table with residual connections / without),
    rounded, for the ladder's L = 3 stack without normalisation at initialisation."""
    with torch_threads(1):  # tiny models: one thread is fastest on a shared CPU (0.2 s instead of 2)
        ratios = [math.log10(_gradient_at_positions(True, seed) / _gradient_at_positions(False, seed))
                  for seed in (0, 1)]
    return round(sum(ratios) / len(ratios))
