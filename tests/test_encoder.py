"""The encoder: masks, pooling, the weight mapping, and parity with the real all-MiniLM-L6-v2.

The reference side runs ``transformers``' BertModel and ``sentence-transformers`` on the packaged
model directory, offline (HF_HUB_OFFLINE=1): the course's encoder must give their numbers.
"""

import math
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # prove that nothing is fetched; set before transformers loads

import pytest
import torch
import torch.nn.functional as F

from course_utils.attention import padding_mask
from course_utils.encoder import (
    POSITION_IDS_KEY,
    EncoderConfig,
    TransformerEncoder,
    bert_key_to_encoder,
    extended_attention_mask,
    load_minilm,
    map_bert_state_dict,
    mean_pool,
    minilm_dir,
    parameter_counts,
)

TINY = EncoderConfig(vocab_size=50, max_len=16, d_model=8, n_heads=2, n_layers=2, d_ff=32)
SENTENCES = [
    "A man is playing the piano.",
    "The kids play football in the park after school, even when it rains all afternoon.",
    "Hi",
    "The animal didn't cross the street because it was too tired.",
]
TOLERANCE = 1e-5


def tiny_encoder(seed: int = 0, **changes) -> TransformerEncoder:
    torch.manual_seed(seed)
    config = EncoderConfig(**{**TINY.__dict__, **changes})
    return TransformerEncoder(config).eval()


# --- configuration ----------------------------------------------------------------------------

def test_config_rejects_heads_that_do_not_divide_d_model():
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        EncoderConfig(d_model=10, n_heads=3)


def test_config_rejects_non_positive_sizes_and_bad_pad_id():
    with pytest.raises(ValueError, match="n_layers must be positive"):
        EncoderConfig(n_layers=0)
    with pytest.raises(ValueError, match="pad_id"):
        EncoderConfig(vocab_size=10, pad_id=10)


def test_config_from_bert_config_and_its_refusals():
    bert = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_size": 384,
            "num_attention_heads": 12, "num_hidden_layers": 6, "intermediate_size": 1536,
            "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute"}
    assert EncoderConfig.from_bert_config(bert) == EncoderConfig()
    with pytest.raises(ValueError, match="exact GELU"):
        EncoderConfig.from_bert_config({**bert, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="absolute"):
        EncoderConfig.from_bert_config({**bert, "position_embedding_type": "relative_key"})


# --- masks and pooling --------------------------------------------------------------------------

def test_extended_mask_shape_and_meaning():
    lengths = torch.tensor([3, 5, 1])
    mask = extended_attention_mask(padding_mask(lengths, 5).long())
    assert mask.shape == (3, 1, 1, 5) and mask.dtype == torch.bool
    assert mask.sum(dim=-1).flatten().tolist() == [3, 5, 1]


def test_extended_mask_errors():
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        extended_attention_mask(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="no real token"):
        extended_attention_mask(torch.tensor([[1, 1], [0, 0]]))


def test_mean_pool_ignores_padding():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 6, 4, generator=gen)
    mask = padding_mask(torch.tensor([2, 6]), 6)
    pooled = mean_pool(hidden, mask)
    torch.testing.assert_close(pooled[0], hidden[0, :2].mean(dim=0))
    torch.testing.assert_close(pooled[1], hidden[1].mean(dim=0))
    garbage = hidden.clone()
    garbage[0, 2:] = 1e6
    torch.testing.assert_close(mean_pool(garbage, mask), pooled)


def test_mean_pool_checks_shapes():
    with pytest.raises(ValueError, match=r"hidden \(B, T, D\) and attention_mask \(B, T\)"):
        mean_pool(torch.zeros(2, 3, 4), torch.ones(2, 4))


# --- the encoder on random weights -----------------------------------------------------------------

def test_forward_shapes_and_hidden_states():
    model = tiny_encoder()
    ids = torch.randint(0, 50, (3, 7))
    assert model(ids).shape == (3, 7, 8)
    states = model.hidden_states(ids)
    assert len(states) == 3 and all(s.shape == (3, 7, 8) for s in states)
    torch.testing.assert_close(states[-1], model(ids))


