"""course_utils.activations: the cache of one forward, patching and head ablation, on the GPT in each
configuration and on the encoder–decoder; then parity with Hugging Face and nnsight on SmolLM2."""

import copy

import pytest
import torch
import torch.nn.functional as F

from course_utils import pretrained
from course_utils.activations import ActivationKeyError, ablate_heads, patch_activation, run_with_cache
from course_utils.attention import merge_heads, weights_kept
from course_utils.encoder_decoder import EncoderDecoder, Seq2SeqConfig

B, T, V = 2, 7, 50
CONFIGS = {  # every switch of GPTConfig that changes what a block computes
    "gpt2": dict(),
    "sinusoidal": dict(position="sinusoidal"),
    "rope-gqa-rmsnorm-swiglu": dict(position="rope", n_kv_heads=2, norm="rmsnorm", activation="swiglu", bias=False,
                                    tie_embeddings=False),
    "multi-query": dict(position="rope", n_kv_heads=1),
    "alibi": dict(position="alibi"),
    "no-positions": dict(position="none"),
    "attention-only": dict(activation="none"),
    "explicit-path": dict(sdpa=False),
}


SIZES = dict(vocab_size=V, max_len=16, n_layers=3)  # the conftest's tiny_gpt, with three layers and V tokens


def ids(seed: int, shape=(B, T)) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", CONFIGS)
@torch.no_grad()
def test_gpt_cache_shapes_and_the_models_own_intermediate_values(name, tiny_gpt):
    model, idx = tiny_gpt(**SIZES, **CONFIGS[name]), ids(0)
    c = model.config
    logits, cache = run_with_cache(model, idx)
    assert torch.equal(logits, model(idx)[0]) or (logits - model(idx)[0]).abs().max() <= 1e-6
    for layer in range(c.n_layers):
        assert cache["resid_pre", layer].shape == cache["resid_post", layer].shape == (B, T, c.d_model)
        assert cache["attn", layer].shape == (B, c.n_heads, T, T)
        assert cache["head_out", layer].shape == (B, c.n_heads, T, c.d_model // c.n_heads)
    assert cache.stack("resid_post").shape == (c.n_layers, B, T, c.d_model)
    assert torch.equal(cache["resid_post", -1], cache["resid_post", c.n_layers - 1])
    # the stream, step by step with the model's own modules
    x = model.token_embedding(idx)
    if model.position_embedding is not None:
        x = x + model.position_embedding(T)
    rope = model._rope(0, T, x)
    for layer, block in enumerate(model.blocks):
        assert (cache["resid_pre", layer] - x).abs().max() <= 1e-6, layer
        attn_in = block.norm1(x)
        out, weights = block.attn.forward_with_weights(attn_in, causal=True, rope=rope)
        assert (cache["attn", layer] - weights).abs().max() <= 1e-6, layer
        assert (block.attn.W_O(merge_heads(cache["head_out", layer])) - out).abs().max() <= 1e-5, layer
        x = block(x, causal=True, rope=rope)
        assert (cache["resid_post", layer] - x).abs().max() <= 1e-5, layer
        if layer:
            assert torch.equal(cache["resid_pre", layer], cache["resid_post", layer - 1])
    assert (cache["final_norm"] - model.final_norm(x)).abs().max() <= 1e-5
    unembed = model.token_embedding.weight if model.lm_head is None else model.lm_head.weight
    assert (F.linear(cache["final_norm"], unembed) - logits).abs().max() <= 1e-5
    w = cache["attn", 0]
    assert torch.allclose(w.sum(-1), torch.ones(B, c.n_heads, T)) and not w.triu(1).any()  # rows of 1, causal
    assert cache.names() == ["resid_pre", "resid_post", "attn", "head_out", "final_norm"]


def test_recording_leaves_the_model_as_it_was(tiny_gpt):
    model, idx = tiny_gpt(**SIZES, **CONFIGS["gpt2"]), ids(0)
    before = model(idx)[0]
    with pytest.raises(RuntimeError):
        with weights_kept([model.blocks[0].attn]):
            raise RuntimeError("stop")
    run_with_cache(model, idx)
    for module in model.modules():
        assert "forward" not in vars(module)
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert torch.equal(model(idx)[0], before)
    with pytest.raises(ValueError, match="twice"):
        with weights_kept([model.blocks[0].attn, model.blocks[0].attn]):
            pass


def seq2seq(norm_first: bool, n_encoder_layers: int = 2) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V + 3, src_max_len=12, tgt_max_len=10,
                                        d_model=16, n_heads=2, n_encoder_layers=n_encoder_layers,
                                        n_decoder_layers=3, norm_first=norm_first)).eval()


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@torch.no_grad()
def test_encoder_decoder_cache(norm_first):
    model, S = seq2seq(norm_first), 9
    src, tgt = ids(1, (B, S)).clamp(min=3), ids(2, (B, T))
    src[1, -2:] = 0  # padding in the second source
    logits, cache = run_with_cache(model, src, tgt)
    assert (logits - model(src, tgt)).abs().max() <= 1e-6  # recorded on the explicit path; the same numbers
    assert cache["encoder.attn", 1].shape == (B, 2, S, S) and cache["encoder.head_out", 0].shape == (B, 2, S, 8)
    assert cache["decoder.attn", 2].shape == (B, 2, T, T) and cache["decoder.cross_attn", 2].shape == (B, 2, T, S)
    assert cache["decoder.resid_post", 2].shape == cache["decoder.final_norm"].shape == (B, T, 16)
    assert not cache["encoder.attn", 0][1, ..., -2:].any() and not cache["decoder.attn", 1].triu(1).any()
    memory_kv, keep = model.encode(src)
    memory = model.transformer.encode(model.src_embedding(src), keep)
    assert (cache["encoder.final_norm"] - memory).abs().max() <= 1e-6
    _, maps = model.decode_with_weights(tgt, memory_kv, keep)
    for layer in range(3):
        assert (cache["decoder.cross_attn", layer] - maps[layer]).abs().max() <= 1e-6
    assert torch.equal(cache["decoder.resid_pre", 0], model.tgt_embedding(tgt))
    assert torch.equal(cache["decoder.resid_pre", 1], cache["decoder.resid_post", 0])
    final = model.transformer.decoder.final_norm(cache["decoder.resid_post", 2])
    assert torch.equal(final, cache["decoder.final_norm"])
    names = run_with_cache(seq2seq(norm_first, 0), src, tgt)[1].names()
    assert "encoder.final_norm" in names and not any(name.startswith("encoder.resid") for name in names)


