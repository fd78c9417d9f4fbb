"""Exercises of lesson 04: LayerNorm, RMSNorm, the ReLU feed-forward network, a pre-LN residual
sublayer, and counting a block's parameters."""

from __future__ import annotations

import torch

from course_tools.checks import Case, exercise
from course_tools.references._shared import close
from course_utils import blocks
from course_utils.blocks import block_parameter_count

SHAPES = [(1, 1, 4), (2, 3, 8), (3, 5, 16)]
EPS = [1e-5, 1e-2, 0.5]  # a large ε makes "ε outside the root" visible



def _ln(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float, dim: int = -1,
        eps_outside: bool = False, unbiased: bool = False) -> torch.Tensor:
    """LayerNorm's usual mistakes (ε outside the root, the wrong axis, the unbiased variance), for the hints."""
    mu = x.mean(dim=dim, keepdim=True)
    var = x.var(dim=dim, keepdim=True, unbiased=unbiased)
    scale = torch.sqrt(var) + eps if eps_outside else torch.sqrt(var + eps)
    return gamma * (x - mu) / scale + beta


def _norm_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for (b, t, d), eps in zip(SHAPES, EPS, strict=True):
        x = torch.randn(b, t, d, generator=gen) * 3 + 1
        gamma = 1 + 0.5 * torch.randn(d, generator=gen)
        beta = 0.5 * torch.randn(d, generator=gen)
        cases.append(Case(f"x (B={b}, T={t}, D={d}), eps={eps:g}", (x, gamma, beta, eps)))
    return cases


def _ln_hint(case: Case, got, expected) -> str | None:
    x, gamma, beta, eps = case.args
    if close(got, _ln(x, gamma, beta, eps, eps_outside=True)):
        return "ε is outside the square root: divide by √(σ² + ε), not √σ² + ε"
    if close(got, _ln(x, gamma, beta, eps, dim=1)):
        return "you normalised over the time axis T; LayerNorm normalises each token over its D features (dim=-1)"
    if x.shape[0] > 1 and close(got, _ln(x, gamma, beta, eps, dim=0)):
        return "you normalised over the batch axis (that is BatchNorm); normalise over the last axis D"
    if close(got, _ln(x, gamma, beta, eps, unbiased=True)):
        return "that is the unbiased variance (divide by D − 1); LayerNorm divides by D (unbiased=False)"
    if close(got, blocks.layer_norm(x, torch.ones_like(gamma), torch.zeros_like(beta), eps)):
        return "the standardisation is right; now scale by γ and shift by β"
    if close(got, (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)
                                                               + eps) * gamma):
        return "β is missing: add the shift after scaling by γ"
    return None


@exercise(cases=_norm_cases, hints=[_ln_hint])
def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """x (B, T, D), gamma (D,), beta (D,) -> (B, T, D): γ (x − μ) / √(σ² + ε) + β per token."""
    return blocks.layer_norm(x, gamma, beta, eps)


def _rms_cases(gen: torch.Generator) -> list[Case]:
    return [Case(c.label, (c.args[0], c.args[1], c.args[3])) for c in _norm_cases(gen)]


def _rms_hint(case: Case, got, expected) -> str | None:
    x, gamma, eps = case.args
    ms = x.pow(2).mean(-1, keepdim=True)
    if close(got, gamma * x / (torch.sqrt(ms) + eps)):
        return "ε is outside the square root: divide by √(mean(x²) + ε)"
    if close(got, gamma * x / (ms + eps)):
        return "you divided by the mean square; divide by its square root (the root mean square)"
    if close(got, blocks.rms_norm(x - x.mean(-1, keepdim=True), gamma, eps)):
        return "RMSNorm does not subtract the mean (that is LayerNorm); divide x itself by its RMS"
    if close(got, gamma * x / torch.sqrt(x.pow(2).mean(1, keepdim=True) + eps)):
        return "you took the mean over the time axis T; RMSNorm averages each token's D features (dim=-1)"
    if close(got, blocks.rms_norm(x, torch.ones_like(gamma), eps)):
        return "the normalisation is right; now multiply by γ"
    return None