def test_embeddings_are_rows_of_the_tables():
    model = tiny_encoder()
    ids = torch.tensor([[4, 9, 4]])
    emb = model.embeddings
    raw = emb.token_embedding.weight[ids[0]] + emb.position_embedding.weight[:3] + emb.type_embedding.weight[0]
    torch.testing.assert_close(emb(ids)[0], emb.norm(raw))
    one_hot = F.one_hot(ids[0], 50).float()
    torch.testing.assert_close(one_hot @ emb.token_embedding.weight, emb.token_embedding.weight[ids[0]])


def test_padding_does_not_change_real_tokens():
    model = tiny_encoder()
    ids = torch.randint(1, 50, (1, 5))
    alone = model(ids, torch.ones_like(ids))
    padded_ids = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    padded = model(padded_ids, padding_mask(torch.tensor([5]), 9).long())
    torch.testing.assert_close(padded[:, :5], alone, atol=1e-6, rtol=1e-5)
    unmasked = model(padded_ids)
    assert (unmasked[:, :5] - alone).abs().max() > 1e-3  # without the mask the padding leaks in


def test_encoder_sees_the_future_and_causal_does_not():
    model = tiny_encoder()
    a = torch.tensor([[5, 6, 7, 8]])
    b = torch.tensor([[5, 6, 7, 9]])  # only the last token differs
    assert (model(a)[:, :3] - model(b)[:, :3]).abs().max() > 1e-3
    torch.testing.assert_close(model(a, causal=True)[:, :3], model(b, causal=True)[:, :3])


def test_attention_weights_shape_rows_and_padding():
    model = tiny_encoder()
    ids = torch.randint(1, 50, (2, 6))
    mask = padding_mask(torch.tensor([4, 6]), 6).long()
    w = model.attention_weights(ids, mask)
    assert w.shape == (2, 2, 2, 6, 6)
    torch.testing.assert_close(w.sum(dim=-1), torch.ones(2, 2, 2, 6))
    assert float(w[:, 0, :, :, 4:].abs().max()) == 0.0


def test_input_errors():
    model = tiny_encoder()
    with pytest.raises(ValueError, match=r"ids\[None\]"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="must have the shape of input_ids"):
        model(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4))
    with pytest.raises(ValueError, match="only N=16 rows"):
        model(torch.ones(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="pooler=True"):
        tiny_encoder(pooler=False).pool(torch.zeros(1, 2, 8))


# --- the weight mapping --------------------------------------------------------------------------

def test_bert_key_names():
    assert bert_key_to_encoder("embeddings.word_embeddings.weight") == "embeddings.token_embedding.weight"
    assert bert_key_to_encoder("embeddings.LayerNorm.bias") == "embeddings.norm.beta"
    assert bert_key_to_encoder("encoder.layer.3.attention.self.query.weight") == "blocks.3.attn.W_Q.weight"
    assert bert_key_to_encoder("encoder.layer.0.attention.output.dense.bias") == "blocks.0.attn.W_O.bias"
    assert bert_key_to_encoder("encoder.layer.5.attention.output.LayerNorm.weight") == "blocks.5.norm1.gamma"
    assert bert_key_to_encoder("encoder.layer.1.intermediate.dense.weight") == "blocks.1.ffn.W_in.weight"
    assert bert_key_to_encoder("encoder.layer.1.output.dense.weight") == "blocks.1.ffn.W_out.weight"
    assert bert_key_to_encoder("encoder.layer.2.output.LayerNorm.bias") == "blocks.2.norm2.beta"
    assert bert_key_to_encoder("pooler.dense.weight") == "pooler.weight"
    with pytest.raises(KeyError, match="unexpected tensor"):
        bert_key_to_encoder("cls.predictions.bias")


def bert_state_dict(model: TransformerEncoder) -> dict[str, torch.Tensor]:
    """A BERT-named checkpoint made from a model (the inverse of the mapping, for tests)."""
    ours_to_bert = {}
    names = [f"embeddings.{k}" for k in ("word_embeddings.weight", "position_embeddings.weight",
                                          "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")]
    names += ["pooler.dense.weight", "pooler.dense.bias"]
    for i in range(model.config.n_layers):
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                     "output.dense", "output.LayerNorm"):
            names += [f"encoder.layer.{i}.{part}.{kind}" for kind in ("weight", "bias")]
    for name in names:
        ours_to_bert[bert_key_to_encoder(name)] = name
    return {ours_to_bert[k]: v.clone() for k, v in model.state_dict().items()}


