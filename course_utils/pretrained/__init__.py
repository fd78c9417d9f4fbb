"""Trained models that ship with the course, so lessons can decode with a GPT that writes.

Each model is two files in this folder: ``NAME.pt`` (weights, sizes and tokenizer; it loads with
``torch.load(weights_only=True)``) and ``NAME.json``, its card: the exact training command, the
sizes, the validation loss on a fixed slice of the corpus, the sha256 of ``NAME.pt`` and the date.
``python -m course_tools.pretrained`` trains and writes them.

Shapes: ``T`` = the model's ``max_len``, ``W`` windows of the fixed slice.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from course_utils import data, gpt
from course_utils.data import sha256_of
from course_utils.tokenize import Tokenizer, load_tokenizer

FOLDER = Path(__file__).resolve().parent
SLICE_WINDOWS = 512  # the fixed slice: the first 512 windows of T characters of the validation part


def names() -> list[str]:
    """The models shipped in this folder."""
    return sorted(p.stem for p in FOLDER.glob("*.json"))


def card(name: str) -> dict:
    """The card of a shipped model: how it was trained and what it scores."""
    path = FOLDER / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no shipped model named {name!r}; shipped: {', '.join(names()) or 'none'}")
    return json.loads(path.read_text(encoding="utf-8"))


def load(name: str = "shakespeare_char_small", device: str | torch.device = "cpu") -> tuple[gpt.GPT, Tokenizer]:
    """(model in eval mode, tokenizer) of a shipped model, after checking the file against its card."""
    info = card(name)
    path = FOLDER / info["file"]
    if sha256_of(path) != info["sha256"]:
        raise ValueError(f"{path} does not match the sha256 in its card; restore it (git checkout {path.name}) "
                         "or rebuild it with python -m course_tools.pretrained")
    state = torch.load(path, map_location=device, weights_only=True)
    model = gpt.GPT(gpt.GPTConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model.to(device).eval(), load_tokenizer(state["tokenizer"])


def fixed_slice(tokenizer: Tokenizer, max_len: int, windows: int = SLICE_WINDOWS,
                text: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs x (W, T) and targets y (W, T): consecutive, non-overlapping windows from the start of
    the validation part (the last 10 % of the course corpus), y shifted by one."""
    _, val_text = data.train_val_split(data.shakespeare() if text is None else text)
    ids = torch.tensor(tokenizer.encode(val_text[: windows * max_len + 1]), dtype=torch.long)
    if len(ids) < windows * max_len + 1:
        raise ValueError(f"the validation part holds {len(ids)} tokens, fewer than {windows} windows of {max_len}")
    return ids[:-1].view(windows, max_len), ids[1:].view(windows, max_len)


@torch.no_grad()
def validation_loss(model: gpt.GPT, tokenizer: Tokenizer, windows: int = SLICE_WINDOWS, batch_size: int = 64,
                    text: str | None = None) -> float:
    """Mean next-token cross-entropy (nats) over every position of the fixed slice: the same
    numbers on every machine, unlike the random batches of ``train.estimate_loss``."""
    x, y = fixed_slice(tokenizer, model.config.max_len, windows, text)
    device = next(model.parameters()).device
    total = 0.0
    for start in range(0, windows, batch_size):
        logits, _ = model(x[start:start + batch_size].to(device))
        total += F.cross_entropy(logits.flatten(0, 1).double(), y[start:start + batch_size].flatten().to(device),
                                 reduction="sum").item()
    return total / y.numel()
