"""Training a model: batches, AdamW, warmup + cosine, checkpoints, throughput, one GPU or many.

The one trainer of the course: the GPT of lessons 07–09 on windows of a token tensor, and any
other model (lesson 10's encoder–decoder) on batches drawn by a function, with a loss function.
``train`` runs four named phases over one ``Run`` object: ``set_up`` (device, optimiser, resume),
``train_step`` (one optimiser step), ``evaluate`` / ``log`` (validation loss, training loss and
speed into the history) and ``save`` (an atomic checkpoint); the helpers above them are each one
idea. The device is ``runtime.device()`` (CUDA, then MPS, then the CPU) unless the caller says
where (``Dist``: ``course train`` under ``torchrun`` gives each process its own rank and device,
and DistributedDataParallel averages the gradients). On CUDA the trainer turns on what makes
training fast (bf16 autocast, TF32 matmuls, ``torch.compile``, fused AdamW); on MPS and the CPU
it stays in float32 and eager unless ``TrainConfig.compile`` says otherwise (fused AdamW on the
CPU too, the plain loop on MPS).

Shapes: ``B`` batch, ``T`` context length (``max_len``), ``V`` vocabulary, ``D`` model width.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from tqdm.auto import tqdm

from course_utils import counting, gpt, runtime
from course_utils.config import from_presets
from course_utils.tokenizer import Tokenizer, load_tokenizer

CHECKPOINT = "ckpt.pt"


# ---------------------------------------------------------------------------------------------
# Settings
DTYPES = ("auto", "bfloat16", "float32")


@dataclass(frozen=True)
class TrainConfig:
    """How to train (the model's shape lives in ``GPTConfig``). ``time_budget`` (seconds), when
    set, replaces ``max_iters``: the schedule stretches or shrinks so the run ends on time. Frozen
    like ``GPTConfig``: change a field with ``dataclasses.replace(cfg, lr=3e-4)`` (which validates again)."""

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
    compile: bool | None = None  # None: on for CUDA, off elsewhere (``compiles``)
    dtype: str = "auto"  # "auto" (bf16 on CUDA when supported), "bfloat16" or "float32"

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "weight_decay", "min_lr"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"TrainConfig.time_budget must be a positive number of seconds or None, "
                             f"got {self.time_budget}")
        if not 0 < self.lr or self.min_lr > self.lr:
            raise ValueError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}; "
                             "the schedule decays from lr down to min_lr")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"AdamW's beta1={self.beta1} and beta2={self.beta2} must lie in [0, 1)")
        if not self.grad_clip > 0:
            raise ValueError(f"TrainConfig.grad_clip must be positive (the largest gradient norm), "
                             f"got {self.grad_clip}")
        if self.dtype not in DTYPES:
            raise ValueError(f"TrainConfig.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TrainConfig:
        """Settings that go with ``GPTConfig.preset(name)`` (``course train --config name``); keyword
        arguments replace fields. An unknown name is a ValueError listing the known ones."""
        return from_presets(TRAIN_PRESETS, name, "training", **overrides)


TRAIN_PRESETS: dict[str, TrainConfig] = {
    "smoke": TrainConfig(batch_size=8, max_iters=30, lr=1e-2, min_lr=1e-3, warmup_iters=5, eval_interval=10,
                         eval_iters=2, log_interval=5),
    # tuned for 2 CPU cores: small batches, many steps, a high learning rate decaying to zero (at equal
    # steps, 1e-2 -> 0 beat 6e-3 -> 6e-4 by 0.014-0.026 in validation loss; README, Performance)
    "cpu": TrainConfig(batch_size=12, max_iters=2000, lr=1e-2, min_lr=0.0, warmup_iters=50,
                       eval_interval=500, eval_iters=20),
    # nanoGPT's shakespeare_char recipe
    "shakespeare_char": TrainConfig(batch_size=64, max_iters=5000, lr=1e-3, min_lr=1e-4, warmup_iters=100,
                                    eval_interval=250, eval_iters=200),
    # the shipped model (python -m course_tools.shipped_model): 4 blocks x width 128, context 128, on 1 CPU thread
    "shakespeare_char_small": TrainConfig(batch_size=12, max_iters=4000, lr=4e-3, min_lr=4e-4, warmup_iters=100,
                                          eval_interval=500, eval_iters=20),
    # GPT-2 small on 8 GPUs: 12 sequences x 1,024 tokens x 5 micro-steps x 8 processes ~ 0.5 M tokens
    # per step (grad_accum counts per process: on one GPU use --grad-accum 40 for the same batch)
    "gpt2": TrainConfig(batch_size=12, grad_accum=5, max_iters=600_000, lr=6e-4, min_lr=6e-5,
                        warmup_iters=2000, beta2=0.95, eval_interval=1000, eval_iters=200),
}


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


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware does it natively (CUDA, compute capability >= 8), else float32.
    MPS stays float32 too: its bf16 support depends on the macOS version, float32 works everywhere."""
    if cfg.dtype == "float32" or device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision context: matmuls in ``dtype``, weights and reductions stay float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# Data: a batch source draws one batch (a tuple of CPU tensors) from a generator; a loss function
# gives the model's mean loss on it. Language models use ``windows`` and ``lm_loss``.
Draw = Callable[[torch.Generator], tuple[torch.Tensor, ...]]
LossFn = Callable[..., torch.Tensor]  # loss_fn(model, *batch) -> scalar


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
    return shifted_windows(data, starts[rank * batch_size:(rank + 1) * batch_size], block_size)


def windows(data: torch.Tensor, batch_size: int, block_size: int, where: Dist = Dist()) -> Draw:
    """The batches of a language model: ``draw(generator)`` gives random windows (x, y) of the 1-D
    token tensor ``data`` (``get_batch``), this process's slice of them."""
    if data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor of token ids, got shape {tuple(data.shape)}; or pass a "
                         "function that draws a batch from a torch.Generator")
    return lambda gen: get_batch(data, batch_size, block_size, gen, where.rank, where.world_size)


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A language model's loss on windows x, y (B, T): ``model(x, y)`` returns ``(logits, loss)``."""
    return model(x, y)[1]