@exercise(cases=_rms_cases, hints=[_rms_hint])
def rms_norm(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
    """x (B, T, D), gamma (D,) -> (B, T, D): γ x / √(mean_j x_j² + ε) per token."""
    return blocks.rms_norm(x, gamma, eps)


def _ffn_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for b, t, d in SHAPES:
        f = 4 * d
        x = torch.randn(b, t, d, generator=gen)
        cases.append(Case(f"x (B={b}, T={t}, D={d}), W_in (D, F={f}), W_out (F, D)", (
            x, torch.randn(d, f, generator=gen) / d**0.5, torch.randn(f, generator=gen) * 0.1,
            torch.randn(f, d, generator=gen) / f**0.5, torch.randn(d, generator=gen) * 0.1)))
    return cases


def _ffn_hint(case: Case, got, expected) -> str | None:
    x, W_in, b_in, W_out, b_out = case.args
    if close(got, (x @ W_in + b_in) @ W_out + b_out):
        return "the ReLU is missing: without it the two matrices collapse into one linear map"
    if close(got, torch.relu((x @ W_in + b_in) @ W_out + b_out)):
        return "the ReLU goes between the two matrices (on the F hidden units), not after W_out"
    if close(got, torch.relu(x @ W_in) @ W_out):
        return "the biases b_in and b_out are missing"
    return None


@exercise(cases=_ffn_cases, hints=[_ffn_hint])
def relu_ffn(x: torch.Tensor, W_in: torch.Tensor, b_in: torch.Tensor, W_out: torch.Tensor,
             b_out: torch.Tensor) -> torch.Tensor:
    """x (B, T, D), W_in (D, F), b_in (F,), W_out (F, D), b_out (D,) -> (B, T, D):
    max(0, x W_in + b_in) W_out + b_out, the same weights at every position."""
    return torch.relu(x @ W_in + b_in) @ W_out + b_out


def _sublayer_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for c in _ffn_cases(gen):
        x, W_in, _, W_out, _ = c.args
        d = x.shape[-1]
        gamma = 1 + 0.5 * torch.randn(d, generator=gen)
        beta = 0.5 * torch.randn(d, generator=gen)
        cases.append(Case(c.label + ", gamma, beta (D,)", (x, gamma, beta, W_in, W_out)))
    return cases


def _mlp(h: torch.Tensor, W_in: torch.Tensor, W_out: torch.Tensor) -> torch.Tensor:
    return torch.relu(h @ W_in) @ W_out


def _sublayer_hint(case: Case, got, expected) -> str | None:
    x, gamma, beta, W_in, W_out = case.args
    ln = _ln(x, gamma, beta, 1e-5)
    if close(got, _ln(x + _mlp(x, W_in, W_out), gamma, beta, 1e-5)):
        return "that is post-LN (LN(x + F(x))); pre-LN normalises the input of F only: x + F(LN(x))"
    if close(got, _mlp(ln, W_in, W_out)):
        return "the residual connection is missing: add x to F(LN(x))"
    if close(got, ln + _mlp(ln, W_in, W_out)):
        return "add the raw x, not LN(x): the residual stream itself is never normalised in pre-LN"
    if close(got, x + _mlp(x, W_in, W_out)):
        return "the LayerNorm is missing: apply it to x before the MLP"
    return None


@exercise(cases=_sublayer_cases, hints=[_sublayer_hint])
def pre_ln_sublayer(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, W_in: torch.Tensor,
                    W_out: torch.Tensor) -> torch.Tensor:
    """x (B, T, D) -> (B, T, D): x + MLP(LN(x)), LN with ε = 1e-5, MLP(h) = max(0, h W_in) W_out."""
    return x + _mlp(_ln(x, gamma, beta, 1e-5), W_in, W_out)


def _count_cases(gen: torch.Generator) -> list[Case]:
    # fixed sizes: a passing check prints "expected N, got N", which must not change run to run
    sizes = [(64, 256), (768, 3072), (100, 300)]
    return [Case(f"d_model={d}, d_ff={f}", (d, f)) for d, f in sizes]


def _count_hint(case: Case, got, expected) -> str | None:
    d, f = case.args
    if not isinstance(got, int):
        return None
    weights = 4 * d * d + 2 * d * f
    if got == weights:
        return "only the weight matrices are counted; add the biases (4D attention, F + D MLP) and 2×(γ, β)"
    if got == expected - 4 * d:
        return "the two LayerNorms are missing: each has γ and β of size D"
    if got == expected - 2 * d:
        return "there are two LayerNorms per block, each with γ and β"
    if got == expected - 4 * d - f - d:
        return "the biases are missing: 4 of size D in attention, F + D in the MLP"
    if got == 12 * d * d + 13 * d:
        return "12d² + 13d assumes d_ff = 4d; use the given d_ff"
    return None


@exercise(cases=_count_cases, hints=[_count_hint])
def block_parameters(d_model: int, d_ff: int) -> int:
    """The trainable parameters of one GPT-2-style block (attention with biases, W_in/W_out with
    biases, two LayerNorms) of width d_model and MLP width d_ff."""
    return block_parameter_count(d_model, d_ff, activation="gelu", bias=True)
