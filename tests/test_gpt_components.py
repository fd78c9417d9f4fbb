"""The component switches of GPTConfig: exact counts for every combination, grouped-query attention,
RoPE/ALiBi inside attention, the KV cache with each of them, and the error messages."""

import contextlib
import itertools
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from course_utils.attention import ModelKVCache, MultiHeadAttention, split_heads
from course_utils.config import POSITIONS
from course_utils.counting import (
    attention_parameter_count,
    count_instantiated,
    count_params,
    flops_per_token,
    kv_cache_bytes_per_token,
)
from course_utils.generate import generate
from course_utils.gpt import GPT, GPTConfig, gpt_block
from course_utils.positional import SinusoidalPositionalEncoding, apply_rope, rope_halves_to_pairs, sinusoidal_encoding

NORMS = ("layernorm", "rmsnorm", "none")
FFNS = ("gelu_tanh", "swiglu", "relu", "none")
SMALL = dict(vocab_size=37, max_len=16, n_layers=2, n_heads=4, d_model=32)


def grid():
    """Every norm x position x feed-forward, with GQA/bias/residual/tying cycled through their values."""
    others = itertools.cycle(itertools.product((None, 2, 1), (True, False), (True, False), (True, False)))
    components = itertools.product(NORMS, POSITIONS, FFNS)
    for (norm, position, ffn), (kv, bias, residual, tie) in zip(components, others, strict=False):
        yield GPTConfig(**SMALL, norm=norm, position=position, activation=ffn, n_kv_heads=kv, bias=bias,
                        residual=residual, tie_embeddings=tie, d_ff=48 if ffn == "swiglu" else None)


GRID = list(grid())


def test_grid_covers_every_value():
    for field, values in (("norm", NORMS), ("position", POSITIONS), ("activation", FFNS), ("n_kv_heads", (None, 2, 1)),
                          ("bias", (True, False)), ("residual", (True, False)), ("tie_embeddings", (True, False))):
        assert {getattr(c, field) for c in GRID} == set(values), field


def test_count_params_equals_the_meta_model_for_every_combination():
    wrong = [(c, count_params(c), count_instantiated(c)) for c in GRID if count_params(c) != count_instantiated(c)]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("kv", [None, 2, 1])
def test_count_params_full_product_at_one_size(kv):
    for norm, position, ffn, bias, tie in itertools.product(NORMS, POSITIONS, FFNS, (True, False), (True, False)):
        c = GPTConfig(**SMALL, norm=norm, position=position, activation=ffn, n_kv_heads=kv, bias=bias,
                      tie_embeddings=tie)
        assert count_params(c) == count_instantiated(c), c


def test_published_llama_counts():
    llama = GPTConfig.preset("llama2_7b")
    assert count_params(llama) == count_instantiated(llama) == 6_738_415_616
    assert count_params(GPTConfig.preset("llama3_8b")) == 8_030_261_248
    assert count_params(GPTConfig.preset("gpt2")) == 124_439_808


def non_matmul_params(model: GPT) -> int:
    """Parameters no matrix product reads: embedding lookups, norms, biases (the tied W_emb is a matmul)."""
    matmul = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    if model.lm_head is None:
        matmul.add(id(model.token_embedding.weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in matmul)


@pytest.mark.parametrize("config", GRID[::7], ids=lambda c: f"{c.norm}-{c.position}-{c.activation}-kv{c.n_kv_heads}")
def test_flops_per_token_equals_counted_matmuls(config):
    torch.manual_seed(0)
    model = GPT(replace(config, sdpa=False)).eval()  # plain matmuls, which FlopCounterMode counts (not the kernel)
    T = config.max_len
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, config.vocab_size, (2, T)))
    measured = counter.get_total_flops() / (2 * T)
    assert measured == flops_per_token(config, T) - 2 * non_matmul_params(model)
    assert flops_per_token(config, T, training=True) == 3 * flops_per_token(config, T)


