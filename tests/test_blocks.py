"""Unit tests of course_utils.blocks: FeedForward, LayerNorm, RMSNorm and TransformerBlock."""

import math

import pytest
import torch

from course_utils.blocks import (
    FeedForward,
    LayerNorm,
    RMSNorm,
    block_parameter_count,
    feedforward_parameter_count,
)


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


# ---------------------------------------------------------------- FeedForward

@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_ffn_shapes_and_parameter_count(activation, bias):
    ffn = FeedForward(8, activation=activation, bias=bias)
    assert ffn.d_ff == 32
    assert ffn(torch.randn(2, 5, 8)).shape == (2, 5, 8)
    assert ffn.hidden(torch.randn(3, 8)).shape == (3, 32)
    assert n_params(ffn) == feedforward_parameter_count(8, activation=activation, bias=bias)
    assert hasattr(ffn, "W_gate") == (activation == "swiglu")


def test_ffn_parameter_formulas():
    d = 64
    assert feedforward_parameter_count(d) == 8 * d * d + 5 * d
    assert feedforward_parameter_count(d, activation="swiglu") == 12 * d * d + 9 * d
    assert feedforward_parameter_count(d, d_ff=100, bias=False) == 2 * d * 100
    # LLaMA's choice: SwiGLU with F = 8D/3 keeps the count of a 4D two-matrix MLP
    assert feedforward_parameter_count(96, d_ff=256, activation="swiglu", bias=False) == \
        feedforward_parameter_count(96, bias=False)


def test_gelu_ffn_hand_computed():
    """D = 2, F = 3, weights chosen by hand; GELU(z) = z Φ(z) with the normal CDF Φ."""
    ffn = FeedForward(2, d_ff=3, activation="gelu")
    with torch.no_grad():
        ffn.W_in.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        ffn.W_in.bias.copy_(torch.tensor([0.0, 0.5, 0.0]))
        ffn.W_out.weight.copy_(torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]]))
        ffn.W_out.bias.copy_(torch.tensor([0.1, 0.0]))
    x = torch.tensor([1.0, 2.0])
    z = [1.0, 2.5, -1.0]  # W_in x + b_in

    def gelu(v):
        return v * 0.5 * (1 + math.erf(v / math.sqrt(2)))

    h = [gelu(v) for v in z]
    expected = torch.tensor([h[0] + h[1] + h[2] + 0.1, 2 * h[0] - h[2]])
    torch.testing.assert_close(ffn(x), expected)
    # the numbers themselves, to catch a wrong GELU (Φ(1) = 0.8413...)
    assert math.isclose(h[0], 0.841345, abs_tol=1e-6)


def test_ffn_activations_match_torch():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    for name, fn in [("relu", torch.relu), ("gelu", torch.nn.functional.gelu),
                     ("gelu_tanh", lambda z: torch.nn.functional.gelu(z, approximate="tanh"))]:
        ffn = FeedForward(6, activation=name)
        torch.testing.assert_close(ffn(x), ffn.W_out(fn(ffn.W_in(x))))
    ffn = FeedForward(6, d_ff=10, activation="swiglu")
    gate = torch.nn.functional.silu(ffn.W_gate(x))
    torch.testing.assert_close(ffn(x), ffn.W_out(gate * ffn.W_in(x)))


def test_ffn_is_position_wise():
    torch.manual_seed(0)
    ffn = FeedForward(8, activation="relu")
    x = torch.randn(2, 7, 8)
    perm = torch.randperm(7)
    torch.testing.assert_close(ffn(x[:, perm]), ffn(x)[:, perm])
    torch.testing.assert_close(ffn(x[:, 3]), ffn(x)[:, 3])


def test_ffn_errors():
    with pytest.raises(ValueError, match="relu, gelu, gelu_tanh, swiglu"):
        FeedForward(8, activation="tanh")
    with pytest.raises(ValueError, match="positive"):
        FeedForward(0)
    with pytest.raises(ValueError, match="d_model=8"):
        FeedForward(8)(torch.randn(2, 6))


# ---------------------------------------------------------------- norms

@pytest.mark.parametrize("eps", [1e-5, 1e-2])
def test_layernorm_matches_torch(eps):
    torch.manual_seed(0)
    ours, ref = LayerNorm(10, eps=eps), torch.nn.LayerNorm(10, eps=eps)
    with torch.no_grad():
        for p in (ours.gamma, ours.beta):
            p.copy_(torch.randn(10))
        ref.weight.copy_(ours.gamma)
        ref.bias.copy_(ours.beta)
    x = torch.randn(3, 4, 10) * 5 + 2
    torch.testing.assert_close(ours(x), ref(x))
    # the gradients too
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours(x1).pow(2).sum().backward()
    ref(x2).pow(2).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ours.gamma.grad, ref.weight.grad)


def test_layernorm_standardises_each_token():
    x = torch.randn(5, 16) * 3 + 7
    y = LayerNorm(16)(x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(5), atol=1e-3, rtol=0)


def test_layernorm_eps_inside_root():
    # a constant token has σ² = 0: the output is 0 and the scale is 1/√ε, not 1/(0 + ε)
    x = torch.tensor([[3.0, 3.0, 3.0, 3.0 + 1e-3]])
    ln = LayerNorm(4, eps=1e-2)
    mu = x.mean()
    var = ((x - mu) ** 2).mean()
    torch.testing.assert_close(ln(x), (x - mu) / torch.sqrt(var + 1e-2))


@pytest.mark.parametrize("eps", [1e-6, 1e-3])
def test_rmsnorm_matches_torch(eps):
    torch.manual_seed(0)
    ours, ref = RMSNorm(12, eps=eps), torch.nn.RMSNorm(12, eps=eps)
    with torch.no_grad():
        ours.gamma.copy_(torch.randn(12))
        ref.weight.copy_(ours.gamma)
    x = torch.randn(2, 3, 12) * 4 + 1
    torch.testing.assert_close(ours(x), ref(x))


def test_norm_parameters_and_errors():
    assert [n for n, _ in LayerNorm(6).named_parameters()] == ["gamma", "beta"]
    assert [n for n, _ in RMSNorm(6).named_parameters()] == ["gamma"]
    assert LayerNorm(6).eps == 1e-5 and RMSNorm(6).eps == 1e-6
    with pytest.raises(ValueError, match="last axis"):
        LayerNorm(6)(torch.randn(6, 4))
    with pytest.raises(ValueError, match="RMSNorm\\(4\\)"):
        RMSNorm(6)(torch.randn(6, 4))
    with pytest.raises(ValueError, match="d > 0"):
        LayerNorm(0)


def test_block_parameter_formula():
    for d in (8, 64, 768):
        assert block_parameter_count(d) == 12 * d * d + 13 * d
    assert block_parameter_count(768) == 7_087_872