def test_mapping_round_trip_and_position_ids():
    source, target = tiny_encoder(seed=1), tiny_encoder(seed=2)
    checkpoint = bert_state_dict(source)
    checkpoint[POSITION_IDS_KEY] = torch.arange(16)[None]
    target.load_state_dict(map_bert_state_dict(checkpoint, target), strict=True)
    ids = torch.randint(0, 50, (2, 5))
    torch.testing.assert_close(target(ids), source(ids))
    checkpoint[POSITION_IDS_KEY] = torch.arange(16).flip(0)[None]
    with pytest.raises(ValueError, match="not 0..N-1"):
        map_bert_state_dict(checkpoint, target)


def test_mapping_refuses_missing_unexpected_and_misshapen():
    model = tiny_encoder()
    good = bert_state_dict(model)
    missing = {k: v for k, v in good.items() if k != "encoder.layer.1.output.LayerNorm.weight"}
    with pytest.raises(ValueError, match=r"missing from the file: blocks\.1\.norm2\.gamma"):
        map_bert_state_dict(missing, model)
    with pytest.raises(ValueError, match="unexpected tensors in the file: cls.predictions.bias"):
        map_bert_state_dict({**good, "cls.predictions.bias": torch.zeros(50)}, model)
    with pytest.raises(ValueError, match=r"unexpected tensors in the file: encoder\.layer\.2\."):
        map_bert_state_dict({**good, "encoder.layer.2.output.dense.bias": torch.zeros(8)}, model)
    bad = {**good, "embeddings.word_embeddings.weight": torch.zeros(51, 8)}
    with pytest.raises(ValueError, match=r"shape mismatches: embeddings.word_embeddings.weight \(51, 8\)"):
        map_bert_state_dict(bad, model)
    with pytest.raises(ValueError, match="missing from the file: pooler.bias"):
        map_bert_state_dict({k: v for k, v in good.items() if k != "pooler.dense.bias"}, model)


def test_parameter_counts_by_kind():
    model = tiny_encoder()
    counts = parameter_counts(model)
    d, f, layers = 8, 32, 2
    assert counts == {"embeddings": 50 * d + 16 * d + 2 * d, "attention": layers * 4 * (d * d + d),
                      "FFN": layers * (2 * d * f + f + d), "LayerNorm": 2 * d + layers * 4 * d,
                      "pooler": d * d + d}
    assert sum(counts.values()) == sum(p.numel() for p in model.parameters())
    assert "pooler" not in parameter_counts(tiny_encoder(pooler=False))


# --- parity with the real pretrained model --------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer, BertModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    path = str(minilm_dir())
    return (AutoTokenizer.from_pretrained(path),
            BertModel.from_pretrained(path, attn_implementation="eager").eval())


def test_loaded_file_fills_every_parameter(minilm):
    from safetensors import safe_open

    with safe_open(str(minilm_dir() / "model.safetensors"), "pt") as f:
        in_file = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k != POSITION_IDS_KEY)
    assert sum(parameter_counts(minilm.model).values()) == in_file == 22_713_216


def test_tokenizer_matches_the_reference(minilm, reference):
    tokenizer, _ = reference
    ours = minilm.batch(SENTENCES)
    theirs = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(getattr(ours, key), theirs[key]), key
    assert ours.tokens[2] == ["[CLS]", "hi", "[SEP]"]
    with pytest.raises(ValueError, match="list of sentences"):
        minilm.batch("just one string")


