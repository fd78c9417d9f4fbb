"""``course bench --cpu``: training speed of the course's GPT against Hugging Face's GPT-2 code
(``course bench --gpu``, in ``bench_gpu``: GPT-2 small on a CUDA device, with MFU; ``--llama-cpp``, in
``bench_llama_cpp``: SmolLM2 decoding against llama.cpp).

Both models get the same sizes, the same weights' shapes, float32, dropout 0, and the same AdamW;
the reference runs PyTorch's tanh GELU kernel (``gelu_pytorch_tanh``, the function GPT-2 uses) and
its scaled-dot-product attention, so the comparison is of the code, not of different maths.
They are timed in one process and interleaved: each round times one step of one model and then one
of the other, the order alternating (ABBA), so a drift in the machine's speed slows both alike. A
round's ratio is the reference's time over the course's; the result is the median of the rounds'
ratios with its 95% interval (``median_interval``), so a run says whether a ratio below or above
1.0 is more than the machine's noise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.cli.errors import fail
from course_utils import gpt
from course_utils.cpu_threads import torch_threads
from course_utils.train import TrainConfig, make_optimizer

PROG = "course bench"


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


SIZES = {
    # the sizes of `course train --config cpu` and of nanoGPT's shakespeare_char (a smaller batch, no
    # dropout), with tinyshakespeare's 65 characters as the vocabulary (the course corpus has 84)
    "cpu": BenchSize("cpu", 3, 128, 4, 64, 12),
    "char": BenchSize("char", 6, 384, 6, 256, 4),
    "tiny": BenchSize("tiny", 2, 32, 2, 16, 2),
}


def course_model(size: BenchSize) -> nn.Module:
    """The course's GPT at ``size``; ``model(x)`` returns logits (B, T, V)."""
    config = gpt.GPTConfig(size.vocab_size, size.max_len, size.n_layers, size.n_heads, size.d_model)
    model = gpt.GPT(config)
    return _LogitsOnly(model, lambda out: out[0])


