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
