"""GPT: the decoder-only Transformer language model, and how to count its parameters and FLOPs.

token + learned position embeddings -> L pre-LN blocks with causal multi-head attention ->
final LayerNorm -> unembedding tied to the token embedding -> logits over the vocabulary.
Every position predicts the token after it, so one forward pass trains on all T positions;
generation (``course_utils.generate``) only reads the last one.

That is GPT-2's recipe, the default. ``GPTConfig`` switches each piece so that a LLaMA-style
decoder (RMSNorm, RoPE, SwiGLU, no biases, grouped-query attention, untied unembedding) is the
same class, and so that a lesson can remove pieces one at a time to measure what they are worth.

Shapes: ``B`` batch, ``T`` sequence length, ``D`` = d_model, ``V`` vocabulary, ``L`` blocks.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import ModelKVCache
from course_utils.blocks import (
    ACTIVATIONS,
    NORMS,
    TransformerBlock,
    block_parameter_count,
    make_norm,
    norm_parameter_count,
)
from course_utils.positional import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, rope_halves_to_pairs

INIT_STD = 0.02  # GPT-2's initial standard deviation of every weight matrix and embedding
POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")


@dataclass(frozen=True)
class GPTConfig:
    """The sizes and the components of a GPT; the defaults are GPT-2's.

    ``d_ff`` defaults to 4·d_model. Components: ``activation`` of the feed-forward network
    ("gelu_tanh" is GPT-2's, "swiglu" LLaMA's, "none" removes the network), ``norm``
    ("layernorm", "rmsnorm", "none"), ``position`` ("learned", "sinusoidal", "rope", "alibi",
    "none"), ``n_kv_heads`` (key/value heads for grouped-query attention; None = n_heads),
    ``bias`` (biases of the linear layers), ``residual`` (the "x +" of every sublayer) and
    ``tie_embeddings`` (the unembedding reuses the token embedding, or is its own ``lm_head``).
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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "n_heads", "d_model"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be positive, got {getattr(self, name)}")
        if self.n_layers < 0:
            raise ValueError(f"GPTConfig.n_layers must be >= 0 (0 is a bigram model), got {self.n_layers}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                             "pick a number of heads that divides d_model")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}; "
                             "use 1 (multi-query), a divisor of n_heads, or None (multi-head)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        self._check_components()

    def _check_components(self) -> None:
        for name, allowed in (("activation", (*ACTIVATIONS, "none")), ("norm", NORMS), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is not known; "
                                 f"use one of {', '.join(allowed)}")
        if self.position == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"RoPE rotates pairs of features: the head size d_model/n_heads = "
                             f"{self.d_model // self.n_heads} must be even; change n_heads or d_model")
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads: ``n_kv_heads``, or ``n_heads`` when that is None."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> GPTConfig:
        """A named size, e.g. ``GPTConfig.preset("gpt2")``; keyword arguments replace fields."""
        if name not in PRESETS:
            hint = f"presets are spelled with underscores, use {name.replace('-', '_')!r}; " if "-" in name else ""
            raise KeyError(f"no preset named {name!r}; {hint}known presets: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    # the names before the course's one vocabulary, kept for one release
    @property
    def n_ctx(self) -> int:
        return _renamed("n_ctx", "max_len", self.max_len)

    @property
    def n_layer(self) -> int:
        return _renamed("n_layer", "n_layers", self.n_layers)

    @property
    def n_head(self) -> int:
        return _renamed("n_head", "n_heads", self.n_heads)


def _renamed(old: str, new: str, value: int) -> int:
    warnings.warn(f"GPTConfig.{old} is deprecated; use GPTConfig.{new}", DeprecationWarning, stacklevel=3)
    return value


GPT2_VOCAB = 50_257


def _llama(vocab_size: int, max_len: int, n_layers: int, n_heads: int, d_model: int, d_ff: int,
           n_kv_heads: int | None = None, rope_base: float = 10000.0) -> GPTConfig:
    """Meta's LLaMA layout: RMSNorm, RoPE, SwiGLU, no biases, untied unembedding."""
    return GPTConfig(vocab_size, max_len, n_layers, n_heads, d_model, bias=False, d_ff=d_ff,
                     activation="swiglu", n_kv_heads=n_kv_heads, norm="rmsnorm", position="rope",
                     tie_embeddings=False, rope_base=rope_base)


PRESETS: dict[str, GPTConfig] = {
    # OpenAI's GPT-2 family (2019): context 1,024, byte-level BPE vocabulary of 50,257 tokens
    "gpt2": GPTConfig(GPT2_VOCAB, 1024, 12, 12, 768),
    "gpt2_medium": GPTConfig(GPT2_VOCAB, 1024, 24, 16, 1024),
    "gpt2_large": GPTConfig(GPT2_VOCAB, 1024, 36, 20, 1280),
    "gpt2_xl": GPTConfig(GPT2_VOCAB, 1024, 48, 25, 1600),
    # GPT-3 175B (2020): context 2,048, same vocabulary
    "gpt3": GPTConfig(GPT2_VOCAB, 2048, 96, 96, 12288),
    # Meta's LLaMA 2 (2023) and LLaMA 3 (2024), sizes from their published config.json files
    "llama2_7b": _llama(32_000, 4096, 32, 32, 4096, 11_008),
    "llama2_70b": _llama(32_000, 4096, 80, 64, 8192, 28_672, n_kv_heads=8),
    "llama3_8b": _llama(128_256, 8192, 32, 32, 4096, 14_336, n_kv_heads=8, rope_base=500_000.0),
    # the course's character-level model on Shakespeare (84 distinct characters in the corpus)
    "shakespeare_char": GPTConfig(84, 256, 6, 6, 384, dropout=0.2),
    # the model that ships with the course (course_utils/pretrained): trained on two CPU cores
    "shakespeare_char_small": GPTConfig(84, 128, 4, 4, 128),
    # small sizes for CI and laptops
    "smoke": GPTConfig(84, 32, 2, 2, 32),
    "cpu": GPTConfig(84, 128, 4, 4, 128),
}


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
        self.blocks = nn.ModuleList(
            TransformerBlock(c.d_model, c.n_heads, d_ff=c.d_ff, activation=c.activation, norm_first=True,
                             eps=c.eps, bias=c.bias, dropout=c.dropout, attn_impl="fused",
                             n_kv_heads=c.n_kv_heads, norm=c.norm, residual=c.residual,
                             rope_base=c.rope_base if c.position == "rope" else None,
                             alibi=c.position == "alibi")
            for _ in range(c.n_layers)
        )
        self.final_norm = make_norm(c.norm, c.d_model, c.eps)
        self.lm_head = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialisation: N(0, 0.02) weights and embeddings, zero biases, and the two
        projections that write into the residual stream scaled by 1/√(2L), so the stream's
        variance does not grow with depth (each block adds two such terms)."""
        for name, p in self.named_parameters():
            if name.endswith("bias") or name.endswith("beta"):
                nn.init.zeros_(p)
            elif name.endswith("gamma"):
                nn.init.ones_(p)
            elif name.endswith(("attn.W_O.weight", "ffn.W_out.weight")):
                nn.init.normal_(p, 0.0, INIT_STD / math.sqrt(2 * self.config.n_layers))
            else:
                nn.init.normal_(p, 0.0, INIT_STD)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                kv_cache: ModelKVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) token ids -> (logits (B, T, V), loss or None).

        ``targets`` (B, T) are the next tokens; the loss is their mean cross-entropy (targets equal
        to -100 are ignored). With ``kv_cache`` the T new tokens continue the cached positions.
        """
        offset = 0 if kv_cache is None else len(kv_cache)
        self._check_idx(idx, offset)
        x = self.token_embedding(idx)  # (B, T, D)
        if self.position_embedding is not None:
            x = x + self.position_embedding(idx.shape[1], offset)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, causal=True, kv_cache=None if kv_cache is None else kv_cache[i])
        x = getattr(self.final_norm, "fused", self.final_norm)(x)  # PyTorch's one-kernel norm (none: identity)
        # (B, T, V): tied to W_emb, or the model's own lm_head
        logits = F.linear(x, self.token_embedding.weight) if self.lm_head is None else self.lm_head(x)
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(f"targets must have the shape of idx {tuple(idx.shape)}, got {tuple(targets.shape)}")
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    def _check_idx(self, idx: torch.Tensor, offset: int) -> None:
        """Reject what the lookups would fail on, instead of PyTorch's bare "index out of range in self"."""
        c = self.config
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be (B, T) integer token ids, got shape {tuple(idx.shape)} and dtype "
                             f"{idx.dtype}; for one sequence use idx[None]")
        if c.position == "learned" and offset + idx.shape[1] > c.max_len:
            raise ValueError(f"sequence of {offset + idx.shape[1]} tokens is longer than the context "
                             f"max_len={c.max_len}; crop it to the last {c.max_len} tokens, e.g. idx[:, -max_len:]")
        if idx.numel() and not torch.compiler.is_compiling():  # reading values would split a compiled graph
            low, high = (int(v) for v in torch.aminmax(idx))
            if low < 0 or high >= c.vocab_size:
                raise ValueError(f"token ids must lie in [0, vocab_size={c.vocab_size}), got ids from {low} to "
                                 f"{high}; encode the text with the tokenizer this model was built for")

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> GPT:
        """Our GPT with the config and weights of a Hugging Face ``GPT2LMHeadModel`` or
        ``LlamaForCausalLM`` (read from the model object, nothing downloaded).

        HF's LLaMA applies RoPE to the two halves of each head (feature j pairs with j + d/2);
        ``positional.apply_rope`` pairs neighbours (2j with 2j + 1). Permuting the rows of W_Q and
        W_K head by head (``rope_halves_to_pairs``) turns one convention into the other: q·k is a
        sum over features, so reordering the features of q and k alike leaves every score unchanged.
        """
        kind = getattr(getattr(hf_model, "config", None), "model_type", None)
        if kind == "gpt2":
            c = hf_model.config
            if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
                raise ValueError(f"activation_function={c.activation_function!r} is not GPT-2's tanh GELU")
            return cls.from_hf_state_dict(hf_model.state_dict(), n_heads=c.n_head, eps=c.layer_norm_epsilon)
        if kind == "llama":
            config = _llama_config(hf_model.config)
            return cls._with_weights(config, _llama_to_ours(hf_model.state_dict(), config))
        raise TypeError(f"from_hf reads GPT2LMHeadModel or LlamaForCausalLM, got a {type(hf_model).__name__} "
                        f"(model_type {kind!r}); pass the model object, not its name")

    @classmethod
    def from_hf_state_dict(cls, state_dict: dict[str, torch.Tensor], n_heads: int, eps: float = 1e-5) -> GPT:
        """A GPT holding the weights of a Hugging Face ``GPT2LMHeadModel`` (or ``GPT2Model``) state dict.

        HF's ``Conv1D`` layers store weights as (in, out), so they are transposed into our
        ``nn.Linear`` (out, in); ``c_attn`` holds W_Q, W_K, W_V side by side. The number of heads
        cannot be read off the weights, so it is passed in (``hf_model.config.n_head``).
        """
        sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
        missing = [k for k in ("wte.weight", "wpe.weight", "ln_f.weight") if k not in sd]
        if missing:
            raise KeyError(f"not a GPT-2 state dict: missing {', '.join(missing)}; pass hf_model.state_dict()")
        V, D = sd["wte.weight"].shape
        n_layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
        d_ff = sd["h.0.mlp.c_fc.weight"].shape[1]
        d_ff = None if d_ff == 4 * D else d_ff  # the default width
        if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["wte.weight"]):
            raise ValueError("lm_head.weight differs from wte.weight; this GPT ties the unembedding to "
                             "the token embedding, so it can only load tied checkpoints")
        config = GPTConfig(V, sd["wpe.weight"].shape[0], n_layers, n_heads, D, d_ff=d_ff, eps=eps)
        return cls._with_weights(config, _gpt2_to_ours(sd, n_layers, D))

    @classmethod
    def _with_weights(cls, config: GPTConfig, state_dict: dict[str, torch.Tensor]) -> GPT:
        """Build on the meta device (no memory, no initialisation) and take over the given tensors."""
        with torch.device("meta"):
            model = cls(config)
        model.load_state_dict({k: v.detach().clone() for k, v in state_dict.items()}, strict=True, assign=True)
        return model

    @classmethod
    def from_pretrained(cls, name: str = "gpt2") -> GPT:
        """Download OpenAI's GPT-2 weights from the Hugging Face hub (needs ``transformers`` and a
        connection, or a cached copy) and load them into a GPT."""
        from transformers import GPT2LMHeadModel

        return cls.from_hf(GPT2LMHeadModel.from_pretrained(name))


