"""The parts of a Transformer block besides attention: the position-wise feed-forward network,
LayerNorm and RMSNorm written out from their formulas, and the block that joins them with
residual connections in the post-LN (2017, BERT) or pre-LN (GPT-2 onward) order.

Shapes: ``B`` batch, ``T`` sequence length, ``D`` model width (``d_model``), ``F`` hidden width
of the feed-forward network (``d_ff``, 4·D by default).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import MultiHeadAttention

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORMS = ("layernorm", "rmsnorm", "none")


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not known; use one of {', '.join(ACTIVATIONS)}")


def feedforward_parameter_count(d_model: int, d_ff: int | None = None, activation: str = "gelu",
                                bias: bool = True) -> int:
    """Trainable parameters of ``FeedForward(d_model, d_ff, activation, bias)`` by formula.

    ReLU/GELU: two matrices, 2·D·F (+ F + D biases). SwiGLU: three matrices, 3·D·F (+ 2F + D).
    With F = 4D and biases that is 8D² + 5D, the MLP's share of a GPT-2 block.
    """
    _check_activation(activation)
    d_ff = 4 * d_model if d_ff is None else d_ff
    n_in = 2 if activation == "swiglu" else 1  # SwiGLU has a gate matrix next to W_in
    weights = (n_in + 1) * d_model * d_ff
    biases = (n_in * d_ff + d_model) if bias else 0
    return weights + biases


class FeedForward(nn.Module):
    """Position-wise feed-forward network: D -> F -> D with a nonlinearity in between.

    The same ``W_in``/``W_out`` act on every token separately, so tokens are never mixed here
    (only attention mixes them). ``"swiglu"`` computes ``W_out(silu(W_gate x) * W_in x)``.
    """

    def __init__(self, d_model: int, d_ff: int | None = None, activation: str = "gelu",
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        _check_activation(activation)
        if d_model <= 0 or (d_ff is not None and d_ff <= 0):
            raise ValueError(f"d_model={d_model} and d_ff={d_ff} must be positive")
        self.d_model = d_model
        self.d_ff = 4 * d_model if d_ff is None else d_ff
        self.activation = activation
        self.W_in = nn.Linear(d_model, self.d_ff, bias=bias)
        if activation == "swiglu":
            self.W_gate = nn.Linear(d_model, self.d_ff, bias=bias)
        self.W_out = nn.Linear(self.d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., F): the activations after the nonlinearity (the "neurons")."""
        if x.shape[-1] != self.d_model:
            raise ValueError(f"FeedForward expects inputs with last dimension d_model={self.d_model}, "
                             f"got shape {tuple(x.shape)}")
        h = self.W_in(x)
        if self.activation == "relu":
            return F.relu(h)
        if self.activation == "gelu":
            return F.gelu(h)
        if self.activation == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        return F.silu(self.W_gate(x)) * h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        return self.dropout(self.W_out(self.hidden(x)))


def _check_last_dim(name: str, x: torch.Tensor, d: int) -> None:
    if x.shape[-1] != d:
        raise ValueError(f"{name} was built for vectors of size d={d} but got input of shape "
                         f"{tuple(x.shape)}; normalise over the last axis, or build {name}({x.shape[-1]})")


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., D) -> (..., D): γ (x − μ) / √(σ² + ε) + β, μ and the biased σ² over each token's D features."""
    mu = x.mean(dim=-1, keepdim=True)
    var = (x - mu).pow(2).mean(dim=-1, keepdim=True)
    return gamma * (x - mu) / torch.sqrt(var + eps) + beta


def rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """(..., D) -> (..., D): γ x / √(mean_j x_j² + ε); no mean subtracted, no shift."""
    return gamma * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


