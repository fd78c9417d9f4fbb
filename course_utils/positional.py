"""Positional information for attention, which on its own ignores token order: learned absolute
positions (one row of W_pos per position), sinusoidal encodings (2017), rotary embeddings
(RoPE, 2021) and the ALiBi bias (2022).

Shapes: ``T`` query positions, ``S`` key positions, ``D`` model width, ``H`` heads, ``d`` the
size of the vectors being encoded (``d_model`` or ``d_head``, always even for sin/cos pairs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from course_utils import runtime


class LearnedPositionalEmbedding(nn.Module):
    """Absolute positions as a trained table: position p gets row p of ``weight`` (N, D).

    Equal to one-hot(p) @ W_pos. N, the maximum length, is fixed in advance: a position ≥ N
    has no row, so it has no embedding.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        if max_len <= 0 or d_model <= 0:
            raise ValueError(f"max_len={max_len} and d_model={d_model} must be positive")
        self.max_len, self.d_model = max_len, d_model
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        """Embeddings of positions offset, ..., offset + seq_len − 1: (seq_len, D)."""
        if seq_len < 0 or offset < 0:
            raise ValueError(f"seq_len={seq_len} and offset={offset} must be non-negative")
        if offset + seq_len > self.max_len:
            raise ValueError(
                f"positions up to {offset + seq_len - 1} were asked for, but this table has only "
                f"N={self.max_len} rows (positions 0..{self.max_len - 1}); shorten the input to at most "
                f"N={self.max_len} tokens or build LearnedPositionalEmbedding with a larger max_len")
        return self.weight[offset:offset + seq_len]

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


def _check_even(d: int, what: str) -> None:
    if d <= 0 or d % 2:
        raise ValueError(f"{what} must be a positive even number (features come in sin/cos pairs), got {d}")


