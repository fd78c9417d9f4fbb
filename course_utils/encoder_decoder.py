"""The encoder–decoder Transformer of 2017: an encoder reads the source, a decoder writes the target
one token at a time and, in every block, looks back at the encoder's output through
cross-attention (교차 어텐션): queries from the decoder, keys and values from the encoder.

Shapes: ``B`` batch, ``S`` source positions, ``T`` target positions, ``D`` = d_model, ``H`` heads,
``V`` target vocabulary. Source padding masks are boolean (B, S) with **True = real token**
(``attention.padding_mask``'s convention); ``forward``'s ``src_pad`` follows PyTorch's
``key_padding_mask`` instead (True = padding), because it mirrors ``torch.nn.Transformer``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import (
    KVCache,
    MultiHeadAttention,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
    weights_kept,
)
from course_utils.blocks import FeedForward, LayerNorm, TransformerBlock, make_block
from course_utils.positional import LearnedPositionalEmbedding

PAD, BOS, EOS = 0, 1, 2


def key_mask(src_keep: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) True = real token -> (B, 1, 1, S), broadcastable over heads and queries."""
    return None if src_keep is None else src_keep[:, None, None, :]


class CrossAttention(nn.Module):
    """Multi-head attention whose queries come from ``x`` (the decoder) and whose keys and values
    come from ``memory`` (the encoder's output). Its W_Q, W_K, W_V, W_O (D -> D each) are laid out
    like ``MultiHeadAttention``'s, so one's state dict loads into the other.

    ``memory_kv`` takes the keys and values once projected by ``project_memory``: during generation
    the memory never changes, so they are computed once, not at every new token.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pick a number of heads "
                             "that divides d_model")
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.W_Q = nn.Linear(d_model, d_model, bias=bias)
        self.W_K = nn.Linear(d_model, d_model, bias=bias)
        self.W_V = nn.Linear(d_model, d_model, bias=bias)
        self.W_O = nn.Linear(d_model, d_model, bias=bias)

    def project_memory(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """memory (B, S, D) -> keys (B, H, S, d_k), values (B, H, S, d_v)."""
        return split_heads(self.W_K(memory), self.n_heads), split_heads(self.W_V(memory), self.n_heads)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                src_keep: torch.Tensor | None = None,
                memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, T, D), memory (B, S, D), src_keep (B, S) -> out (B, T, D)."""
        return self.forward_with_weights(x, memory, src_keep, memory_kv)[0]

    def forward_with_weights(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                             src_keep: torch.Tensor | None = None,
                             memory_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``forward``, also returning the weights: (out (B, T, D), weights (B, H, T, S))."""
        if memory is not None and memory_kv is None:
            k, v = self.project_memory(memory)
        elif memory is None and memory_kv is not None:
            k, v = memory_kv
        else:
            raise ValueError("pass exactly one of memory (B, S, D) or memory_kv (its projected keys and values)")
        q = split_heads(self.W_Q(x), self.n_heads)                    # (B, H, T, d_k)
        p = self.dropout if self.training else 0.0
        h, weights = scaled_dot_product_attention(q, k, v, key_mask(src_keep), dropout_p=p)
        return self.W_O(merge_heads(h)), weights


class DecoderBlock(nn.Module):
    """Causal self-attention, then cross-attention to the encoder, then the feed-forward network,
    each with a residual connection and a LayerNorm.

    Post-LN (``norm_first=False``, the 2017 paper): x = norm(x + sublayer(x)) three times.
    Pre-LN (``norm_first=True``): x = x + sublayer(norm(x)); the memory itself is not normalised here.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int | None = None, activation: str = "relu",
                 norm_first: bool = False, eps: float = 1e-5, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.norm1 = LayerNorm(d_model, eps)
        self.cross_attn = CrossAttention(d_model, n_heads, bias=bias, dropout=dropout)
        self.norm2 = LayerNorm(d_model, eps)
        self.ffn = FeedForward(d_model, d_ff, activation, bias, dropout)
        self.norm3 = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                src_keep: torch.Tensor | None = None, kv_cache: KVCache | None = None) -> torch.Tensor:
        """x (B, T, D), the block's projected memory (keys, values) -> (B, T, D).

        With ``kv_cache`` the T new positions attend to every earlier one kept in the cache. Every
        sublayer is called as a module, so hooks see it (``activations``).
        """
        def self_attn(h: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.self_attn(h, causal=True, kv_cache=kv_cache))

        def cross_attn(h: torch.Tensor) -> torch.Tensor:
            return self.dropout(self.cross_attn(h, src_keep=src_keep, memory_kv=memory_kv))

        if self.norm_first:
            x = x + self_attn(self.norm1(x))
            x = x + cross_attn(self.norm2(x))
            return x + self.ffn(self.norm3(x))
        x = self.norm1(x + self_attn(x))
        x = self.norm2(x + cross_attn(x))
        return self.norm3(x + self.ffn(x))

    def forward_with_weights(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                             src_keep: torch.Tensor | None = None,
                             kv_cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``forward``, also returning the cross-attention weights (B, H, T, S)."""
        with weights_kept([self.cross_attn]) as kept:
            out = self(x, memory_kv, src_keep, kv_cache)
        return out, kept[0]


class Stack(nn.Module):
    """Blocks and the LayerNorm after them: the encoder's or the decoder's half of ``Transformer``."""

    def __init__(self, blocks: Iterable[nn.Module], final_norm: LayerNorm) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm


class Transformer(nn.Module):
    """The encoder–decoder without embeddings: float vectors in, float vectors out.

    ``encoder`` holds ``blocks`` (``blocks.make_block``, no mask but the source padding) and
    ``final_norm``; ``decoder`` holds ``blocks`` (``DecoderBlock``) and ``final_norm``. As in
    ``torch.nn.Transformer``, both stacks end with a LayerNorm (needed after pre-LN blocks).
    ``n_encoder_layers=0`` leaves the encoder position-wise: memory position s is the normalised
    source vector s, unmixed with the others (lesson 10 uses it to see the alignment).
    """

    def __init__(self, d_model: int, n_heads: int, n_encoder_layers: int, n_decoder_layers: int,
                 d_ff: int | None = None, activation: str = "relu", norm_first: bool = False,
                 eps: float = 1e-5, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if n_encoder_layers < 0 or n_decoder_layers < 1:
            raise ValueError(f"n_encoder_layers={n_encoder_layers} must be at least 0 and "
                             f"n_decoder_layers={n_decoder_layers} at least 1")
        self.d_model, self.n_heads = d_model, n_heads
        self.encoder = Stack((make_block(d_model, n_heads, d_ff, activation, norm_first, eps, bias, dropout)
                              for _ in range(n_encoder_layers)), LayerNorm(d_model, eps))
        self.decoder = Stack((DecoderBlock(d_model, n_heads, d_ff, activation, norm_first, eps, bias, dropout)
                              for _ in range(n_decoder_layers)), LayerNorm(d_model, eps))

    def encode(self, src: torch.Tensor, src_keep: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S, D) -> memory (B, S, D); padded positions are never attended to."""
        mask = key_mask(src_keep)
        for block in self.encoder.blocks:
            src = block(src, mask=mask)
        return self.encoder.final_norm(src)

    def memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each decoder block's cross-attention keys and values of the memory, computed once."""
        return [block.cross_attn.project_memory(memory) for block in self.decoder_blocks()]

    def decoder_blocks(self) -> list[DecoderBlock]:
        """The decoder's blocks, typed (``decoder.blocks`` is an ``nn.ModuleList``)."""
        return cast("list[DecoderBlock]", list(self.decoder.blocks))

    def decode(self, tgt: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
               src_keep: torch.Tensor | None = None, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """tgt (B, T, D) -> (B, T, D)."""
        caches: list[KVCache | None] = list(kv_caches) if kv_caches else [None] * len(self.decoder.blocks)
        for block, kv, cache in zip(self.decoder.blocks, memory_kv, caches, strict=True):
            tgt = block(tgt, kv, src_keep, kv_cache=cache)
        return self.decoder.final_norm(tgt)

    def decode_with_weights(self, tgt: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
                            src_keep: torch.Tensor | None = None, kv_caches: list[KVCache] | None = None,
                            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Like ``decode``, also returning every block's cross-attention weights (B, H, T, S)."""
        with weights_kept([block.cross_attn for block in self.decoder_blocks()]) as maps:
            out = self.decode(tgt, memory_kv, src_keep, kv_caches)
        return out, maps

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_pad: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S, D), tgt (B, T, D), src_pad (B, S) True = padding -> (B, T, D).

        Equals ``torch.nn.Transformer(src, tgt, tgt_mask=causal, src_key_padding_mask=src_pad,
        memory_key_padding_mask=src_pad)``; the target's causal mask is built in.
        """
        if src.ndim != 3 or tgt.ndim != 3 or src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"expected src (B, S, {self.d_model}) and tgt (B, T, {self.d_model}), got "
                             f"{tuple(src.shape)} and {tuple(tgt.shape)}; embed token ids first")
        if src_pad is not None and (src_pad.dtype != torch.bool or src_pad.shape != src.shape[:2]):
            raise ValueError(f"src_pad must be a bool (B, S) = {tuple(src.shape[:2])} mask with True = padding, "
                             f"got {src_pad.dtype} {tuple(src_pad.shape)}")
        src_keep = None if src_pad is None else ~src_pad
        memory = self.encode(src, src_keep)
        return self.decode(tgt, self.memory_kv(memory), src_keep)


def _copy_linear(ours: nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    ours.weight.copy_(weight)
    if bias is not None:
        ours.bias.copy_(bias)


def _copy_attention(ours: MultiHeadAttention | CrossAttention, theirs: nn.MultiheadAttention) -> None:
    """nn.MultiheadAttention packs W_Q, W_K, W_V into one in_proj (3D, D); ours keeps them apart."""
    for name, w, b in zip(("W_Q", "W_K", "W_V"), theirs.in_proj_weight.chunk(3),
                          theirs.in_proj_bias.chunk(3) if theirs.in_proj_bias is not None else (None,) * 3,
                          strict=True):
        _copy_linear(getattr(ours, name), w, b)
    _copy_linear(ours.W_O, theirs.out_proj.weight, theirs.out_proj.bias)


def _copy_norm(ours: LayerNorm, theirs: nn.LayerNorm) -> None:
    ours.gamma.copy_(theirs.weight)
    ours.beta.copy_(theirs.bias)


def _copy_ffn(ours: FeedForward, theirs: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer) -> None:
    _copy_linear(ours.W_in, theirs.linear1.weight, theirs.linear1.bias)
    _copy_linear(ours.W_out, theirs.linear2.weight, theirs.linear2.bias)


def _activation_name(layer: nn.Module) -> str:
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or isinstance(act, nn.GELU):
        return "gelu"
    raise ValueError(f"activation {act!r} is not supported; build torch.nn.Transformer with 'relu' or 'gelu'")


@torch.no_grad()
def transformer_from_torch(ref: nn.Transformer) -> Transformer:
    """Our ``Transformer`` holding the weights of a ``torch.nn.Transformer`` (built with
    ``batch_first=True``), computing the same function in eval mode."""
    if not getattr(ref, "batch_first", False):
        raise ValueError("build the reference with torch.nn.Transformer(..., batch_first=True)")
    enc_layers, dec_layers = ref.encoder.layers, ref.decoder.layers
    first = enc_layers[0]
    model = Transformer(ref.d_model, ref.nhead, len(enc_layers), len(dec_layers),
                        d_ff=first.linear1.out_features, activation=_activation_name(first),
                        norm_first=first.norm_first, eps=first.norm1.eps, bias=first.linear1.bias is not None)
    for ours, theirs in zip(cast("list[TransformerBlock]", model.encoder.blocks), enc_layers, strict=True):
        _copy_attention(cast(MultiHeadAttention, ours.attn), theirs.self_attn)
        _copy_ffn(cast(FeedForward, ours.ffn), theirs)
        _copy_norm(cast(LayerNorm, ours.norm1), theirs.norm1)
        _copy_norm(cast(LayerNorm, ours.norm2), theirs.norm2)
    for block, theirs in zip(model.decoder_blocks(), dec_layers, strict=True):
        _copy_attention(block.self_attn, theirs.self_attn)
        _copy_attention(block.cross_attn, theirs.multihead_attn)
        _copy_ffn(block.ffn, theirs)
        for i in (1, 2, 3):
            _copy_norm(getattr(block, f"norm{i}"), getattr(theirs, f"norm{i}"))
    _copy_norm(model.encoder.final_norm, ref.encoder.norm)
    _copy_norm(model.decoder.final_norm, ref.decoder.norm)
    return model.eval()


# ------------------------------------------------------------------ the model on token ids

@dataclass(frozen=True)
class Seq2SeqConfig:
    """Sizes of an encoder–decoder over token ids (id 0 is <pad> in both vocabularies)."""

    src_vocab_size: int
    tgt_vocab_size: int
    src_max_len: int
    tgt_max_len: int
    d_model: int = 64
    n_heads: int = 4
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    d_ff: int | None = None
    dropout: float = 0.0
    norm_first: bool = True


class Embedding(nn.Module):
    """Token embedding plus a learned position: ids (B, L) -> (B, L, D)."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.token_embedding.weight, std=0.02)  # the size of the position rows
        self.position_embedding = LearnedPositionalEmbedding(max_len, d_model)

    def forward(self, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        return self.token_embedding(ids) + self.position_embedding(ids.shape[1], offset)


class EncoderDecoder(nn.Module):
    """Source ids -> encoder; target ids -> decoder with cross-attention -> logits over the target
    vocabulary. Submodules: ``src_embedding``, ``tgt_embedding``, ``transformer``, ``lm_head``."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        c = self.config = config
        self.src_embedding = Embedding(c.src_vocab_size, c.src_max_len, c.d_model)
        self.tgt_embedding = Embedding(c.tgt_vocab_size, c.tgt_max_len, c.d_model)
        self.transformer = Transformer(c.d_model, c.n_heads, c.n_encoder_layers, c.n_decoder_layers, c.d_ff,
                                       activation="gelu", norm_first=c.norm_first, dropout=c.dropout)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size)

    def encode(self, src: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """src ids (B, S) -> (each decoder block's cross-attention keys/values, src_keep (B, S))."""
        src_keep = src != PAD
        memory = self.transformer.encode(self.src_embedding(src), src_keep)
        return self.transformer.memory_kv(memory), src_keep

    def decode(self, tgt_in: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
               src_keep: torch.Tensor, kv_caches: list[KVCache] | None = None) -> torch.Tensor:
        """tgt_in ids (B, T) -> logits (B, T, V).

        With ``kv_caches`` the T ids continue the ones already cached (their positions start there).
        """
        offset = len(kv_caches[0]) if kv_caches else 0
        out = self.transformer.decode(self.tgt_embedding(tgt_in, offset), memory_kv, src_keep, kv_caches)
        return self.lm_head(out)

    def decode_with_weights(self, tgt_in: torch.Tensor, memory_kv: list[tuple[torch.Tensor, torch.Tensor]],
                            src_keep: torch.Tensor, kv_caches: list[KVCache] | None = None,
                            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Like ``decode``, also returning the cross-attention weights of every block (B, H, T, S)."""
        with weights_kept([block.cross_attn for block in self.transformer.decoder_blocks()]) as maps:
            logits = self.decode(tgt_in, memory_kv, src_keep, kv_caches)
        return logits, maps

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """src (B, S), tgt_in (B, T) ids -> logits (B, T, V)."""
        return self.decode(tgt_in, *self.encode(src))


def target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), targets (B, T) -> mean cross-entropy over the positions that are not <pad>."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=PAD)


def teacher_forcing_loss(model: EncoderDecoder, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """The decoder reads the true target shifted right, tgt[:, :-1] (<s> y1 ... yn), and is scored
    on predicting tgt[:, 1:] (y1 ... yn </s>) at every position in one pass. src (B, S), tgt (B, T)."""
    return target_loss(model(src, tgt[:, :-1]), tgt[:, 1:])


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: torch.Tensor, max_new: int, use_cache: bool = True) -> torch.Tensor:
    """src (B, S) -> generated ids (B, ≤ max_new) after <s>, arg-max at each step, <pad> after </s>.

    The encoder runs once; with ``use_cache`` each step feeds only the newest token and the decoder's
    self-attention keys/values of earlier tokens come from a KV cache.
    """
    memory_kv, src_keep = model.encode(src)
    B = src.shape[0]
    out = torch.full((B, 1), BOS, dtype=torch.long, device=src.device)
    caches = [KVCache() for _ in model.transformer.decoder.blocks] if use_cache else None
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    for _ in range(max_new):
        step_in = out[:, -1:] if use_cache else out
        logits = model.decode(step_in, memory_kv, src_keep, caches)[:, -1]
        nxt = logits.argmax(-1).masked_fill(done, PAD)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == EOS
        if bool(done.all()):
            break
    return out[:, 1:]


def _expand(x: torch.Tensor, k: int) -> torch.Tensor:
    """(B, ...) -> (B·k, ...): each row repeated k times in a row (beam b·k + j)."""
    return x.repeat_interleave(k, dim=0)


def beam_step(log_probs: torch.Tensor, scores: torch.Tensor, done: torch.Tensor,
              beam_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of beam search over B sources with K beams each.

    log_probs (B, K, V) of the next token, scores (B, K) summed log-probabilities so far, done (B, K)
    beams that ended. A finished beam keeps its score and can only extend with <pad>. Returns the new
    (scores (B, K), parent beam (B, K), token (B, K)): the K best of the K·V extensions.
    """
    B, K, V = log_probs.shape
    finished = torch.full((V,), float("-inf"), device=log_probs.device)
    finished[PAD] = 0.0
    log_probs = torch.where(done[..., None], finished, log_probs)
    total = (scores[..., None] + log_probs).reshape(B, K * V)
    new_scores, flat = total.topk(beam_size, dim=-1)
    return new_scores, flat // V, flat % V


@torch.no_grad()
def beam_search(model: EncoderDecoder, src: torch.Tensor, max_new: int, beam_size: int = 4) -> torch.Tensor:
    """src (B, S) -> the highest-scoring sequence per source (B, ≤ max_new), by summed log-probability.

    Keeps the ``beam_size`` best prefixes per source. The encoder's keys/values are computed once and
    shared by the beams; the decoder's KV caches follow each surviving beam's parent. At the start all
    beams are the same <s>, so only beam 0 is live.
    """
    memory_kv, src_keep = model.encode(src)
    B, K = src.shape[0], beam_size
    memory_kv = [(_expand(k, K), _expand(v, K)) for k, v in memory_kv]
    src_keep = _expand(src_keep, K)
    caches = [KVCache() for _ in model.transformer.decoder.blocks]
    seqs = torch.full((B, K, 1), BOS, dtype=torch.long, device=src.device)
    scores = torch.full((B, K), float("-inf"), device=src.device)
    scores[:, 0] = 0.0
    done = torch.zeros(B, K, dtype=torch.bool, device=src.device)
    for _ in range(max_new):
        logits = model.decode(seqs[:, :, -1:].reshape(B * K, 1), memory_kv, src_keep, caches)[:, -1]
        log_probs = F.log_softmax(logits, dim=-1).reshape(B, K, -1)
        scores, parent, token = beam_step(log_probs, scores, done, K)
        rows = (parent + K * torch.arange(B, device=src.device)[:, None]).reshape(-1)  # parent's flat row
        for cache in caches:
            cache.select(rows)
        seqs = torch.cat([seqs.gather(1, parent[..., None].expand_as(seqs)), token[..., None]], dim=-1)
        done = done.gather(1, parent) | (token == EOS) | (token == PAD)
        if bool(done.all()):
            break
    return seqs[:, 0, 1:]


# ------------------------------------------------------------------ a decoder-only model for comparison

class DecoderOnly(nn.Module):
    """A GPT-style model for the same task: one sequence, the source padded to a fixed width, then
    ``<s> target </s>``, read left to right by causal pre-LN blocks; trained on the target part only
    (``prefix_lm_loss``). <pad> tokens are never attended to."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int, n_heads: int, n_layers: int,
                 d_ff: int | None = None) -> None:
        super().__init__()
        self.embedding = Embedding(vocab_size, max_len, d_model)
        self.blocks = nn.ModuleList(make_block(d_model, n_heads, d_ff, "gelu", norm_first=True)
                                    for _ in range(n_layers))
        self.final_norm = LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> logits (B, L, V): causal attention that also skips <pad> keys."""
        x = self.embedding(ids)
        keep = key_mask(ids != PAD)
        for block in self.blocks:
            x = block(x, mask=keep, causal=True)
        return self.lm_head(self.final_norm(x))


def prefix_lm_loss(model: DecoderOnly, prompt: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """prompt (B, P) padded to one width, tgt (B, T) <s> ... </s> -> teacher forcing on the target part
    only: the model reads prompt + tgt[:, :-1] and nothing inside the prompt is scored."""
    P = prompt.shape[1]
    return target_loss(model(torch.cat([prompt, tgt[:, :-1]], dim=1))[:, P:], tgt[:, 1:])


@torch.no_grad()
def greedy_continue(model: DecoderOnly, prompt: torch.Tensor, max_new: int) -> torch.Tensor:
    """prompt (B, P) ending with <s> -> the arg-max continuation (B, ≤ max_new), <pad> after </s>."""
    out, done = prompt, torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for _ in range(max_new):
        nxt = model(out)[:, -1].argmax(-1).masked_fill(done, PAD)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == EOS
        if bool(done.all()):
            break
    return out[:, prompt.shape[1]:]
