"""Unit tests of course_utils.positional: learned, sinusoidal, RoPE and ALiBi."""

import math

import pytest
import torch

from course_utils.positional import (
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_rotation,
)


def test_learned_rows_equal_one_hot_times_table():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(max_len=10, d_model=5)
    assert emb.weight.shape == (10, 5) and emb.weight.requires_grad
    one_hot = torch.nn.functional.one_hot(torch.arange(2, 6), 10).float()
    torch.testing.assert_close(emb(4, offset=2), one_hot @ emb.weight)
    assert emb(0).shape == (0, 5)
    assert emb(10).shape == (10, 5)


def test_learned_past_max_len_names_n():
    emb = LearnedPositionalEmbedding(max_len=8, d_model=4)
    with pytest.raises(ValueError, match="N=8"):
        emb(9)
    with pytest.raises(ValueError, match="N=8"):
        emb(3, offset=6)
    with pytest.raises(ValueError, match="non-negative"):
        emb(-1)
    with pytest.raises(ValueError, match="positive"):
        LearnedPositionalEmbedding(0, 4)


def test_learned_receives_gradients():
    emb = LearnedPositionalEmbedding(max_len=6, d_model=3)
    emb(4).sum().backward()
    assert torch.equal(emb.weight.grad[:4], torch.ones(4, 3))
    assert torch.equal(emb.weight.grad[4:], torch.zeros(2, 3))


