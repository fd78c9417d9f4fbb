"""Other people's weights in our GPT: Hugging Face's GPT-2 and LLaMA, mapped tensor by tensor.

Each function returns ``(GPTConfig, state dict with our names)``; ``GPT.from_hf`` and
``GPT.from_hf_state_dict`` build the model from them. Our names are ``token_embedding.weight``,
``position_embedding.weight``, ``blocks.{i}.norm1.gamma``/``.beta``,
``blocks.{i}.attn.W_Q``/``W_K``/``W_V``/``W_O``, ``blocks.{i}.norm2``, ``blocks.{i}.ffn.W_in``/
``W_out``/``W_gate``, ``final_norm`` and ``lm_head.weight``; GPT-2's and LLaMA's own names
(``wte``, ``wpe``, ``h.i``, ``c_attn``, ``ln_f``, ``q_proj``, ...) appear only here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from course_utils.config import GPTConfig, llama
from course_utils.positional import rope_halves_to_pairs

StateDict = dict[str, torch.Tensor]


def from_hf(hf_model: nn.Module) -> tuple[GPTConfig, StateDict]:
    """Config and weights of a Hugging Face ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` object
    (nothing is downloaded)."""
    kind = getattr(getattr(hf_model, "config", None), "model_type", None)
    if kind == "gpt2":
        c: Any = hf_model.config  # a transformers PretrainedConfig
        if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"activation_function={c.activation_function!r} is not GPT-2's tanh GELU")
        return from_gpt2_state_dict(hf_model.state_dict(), n_heads=c.n_head, eps=c.layer_norm_epsilon)
    if kind == "llama":
        config = llama_config(hf_model.config)
        return config, from_llama_state_dict(hf_model.state_dict(), config)
    raise TypeError(f"from_hf reads GPT2LMHeadModel or LlamaForCausalLM, got a {type(hf_model).__name__} "
                    f"(model_type {kind!r}); pass the model object, not its name")


def from_gpt2_state_dict(state_dict: StateDict, n_heads: int, eps: float = 1e-5) -> tuple[GPTConfig, StateDict]:
    """A ``GPT2LMHeadModel`` (or ``GPT2Model``) state dict -> our config and names.

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
    tied = "lm_head.weight" not in sd or torch.equal(sd["lm_head.weight"], sd["wte.weight"])  # OpenAI's are tied
    config = GPTConfig(V, sd["wpe.weight"].shape[0], n_layers, n_heads, D,
                       d_ff=None if d_ff == 4 * D else d_ff, eps=eps, tie_embeddings=tied)
    ours = {"token_embedding.weight": sd["wte.weight"], "position_embedding.weight": sd["wpe.weight"],
            "final_norm.gamma": sd["ln_f.weight"], "final_norm.beta": sd["ln_f.bias"]}
    if not tied:
        ours["lm_head.weight"] = sd["lm_head.weight"]
    pairs = {"attn.W_O": "attn.c_proj", "ffn.W_in": "mlp.c_fc", "ffn.W_out": "mlp.c_proj"}
    for i in range(n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        w_qkv, b_qkv = sd[h + "attn.c_attn.weight"].split(D, dim=1), sd[h + "attn.c_attn.bias"].split(D)
        for j, name in enumerate(("W_Q", "W_K", "W_V")):
            ours[b + f"attn.{name}.weight"] = w_qkv[j].t()
            ours[b + f"attn.{name}.bias"] = b_qkv[j]
        for mine, theirs in pairs.items():
            ours[b + mine + ".weight"] = sd[h + theirs + ".weight"].t()
            ours[b + mine + ".bias"] = sd[h + theirs + ".bias"]
        for mine, theirs in (("norm1", "ln_1"), ("norm2", "ln_2")):
            ours[b + mine + ".gamma"] = sd[h + theirs + ".weight"]
            ours[b + mine + ".beta"] = sd[h + theirs + ".bias"]
    return config, ours


def llama_config(hf: Any) -> GPTConfig:
    """GPTConfig of a Hugging Face ``LlamaConfig``; refuses what this GPT does not implement."""
    rope = dict(getattr(hf, "rope_parameters", None) or {})
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"RoPE scaling {rope.get('rope_type')!r} is not implemented; only plain RoPE loads")
    if hf.hidden_act != "silu" or getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False):
        raise ValueError("only LLaMA's own layout loads: SwiGLU (hidden_act='silu') and no biases")
    if getattr(hf, "head_dim", None) not in (None, hf.hidden_size // hf.num_attention_heads):
        raise ValueError(f"head_dim={hf.head_dim} differs from hidden_size/num_attention_heads; not supported")
    return llama(hf.vocab_size, hf.max_position_embeddings, hf.num_hidden_layers, hf.num_attention_heads,
                 hf.hidden_size, hf.intermediate_size, n_kv_heads=hf.num_key_value_heads, rope_base=float(theta),
                 eps=hf.rms_norm_eps, tie_embeddings=hf.tie_word_embeddings)


def from_llama_state_dict(state_dict: StateDict, config: GPTConfig) -> StateDict:
    """HF LLaMA's tensor names -> ours.

    HF's LLaMA applies RoPE to the two halves of each head (feature j pairs with j + d/2);
    ``positional.apply_rope`` pairs neighbours (2j with 2j + 1). Permuting the rows of W_Q and
    W_K head by head (``rope_halves_to_pairs``) turns one convention into the other: q·k is a
    sum over features, so reordering the features of q and k alike leaves every score unchanged.
    """
    c = config
    sd = {k.removeprefix("model."): v for k, v in state_dict.items()}
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