def logit_change_from(clean: torch.Tensor, patched: torch.Tensor) -> torch.Tensor:
    """(T,) whether each position's logits moved (any batch row)."""
    return (patched - clean).abs().amax(dim=(0, 2)) > 1e-6


@pytest.mark.parametrize("name", ["gpt2", "rope-gqa-rmsnorm-swiglu"])
@pytest.mark.parametrize("key", [("resid_pre", 0), ("resid_post", 1), ("head_out", 1)])
@torch.no_grad()
def test_patching_is_exact_on_its_own_run_and_causal_on_another(name, key, tiny_gpt):
    model, clean, corrupt = tiny_gpt(**SIZES, **CONFIGS[name]), ids(3), ids(4)
    clean_logits, clean_cache = run_with_cache(model, clean)
    corrupt_logits = model(corrupt)[0]
    with patch_activation(model, key, clean_cache[key], positions=[1, 3]):
        assert torch.equal(run_with_cache(model, clean)[0], clean_logits)  # on the path that recorded the value
        patched = model(corrupt)[0]
    moved = logit_change_from(corrupt_logits, patched)
    assert not moved[:1].any() and moved[1:].all(), moved  # nothing before the first patched position changes
    with patch_activation(model, key, clean_cache[key]):  # every position: the clean run, downstream of the key
        assert (model(corrupt)[0] - clean_logits).abs().max() <= 1e-5 or key[0] == "head_out"
    assert torch.equal(model(corrupt)[0], corrupt_logits)  # the hook is gone


@torch.no_grad()
def test_patching_the_last_stream_everywhere_gives_the_clean_logits_and_cache_sees_the_patch(tiny_gpt):
    model, clean, corrupt = tiny_gpt(**SIZES, **CONFIGS["gpt2"]), ids(3), ids(4)
    clean_logits, clean_cache = run_with_cache(model, clean)
    with patch_activation(model, ("resid_post", -1), clean_cache["resid_post", -1]):
        logits, cache = run_with_cache(model, corrupt)
    assert torch.equal(logits, clean_logits) and torch.equal(cache["resid_post", 2], clean_cache["resid_post", 2])
    assert not torch.equal(cache["resid_post", 1], clean_cache["resid_post", 1])


@torch.no_grad()
def test_patching_one_head_changes_that_head_only(tiny_gpt):
    model, clean, corrupt = tiny_gpt(**SIZES, **CONFIGS["gpt2"]), ids(3), ids(4)
    _, clean_cache = run_with_cache(model, clean)
    with patch_activation(model, ("head_out", 1), clean_cache["head_out", 1], positions=-1, heads=2):
        _, cache = run_with_cache(model, corrupt)
    _, corrupt_cache = run_with_cache(model, corrupt)
    got, clean_heads, corrupt_heads = cache["head_out", 1], clean_cache["head_out", 1], corrupt_cache["head_out", 1]
    assert torch.equal(got[:, 2, -1], clean_heads[:, 2, -1])
    assert torch.equal(got[:, 2, :-1], corrupt_heads[:, 2, :-1])
    assert torch.equal(got[:, [0, 1, 3]], corrupt_heads[:, [0, 1, 3]])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@torch.no_grad()