def shifted_windows(data: torch.Tensor, starts: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """data (N,), starts (B,) -> x (B, T) = data[s : s+T], y (B, T) = data[s+1 : s+T+1] for each start s."""
    spans = data[starts[:, None] + torch.arange(block_size + 1)]  # (B, T + 1)
    return spans[:, :-1], spans[:, 1:]


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
    PyTorch's fused kernel (on a CPU it is about 4x faster than the per-tensor loop)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             fused=device.type in ("cuda", "cpu"))


@torch.no_grad()
def mean_losses(model: nn.Module, draws: dict[str, Draw], loss_fn: LossFn, iters: int, seed: int,
                dtype: torch.dtype = torch.float32, where: Dist = Dist()) -> dict[str, float]:
    """Mean of ``loss_fn(model, *batch)`` over ``iters`` batches of each named source. The batches
    are the same at every call (a fixed seed), so successive estimates differ only because the
    model changed."""
    was_training = model.training
    model.eval()
    out = {}
    for name, draw in draws.items():
        gen = torch.Generator().manual_seed(seed)
        total = torch.zeros((), device=where.device)
        for _ in range(iters):
            batch = tuple(t.to(where.device) for t in draw(gen))
            with autocast(where.device, dtype):
                total += loss_fn(model, *batch).float()
        if where.world_size > 1:
            dist.all_reduce(total)
        out[name] = total.item() / (iters * where.world_size)
    model.train(was_training)
    return out


def estimate_loss(model: nn.Module, splits: dict[str, torch.Tensor], batch_size: int, block_size: int,
                  iters: int, seed: int, dtype: torch.dtype = torch.float32, where: Dist = Dist()) -> dict[str, float]:
    """A language model's mean loss over ``iters`` random windows (B, T) of each 1-D token tensor."""
    draws = {name: windows(data, batch_size, block_size, where) for name, data in splits.items()}
    return mean_losses(model, draws, lm_loss, iters, seed, dtype, where)


# ---------------------------------------------------------------------------------------------
# Checkpoints
CHECKPOINT_KEYS = ("model", "optimizer", "step", "elapsed", "history", "model_config", "train_config",
                   "tokenizer", "rng")


class CheckpointError(ValueError):
    """A file that is not a checkpoint written by ``train``: damaged, truncated, or something else."""


def save_checkpoint(path: str | os.PathLike, state: dict) -> None:
    """Write atomically: a temporary file in the same folder, then a rename, so a crash midway
    leaves the previous checkpoint intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint with ``weights_only=True``: tensors and plain containers, no pickled code.

    A missing file is a FileNotFoundError; an unreadable one, or one that is not a checkpoint of
    ``train``, a one-line CheckpointError (torch's own message is about zip records and opcodes).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}; train first (course train --out {path.parent})")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except OSError as err:  # permissions, I/O: the operating system's reason is the useful part
        raise CheckpointError(f"cannot read {path}: {err.strerror or type(err).__name__}") from None
    except Exception:  # any failure inside the unpickler or the zip reader means the same to a user
        raise CheckpointError(f"{path} is not a readable checkpoint (damaged, truncated, or not written by "
                              "course train); train again or point to another ckpt.pt") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint of course train; "
                              "point to the ckpt.pt that course train wrote")
    missing = [key for key in CHECKPOINT_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{path} is not a checkpoint of course train (it lacks {', '.join(missing)}); "
                              "point to the ckpt.pt that course train wrote")
    return state


def load_model(path: str | os.PathLike, device: str | torch.device | None = None) -> tuple[gpt.GPT, Tokenizer]:
    """(model in eval mode on ``device``, default ``runtime.device()``; its tokenizer) from a checkpoint."""
    device = runtime.device() if device is None else torch.device(device)
    ckpt = load_checkpoint(path, map_location=device)
    if ckpt["tokenizer"] is None:
        raise CheckpointError(f"{path} holds no tokenizer (it was trained without one), so text cannot be "
                              "decoded; train with course train, which stores it")
    return model_from_state(ckpt, device)


def model_from_state(state: dict, device: str | torch.device) -> tuple[gpt.GPT, Tokenizer]:
    """(GPT in eval mode on ``device``, tokenizer) from the ``model_config``, ``model`` and ``tokenizer``
    entries of a checkpoint or of a shipped model's file (``pretrained.load``): ``GPT.with_weights``,
    so the model is built without a random initialisation that the weights would overwrite."""
    model = gpt.GPT.with_weights(gpt.GPTConfig(**state["model_config"]), state["model"], copy=False)
    return model.to(device).eval(), load_tokenizer(state["tokenizer"])


def _device_rng_state(device: torch.device) -> torch.Tensor | None:
    """The random state of a GPU's own generator (dropout runs there); None on the CPU, whose
    state ``torch.get_rng_state`` already holds."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "mps":
        return torch.mps.get_rng_state()
    return None


def _set_device_rng_state(device: torch.device, state: torch.Tensor | None) -> None:
    if state is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    elif state is not None and device.type == "mps":
        torch.mps.set_rng_state(state)


# ---------------------------------------------------------------------------------------------
# The run: its state, and the phases that advance it
@dataclass
class History:
    """The curves of a run, one list per quantity. Per optimiser step: ``step``, its training
    ``loss`` and ``lr``. Per evaluation: ``eval_step``, the mean ``train_loss`` and ``val_loss``,
    the seconds it took (``eval_time``) and when it ended since the run began (``eval_elapsed``).
    Per logging window: ``tokens_per_s``. A checkpoint stores it as a dict of lists (``asdict``)."""

    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    eval_time: list[float] = field(default_factory=list)
    eval_elapsed: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)

    @classmethod
    def from_dict(cls, saved: dict[str, list]) -> History:
        """The history a checkpoint stored; a list that did not exist yet when it was written (older
        files have no ``eval_elapsed``) starts empty."""
        unknown = sorted(set(saved) - {f.name for f in fields(cls)})
        if unknown:
            raise CheckpointError(f"the checkpoint's history has lists this trainer does not know "
                                  f"({', '.join(unknown)}); load it with the version of the course that wrote it")
        return cls(**{name: list(values) for name, values in saved.items()})


