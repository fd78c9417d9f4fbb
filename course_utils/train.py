"""Training a GPT: batches, AdamW, warmup + cosine, checkpoints, throughput, one GPU or many.

``train`` is the whole loop and fits in one screen; the helpers above it are each one idea.
On CUDA it turns on what makes training fast (bf16 autocast, TF32 matmuls, ``torch.compile``,
fused AdamW); on a CPU it stays in float32 and eager mode. Under ``torchrun`` every process runs
this same code on its share of each batch and DistributedDataParallel averages the gradients.

Shapes: ``B`` batch, ``T`` context length (``max_len``), ``V`` vocabulary, ``D`` model width.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from course_utils import gpt
from course_utils.bpe import BPETokenizer

CHECKPOINT = "ckpt.pt"


# ---------------------------------------------------------------------------------------------
# Settings
@dataclass
class TrainConfig:
    """How to train (the model's shape lives in ``GPTConfig``). ``time_budget`` (seconds), when
    set, replaces ``max_iters``: the schedule stretches or shrinks so the run ends on time."""

    batch_size: int = 12
    grad_accum: int = 1
    max_iters: int = 2000
    time_budget: float | None = None
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    seed: int = 1337
    compile: bool | None = None  # None: on for CUDA, off elsewhere
    dtype: str = "auto"  # "auto" (bf16 on CUDA when supported), "bfloat16" or "float32"

    @classmethod
    def preset(cls, name: str) -> TrainConfig:
        """Settings that go with ``GPTConfig.preset(name)``."""
        if name not in TRAIN_PRESETS:
            raise ValueError(f"no training preset {name!r}; use one of {', '.join(TRAIN_PRESETS)}")
        return cls(**TRAIN_PRESETS[name])


TRAIN_PRESETS = {
    "smoke": dict(batch_size=8, max_iters=30, lr=1e-2, min_lr=1e-3, warmup_iters=5, eval_interval=10,
                  eval_iters=2, log_interval=5),
    # tuned for 2 CPU cores: small batches, many steps, a high learning rate
    "cpu": dict(batch_size=12, max_iters=2000, lr=6e-3, min_lr=6e-4, warmup_iters=50,
                eval_interval=500, eval_iters=20),
    # nanoGPT's shakespeare_char recipe
    "shakespeare_char": dict(batch_size=64, max_iters=5000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
                             eval_interval=250, eval_iters=200),
    # GPT-2 small on 8 GPUs: 12 sequences x 1,024 tokens x 5 micro-steps x 8 processes ~ 0.5 M tokens
    # per step (grad_accum counts per process: on one GPU use --grad-accum 40 for the same batch)
    "gpt2": dict(batch_size=12, grad_accum=5, max_iters=600_000, lr=6e-4, min_lr=6e-5,
                 warmup_iters=2000, beta2=0.95, eval_interval=1000, eval_iters=200),
}


# What `course train --config NAME` changes in GPTConfig.preset(NAME), besides the vocabulary: in a
# CPU's two minutes, 3 blocks with a context of 64 (nanoGPT's CPU recipe has 4 x 64) take more
# optimiser steps, and reach a lower validation loss, than 4 blocks with a context of 128.
MODEL_OVERRIDES = {"cpu": {"max_len": 64, "n_layers": 3}}


def model_config(name: str, vocab_size: int) -> gpt.GPTConfig:
    """The GPT that ``course train --config name`` trains, for a tokenizer of ``vocab_size`` tokens."""
    return gpt.GPTConfig.preset(name, vocab_size=vocab_size, **MODEL_OVERRIDES.get(name, {}))


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
        raise ValueError(f"a time budget must be positive, got {text!r}")
    return seconds


# ---------------------------------------------------------------------------------------------
# Devices and processes
@dataclass(frozen=True)
class Dist:
    """Where this process runs: its rank among ``world_size`` processes, and its device."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """Join the process group when started by ``torchrun`` (NCCL on GPUs, gloo on CPUs)."""
    if "RANK" not in os.environ:
        return Dist(device=torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, device)


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware does it natively (CUDA, compute capability >= 8), else float32."""
    if cfg.dtype not in ("auto", "bfloat16", "float32"):
        raise ValueError(f"dtype must be auto, bfloat16 or float32, got {cfg.dtype!r}")
    if cfg.dtype == "float32" or device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision context: matmuls in ``dtype``, weights and reductions stay float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Data
def get_batch(data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator,
              rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Random contiguous windows of a 1-D token array: x (B, T) and y (B, T), y shifted by one.

    All processes draw the same ``world_size * B`` start positions and each keeps its own slice,
    so N processes with batch B see exactly what one process with batch N*B would see.
    """
    if data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor of token ids, got shape {tuple(data.shape)}")
    if len(data) < block_size + 1:
        raise ValueError(f"the data has {len(data)} tokens, fewer than block_size + 1 = {block_size + 1}; "
                         "use more text or a smaller max_len")
    starts = torch.randint(len(data) - block_size, (world_size * batch_size,), generator=generator)
    starts = starts[rank * batch_size:(rank + 1) * batch_size]
    windows = data[starts[:, None] + torch.arange(block_size + 1)]  # (B, T + 1)
    return windows[:, :-1], windows[:, 1:]


# ---------------------------------------------------------------------------------------------
# Optimisation
def lr_at(step: int, max_steps: int, lr: float, min_lr: float, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then a cosine from ``lr`` down to ``min_lr`` at ``max_steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= max_steps:
        return min_lr
    progress = (step - warmup) / max(1, max_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norm gains or 1-D vectors);
    the fused CUDA kernel when on a GPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type == "cuda")


@torch.no_grad()
def estimate_loss(model: nn.Module, splits: dict[str, torch.Tensor], batch_size: int, block_size: int,
                  iters: int, seed: int, dtype: torch.dtype = torch.float32, where: Dist = Dist()) -> dict:
    """Mean loss over ``iters`` batches per split. The batches are the same at every call (a fixed
    seed), so successive estimates differ only because the model changed."""
    was_training = model.training
    model.eval()
    out = {}
    for name, data in splits.items():
        gen = torch.Generator().manual_seed(seed)
        total = torch.zeros((), device=where.device)
        for _ in range(iters):
            x, y = get_batch(data, batch_size, block_size, gen, where.rank, where.world_size)
            with autocast(where.device, dtype):
                _, loss = model(x.to(where.device), y.to(where.device))
            total += loss.float()
        if where.world_size > 1:
            dist.all_reduce(total)
        out[name] = total.item() / (iters * where.world_size)
    model.train(was_training)
    return out


# ---------------------------------------------------------------------------------------------
# Throughput: model FLOPs utilisation
# Dense peak TFLOP/s from the vendors' data sheets: (bf16/fp16 tensor cores, tf32 or fp32).
# More specific names first ("H100 PCIe" before "H100", "L40S" before "L4").
PEAK_TFLOPS = [
    ("H200", 989.0, 494.0),
    ("H100 PCIe", 756.0, 378.0),
    ("H100", 989.0, 494.0),
    ("A100", 312.0, 156.0),
    ("L40S", 362.0, 183.0),
    ("L4", 121.0, 60.0),
    ("RTX 4090", 165.2, 82.6),
    ("V100", 125.0, 15.7),
    ("T4", 65.0, 8.1),
]


def peak_tflops(device_name: str, dtype: torch.dtype) -> float | None:
    """The device's dense peak for ``dtype`` (bf16 column, else the tf32/fp32 one); None if unknown."""
    for key, low_precision, full in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return low_precision if dtype in (torch.bfloat16, torch.float16) else full
    return None


# ---------------------------------------------------------------------------------------------
# Checkpoints
def tokenizer_state(tokenizer) -> dict | None:
    """A tokenizer as plain lists/strings (char: its alphabet; bpe: its merges)."""
    if tokenizer is None:
        return None
    if isinstance(tokenizer, BPETokenizer):
        return tokenizer.to_dict()
    if hasattr(tokenizer, "chars"):
        return {"kind": "char", "chars": "".join(tokenizer.chars)}
    raise TypeError(f"cannot store a {type(tokenizer).__name__}; use CharTokenizer or BPETokenizer")


def tokenizer_from_state(state: dict):
    """Rebuild the tokenizer stored by ``tokenizer_state``."""
    if state["kind"] == "bpe":
        return BPETokenizer.from_dict(state)
    if state["kind"] == "char":
        from course_utils.tokenize import CharTokenizer

        return CharTokenizer(state["chars"])
    raise ValueError(f"unknown tokenizer kind {state['kind']!r} in the checkpoint")


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write atomically: a temporary file in the same folder, then a rename, so a crash midway
    leaves the previous checkpoint intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint with ``weights_only=True``: tensors and plain containers, no pickled code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train first (course train --out {path.parent})")
    return torch.load(path, map_location=map_location, weights_only=True)


# ---------------------------------------------------------------------------------------------
# The loop
@dataclass
class TrainResult:
    """What a run leaves behind: the loss curves, the final estimate and the speed."""

    history: dict = field(default_factory=dict)
    step: int = 0
    val_loss: float = float("nan")
    tokens_per_s: float = float("nan")
    tflops: float = float("nan")
    mfu: float | None = None
    elapsed: float = 0.0


def _new_history() -> dict:
    return {"step": [], "loss": [], "lr": [], "eval_step": [], "train_loss": [], "val_loss": [],
            "eval_time": [], "tokens_per_s": []}


def train(model: nn.Module, train_data: torch.Tensor, val_data: torch.Tensor, cfg: TrainConfig, *,
          tokenizer=None, out_dir: str | os.PathLike | None = None, resume: dict | None = None,
          until: int | None = None, progress: bool = True) -> TrainResult:
    """Train ``model`` (``model(x, y) -> (logits, loss)``, ``model.config`` a ``GPTConfig``) on 1-D
    token tensors. ``resume`` is a checkpoint dict to continue from; ``until`` pauses after that
    step (with a checkpoint) while the schedule still plans for the whole run."""
    clock = time.perf_counter()  # the time budget counts setup too (the first optimizer imports dynamo)
    where = setup_distributed()
    dtype = autocast_dtype(cfg, where.device)
    if where.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    mcfg = model.config
    raw = model.to(where.device)
    optimizer = make_optimizer(raw, cfg, where.device)
    batches = torch.Generator().manual_seed(cfg.seed)  # same on every rank: see get_batch
    torch.manual_seed(cfg.seed + where.rank)  # dropout differs per rank
    step, elapsed, history = 0, 0.0, _new_history()
    if resume is not None:
        raw.load_state_dict(resume["model"])
        optimizer.load_state_dict(resume["optimizer"])
        step, elapsed, history = resume["step"], resume["elapsed"], resume["history"]
        batches.set_state(resume["rng"]["batches"])
        torch.set_rng_state(resume["rng"]["torch"])
        if where.device.type == "cuda" and resume["rng"]["cuda"] is not None:
            torch.cuda.set_rng_state(resume["rng"]["cuda"])
    if cfg.compile if cfg.compile is not None else where.device.type == "cuda":
        model = torch.compile(raw)
    if where.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[where.device.index]
                                                    if where.device.type == "cuda" else None)
    splits = {"train": train_data, "val": val_data}
    T, B = mcfg.max_len, cfg.batch_size
    tokens_per_step = B * T * cfg.grad_accum * where.world_size
    flops = gpt.flops_per_token(mcfg, T, training=True)  # 6N + 12·L·T·D per token
    peak = peak_tflops(torch.cuda.get_device_name(where.device), dtype) if where.device.type == "cuda" else None

    def evaluate() -> float:
        t0 = time.perf_counter()
        losses = estimate_loss(model, splits, B, T, cfg.eval_iters, cfg.seed + 1, dtype, where)
        history["eval_step"].append(step)
        history["train_loss"].append(losses["train"])
        history["val_loss"].append(losses["val"])
        history["eval_time"].append(time.perf_counter() - t0)
        return history["eval_time"][-1]

    def flush() -> None:  # copy the pending losses to the history (.tolist() waits for the GPU)
        if pending:
            losses = torch.stack(pending)
            if where.world_size > 1:
                dist.all_reduce(losses)
                losses /= where.world_size
            history["loss"].extend(losses.tolist())
            pending.clear()

    def checkpoint() -> None:
        if out_dir is not None and where.is_main:
            save_checkpoint(Path(out_dir) / CHECKPOINT, {
                "model": raw.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "elapsed": elapsed, "history": history, "model_config": asdict(mcfg),
                "train_config": asdict(cfg), "tokenizer": tokenizer_state(tokenizer),
                "rng": {"batches": batches.get_state(), "torch": torch.get_rng_state(),
                        "cuda": torch.cuda.get_rng_state(where.device) if where.device.type == "cuda" else None}})

    max_steps = cfg.max_iters
    bar = tqdm(total=max_steps, initial=step, disable=not (progress and where.is_main), unit="step")
    pending: list[torch.Tensor] = []  # losses still on the device (no sync per step)
    start = clock - elapsed
    window_start, window_tokens, window_eval = time.perf_counter(), 0, 0.0
    model.train()
    while True:
        if step % cfg.eval_interval == 0 and step not in history["eval_step"][-1:]:
            flush()
            window_eval += evaluate()
            elapsed = time.perf_counter() - start
            if step > 0:
                checkpoint()
        if cfg.time_budget is not None:  # re-plan the schedule from the measured speed
            max_steps = _plan_steps(step, time.perf_counter() - start, cfg, history, where)
            bar.total = max_steps
        if step >= max_steps or (until is not None and step >= until):
            break
        lr = lr_at(step, max_steps, cfg.lr, cfg.min_lr, cfg.warmup_iters)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=where.device)
        for micro in range(cfg.grad_accum):
            x, y = get_batch(train_data, B, T, batches, where.rank, where.world_size)
            x, y = x.to(where.device, non_blocking=True), y.to(where.device, non_blocking=True)
            sync = micro == cfg.grad_accum - 1 or where.world_size == 1  # all-reduce once per step
            with (contextlib.nullcontext() if sync else model.no_sync()), autocast(where.device, dtype):
                _, loss = model(x, y)
            (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach().float() / cfg.grad_accum
        nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        pending.append(loss_sum)
        history["step"].append(step)
        history["lr"].append(lr)
        step += 1
        window_tokens += tokens_per_step
        if step % cfg.log_interval == 0:
            flush()
            now = time.perf_counter()
            history["tokens_per_s"].append(window_tokens / max(now - window_start - window_eval, 1e-9))
            window_start, window_tokens, window_eval = now, 0, 0.0
            bar.set_postfix(loss=f"{history['loss'][-1]:.3f}", lr=f"{lr:.1e}",
                            tok_s=f"{history['tokens_per_s'][-1]:,.0f}")
            bar.update(step - bar.n)
        elapsed = time.perf_counter() - start
    flush()
    if step >= max_steps and step not in history["eval_step"][-1:]:  # the end, not a pause
        evaluate()
    elapsed = time.perf_counter() - start
    checkpoint()
    bar.update(step - bar.n)
    bar.close()
    # Windows hold equal numbers of tokens, so the overall rate is their harmonic mean; the first
    # window (compilation, warm-up) is left out when there are others.
    speeds = history["tokens_per_s"][1:] or history["tokens_per_s"]
    tok_s = len(speeds) / sum(1 / v for v in speeds) if speeds else float("nan")
    tflops = tok_s * flops / 1e12
    return TrainResult(history, step, history["val_loss"][-1], tok_s, tflops,
                       tflops / peak if peak else None, elapsed)


def _plan_steps(step: int, spent: float, cfg: TrainConfig, history: dict, where: Dist) -> int:
    """How many steps fit in the time budget, from the time per step so far; the final
    evaluation's time (as long as the longest so far) is kept in reserve. All ranks agree."""
    reserve = 1.25 * max(history["eval_time"], default=0.0)
    left = cfg.time_budget - spent - reserve
    if step < 3:  # no reliable speed yet: plan with max_iters
        total = cfg.max_iters if left > 0 else step
    else:
        total = step + max(0, int(left / (spent / step)))
    if where.world_size > 1:
        t = torch.tensor([total], device=where.device)
        dist.broadcast(t, src=0)
        total = int(t.item())
    return total


# ---------------------------------------------------------------------------------------------
# Command line: course train, course sample
def load_corpus(spec: str) -> str:
    """``"shakespeare"`` (the course corpus) or the path of a UTF-8 text file."""
    from course_utils import data

    return data.shakespeare() if spec == "shakespeare" else data.load_text(spec)


def build_tokenizer(kind: str, text: str, bpe_vocab: int = 512):
    """A character tokenizer of ``text``, or a byte-level BPE trained on it."""
    if kind == "char":
        from course_utils.tokenize import CharTokenizer

        return CharTokenizer(text)
    if kind == "bpe":
        return BPETokenizer.train(text, bpe_vocab)
    raise ValueError(f"unknown tokenizer {kind!r}; use char or bpe")


def run_train(args: argparse.Namespace) -> int:
    """``course train``: build or resume everything from the arguments, train, report."""
    from course_utils.data import train_val_split

    where = setup_distributed()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out or Path("runs") / args.config)
    text = load_corpus(args.data)
    overrides = {k: v for k, v in (("max_iters", args.max_iters), ("batch_size", args.batch_size),
                                    ("grad_accum", args.grad_accum), ("lr", args.lr), ("seed", args.seed),
                                    ("compile", args.compile)) if v is not None}
    if args.time_budget is not None:
        overrides["time_budget"] = parse_duration(args.time_budget)
    resume = load_checkpoint(out / CHECKPOINT) if args.resume else None
    if resume is not None:
        tokenizer = tokenizer_from_state(resume["tokenizer"])
        mcfg = gpt.GPTConfig(**resume["model_config"])
        cfg = TrainConfig(**{**resume["train_config"], **overrides})
    else:
        train_text, _ = train_val_split(text)
        tokenizer = build_tokenizer(args.tokenizer, train_text if args.tokenizer == "bpe" else text,
                                    args.bpe_vocab)
        mcfg = model_config(args.config, tokenizer.vocab_size)
        cfg = TrainConfig(**{**asdict(TrainConfig.preset(args.config)), **overrides})
    tokens = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train_data, val_data = train_val_split(tokens)
    torch.manual_seed(cfg.seed)
    model = gpt.GPT(mcfg)
    if where.is_main:
        print(f"{args.config}: {sum(p.numel() for p in model.parameters()):,} parameters, "
              f"{tokenizer!r}, {len(train_data):,} train / {len(val_data):,} val tokens, "
              f"{where.world_size} process(es) on {where.device}")
    result = train(model, train_data, val_data, cfg, tokenizer=tokenizer, out_dir=out, resume=resume,
                   progress=not args.quiet)
    if where.is_main:
        mfu = f"{100 * result.mfu:.1f}%" if result.mfu is not None else "n/a (unknown peak)"
        print(f"step {result.step}: val loss {result.val_loss:.4f} (train {result.history['train_loss'][-1]:.4f}) "
              f"in {result.elapsed:.1f} s; {result.tokens_per_s:,.0f} tokens/s, "
              f"{result.tflops:.3g} TFLOP/s, MFU {mfu}; checkpoint {out / CHECKPOINT}")
    if dist.is_initialized():
        dist.barrier()  # every rank done (rank 0 was writing the checkpoint) before tearing down
        dist.destroy_process_group()
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course train``."""
    p = sub.add_parser("train", help="train a GPT on a text (one GPU, a CPU, or many GPUs under torchrun)")
    p.add_argument("--data", default="shakespeare", help="'shakespeare' (the course corpus) or PATH.txt")
    p.add_argument("--config", default="cpu", choices=list(TRAIN_PRESETS),
                   help="model + training preset (default cpu)")
    p.add_argument("--tokenizer", default="char", choices=["char", "bpe"])
    p.add_argument("--bpe-vocab", type=int, default=512, help="vocabulary size of the BPE (default 512)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-iters", type=int, help="number of optimiser steps")
    budget.add_argument("--time-budget", help="wall-clock budget, e.g. 110s or 5m; the schedule fits it")
    p.add_argument("--batch-size", type=int, help="sequences per micro-batch and process")
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimiser step and process")
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--seed", type=int)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model (default: on CUDA only)")
    p.add_argument("--threads", type=int, help="CPU threads for PyTorch (default: its own choice); "
                   "1 is fastest for small models on a busy, shared machine")
    p.add_argument("--out", help="folder for ckpt.pt (default runs/CONFIG)")
    p.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run_train)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """(model in eval mode, tokenizer) from a checkpoint written by ``train``."""
    ckpt = load_checkpoint(path, map_location=device)
    model = gpt.GPT(gpt.GPTConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    if ckpt["tokenizer"] is None:
        raise ValueError(f"{path} holds no tokenizer; it was trained without one, so text cannot be decoded")
    return model.to(device).eval(), tokenizer_from_state(ckpt["tokenizer"])


def run_sample(args: argparse.Namespace) -> int:
    """``course sample``: continue a prompt with a trained checkpoint."""
    from course_utils.generate import generate

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model(args.ckpt, device)
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise SystemExit("the prompt is empty; give at least one character, e.g. --prompt '\\n'")
    idx = torch.tensor([prompt] * args.num_samples, device=device)
    out = generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed)
    for row in out.tolist():
        print(tokenizer.decode(row))
        print("-" * 40)
    return 0


def add_sample_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course sample``."""
    p = sub.add_parser("sample", help="generate text from a checkpoint written by course train")
    p.add_argument("--ckpt", required=True, help="path of ckpt.pt")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_sample)
