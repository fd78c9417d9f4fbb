"""The GPT's fast path computes what the teaching modules compute: values and gradients.

The fast path is PyTorch's fused layer norm (``LayerNorm.fused``), one Q/K/V matmul
(``MultiHeadAttention.project_qkv``) and reshapes without einops; the teaching path is the
formula-by-formula ``LayerNorm.forward``, three projections and ``split_heads``/``merge_heads``.
"""

from __future__ import annotations

import pytest
import torch

from course_utils.attention import MultiHeadAttention, split_heads
from course_utils.blocks import LayerNorm, RMSNorm, TransformerBlock
from course_utils.gpt import GPT, GPTConfig

TOL = 2e-6


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("norm_cls", [LayerNorm, RMSNorm])
def test_fused_norm_equals_the_formula_in_value_and_gradient(norm_cls):
    torch.manual_seed(0)
    norm = norm_cls(24, eps=1e-3)
    with torch.no_grad():
        norm.gamma.uniform_(0.5, 1.5)
        if hasattr(norm, "beta"):
            norm.beta.normal_()
    x = (3 * torch.randn(2, 5, 24) + 1).requires_grad_()
    outs, grads = [], []
    for fn in (norm.forward, norm.fused):
        norm.zero_grad()
        x.grad = None
        y = fn(x)
        (y * torch.linspace(-1, 1, 24)).sum().backward()
        outs.append(y.detach())
        grads.append([x.grad.clone(), *_grads(norm).values()])
    assert max_err(*outs) <= TOL
    for g_formula, g_fused in zip(*grads, strict=True):
        assert max_err(g_formula, g_fused) <= 1e-5


@pytest.mark.parametrize("bias", [True, False])
def test_one_qkv_matmul_equals_three_projections(bias):
    torch.manual_seed(1)
    mha = MultiHeadAttention(32, 4, bias=bias)
    x = torch.randn(3, 7, 32)
    q, k, v = mha.project_qkv(x)
    for fused, layer in ((q, mha.W_Q), (k, mha.W_K), (v, mha.W_V)):
        assert fused.shape == (3, 4, 7, 8)
        assert max_err(fused, split_heads(layer(x), 4)) <= TOL


def test_one_qkv_matmul_with_other_head_widths():
    mha = MultiHeadAttention(12, 3, d_k=5, d_v=2)
    x = torch.randn(2, 4, 12)
    q, k, v = mha.project_qkv(x)
    assert max_err(v, split_heads(mha.W_V(x), 3)) <= TOL and v.shape == (2, 3, 4, 2)
    assert max_err(k, split_heads(mha.W_K(x), 3)) <= TOL and k.shape == (2, 3, 4, 5)


def test_fused_block_equals_the_teaching_block_in_value_and_gradient():
    torch.manual_seed(2)
    block = TransformerBlock(32, 4, activation="gelu_tanh", attn_impl="fused")
    x = torch.randn(2, 9, 32)
    results = []
    for impl in ("batched", "fused"):
        block.attn_impl = impl
        block.zero_grad()
        y = block(x, causal=True)
        y.pow(2).sum().backward()
        results.append((y.detach(), _grads(block)))
    (y_slow, g_slow), (y_fast, g_fast) = results
    assert max_err(y_slow, y_fast) <= 1e-5
    assert g_slow.keys() == g_fast.keys() and len(g_slow) == 16
    for name in g_slow:
        assert max_err(g_slow[name], g_fast[name]) <= 1e-4, name


def test_gpt_fast_path_equals_the_teaching_modules():
    """The whole model: logits and loss of the fast path against the same weights run slowly."""
    torch.manual_seed(3)
    model = GPT(GPTConfig(50, 16, 2, 4, 32))
    idx = torch.randint(50, (2, 16))
    logits_fast, loss_fast = model(idx, idx)
    x = model.token_embedding(idx) + model.position_embedding(16)
    for block in model.blocks:
        block.attn_impl = "batched"
        x = block(x, causal=True)
    logits_slow = torch.nn.functional.linear(model.final_norm(x), model.token_embedding.weight)
    assert max_err(logits_fast, logits_slow) <= 1e-5
    loss_slow = torch.nn.functional.cross_entropy(logits_slow.flatten(0, 1), idx.flatten())
    assert abs(loss_fast.item() - loss_slow.item()) <= 1e-6
