"""Unit tests of course_utils.blocks: FeedForward, LayerNorm, RMSNorm, TransformerBlock and make_block."""

import math

import pytest
import torch

from course_utils.attention import MultiHeadAttention
from course_utils.blocks import (
    FeedForward,
    LayerNorm,
    RMSNorm,
    TransformerBlock,
    layer_norm,
    make_block,
    make_norm,
    rms_norm,
)
from course_utils.counting import block_parameter_count, feedforward_parameter_count


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


# ---------------------------------------------------------------- TransformerBlock

def test_block_parameter_count_gpt2_layout():
    for d, h in [(16, 2), (48, 4), (64, 8)]:
        block = make_block(d, h)
        assert n_params(block) == 12 * d * d + 13 * d == block_parameter_count(d)
    assert n_params(make_block(16, 2, activation="swiglu", bias=False)) == \
        block_parameter_count(16, activation="swiglu", bias=False)


def test_block_submodules():
    block = make_block(16, 4, norm_first=False, eps=1e-6, activation="relu")
    assert isinstance(block.norm1, LayerNorm) and block.norm1.eps == 1e-6
    assert isinstance(block.ffn, FeedForward) and block.ffn.activation == "relu"
    assert block.attn.n_heads == 4


def _torch_layer(block: TransformerBlock, norm_first: bool) -> torch.nn.TransformerEncoderLayer:
    d = block.norm1.d
    ref = torch.nn.TransformerEncoderLayer(d, block.attn.n_heads, dim_feedforward=block.ffn.d_ff, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=norm_first)
    a = block.attn
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([a.W_Q.weight, a.W_K.weight, a.W_V.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([a.W_Q.bias, a.W_K.bias, a.W_V.bias]))
        ref.self_attn.out_proj.weight.copy_(a.W_O.weight)
        ref.self_attn.out_proj.bias.copy_(a.W_O.bias)
        ref.linear1.weight.copy_(block.ffn.W_in.weight)
        ref.linear1.bias.copy_(block.ffn.W_in.bias)
        ref.linear2.weight.copy_(block.ffn.W_out.weight)
        ref.linear2.bias.copy_(block.ffn.W_out.bias)
        for ours, theirs in [(block.norm1, ref.norm1), (block.norm2, ref.norm2)]:
            theirs.weight.copy_(ours.gamma)
            theirs.bias.copy_(ours.beta)
    return ref.eval()


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_matches_torch_encoder_layer(norm_first):
    torch.manual_seed(0)
    block = make_block(32, 4, norm_first=norm_first).eval()
    with torch.no_grad():  # non-trivial γ, β so the norms are really compared
        for norm in (block.norm1, block.norm2):
            norm.gamma.add_(0.3 * torch.randn(32))
            norm.beta.add_(0.3 * torch.randn(32))
    ref = _torch_layer(block, norm_first)
    x = torch.randn(3, 7, 32)
    with torch.no_grad():
        torch.testing.assert_close(block(x), ref(x), atol=1e-5, rtol=1e-5)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(7)
        torch.testing.assert_close(block(x, causal=True), ref(x, src_mask=causal, is_causal=True),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_first", [True, False])
def test_block_order_of_operations(norm_first):
    torch.manual_seed(1)
    block = make_block(16, 2, norm_first=norm_first)
    x = torch.randn(2, 5, 16)
    if norm_first:
        h = x + block.attn(block.norm1(x))
        expected = h + block.ffn(block.norm2(h))
    else:
        h = block.norm1(x + block.attn(x))
        expected = block.norm2(h + block.ffn(h))
    torch.testing.assert_close(block(x), expected)


def test_block_causal_and_padding_masks():
    torch.manual_seed(2)
    block = make_block(16, 4)
    x = torch.randn(1, 6, 16)
    y = block(x, causal=True)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16)  # change only the future
    torch.testing.assert_close(block(x2, causal=True)[:, :4], y[:, :4])
    keep = torch.tensor([[True] * 4 + [False] * 2])[:, None, None, :]  # (B, 1, 1, S): last 2 are padding
    torch.testing.assert_close(block(x2, mask=keep)[:, :4], block(x, mask=keep)[:, :4])


# ---------------------------------------------------------------- lesson 04 exercises: references pass, hints fire

def test_layer_norm_hints(run_exercise):
    def eps_outside(x, g, b, eps):
        return g * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, unbiased=False) + eps) + b

    def wrong_axis(x, g, b, eps):
        mu, var = x.mean(1, keepdim=True), x.var(1, keepdim=True, unbiased=False)
        return g * (x - mu) / torch.sqrt(var + eps) + b

    def unbiased(x, g, b, eps):
        mu, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True)
        return g * (x - mu) / torch.sqrt(var + eps) + b

    assert "ε is outside the square root" in run_exercise("layer_norm", eps_outside).report()
    assert "time axis T" in run_exercise("layer_norm", wrong_axis).report()
    assert "unbiased" in run_exercise("layer_norm", unbiased).report()
    result = run_exercise("layer_norm", lambda x, g, b, eps: torch.nn.functional.layer_norm(x, x.shape[-1:], g, b, eps))
    assert result.status == "pass"