@dataclass
class TrainResult:
    """What a run leaves behind: the loss curves, the final estimate and the speed (``nan`` speeds
    when no optimiser step ran in this call, e.g. a time budget used up by set-up and evaluation;
    ``nan`` TFLOP/s for a model that is not a GPT, whose FLOPs are not counted)."""

    history: History = field(default_factory=History)
    step: int = 0
    val_loss: float = float("nan")
    tokens_per_s: float = float("nan")
    tflops: float = float("nan")
    elapsed: float = 0.0


@dataclass
class SpeedMeter:
    """Training tokens per second, timed in windows of ``log_interval`` steps; time spent
    evaluating inside a window is left out."""

    start: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    paused: float = 0.0
    windows: list[tuple[int, float]] = field(default_factory=list)  # (tokens, seconds) per closed window

    def restart(self) -> None:
        self.start, self.tokens, self.paused = time.perf_counter(), 0, 0.0

    def close_window(self) -> float | None:
        """End the current window and return its tokens/s; None when it holds no step."""
        tokens, seconds = self.tokens, max(time.perf_counter() - self.start - self.paused, 1e-9)
        self.restart()
        if tokens == 0:
            return None
        self.windows.append((tokens, seconds))
        return tokens / seconds

    def rate(self) -> float:
        """Tokens/s over the closed windows, the first (compilation, warm-up) left out when there
        are others; ``nan`` when no step was timed."""
        timed = self.windows[1:] or self.windows
        return sum(t for t, _ in timed) / sum(s for _, s in timed) if timed else float("nan")


