"""Exercises of lesson 00: tensor shapes with einops (flatten, reduce, einsum), three self-check
questions and one experiment (how fast an average settles as T grows)."""

from __future__ import annotations

import torch
from einops import rearrange, reduce

from course_tools.checks import Case, exercise, question
from course_tools.references._shared import known_wrong

SHAPES = [(1, 1, 1), (2, 3, 4), (4, 7, 5)]


def _btd_cases(gen: torch.Generator) -> list[Case]:
    return [Case(f"x of shape (B={b}, T={t}, D={d})", (torch.randn(b, t, d, generator=gen),))
            for b, t, d in SHAPES]


def _same_values_other_order(case: Case, got, expected) -> str | None:
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.allclose(
        got.flatten().sort().values, expected.flatten().sort().values
    ):
        return "the right numbers in the wrong order: merge (b t), not (t b)"
    return None


@exercise(cases=_btd_cases, hints=[_same_values_other_order])
def flatten_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B*T, D): one row per token, batch-major."""
    return rearrange(x, "b t d -> (b t) d")


def _reduced_wrong_axis(case: Case, got, expected) -> str | None:
    x = case.args[0]
    if isinstance(got, torch.Tensor) and got.shape == x.mean(dim=2).shape != expected.shape:
        return "you averaged over D; average over the time axis T"
    if isinstance(got, torch.Tensor) and torch.allclose(got, x.sum(dim=1), atol=1e-5):
        return "that is the sum over T; divide by T (use reduce(..., 'mean'))"
    return None


@exercise(cases=_btd_cases, hints=[_reduced_wrong_axis])
def mean_over_time(x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B, D): the average token vector of each sequence."""
    return reduce(x, "b t d -> b d", "mean")


def _pair_cases(gen: torch.Generator) -> list[Case]:
    sizes = [(1, 1, 1, 3), (2, 3, 5, 4), (3, 6, 2, 8)]
    return [
        Case(f"a (B={b}, T={t}, D={d}), b (B={b}, S={s}, D={d})",
             (torch.randn(b, t, d, generator=gen), torch.randn(b, s, d, generator=gen)))
        for b, t, s, d in sizes
    ]


def _transposed(case: Case, got, expected) -> str | None:
    if isinstance(got, torch.Tensor) and got.shape == expected.transpose(1, 2).shape != expected.shape:
        return "the output is (B, S, T); the first sequence's axis comes first: 'b t d, b s d -> b t s'"
    return None


@exercise(cases=_pair_cases, hints=[_transposed])
def pairwise_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (B, T, D), b (B, S, D) -> (B, T, S): every dot product a[i, t] · b[i, s]."""
    return torch.einsum("btd,bsd->bts", a, b)


# --- self-check questions ------------------------------------------------------------------------

@question(explain="h=4 cuts D=12 into 4 heads of d=3, and the output pattern puts h before t: (B, H, T, D/H).",
          hints=[known_wrong({
              (2, 5, 4, 3): "that is the split before the axes move: the output pattern is 'b h t d', h before t",
              (2, 4, 5, 12): "h=4 does not copy D: it cuts D=12 into 4 pieces of 3",
              (2, 3, 5, 4): "h is given (4), so d is what is left: 12 / 4 = 3",
          })])
def heads_shape() -> tuple:
    """The shape of rearrange(x, "b t (h d) -> b h t d", h=4) for x of shape (2, 5, 12)."""
    return tuple(rearrange(torch.zeros(2, 5, 12), "b t (h d) -> b h t d", h=4).shape)


@question(explain="axes are indexed in the order (B, T, D): x[1, 2] is sequence 1, position 2, a vector of D numbers.",
          hints=[known_wrong({
              "a": "x[2, 1] reads the axes the other way round: the batch axis comes first, x[b, t]",
              "c": "x[:, 2] is position 2 of every sequence, a (B, D) matrix",
              "d": "x[..., 1, 2] indexes the last two axes (T and D): one number per sequence",
          })])
def token_index() -> str:
    """Multiple choice: which expression is the vector of token 2 of sequence 1?"""
    return "b"


@question(explain="one product per (b, t, s, d): 2·3·5·4 = 120; d is summed away, b, t and s stay in the output.",
          hints=[known_wrong({
              30: "30 = B·T·S counts the outputs; each output is a sum of D = 4 products",
              24: "24 = B·T·D is the size of a; every query row meets every one of the S = 5 key rows",
              40: "40 = B·S·D is the size of b; every key row meets every one of the T = 3 query rows",
          })])
def einsum_products() -> int:
    """How many multiplications "b t d, b s d -> b t s" does for B=2, T=3, S=5, D=4."""
    return 2 * 3 * 5 * 4


# --- experiment ----------------------------------------------------------------------------------

def _mean_std(T: int, n: int = 4_000, D: int = 16) -> float:
    x = torch.randn(n, T, D, generator=torch.Generator().manual_seed(0))
    return float(reduce(x, "b t d -> b d", "mean").std())


@question(explain="the average of T independent unit-variance numbers has standard deviation 1/√T: "
                  "1/√64 = 0.125, 1/√128 ≈ 0.088.",
          hints=[known_wrong({
              64: "at T = 64 the spread is still about 0.125: the standard deviation falls like 1/√T, not 1/T",
              100: "T must be a power of two; 1/√T < 0.1 first holds on the grid at the next one",
              16: "the spread falls like 1/√T: at T = 16 it is 0.25 (a 1/T guess would give 0.0625)",
              8: "the spread falls like 1/√T, not 1/T: at T = 8 it is about 0.35",
          })])
def smallest_t_below_a_tenth() -> int:
    """Experiment: the smallest T in 1, 2, 4, ..., 1024 at which the mean over T of N(0, 1)
    token vectors has a standard deviation below 0.1, measured."""
    return next(T for T in (2**i for i in range(11)) if _mean_std(T) < 0.1)
