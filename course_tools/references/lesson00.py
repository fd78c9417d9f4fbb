"""Exercises of lesson 00: tensor shapes with einops (flatten, reduce, einsum)."""

from __future__ import annotations

import torch
from einops import rearrange, reduce

from course_tools.checks import Case, exercise

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
