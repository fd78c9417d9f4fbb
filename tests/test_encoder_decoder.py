import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import KVCache
from course_utils.encoder_decoder import (
    BOS,
    EOS,
    PAD,
    CrossAttention,
    DecoderBlock,
    DecoderOnly,
    EncoderDecoder,
    Seq2SeqConfig,
    Transformer,
    beam_search,
    beam_step,
    greedy_continue,
    greedy_decode,
    prefix_lm_loss,
    target_loss,
    teacher_forcing_loss,
    transformer_from_torch,
)
from course_utils.train import Dist, TrainConfig, train

SHAPES = [  # d_model, n_heads, encoder layers, decoder layers, d_ff, B, S, T
    (16, 2, 1, 1, 32, 2, 5, 4),
    (32, 4, 2, 3, 64, 3, 7, 6),
    (24, 3, 3, 2, 48, 4, 9, 1),
    (8, 1, 1, 2, 16, 1, 1, 3),
]


def _reference(d, h, n_enc, n_dec, d_ff, norm_first, activation="relu"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's notes about its nested-tensor fast path
        return nn.Transformer(d, h, n_enc, n_dec, d_ff, dropout=0.1, activation=activation, batch_first=True,
                              norm_first=norm_first).eval()


def _random_pad(B, S, gen):
    lengths = torch.randint(1, S + 1, (B,), generator=gen)
    lengths[0] = S
    return torch.arange(S)[None] >= lengths[:, None]


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"d{s[0]}-h{s[1]}-enc{s[2]}-dec{s[3]}-B{s[5]}-S{s[6]}-T{s[7]}"
                                               for s in SHAPES])
def test_parity_with_torch_transformer(shape, norm_first):
    d, h, n_enc, n_dec, d_ff, B, S, T = shape
    torch.manual_seed(sum(shape) + norm_first)
    gen = torch.Generator().manual_seed(1)
    ref = _reference(d, h, n_enc, n_dec, d_ff, norm_first)
    ours = transformer_from_torch(ref)
    src, tgt = torch.randn(B, S, d, generator=gen), torch.randn(B, T, d, generator=gen)
    pad = _random_pad(B, S, gen)
    causal = nn.Transformer.generate_square_subsequent_mask(T)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = ref(src, tgt, tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad)
        unpadded = ref(src, tgt, tgt_mask=causal)
        got, got_unpadded = ours(src, tgt, pad), ours(src, tgt)
    assert (got - expected).abs().max() <= 1e-5
    assert (got_unpadded - unpadded).abs().max() <= 1e-5
    if pad.any():  # the mask matters: without it the outputs differ
        assert (got - got_unpadded).abs().max() > 1e-3


def test_parity_with_gelu_and_the_settings_read_from_the_reference():
    ref = _reference(16, 4, 2, 1, 40, norm_first=True, activation="gelu")
    ours = transformer_from_torch(ref)
    assert not ours.training and ours.encoder.blocks[0].ffn.activation == "gelu"
    assert ours.decoder.blocks[0].ffn.d_ff == 40 and ours.decoder.blocks[0].norm_first
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 5, 16)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = ref(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5))
        assert (ours(src, tgt) - expected).abs().max() <= 1e-5


def test_transformer_from_torch_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="batch_first=True"):
            transformer_from_torch(nn.Transformer(8, 2, 1, 1, 16))
        with pytest.raises(ValueError, match="not supported"):
            transformer_from_torch(nn.Transformer(8, 2, 1, 1, 16, activation=torch.tanh, batch_first=True))


def test_cross_attention_takes_queries_from_x_and_keys_values_from_memory():
    torch.manual_seed(0)
    attn = CrossAttention(12, 3).eval()
    x, memory = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    keep = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    out, weights = attn.forward_with_weights(x, memory, keep)
    q = (x @ attn.W_Q.weight.T + attn.W_Q.bias).view(2, 4, 3, 4).transpose(1, 2)
    k = (memory @ attn.W_K.weight.T + attn.W_K.bias).view(2, 6, 3, 4).transpose(1, 2)
    v = (memory @ attn.W_V.weight.T + attn.W_V.bias).view(2, 6, 3, 4).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(4)).masked_fill(~keep[:, None, None], float("-inf"))
    w = torch.softmax(scores, -1)
    expected = attn.W_O((w @ v).transpose(1, 2).reshape(2, 4, 12))
    assert torch.allclose(out, expected, atol=1e-6) and torch.allclose(weights, w, atol=1e-6)
    assert weights.shape == (2, 3, 4, 6) and weights[1, :, :, 3:].abs().max() == 0
    assert torch.allclose(attn(x, memory_kv=attn.project_memory(memory), src_keep=keep), out)
    with pytest.raises(ValueError, match="exactly one of memory"):
        attn(x)