@dataclass
class Run:
    """Everything one call of ``train`` works on. ``set_up`` fills it; the phases advance ``step``,
    ``history`` and the generators, which with the weights are what a checkpoint stores."""

    cfg: TrainConfig
    raw: nn.Module  # the model itself: its state_dict is what checkpoints hold
    model: nn.Module  # what the steps call: ``raw``, compiled and/or wrapped in DDP once ``set_up`` is done
    optimizer: torch.optim.Optimizer
    where: Dist
    dtype: torch.dtype  # autocast precision: bfloat16 or float32
    draws: dict[str, Draw]  # "train" and, when there is validation data, "val"
    loss_fn: LossFn
    batches: torch.Generator  # draws the training batches; the same on every rank
    start: float  # perf_counter() at which the run's elapsed time was 0 (earlier for a resumed run)
    tokenizer: Tokenizer | None = None
    out_dir: Path | None = None
    step: int = 0
    max_steps: int = 0
    history: History = field(default_factory=History)
    pending: list[torch.Tensor] = field(default_factory=list)  # step losses still on the device
    meter: SpeedMeter = field(default_factory=SpeedMeter)

    @property
    def evaluates(self) -> bool:
        return "val" in self.draws

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def _draw(data: torch.Tensor | Draw, cfg: TrainConfig, model: nn.Module, where: Dist) -> Draw:
    """A batch source: the function given, or the windows of a 1-D token tensor (T = model.config.max_len)."""
    if callable(data):
        return data
    config: Any = model.config  # a language model's: GPTConfig, or any config with max_len
    return windows(data, cfg.batch_size, config.max_len, where)


def set_up(model: nn.Module, train_data: torch.Tensor | Draw, val_data: torch.Tensor | Draw | None,
           cfg: TrainConfig, *, loss_fn: LossFn = lm_loss, tokenizer: Tokenizer | None = None,
           out_dir: str | os.PathLike | None = None, resume: dict | None = None, clock: float | None = None,
           where: Dist | None = None) -> Run:
    """Phase 1: device, precision, optimiser and generators, then the state of ``resume`` if given.
    ``clock`` is when the run started (a time budget counts set-up too)."""
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"cannot store a {type(tokenizer).__name__} in a checkpoint; use CharTokenizer or "
                        "BPETokenizer (or a class with kind, vocab_size, encode, decode and to_dict)")
    where = Dist(device=runtime.device()) if where is None else where
    if where.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    raw = model.to(where.device)
    draws = {"train": _draw(train_data, cfg, raw, where)}
    if val_data is not None:
        draws["val"] = _draw(val_data, cfg, raw, where)
    run = Run(cfg, raw, raw, make_optimizer(raw, cfg, where.device), where, autocast_dtype(cfg, where.device),
              draws, loss_fn, torch.Generator().manual_seed(cfg.seed),
              start=time.perf_counter() if clock is None else clock, tokenizer=tokenizer,
              out_dir=Path(out_dir) if out_dir is not None else None, max_steps=cfg.max_iters)
    torch.manual_seed(cfg.seed + where.rank)  # dropout differs per rank
    if resume is not None:
        _restore(run, resume)
    run.model = _wrap(raw, cfg, where)
    return run
