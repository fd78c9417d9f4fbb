import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.config import PRESETS
from course_utils.counting import (
    count_instantiated,
    count_params,
    count_params_approx,
    embedding_params,
    flops_per_token,
    size_report,
    training_compute,
)
from course_utils.gpt import GPT, GPTConfig


def small(**overrides) -> GPTConfig:
    fields = {"vocab_size": 37, "max_len": 24, "n_layers": 3, "n_heads": 4, "d_model": 32, **overrides}
    return GPTConfig(**fields)


# ------------------------------------------------------------------------ counting

def test_gpt2_small_has_124_439_808_parameters():
    c = GPTConfig.preset("gpt2")
    V, N, L, d = c.vocab_size, c.max_len, c.n_layers, c.d_model
    assert V * d + N * d + L * (12 * d * d + 13 * d) + 2 * d == 124_439_808
    assert count_params(c) == 124_439_808
    assert count_instantiated(c) == 124_439_808
    assert round(embedding_params(c) / count_params(c), 2) == 0.32


@pytest.mark.parametrize("name, expected", [
    ("gpt2_medium", 354_823_168), ("gpt2_large", 774_030_080), ("gpt2_xl", 1_557_611_200)])
def test_gpt2_family_counts(name, expected):
    assert count_params(GPTConfig.preset(name)) == count_instantiated(GPTConfig.preset(name)) == expected


@pytest.mark.parametrize("overrides", [{}, {"activation": "swiglu"}, {"bias": False}, {"d_ff": 50},
                                       {"activation": "swiglu", "d_ff": 88, "bias": False}])
def test_formula_matches_the_instantiated_model(overrides):
    c = small(**overrides)
    assert count_params(c) == count_instantiated(c) == sum(p.numel() for p in GPT(c).parameters())


def test_every_small_preset_matches_its_model():
    for name in ("smoke", "cpu", "shakespeare_char"):
        assert count_params(PRESETS[name]) == count_instantiated(PRESETS[name])


def test_gpt3_is_dominated_by_its_blocks():
    c = GPTConfig.preset("gpt3")
    assert count_params_approx(c) == 173_946_175_488  # 12·L·d² ≈ 173.9 billion
    assert embedding_params(c) / count_params(c) < 0.004
    assert count_params(c) == count_instantiated(c)  # on the meta device: no memory


def test_doubling_width_quadruples_block_parameters():
    per_block = [(count_params(small(d_model=d)) - embedding_params(small(d_model=d)) - 2 * d) // 3
                 for d in (256, 512)]
    assert 3.9 < per_block[1] / per_block[0] < 4.0


def test_flops_per_token():
    c = GPTConfig.preset("gpt2")
    n = count_params(c)
    assert flops_per_token(c, 1024) == 2 * n + 4 * 12 * 1024 * 768
    assert flops_per_token(c, 1024, training=True) == 3 * flops_per_token(c, 1024)
    assert 2 * n < flops_per_token(c, 1) < 2.001 * n  # short context: ≈ 2N
    assert training_compute(n, 10**9) == 6 * n * 10**9
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(c, 0)


def test_size_report():
    r = size_report(GPTConfig.preset("gpt2"))
    assert r["params"] == 124_439_808 and r["approx_12Ld2"] == 12 * 12 * 768 ** 2
    assert r["memory_fp32_GB"] == pytest.approx(0.4977592) and r["memory_bf16_GB"] == r["memory_fp32_GB"] / 2


# ------------------------------------------------------------------------ config

def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        small(d_model=30)
    with pytest.raises(ValueError, match="n_layers must be >= 0"):
        small(n_layers=-1)
    with pytest.raises(ValueError, match="known presets: gpt2"):
        GPTConfig.preset("gpt5")
    assert GPTConfig.preset("shakespeare_char", vocab_size=65).vocab_size == 65
    for old, new in (("shakespeare-char", "shakespeare_char"), ("gpt2-medium", "gpt2_medium")):
        with pytest.raises(ValueError, match=f"spelled with underscores, use '{new}'"):
            GPTConfig.preset(old)


def test_one_config_per_preset_name():
    """`course train --config cpu` trains GPTConfig.preset("cpu") itself (only the vocabulary follows the
    tokenizer), and no two presets are the same model."""
    assert GPTConfig.preset("cpu") == GPTConfig(84, 64, 3, 4, 128)
    assert GPTConfig.preset("shakespeare_char_small") == GPTConfig(84, 128, 4, 4, 128)
    configs = list(PRESETS.values())
    assert all(a != b for i, a in enumerate(configs) for b in configs[i + 1:])
    assert GPTConfig(37, 24, 3, 4, 32) == small()  # positional order of the fields


