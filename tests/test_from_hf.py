"""GPT.from_hf: our model equals Hugging Face's GPT-2 and LLaMA on the same weights (randomly
initialised from a config, so nothing is downloaded), and greedy generation agrees token for token."""

import pytest
import torch

from course_utils.counting import count_params
from course_utils.generate import generate
from course_utils.gpt import GPT

transformers = pytest.importorskip("transformers")

LLAMA_BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-6)
LLAMA_CONFIGS = {
    "multi-head": dict(num_key_value_heads=4),
    "gqa, odd vocabulary, rope_theta 5e5": dict(num_key_value_heads=2, vocab_size=101, rope_theta=500_000.0),
    "multi-query, tied, 3 layers, eps 1e-5": dict(num_key_value_heads=1, tie_word_embeddings=True,
                                                  num_hidden_layers=3, rms_norm_eps=1e-5),
    "8 heads of 8, rope_theta 100": dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=100.0),
}


def llama(**overrides):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA_BASE, **overrides})
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("overrides", LLAMA_CONFIGS.values(), ids=LLAMA_CONFIGS.keys())
def test_llama_logits_match(overrides):
    hf = llama(**overrides)
    ours = GPT.from_hf(hf).eval()
    c = ours.config
    assert (c.norm, c.position, c.activation, c.bias) == ("rmsnorm", "rope", "swiglu", False)
    assert c.kv_heads == hf.config.num_key_value_heads and c.rope_base == float(hf.config.rope_parameters["rope_theta"])
    assert count_params(c) == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, c.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(idx).logits
        mine, _ = ours(idx)
    assert theirs.abs().max() > 1.0  # large enough that a wrong rotation could not hide
    assert (mine - theirs).abs().max().item() <= 1e-4


def test_llama_without_the_permutation_differs():
    hf = llama(num_key_value_heads=2)
    ours = GPT.from_hf(hf).eval()
    for block, layer in zip(ours.blocks, hf.model.layers, strict=True):  # raw HF rows: wrong RoPE pairing
        block.attn.W_Q.weight.data.copy_(layer.self_attn.q_proj.weight)
        block.attn.W_K.weight.data.copy_(layer.self_attn.k_proj.weight)
    idx = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() > 1e-2


@pytest.mark.parametrize("name", ["multi-head", "gqa, odd vocabulary, rope_theta 5e5"])
def test_llama_greedy_generation_matches_hf_generate(name):
    hf = llama(**LLAMA_CONFIGS[name])
    ours = GPT.from_hf(hf).eval()
    prompt = torch.randint(0, ours.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    theirs = hf.generate(prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    mine = generate(ours, prompt, 30, temperature=0.0)  # with our KV cache (the default)
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_logits_match(tied):
    """OpenAI's GPT-2 ties the unembedding to wte; an untied checkpoint keeps its own lm_head."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=101, n_positions=32, n_embd=48, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied)
    hf = transformers.GPT2LMHeadModel(config).eval()
    if not tied:
        torch.nn.init.normal_(hf.lm_head.weight, std=0.02)  # its own numbers, not a copy of wte
    ours = GPT.from_hf(hf).eval()
    assert ours.config.tie_embeddings == tied and (ours.lm_head is None) == tied
    idx = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(idx)[0] - hf(idx).logits).abs().max().item() <= 1e-5


def test_from_hf_rejects_other_models():
    with pytest.raises(TypeError, match="GPT2LMHeadModel or LlamaForCausalLM"):
        GPT.from_hf(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="RoPE scaling"):
        GPT.from_hf(llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}))
