"""The parts of a Transformer block besides attention: the position-wise feed-forward network,
LayerNorm and RMSNorm written out from their formulas, and the block that joins them with
residual connections in the post-LN (2017, BERT) or pre-LN (GPT-2 onward) order.

Shapes: ``B`` batch, ``T`` sequence length, ``D`` model width (``d_model``), ``F`` hidden width
of the feed-forward network (``d_ff``, 4·D by default).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import Cache, MultiHeadAttention, RopeTable
from course_utils.config import ACTIVATIONS, NORMS


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not known; use one of {', '.join(ACTIVATIONS)}")


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
    ``forward`` calls PyTorch's one-kernel ``F.layer_norm``, which computes ``layer_norm`` above
    (lesson 04 checks that they agree) in one operation instead of about eight.
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
        return F.layer_norm(x, (self.d,), self.gamma, self.beta, self.eps)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


class RMSNorm(nn.Module):
    """RMSNorm(x)_i = γ_i x_i / √(mean_j x_j² + ε): no mean subtracted, no shift β.

    ``forward`` calls PyTorch's ``F.rms_norm``, which computes ``rms_norm`` above (lesson 04 checks it).
    """

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        if d <= 0 or eps < 0:
            raise ValueError(f"RMSNorm needs d > 0 and eps >= 0, got d={d}, eps={eps}")
        self.d, self.eps = d, eps
        self.gamma = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) -> (..., D)."""
        _check_last_dim("RMSNorm", x, self.d)
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


class TransformerBlock(nn.Module):
    """One Transformer layer: attention, then the feed-forward network, each wrapped in a residual
    connection and a normalisation. The block joins the parts it is given (``make_block`` builds
    the usual ones; ``gpt.GPT`` builds them from its config).

    ``norm_first=True`` (pre-LN, GPT-2 onward): x + attn(norm1(x)), then x + ffn(norm2(x)); the
    residual stream itself is never normalised. ``norm_first=False`` (post-LN, 2017 "Add & Norm",
    BERT): norm1(x + attn(x)), then norm2(x + ffn(x)). ``ffn=None`` (with ``norm2=None``) leaves
    attention alone; ``residual=False`` drops the "x +" (lesson 04 measures what it is worth).
    """

    def __init__(self, attn: nn.Module, ffn: nn.Module | None, norm1: nn.Module, norm2: nn.Module | None, *,
                 norm_first: bool = True, residual: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if (ffn is None) != (norm2 is None):
            raise ValueError("give the feed-forward network and its norm together (both, or both None)")
        self.norm_first, self.residual = norm_first, residual
        self.attn = attn
        self.norm1 = norm1
        self.ffn = ffn
        self.norm2 = norm2
        self.dropout = nn.Dropout(dropout)  # on the attention output, as GPT-2/BERT do (the FFN has its own)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                kv_cache: Cache | None = None, rope: RopeTable | None = None) -> torch.Tensor:
        """(B, T, D) -> (B, T, D). ``mask``/``causal``/``kv_cache`` and the model's RoPE table
        ``rope`` (``attention.rope_table``) go to the attention."""
        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.attn(h, mask=mask, causal=causal, kv_cache=kv_cache, rope=rope))

        x = self._sublayer(x, attend, self.norm1)
        return x if self.ffn is None or self.norm2 is None else self._sublayer(x, self.ffn, self.norm2)

    def _sublayer(self, x: torch.Tensor, f: Callable[[torch.Tensor], torch.Tensor], norm: nn.Module) -> torch.Tensor:
        """Pre-LN x + f(norm(x)) or post-LN norm(x + f(x)); without the residual, "x +" is dropped."""
        if self.norm_first:
            out = f(norm(x))
            return x + out if self.residual else out
        return norm(x + f(x) if self.residual else f(x))


def make_block(d_model: int, n_heads: int, d_ff: int | None = None, activation: str = "gelu",
               norm_first: bool = True, eps: float = 1e-5, bias: bool = True, dropout: float = 0.0) -> TransformerBlock:
    """The block of the 2017 paper and BERT (``norm_first=False``) or of GPT-2 (pre-LN): multi-head
    attention, LayerNorms and a feed-forward network of width ``d_ff`` (4·d_model by default)."""
    return TransformerBlock(MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout),
                            FeedForward(d_model, d_ff, activation, bias, dropout),
                            LayerNorm(d_model, eps), LayerNorm(d_model, eps), norm_first=norm_first, dropout=dropout)