# ------------------------------------------------------------------------ the model

def test_forward_shapes_and_loss():
    torch.manual_seed(0)
    c = small()
    model = GPT(c)
    idx = torch.randint(0, c.vocab_size, (2, 10))
    targets = torch.randint(0, c.vocab_size, (2, 10))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 10, c.vocab_size)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1)))
    assert abs(loss.item() - math.log(c.vocab_size)) < 0.1  # small init: near-uniform predictions
    assert model(idx)[1] is None


def test_unembedding_is_tied_to_the_token_embedding():
    model = GPT(small())
    names = [n for n, _ in model.named_parameters()]
    assert "token_embedding.weight" in names and not any("lm_head" in n for n in names)
    idx = torch.randint(0, 37, (2, 5))
    x = model.drop(model.token_embedding(idx) + model.position_embedding(5))
    for block in model.blocks:
        x = block(x, causal=True)
    by_hand = model.final_norm(x) @ model.token_embedding.weight.T  # the head is W_emb transposed
    torch.testing.assert_close(model(idx)[0], by_hand)


def test_attention_is_causal():
    torch.manual_seed(1)
    model = GPT(small()).eval()
    idx = torch.randint(0, 37, (1, 12))
    changed = idx.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % 37
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8])  # positions before the change do not see it
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_too_long_sequence_is_a_clear_error():
    model = GPT(small())
    with pytest.raises(ValueError, match=r"longer than the context max_len=24.*idx\[:, -max_len:\]"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"idx\[None\]"):
        model(torch.zeros(5, dtype=torch.long))


@pytest.mark.parametrize("bad, shown", [(37, "from 0 to 37"), (-1, "from -1 to 0")])
def test_token_id_outside_the_vocabulary_is_a_clear_error(bad, shown):
    model = GPT(small())
    idx = torch.zeros(2, 6, dtype=torch.long)
    idx[1, 3] = bad
    with pytest.raises(ValueError, match=rf"token ids must lie in \[0, vocab_size=37\), got ids {shown}; encode"):
        model(idx)
    model(idx.clamp(0, 36))  # the largest valid id is fine


def test_forward_reads_no_token_values_off_the_device():
    """The vocabulary check reads idx only where it lives in host memory: on another device it would
    wait for the device at every forward. The meta device stands in for one (it has no values at all)."""
    with torch.device("meta"):
        model = GPT(small(position="rope"))
        logits, loss = model(torch.zeros(2, 6, dtype=torch.long), torch.zeros(2, 6, dtype=torch.long))
    assert logits.shape == (2, 6, 37) and loss.shape == ()


@torch.no_grad()
def test_gpt2_initialisation():
    torch.manual_seed(0)
    c = small(n_layers=8, d_model=256, n_heads=8)
    model = GPT(c)
    block = model.blocks[0]
    assert abs(float(block.attn.W_Q.weight.std()) - 0.02) < 0.001
    scaled = 0.02 / math.sqrt(2 * c.n_layers)
    assert abs(float(block.attn.W_O.weight.std()) - scaled) < 0.0005
    assert abs(float(block.ffn.W_out.weight.std()) - scaled) < 0.0005
    assert abs(float(model.token_embedding.weight.std()) - 0.02) < 0.002
    assert float(block.attn.W_Q.bias.abs().max()) == 0.0
    assert torch.equal(block.norm1.gamma, torch.ones(256))


def _initialise_by_name(model: GPT) -> None:
    """The rule GPT.reset_parameters followed before it initialised by module type, kept verbatim:
    by parameter-name suffix, in the order of named_parameters()."""
    for name, p in model.named_parameters():
        if name.endswith("bias") or name.endswith("beta"):
            nn.init.zeros_(p)
        elif name.endswith("gamma"):
            nn.init.ones_(p)
        elif name.endswith(("attn.W_O.weight", "ffn.W_out.weight")):
            nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * model.config.n_layers))
        else:
            nn.init.normal_(p, 0.0, 0.02)