def test_rms_norm_hints(run_exercise):
    def eps_outside(x, g, eps):
        return g * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps)

    def subtracts_mean(x, g, eps):
        x = x - x.mean(-1, keepdim=True)
        return g * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    assert "ε is outside the square root" in run_exercise("rms_norm", eps_outside).report()
    assert "does not subtract the mean" in run_exercise("rms_norm", subtracts_mean).report()
    assert "square root" in run_exercise("rms_norm",
                                         lambda x, g, eps: g * x / (x.pow(2).mean(-1, keepdim=True) + eps)).report()


def test_ffn_and_sublayer_hints(run_exercise):
    assert "ReLU is missing" in run_exercise("relu_ffn", lambda x, wi, bi, wo, bo: (x @ wi + bi) @ wo + bo).report()

    def ln(x, g, b):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], g, b, 1e-5)

    def post(x, g, b, wi, wo):
        return ln(x + torch.relu(x @ wi) @ wo, g, b)

    def no_residual(x, g, b, wi, wo):
        return torch.relu(ln(x, g, b) @ wi) @ wo

    def normalised_stream(x, g, b, wi, wo):
        h = ln(x, g, b)
        return h + torch.relu(h @ wi) @ wo

    assert "post-LN" in run_exercise("pre_ln_sublayer", post).report()
    assert "residual connection is missing" in run_exercise("pre_ln_sublayer", no_residual).report()
    assert "never normalised" in run_exercise("pre_ln_sublayer", normalised_stream).report()


def test_block_parameters_hints(run_exercise):
    no_norms = lambda d, f: 4 * d * d + 4 * d + 2 * d * f + f + d
    assert "LayerNorms are missing" in run_exercise("block_parameters", no_norms).report()
    assert "biases are missing" in run_exercise("block_parameters", lambda d, f: 4 * d * d + 2 * d * f + 4 * d).report()
    assert "d_ff = 4d" in run_exercise("block_parameters", lambda d, f: 12 * d * d + 13 * d).report()


def test_block_dropout_only_in_training():
    torch.manual_seed(3)
    block = make_block(16, 2, dropout=0.5)
    x = torch.randn(2, 5, 16)
    block.train()
    assert not torch.allclose(block(x), block(x))
    block.eval()
    torch.testing.assert_close(block(x), block(x))
    assert n_params(block) == block_parameter_count(16)


@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 16)])
def test_the_norm_modules_compute_the_derived_formulas(shape):
    torch.manual_seed(4)
    x = torch.randn(*shape) * 3 + 1
    ln, rms = LayerNorm(16, eps=1e-5), RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ln.gamma.copy_(torch.randn(16))
        ln.beta.copy_(torch.randn(16))
        rms.gamma.copy_(torch.randn(16))
    torch.testing.assert_close(ln(x), layer_norm(x, ln.gamma, ln.beta, 1e-5))
    torch.testing.assert_close(rms(x), rms_norm(x, rms.gamma, 1e-6))


def test_make_norm_names_the_kinds():
    assert isinstance(make_norm("layernorm", 8), LayerNorm) and isinstance(make_norm("rmsnorm", 8), RMSNorm)
    assert isinstance(make_norm("none", 8), torch.nn.Identity)
    with pytest.raises(ValueError, match="norm='batchnorm' is not known; use one of layernorm, rmsnorm, none"):
        make_norm("batchnorm", 8)


def test_block_from_parts_attention_only_and_without_residual():
    torch.manual_seed(5)
    attn, norm = MultiHeadAttention(16, 2).eval(), LayerNorm(16)
    x = torch.randn(2, 5, 16)
    alone = TransformerBlock(attn, None, norm, None)
    torch.testing.assert_close(alone(x, causal=True), x + attn(norm(x), causal=True))
    no_residual = TransformerBlock(attn, None, norm, None, residual=False)
    torch.testing.assert_close(no_residual(x), attn(norm(x)))
    post = TransformerBlock(attn, None, norm, None, norm_first=False, residual=False)
    torch.testing.assert_close(post(x), norm(attn(x)))
    with pytest.raises(ValueError, match="give the feed-forward network and its norm together"):
        TransformerBlock(attn, FeedForward(16), norm, None)