def test_gqa_attention_parameter_count():
    attn = MultiHeadAttention(64, 8, n_kv_heads=2)
    assert attn.W_K.weight.shape == (16, 64) and attn.W_V.weight.shape == (16, 64)
    expected = 2 * 64 * 64 + 2 * 64 * 16 + 2 * 64 + 2 * 16  # W_Q, W_O; W_K, W_V at 2 heads of 8; biases
    assert sum(p.numel() for p in attn.parameters()) == attention_parameter_count(64, 8, 2) == expected


@pytest.mark.parametrize("kv", [4, 2, 1])
def test_gqa_equals_multi_head_with_repeated_kv_weights(kv):
    torch.manual_seed(0)
    gqa = MultiHeadAttention(32, 4, n_kv_heads=kv)
    mha = MultiHeadAttention(32, 4)
    group = 4 // kv
    with torch.no_grad():
        mha.W_Q.load_state_dict(gqa.W_Q.state_dict())
        mha.W_O.load_state_dict(gqa.W_O.state_dict())
        for name in ("W_K", "W_V"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            dst.weight.copy_(src.weight.view(kv, 8, 32).repeat_interleave(group, 0).reshape(32, 32))
            dst.bias.copy_(src.bias.view(kv, 8).repeat_interleave(group, 0).reshape(32))
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(gqa(x, causal=True), mha(x, causal=True), atol=1e-6, rtol=1e-5)
    if kv < 4:
        assert not torch.allclose(gqa(x, causal=True), MultiHeadAttention(32, 4)(x, causal=True))


@pytest.mark.parametrize("extra", [dict(n_kv_heads=2), dict(n_kv_heads=1, rope_base=100.0), dict(alibi=True),
                                   dict(n_kv_heads=2, alibi=True)], ids=str)
def test_attention_paths_agree_with_gqa_rope_alibi(extra):
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4, **extra)
    x = torch.randn(2, 6, 32)
    explicit, weights = attn.forward_with_weights(x, causal=True)
    torch.testing.assert_close(attn(x, causal=True), explicit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 6))
    assert torch.all(weights.triu(1) == 0)  # causal


