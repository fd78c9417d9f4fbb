"""``course-dev bench cpu``: training speed of the course's GPT against Hugging Face's GPT-2 on the CPU.

Both models get the same sizes, the same weights' shapes, float32, dropout 0, and the same AdamW
(``shared.reference_model`` says how the reference is made to compute the same maths). Each round
times one step of one model and then one of the other, the order alternating (``shared.interleave``);
a round's ratio is the reference's time over the course's, and the result is the median of the
rounds' ratios with its 95% interval (``shared.median_interval``), so a run says whether a ratio
below or above 1.0 is more than the machine's noise.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.dev.bench.shared import (
    BenchSize,
    LogitsOnly,
    at_least_one,
    interleave,
    load_average,
    median_interval,
    reference_model,
)
from course_utils import gpt
from course_utils.cpu_threads import torch_threads
from course_utils.train import TrainConfig, make_optimizer

SIZES = {
    # the sizes of `course train --config cpu` and of nanoGPT's shakespeare_char (a smaller batch, no
    # dropout), with tinyshakespeare's 65 characters as the vocabulary (the course corpus has 84)
    "cpu": BenchSize("cpu", 3, 128, 4, 64, 12),
    "char": BenchSize("char", 6, 384, 6, 256, 4),
    "tiny": BenchSize("tiny", 2, 32, 2, 16, 2),
}
SECONDS = 30.0  # timed seconds per size and thread count: about 250 rounds at the `cpu` size
# at least 31 rounds, so that the 95% interval spans the 10th to the 22nd of them (with 11, the 2nd to the
# 10th: about ±1% at `char`, too wide to tell 0.99 from 1.01); `char` then takes about 70 s on 1 thread
MIN_ROUNDS, MAX_ROUNDS = 31, 401


def course_model(size: BenchSize) -> nn.Module:
    """The course's GPT at ``size``; ``model(x)`` returns logits (B, T, V)."""
    config = gpt.GPTConfig(size.vocab_size, size.max_len, size.n_layers, size.n_heads, size.d_model)
    return LogitsOnly(gpt.GPT(config), lambda out: out[0])


class Trainer:
    """One model, its AdamW and a fixed random batch: ``steps(n)`` runs n training steps, returns seconds."""

    def __init__(self, model: nn.Module, size: BenchSize, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        shape = (size.batch_size, size.max_len)
        self.x = torch.randint(size.vocab_size, shape, generator=gen)
        self.y = torch.randint(size.vocab_size, shape, generator=gen)
        self.model = model.train()
        self.optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
        self.tokens_per_step = self.x.numel()

    def steps(self, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            logits = self.model(self.x)
            loss = F.cross_entropy(logits.flatten(0, 1), self.y.flatten())
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


@dataclass
class BenchResult:
    size: str
    threads: int
    rounds: int
    course_tokens_per_s: float
    reference_tokens_per_s: float
    ratio: float  # course / reference speed, median of the rounds' ratios
    low: float  # the median's 95% interval (``median_interval``)
    high: float


def compare(size: BenchSize, threads: int, rounds: int | None = None, steps: int = 1, warmup: int = 2,
            seconds: float = SECONDS) -> BenchResult:
    """Interleaved timing of the two models at ``size`` with ``threads`` PyTorch threads: ``rounds``
    rounds of ``steps`` steps of each model, the order alternating (ABBA). Without ``rounds``, as many
    as fit in about ``seconds`` at the speed of the last warm-up steps (from MIN_ROUNDS to MAX_ROUNDS)."""
    with torch_threads(threads):
        torch.manual_seed(0)
        ours, theirs = Trainer(course_model(size), size), Trainer(reference_model(size), size)
        ours.steps(warmup - 1)
        theirs.steps(warmup - 1)
        one_round = ours.steps(1) + theirs.steps(1)
        if rounds is None:
            rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(seconds / (steps * one_round))))
        times = interleave({"ours": lambda: ours.steps(steps), "theirs": lambda: theirs.steps(steps)}, rounds)
    ratios = [b / a for a, b in zip(times["ours"], times["theirs"], strict=True)]
    low, high = median_interval(ratios)
    tokens = steps * ours.tokens_per_step
    return BenchResult(size.name, threads, rounds, tokens / statistics.median(times["ours"]),
                       tokens / statistics.median(times["theirs"]), statistics.median(ratios), low, high)


def main(args: argparse.Namespace) -> int:
    """A table of tokens/s and the ratio per size and thread count."""
    print(f"load average before: {load_average()}")
    print(f"{args.steps} step(s) of each model per round, the order alternating; ratio = course / HF speed, the "
          "median of the rounds' ratios, and its 95% interval")
    print(f"{'size':<6}{'threads':>8}{'rounds':>7}{'course tok/s':>14}{'HF GPT-2 tok/s':>16}{'ratio':>7}"
          f"{'95% interval':>15}")
    for name in args.sizes:
        for threads in args.threads:
            r = compare(SIZES[name], threads, rounds=args.rounds, steps=args.steps)
            print(f"{r.size:<6}{r.threads:>8}{r.rounds:>7}{r.course_tokens_per_s:>14,.0f}"
                  f"{r.reference_tokens_per_s:>16,.0f}{r.ratio:>7.3f}{f'{r.low:.3f}-{r.high:.3f}':>15}", flush=True)
    print(f"load average after: {load_average()}")
    return 0


def add_parser(modes: argparse._SubParsersAction) -> None:
    """Register ``course-dev bench cpu``."""
    p = modes.add_parser("cpu", help="training tokens/s of the course's GPT vs Hugging Face's GPT-2 on the CPU, "
                         "same sizes, with the ratio and its interval")
    p.add_argument("--sizes", nargs="+", default=["cpu", "char"], choices=list(SIZES), metavar="SIZE",
                   help="sizes to compare (default cpu char)")
    p.add_argument("--threads", nargs="+", type=at_least_one, default=[1, 2], metavar="N",
                   help="PyTorch thread counts (default 1 2)")
    p.add_argument("--rounds", type=at_least_one, metavar="N", help=f"interleaved rounds (default: as many as fit "
                   f"in about {SECONDS:.0f} s per size and thread count, at least {MIN_ROUNDS})")
    p.add_argument("--steps", type=at_least_one, default=1, metavar="N",
                   help="training steps per model and round (default 1)")
    p.set_defaults(func=main)
