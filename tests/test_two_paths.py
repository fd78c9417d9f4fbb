"""The GPT's two ways of computing attention give the same model: values and gradients.

``GPTConfig(sdpa=True)`` runs PyTorch's ``F.scaled_dot_product_attention``; ``sdpa=False`` the
explicit softmax(q kᵀ/√d) v of lesson 02. The norms call PyTorch's ``F.layer_norm`` /
``F.rms_norm``, which must equal the formulas ``blocks.layer_norm`` / ``blocks.rms_norm``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from course_utils.blocks import LayerNorm, RMSNorm, layer_norm, rms_norm
from course_utils.gpt import GPT, GPTConfig

TOL = 2e-6


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("norm_cls", [LayerNorm, RMSNorm])
def test_norm_module_equals_the_formula_in_value_and_gradient(norm_cls):
    torch.manual_seed(0)
    norm = norm_cls(24, eps=1e-3)
    with torch.no_grad():
        norm.gamma.uniform_(0.5, 1.5)
        if hasattr(norm, "beta"):
            norm.beta.normal_()
    formula = ((lambda x: layer_norm(x, norm.gamma, norm.beta, norm.eps)) if norm_cls is LayerNorm
               else (lambda x: rms_norm(x, norm.gamma, norm.eps)))
    x = (3 * torch.randn(2, 5, 24) + 1).requires_grad_()
    outs, grads = [], []
    for fn in (norm, formula):
        norm.zero_grad()
        x.grad = None
        y = fn(x)
        (y * torch.linspace(-1, 1, 24)).sum().backward()
        outs.append(y.detach())
        grads.append([x.grad.clone(), *_grads(norm).values()])
    torch.testing.assert_close(*outs, atol=TOL, rtol=0)
    for g_module, g_formula in zip(*grads, strict=True):
        torch.testing.assert_close(g_module, g_formula, atol=1e-5, rtol=0)


@pytest.mark.parametrize("components", [
    {}, dict(norm="rmsnorm", position="rope", activation="swiglu", n_kv_heads=2, bias=False, tie_embeddings=False),
    dict(position="alibi"), dict(position="sinusoidal", residual=False)], ids=str)
def test_sdpa_and_the_explicit_softmax_train_the_same_model(components):
    torch.manual_seed(3)
    config = GPTConfig(50, 16, 2, 4, 32, **components)
    fast = GPT(config)
    slow = GPT(dataclasses.replace(config, sdpa=False))
    slow.load_state_dict(fast.state_dict())
    idx = torch.randint(50, (2, 16))
    results = []
    for model in (fast, slow):
        logits, loss = model(idx, idx)
        loss.backward()
        results.append((logits.detach(), loss.item(), _grads(model)))
    (l_fast, loss_fast, g_fast), (l_slow, loss_slow, g_slow) = results
    torch.testing.assert_close(l_fast, l_slow, atol=1e-5, rtol=0)
    assert abs(loss_fast - loss_slow) <= 1e-6
    assert g_fast.keys() == g_slow.keys() and len(g_fast) == len(list(fast.parameters()))
    for name in g_fast:
        torch.testing.assert_close(g_fast[name], g_slow[name], atol=1e-5, rtol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_the_path_is_chosen_in_the_config_and_reaches_every_block():
    assert all(b.attn.sdpa for b in GPT(GPTConfig(20, 8, 3, 2, 16)).blocks)
    assert not any(b.attn.sdpa for b in GPT(GPTConfig(20, 8, 3, 2, 16, sdpa=False)).blocks)
