"""What the three modes of ``course-dev bench`` share: the reference GPT-2 at the course's sizes, the
interleaved rounds, the interval of their median and the load average printed beside them.

Every mode times the course's code against a reference in one process, interleaved: each round runs
every contender once, the order rotating from round to round (ABBA for two), so a drift in the
machine's speed slows all alike. A ratio is the median of the rounds' ratios, which a disturbance of
one round does not move.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

ROUNDS = 5  # interleaved rounds of `gpu` and `llama-cpp` unless --rounds says otherwise
T = TypeVar("T")


@dataclass(frozen=True)
class BenchSize:
    """One model size and batch: ``n_layers`` × ``d_model`` with ``n_heads`` heads, context ``max_len``."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    max_len: int
    batch_size: int
    vocab_size: int = 65


class LogitsOnly(nn.Module):
    """Wrap a model so every contender is called the same way: tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, model: nn.Module, logits: Callable) -> None:
        super().__init__()
        self.model, self._logits = model, logits

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self._logits(self.model(idx))


def reference_model(size: BenchSize) -> nn.Module:
    """Hugging Face's ``GPT2LMHeadModel`` at ``size``, as the course's GPT computes: dropout 0, PyTorch's tanh
    GELU kernel (``gelu_pytorch_tanh``, GPT-2's function) and its scaled-dot-product attention, so a
    comparison is of the code, not of different maths; ``model(x)`` returns logits (B, T, V)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=size.vocab_size, n_positions=size.max_len, n_embd=size.d_model,
                        n_layer=size.n_layers, n_head=size.n_heads, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, activation_function="gelu_pytorch_tanh", use_cache=False,
                        bos_token_id=None, eos_token_id=None)
    takes_attn_impl = "attn_implementation" in inspect.signature(GPT2LMHeadModel.__init__).parameters
    model = GPT2LMHeadModel(config, attn_implementation="sdpa") if takes_attn_impl else GPT2LMHeadModel(config)
    return LogitsOnly(model, lambda out: out.logits)


def interleave(runs: dict[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Call every one of ``runs`` once per round for ``rounds`` rounds, the order rotating by one each
    round (for two: AB, BA, AB, ...); name -> its results in round order."""
    names = list(runs)
    results: dict[str, list[T]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(runs[name]())
    return results


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the j-th smallest and the j-th largest
    value, with j the largest rank such that the interval holds the true median with at least
    ``confidence`` (each value falls below the median with probability 1/2, so the count below is
    Binomial(n, 1/2)). With fewer than 6 values no such j exists at 95%, and the range is returned."""
    if not values:
        raise ValueError("median_interval needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    xs, n = sorted(values), len(values)
    j, below = 0, 0.0  # below = P(Binomial(n, 1/2) <= j - 1): the chance that the median lies under xs[j - 1]
    while j < n // 2:
        nxt = below + math.comb(n, j) / 2**n
        if 2 * nxt > 1.0 - confidence:
            break
        j, below = j + 1, nxt
    return (xs[0], xs[-1]) if j == 0 else (xs[j - 1], xs[n - j])


def load_average() -> str:
    """The 1-minute load average (runnable processes), or "n/a" where the OS does not report it."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def at_least_one(text: str) -> int:
    """argparse type of a count (rounds, steps, threads, tokens): a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