def _position_module(c: GPTConfig) -> nn.Module | None:
    """What adds positions to the token vectors; None when attention handles them (RoPE, ALiBi) or nothing does."""
    if c.position == "learned":
        return LearnedPositionalEmbedding(c.max_len, c.d_model)
    if c.position == "sinusoidal":
        return SinusoidalPositionalEncoding(c.d_model)
    return None


def _llama_config(hf: Any) -> GPTConfig:
    """GPTConfig of a Hugging Face ``LlamaConfig``; refuses what this GPT does not implement."""
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"RoPE scaling {rope.get('rope_type')!r} is not implemented; only plain RoPE loads")
    if hf.hidden_act != "silu" or getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False):
        raise ValueError("only LLaMA's own layout loads: SwiGLU (hidden_act='silu') and no biases")
    if getattr(hf, "head_dim", None) not in (None, hf.hidden_size // hf.num_attention_heads):
        raise ValueError(f"head_dim={hf.head_dim} differs from hidden_size/num_attention_heads; not supported")
    return GPTConfig(hf.vocab_size, hf.max_position_embeddings, hf.num_hidden_layers, hf.num_attention_heads,
                     hf.hidden_size, bias=False, d_ff=hf.intermediate_size, activation="swiglu",
                     eps=hf.rms_norm_eps, n_kv_heads=hf.num_key_value_heads, norm="rmsnorm", position="rope",
                     tie_embeddings=hf.tie_word_embeddings, rope_base=float(theta))


def _llama_to_ours(sd: dict[str, torch.Tensor], c: GPTConfig) -> dict[str, torch.Tensor]:
    """HF LLaMA's tensor names -> ours; W_Q and W_K rows reordered from RoPE halves to neighbour pairs."""
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    ours = {"token_embedding.weight": sd["embed_tokens.weight"], "final_norm.gamma": sd["norm.weight"]}
    if not c.tie_embeddings:
        ours["lm_head.weight"] = sd["lm_head.weight"]
    names = {"attn.W_V": "self_attn.v_proj", "attn.W_O": "self_attn.o_proj", "ffn.W_gate": "mlp.gate_proj",
             "ffn.W_in": "mlp.up_proj", "ffn.W_out": "mlp.down_proj"}
    for i in range(c.n_layers):
        h, b = f"layers.{i}.", f"blocks.{i}."
        ours[b + "attn.W_Q.weight"] = rope_halves_to_pairs(sd[h + "self_attn.q_proj.weight"], c.n_heads)
        ours[b + "attn.W_K.weight"] = rope_halves_to_pairs(sd[h + "self_attn.k_proj.weight"], c.kv_heads)
        for mine, theirs in names.items():
            ours[b + mine + ".weight"] = sd[h + theirs + ".weight"]
        ours[b + "norm1.gamma"] = sd[h + "input_layernorm.weight"]
        ours[b + "norm2.gamma"] = sd[h + "post_attention_layernorm.weight"]
    return ours


def _gpt2_to_ours(sd: dict[str, torch.Tensor], n_layers: int, D: int) -> dict[str, torch.Tensor]:
    """GPT-2's tensor names (wte, wpe, h.i, ln_f) -> this module's names, Conv1D weights transposed."""
    ours = {"token_embedding.weight": sd["wte.weight"], "position_embedding.weight": sd["wpe.weight"],
            "final_norm.gamma": sd["ln_f.weight"], "final_norm.beta": sd["ln_f.bias"]}
    for i in range(n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        w_qkv, b_qkv = sd[h + "attn.c_attn.weight"].split(D, dim=1), sd[h + "attn.c_attn.bias"].split(D)
        for j, name in enumerate(("W_Q", "W_K", "W_V")):
            ours[b + f"attn.{name}.weight"] = w_qkv[j].t()
            ours[b + f"attn.{name}.bias"] = b_qkv[j]
        pairs = {"attn.W_O": "attn.c_proj", "ffn.W_in": "mlp.c_fc", "ffn.W_out": "mlp.c_proj"}
        for mine, theirs in pairs.items():
            ours[b + mine + ".weight"] = sd[h + theirs + ".weight"].t()
            ours[b + mine + ".bias"] = sd[h + theirs + ".bias"]
        for mine, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            ours[b + mine + ".gamma"] = sd[h + theirs + ".weight"]
            ours[b + mine + ".beta"] = sd[h + theirs + ".bias"]
    return ours


# ---------------------------------------------------------------- counting parameters and compute

def embedding_params(config: GPTConfig) -> int:
    """Token embedding V·D (counted once when it is also the unembedding, twice with an untied
    ``lm_head``) plus the learned position table max_len·D (other position schemes have no parameters)."""
    c = config
    tokens = c.vocab_size * c.d_model * (1 if c.tie_embeddings else 2)
    return tokens + (c.max_len * c.d_model if c.position == "learned" else 0)


def count_params(config: GPTConfig) -> int:
    """N = V·d + max_len·d + L·(12d² + 13d) + 2d for GPT-2's layout, exact for any config.

    The per-block count comes from ``blocks.block_parameter_count`` (it knows d_ff, SwiGLU,
    grouped-query attention, the norm and biases); the final norm adds 2d (LayerNorm) or d (RMSNorm).
    """
    c = config
    per_block = block_parameter_count(c.d_model, c.d_ff, c.activation, c.bias, n_heads=c.n_heads,
                                      n_kv_heads=c.n_kv_heads, norm=c.norm)
    return embedding_params(c) + c.n_layers * per_block + norm_parameter_count(c.norm, c.d_model)


def kv_cache_bytes_per_token(config: GPTConfig, bytes_per_number: int = 2) -> int:
    """Memory a KV cache holds per token: a key and a value of H_kv·d_head numbers in each of L
    blocks, 2·L·H_kv·d_head numbers (bf16/fp16: 2 bytes each). Grouped-query attention divides it by H/H_kv."""
    c = config
    return 2 * c.n_layers * c.kv_heads * (c.d_model // c.n_heads) * bytes_per_number


def count_params_approx(config: GPTConfig) -> int:
    """12·L·d²: the weight matrices of the blocks (4d² attention + 8d² MLP each), the bulk for large d."""
    return 12 * config.n_layers * config.d_model ** 2


def count_instantiated(config: GPTConfig) -> int:
    """Parameters of an actual ``GPT(config)``, built on the ``meta`` device (shapes only, no memory),
    so even GPT-3's 175 billion cost nothing. Tied weights count once."""
    with torch.device("meta"):
        model = GPT(config)
    return sum(p.numel() for p in model.parameters())


def flops_per_token(config: GPTConfig, seq_len: int, training: bool = False) -> int:
    """FLOPs to process one token with ``seq_len`` tokens of context (forward, or forward+backward).

    Forward: 2 FLOPs (a multiply and an add) per parameter, 2N, plus the attention scores and the
    weighted sum of values, 2·2·L·T·d (every key counted, as kernels compute them; every query
    head counts, so grouped-query attention changes only N). Training adds the backward pass,
    about twice the forward: 6N + 12·L·T·d.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    forward = 2 * count_params(config) + 4 * config.n_layers * seq_len * config.d_model
    return 3 * forward if training else forward


def training_compute(n_params: int, n_tokens: int) -> int:
    """C ≈ 6·N·D: training FLOPs for N parameters on D tokens (the scaling-laws estimate)."""
    return 6 * n_params * n_tokens


def size_report(config: GPTConfig, seq_len: int | None = None) -> dict[str, float]:
    """The numbers the lesson's calculator shows for one config (``seq_len`` defaults to max_len)."""
    n = count_params(config)
    seq_len = config.max_len if seq_len is None else seq_len
    return {
        "params": n,
        "approx_12Ld2": count_params_approx(config),
        "embedding_share": embedding_params(config) / n,
        "flops_per_token_forward": flops_per_token(config, seq_len),
        "flops_per_token_training": flops_per_token(config, seq_len, training=True),
        "memory_fp32_GB": 4 * n / 1e9,
        "memory_bf16_GB": 2 * n / 1e9,
    }