def test_cross_attention_is_its_own_module_with_the_layout_of_multi_head_attention():
    from course_utils.attention import MultiHeadAttention

    torch.manual_seed(1)
    mha, cross = MultiHeadAttention(12, 3).eval(), CrossAttention(12, 3).eval()
    assert not isinstance(cross, MultiHeadAttention)
    cross.load_state_dict(mha.state_dict())  # the same names and shapes: W_Q, W_K, W_V, W_O
    x = torch.randn(2, 5, 12)
    assert torch.allclose(cross(x, x), mha(x), atol=1e-6)  # memory = x: self-attention
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=3"):
        CrossAttention(10, 3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_order_of_sublayers(norm_first):
    torch.manual_seed(1)
    block = DecoderBlock(8, 2, 16, norm_first=norm_first).eval()
    x, memory = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    kv = block.cross_attn.project_memory(memory)

    def sa(h):
        return block.self_attn(h, causal=True)

    def ca(h):
        return block.cross_attn(h, memory)

    if norm_first:
        h = x + sa(block.norm1(x))
        h = h + ca(block.norm2(h))
        expected = h + block.ffn(block.norm3(h))
    else:
        h = block.norm1(x + sa(x))
        h = block.norm2(h + ca(h))
        expected = block.norm3(h + block.ffn(h))
    assert torch.allclose(block(x, kv), expected, atol=1e-6)
    # causal: the first 2 outputs ignore what comes after them
    x2 = torch.cat([x[:, :2], torch.randn(2, 3, 8)], dim=1)
    assert torch.allclose(block(x2, kv)[:, :2], expected[:, :2], atol=1e-6)


def _model(norm_first=True, seed=0):
    torch.manual_seed(seed)
    config = Seq2SeqConfig(src_vocab_size=13, tgt_vocab_size=11, src_max_len=8, tgt_max_len=10, d_model=16,
                           n_heads=2, n_encoder_layers=2, n_decoder_layers=2, norm_first=norm_first)
    return EncoderDecoder(config).eval()


def _batch(gen, B=3, S=6, T=7):
    src = torch.randint(3, 13, (B, S), generator=gen)
    src[1, 4:] = PAD
    tgt = torch.randint(3, 11, (B, T), generator=gen)
    tgt[:, 0] = BOS
    tgt[:, -1] = EOS
    tgt[2, 4:] = PAD
    tgt[2, 3] = EOS
    return src, tgt


def test_padding_in_the_source_changes_nothing():
    model, gen = _model(), torch.Generator().manual_seed(0)
    src, tgt = _batch(gen)
    wide = torch.cat([src, torch.full((3, 2), PAD)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(src, tgt), model(wide, tgt), atol=1e-5)
        assert torch.allclose(model(src[1:2, :4], tgt[1:2]), model(src, tgt)[1:2], atol=1e-5)


def test_teacher_forcing_loss_is_the_shifted_cross_entropy():
    model, gen = _model(), torch.Generator().manual_seed(1)
    src, tgt = _batch(gen)
    loss = teacher_forcing_loss(model, src, tgt)
    terms = []
    with torch.no_grad():
        for b in range(3):
            for t in range(1, tgt.shape[1]):
                if tgt[b, t] != PAD:  # position t - 1 reads tgt[:t] and predicts tgt[t]
                    logits = model(src[b:b + 1], tgt[b:b + 1, :t])[0, -1]
                    terms.append(-F.log_softmax(logits, -1)[tgt[b, t]])
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-5)
    assert target_loss(torch.zeros(1, 2, 5), torch.tensor([[3, PAD]])).item() == pytest.approx(math.log(5))


def test_kv_cache_decoding_equals_full_recompute_and_projects_memory_once(monkeypatch):
    model, gen = _model(norm_first=False), torch.Generator().manual_seed(2)
    src, tgt = _batch(gen)
    memory_kv, keep = model.encode(src)
    caches = [KVCache() for _ in range(2)]
    with torch.no_grad():
        full = model.decode(tgt, memory_kv, keep)
        steps = torch.cat([model.decode(tgt[:, t:t + 1], memory_kv, keep, caches) for t in range(tgt.shape[1])], 1)
    assert torch.allclose(full, steps, atol=1e-5)
    calls = []
    original = CrossAttention.project_memory
    monkeypatch.setattr(CrossAttention, "project_memory", lambda self, m: calls.append(1) or original(self, m))
    cached = greedy_decode(model, src, 9)
    assert len(calls) == 2  # once per decoder block, not once per generated token
    assert torch.equal(cached, greedy_decode(model, src, 9, use_cache=False))


def test_greedy_decode_stops_and_pads_after_the_end():
    model = _model()
    with torch.no_grad():
        model.lm_head.bias.fill_(0.0)
        model.lm_head.weight.fill_(0.0)
        model.lm_head.bias[EOS] = 5.0
    out = greedy_decode(model, torch.randint(3, 13, (2, 4)), 6)
    assert out.tolist() == [[EOS], [EOS]]


def test_beam_step_picks_the_best_extensions():
    log_probs = torch.log(torch.tensor([[[0.1, 0.1, 0.2, 0.6], [0.1, 0.1, 0.7, 0.1]]]))
    scores = torch.log(torch.tensor([[0.5, 0.4]]))
    new, parent, token = beam_step(log_probs, scores, torch.zeros(1, 2, dtype=torch.bool), 2)
    assert parent.tolist() == [[0, 1]] and token.tolist() == [[3, 2]]
    assert torch.allclose(new.exp(), torch.tensor([[0.30, 0.28]]))
    new, parent, token = beam_step(log_probs, scores, torch.tensor([[True, False]]), 2)
    assert parent.tolist() == [[0, 1]] and token.tolist() == [[PAD, 2]]  # a finished beam only pads
    assert torch.allclose(new.exp(), torch.tensor([[0.5, 0.28]]))


def test_beam_search_of_width_one_is_greedy_and_wider_beams_score_no_worse():
    model, gen = _model(seed=3), torch.Generator().manual_seed(3)
    src, _ = _batch(gen)
    greedy = greedy_decode(model, src, 8)
    assert torch.equal(beam_search(model, src, 8, beam_size=1)[:, :greedy.shape[1]], greedy)

    def score(seqs):
        tgt = torch.cat([torch.full((3, 1), BOS), seqs], dim=1)
        with torch.no_grad():
            logp = F.log_softmax(model(src, tgt[:, :-1]), -1).gather(-1, tgt[:, 1:, None])[..., 0]
        return (logp * (tgt[:, 1:] != PAD)).sum(1)

    wide = beam_search(model, src, 8, beam_size=4)
    assert (score(wide) >= score(greedy) - 1e-5).all()


def _beam_search_without_cache(model, src_row, max_new, k):
    """Beam search on one source (1, S) that re-runs the whole model on every full prefix: no KV cache,
    no reordering. Returns the best sequence after <s>, without trailing <pad>."""
    beams = [(0.0, [BOS], False)]  # (summed log-probability, ids, finished)
    for _ in range(max_new):
        candidates = []
        for score, seq, done in beams:
            if done:  # a finished beam keeps its score and only extends with <pad>
                candidates.append((score, seq + [PAD], True))
                continue
            with torch.no_grad():
                logp = F.log_softmax(model(src_row, torch.tensor([seq]))[0, -1], -1)
            candidates += [(score + logp[t].item(), seq + [t], t in (EOS, PAD)) for t in range(len(logp))]
        beams = sorted(candidates, key=lambda c: -c[0])[:k]
    best = beams[0][1][1:]
    while best and best[-1] == PAD:
        best.pop()
    return best


@pytest.mark.parametrize("beam_size", [2, 3, 5])
def test_beam_search_with_the_kv_cache_equals_a_cache_free_reference(beam_size):
    model, gen = _model(seed=4), torch.Generator().manual_seed(4)
    with torch.no_grad():  # sharper predictions, never <pad> or <s>: the beams differ from greedy, one ends early
        model.lm_head.weight.mul_(3.0)
        model.lm_head.bias[PAD] = model.lm_head.bias[BOS] = -1e4
    src, _ = _batch(gen)
    cached = beam_search(model, src, 7, beam_size=beam_size).tolist()
    assert beam_size < 5 or cached != greedy_decode(model, src, 7).tolist()
    for b in range(src.shape[0]):
        row = cached[b]
        while row and row[-1] == PAD:
            row.pop()
        assert row == _beam_search_without_cache(model, src[b:b + 1], 7, beam_size)


def test_decoder_only_prefix_loss_and_generation():
    torch.manual_seed(0)
    model = DecoderOnly(vocab_size=20, max_len=16, d_model=16, n_heads=2, n_layers=2).eval()
    prompt, tgt = torch.randint(12, 20, (2, 3)), torch.tensor([[BOS, 5, 6, EOS], [BOS, 7, EOS, PAD]])
    with torch.no_grad():
        logits = model(torch.cat([prompt, tgt[:, :-1]], 1))[:, 3:]
    assert torch.allclose(prefix_lm_loss(model, prompt, tgt), target_loss(logits, tgt[:, 1:]))
    out = greedy_continue(model, torch.cat([prompt, tgt[:, :1]], 1), 5)
    assert out.shape[0] == 2 and out.shape[1] <= 5
    padded = torch.cat([prompt[:, :2], torch.zeros(2, 2, dtype=torch.long), tgt[:, :1]], 1)
    with torch.no_grad():
        before = model(padded)[:, -1]
        model.embedding.token_embedding.weight[PAD] += 3.0  # what <pad> holds must not matter
        assert torch.allclose(model(padded)[:, -1], before, atol=1e-5)
        model.embedding.token_embedding.weight[5] += 3.0    # a real token does
        assert not torch.allclose(model(torch.where(padded == PAD, 5, padded))[:, -1], before, atol=1e-3)


def copy_pairs(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the copying task: 32 sources of 4 tokens, each target <s> source </s>."""
    src = torch.randint(3, 11, (32, 4), generator=gen)
    return src, torch.cat([torch.full((32, 1), BOS), src, torch.full((32, 1), EOS)], dim=1)


def test_the_course_trainer_trains_the_encoder_decoder():
    model = _model()
    cfg = TrainConfig(max_iters=150, lr=3e-3, min_lr=3e-4, warmup_iters=10, eval_interval=75, eval_iters=2,
                      log_interval=50)
    result = train(model, copy_pairs, copy_pairs, cfg, loss_fn=teacher_forcing_loss, where=Dist(), progress=False)
    losses = result.history.loss
    assert result.step == 150 and len(losses) == 150
    assert sum(losses[-50:]) / 50 < 0.5 * sum(losses[:50]) / 50
    assert result.history.eval_step == [0, 75, 150] and result.val_loss < result.history.val_loss[0]
    assert math.isnan(result.tflops)  # FLOPs are counted for GPTs only
    assert result.tokens_per_s > 0


def test_shape_and_size_errors():
    model = Transformer(8, 2, 1, 1)
    with pytest.raises(ValueError, match="embed token ids first"):
        model(torch.randint(0, 5, (2, 3)), torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="src_pad must be a bool"):
        model(torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="n_decoder_layers=0 at least 1"):
        Transformer(8, 2, 1, 0)
    with pytest.raises(ValueError, match="n_encoder_layers=-1 must be at least 0"):
        Transformer(8, 2, -1, 1)


def test_an_encoder_without_blocks_keeps_each_memory_position_to_its_own_source_vector():
    torch.manual_seed(0)
    model = Transformer(8, 2, 0, 1).eval()
    src = torch.randn(2, 5, 8)
    changed = src.clone()
    changed[:, 2] = torch.randn(2, 8)
    memory, memory_changed = model.encode(src), model.encode(changed)
    assert torch.allclose(memory, model.encoder.final_norm(src))
    moved = (memory - memory_changed).abs().amax(dim=(0, 2))
    assert moved[2] > 0.1 and moved[[0, 1, 3, 4]].max() == 0  # only the changed position moves
    mixing = Transformer(8, 2, 1, 1).eval()  # one self-attention block: every position moves
    assert (mixing.encode(src) - mixing.encode(changed)).abs().amax(dim=(0, 2)).min() > 1e-3


# ------------------------------------------------------------------------ lesson 10 exercises

def test_lesson10_exercises_catch_the_classic_mistakes(run_exercise):
    from course_tools.exercises.checks import FAIL
    from course_tools.exercises.references import lesson10 as ex

    mistakes = {
        "cross_attention": (lambda x, m, keep, w, h: ex._attend(x, m, w, h), "padded source positions"),
        "decoder_block": (lambda x, m, keep, w, h: ex._decoder_block(x, m, keep, w, h, norm_first=True), "post-LN"),
        "seq2seq_loss": (lambda logits, tgt: F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                             tgt[:, 1:].reshape(-1)), "ignore target id 0"),
        "greedy_step": (lambda logits, done: logits.argmax(-1), "<pad>"),
        "beam_step": (lambda lp, s, done, k: ex.beam_step(lp, torch.zeros_like(s), done, k), "add each beam's score"),
        "decoder_masks": (lambda src, T: (torch.ones(T, T, dtype=torch.bool).triu(), (src != 0)[:, None, None]),
                          "transposed"),
    }
    for name, (wrong, phrase) in mistakes.items():
        result = run_exercise(name, wrong)
        assert result.status == FAIL and phrase in result.report(), (name, result.report())