def test_patching_the_decoder_is_causal_and_the_encoder_reaches_every_target_position(norm_first):
    model = seq2seq(norm_first)
    src, other_src, tgt, other_tgt = ids(1, (B, 9)), ids(5, (B, 9)), ids(2, (B, T)), ids(6, (B, T))
    _, clean_cache = run_with_cache(model, src, tgt)
    base = model(src, other_tgt)
    with patch_activation(model, ("decoder.resid_post", 0), clean_cache["decoder.resid_post", 0], positions=4):
        moved = logit_change_from(base, model(src, other_tgt))
    assert not moved[:4].any() and moved[4:].all()
    with patch_activation(model, ("decoder.cross_head_out", 1), clean_cache["decoder.cross_head_out", 1],
                          positions=2, heads=0):
        moved = logit_change_from(base, model(src, other_tgt))
    assert not moved[:2].any() and moved[2]
    base = model(other_src, tgt)
    with patch_activation(model, ("encoder.resid_post", 1), clean_cache["encoder.resid_post", 1], positions=0):
        assert logit_change_from(base, model(other_src, tgt)).all()  # every target position reads the source


@pytest.mark.parametrize("name", ["gpt2", "rope-gqa-rmsnorm-swiglu"])
@torch.no_grad()
def test_ablating_heads_equals_editing_w_o(name, tiny_gpt):
    model, idx = tiny_gpt(**SIZES, **CONFIGS[name]), ids(3)
    d = model.config.d_model // model.config.n_heads
    logits, cache = model(idx)[0], run_with_cache(model, idx)[1]
    with ablate_heads(model, []):
        assert torch.equal(model(idx)[0], logits)
    heads = [(0, 1), (2, 0), (2, 3)]
    for mean_of in (None, cache):
        with ablate_heads(model, heads, mean_of=mean_of):
            ablated = model(idx)[0]
        edited = copy.deepcopy(model)  # the same ablation written into W_O: its columns of those heads
        for layer, head in heads:
            W_O = edited.blocks[layer].attn.W_O
            columns = W_O.weight[:, head * d:(head + 1) * d]
            if mean_of is not None:  # their constant contribution moves into the bias
                mean = cache["head_out", layer][:, head].mean(dim=(0, 1))
                W_O.bias = torch.nn.Parameter((0 if W_O.bias is None else W_O.bias) + columns @ mean)
            columns.zero_()
        assert (ablated - edited(idx)[0]).abs().max() <= 1e-5
        assert (ablated - logits).abs().max() > 1e-3


