"""Exercises of lesson 05: sinusoidal encodings, the rotation R(k), applying RoPE, the ALiBi bias."""

from __future__ import annotations

import torch

from course_tools.checks import Case, exercise
from course_tools.references._shared import close
from course_utils.positional import alibi_bias, apply_rope, sinusoidal_encoding, sinusoidal_rotation


def _pe_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(4, 2), (10, 8), (50, 16)]
    return [Case(f"n_positions={n}, d={d}", (n, d)) for n, d in sizes]


def _pe_hint(case: Case, got, expected) -> str | None:
    n, d = case.args
    if close(got, expected.view(n, d // 2, 2).flip(-1).reshape(n, d)):
        return "sin and cos are swapped: even features (2i) take sin, odd features (2i+1) take cos"
    if close(got, expected.view(n, d // 2, 2).transpose(1, 2).reshape(n, d)):
        return "the right values in the wrong layout: interleave sin and cos (2i, 2i+1), do not concatenate halves"
    p = torch.arange(n, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)  # i/d instead of 2i/d
    wrong = torch.stack([(p * w).sin(), (p * w).cos()], -1).reshape(n, d).float()
    if close(got, wrong):
        return "the exponent is 2i/d, not i/d: ω_i = 10000^(−2i/d)"
    return None


@exercise(cases=_pe_cases, hints=[_pe_hint])
def sinusoidal_pe(n_positions: int, d: int) -> torch.Tensor:
    """-> (n_positions, d) float32: PE[p, 2i] = sin(ω_i p), PE[p, 2i+1] = cos(ω_i p), ω_i = 10000^(−2i/d)."""
    return sinusoidal_encoding(n_positions, d)


def _rotation_cases(gen: torch.Generator) -> list[Case]:
    return [Case("k=1, d=2", (1, 2)), Case("k=3, d=8", (3, 8)),
            Case("k=random in 0..100, d=16", (int(torch.randint(0, 101, (1,), generator=gen)), 16))]


def _rotation_hint(case: Case, got, expected) -> str | None:
    if close(got, expected.T):
        return "R(k) is transposed (it turns backwards): block i is [[cos ω_i k, sin ω_i k], [−sin ω_i k, cos ω_i k]]"
    return None


@exercise(cases=_rotation_cases, hints=[_rotation_hint])
def pe_rotation(k: int, d: int) -> torch.Tensor:
    """-> (d, d): the block-diagonal rotation with PE(p + k) = R(k) @ PE(p) for every position p."""
    return sinusoidal_rotation(k, d)


def _rope_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, h, t, d in [(1, 1, 3, 2), (2, 2, 5, 8), (1, 4, 7, 16)]:
        x = torch.randn(b, h, t, d, generator=gen)
        positions = torch.randint(0, 64, (t,), generator=gen)
        cases.append(Case(f"x (B={b}, H={h}, T={t}, d_head={d}), positions (T,)", (x, positions)))
    return cases


def _rope_half_split(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The same rotations applied to the pairs (x_i, x_{i+d/2}) instead of (x_2i, x_2i+1)."""
    d = x.shape[-1]
    order = torch.stack([torch.arange(d // 2), torch.arange(d // 2, d)], -1).flatten()
    return apply_rope(x[..., order], positions)[..., order.argsort()]


def _rope_swapped(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """cos and sin exchanged in the 2×2 rotation."""
    d = x.shape[-1]
    angle = positions.float()[:, None] * 10000.0 ** (-torch.arange(0, d, 2).float() / d)
    cos, sin = angle.cos(), angle.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * sin - odd * cos, even * cos + odd * sin], -1).flatten(-2)


def _rope_hint(case: Case, got, expected) -> str | None:
    x, positions = case.args
    if close(got, apply_rope(x, -positions)):
        return "you rotate the wrong way: x_2i' = x_2i cos θ − x_2i+1 sin θ, x_2i+1' = x_2i sin θ + x_2i+1 cos θ"
    if x.shape[-1] > 2 and close(got, _rope_half_split(x, positions)):
        return "you rotate the wrong pairs: pair feature 2i with 2i+1 (adjacent), not i with i + d/2"
    if close(got, _rope_swapped(x, positions)):
        return "cos and sin are swapped: x_2i' = x_2i cos θ − x_2i+1 sin θ (cos on the feature itself)"
    return None


@exercise(cases=_rope_cases, hints=[_rope_hint], atol=1e-4)
def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """x (..., T, d) with d even, positions (T,) -> (..., T, d): rotate each pair (x_2i, x_2i+1) of
    token t by the angle θ = ω_i · positions[t], ω_i = 10000^(−2i/d)."""
    return apply_rope(x, positions)


def _alibi_cases(gen: torch.Generator) -> list[Case]:
    return [Case("n_heads=1, T=3", (1, 3)), Case("n_heads=4, T=5", (4, 5)), Case("n_heads=8, T=6", (8, 6))]


def _alibi_hint(case: Case, got, expected) -> str | None:
    if close(got, -expected):
        return "the sign is flipped: the bias is a penalty, −m_h·|i − j| ≤ 0, so far keys lose score"
    if close(got, expected.flip(0)):
        return "the slopes are in reverse order: head h = 1..H gets m_h = 2^(−8h/H), the steepest first"
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        h, t = case.args
        signed = expected * torch.sign(torch.arange(t)[None, :] - torch.arange(t)[:, None]).float()
        if close(got, signed) or close(got, -signed):
            return "use the distance |i − j| (always ≥ 0), not the signed offset"
    return None


@exercise(cases=_alibi_cases, hints=[_alibi_hint])
def alibi(n_heads: int, T: int) -> torch.Tensor:
    """-> (n_heads, T, T): bias[h, i, j] = −m_h · |i − j| with m_h = 2^(−8h/H), h = 1..H (H a power of 2)."""
    return alibi_bias(n_heads, T)