def test_rope_in_attention_scores_depend_on_distance_only():
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, rope_base=10000.0, bias=False)
    token = torch.randn(1, 1, 16)
    x = token.expand(1, 8, 16)  # the same token everywhere: scores may depend on positions only
    _, w = attn.forward_with_weights(x)
    scores = torch.log(w[0, 0])  # log-softmax rows differ from scores by a per-row constant
    rel = scores - scores.diagonal()[:, None]
    torch.testing.assert_close(rel[3, 1], rel[6, 4], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(rel[3, 1], rel[3, 2], atol=1e-3)


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kv", [None, 1])
def test_kv_cache_matches_full_forward_and_stores_kv_heads(position, kv):
    c = GPTConfig(**SMALL, position=position, n_kv_heads=kv, norm="rmsnorm", activation="swiglu")
    torch.manual_seed(0)
    model = GPT(c).eval()
    idx = torch.randint(0, c.vocab_size, (2, 9))
    cache = ModelKVCache(c.n_layers)
    with torch.no_grad():
        full, _ = model(idx)
        steps = [model(idx[:, :4], kv_cache=cache)[0]]
        steps += [model(idx[:, t:t + 1], kv_cache=cache)[0] for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].k.shape == (2, c.kv_heads, 9, 8) and cache.layers[0].v.shape == (2, c.kv_heads, 9, 8)
    assert kv_cache_bytes_per_token(c, 4) == sum(layer.k[0, :, 0].numel() + layer.v[0, :, 0].numel()
                                                 for layer in cache.layers) * 4


def test_switches_change_the_model():
    base = GPTConfig(**SMALL)
    for change in (dict(norm="rmsnorm"), dict(norm="none"), dict(position="rope"), dict(position="none"),
                   dict(activation="swiglu", d_ff=48), dict(activation="none"), dict(residual=False),
                   dict(n_kv_heads=1), dict(tie_embeddings=False), dict(position="alibi"), dict(position="sinusoidal")):
        torch.manual_seed(0)
        a = GPT(base).eval()
        torch.manual_seed(0)
        b = GPT(GPTConfig(**SMALL, **change)).eval()
        if set(change) <= {"norm", "position", "residual"}:  # same parameters: copy them over
            b.load_state_dict(a.state_dict(), strict=False)
        idx = torch.randint(0, 37, (1, 8), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert not torch.allclose(a(idx)[0], b(idx)[0], atol=1e-4), change


def test_structure_of_switched_blocks():
    m = GPT(GPTConfig(**SMALL, norm="none", activation="none", tie_embeddings=False, position="rope"))
    block = m.blocks[0]
    assert isinstance(block.norm1, nn.Identity) and block.ffn is None and block.norm2 is None
    assert m.position_embedding is None and m.lm_head.weight.shape == (37, 32)
    assert isinstance(GPT(GPTConfig(**SMALL, position="sinusoidal")).position_embedding, SinusoidalPositionalEncoding)
    bigram = GPT(GPTConfig(**{**SMALL, "n_layers": 0}, position="none", norm="none"))
    assert sum(p.numel() for p in bigram.parameters()) == 37 * 32


def test_block_without_residual_is_plain_composition():
    torch.manual_seed(0)
    block = gpt_block(GPTConfig(20, 8, 1, 2, 16, residual=False, norm="none")).eval()
    x = torch.randn(2, 5, 16)
    expected = block.ffn(block.attn(x, causal=True))
    torch.testing.assert_close(block(x, causal=True), expected)


def test_sinusoidal_module_and_lengths_past_max_len():
    enc = SinusoidalPositionalEncoding(8)
    torch.testing.assert_close(enc(5, offset=3), sinusoidal_encoding(8, 8)[3:])
    idx = torch.zeros(1, SMALL["max_len"] + 8, dtype=torch.long)
    for position in ("rope", "alibi", "none", "sinusoidal"):
        logits, _ = GPT(GPTConfig(**SMALL, position=position))(idx)  # no table, so no maximum length
        assert logits.shape == (1, SMALL["max_len"] + 8, 37)
    with pytest.raises(ValueError, match="longer than the context"):
        GPT(GPTConfig(**SMALL))(idx)


def test_every_position_kind_runs_in_the_models_dtype():
    """The fixed sinusoids are made in float32 on the CPU; the model adds them in its own dtype (and,
    on a GPU, on its own device: tests/test_gpu.py), so a bfloat16 model stays bfloat16 throughout."""
    idx = torch.randint(37, (2, 6))
    for position in ("learned", "sinusoidal", "rope", "alibi", "none"):
        model = GPT(GPTConfig(**SMALL, position=position)).to(torch.bfloat16)
        logits, loss = model(idx, idx)
        assert logits.dtype == torch.bfloat16 and torch.isfinite(loss), position


def rotate_half_rope(x: torch.Tensor, base: float) -> torch.Tensor:
    """Hugging Face LLaMA's convention: feature j rotates with j + d/2."""
    d = x.shape[-1]
    angle = torch.arange(x.shape[-2])[:, None].double() * base ** (-torch.arange(0, d, 2).double() / d)
    cos, sin = torch.cat([angle.cos()] * 2, -1).float(), torch.cat([angle.sin()] * 2, -1).float()
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * cos + rotated * sin


def test_rope_halves_to_pairs_converts_the_convention():
    torch.manual_seed(0)
    H, d, D = 3, 8, 12
    w = torch.randn(H * d, D)
    x = torch.randn(5, D)
    theirs = rotate_half_rope((x @ w.T).view(5, H, d).transpose(0, 1), 500.0)  # (H, T, d)
    ours = apply_rope((x @ rope_halves_to_pairs(w, H).T).view(5, H, d).transpose(0, 1), torch.arange(5), 500.0)
    perm = rope_halves_to_pairs(torch.arange(d)[:, None], 1).flatten()
    torch.testing.assert_close(ours, theirs[..., perm], atol=1e-5, rtol=1e-5)
    assert perm.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_kv_heads=3), "must divide n_heads"),
    (dict(norm="batchnorm"), "norm='batchnorm' is not known"),
    (dict(position="relative"), "position='relative' is not known"),
    (dict(activation="tanh"), "activation='tanh' is not known"),
    (dict(n_layers=-1), "n_layers must be >= 0"),
    (dict(n_heads=32, position="rope"), "must be even"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**{**SMALL, **kwargs})