def sinusoidal_frequencies(d: int, base: float = 10000.0) -> torch.Tensor:
    """ω_i = base^(−2i/d) for i = 0 .. d/2 − 1: (d/2,), float64. Each pair is ~base^(2/d) slower."""
    _check_even(d, "d")
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def sinusoidal_encoding(n_positions: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE[p, 2i] = sin(ω_i p), PE[p, 2i+1] = cos(ω_i p) for p = 0 .. n − 1: (n, d).

    Computed in float64 and returned in the default dtype.
    """
    if n_positions < 0:
        raise ValueError(f"n_positions must be non-negative, got {n_positions}")
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * sinusoidal_frequencies(d, base)
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # interleave: sin, cos, sin, ...
    return pe.to(torch.get_default_dtype())


class SinusoidalPositionalEncoding(nn.Module):
    """The fixed sinusoidal encodings as a module with no parameters, defined for any position
    (unlike the learned table, it has no maximum length)."""

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        _check_even(d_model, "d_model")
        self.d_model, self.base = d_model, base

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        """Encodings of positions offset, ..., offset + seq_len − 1: (seq_len, D)."""
        if seq_len < 0 or offset < 0:
            raise ValueError(f"seq_len={seq_len} and offset={offset} must be non-negative")
        return sinusoidal_encoding(offset + seq_len, self.d_model, self.base)[offset:]

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, base={self.base}"


def sinusoidal_rotation(k: float, d: int, base: float = 10000.0) -> torch.Tensor:
    """The (d, d) block-diagonal rotation R(k) with PE(p + k) = R(k) PE(p) for every p.

    Block i is [[cos ω_i k, sin ω_i k], [−sin ω_i k, cos ω_i k]] acting on (sin, cos) pair i.
    """
    angle = sinusoidal_frequencies(d, base) * k
    c, s = angle.cos(), angle.sin()
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(torch.get_default_dtype())


def rope_angles(positions: torch.Tensor | Sequence[int], d: int, base: float = 10000.0,
                dtype: torch.dtype | None = None, device: torch.device | str | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles ω_i · position: (..., T, d/2) each, for ``rotate_pairs``.

    The angles are formed in float64 (float32 on MPS), so a position of several thousand still gets
    its exact rotation, and only cos and sin are rounded to ``dtype``. Queries and keys at the same
    positions share one table, so attention computes it once per step.
    """
    _check_even(d, "the last dimension of x (the head size)")
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype == torch.bool:
        raise TypeError("positions must be numbers (token positions), not booleans")
    exact = runtime.exact_dtype(positions.device)
    omega = sinusoidal_frequencies(d, base).to(device=positions.device, dtype=exact)
    angle = positions.to(exact)[..., None] * omega  # (..., T, d/2)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, d) with each pair (x_2i, x_2i+1) rotated by the angle whose cos and sin
    (broadcastable to (..., T, d/2)) are given: the rotation step of ``apply_rope``."""
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], dim=-1)
    return rotated.flatten(-2)


def apply_rope(x: torch.Tensor, positions: torch.Tensor | Sequence[int],
               base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding: rotate each pair (x_2i, x_2i+1) by the angle ω_i · position.

    x: (..., T, d) queries or keys, d even; positions: (T,) or any shape broadcastable to
    x.shape[:-1]. Returns a tensor like x. Applied to both q and k, q·k then depends on the
    contents and on the difference of the two positions only.
    """
    _check_even(x.shape[-1], "the last dimension of x (the head size)")
    positions = torch.as_tensor(positions, device=x.device)
    if positions.ndim == 0 or positions.shape[-1] != x.shape[-2]:
        raise ValueError(f"positions must have one entry per token: last dimension {x.shape[-2]} "
                         f"(x has shape {tuple(x.shape)}), got shape {tuple(positions.shape)}")
    return rotate_pairs(x, *rope_angles(positions, x.shape[-1], base, x.dtype))


def rope_halves_to_pairs(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a query or key projection (H·d, ...) from the "halves" RoPE convention
    to ours. Hugging Face's LLaMA rotates feature j of a head with feature j + d/2 ("rotate_half");
    ``apply_rope`` rotates 2j with 2j + 1. Row j goes to 2j and row j + d/2 to 2j + 1, in every head.
    """
    if weight.shape[0] % n_heads or (weight.shape[0] // n_heads) % 2:
        raise ValueError(f"{weight.shape[0]} rows do not split into n_heads={n_heads} heads of even size; "
                         "pass the number of heads of this projection (n_kv_heads for W_K)")
    d = weight.shape[0] // n_heads
    return weight.reshape(n_heads, 2, d // 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes m_h: (H,). For H a power of two, m_h = 2^(−8h/H), h = 1..H;
    otherwise the slopes of the next lower power of two, topped up with every other slope of
    twice that many heads (as in the paper's code)."""
    if n_heads <= 0:
        raise ValueError(f"n_heads must be positive, got {n_heads}")

    def powers(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    lower = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(lower) + powers(2 * lower)[0::2][: n_heads - lower]
    return torch.tensor(slopes)


def alibi_bias(n_heads: int, T: int, S: int | None = None) -> torch.Tensor:
    """Additive attention bias −m_h · |i − j|: (H, T, S). Far keys lose score linearly.

    Queries are aligned bottom-right like ``attention.causal_mask``: query t sits at key
    position t + S − T. With a causal mask this is the paper's bias; without one, the
    symmetric version. Add it to the scores (pass it as an additive float mask).
    """
    S = T if S is None else S
    if T < 0 or S < T:
        raise ValueError(f"need 0 <= T <= S (T queries are the last T of S keys), got T={T}, S={S}")
    query_pos = torch.arange(S - T, S)[:, None]
    key_pos = torch.arange(S)[None, :]
    minus_distance = -(query_pos - key_pos).abs()  # integers, so the diagonal is +0.0, not -0.0
    return alibi_slopes(n_heads)[:, None, None] * minus_distance.to(torch.get_default_dtype())
