"""The fixed parts of lesson 13's exercises 6 to 9, shared by the notebook and the grader: the model the
grader injects LoRA into, and the small chat model's task (its template, tokenizer, sizes and numbers).
Unlike the references, this module is in the grading sandbox, so the notebook's given cells import it."""

from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.sino_korean import TARGET_CHARS, read_number, read_number_formal, split_by_number
from course_utils.tokenizer import CharTokenizer

# ------------------------------------------------------------------ the model the grader injects LoRA into


class _ProbeBlock(nn.Module):
    """One block of the grader's model: a norm, four attention-like projections, a two-layer MLP."""

    def __init__(self, d: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.ModuleDict({k: nn.Linear(d, d, bias=bias) for k in ("q", "k", "v", "o")})
        self.mlp = nn.ModuleDict({"up": nn.Linear(d, hidden, bias=bias), "down": nn.Linear(hidden, d, bias=bias)})

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = self.norm(h)
        h = h + self.attn["o"](torch.tanh(self.attn["q"](a)) * self.attn["k"](a) + self.attn["v"](a))
        return h + self.mlp["down"](F.gelu(self.mlp["up"](self.norm(h))))


class ProbeModel(nn.Module):
    """A model the grader injects adapters into: an embedding, ``blocks`` blocks, a final norm and a head.
    Its layers are named ``blocks.0.attn.q`` ... ``blocks.0.mlp.down``, ``head``; its norms ``norm``."""

    def __init__(self, vocab: int, d: int, hidden: int, blocks: int, bias: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(_ProbeBlock(d, hidden, bias) for _ in range(blocks))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def probe_model(spec: dict) -> ProbeModel:
    """The grader's model of ``spec`` (vocab, d, hidden, blocks, bias), its weights drawn from ``spec["seed"]``."""
    torch.manual_seed(int(spec["seed"]))
    model = ProbeModel(int(spec["vocab"]), int(spec["d"]), int(spec["hidden"]), int(spec["blocks"]), bool(spec["bias"]))
    with torch.no_grad():  # norms away from 1 and 0, so that a replaced norm changes the output
        for name, p in model.named_parameters():
            if ".norm." in f".{name}":
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


# ------------------------------------------------------------------ the small chat model's task

CHAT_END = "\n"  # the answer's end marker


def chat_prompt(message: str) -> str:
    """The small chat model's template: the user's turn, then the header of the assistant's."""
    return f"user: {message}\nassistant: "


CHAT_TOKENIZER = CharTokenizer(chat_prompt("1234567890") + TARGET_CHARS + CHAT_END)
PAD_ID = CHAT_TOKENIZER.encode(" ")[0]
CHAT_SIZES = {"vocab_size": CHAT_TOKENIZER.vocab_size, "max_len": 40, "n_layers": 2, "n_heads": 4, "d_model": 64}


def chat_encode(text: str) -> list[int]:
    return CHAT_TOKENIZER.encode(text)


@lru_cache(maxsize=1)
def chat_numbers() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Lesson 10's numbers of 1-4 digits: (to train on, held out)."""
    splits = split_by_number(5000, 4, seed=0)
    return tuple(splits["train"]), tuple(splits["test"])


def formal_numbers() -> tuple[list[int], list[int]]:
    """The numbers whose formal reading differs from the everyday one (a silent 1 said as 일): to train on,
    held out."""
    train, held = chat_numbers()
    return ([n for n in train if read_number_formal(n) != read_number(n)],
            [n for n in held if read_number_formal(n) != read_number(n)])