def test_attention_errors():
    with pytest.raises(ValueError, match="must divide n_heads"):
        MultiHeadAttention(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="not both"):
        MultiHeadAttention(32, 4, rope_base=10000.0, alibi=True)
    with pytest.raises(ValueError, match="even size"):
        rope_halves_to_pairs(torch.zeros(12, 4), 4)


def test_kv_cache_bytes_at_llama_sizes():
    assert kv_cache_bytes_per_token(GPTConfig.preset("llama2_7b")) == 2 * 32 * 4096 * 2 == 524_288
    assert kv_cache_bytes_per_token(GPTConfig.preset("llama2_70b")) == 2 * 80 * 8 * 128 * 2
    assert math.isclose(kv_cache_bytes_per_token(GPTConfig.preset("llama2_7b", n_kv_heads=1)) * 32, 524_288)


# --- lesson 09 exercises: the references agree with the library, hints name the mistake --------------
from course_tools.exercises.references import lesson09 as ex  # noqa: E402


def test_exercise_references_agree_with_the_library():
    torch.manual_seed(0)
    block = gpt_block(GPTConfig(84, 16, 1, 4, 64, d_ff=170, activation="swiglu", bias=False, norm="rmsnorm",
                                n_kv_heads=1))
    assert ex.llama_block_params(64, 4, 1, 170) == sum(p.numel() for p in block.parameters())
    ffn = block.ffn
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(ex.swiglu(x, ffn.W_gate.weight.T, ffn.W_in.weight.T, ffn.W_out.weight.T), ffn(x))
    attn = MultiHeadAttention(64, 4, n_kv_heads=2, bias=False)
    q, k, v = split_heads(attn.W_Q(x), 4), split_heads(attn.W_K(x), 2), split_heads(attn.W_V(x), 2)
    expected = attn.W_O.weight @ ex.gqa_attention(q, k, v).transpose(1, 2).reshape(2, 3, 64)[..., None]
    torch.testing.assert_close(expected[..., 0], attn(x, causal=True), atol=1e-5, rtol=1e-5)


