"""What a GPT is made of: ``GPTConfig`` (its sizes and components) and the named presets.

One name, one config: ``GPTConfig.preset("cpu")`` is exactly the model that
``course train --config cpu`` trains (only the vocabulary follows the tokenizer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORMS = ("layernorm", "rmsnorm", "none")
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


Config = TypeVar("Config")


def from_presets(presets: Mapping[str, Config], name: str, what: str, **overrides: Any) -> Config:
    """The config named ``name`` in a registry of frozen dataclass instances, with ``overrides``
    replacing fields: one behaviour, and one error, for ``GPTConfig.preset`` and ``TrainConfig.preset``."""
    if name not in presets:
        hint = f"presets are spelled with underscores, use {name.replace('-', '_')!r}; " if "-" in name else ""
        raise ValueError(f"no {what} preset named {name!r}; {hint}known presets: {', '.join(presets)}")
    return dataclasses.replace(presets[name], **overrides)  # type: ignore[type-var]


@dataclass(frozen=True)
class GPTConfig:
    """The sizes and the components of a GPT; the defaults are GPT-2's.

    ``d_ff`` defaults to 4·d_model. Components: ``activation`` of the feed-forward network
    ("gelu_tanh" is GPT-2's, "swiglu" LLaMA's, "none" removes the network), ``norm``
    ("layernorm", "rmsnorm", "none"), ``position`` ("learned", "sinusoidal", "rope", "alibi",
    "none"), ``n_kv_heads`` (key/value heads for grouped-query attention; None = n_heads),
    ``bias`` (biases of the linear layers), ``residual`` (the "x +" of every sublayer) and
    ``tie_embeddings`` (the unembedding reuses the token embedding, or is its own ``lm_head``).
    ``sdpa`` picks how attention is computed: PyTorch's ``F.scaled_dot_product_attention``
    (True, fast) or the explicit softmax(q kᵀ/√d) v of lesson 02 (False); both give the same numbers.
    """

    vocab_size: int
    max_len: int
    n_layers: int
    n_heads: int
    d_model: int
    dropout: float = 0.0
    bias: bool = True
    d_ff: int | None = None
    activation: str = "gelu_tanh"
    eps: float = 1e-5
    n_kv_heads: int | None = None
    norm: str = "layernorm"
    position: str = "learned"
    residual: bool = True
    tie_embeddings: bool = True
    rope_base: float = 10000.0
    sdpa: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "n_heads", "d_model"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_layers < 0:
            raise ValueError(f"GPTConfig.n_layers must be >= 0 (0 is a bigram model), got {self.n_layers}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                             "pick a number of heads that divides d_model")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}; "
                             "use 1 (multi-query), a divisor of n_heads, or None (multi-head)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name, allowed in (("activation", (*ACTIVATIONS, "none")), ("norm", NORMS), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is not known; "
                                 f"use one of {', '.join(allowed)}")
        if self.position == "rope" and self.d_head % 2:
            raise ValueError(f"RoPE rotates pairs of features: the head size d_model/n_heads = "
                             f"{self.d_head} must be even; change n_heads or d_model")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads: ``n_kv_heads``, or ``n_heads`` when that is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def d_head(self) -> int:
        """The width of one head, d_model / n_heads."""
        return self.d_model // self.n_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named size, e.g. ``GPTConfig.preset("gpt2")``; keyword arguments replace fields. An unknown
        name is a ValueError listing the known ones."""
        return from_presets(PRESETS, name, "model", **overrides)


GPT2_VOCAB = 50_257
SHAKESPEARE_CHARS = 84  # distinct characters in the course corpus


def llama(vocab_size: int, max_len: int, n_layers: int, n_heads: int, d_model: int, d_ff: int,
          n_kv_heads: int | None = None, rope_base: float = 10000.0, eps: float = 1e-5,
          tie_embeddings: bool = False) -> GPTConfig:
    """Meta's LLaMA layout at the given sizes: RMSNorm, RoPE, SwiGLU, no biases, untied unembedding."""
    return GPTConfig(vocab_size, max_len, n_layers, n_heads, d_model, bias=False, d_ff=d_ff,
                     activation="swiglu", eps=eps, n_kv_heads=n_kv_heads, norm="rmsnorm", position="rope",
                     tie_embeddings=tie_embeddings, rope_base=rope_base)


PRESETS: dict[str, GPTConfig] = {
    # OpenAI's GPT-2 family (2019): context 1,024, byte-level BPE vocabulary of 50,257 tokens
    "gpt2": GPTConfig(GPT2_VOCAB, 1024, 12, 12, 768),
    "gpt2_medium": GPTConfig(GPT2_VOCAB, 1024, 24, 16, 1024),
    "gpt2_large": GPTConfig(GPT2_VOCAB, 1024, 36, 20, 1280),
    "gpt2_xl": GPTConfig(GPT2_VOCAB, 1024, 48, 25, 1600),
    # GPT-3 175B (2020): context 2,048, same vocabulary
    "gpt3": GPTConfig(GPT2_VOCAB, 2048, 96, 96, 12288),
    # Meta's LLaMA 2 (2023) and LLaMA 3 (2024), sizes from their published config.json files
    "llama2_7b": llama(32_000, 4096, 32, 32, 4096, 11_008),
    "llama2_70b": llama(32_000, 4096, 80, 64, 8192, 28_672, n_kv_heads=8),
    "llama3_8b": llama(128_256, 8192, 32, 32, 4096, 14_336, n_kv_heads=8, rope_base=500_000.0),
    # nanoGPT's character-level Shakespeare model
    "shakespeare_char": GPTConfig(SHAKESPEARE_CHARS, 256, 6, 6, 384, dropout=0.2),
    # the model that ships with the course (course_utils/pretrained): 4 blocks x 128, context 128
    "shakespeare_char_small": GPTConfig(SHAKESPEARE_CHARS, 128, 4, 4, 128),
    # `course train --config cpu`: in a CPU's two minutes, 3 blocks with a context of 64 take more
    # optimiser steps, and reach a lower validation loss, than 4 blocks with a context of 128
    "cpu": GPTConfig(SHAKESPEARE_CHARS, 64, 3, 4, 128),
    # the smallest model that is still a GPT, for tests and smoke runs
    "smoke": GPTConfig(SHAKESPEARE_CHARS, 32, 2, 2, 32),
}