def reference_model(size: BenchSize) -> nn.Module:
    """Hugging Face's ``GPT2LMHeadModel`` at ``size``; ``model(x)`` returns logits (B, T, V)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=size.vocab_size, n_positions=size.max_len, n_embd=size.d_model,
                        n_layer=size.n_layers, n_head=size.n_heads, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, activation_function="gelu_pytorch_tanh", use_cache=False,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config, attn_implementation="sdpa") if _takes_attn_impl() else GPT2LMHeadModel(config)
    return _LogitsOnly(model, lambda out: out.logits)


def _takes_attn_impl() -> bool:
    import inspect

    from transformers import GPT2LMHeadModel

    return "attn_implementation" in inspect.signature(GPT2LMHeadModel.__init__).parameters


class _LogitsOnly(nn.Module):
    """Wrap a model so both sides are called the same way: tokens (B, T) -> logits (B, T, V)."""

    def __init__(self, model: nn.Module, logits) -> None:
        super().__init__()
        self.model, self._logits = model, logits

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self._logits(self.model(idx))


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


SECONDS = 30.0  # timed seconds per size and thread count: about 250 rounds at the `cpu` size
# at least 31 rounds, so that the 95% interval spans the 10th to the 22nd of them (with 11, the 2nd to the
# 10th: about ±1% at `char`, too wide to tell 0.99 from 1.01); `char` then takes about 70 s on 1 thread
MIN_ROUNDS, MAX_ROUNDS = 31, 401
ROUNDS = 5  # --gpu and --llama-cpp: interleaved rounds unless --rounds says otherwise


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
        times: dict[str, list[float]] = {"ours": [], "theirs": []}
        for r in range(rounds):
            order = (("ours", ours), ("theirs", theirs)) if r % 2 == 0 else (("theirs", theirs), ("ours", ours))
            for name, trainer in order:
                times[name].append(trainer.steps(steps))
    ratios = [b / a for a, b in zip(times["ours"], times["theirs"], strict=True)]
    low, high = median_interval(ratios)
    tokens = steps * ours.tokens_per_step
    return BenchResult(size.name, threads, rounds, tokens / statistics.median(times["ours"]),
                       tokens / statistics.median(times["theirs"]), statistics.median(ratios), low, high)


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


def run_bench(args: argparse.Namespace) -> int:
    """``course bench --cpu``: a table of tokens/s and the ratio per size and thread count;
    ``course bench --gpu``: GPT-2 small on the CUDA device (``bench_gpu``)."""
    if any(n is not None and n < 1 for n in (args.rounds, args.steps)):
        return fail(PROG, ValueError("--rounds and --steps must be at least 1"))
    if args.gpu:
        return run_gpu_bench(args)
    if args.llama_cpp:
        from course_tools.cli import bench_llama_cpp

        return bench_llama_cpp.run(args)
    if args.dry_run or args.nanogpt or args.json:
        return fail(PROG, ValueError("--dry-run, --nanogpt and --json go with --gpu"))
    if not args.cpu:
        return fail(PROG, ValueError("say where: `course bench --cpu` or `course bench --gpu`"))
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        return fail(PROG, ValueError(f"unknown size {unknown[0]!r}; choose from {', '.join(SIZES)}"))
    print(f"load average before: {load_average()}")
    steps = args.steps or 1
    print(f"{steps} step(s) of each model per round, the order alternating; ratio = course / HF speed, the median "
          "of the rounds' ratios, and its 95% interval")
    print(f"{'size':<6}{'threads':>8}{'rounds':>7}{'course tok/s':>14}{'HF GPT-2 tok/s':>16}{'ratio':>7}"
          f"{'95% interval':>15}")
    for name in args.sizes:
        for threads in args.threads:
            r = compare(SIZES[name], threads, rounds=args.rounds, steps=steps)
            print(f"{r.size:<6}{r.threads:>8}{r.rounds:>7}{r.course_tokens_per_s:>14,.0f}"
                  f"{r.reference_tokens_per_s:>16,.0f}{r.ratio:>7.3f}{f'{r.low:.3f}-{r.high:.3f}':>15}", flush=True)
    print(f"load average after: {load_average()}")
    return 0


def run_gpu_bench(args: argparse.Namespace) -> int:
    """``course bench --gpu [--dry-run] [--nanogpt model.py] [--json FILE]``."""
    from course_tools.cli import bench_gpu

    if args.cpu:
        return fail(PROG, ValueError("choose one of --cpu and --gpu"))
    try:
        s = bench_gpu.setting(args.dry_run)
        contenders = [bench_gpu.course_contender(s.size), bench_gpu.hf_contender(s.size)]
        if args.nanogpt:
            contenders.append(bench_gpu.nanogpt_contender(s.size, Path(args.nanogpt)))
        else:
            s.skipped.append("nanogpt: no --nanogpt PATH to nanoGPT's model.py given")
        result = bench_gpu.run(contenders, s, rounds=args.rounds or ROUNDS, steps=args.steps or 5,
                                  batch=args.batch)
    except (OSError, ValueError, RuntimeError) as err:
        return fail(PROG, err)
    bench_gpu.print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course bench``."""
    p = sub.add_parser("bench", help="training tokens/s of the course's GPT vs Hugging Face's GPT-2, same sizes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--cpu", action="store_true", help="on the CPU, at the sizes of --sizes")
    where.add_argument("--gpu", action="store_true", help="GPT-2 small on the CUDA device: bf16, compiled, "
                       "the largest micro-batch that fits, with MFU")
    where.add_argument("--llama-cpp", action="store_true", help="SmolLM2 decoding: the course's float32 GPT vs "
                       "llama.cpp's Q4_1 kernels on the same file (needs llama-cpp-python, built outside the course)")
    p.add_argument("--sizes", nargs="+", default=["cpu", "char"], metavar="SIZE",
                   help=f"--cpu: sizes to compare ({', '.join(SIZES)}; default cpu char)")
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2],
                   help="--cpu: thread counts (default 1 2); --llama-cpp: the first one")
    p.add_argument("--new-tokens", type=int, default=64, help="--llama-cpp: tokens to decode (default 64)")
    p.add_argument("--rounds", type=int, help=f"interleaved rounds (default: --cpu, as many as fit in about "
                   f"{SECONDS:.0f} s per size and thread count, at least {MIN_ROUNDS}; otherwise {ROUNDS})")
    p.add_argument("--steps", type=int, help="training steps per model and round (default 1 with --cpu, 5 with "
                   "--gpu)")
    p.add_argument("--dry-run", action="store_true", help="--gpu: the same code on the CPU at a tiny size")
    p.add_argument("--nanogpt", metavar="MODEL.PY", help="--gpu: also time nanoGPT's model.py (from a clone)")
    p.add_argument("--batch", type=int, help="--gpu: micro-batch (default: the largest power of two that fits)")
    p.add_argument("--json", metavar="FILE", help="--gpu: write the result to this file")
    p.set_defaults(func=run_bench)