def test_token_vectors_attention_and_pooler_match_bert(minilm, reference):
    _, bert = reference
    batch = minilm.batch(SENTENCES)
    assert batch.attention_mask.sum(1).unique().numel() == len(SENTENCES)  # padding is exercised
    with torch.no_grad():
        out = bert(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   token_type_ids=batch.token_type_ids, output_hidden_states=True, output_attentions=True)
        ours = minilm.layer_vectors(batch)
        weights = minilm.model.attention_weights(batch.input_ids, batch.attention_mask)
        pooled = minilm.model.pool(ours[-1])
    real = batch.attention_mask.bool()
    for layer, (a, b) in enumerate(zip(ours, out.hidden_states, strict=True)):
        err = (a - b)[real].abs().max().item()  # padded positions are not outputs of the model
        assert err <= TOLERANCE, f"layer {layer}: max abs error {err:.2e}"
    err = (weights - torch.stack(out.attentions)).abs().max().item()
    assert err <= TOLERANCE, f"attention weights: max abs error {err:.2e}"
    assert (pooled - out.pooler_output).abs().max().item() <= TOLERANCE


def test_sentence_embeddings_match_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir()), device="cpu")
    theirs = reference.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    ours = minilm.encode(SENTENCES)
    assert ours.shape == (len(SENTENCES), 384)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(SENTENCES)))
    assert (ours - theirs).abs().max().item() <= TOLERANCE


# --- lesson 06 exercises: references and hand-written answers pass, hints fire ----------------

def hand_block(x, attention_mask, w, n_heads, post_ln=True, masked=True, approximate="none"):
    """A post-LN block written out from raw tensors, as a learner would (and its usual mistakes)."""
    from course_utils.attention import merge_heads, scaled_dot_product_attention, split_heads

    def lin(h, name):
        return h @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def ln(h, name):
        return F.layer_norm(h, h.shape[-1:], w[f"{name}.gamma"], w[f"{name}.beta"], eps=1e-12)

    def attn(h):
        q, k, v = (split_heads(lin(h, f"attn.W_{c}"), n_heads) for c in "QKV")
        mask = attention_mask.bool()[:, None, None, :] if masked else None
        return lin(merge_heads(scaled_dot_product_attention(q, k, v, mask)[0]), "attn.W_O")

    def ffn(h):
        return lin(F.gelu(lin(h, "ffn.W_in"), approximate=approximate), "ffn.W_out")

    if not post_ln:
        x = x + attn(ln(x, "norm1"))
        return x + ffn(ln(x, "norm2"))
    x = ln(x + attn(x), "norm1")
    return ln(x + ffn(x), "norm2")


def test_lesson06_hand_answers_pass(run_exercise):
    assert run_exercise("post_ln_encoder_block", hand_block).status == "pass"
    assert run_exercise("extended_attention_mask", lambda m: (m == 1)[:, None, None, :]).status == "pass"
    assert run_exercise("contextual_similarity", lambda a, b: F.cosine_similarity(a[:, None], b[None], dim=-1)).status \
        == "pass"


def test_lesson06_hints(run_exercise):
    assert "pre-LN" in run_exercise("post_ln_encoder_block", lambda *a: hand_block(*a, post_ln=False)).report()
    assert "padding leaks" in run_exercise("post_ln_encoder_block", lambda *a: hand_block(*a, masked=False)).report()
    assert "tanh approximation" in run_exercise("post_ln_encoder_block",
                                                lambda *a: hand_block(*a, approximate="tanh")).report()
    assert "inverted" in run_exercise("extended_attention_mask", lambda m: (m == 0)[:, None, None, :]).report()
    assert "mask the keys" in run_exercise("extended_attention_mask", lambda m: m.bool()[:, None, :, None]).report()
    assert "bool tensor" in run_exercise("extended_attention_mask", lambda m: m[:, None, None, :]).report()
    assert "averaged the padding" in run_exercise("masked_mean_pool", lambda h, m: h.mean(dim=1)).report()
    assert "not by T" in run_exercise("masked_mean_pool", lambda h, m: (h * m[..., None]).sum(1) / h.shape[1]).report()
    swapped = lambda names: [bert_key_to_encoder(n).replace("norm1", "#").replace("norm2", "norm1")
                             .replace("#", "norm2") for n in names]
    assert "first Add & Norm" in run_exercise("bert_layer_names", swapped).report()
    assert "dot products" in run_exercise("contextual_similarity", lambda a, b: a @ b.T).report()