def test_exercise_hints(run_exercise):
    import torch.nn.functional as F

    assert "swapped" in run_exercise("swiglu", lambda x, g, i, o: (F.silu(x @ i) * (x @ g)) @ o).report()
    assert "not the GELU" in run_exercise("swiglu", lambda x, g, i, o: (F.gelu(x @ g) * (x @ i)) @ o).report()
    only_q = lambda q, k, b: ex._rope_scores(q, k, b, rotate_k=False)
    assert "rotate the keys too" in run_exercise("rope_scores", only_q).report()
    halves = lambda q, k, b: ex._rope_scores(q, k, b, halves=True)
    assert "neighbours" in run_exercise("rope_scores", halves).report()
    tiled = lambda q, k, v: ex._attend(q, k.repeat(1, q.shape[1] // k.shape[1], 1, 1),
                                       v.repeat(1, q.shape[1] // k.shape[1], 1, 1))
    assert "repeat_interleave" in run_exercise("gqa_attention", tiled).report()

    def expanded_cache(q, k_new, v_new, k_cache, v_cache):
        out, k_all, v_all = ex.gqa_cache_step(q, k_new, v_new, k_cache, v_cache)
        g = q.shape[1] // k_all.shape[1]
        return out, k_all.repeat_interleave(g, 1), v_all.repeat_interleave(g, 1)

    assert "only the H_kv" in run_exercise("gqa_cache_step", expanded_cache).report()
    mha_count = lambda d, h, kv, f: ex.llama_block_params(d, h, h, f)
    assert "D × (H_kv·D/H)" in run_exercise("llama_block_params", mha_count).report()
    ln_count = lambda d, h, kv, f: ex.llama_block_params(d, h, kv, f) + 2 * d
    assert "no shift β" in run_exercise("llama_block_params", ln_count).report()


def test_generate_with_a_bigram_model_and_no_blocks():
    torch.manual_seed(0)
    bigram = GPT(GPTConfig(**{**SMALL, "n_layers": 0}, position="none", norm="none"))
    out = generate(bigram, torch.zeros(1, 1, dtype=torch.long), 5, temperature=0.0)
    logits = bigram.token_embedding.weight @ bigram.token_embedding.weight.T  # token t -> scores of the next
    expected = [0]
    for _ in range(5):
        expected.append(int(logits[expected[-1]].argmax()))
    assert out[0].tolist() == expected


@pytest.mark.parametrize("sdpa, precision", [(True, None), (False, None), (True, torch.bfloat16)])
def test_rope_table_is_computed_once_per_forward_and_passed_down(sdpa, precision, monkeypatch):
    """GPT.forward makes RoPE's cos/sin once for all its blocks (no layer computes its own, no
    table is kept between calls), and the logits equal those of layers that each make their own,
    under autocast too (the table is made in the precision of the queries)."""
    from course_utils import attention, gpt

    model = GPT(GPTConfig(**SMALL, position="rope", n_kv_heads=2, sdpa=sdpa)).eval()
    idx = torch.randint(0, 37, (2, 9))
    calls = {"model": 0, "layer": 0}

    def counted(who, real):
        def table(*args):
            calls[who] += 1
            return real(*args)
        return table

    monkeypatch.setattr(gpt, "rope_table", counted("model", attention.rope_table))
    monkeypatch.setattr(attention, "rope_table", counted("layer", attention.rope_table))
    autocast = torch.autocast("cpu", dtype=precision) if precision else contextlib.nullcontext()
    with torch.no_grad(), autocast:
        logits, _ = model(idx)
        model(idx)
        x = model.drop(model.token_embedding(idx))
        for block in model.blocks:  # no table handed down: each attention layer computes its own
            x = block(x, causal=True)
        by_layers = F.linear(model.final_norm(x), model.token_embedding.weight)
    assert calls == {"model": 2, "layer": SMALL["n_layers"]}
    torch.testing.assert_close(logits, by_layers, rtol=0, atol=0)


def test_attention_alone_computes_its_own_rope_table():
    """MultiHeadAttention with rope_base, outside a GPT: the same output as with the table passed in,
    and equal to rotating q and k with positional.apply_rope by hand."""
    from course_utils.attention import merge_heads, rope_table, scaled_dot_product_attention

    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, rope_base=500.0, bias=False).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        alone = attn(x, causal=True)
        given = attn(x, causal=True, rope=rope_table(0, 6, 8, 500.0, x.dtype, x.device))
        q, k, v = (split_heads(w(x), 2) for w in (attn.W_Q, attn.W_K, attn.W_V))
        pos = torch.arange(6)
        out, _ = scaled_dot_product_attention(apply_rope(q, pos, 500.0), apply_rope(k, pos, 500.0), v, causal=True)
        by_hand = attn.W_O(merge_heads(out))
    assert torch.equal(alone, given)
    torch.testing.assert_close(alone, by_hand)


def test_rope_inside_the_forward_keeps_a_compiled_graph_whole():
    """The table is computed inside GPT.forward, so torch.compile traces it with the rest: one graph,
    no break (the eager back-end checks the tracing without compiling kernels)."""
    model = GPT(GPTConfig(**SMALL, position="rope", norm="rmsnorm")).eval()
    idx = torch.randint(0, 37, (2, 9))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(idx)[0], model(idx)[0])
