"""Drawing ids from a discrete distribution by inverting its cumulative sum (inverse-CDF sampling).

word2vec draws its noise words this way and ``generate`` its next tokens: one uniform number u per
draw, and the drawn id is the first whose cumulative probability exceeds u.
"""

from __future__ import annotations

import torch


def inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """cdf (..., V) running sums of (unnormalised) probabilities, u uniform in [0, 1) -> ids.

    With a 1-D ``cdf`` (V,), ``u`` may have any shape and the ids have that shape; with a batch of
    distributions (B, V), ``u`` is (B,). The id is the first index whose cumulative mass exceeds
    u · total, so flat stretches of the cdf (zero-probability ids) are never drawn.
    """
    target = u.to(cdf.dtype)[..., None] * cdf[..., -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(cdf.shape[-1] - 1)


class AliasTable:
    """Walker's alias method: many draws from one fixed distribution over V ids, each in O(1).

    The V probabilities, scaled by V, are cut into V columns of height 1: column j keeps id j with
    probability ``accept[j]`` and otherwise gives ``alias[j]``. A draw picks a column uniformly and
    flips that biased coin, two lookups whatever V is, where ``inverse_cdf`` binary-searches log V
    entries (the bulk of word2vec's time when it draws millions of noise words).
    """

    def __init__(self, probs: torch.Tensor) -> None:
        probs = torch.as_tensor(probs, dtype=torch.float64)
        if probs.dim() != 1 or not probs.numel() or bool((probs < 0).any()) or not float(probs.sum()) > 0:
            raise ValueError("AliasTable needs a 1-D tensor of non-negative weights with a positive sum")
        V = probs.numel()
        height = (probs * (V / probs.sum())).tolist()
        accept, alias = [1.0] * V, list(range(V))
        small = [j for j, h in enumerate(height) if h < 1.0]
        large = [j for j, h in enumerate(height) if h >= 1.0]
        while small and large:  # fill each short column with the excess of a tall one (Vose's order)
            s, g = small.pop(), large.pop()
            accept[s], alias[s] = height[s], g
            height[g] -= 1.0 - height[s]
            (small if height[g] < 1.0 else large).append(g)
        self.accept = torch.tensor(accept, dtype=torch.float64)  # columns left over keep 1.0 (rounding)
        self.alias = torch.tensor(alias)

    def sample(self, shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
        """Ids of the given shape, drawn independently with the table's probabilities."""
        # int32 columns: the same draws as int64 ones, half the bytes to move (the result is int64)
        small = len(self.accept) < 2**31
        column = torch.randint(len(self.accept), shape, generator=generator,
                               dtype=torch.int32 if small else torch.long).reshape(-1)
        coin = torch.rand(column.shape, generator=generator, dtype=torch.float64)
        keep = coin < self.accept.index_select(0, column)
        return torch.where(keep, column, self.alias.index_select(0, column)).view(shape)
