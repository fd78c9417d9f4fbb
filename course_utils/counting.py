"""Counting a Transformer by formula: parameters of each part and of a whole GPT, FLOPs per token,
training compute, the memory of a KV cache, and the summary lesson 07's calculator shows.

Every count is exact for the modules of ``attention``, ``blocks`` and ``gpt`` (the tests build
the models and compare). Shapes and sizes: ``D`` = d_model, ``F`` = d_ff, ``H`` heads, ``H_kv``
key/value heads, ``L`` blocks, ``V`` vocabulary, ``T`` context length.
"""

from __future__ import annotations

import torch

from course_utils.config import ACTIVATIONS, NORMS, GPTConfig
from course_utils.gpt import GPT


def feedforward_parameter_count(d_model: int, d_ff: int | None = None, activation: str = "gelu",
                                bias: bool = True) -> int:
    """Trainable parameters of ``FeedForward(d_model, d_ff, activation, bias)`` by formula.

    ReLU/GELU: two matrices, 2·D·F (+ F + D biases). SwiGLU: three matrices, 3·D·F (+ 2F + D).
    With F = 4D and biases that is 8D² + 5D, the MLP's share of a GPT-2 block.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not known; use one of {', '.join(ACTIVATIONS)}")
    d_ff = 4 * d_model if d_ff is None else d_ff
    n_in = 2 if activation == "swiglu" else 1  # SwiGLU has a gate matrix next to W_in
    weights = (n_in + 1) * d_model * d_ff
    biases = (n_in * d_ff + d_model) if bias else 0
    return weights + biases


def norm_parameter_count(kind: str, d: int) -> int:
    """LayerNorm has γ and β (2d), RMSNorm only γ (d), no normalisation nothing."""
    if kind not in NORMS:
        raise ValueError(f"norm={kind!r} is not known; use one of {', '.join(NORMS)}")
    return {"layernorm": 2 * d, "rmsnorm": d, "none": 0}[kind]


def attention_parameter_count(d_model: int, n_heads: int = 1, n_kv_heads: int | None = None,
                              bias: bool = True) -> int:
    """``MultiHeadAttention(d_model, n_heads, n_kv_heads=..., bias=...)`` by formula (d_k = D/H).

    W_Q and W_O are D×D; W_K and W_V are D×(H_kv·d_k), so grouped-query attention shrinks them by
    H/H_kv. Multi-head attention (H_kv = H) gives 4D² + 4D.
    """
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    kv_width = n_kv_heads * (d_model // n_heads)
    weights = 2 * d_model * d_model + 2 * d_model * kv_width
    return weights + ((2 * d_model + 2 * kv_width) if bias else 0)


def block_parameter_count(d_model: int, d_ff: int | None = None, activation: str = "gelu",
                          bias: bool = True, *, n_heads: int = 1, n_kv_heads: int | None = None,
                          norm: str = "layernorm") -> int:
    """Trainable parameters of one Transformer block by formula.

    Attention as in ``attention_parameter_count``, two norms, the MLP as in
    ``feedforward_parameter_count`` (``activation="none"``: no MLP and no second norm).
    GPT-2's layout (F = 4D, GELU, biases, LayerNorm, H_kv = H) gives 12D² + 13D.
    """
    attention = attention_parameter_count(d_model, n_heads, n_kv_heads, bias)
    if activation == "none":
        return attention + norm_parameter_count(norm, d_model)
    return (attention + 2 * norm_parameter_count(norm, d_model)
            + feedforward_parameter_count(d_model, d_ff, activation, bias))


def embedding_params(config: GPTConfig) -> int:
    """Token embedding V·D (counted once when it is also the unembedding, twice with an untied
    ``lm_head``) plus the learned position table max_len·D (other position schemes have no parameters)."""
    c = config
    tokens = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    return tokens + (c.max_len * c.d_model if c.position == "learned" else 0)


def count_params(config: GPTConfig) -> int:
    """N = V·d + max_len·d + L·(12d² + 13d) + 2d for GPT-2's layout, exact for any config.

    The per-block count is ``block_parameter_count`` (it knows d_ff, SwiGLU, grouped-query
    attention, the norm and biases); the final norm adds 2d (LayerNorm) or d (RMSNorm).
    """
    c = config
    per_block = block_parameter_count(c.d_model, c.d_ff, c.activation, c.bias, n_heads=c.n_heads,
                                      n_kv_heads=c.n_kv_heads, norm=c.norm)
    return embedding_params(c) + c.n_layers * per_block + norm_parameter_count(c.norm, c.d_model)


def count_params_approx(config: GPTConfig) -> int:
    """12·L·d²: the weight matrices of the blocks (4d² attention + 8d² MLP each), the bulk for large d."""
    return 12 * config.n_layers * config.d_model ** 2


def count_instantiated(config: GPTConfig) -> int:
    """Parameters of an actual ``GPT(config)``, built on the ``meta`` device (shapes only, no memory),
    so even GPT-3's 175 billion cost nothing. Tied weights count once."""
    with torch.device("meta"):
        model = GPT(config)
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes_per_token(config: GPTConfig, bytes_per_number: int = 2) -> int:
    """Memory a KV cache holds per token: a key and a value of H_kv·d_head numbers in each of L
    blocks, 2·L·H_kv·d_head numbers (bf16/fp16: 2 bytes each). Grouped-query attention divides it by H/H_kv."""
    c = config
    return 2 * c.n_layers * c.kv_heads * c.d_head * bytes_per_number


def flops_per_token(config: GPTConfig, seq_len: int, training: bool = False) -> int:
    """FLOPs to process one token with ``seq_len`` tokens of context (forward, or forward+backward).

    Forward: 2 FLOPs (a multiply and an add) per parameter, 2N, plus the attention scores and the
    weighted sum of values, 2·2·L·T·d (every key counted, as kernels compute them; every query
    head counts, so grouped-query attention changes only N). Training adds the backward pass,
    about twice the forward: 6N + 12·L·T·d.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    forward = 2 * count_params(config) + 4 * config.n_layers * seq_len * config.d_model
    return 3 * forward if training else forward


def training_compute(n_params: int, n_tokens: int) -> int:
    """C ≈ 6·N·D: training FLOPs for N parameters on D tokens (the scaling-laws estimate)."""
    return 6 * n_params * n_tokens


def size_report(config: GPTConfig, seq_len: int | None = None) -> dict[str, float]:
    """The numbers the lesson's calculator shows for one config (``seq_len`` defaults to max_len)."""
    n = count_params(config)
    seq_len = config.max_len if seq_len is None else seq_len
    return {
        "params": n,
        "approx_12Ld2": count_params_approx(config),
        "embedding_share": embedding_params(config) / n,
        "flops_per_token_forward": flops_per_token(config, seq_len),
        "flops_per_token_training": flops_per_token(config, seq_len, training=True),
        "memory_fp32_GB": 4 * n / 1e9,
        "memory_bf16_GB": 2 * n / 1e9,
    }
