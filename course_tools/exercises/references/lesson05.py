"""Exercises of lesson 05: sinusoidal encodings, the rotation R(k), applying RoPE, the ALiBi bias;
five self-check questions and one experiment (where RoPE's score of two equal tokens first falls to
half as they move apart)."""

from __future__ import annotations

import torch

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.messages import N_, _
from course_utils.positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_rotation,
)


def _pe_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(4, 2), (10, 8), (50, 16)]
    return [Case(f"n_positions={n}, d={d}", (n, d)) for n, d in sizes]


def _pe_hint(case: Case, got, expected) -> str | None:
    n, d = case.args
    if close(got, expected.view(n, d // 2, 2).flip(-1).reshape(n, d)):
        return _("sin and cos are swapped: even features (2i) take sin, odd features (2i+1) take cos")
    if close(got, expected.view(n, d // 2, 2).transpose(1, 2).reshape(n, d)):
        return _("the right values in the wrong layout: interleave sin and cos (2i, 2i+1), do not concatenate halves")
    p = torch.arange(n, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float64) / d)  # i/d instead of 2i/d
    wrong = torch.stack([(p * w).sin(), (p * w).cos()], -1).reshape(n, d).float()
    if close(got, wrong):
        return _("the exponent is 2i/d, not i/d: ω_i = 10000^(−2i/d)")
    return None


@exercise(cases=_pe_cases, hints=[_pe_hint])
def sinusoidal_pe(n_positions: int, d: int) -> torch.Tensor:
    """-> (n_positions, d) float32: PE[p, 2i] = sin(ω_i p), PE[p, 2i+1] = cos(ω_i p), ω_i = 10000^(−2i/d)."""
    return sinusoidal_encoding(n_positions, d)


def _rotation_cases(gen: torch.Generator) -> list[Case]:
    return [Case("k=1, d=2", (1, 2)), Case("k=3, d=8", (3, 8)),
            Case(N_("k=random in 0..100, d=16"), (int(torch.randint(0, 101, (1,), generator=gen)), 16))]


def _rotation_hint(case: Case, got, expected) -> str | None:
    if close(got, expected.T):
        return _("R(k) is transposed (it turns backwards): block i is [[cos ω_i k, sin ω_i k], [−sin ω_i k, cos ω_i "
                 "k]]")
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
        cases.append(Case(N_("x (B={b}, H={h}, T={t}, d_head={d}), positions (T,)", b=b, h=h, t=t, d=d),
                          (x, positions)))
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
        return _("you rotate the wrong way: x_2i' = x_2i cos θ − x_2i+1 sin θ, x_2i+1' = x_2i sin θ + x_2i+1 cos θ")
    if x.shape[-1] > 2 and close(got, _rope_half_split(x, positions)):
        return _("you rotate the wrong pairs: pair feature 2i with 2i+1 (adjacent), not i with i + d/2")
    if close(got, _rope_swapped(x, positions)):
        return _("cos and sin are swapped: x_2i' = x_2i cos θ − x_2i+1 sin θ (cos on the feature itself)")
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
        return _("the sign is flipped: the bias is a penalty, −m_h·|i − j| ≤ 0, so far keys lose score")
    if close(got, expected.flip(0)):
        return _("the slopes are in reverse order: head h = 1..H gets m_h = 2^(−8h/H), the steepest first")
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        h, t = case.args
        signed = expected * torch.sign(torch.arange(t)[None, :] - torch.arange(t)[:, None]).float()
        if close(got, signed) or close(got, -signed):
            return _("use the distance |i − j| (always ≥ 0), not the signed offset")
    return None


@exercise(cases=_alibi_cases, hints=[_alibi_hint])
def alibi(n_heads: int, T: int) -> torch.Tensor:
    """-> (n_heads, T, T): bias[h, i, j] = −m_h · |i − j| with m_h = 2^(−8h/H), h = 1..H (H a power of 2)."""
    return alibi_bias(n_heads, T)


# --- self-check questions ------------------------------------------------------------------------

@question(explain=N_("each of the d/2 = 8 pairs contributes sin² + cos² = 1, whatever the position: 8."),
          hints=[known_wrong({
              16: N_("one feature squared is not 1 on its own: each of the 8 (sin, cos) pairs gives sin² + cos² = 1"),
              1: N_("the encoding is not normalised to length 1: each of the 8 pairs contributes 1"),
              2.8284: N_("√8 is the length; the dot product of PE(p) with itself is the squared length"),
              0: N_("PE(0) is not zero: the cosines are 1 at p = 0"),
          })])
def pe_norm_squared() -> float:
    """PE(p) · PE(p) for the sinusoidal encoding with d = 16, for any position p."""
    return float(sinusoidal_encoding(1, 16)[0].square().sum())


@question(explain=N_("ω_i = 10000^(−2i/d): going from pair i to pair i + 1 divides ω by 10000^(2/64) ≈ 1.334."),
          atol=0.01,
          hints=[known_wrong({
              3.16: N_("3.16 is the ratio for d = 16; with d = 64 the steps are smaller: 10000^(2/64)"),
              3.1623: N_("3.16 is the ratio for d = 16; with d = 64 the steps are smaller: 10000^(2/64)"),
              1.1548: N_("the exponent is 2i/d, so consecutive pairs differ by 10000^(2/d), not 10000^(1/d)"),
              0.7499: N_("that is ω_(i+1) / ω_i, the ratio the other way round; ω_i / ω_(i+1) is above 1"),
          })])
def frequency_ratio() -> float:
    """ω_i / ω_(i+1) for the sinusoidal encoding with d = 64."""
    omega = sinusoidal_frequencies(64)
    return float(omega[0] / omega[1])


@question(explain=N_("W_pos has one trained row of d_model = 768 numbers for each of N = 1024 positions: 1024 × 768 "
                     "= 786,432."),
          hints=[known_wrong({
              1024: N_("one row per position, but each row is a whole vector of d_model = 768 numbers"),
              768: N_("768 is one row; the table has one row for each of the 1024 positions"),
              0: N_("zero is the sinusoidal encoding; a learned table is trained, one number per entry"),
              1792: N_("the table is N × d (a product), not N + d"),
          })])
def learned_table_params() -> int:
    """The number of trained parameters of GPT-2's learned position table: max_len = 1024, d_model = 768."""
    return LearnedPositionalEmbedding(1024, 768).weight.numel()


@question(explain=N_("R_m q · R_n k = q · R_(n−m) k: the contents q, k and the offset n − m, never m or n alone."),
          hints=[known_wrong({
              "a": N_("the rotations of m and n combine into one rotation by n − m: the absolute positions drop out"),
              "c": N_("the rotation R_(n−m) stays in the score, so the distance matters too"),
              "d": N_("the rotation acts on q and k, so the score still depends on what the tokens are"),
          })])
def rope_depends_on() -> str:
    """Multiple choice: what RoPE's score of a query at m and a key at n depends on ."""
    return "b"


@question(explain=N_("m_h = 2^(−8h/H) with heads counted from 1: h = 3, H = 8 gives 2^(−3) = 0.125."), atol=1e-3,
          hints=[known_wrong({
              0.25: N_("heads are counted from 1: head 3 has m = 2^(−8·3/8) = 2^(−3), not 2^(−2)"),
              0.0625: N_("head 3 of 8 has exponent −8·3/8 = −3: 2^(−3)"),
              -0.125: N_("the slope m_h is positive; the minus sign is in the bias −m_h·|i − j|"),
              8: N_("the slope is a power of one half: 2^(−3), not 2^3"),
          })])
def alibi_slope() -> float:
    """ALiBi's slope of head 3 (heads counted 1..8) when H = 8."""
    return float(alibi_slopes(8)[2])


# --- experiment: find where a curve crosses ----------------------------------------------------

MAX_DISTANCE = 64


def _mean_same_content_scores(d_head: int = 64, n_vectors: int = 8_000) -> list[float]:
    """The score of a query at distance Δ = 0 … 64 from a key of the same random content, averaged."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n_vectors, 1, d_head, generator=gen).expand(n_vectors, MAX_DISTANCE + 1, d_head)
    rotated = apply_rope(x, list(range(MAX_DISTANCE + 1)))
    return (rotated * rotated[:, :1]).sum(-1).mean(0).tolist()


@question(explain=N_("for equal contents the score is Σ_i |x_pair i|² cos(ω_i Δ), on average 2·Σ_i cos(ω_i Δ): the "
                     "fast pairs turn out of phase first, and the average first falls below half of its value at Δ = "
                     "0 between Δ = 27 and 28, at about 27.9 (it rises above half again after 28)."),
          atol=0.2,
          hints=[known_wrong({
              27: N_("27 is the last distance still above half; the curve crosses between 27 and 28: interpolate"),
              4.42: N_("with ω_i = 10000^(−i/d) the frequencies are too high and the score falls too soon: the "
                       "exponent is 2i/d"),
              8.71: N_("that is the crossing for d_head = 16 (the lesson's d); the experiment uses d_head = 64"),
              64: N_("the curve comes back above half after Δ = 28: find where it first crosses, at every integer Δ"),
          })])
def rope_half_crossing() -> float:
    """Experiment: where RoPE's mean score between a query and a key of the same random content
    (d_head = 64, N(0, 1) entries) first falls below half of its value at distance 0, interpolated
    linearly between the two integer distances around the crossing."""
    scores = _mean_same_content_scores()
    half = scores[0] / 2
    after = next(k for k in range(1, MAX_DISTANCE + 1) if scores[k] < half)
    return after - 1 + (scores[after - 1] - half) / (scores[after - 1] - scores[after])