@pytest.mark.parametrize("name, overrides", [
    ("smoke", {}), ("cpu", {}), ("shakespeare_char_small", {}), ("shakespeare_char", {}),
    ("smoke", dict(norm="rmsnorm", position="rope", activation="swiglu", bias=False, tie_embeddings=False,
                   n_kv_heads=1)),
    ("smoke", dict(position="sinusoidal", activation="relu", norm="none")),
    ("smoke", dict(position="alibi", activation="none")), ("smoke", dict(n_layers=0)),
])
def test_initialisation_by_module_type_draws_the_tensors_of_the_rule_by_name(name, overrides):
    """Stored notebook outputs depend on the initial weights: the same seed gives the same tensors,
    bit for bit, as the old rule by name (same draws in the same order)."""
    c = GPTConfig.preset(name, **overrides)
    torch.manual_seed(1234)
    by_type = GPT(c).state_dict()
    torch.manual_seed(1234)
    with mock.patch.object(GPT, "reset_parameters", _initialise_by_name):
        by_name = GPT(c).state_dict()
    assert list(by_type) == list(by_name)
    for key, tensor in by_name.items():
        assert torch.equal(by_type[key], tensor), key


def test_training_uses_dropout_and_eval_does_not():
    torch.manual_seed(0)
    model = GPT(small(dropout=0.5))
    idx = torch.randint(0, 37, (2, 8))
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])


# ------------------------------------------------------------------------ parity with Hugging Face GPT-2

def hf_model(vocab: int, max_len: int, d: int, n_layers: int, n_heads: int, seed: int):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=max_len, n_embd=d, n_layer=n_layers,
                                     n_head=n_heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # random biases and norms too, so every mapped tensor matters
        for name, p in model.named_parameters():
            if not name.endswith("wte.weight"):
                p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("vocab, max_len, d, n_layers, n_heads, T", [
    (50, 16, 32, 2, 4, 1), (50, 16, 32, 2, 4, 16), (97, 64, 48, 3, 3, 33), (128, 40, 64, 1, 8, 40)])
def test_logits_match_hugging_face_gpt2(vocab, max_len, d, n_layers, n_heads, T):
    hf = hf_model(vocab, max_len, d, n_layers, n_heads, seed=T)
    ours = GPT.from_hf_state_dict(hf.state_dict(), n_heads=n_heads).eval()
    assert ours.config == GPTConfig(vocab, max_len, n_layers, n_heads, d)
    idx = torch.randint(0, vocab, (3, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        expected = hf(idx).logits
        got, _ = ours(idx)
    assert (got - expected).abs().max() <= 1e-5


def test_hf_loading_rejects_wrong_input_and_keeps_an_untied_head():
    with pytest.raises(KeyError, match="not a GPT-2 state dict"):
        GPT.from_hf_state_dict(GPT(small()).state_dict(), n_heads=4)
    sd = dict(hf_model(50, 16, 32, 1, 4, seed=0).state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0  # no longer a copy of wte: an untied checkpoint
    untied = GPT.from_hf_state_dict(sd, n_heads=4)
    assert not untied.config.tie_embeddings and torch.equal(untied.lm_head.weight, sd["lm_head.weight"])


# ------------------------------------------------------------------------ lesson 07 exercises

def test_block_exercise_catches_an_off_by_one_causal_mask():
    from course_tools.exercises.checks import FAIL, PASS, run
    from course_tools.exercises.references import lesson07 as ex

    assert run("gpt_block", ex.gpt_block, seed=0).status == PASS
    for diagonal, words in ((1, "off by one"), (-1, "see itself")):
        result = run("gpt_block", lambda x, w, h, dg=diagonal: ex._block(x, w, h, diagonal=dg), seed=0)
        assert result.status == FAIL and words in result.report()
    assert "post-LN" in run("gpt_block", lambda x, w, h: ex._block(x, w, h, norm_first=False), seed=0).report()


def test_count_and_loss_exercises():
    from course_tools.exercises.checks import PASS, run
    from course_tools.exercises.references import lesson07 as ex

    assert run("gpt_param_count", ex.gpt_param_count).status == PASS
    tied_twice = run("gpt_param_count", lambda V, n, d, L: ex.gpt_param_count(V, n, d, L) + V * d)
    assert "tied" in tied_twice.report()
    unshifted = run("next_token_loss", lambda lg, t: F.cross_entropy(lg.flatten(0, 1), t.flatten()), seed=0)
    assert "no shift" in unshifted.report()


def test_hf_base_model_state_dict_loads_too_and_trains():
    hf = hf_model(50, 16, 32, 2, 4, seed=1)
    full = GPT.from_hf_state_dict(hf.state_dict(), n_heads=4)
    base = GPT.from_hf_state_dict(hf.transformer.state_dict(), n_heads=4)  # GPT2Model keys, no "transformer."
    idx = torch.randint(0, 50, (2, 9))
    assert torch.equal(full(idx)[0], base(idx)[0])
    assert all(p.requires_grad and p.device.type == "cpu" for p in full.parameters())
    _, loss = full(idx, idx)
    loss.backward()
    assert full.token_embedding.weight.grad is not None