def test_sinusoidal_matches_formula():
    n, d = 12, 16
    pe = sinusoidal_encoding(n, d)
    assert pe.shape == (n, d) and pe.dtype == torch.get_default_dtype()
    for p in range(n):
        for i in range(d // 2):
            w = 10000 ** (-2 * i / d)
            assert math.isclose(pe[p, 2 * i].item(), math.sin(w * p), abs_tol=1e-6)
            assert math.isclose(pe[p, 2 * i + 1].item(), math.cos(w * p), abs_tol=1e-6)
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * (d // 2)))


def test_sinusoidal_other_base_and_errors():
    pe = sinusoidal_encoding(5, 4, base=100.0)
    assert math.isclose(pe[3, 2].item(), math.sin(3 / 10), abs_tol=1e-6)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(5, 7)
    with pytest.raises(ValueError, match="non-negative"):
        sinusoidal_encoding(-1, 4)


def test_frequency_ratio_is_constant():
    w = sinusoidal_frequencies(16)
    ratios = w[:-1] / w[1:]
    torch.testing.assert_close(ratios, torch.full_like(ratios, 10000 ** (2 / 16)))
    assert round(ratios[0].item(), 2) == 3.16


@pytest.mark.parametrize("k", [0, 1, 7, 40])
def test_rotation_identity(k):
    d = 16
    pe = sinusoidal_encoding(100, d).double()
    R = sinusoidal_rotation(k, d).double()
    torch.testing.assert_close(pe[k:], pe[: 100 - k] @ R.T, atol=1e-6, rtol=0)
    torch.testing.assert_close(R @ R.T, torch.eye(d, dtype=torch.float64), atol=1e-6, rtol=0)


def test_dot_product_depends_on_distance_only():
    d, n = 16, 64
    pe = sinusoidal_encoding(n, d).double()
    gram = pe @ pe.T
    p = torch.arange(n)
    w = sinusoidal_frequencies(d)
    expected = torch.cos((p[:, None, None] - p[None, :, None]) * w).sum(-1)
    torch.testing.assert_close(gram, expected, atol=1e-5, rtol=0)


def _rope_reference(x, positions, base=10000.0):
    """Per-pair 2×2 rotation matrices, written out slowly."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for t, p in enumerate(positions.tolist()):
        for i in range(d // 2):
            a = p * base ** (-2 * i / d)
            rot = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=x.dtype)
            out[..., t, 2 * i:2 * i + 2] = x[..., t, 2 * i:2 * i + 2] @ rot.T
    return out


@pytest.mark.parametrize("d", [2, 6, 8])
def test_rope_matches_reference(d):
    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 3, 5, d, generator=g)
    pos = torch.tensor([0, 1, 4, 9, 30])
    torch.testing.assert_close(apply_rope(x, pos), _rope_reference(x, pos), atol=1e-5, rtol=1e-5)
    assert torch.equal(apply_rope(x, torch.zeros(5, dtype=torch.long)), x)


def test_rope_preserves_norm_and_dtype():
    x = torch.randn(4, 7, 10, dtype=torch.float64)
    y = apply_rope(x, list(range(7)))
    assert y.dtype == torch.float64 and y.shape == x.shape
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_rope_score_depends_on_offset_only():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 12, generator=g), torch.randn(1, 12, generator=g)

    def score(p, r):
        return (apply_rope(q, [p]) * apply_rope(k, [r])).sum().item()

    for p, r in [(5, 2), (50, 47), (1000, 997)]:
        assert math.isclose(score(p, r), score(3, 0), abs_tol=1e-3)
    assert not math.isclose(score(5, 2), score(5, 3), abs_tol=1e-3)


def test_rope_batch_positions_broadcast():
    x = torch.randn(2, 4, 8)
    pos = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 13]])
    y = apply_rope(x, pos)
    torch.testing.assert_close(y[1], apply_rope(x[1], pos[1]))


def test_rope_errors():
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.randn(3, 5), [0, 1, 2])
    with pytest.raises(ValueError, match="one entry per token"):
        apply_rope(torch.randn(3, 4), [0, 1])
    with pytest.raises(TypeError, match="booleans"):
        apply_rope(torch.randn(2, 4), torch.tensor([True, False]))


def test_alibi_slopes():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(h) for h in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * h) for h in range(1, 5)]))
    # 6 heads: the 4 slopes of H=4, then the odd-numbered slopes of H=8
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]))
    with pytest.raises(ValueError, match="positive"):
        alibi_slopes(0)


def test_alibi_bias_values():
    b = alibi_bias(4, 5)
    assert b.shape == (4, 5, 5)
    m = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert math.isclose(b[h, i, j].item(), -m[h].item() * abs(i - j), rel_tol=1e-6)
    assert torch.equal(b.diagonal(dim1=-2, dim2=-1), torch.zeros(4, 5))


def test_alibi_bias_bottom_right_alignment():
    b = alibi_bias(2, 2, 5)
    assert b.shape == (2, 2, 5)
    torch.testing.assert_close(b, alibi_bias(2, 5)[:, 3:, :])
    with pytest.raises(ValueError, match="T <= S"):
        alibi_bias(2, 5, 3)


# ---------------------------------------------------------------- lesson 05 exercises: references pass, hints fire

def test_sinusoidal_pe_hints(run_exercise):
    def swapped(n, d):
        return sinusoidal_encoding(n, d).view(n, d // 2, 2).flip(-1).reshape(n, d)

    def halves(n, d):
        pe = sinusoidal_encoding(n, d)
        return torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)

    def i_over_d(n, d):
        angle = torch.arange(n)[:, None] * 10000.0 ** (-torch.arange(d // 2) / d)
        return torch.stack([angle.sin(), angle.cos()], -1).reshape(n, d)

    assert "sin and cos are swapped" in run_exercise("sinusoidal_pe", swapped).report()
    assert "concatenate halves" in run_exercise("sinusoidal_pe", halves).report()
    assert "2i/d" in run_exercise("sinusoidal_pe", i_over_d).report()


def test_pe_rotation_hint(run_exercise):
    assert "transposed" in run_exercise("pe_rotation", lambda k, d: sinusoidal_rotation(k, d).T).report()


def test_rope_hints(run_exercise):
    def half_split(x, pos):  # LLaMA-style pairing, a different convention from ours
        d = x.shape[-1]
        angle = pos[:, None].float() * 10000.0 ** (-torch.arange(0, d, 2).float() / d)
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
        rotated_half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + rotated_half * sin

    def swapped(x, pos):
        d = x.shape[-1]
        angle = pos[:, None].float() * 10000.0 ** (-torch.arange(0, d, 2).float() / d)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * angle.sin() - odd * angle.cos(), even * angle.cos() + odd * angle.sin()],
                           -1).flatten(-2)

    assert "wrong pairs" in run_exercise("rope", half_split).report()
    assert "wrong way" in run_exercise("rope", lambda x, pos: apply_rope(x, -pos)).report()
    assert "cos and sin are swapped" in run_exercise("rope", swapped).report()


def test_alibi_hints(run_exercise):
    assert "sign is flipped" in run_exercise("alibi", lambda h, t: -alibi_bias(h, t)).report()
    assert "reverse order" in run_exercise("alibi", lambda h, t: alibi_bias(h, t).flip(0)).report()

    def signed(h, t):
        offset = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).float()
        return alibi_slopes(h)[:, None, None] * offset

    assert "|i − j|" in run_exercise("alibi", signed).report()


def test_rope_fractional_positions_interpolate():
    """Position interpolation feeds fractional positions; p = 2.5 lies between the rotations of 2 and 3."""
    x = torch.randn(1, 8, dtype=torch.float64)
    quarter = torch.tensor([1.25], dtype=torch.float64)
    halfway = apply_rope(x, 2 * quarter)
    twice = apply_rope(apply_rope(x, quarter), quarter)
    torch.testing.assert_close(halfway, twice)
    torch.testing.assert_close(apply_rope(apply_rope(x, [2]), [3]), apply_rope(x, [5]))
