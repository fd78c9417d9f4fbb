"""Exercises of lesson 04: LayerNorm, RMSNorm, the ReLU feed-forward network, a pre-LN residual
sublayer, and counting a block's parameters; five self-check questions and one experiment (the
depth at which a plain stack stops passing gradient to its first layer)."""

from __future__ import annotations

import torch

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.messages import N_, _
from course_utils import blocks
from course_utils.blocks import FeedForward
from course_utils.counting import block_parameter_count
from course_utils.cpu_threads import torch_threads

# Classes that answer an exercise whole (course_tools.grading.shortcuts adds them to what it derives).
TEACHES = {"layer_norm": ("course_utils.blocks.LayerNorm",), "rms_norm": ("course_utils.blocks.RMSNorm",),
           "relu_ffn": ("course_utils.blocks.FeedForward",),
           "pre_ln_sublayer": ("course_utils.blocks.FeedForward", "course_utils.blocks.LayerNorm")}

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
        return _("ε is outside the square root: divide by √(σ² + ε), not √σ² + ε")
    if close(got, _ln(x, gamma, beta, eps, dim=1)):
        return _("you normalised over the time axis T; LayerNorm normalises each token over its D features (dim=-1)")
    if x.shape[0] > 1 and close(got, _ln(x, gamma, beta, eps, dim=0)):
        return _("you normalised over the batch axis (that is BatchNorm); normalise over the last axis D")
    if close(got, _ln(x, gamma, beta, eps, unbiased=True)):
        return _("that is the unbiased variance (divide by D − 1); LayerNorm divides by D (unbiased=False)")
    if close(got, blocks.layer_norm(x, torch.ones_like(gamma), torch.zeros_like(beta), eps)):
        return _("the standardisation is right; now scale by γ and shift by β")
    if close(got, (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False)
                                                               + eps) * gamma):
        return _("β is missing: add the shift after scaling by γ")
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
        return _("ε is outside the square root: divide by √(mean(x²) + ε)")
    if close(got, gamma * x / (ms + eps)):
        return _("you divided by the mean square; divide by its square root (the root mean square)")
    if close(got, blocks.rms_norm(x - x.mean(-1, keepdim=True), gamma, eps)):
        return _("RMSNorm does not subtract the mean (that is LayerNorm); divide x itself by its RMS")
    if close(got, gamma * x / torch.sqrt(x.pow(2).mean(1, keepdim=True) + eps)):
        return _("you took the mean over the time axis T; RMSNorm averages each token's D features (dim=-1)")
    if close(got, blocks.rms_norm(x, torch.ones_like(gamma), eps)):
        return _("the normalisation is right; now multiply by γ")
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
        return _("the ReLU is missing: without it the two matrices collapse into one linear map")
    if close(got, torch.relu((x @ W_in + b_in) @ W_out + b_out)):
        return _("the ReLU goes between the two matrices (on the F hidden units), not after W_out")
    if close(got, torch.relu(x @ W_in) @ W_out):
        return _("the biases b_in and b_out are missing")
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
        cases.append(Case(N_("{label}, gamma, beta (D,)", label=c.label), (x, gamma, beta, W_in, W_out)))
    return cases


def _mlp(h: torch.Tensor, W_in: torch.Tensor, W_out: torch.Tensor) -> torch.Tensor:
    return torch.relu(h @ W_in) @ W_out


def _sublayer_hint(case: Case, got, expected) -> str | None:
    x, gamma, beta, W_in, W_out = case.args
    ln = _ln(x, gamma, beta, 1e-5)
    if close(got, _ln(x + _mlp(x, W_in, W_out), gamma, beta, 1e-5)):
        return _("that is post-LN (LN(x + F(x))); pre-LN normalises the input of F only: x + F(LN(x))")
    if close(got, _mlp(ln, W_in, W_out)):
        return _("the residual connection is missing: add x to F(LN(x))")
    if close(got, ln + _mlp(ln, W_in, W_out)):
        return _("add the raw x, not LN(x): the residual stream itself is never normalised in pre-LN")
    if close(got, x + _mlp(x, W_in, W_out)):
        return _("the LayerNorm is missing: apply it to x before the MLP")
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
        return _("only the weight matrices are counted; add the biases (4D attention, F + D MLP) and 2×(γ, β)")
    if got == expected - 4 * d:
        return _("the two LayerNorms are missing: each has γ and β of size D")
    if got == expected - 2 * d:
        return _("there are two LayerNorms per block, each with γ and β")
    if got == expected - 4 * d - f - d:
        return _("the biases are missing: 4 of size D in attention, F + D in the MLP")
    if got == 12 * d * d + 13 * d:
        return _("12d² + 13d assumes d_ff = 4d; use the given d_ff")
    return None


@exercise(cases=_count_cases, hints=[_count_hint])
def block_parameters(d_model: int, d_ff: int) -> int:
    """The trainable parameters of one GPT-2-style block (attention with biases, W_in/W_out with
    biases, two LayerNorms) of width d_model and MLP width d_ff."""
    return block_parameter_count(d_model, d_ff, activation="gelu", bias=True)


# --- self-check questions ------------------------------------------------------------------------

