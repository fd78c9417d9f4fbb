"""Exercises of lesson 00: tensor shapes with einops (flatten, reduce, einsum), three self-check
questions and one experiment (the exponent with which an average settles as T grows)."""

from __future__ import annotations

import torch
from einops import rearrange, reduce

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _

SHAPES = [(1, 1, 1), (2, 3, 4), (4, 7, 5)]


def _btd_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("x of shape (B={b}, T={t}, D={d})", b=b, t=t, d=d), (torch.randn(b, t, d, generator=gen),))
            for b, t, d in SHAPES]


def _same_values_other_order(case: Case, got, expected) -> str | None:
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.allclose(
        got.flatten().sort().values, expected.flatten().sort().values
    ):
        return _("the right numbers in the wrong order: merge (b t), not (t b)")
    return None


@exercise(cases=_btd_cases, hints=[_same_values_other_order])
def flatten_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B*T, D): one row per token, batch-major."""
    return rearrange(x, "b t d -> (b t) d")


def _reduced_wrong_axis(case: Case, got, expected) -> str | None:
    x = case.args[0]
    if isinstance(got, torch.Tensor) and got.shape == x.mean(dim=2).shape != expected.shape:
        return _("you averaged over D; average over the time axis T")
    if isinstance(got, torch.Tensor) and torch.allclose(got, x.sum(dim=1), atol=1e-5):
        return _("that is the sum over T; divide by T (use reduce(..., 'mean'))")
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
        return _("the output is (B, S, T); the first sequence's axis comes first: 'b t d, b s d -> b t s'")
    return None


@exercise(cases=_pair_cases, hints=[_transposed])
def pairwise_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (B, T, D), b (B, S, D) -> (B, T, S): every dot product a[i, t] · b[i, s]."""
    return torch.einsum("btd,bsd->bts", a, b)


# --- self-check questions ------------------------------------------------------------------------

@question(explain=N_("h=4 cuts D=12 into 4 heads of d=3, and (b h) merges the heads into the batch axis, "
                     "batch-major: (B·H, T, D/H) = (8, 5, 3)."),
          hints=[known_wrong({
              (2, 4, 5, 3): N_("that is 'b h t d': here b and h are merged into one axis, (b h)"),
              (8, 5, 12): N_("the heads are cut out of D: each keeps D/H = 3 features, not all 12"),
              (2, 20, 3): N_("(b h) merges b with h, not t with h: the positions stay a separate axis of 5"),
          })])
def merged_heads_shape() -> tuple:
    """The shape of rearrange(x, "b t (h d) -> (b h) t d", h=4) for x of shape (2, 5, 12)."""
    return tuple(rearrange(torch.zeros(2, 5, 12), "b t (h d) -> (b h) t d", h=4).shape)


PATTERNS = {"a": ("b t (h d) -> t b h d", 4), "b": ("b t (d h) -> b t d h", 4),
            "c": ("b t (h d) -> b h t d", 3), "d": ("b t (h d) -> t b d h", 4)}


@question(explain=N_("(h d) with h = 4 cuts D = 12 into h = 4 and d = 3; 't b d h' lists them as (5, 2, 3, 4)."),
          hints=[known_wrong({
              "a": N_("'t b h d' with h = 4 puts the 4 heads before the 3 features: (5, 2, 4, 3)"),
              "b": N_("'b t d h' keeps the batch axis first: (2, 5, 3, 4)"),
              "c": N_("'b h t d' with h = 3 gives (2, 3, 5, 4): the batch axis stays first"),
          })])
def pattern_for_shape() -> str:
    """Multiple choice: which rearrange turns x of shape (2, 5, 12) into shape (5, 2, 3, 4)?"""
    x = torch.zeros(2, 5, 12)
    return next(k for k, (pattern, h) in PATTERNS.items() if rearrange(x, pattern, h=h).shape == (5, 2, 3, 4))


@question(explain=N_("one product per (b, t, s, d): 2·3·5·4 = 120; d is summed away, b, t and s stay in the output."),
          hints=[known_wrong({
              30: N_("30 = B·T·S counts the outputs; each output is a sum of D = 4 products"),
              24: N_("24 = B·T·D is the size of a; every query row meets every one of the S = 5 key rows"),
              40: N_("40 = B·S·D is the size of b; every key row meets every one of the T = 3 query rows"),
          })])
def einsum_products() -> int:
    """How many multiplications "b t d, b s d -> b t s" does for B=2, T=3, S=5, D=4."""
    return 2 * 3 * 5 * 4


# --- experiment: fit an exponent -----------------------------------------------------------------

SPREAD_TS = (1, 4, 16, 64, 256)


def _mean_std(T: int, n: int = 4_000, D: int = 16) -> float:
    x = torch.randn(n, T, D, generator=torch.Generator().manual_seed(T))
    return float(reduce(x, "b t d -> b d", "mean").std())


@question(explain=N_("the average of T independent unit-variance numbers has standard deviation T^(−1/2) = 1/√T: on "
                     "a log-log plot a straight line of slope −0.5."),
          atol=0.03,
          hints=[known_wrong({
              -1.0: N_("a slope of −1 means the spread falls like 1/T; it is the variance that does"),
              0.5: N_("the spread shrinks as T grows: the slope is negative"),
              -0.25: N_("fit log(spread) against log(T) in the same base on both axes (or natural logs on both)"),
          })])
def spread_exponent() -> float:
    """Experiment: the least-squares slope of log(standard deviation of the mean over T) against log T,
    for T = 1, 4, 16, 64, 256 (N = 4,000 sequences of D = 16 standard normal entries each)."""
    lx = torch.log(torch.tensor(SPREAD_TS, dtype=torch.float64))
    ly = torch.log(torch.tensor([_mean_std(T) for T in SPREAD_TS], dtype=torch.float64))
    lx, ly = lx - lx.mean(), ly - ly.mean()
    return float((lx * ly).sum() / (lx * lx).sum())
