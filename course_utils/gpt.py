"""GPT: the decoder-only Transformer language model.

token + learned position embeddings -> L pre-LN blocks with causal multi-head attention ->
final LayerNorm -> unembedding tied to the token embedding -> logits over the vocabulary.
Every position predicts the token after it, so one forward pass trains on all T positions;
generation (``course_utils.generate``) only reads the last one.

That is GPT-2's recipe, the default. ``GPTConfig`` (``course_utils.config``) switches each piece
so that a LLaMA-style decoder (RMSNorm, RoPE, SwiGLU, no biases, grouped-query attention, untied
unembedding) is the same class, and so that a lesson can remove pieces one at a time to measure
what they are worth. Counting lives in ``counting``, Hugging Face's weights in ``convert``.

Shapes: ``B`` batch, ``T`` sequence length, ``D`` = d_model, ``V`` vocabulary, ``L`` blocks.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from course_utils import convert
from course_utils.attention import ModelKVCache, MultiHeadAttention, RopeTable, rope_table
from course_utils.blocks import FeedForward, LayerNorm, RMSNorm, TransformerBlock, make_norm
from course_utils.config import GPTConfig
from course_utils.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding

INIT_STD = 0.02  # GPT-2's initial standard deviation of every weight matrix and embedding


def gpt_block(c: GPTConfig) -> TransformerBlock:
    """One pre-LN block with the components ``c`` selects: the attention (grouped-query heads,
    RoPE or ALiBi inside it, and its path), the norms, and the feed-forward network (or none)."""
    attn = MultiHeadAttention(c.d_model, c.n_heads, bias=c.bias, dropout=c.dropout, n_kv_heads=c.n_kv_heads,
                              rope_base=c.rope_base if c.position == "rope" else None,
                              alibi=c.position == "alibi", sdpa=c.sdpa)
    ffn, norm2 = None, None
    if c.activation != "none":
        ffn = FeedForward(c.d_model, c.d_ff, c.activation, c.bias, c.dropout)
        norm2 = make_norm(c.norm, c.d_model, c.eps)
    return TransformerBlock(attn, ffn, make_norm(c.norm, c.d_model, c.eps), norm2, norm_first=True,
                            residual=c.residual, dropout=c.dropout)


def _position_module(c: GPTConfig) -> nn.Module | None:
    """What adds positions to the token vectors; None when attention handles them (RoPE, ALiBi) or nothing does."""
    if c.position == "learned":
        return LearnedPositionalEmbedding(c.max_len, c.d_model)
    if c.position == "sinusoidal":
        return SinusoidalPositionalEncoding(c.d_model)
    return None


class GPT(nn.Module):
    """Decoder-only Transformer LM with GPT-2's layout and initialisation (or the components the
    config selects instead)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        # W_emb (V, D); with tie_embeddings also the unembedding, so there is no lm_head
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.position_embedding = _position_module(c)  # W_pos (max_len, D), fixed sinusoids, or None
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(gpt_block(c) for _ in range(c.n_layers))
        self.final_norm = make_norm(c.norm, c.d_model, c.eps)
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation, by module type (as nanoGPT does): N(0, 0.02) for the weights of
        linear layers and embedding tables, zero biases, norms at γ = 1, β = 0; and the two
        projections that write into the residual stream (each block's ``attn.W_O`` and ``ffn.W_out``)
        at 0.02/√(2L), so the stream's variance does not grow with depth (each block adds two such
        terms). Modules are visited in registration order, so the random draws come in the order of
        ``named_parameters()``."""
        residual: set[nn.Module] = set()
        for block in self.blocks:  # each built by gpt_block: a MultiHeadAttention, a FeedForward or None
            residual.add(cast(MultiHeadAttention, block.attn).W_O)
            if block.ffn is not None:
                residual.add(cast(FeedForward, block.ffn).W_out)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = INIT_STD / math.sqrt(2 * self.config.n_layers) if module in residual else INIT_STD
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.Embedding, LearnedPositionalEmbedding)):
                nn.init.normal_(module.weight, 0.0, INIT_STD)
            elif isinstance(module, LayerNorm):
                nn.init.ones_(module.gamma)
                nn.init.zeros_(module.beta)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.gamma)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                kv_cache: ModelKVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits (B, T, V), loss or None).

        ``targets`` (B, T) are the next tokens; the loss is their mean cross-entropy (targets equal
        to -100 are ignored). With ``kv_cache`` the T new tokens continue the cached positions.
        """
        logits = self.unembed(self.hidden(idx, kv_cache))
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def hidden(self, idx: torch.Tensor, kv_cache: ModelKVCache | None = None) -> torch.Tensor:
        """idx (B, T) token ids -> (B, T, D) the last block's output after the final norm: what the
        unembedding reads. ``forward`` is ``unembed(hidden(idx))``; a loss that needs the logits of a
        few positions only (an answer's, in supervised fine-tuning) unembeds just those."""
        offset = 0 if kv_cache is None else len(kv_cache)
        self._check_idx(idx, offset)
        x = self.token_embedding(idx)  # (B, T, D)
        if self.position_embedding is not None:  # (T, D); .to(x): fixed sinusoids are made on the CPU in float32
            x = x + self.position_embedding(idx.shape[1], offset).to(x)
        x = self.drop(x)
        rope = self._rope(offset, idx.shape[1], x)
        for i, block in enumerate(self.blocks):
            x = block(x, causal=True, kv_cache=None if kv_cache is None else kv_cache[i], rope=rope)
        return self.final_norm(x)

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """h (..., D) final-normed states -> (..., V) logits: tied to W_emb, or the model's own lm_head."""
        return F.linear(h, self.token_embedding.weight) if self.lm_head is None else self.lm_head(h)

    def _rope(self, offset: int, T: int, x: torch.Tensor) -> RopeTable | None:
        """RoPE's cos/sin table of the T positions from ``offset``, computed once for every block
        (None without RoPE), in the precision the queries will have: autocast's, else x's."""
        c = self.config
        if c.position != "rope":
            return None
        device = x.device.type
        autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
        dtype = torch.get_autocast_dtype(device) if autocast else x.dtype
        return rope_table(offset, T, c.d_head, c.rope_base, dtype, x.device)

    def _check_idx(self, idx: torch.Tensor, offset: int) -> None:
        """Reject what the lookups would fail on, instead of PyTorch's bare "index out of range in self"."""
        c = self.config
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be (B, T) integer token ids, got shape {tuple(idx.shape)} and dtype "
                             f"{idx.dtype}; for one sequence use idx[None]")
        if c.position == "learned" and offset + idx.shape[1] > c.max_len:
            raise ValueError(f"sequence of {offset + idx.shape[1]} tokens is longer than the context "
                             f"max_len={c.max_len}; crop it to the last {c.max_len} tokens, e.g. idx[:, -max_len:]")
        # the values are read only where they already are in host memory: on an accelerator reading them
        # would wait for the device at every forward, and in a compiled graph it would split the graph
        if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
            low, high = (int(v) for v in torch.aminmax(idx))
            if low < 0 or high >= c.vocab_size:
                raise ValueError(f"token ids must lie in [0, vocab_size={c.vocab_size}), got ids from {low} to "
                                 f"{high}; encode the text with the tokenizer this model was built for")

    @classmethod
    def with_weights(cls, config: GPTConfig, state_dict: dict[str, torch.Tensor], *, copy: bool = True) -> GPT:
        """A GPT of ``config`` holding exactly the tensors of ``state_dict`` (our names): built on the
        meta device (no memory, no initialisation), then the tensors take its place. They are copied,
        unless ``copy=False`` says that nothing else holds them (a state dict just read from a file)."""
        with torch.device("meta"):
            model = cls(config)
        tensors = {k: v.detach().clone() for k, v in state_dict.items()} if copy else state_dict
        model.load_state_dict(tensors, strict=True, assign=True)
        return model

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> GPT:
        """Our GPT with the config and weights of a Hugging Face ``GPT2LMHeadModel`` or
        ``LlamaForCausalLM`` (read from the model object, nothing downloaded; see ``convert``)."""
        return cls.with_weights(*convert.from_hf(hf_model))

    @classmethod
    def from_hf_state_dict(cls, state_dict: dict[str, torch.Tensor], n_heads: int, eps: float = 1e-5) -> GPT:
        """A GPT holding the weights of a Hugging Face ``GPT2LMHeadModel`` (or ``GPT2Model``) state
        dict; ``n_heads`` cannot be read off the weights (``hf_model.config.n_head``)."""
        return cls.with_weights(*convert.from_gpt2_state_dict(state_dict, n_heads, eps))

    @classmethod
    def from_pretrained(cls, name: str = "gpt2") -> GPT:
        """Download OpenAI's GPT-2 weights from the Hugging Face hub (needs ``transformers`` and a
        connection, or a cached copy) and load them into a GPT."""
        from transformers import GPT2LMHeadModel

        return cls.from_hf(GPT2LMHeadModel.from_pretrained(name))