@question(explain=N_("LayerNorm standardises each token on its own, over its D features; batch and position play no "
                     "part (which is why it works the same at batch size 1)."),
          hints=[known_wrong({
              "a": N_("averaging over the batch for each feature is BatchNorm; LayerNorm looks at one token at a time"),
              "b": N_("averaging over the positions mixes tokens; LayerNorm normalises each token over its features"),
              "d": N_("one mean for the whole tensor lets tokens change each other's scale; LayerNorm has one per "
                      "token"),
          })])
def norm_axis() -> str:
    """Multiple choice: over which axis of x (B, T, D) LayerNorm takes its mean and variance."""
    return "c"


@question(explain=N_("the mean square of (2, 2, 2, 2) is 4 and its root is 2, so every feature becomes 2 / 2 = 1; "
                     "RMSNorm subtracts no mean, so a constant token is not sent to zero."),
          atol=1e-3,
          hints=[known_wrong({
              0: N_("0 is LayerNorm's answer (it subtracts the mean 2 first); RMSNorm divides x itself by its RMS"),
              0.5: N_("2 / 4 divides by the mean square; RMSNorm divides by its square root"),
              2: N_("RMSNorm divides by the root mean square, which is 2 here"),
          })])
def rms_of_constant() -> float:
    """RMSNorm (γ = 1, ε = 0) of the token x = (2, 2, 2, 2): the value of each feature."""
    return 1.0


@question(explain=N_("the Jacobians of a stack multiply: ten factors of 0.5 give 0.5¹⁰ ≈ 0.001; with residual "
                     "connections each factor is I + 0.5 I = 1.5 I instead."),
          atol=1e-4,
          hints=[known_wrong({
              5: N_("0.5 × 10 adds the layers' factors; the chain rule multiplies them"),
              0.05: N_("0.5 / 10 divides; the chain rule multiplies ten factors of 0.5"),
              1.5**10: N_("that is the residual stack, whose Jacobians are I + 0.5 I; the plain stack has 0.5 I"),
              0.5: N_("that is one layer; the gradient passes through all ten"),
          })])
def plain_gradient_factor() -> float:
    """The factor by which 10 plain layers, each with Jacobian 0.5·I, multiply the gradient."""
    return 0.5**10


@question(explain=N_("W_in is 64 × 256 with 256 biases, W_out 256 × 64 with 64 biases: 16,640 + 16,448 = 33,088."),
          hints=[known_wrong({
              2 * 64 * 256: N_("the weights are right; W_in adds 256 biases and W_out 64"),
              2 * 64 * 256 + 2 * 256: N_("W_out's bias has one entry per output feature: 64, not 256"),
              2 * 64 * 256 + 2 * 64: N_("W_in's bias has one entry per hidden unit: 256, not 64"),
              64 * 256 + 256: N_("that is W_in only; the FFN also maps the 256 hidden units back to 64"),
          })])
def ffn_parameters() -> int:
    """The parameters of the FFN (W_in, b_in, W_out, b_out) of a block with d_model = 64 and d_ff = 256."""
    return 64 * 256 + 256 + 256 * 64 + 64


PRE_LN_OPTIONS = {"a": "LN(x + F(x))", "b": "x + LN(F(x))", "c": "LN(x) + F(x)", "d": "x + F(LN(x))"}


@question(explain=N_("pre-LN normalises the input of the sublayer and adds its output to the raw x: the residual "
                     "stream itself is never normalised."),
          hints=[known_wrong({
              "a": N_("(a) normalises after the addition: that is post-LN, the 2017 order"),
              "b": N_("(b) normalises F's output; pre-LN normalises F's input"),
              "c": N_("(c) adds F(x) to a normalised stream: the identity path would then pass through LN"),
          })])
def pre_ln_choice() -> str:
    """Multiple choice: which of four update rules is the pre-LN sublayer."""
    return next(k for k, rule in PRE_LN_OPTIONS.items() if rule == "x + F(LN(x))")


# --- experiment ----------------------------------------------------------------------------------

def _first_to_last_ratio(n_layers: int, d: int = 64) -> float:
    """The gradient norm at the first layer's W_in over the last layer's, in a plain stack x <- FFN(x)."""
    torch.manual_seed(0)
    layers = [FeedForward(d, activation="relu").double() for _ in range(n_layers)]
    h = torch.randn(8, 16, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for layer in layers:
        h = layer(h)
    h.pow(2).mean().backward()
    return float(layers[0].W_in.weight.grad.norm() / layers[-1].W_in.weight.grad.norm())


@question(explain=N_("each plain layer multiplies the gradient by a Jacobian that shrinks it (by about 4× per layer "
                     "here): the first layer gets about 10⁻⁴ of the last one's at 8 layers and about 10⁻⁹ at 16."),
          hints=[known_wrong({
              8: N_("at 8 layers the first layer still gets about 10⁻⁴ of the last one's gradient: not yet below 10⁻⁶"),
              32: N_("a smaller depth already passes: measure every depth of the grid, from 1 up"),
              64: N_("a smaller depth already passes: measure every depth of the grid, from 1 up"),
          })])
def vanishing_depth() -> int:
    """Experiment: the smallest depth in 1, 2, 4, ..., 64 at which the first layer of a plain ReLU FFN
    stack (d = 64) receives less than 10⁻⁶ of the gradient norm its last layer receives."""
    with torch_threads(1):  # tiny tensors: on busy shared cores, more threads only slow the grader down
        return next(n for n in (2**i for i in range(7)) if _first_to_last_ratio(n) < 1e-6)