@torch.no_grad()
def test_one_line_errors(tiny_gpt):
    model, idx = tiny_gpt(**SIZES, **CONFIGS["gpt2"]), ids(0)
    _, cache = run_with_cache(model, idx)
    cases = [
        (lambda: cache["resid", 0], ActivationKeyError, "no activation .* a name from resid_pre"),
        (lambda: cache["resid_post", 3], ActivationKeyError, "layer 3 of 'resid_post' does not exist: .* 3 blocks"),
        (lambda: cache["resid_post", -4], ActivationKeyError, "layers 0 to 2"),
        (lambda: cache["attn"], ActivationKeyError, "give a layer"),
        (lambda: cache["final_norm", 0], ActivationKeyError, "without a layer"),
        (lambda: cache.stack("final"), ActivationKeyError, "no activation"),
        (lambda: run_with_cache(torch.nn.Linear(2, 2), idx), TypeError, "use a gpt.GPT"),
        (lambda: patch_activation(model, ("attn", 0), cache["attn", 0]).__enter__(), ValueError, "patch the heads"),
        (lambda: patch_activation(model, ("resid_post", 0), cache["resid_post", 0], heads=1).__enter__(), ValueError,
         "'resid_post' is not one"),
        (lambda: patch_activation(model, ("head_out", 0), cache["head_out", 0], heads=[4]).__enter__(), ValueError,
         "head 4 does not exist: there are 4 heads"),
        (lambda: ablate_heads(model, [(3, 0)]).__enter__(), ActivationKeyError, "layer 3"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message) as info:
            call()
        assert "\n" not in str(info.value)
    for patch, message in [(dict(positions=T), f"position {T} does not exist: there are {T} positions"),
                           (dict(value=cache["resid_post", 0][:, :3]), r"has shape \(2, 3, 32\) but the activation")]:
        with patch_activation(model, ("resid_post", 0), **{"value": cache["resid_post", 0], **patch}):
            with pytest.raises(ValueError, match=message) as info:
                model(idx)
        assert "\n" not in str(info.value)


# ---------------------------------------------------------------- SmolLM2: Hugging Face and nnsight

CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = pretrained.fetch(pretrained.SMOLLM2)
    except pretrained.ModelUnavailable as err:
        pytest.skip(str(err))
    return pretrained.load_gguf(path), path


@pytest.fixture(scope="module")
def hf_smollm2(smollm2):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    _, path = smollm2
    return transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                         attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def prompts(smollm2):
    (_, tok), _ = smollm2
    clean, corrupt = (torch.tensor([tok.encode(text)]) for text in (CLEAN, CORRUPT))
    assert clean.shape == corrupt.shape == (1, 9)
    return clean, corrupt, tok.encode(" Paris")[0], tok.encode(" Rome")[0]


def layer_errors(model, hf, idx):
    """Per block, the largest |ours − Hugging Face's| of the stream entering it, the same divided by that
    stream's largest entry, and of its attention probabilities; and of the final-normed stream (Hugging Face's
    last hidden state is taken after the final norm)."""
    L = model.config.n_layers
    with torch.no_grad():
        _, cache = run_with_cache(model, idx)
        out = hf(idx, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == L + 1 and len(out.attentions) == L
    absolute = [(cache["resid_pre", layer] - out.hidden_states[layer]).abs().max().item() for layer in range(L)]
    relative = [a / out.hidden_states[layer].abs().max().item() for layer, a in enumerate(absolute)]
    attention = [(cache["attn", layer] - out.attentions[layer]).abs().max().item() for layer in range(L)]
    final = (cache["final_norm"] - out.hidden_states[L]).abs().max().item()
    return absolute, relative, attention, final


def eager_attention_in_float64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Hugging Face's ``eager_attention_forward`` for LLaMA, line for line, but for its softmax, which it
    computes in float32 whatever the model's dtype; here it stays in the queries' dtype (float64)."""
    from transformers.models.llama.modeling_llama import repeat_kv

    keys, values = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.nn.functional.softmax(weights, dim=-1)
    return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights


def rms_norm_in_float64(self, hidden_states):
    """Hugging Face's ``LlamaRMSNorm.forward`` without its cast to float32: the same formula in the input's dtype."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.mark.slow
def test_smollm2_streams_and_attention_equal_hugging_face(smollm2, hf_smollm2, prompts, monkeypatch):
    """float32, as the lessons run: every attention probability and the final-normed stream agree to 1e-4.
    The stream itself reaches 650 in layers 3-10 and about 22,500 from layer 12 on (SmolLM2's massive
    activations), where one float32 step is 6e-5 and 0.002: there it is held to 1e-6 of the stream's largest
    entry. float64: every stream and probability agrees to 1e-4, once the reference keeps float64 where it
    casts to float32 even in a float64 model (the RoPE angles, the softmax, RMSNorm)."""
    from test_smollm2 import float64_angles
    from transformers.models.llama import modeling_llama

    (model, _), _ = smollm2
    clean = prompts[0]
    _, relative, attention, final = layer_errors(model, hf_smollm2, clean)
    assert max(relative) <= 1e-6 and max(attention) <= 1e-4 and final <= 1e-4, (relative, attention, final)
    model64, hf64 = copy.deepcopy(model).double(), copy.deepcopy(hf_smollm2).double()
    float64_angles(hf64)
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", eager_attention_in_float64)
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", rms_norm_in_float64)
    absolute, _, attention, final = layer_errors(model64, hf64, clean)
    assert max(absolute) <= 1e-4 and max(attention) <= 1e-4 and final <= 1e-4, (absolute, attention, final)


@pytest.mark.slow
def test_smollm2_patching_equals_nnsight(smollm2, hf_smollm2, prompts):
    """Causal tracing at one (layer, position): the clean run's residual stream after block 5 at the subject's
    last token, patched into the corrupted run; the logit difference " Paris" − " Rome" after it, ours against
    nnsight's intervention on Hugging Face's model."""
    nnsight = pytest.importorskip("nnsight")
    (model, _), _ = smollm2
    clean, corrupt, paris, rome = prompts
    layer, position = 5, 3

    def difference(logits: torch.Tensor) -> float:
        return (logits[0, -1, paris] - logits[0, -1, rome]).item()

    with torch.no_grad():
        _, cache = run_with_cache(model, clean)
        with patch_activation(model, ("resid_post", layer), cache["resid_post", layer], positions=position):
            ours = difference(model(corrupt)[0])
        corrupted = difference(model(corrupt)[0])
        traced = nnsight.NNsight(hf_smollm2)
        with traced.trace(clean):
            stream = traced.model.layers[layer].output.save()
        with traced.trace(corrupt):
            traced.model.layers[layer].output[:, position] = stream[:, position]
            logits = traced.lm_head.output.save()
    assert abs(ours - difference(logits)) <= 1e-4, (ours, difference(logits))
    assert ours - corrupted > 1.0  # the patch matters: the comparison is not of two unpatched runs
