"""``course train``: train a GPT from the command line (one GPU, a CPU, or many GPUs under torchrun).

This module turns arguments into the objects ``course_utils.train.train`` takes (corpus, tokenizer,
model and training configs, or a checkpoint to resume) and reports the result in one line.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from course_tools.cli import process_group, tuning
from course_tools.cli.errors import USER_ERRORS, fail
from course_utils import counting, data, gpt, train
from course_utils.bpe import BPETokenizer
from course_utils.tokenizer import CharTokenizer, Tokenizer, load_tokenizer

PROG = "course train"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course train``."""
    p = sub.add_parser("train", help="train a GPT on a text (one GPU, a CPU, or many GPUs under torchrun)")
    p.add_argument("--data", default="shakespeare", help="'shakespeare' (the course corpus) or PATH.txt")
    p.add_argument("--config", default="cpu", choices=list(train.TRAIN_PRESETS),
                   help="model + training preset (default cpu)")
    p.add_argument("--tokenizer", default="char", choices=["char", "bpe"],
                   help="characters, or a byte-pair encoding learned from the text")
    p.add_argument("--bpe-vocab", type=int, default=512, help="vocabulary size of the BPE (default 512)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-iters", type=int, help="number of optimiser steps")
    budget.add_argument("--time-budget", help="wall-clock budget, e.g. 110s or 5m; the schedule fits it")
    p.add_argument("--batch-size", type=int, help="sequences per micro-batch and process")
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimiser step and process")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--seed", type=int,
                   help=f"seed of the initialisation and the batches (default {train.TrainConfig.seed})")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on CUDA; on a CPU when --time-budget is at least "
                   f"{tuning.CPU_COMPILE_BREAK_EVEN:.0f} s, where the faster steps repay the compile time)")
    p.add_argument("--threads", type=int, help="CPU threads for PyTorch (default on a CPU: measured: a few steps on "
                   "one thread and on all cores, the faster kept, back to one thread if other processes take a core)")
    p.add_argument("--out", help="folder for ckpt.pt (default runs/CONFIG)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def parse_duration(text: str | float) -> float:
    """``"110s"``, ``"5m"``, ``"1.5h"`` or a plain number of seconds -> seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*", str(text))
        if not m:
            raise ValueError(f"cannot read the duration {text!r}; write e.g. 90s, 5m or 1.5h")
        seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"a time budget must be positive, got {text!r}; write e.g. 90s, 5m or 1.5h")
    return seconds


def read_corpus(spec: str) -> str:
    """``"shakespeare"`` (the course corpus) or the path of a UTF-8 text file, which must hold text."""
    text = data.shakespeare() if spec == "shakespeare" else data.load_text(spec)
    if not text.strip():
        raise ValueError(f"{spec} holds no text; give a text file with at least a few thousand characters")
    return text


def build_tokenizer(kind: str, text: str, bpe_vocab: int = 512) -> Tokenizer:
    """A character tokenizer of ``text``, or a byte-level BPE trained on it."""
    if kind == "char":
        return CharTokenizer(text)
    if kind == "bpe":
        return BPETokenizer.train(text, bpe_vocab)
    raise ValueError(f"unknown tokenizer {kind!r}; use char or bpe")


def check_long_enough(spec: str, n_tokens: int, n_val: int, block_size: int) -> None:
    """Both parts of the split must hold at least one window of ``block_size + 1`` tokens."""
    if n_val < block_size + 1:
        raise ValueError(f"{spec} gives {n_tokens:,} tokens, too few for windows of {block_size} tokens: the "
                         f"validation part (the last 10 %) needs at least {block_size + 1}; use a text of at "
                         f"least {10 * (block_size + 2):,} tokens (with --tokenizer char: characters)")


@dataclass
class Job:
    """What ``course train`` hands to ``train.train``."""

    model: gpt.GPT
    train_data: torch.Tensor
    val_data: torch.Tensor
    cfg: train.TrainConfig
    tokenizer: Tokenizer
    resume: dict | None
    out: Path


def overrides(args: argparse.Namespace) -> dict:
    """The TrainConfig fields set on the command line."""
    given = {k: v for k, v in (("max_iters", args.max_iters), ("batch_size", args.batch_size),
                               ("grad_accum", args.grad_accum), ("lr", args.lr), ("seed", args.seed),
                               ("compile", args.compile)) if v is not None}
    if args.time_budget is not None:
        given["time_budget"] = parse_duration(args.time_budget)
    return given


def prepare(args: argparse.Namespace, where: train.Dist) -> Job:
    """Read the corpus, then build (or restore from OUT/ckpt.pt) the tokenizer, model and configs;
    whether to compile, when ``--compile`` is not given, follows ``tuning.compile_default``."""
    out = Path(args.out or Path("runs") / args.config)
    text = read_corpus(args.data)
    changes = overrides(args)
    resume = train.load_checkpoint(out / train.CHECKPOINT) if args.resume else None
    if resume is not None:
        if resume["tokenizer"] is None:
            raise ValueError(f"{out / train.CHECKPOINT} holds no tokenizer (train.train was called without one); "
                             "train afresh without --resume")
        tokenizer = load_tokenizer(resume["tokenizer"])
        mcfg = gpt.GPTConfig(**resume["model_config"])
        cfg = train.TrainConfig(**{**resume["train_config"], **changes})
    else:
        train_text, _ = data.train_val_split(text)
        tokenizer = build_tokenizer(args.tokenizer, train_text if args.tokenizer == "bpe" else text, args.bpe_vocab)
        mcfg = gpt.GPTConfig.preset(args.config, vocab_size=tokenizer.vocab_size)
        cfg = train.TrainConfig.preset(args.config, **changes)
    if cfg.compile is None:
        cfg = replace(cfg, compile=tuning.compile_default(cfg.time_budget, where.device))
    tokens = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_data, val_data = data.train_val_split(tokens)
    check_long_enough(args.data, len(tokens), len(val_data), mcfg.max_len)
    torch.manual_seed(cfg.seed)
    return Job(gpt.GPT(mcfg), train_data, val_data, cfg, tokenizer, resume, out)


def summary(job: Job, result: train.TrainResult, where: train.Dist) -> str:
    """The closing line: losses, time, speed (or why there is none), and where the checkpoint is."""
    losses = (f"step {result.step}: val loss {result.val_loss:.4f} (train {result.history.train_loss[-1]:.4f}) "
              f"in {result.elapsed:.1f} s")
    if math.isnan(result.tokens_per_s):  # no optimiser step ran in this call: nothing was timed
        why = (f"the time budget of {job.cfg.time_budget:g} s went to set-up and evaluation; give a larger "
               "--time-budget" if job.cfg.time_budget is not None else
               f"the run had already reached {job.cfg.max_iters} steps; raise --max-iters to continue")
        speed = f"no training step ran ({why})"
    else:
        utilisation = tuning.mfu(result.tflops, where.device, train.autocast_dtype(job.cfg, where.device))
        mfu = f"{100 * utilisation:.1f}%" if utilisation is not None else "n/a (unknown peak)"
        speed = f"{result.tokens_per_s:,.0f} tokens/s, {result.tflops:.3g} TFLOP/s, MFU {mfu}"
    return f"{losses}; {speed}; checkpoint {job.out / train.CHECKPOINT}"


def run(args: argparse.Namespace) -> int:
    """``course train``: the processes (``process_group``) and threads (``tuning``), then everything
    else from the arguments; train; report; leave the process group."""
    where = process_group.join()
    try:
        tuner = tuning.choose_threads(args.threads, where)
        job = prepare(args, where)
    except USER_ERRORS as err:
        process_group.leave()
        return fail(PROG, err)
    if where.is_main:
        print(f"{args.config}: {counting.count_params(job.model.config):,} parameters, {job.tokenizer!r}, "
              f"{len(job.train_data):,} train / {len(job.val_data):,} val tokens, "
              f"{where.world_size} process(es) on {where.device}")
    result = train.train(job.model, job.train_data, job.val_data, job.cfg, tokenizer=job.tokenizer, out_dir=job.out,
                         resume=job.resume, progress=not args.quiet, where=where,
                         on_step=None if tuner is None else tuner.observe)
    if where.is_main:
        if tuner is not None:
            print("threads: " + "; then ".join(tuner.log or ["1 (too few steps to measure)"]))
        print(summary(job, result, where))
    process_group.leave()
    return 0