class LayerNorm(nn.Module):
    """LN(x)_i = γ_i (x_i − μ) / √(σ² + ε) + β_i, with μ and σ² taken over each token's D features.

    σ² is the biased variance (divide by D), as in ``torch.nn.LayerNorm``; ε sits inside the root.
    """

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        if d <= 0 or eps < 0:
            raise ValueError(f"LayerNorm needs d > 0 and eps >= 0, got d={d}, eps={eps}")
        self.d, self.eps = d, eps
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D): every token standardised, then scaled by γ and shifted by β."""
        _check_last_dim("LayerNorm", x, self.d)
        return layer_norm(x, self.gamma, self.beta, self.eps)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same function in PyTorch's one-kernel ``F.layer_norm`` (a test checks they agree):
        one operation forward and one backward instead of about eight each, for fast training."""
        return F.layer_norm(x, (self.d,), self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


class RMSNorm(nn.Module):
    """RMSNorm(x)_i = γ_i x_i / √(mean_j x_j² + ε): no mean subtracted, no shift β."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        if d <= 0 or eps < 0:
            raise ValueError(f"RMSNorm needs d > 0 and eps >= 0, got d={d}, eps={eps}")
        self.d, self.eps = d, eps
        self.gamma = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        _check_last_dim("RMSNorm", x, self.d)
        return rms_norm(x, self.gamma, self.eps)

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same function in PyTorch's ``F.rms_norm`` (a test checks they agree)."""
        return F.rms_norm(x, (self.d,), self.gamma, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


def make_norm(kind: str, d: int, eps: float = 1e-5) -> nn.Module:
    """The normalisation named ``kind`` over vectors of size d: LayerNorm, RMSNorm or none (identity)."""
    if kind == "layernorm":
        return LayerNorm(d, eps)
    if kind == "rmsnorm":
        return RMSNorm(d, eps)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm={kind!r} is not known; use one of {', '.join(NORMS)}")


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
    """Trainable parameters of one ``TransformerBlock`` by formula.

    Attention as in ``attention_parameter_count``, two norms, the MLP as in
    ``feedforward_parameter_count`` (``activation="none"``: no MLP and no second norm).
    GPT-2's layout (F = 4D, GELU, biases, LayerNorm, H_kv = H) gives 12D² + 13D.
    """
    attention = attention_parameter_count(d_model, n_heads, n_kv_heads, bias)
    if activation == "none":
        return attention + norm_parameter_count(norm, d_model)
    return (attention + 2 * norm_parameter_count(norm, d_model)
            + feedforward_parameter_count(d_model, d_ff, activation, bias))


class TransformerBlock(nn.Module):
    """One Transformer layer: multi-head attention, then the feed-forward network, each wrapped in
    a residual connection and a normalisation.

    ``norm_first=True`` (pre-LN, GPT-2 onward): x + attn(norm1(x)), then x + ffn(norm2(x)); the
    residual stream itself is never normalised. ``norm_first=False`` (post-LN, 2017 "Add & Norm",
    BERT): norm1(x + attn(x)), then norm2(x + ffn(x)). The switches exist to measure what each
    piece is worth: ``norm`` "layernorm" / "rmsnorm" / "none", ``activation="none"`` (no
    feed-forward network), ``residual=False`` (drop the "x +"), ``n_kv_heads`` (grouped-query
    attention), ``rope_base`` / ``alibi`` (positions inside attention).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, activation: str = "gelu",
                 norm_first: bool = True, eps: float = 1e-5, bias: bool = True, dropout: float = 0.0,
                 attn_impl: str = "batched", *, n_kv_heads: int | None = None, norm: str = "layernorm",
                 residual: bool = True, rope_base: float | None = None, alibi: bool = False) -> None:
        super().__init__()
        if activation != "none":
            _check_activation(activation)
        self.norm_first, self.residual = norm_first, residual
        self.attn_impl = attn_impl  # "batched" or "fused" (PyTorch's kernels, same parameters)
        self.attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout, n_kv_heads=n_kv_heads,
                                       rope_base=rope_base, alibi=alibi)
        self.norm1 = make_norm(norm, d_model, eps)
        self.ffn = None if activation == "none" else FeedForward(d_model, d_ff, activation, bias, dropout)
        self.norm2 = None if activation == "none" else make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout)  # on the attention output, as GPT-2/BERT do (the FFN has its own)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                kv_cache=None) -> torch.Tensor:
        """(B, T, D) -> (B, T, D). ``mask``/``causal``/``kv_cache`` go to the attention.

        With ``attn_impl="fused"`` the norms run as PyTorch's kernels too (``LayerNorm.fused``).
        """
        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.attn(h, mask=mask, causal=causal, impl=self.attn_impl, kv_cache=kv_cache))

        x = self._sublayer(x, attend, self._kernel(self.norm1))
        return x if self.ffn is None else self._sublayer(x, self.ffn, self._kernel(self.norm2))

    def _kernel(self, norm: nn.Module) -> nn.Module:
        """The norm itself, or with ``attn_impl="fused"`` its one-kernel twin (no norm: the identity)."""
        return getattr(norm, "fused", norm) if self.attn_impl == "fused" else norm

    def _sublayer(self, x: torch.Tensor, f, norm) -> torch.Tensor:
        """Pre-LN x + f(norm(x)) or post-LN norm(x + f(x)); without the residual, "x +" is dropped."""
        if self.norm_first:
            out = f(norm(x))
            return x + out if self.residual else out
        return norm(x + f(x) if self.residual else f(x))