def _restore(run: Run, ckpt: dict) -> None:
    """Put a checkpoint's weights, optimiser moments, step, history and random states into ``run``."""
    run.raw.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.step, run.history = ckpt["step"], History.from_dict(ckpt["history"])
    run.start -= ckpt["elapsed"]
    run.batches.set_state(ckpt["rng"]["batches"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    _set_device_rng_state(run.where.device, ckpt["rng"].get("device"))


def compiles(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether ``train`` runs the model through ``torch.compile``: ``cfg.compile`` when set; else on
    CUDA only (on a CPU compiling costs minutes that short runs never win back; ``course train``
    decides by the time budget; MPS's back-end is experimental)."""
    return cfg.compile if cfg.compile is not None else device.type == "cuda"


def _wrap(raw: nn.Module, cfg: TrainConfig, where: Dist) -> nn.Module:
    """The module the steps call: ``torch.compile``d when ``compiles`` says so, and DDP-wrapped with
    several processes."""
    model = raw
    if compiles(cfg, where.device):
        model = cast(nn.Module, torch.compile(raw))  # an OptimizedModule around raw
    if where.world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[where.device.index]
                                                    if where.device.type == "cuda" else None)
    return model


def train_step(run: Run) -> None:
    """Phase 2: one optimiser step at the scheduled learning rate, over ``grad_accum`` micro-batches
    (DDP all-reduces the gradients once, on the last one), with clipping by the global norm."""
    cfg, where = run.cfg, run.where
    lr = lr_at(run.step, run.max_steps, cfg.lr, cfg.min_lr, cfg.warmup_iters)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=where.device)
    for micro in range(cfg.grad_accum):
        batch = tuple(t.to(where.device, non_blocking=True) for t in run.draws["train"](run.batches))
        sync = micro == cfg.grad_accum - 1 or where.world_size == 1
        no_sync = contextlib.nullcontext if sync else cast(nn.parallel.DistributedDataParallel, run.model).no_sync
        with no_sync(), autocast(where.device, run.dtype):
            loss = run.loss_fn(run.model, *batch)
        (loss / cfg.grad_accum).backward()
        loss_sum += loss.detach().float() / cfg.grad_accum
        run.meter.tokens += batch[0].numel() * where.world_size  # tokens of the inputs (B·T for a language model)
    nn.utils.clip_grad_norm_(run.raw.parameters(), cfg.grad_clip)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.pending.append(loss_sum)  # no .item() here: that would wait for the GPU at every step
    run.history.step.append(run.step)
    run.history.lr.append(lr)
    run.step += 1


def _flush(run: Run) -> None:
    """Copy the pending step losses into the history (one wait for the device; averaged over ranks)."""
    if run.pending:
        losses = torch.stack(run.pending)
        if run.where.world_size > 1:
            dist.all_reduce(losses)
            losses /= run.where.world_size
        run.history.loss.extend(losses.tolist())
        run.pending.clear()


def evaluate(run: Run) -> None:
    """Phase 3a: mean losses on fixed train and validation batches, into the history; the time it
    takes is left out of the speed."""
    _flush(run)
    t0 = time.perf_counter()
    losses = mean_losses(run.model, run.draws, run.loss_fn, run.cfg.eval_iters, run.cfg.seed + 1, run.dtype,
                         run.where)
    seconds = time.perf_counter() - t0
    h = run.history
    h.eval_step.append(run.step)
    h.train_loss.append(losses["train"])
    h.val_loss.append(losses["val"])
    h.eval_time.append(seconds)
    h.eval_elapsed.append(run.elapsed)  # since the run began
    run.meter.paused += seconds


def log(run: Run, bar: tqdm) -> None:
    """Phase 3b: the step losses into the history, the speed of the window since the last log."""
    _flush(run)
    rate = run.meter.close_window()
    if rate is None:
        return
    run.history.tokens_per_s.append(rate)
    bar.set_postfix(loss=f"{run.history.loss[-1]:.3f}", lr=f"{run.history.lr[-1]:.1e}", tok_s=f"{rate:,.0f}")
    bar.update(run.step - bar.n)


def save(run: Run) -> None:
    """Phase 4: an atomic checkpoint of everything needed to continue exactly (rank 0 writes it)."""
    if run.out_dir is None or not run.where.is_main:
        return
    config: Any = run.raw.config  # a dataclass: GPTConfig, or another model's config
    save_checkpoint(run.out_dir / CHECKPOINT, {
        "model": run.raw.state_dict(), "optimizer": run.optimizer.state_dict(), "step": run.step,
        "elapsed": run.elapsed, "history": asdict(run.history), "model_config": asdict(config),
        "train_config": asdict(run.cfg), "tokenizer": run.tokenizer.to_dict() if run.tokenizer is not None else None,
        "rng": {"batches": run.batches.get_state(), "torch": torch.get_rng_state(),
                "device": _device_rng_state(run.where.device)}})


def _plan_steps(step: int, spent: float, cfg: TrainConfig, history: History, where: Dist) -> int:
    """How many steps fit in the time budget, from the time per step so far; the final
    evaluation's time (as long as the longest so far) is kept in reserve. All ranks agree."""
    reserve = 1.25 * max(history.eval_time, default=0.0)
    if cfg.time_budget is None:
        raise ValueError("steps are planned from a time budget; set TrainConfig.time_budget")
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


def finish(run: Run, bar: tqdm) -> TrainResult:
    """The end of a call: the last losses and speed, a final evaluation when the schedule is done
    (not at a pause), a checkpoint, and the result with throughput and TFLOP/s (a GPT's)."""
    log(run, bar)
    if run.evaluates and run.step >= run.max_steps and run.step not in run.history.eval_step[-1:]:
        evaluate(run)
    save(run)
    bar.update(run.step - bar.n)
    bar.close()
    tok_s = run.meter.rate()
    config = getattr(run.raw, "config", None)
    tflops = (tok_s * counting.flops_per_token(config, config.max_len, training=True) / 1e12  # 6N + 12·L·T·D
              if isinstance(config, gpt.GPTConfig) else float("nan"))
    val_loss = run.history.val_loss[-1] if run.history.val_loss else float("nan")
    return TrainResult(run.history, run.step, val_loss, tok_s, tflops, run.elapsed)


def train(model: nn.Module, train_data: torch.Tensor | Draw, val_data: torch.Tensor | Draw | None,
          cfg: TrainConfig, *, loss_fn: LossFn = lm_loss, tokenizer: Tokenizer | None = None,
          out_dir: str | os.PathLike | None = None, resume: dict | None = None, until: int | None = None,
          progress: bool = True, where: Dist | None = None,
          on_step: Callable[[float], None] | None = None) -> TrainResult:
    """Train ``model`` and return its curves and speed.

    A language model (``model(x, y) -> (logits, loss)``, ``model.config.max_len``) trains on 1-D
    token tensors, in random windows. Any other model trains on batches drawn by a function,
    ``train_data(generator) -> tuple of tensors``, scored by ``loss_fn(model, *batch)``
    (``val_data`` likewise, or None: no evaluation). ``resume`` is a checkpoint dict to continue
    from (checkpoints store ``model.config``, a dataclass); ``until`` pauses after that step (with a
    checkpoint) while the schedule still plans for the whole run. ``where`` is the process and
    device (default: one process on ``runtime.device()``); ``on_step`` receives every optimiser
    step's seconds (``course train``'s thread tuner listens there)."""
    clock = time.perf_counter()  # the time budget counts set-up too (the first optimiser imports dynamo)
    run = set_up(model, train_data, val_data, cfg, loss_fn=loss_fn, tokenizer=tokenizer, out_dir=out_dir,
                 resume=resume, clock=clock, where=where)
    bar = tqdm(total=run.max_steps, initial=run.step, disable=not (progress and run.where.is_main), unit="step")
    run.model.train()
    run.meter.restart()
    while True:
        if run.step % cfg.eval_interval == 0 and run.step not in run.history.eval_step[-1:]:
            if run.evaluates:
                evaluate(run)
            if run.step > 0:
                save(run)
        if cfg.time_budget is not None:  # re-plan the schedule from the measured speed
            run.max_steps = bar.total = _plan_steps(run.step, run.elapsed, cfg, run.history, run.where)
        if run.step >= run.max_steps or (until is not None and run.step >= until):
            break
        started = time.perf_counter()
        train_step(run)
        if on_step is not None:
            on_step(time.perf_counter() - started)
        if run.step % cfg.log_interval == 0:
            log(run, bar)
    return finish(run, bar)
