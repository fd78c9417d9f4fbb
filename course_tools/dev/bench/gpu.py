"""``course-dev bench gpu``: GPT-2 small's training speed and model FLOPs utilisation on one CUDA device.

Three implementations of the same 124M-parameter model (12 blocks × width 768, 12 heads, context
1,024, nanoGPT's padded vocabulary of 50,304 so the unembedding is a multiple of 64) train on the
same random tokens with the same AdamW, each as fast as PyTorch lets it: bf16 autocast, TF32
matmuls, ``torch.compile`` and fused AdamW, at the largest micro-batch that fits on the device:

- ``course``: the course's ``GPT``;
- ``hf``: Hugging Face's ``GPT2LMHeadModel`` with its scaled-dot-product attention;
- ``nanogpt``: nanoGPT's ``model.py`` (``--nanogpt PATH``: the file from a clone of nanoGPT, which
  the course does not ship), built with nanoGPT's own ``GPTConfig``.

They are timed in one process and interleaved (a few steps of each in turn, the order rotating:
``shared.interleave``), so a change in clocks or a neighbour affects all alike; each speed is the
median over rounds, and each ratio the median of the per-round ratios (the course's GPT over the
other; above 1, ours is faster). MFU is the achieved FLOP/s (6N + 12·L·T·d per token,
``counting.flops_per_token``) over the device's dense bf16 peak.

``--dry-run`` runs the same code on the CPU at a tiny size in float32 without compiling (each
GPU-only step says why it was skipped), so the command is tested by CI without a GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from course_tools.cli import tuning
from course_tools.cli.errors import fail
from course_tools.dev.bench.shared import ROUNDS, BenchSize, at_least_one, interleave, reference_model
from course_utils import counting, gpt, runtime, train

PROG = "course-dev bench gpu"

GPT2_SMALL = BenchSize("gpt2", 12, 768, 12, 1024, batch_size=0, vocab_size=50_304)  # batch: measured
DRY_RUN = BenchSize("tiny", 2, 32, 2, 16, batch_size=0, vocab_size=65)
MAX_PROBE_BATCH = {True: 8, False: 512}  # dry run: a CPU needs no search beyond a few sequences


@dataclass(frozen=True)
class Contender:
    """One implementation: ``build()`` makes the model, ``loss(model, x, y)`` one training loss."""

    name: str
    build: Callable[[], nn.Module]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def course_contender(size: BenchSize) -> Contender:
    config = gpt.GPTConfig(size.vocab_size, size.max_len, size.n_layers, size.n_heads, size.d_model)
    return Contender("course", lambda: gpt.GPT(config), lambda m, x, y: m(x, y)[1])


def hf_contender(size: BenchSize) -> Contender:
    def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x).flatten(0, 1).float(), y.flatten())

    return Contender("hf", lambda: reference_model(size), loss)


def nanogpt_contender(size: BenchSize, path: Path) -> Contender:
    """nanoGPT's ``GPT`` from its ``model.py`` at ``path``; its forward with targets returns (logits, loss)."""
    if not path.is_file():
        raise FileNotFoundError(f"--nanogpt {path}: no such file; pass the model.py of a nanoGPT clone")
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "GPT") or not hasattr(module, "GPTConfig"):
        raise ValueError(f"{path} defines no GPT and GPTConfig; pass nanoGPT's model.py")
    config = module.GPTConfig(block_size=size.max_len, vocab_size=size.vocab_size, n_layer=size.n_layers,
                              n_head=size.n_heads, n_embd=size.d_model, dropout=0.0, bias=True)
    return Contender("nanogpt", lambda: module.GPT(config), lambda m, x, y: m(x, y)[1])


@dataclass
class Setting:
    """Where and how the benchmark runs; ``skipped`` says which GPU-only steps a dry run leaves out, and why."""

    device: torch.device
    dtype: torch.dtype
    compile: bool
    size: BenchSize
    skipped: list[str] = field(default_factory=list)


def setting(dry_run: bool) -> Setting:
    """On CUDA: GPT-2 small, bf16, compiled. With ``dry_run``: the CPU, a tiny model, float32, eager."""
    device = runtime.device()
    if dry_run:
        return Setting(torch.device("cpu"), torch.float32, False, DRY_RUN, skipped=[
            "bf16 autocast: the dry run stays in float32 on the CPU",
            "torch.compile: skipped in the dry run (a compile takes minutes on 2 CPU cores)",
            "MFU: no peak FLOP/s is known for a CPU",
        ])
    if device.type != "cuda":
        raise RuntimeError(f"no CUDA device here (found {device.type}); "
                           "use `course-dev bench cpu`, or `course-dev bench gpu --dry-run` to test the command")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return Setting(device, dtype, True, GPT2_SMALL)


class GPUTrainer:
    """One contender on the device with its AdamW and a fixed batch; ``steps(n)`` returns seconds."""

    def __init__(self, contender: Contender, s: Setting, batch: int, seed: int = 0) -> None:
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        shape = (batch, s.size.max_len)
        self.x = torch.randint(s.size.vocab_size, shape, generator=gen).to(s.device)
        self.y = torch.randint(s.size.vocab_size, shape, generator=gen).to(s.device)
        self.raw = contender.build().to(s.device).train()
        self.model = torch.compile(self.raw) if s.compile else self.raw
        self.loss, self.setting = contender.loss, s
        self.optimizer = train.make_optimizer(self.raw, train.TrainConfig(), s.device)
        self.tokens_per_step = self.x.numel()

    def _sync(self) -> None:
        if self.setting.device.type == "cuda":
            torch.cuda.synchronize(self.setting.device)

    def steps(self, n: int) -> float:
        self._sync()
        t0 = time.perf_counter()
        for _ in range(n):
            with train.autocast(self.setting.device, self.setting.dtype):
                loss = self.loss(self.model, self.x, self.y)
            loss.backward()
            nn.utils.clip_grad_norm_(self.raw.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - t0


def _fits(contender: Contender, s: Setting, batch: int) -> bool:
    """Whether one eager training step at ``batch`` sequences fits in the device's memory."""
    eager = Setting(s.device, s.dtype, False, s.size)
    try:
        GPUTrainer(contender, eager, batch).steps(1)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        if s.device.type == "cuda":
            torch.cuda.empty_cache()


def largest_batch(contender: Contender, s: Setting, cap: int) -> int:
    """The largest power of two up to ``cap`` whose eager training step fits (compiled graphs need
    less memory than eager ones, which keep every intermediate); 0 if not even one sequence fits."""
    batch = 0
    while batch < cap and _fits(contender, s, max(1, 2 * batch)):
        batch = max(1, 2 * batch)
    return batch


@dataclass
class Row:
    name: str
    tokens_per_s: float
    mfu: float | None
    course_over_this: float  # median over rounds of (the course GPT's speed / this contender's): > 1, ours is faster


@dataclass
class GPUBenchResult:
    device: str
    dtype: str
    compiled: bool
    size: dict
    micro_batch: int
    peak_tflops: float | None
    flops_per_token: int
    rounds: int
    steps: int
    rows: list[Row]
    skipped: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def measure(contenders: list[Contender], s: Setting, rounds: int = ROUNDS, steps: int = 10, warmup: int = 3,
            batch: int | None = None) -> GPUBenchResult:
    """Find the micro-batch (unless given), build every contender, warm up (compiles), then time
    ``rounds`` interleaved rounds of ``steps`` steps each."""
    if contenders[0].name != "course":
        raise ValueError("the course's GPT comes first: the ratios are against it")
    batch = batch or largest_batch(contenders[0], s, MAX_PROBE_BATCH[s.device.type == "cpu"])
    if batch == 0:
        raise RuntimeError("not even one sequence of the model fits on the device")
    trainers = {c.name: GPUTrainer(c, s, batch) for c in contenders}
    for trainer in trainers.values():
        trainer.steps(warmup)
    speeds = interleave({name: (lambda t=t: steps * t.tokens_per_step / t.steps(steps))
                         for name, t in trainers.items()}, rounds)
    flops = counting.flops_per_token(gpt.GPTConfig(s.size.vocab_size, s.size.max_len, s.size.n_layers,
                                              s.size.n_heads, s.size.d_model), s.size.max_len, training=True)
    peak = tuning.peak_tflops(torch.cuda.get_device_name(s.device), s.dtype) if s.device.type == "cuda" else None
    rows = []
    for name, values in speeds.items():
        speed = statistics.median(values)
        ratio = statistics.median(a / b for a, b in zip(speeds["course"], values, strict=True))
        rows.append(Row(name, speed, speed * flops / (peak * 1e12) if peak else None, ratio))
    device_name = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else "cpu"
    return GPUBenchResult(device_name, str(s.dtype).removeprefix("torch."), s.compile, asdict(s.size), batch,
                          peak, flops, rounds, steps, rows, s.skipped)


def print_result(result: GPUBenchResult) -> None:
    """The table ``course-dev bench gpu`` prints."""
    print(f"device {result.device}, {result.dtype}, compiled: {result.compiled}, micro-batch {result.micro_batch} "
          f"x {result.size['max_len']} tokens, peak {result.peak_tflops or 'n/a'} TFLOP/s")
    for reason in result.skipped:
        print(f"skipped: {reason}")
    print(f"{'model':<8}{'tokens/s':>12}{'MFU':>8}{'course/this':>13}")
    for row in result.rows:
        mfu = f"{row.mfu:.1%}" if row.mfu is not None else "n/a"
        print(f"{row.name:<8}{row.tokens_per_s:>12,.0f}{mfu:>8}{row.course_over_this:>13.2f}")


def main(args: argparse.Namespace) -> int:
    """Time the contenders, print the table, and write it to ``--json`` when asked."""
    try:
        s = setting(args.dry_run)
        contenders = [course_contender(s.size), hf_contender(s.size)]
        if args.nanogpt:
            contenders.append(nanogpt_contender(s.size, Path(args.nanogpt)))
        else:
            s.skipped.append("nanogpt: no --nanogpt PATH to nanoGPT's model.py given")
        result = measure(contenders, s, rounds=args.rounds, steps=args.steps, batch=args.batch)
    except (OSError, ValueError, RuntimeError) as err:
        return fail(PROG, err)
    print_result(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    return 0


def add_parser(modes: argparse._SubParsersAction) -> None:
    """Register ``course-dev bench gpu``."""
    p = modes.add_parser("gpu", help="GPT-2 small's training tokens/s and MFU on the CUDA device: the course's GPT "
                         "vs Hugging Face's (and nanoGPT's), bf16, compiled, the largest micro-batch that fits")
    p.add_argument("--dry-run", action="store_true", help="the same code on the CPU at a tiny size")
    p.add_argument("--nanogpt", metavar="MODEL.PY", help="also time nanoGPT's model.py (from a clone)")
    p.add_argument("--batch", type=at_least_one, metavar="N",
                   help="micro-batch (default: the largest power of two that fits)")
    p.add_argument("--rounds", type=at_least_one, default=ROUNDS, metavar="N",
                   help=f"interleaved rounds (default {ROUNDS})")
    p.add_argument("--steps", type=at_least_one, default=5, metavar="N",
                   help="training steps per model and round (default 5)")
    p.add_argument("--json", metavar="FILE", help="write the result to this file")
    p.set_defaults(func=main)
