"""course_utils.attention: softmax, masks, scaled dot-product attention and multi-head attention.

Parity is checked against PyTorch (``torch.softmax``, ``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``) on random inputs; max abs error ≤ 1e-5 in float32.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_utils.attention import (
    KVCache,
    ModelKVCache,
    MultiHeadAttention,
    SelfAttentionHead,
    attend,
    causal_mask,
    merge_heads,
    padding_mask,
    repeat_kv,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from course_utils.positional import alibi_bias

TOL = 1e-5
SIZES = [(1, 1), (3, 4), (2, 7)]  # (B, T): a single token, a batch, an odd length
# (d_model, n_heads, d_k, d_v): odd widths, one head, and per-head widths that differ from D / H
WIDTHS = [(15, 3, None, None), (7, 1, None, None), (16, 4, None, None), (10, 3, 4, 6)]


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_lengths(B: int, T: int, g: torch.Generator) -> torch.Tensor:
    """At least one real token per row, so no query is left without keys."""
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    return lengths


# --- softmax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_matches_torch(dim):
    x = torch.randn(3, 5, 7, generator=gen())
    torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim), atol=TOL, rtol=0)


def test_softmax_is_stable_for_large_scores():
    x = torch.tensor([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]])
    got = softmax(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, torch.softmax(x.double(), dim=-1).float(), atol=TOL, rtol=0)
    # the naive formula overflows: exp(1000) = inf, inf / inf = NaN
    assert torch.isnan(x.exp() / x.exp().sum(-1, keepdim=True)).any()


def test_softmax_fully_masked_row_is_zero():
    x = torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]])
    got = softmax(x)
    assert torch.equal(got[1], torch.zeros(2))
    torch.testing.assert_close(got[0], torch.softmax(x[0], -1), atol=TOL, rtol=0)


# --- masks -----------------------------------------------------------------------------------------


def test_causal_mask_square_is_lower_triangular():
    assert torch.equal(causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("T,S", [(1, 5), (3, 5), (5, 5), (4, 2)])
def test_causal_mask_is_bottom_right_aligned(T, S):
    m = causal_mask(T, S)
    assert m.shape == (T, S) and m.dtype == torch.bool
    for t, s in itertools.product(range(T), range(S)):
        assert bool(m[t, s]) == (s <= t + S - T)
    assert bool(m[-1].all())  # the last query sees every key


def test_causal_mask_rejects_negative_sizes():
    with pytest.raises(ValueError, match="non-negative"):
        causal_mask(-1)


def test_padding_mask():
    m = padding_mask([3, 1, 0], 4)
    expected = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(m, expected)
    assert torch.equal(padding_mask(torch.tensor([2]), 2), torch.ones(1, 2, dtype=torch.bool))


def test_padding_mask_errors():
    with pytest.raises(ValueError, match="raise max_len"):
        padding_mask([5], 4)
    with pytest.raises(ValueError, match=r"\[0, max_len"):
        padding_mask([-1], 4)
    with pytest.raises(ValueError, match="1-D list or tensor of integers"):
        padding_mask(torch.tensor([[1, 2]]), 4)
    with pytest.raises(ValueError, match="integers"):
        padding_mask(torch.tensor([1.5]), 4)


# --- scaled dot-product attention ------------------------------------------------------------------


@pytest.mark.parametrize("B,T,S", [(1, 1, 1), (2, 3, 5), (3, 7, 7), (2, 5, 2)])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float", "padding"])
def test_sdpa_matches_torch(B, T, S, kind):
    g = gen(B * 100 + T * 10 + S)
    H, d_k, d_v = 2, 5, 3
    q = torch.randn(B, H, T, d_k, generator=g)
    k = torch.randn(B, H, S, d_k, generator=g)
    v = torch.randn(B, H, S, d_v, generator=g)
    mask, causal = None, kind == "causal"
    if kind == "bool":
        mask = torch.rand(T, S, generator=g) > 0.3
        mask[:, 0] = True  # every query keeps a key
    elif kind == "float":
        mask = torch.randn(B, 1, T, S, generator=g)
    elif kind == "padding":
        mask = padding_mask(random_lengths(B, S, g), S)[:, None, None, :]
    out, weights = scaled_dot_product_attention(q, k, v, mask, causal)
    ref_mask = causal_mask(T, S) if causal else mask
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask)
    assert out.shape == (B, H, T, d_v) and weights.shape == (B, H, T, S)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    # rows sum to one, except the queries a causal mask with T > S leaves with no key at all
    alive = torch.ones(T) if ref_mask is None else ref_mask.any(-1).float()
    torch.testing.assert_close(weights.sum(-1), alive.expand(B, H, T), atol=TOL, rtol=0)


def test_sdpa_weights_by_hand():
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v = torch.tensor([[10.0], [20.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    a = torch.tensor(1 / 2**0.5).exp()
    torch.testing.assert_close(w, torch.tensor([[a / (a + 1), 1 / (a + 1)]]), atol=TOL, rtol=0)
    torch.testing.assert_close(out, w @ v, atol=TOL, rtol=0)


def test_sdpa_causal_combines_with_a_mask():
    g = gen(3)
    q, k, v = (torch.randn(2, 4, 3, generator=g) for _ in range(3))
    pad = padding_mask([4, 2], 4)[:, None, :]  # (B, 1, S)
    out, w = scaled_dot_product_attention(q, k, v, pad, causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=pad & causal_mask(4))
    torch.testing.assert_close(out, ref, atol=TOL, rtol=0)
    assert (w[1, :, 2:] == 0).all() and (w.triu(1) == 0).all()
    float_mask = torch.zeros(1, 4).masked_fill(~padding_mask([3], 4), float("-inf"))
    out_f, _ = scaled_dot_product_attention(q, k, v, float_mask, causal=True)
    ref_f = F.scaled_dot_product_attention(q, k, v, attn_mask=padding_mask([3], 4) & causal_mask(4))
    torch.testing.assert_close(out_f, ref_f, atol=TOL, rtol=0)


def test_fully_masked_rows_give_zero_output_not_nan():
    g = gen(4)
    q, k, v = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    q.requires_grad_(True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(w[:, 1], torch.zeros(2, 5)) and torch.equal(out[:, 1], torch.zeros(2, 4))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=TOL, rtol=0)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    # a causal mask with more queries than keys leaves the first T - S queries with nothing to see
    out, w = scaled_dot_product_attention(q, k[:, :2], v[:, :2], causal=True)
    assert torch.equal(out[:, 0], torch.zeros(2, 4)) and torch.isfinite(out).all()


def test_sdpa_dropout_only_drops_weights():
    g = gen(5)
    q, k, v = (torch.randn(1, 6, 4, generator=g) for _ in range(3))
    torch.manual_seed(0)
    _, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    _, w0 = scaled_dot_product_attention(q, k, v)
    dropped = w == 0
    assert dropped.any()
    torch.testing.assert_close(w[~dropped], 2 * w0[~dropped], atol=TOL, rtol=0)


@pytest.mark.parametrize("sdpa", [True, False])
def test_bfloat16_with_a_float32_mask(sdpa):
    torch.manual_seed(6)
    mha = MultiHeadAttention(8, 2, sdpa=sdpa).eval()
    x = torch.randn(2, 5, 8)
    mask = torch.zeros(5, 5).masked_fill(~causal_mask(5), float("-inf"))  # float32, additive
    ref = mha(x, mask)
    out = mha.to(torch.bfloat16)(x.to(torch.bfloat16), mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0)


def test_sdpa_errors():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    with pytest.raises(ValueError, match="share their last dim d_k"):
        scaled_dot_product_attention(q, torch.randn(2, 5, 3), v)
    with pytest.raises(ValueError, match="same number of positions S"):
        scaled_dot_product_attention(q, k, torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match="do not broadcast"):
        scaled_dot_product_attention(q, torch.randn(3, 5, 4), torch.randn(3, 5, 6))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 3\) does not broadcast"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):  # a mask may not add batch dims
        scaled_dot_product_attention(q, k, v, torch.ones(4, 2, 3, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="use a bool mask"):
        scaled_dot_product_attention(q, k, v, torch.ones(3, 5, dtype=torch.long))


# --- heads -----------------------------------------------------------------------------------------


def test_split_and_merge_heads():
    x = torch.arange(2 * 3 * 6).reshape(2, 3, 6)
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 3, 2)
    assert torch.equal(h[1, 2, 0], x[1, 0, 4:6])  # head 2 owns columns 4..5
    assert torch.equal(merge_heads(h), x)
    with pytest.raises(ValueError, match="not divisible by n_heads=4"):
        split_heads(x, 4)
    with pytest.raises(ValueError, match=r"expects \(..., H, T, d\)"):
        merge_heads(torch.ones(3, 4))


def test_self_attention_head_shapes_and_math():
    torch.manual_seed(0)
    head = SelfAttentionHead(6, d_k=4, d_v=3)
    x = torch.randn(2, 5, 6)
    out, w = head(x, causal=True)
    assert out.shape == (2, 5, 3) and w.shape == (2, 5, 5)
    q, k, v = head.W_Q(x), head.W_K(x), head.W_V(x)
    scores = (q @ k.transpose(1, 2) / 2).masked_fill(~causal_mask(5), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, d_model=6\)"):
        head(torch.randn(5, 6))


def test_one_head_plus_W_O_is_multi_head_with_one_head():
    torch.manual_seed(1)
    head, W_O = SelfAttentionHead(8, d_k=8), nn.Linear(8, 8)
    mha = MultiHeadAttention(8, 1)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V"):
            getattr(mha, name).load_state_dict(getattr(head, name).state_dict())
        mha.W_O.load_state_dict(W_O.state_dict())
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(mha(x), W_O(head(x)[0]), atol=TOL, rtol=0)


# --- multi-head attention --------------------------------------------------------------------------


def mha_mask(kind: str, B: int, T: int, H: int, g: torch.Generator) -> tuple[torch.Tensor | None, bool]:
    if kind == "causal":
        return None, True
    if kind == "padding":
        return padding_mask(random_lengths(B, T, g), T)[:, None, None, :], False
    if kind == "padding+causal":
        return padding_mask(random_lengths(B, T, g), T)[:, None, None, :], True
    if kind == "per-head":
        m = torch.rand(B, H, T, T, generator=g) > 0.4
        m[..., 0] = True
        return m, False
    if kind == "float 3d":
        return torch.randn(B, T, T, generator=g), False
    return None, False


def one_head_at_a_time(mha: MultiHeadAttention, x: torch.Tensor, mask: torch.Tensor | None,
                       causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The lecture notes' multi-head attention: head i from its rows of W_Q, W_K, W_V, then concat and W_O."""
    if mask is not None and mask.ndim == 3:
        mask = mask[:, None]
    heads, weights = [], []
    for i in range(mha.n_heads):
        rows_k, rows_v = slice(i * mha.d_k, (i + 1) * mha.d_k), slice(i * mha.d_v, (i + 1) * mha.d_v)
        q, k, v = (F.linear(x, layer.weight[rows], None if layer.bias is None else layer.bias[rows])
                   for layer, rows in ((mha.W_Q, rows_k), (mha.W_K, rows_k), (mha.W_V, rows_v)))
        mask_i = mask[:, min(i, mask.shape[1] - 1)] if mask is not None and mask.ndim == 4 else mask
        h, w = scaled_dot_product_attention(q, k, v, mask_i, causal)
        heads.append(h)
        weights.append(w)
    return mha.W_O(torch.cat(heads, dim=-1)), torch.stack(weights, dim=1)


@pytest.mark.parametrize("B,T", SIZES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", ["none", "causal", "padding", "padding+causal", "per-head", "float 3d"])
def test_all_heads_at_once_equal_one_at_a_time_on_both_paths(B, T, width, kind):
    d_model, H, d_k, d_v = width
    g = gen(B + 10 * T + 100 * d_model)
    torch.manual_seed(d_model)
    mha = MultiHeadAttention(d_model, H, d_k=d_k, d_v=d_v).eval()
    x = torch.randn(B, T, d_model, generator=g)
    mask, causal = mha_mask(kind, B, T, H, g)
    out_loop, w_loop = one_head_at_a_time(mha, x, mask, causal)
    out_explicit, w_explicit = mha.forward_with_weights(x, mask, causal)
    out_sdpa = mha(x, mask, causal)
    explicit = MultiHeadAttention(d_model, H, d_k=d_k, d_v=d_v, sdpa=False).eval()  # the path, chosen when built
    explicit.load_state_dict(mha.state_dict())
    assert out_explicit.shape == (B, T, d_model) and w_explicit.shape == (B, H, T, T)
    torch.testing.assert_close(out_loop, out_explicit, atol=TOL, rtol=0)
    torch.testing.assert_close(w_loop, w_explicit, atol=TOL, rtol=0)
    torch.testing.assert_close(out_sdpa, out_explicit, atol=TOL, rtol=0)
    assert torch.equal(explicit(x, mask, causal), out_explicit)  # sdpa=False: the explicit path


def copy_into_torch(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(mha.d_model, mha.n_heads, bias=mha.W_Q.bias is not None, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.W_Q.weight, mha.W_K.weight, mha.W_V.weight]))
        ref.out_proj.weight.copy_(mha.W_O.weight)
        if mha.W_Q.bias is not None:
            ref.in_proj_bias.copy_(torch.cat([mha.W_Q.bias, mha.W_K.bias, mha.W_V.bias]))
            ref.out_proj.bias.copy_(mha.W_O.bias)
    return ref.eval()


@pytest.mark.parametrize("B,T", SIZES)
@pytest.mark.parametrize("d_model,H", [(15, 3), (7, 1), (16, 4)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["none", "causal", "padding"])
@pytest.mark.parametrize("sdpa", [True, False])
def test_matches_torch_multihead_attention(B, T, d_model, H, bias, kind, sdpa):
    g = gen(B + 10 * T + 100 * d_model)
    torch.manual_seed(T)
    mha = MultiHeadAttention(d_model, H, bias=bias, sdpa=sdpa).eval()
    ref = copy_into_torch(mha)
    x = torch.randn(B, T, d_model, generator=g)
    kwargs, mask, causal = {}, None, kind == "causal"
    if causal:
        kwargs["attn_mask"] = ~causal_mask(T)  # PyTorch's module: True = blocked
    if kind == "padding":
        keep = padding_mask(random_lengths(B, T, g), T)
        mask, kwargs["key_padding_mask"] = keep[:, None, None, :], ~keep
    out, w = mha.forward_with_weights(x, mask, causal)
    ref_out, ref_w = ref(x, x, x, need_weights=True, average_attn_weights=True, **kwargs)
    torch.testing.assert_close(out, ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(mha(x, mask, causal), ref_out, atol=TOL, rtol=0)
    torch.testing.assert_close(w.mean(dim=1), ref_w, atol=TOL, rtol=0)
    _, ref_w_heads = ref(x, x, x, need_weights=True, average_attn_weights=False, **kwargs)
    torch.testing.assert_close(w, ref_w_heads, atol=TOL, rtol=0)


@pytest.mark.parametrize("d_model,H", [(8, 2), (12, 3), (768, 12)])
def test_parameter_count(d_model, H):
    n = sum(p.numel() for p in MultiHeadAttention(d_model, H).parameters())
    assert n == 4 * d_model**2 + 4 * d_model
    assert sum(p.numel() for p in MultiHeadAttention(d_model, H, bias=False).parameters()) == 4 * d_model**2


def test_custom_head_widths_shapes():
    mha = MultiHeadAttention(10, 3, d_k=4, d_v=6)
    assert mha.W_Q.weight.shape == (12, 10) and mha.W_V.weight.shape == (18, 10)
    assert mha.W_O.weight.shape == (10, 18)  # nn.Linear stores (out, in): W_O is (m·d_v × d) transposed


def test_the_columns_of_one_head_are_its_slice():
    torch.manual_seed(2)
    mha = MultiHeadAttention(12, 3)
    x = torch.randn(2, 5, 12)
    q_all = split_heads(mha.W_Q(x), 3)
    for i in range(3):
        q_i = F.linear(x, mha.W_Q.weight[4 * i:4 * (i + 1)], mha.W_Q.bias[4 * i:4 * (i + 1)])
        torch.testing.assert_close(q_i, q_all[:, i], atol=TOL, rtol=0)


@pytest.mark.parametrize("sdpa", [True, False])
def test_kv_cache_matches_full_causal_pass(sdpa):
    torch.manual_seed(3)
    mha = MultiHeadAttention(16, 4, sdpa=sdpa).eval()
    x = torch.randn(2, 7, 16)
    full = mha(x, causal=True)
    cache = KVCache()
    prompt = mha(x[:, :4], causal=True, kv_cache=cache)  # 4 tokens at once
    steps = [mha(x[:, t:t + 1], causal=True, kv_cache=cache) for t in range(4, 7)]
    assert len(cache) == 7 and cache.k.shape == (2, 4, 7, 4)
    torch.testing.assert_close(torch.cat([prompt, *steps], dim=1), full, atol=TOL, rtol=0)
    # two new tokens at once against a cache of five: bottom-right causal alignment
    cache = KVCache()
    mha(x[:, :5], causal=True, kv_cache=cache)
    torch.testing.assert_close(mha(x[:, 5:], causal=True, kv_cache=cache), full[:, 5:], atol=TOL, rtol=0)
    _, weights = mha.forward_with_weights(x[:, 5:], causal=True, kv_cache=KVCache())
    assert weights.shape == (2, 4, 2, 2)


def test_kv_cache_select_keeps_rows_in_the_order_given():
    cache = KVCache()
    k, v = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 6)
    cache.update(k, v)
    cache.select(torch.tensor([2, 0, 0]))
    assert torch.equal(cache.k, k[[2, 0, 0]]) and torch.equal(cache.v, v[[2, 0, 0]]) and len(cache) == 4
    with pytest.raises(ValueError, match="the cache is empty"):
        KVCache().select(torch.tensor([0]))


def test_model_kv_cache_needs_a_layer():
    with pytest.raises(ValueError, match="n_layers must be positive, got 0"):
        ModelKVCache(0)
    cache = ModelKVCache(3)
    assert len(cache) == 0 and cache[2] is not cache[0]


def test_dropout_active_only_in_training():
    torch.manual_seed(4)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    x = torch.randn(2, 6, 8)
    mha.train()
    assert not torch.allclose(mha(x), mha.eval()(x), rtol=0, atol=1e-3)  # some output moved by more than 1e-3
    assert torch.equal(mha(x), mha(x))
    torch.testing.assert_close(mha.forward_with_weights(x)[0], mha(x), atol=TOL, rtol=0)


def test_fully_masked_padding_row_on_both_paths():
    torch.manual_seed(5)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 3, 8)
    mask = padding_mask([3, 0], 3)[:, None, None, :]  # the second sequence is all padding
    outs = [one_head_at_a_time(mha, x, mask, False)[0], mha.forward_with_weights(x, mask)[0], mha(x, mask)]
    for out in outs:
        assert torch.isfinite(out).all()
        # zero attention output, then + bias
        torch.testing.assert_close(out[1], mha.W_O.bias.expand(3, 8), atol=TOL, rtol=0)
    torch.testing.assert_close(outs[0], outs[1], atol=TOL, rtol=0)
    torch.testing.assert_close(outs[2], outs[1], atol=TOL, rtol=0)


def test_multi_head_attention_errors():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="n_heads must be at least 1"):
        MultiHeadAttention(8, 0)
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match=r"expected x of shape \(B, T, d_model=8\), got \(2, 5, 6\)"):
        mha(torch.randn(2, 5, 6))
    with pytest.raises(ValueError, match=r"x\[None\]"):
        mha(torch.randn(5, 8))
    x = torch.randn(2, 5, 8)
    for call in (mha, mha.forward_with_weights):
        with pytest.raises(ValueError, match=r"mask of shape \(4, 4\) does not broadcast"):
            call(x, torch.ones(4, 4, dtype=torch.bool))
        with pytest.raises(ValueError, match="does not broadcast"):
            call(x, torch.ones(2, 3, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_kv_heads=3 must divide n_heads=2"):
        MultiHeadAttention(8, 2, n_kv_heads=3)
    with pytest.raises(ValueError, match="either RoPE"):
        MultiHeadAttention(8, 2, rope_base=10000.0, alibi=True)


# --- exercises of lessons 02-03: the usual mistakes get a hint that names them ----------------------


def _masked_after_softmax(q, k, v):
    w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
    return (w * causal_mask(q.shape[-2])) @ v


@pytest.mark.parametrize("name,fn,words", [
    ("stable_softmax", lambda x: x.exp() / x.exp().sum(-1, keepdim=True), "maximum"),
    ("stable_softmax", lambda x: torch.softmax(x, dim=1), "axis 1"),
    ("query_weights", lambda q, K: torch.softmax(K @ q, dim=-1), "√d_k"),
    ("causal_attention", _masked_after_softmax, "after the softmax"),
    ("causal_attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "no mask"),
    ("lengths_to_mask", lambda lengths, n: torch.arange(n) >= lengths[:, None], "real tokens"),
    ("split_into_heads", lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1), "bare reshape"),
    ("multi_head_forward", lambda x, q, k, v, o, h: merge_heads(scaled_dot_product_attention(
        *(split_heads(x @ w, h) for w in (q, k, v)))[0]), "W_O is missing"),
    ("attention_parameter_count", lambda d, h, dk, dv, b: 4 * d * d + 4 * d * b, "4d² + 4d"),
    ("kv_causal_mask", lambda T, S: torch.ones(T, S, dtype=torch.bool).tril(), "top-left"),
])
def test_exercise_hints_name_the_mistake(name, fn, words, first_hint):
    assert words in first_hint(name, fn)


# --- the two paths of attend, and the pieces later lessons add ------------------------------------

@pytest.mark.parametrize("T,S", [(1, 1), (4, 4), (2, 6), (5, 5)])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "bool+causal", "float", "float+causal"])
def test_attend_sdpa_equals_the_explicit_softmax(T, S, kind):
    g = gen(T + 10 * S)
    q, k, v = torch.randn(2, 3, T, 4, generator=g), torch.randn(2, 3, S, 4, generator=g), torch.randn(2, 3, S, 5,
                                                                                                     generator=g)
    mask = None
    if kind.startswith("bool"):
        mask = torch.rand(2, 1, T, S, generator=g) > 0.3
        mask[..., -1] = True
    elif kind.startswith("float"):
        mask = torch.randn(1, 3, T, S, generator=g)
    causal = kind.endswith("causal")
    explicit = scaled_dot_product_attention(q, k, v, mask, causal)[0]
    assert torch.equal(attend(q, k, v, mask, causal, sdpa=False), explicit)
    torch.testing.assert_close(attend(q, k, v, mask, causal), explicit, atol=TOL, rtol=0)
    torch.testing.assert_close(attend(q, k, v, mask, causal), F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if mask is None and not causal else
        (causal_mask(T, S) if mask is None else (mask & causal_mask(T, S) if mask.dtype == torch.bool and causal
                                                 else mask if not causal else
                                                 mask.masked_fill(~causal_mask(T, S), float("-inf"))))),
        atol=TOL, rtol=0)


def test_repeat_kv_gives_each_query_head_its_group():
    k = torch.randn(2, 2, 5, 3)
    assert repeat_kv(k, 1) is k
    r = repeat_kv(k, 3)
    assert r.shape == (2, 6, 5, 3)
    for i in range(6):
        assert torch.equal(r[:, i], k[:, i // 3])


@pytest.mark.parametrize("T, S", [(1, 7), (7, 7), (3, 7)])
@pytest.mark.parametrize("masked", [False, True])
def test_attend_shares_grouped_key_heads_without_copying_them(T, S, masked):
    """The fused path reads each shared key/value head in place (enable_gqa); the explicit path repeats
    them: both equal attention over repeat_kv's copies, for one cached query, a full square and a chunk."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, T, 8, generator=g)
    k, v = torch.randn(2, 2, S, 8, generator=g), torch.randn(2, 2, S, 8, generator=g)
    mask = (torch.rand(2, 1, T, S, generator=g) > 0.3) | causal_mask(T, S) if masked else None
    expected = scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), mask, causal=True)[0]
    for sdpa in (True, False):
        got = attend(q, k, v, mask, causal=True, sdpa=sdpa, group_size=3)
        assert (got - expected).abs().max() <= TOL, (sdpa, T, S)


@pytest.mark.parametrize("sdpa", [True, False])
def test_grouped_query_attention_equals_multi_head_with_shared_key_heads(sdpa):
    torch.manual_seed(7)
    gqa = MultiHeadAttention(16, 4, n_kv_heads=2, sdpa=sdpa).eval()
    mha = MultiHeadAttention(16, 4, sdpa=sdpa).eval()
    with torch.no_grad():
        for name in ("W_Q", "W_O"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("W_K", "W_V"):  # key/value head j serves query heads 2j and 2j + 1
            small = getattr(gqa, name)
            getattr(mha, name).weight.copy_(small.weight.view(2, 1, 4, 16).expand(2, 2, 4, 16).reshape(16, 16))
            getattr(mha, name).bias.copy_(small.bias.view(2, 1, 4).expand(2, 2, 4).reshape(16))
    x = torch.randn(2, 6, 16)
    torch.testing.assert_close(gqa(x, causal=True), mha(x, causal=True), atol=TOL, rtol=0)
    cache = KVCache()
    gqa(x, causal=True, kv_cache=cache)
    assert cache.k.shape == (2, 2, 6, 4)  # the cache holds only the key/value heads


@pytest.mark.parametrize("sdpa", [True, False])
def test_alibi_adds_its_bias_to_the_scores(sdpa):
    torch.manual_seed(8)
    mha = MultiHeadAttention(8, 2, alibi=True, sdpa=sdpa).eval()
    plain = MultiHeadAttention(8, 2).eval()
    plain.load_state_dict(mha.state_dict())
    x = torch.randn(1, 5, 8)
    bias = alibi_bias(2, 5, 5)[None]
    torch.testing.assert_close(mha(x, causal=True), plain(x, bias.masked_fill(~causal_mask(5), float("-inf"))),
                               atol=TOL, rtol=0)
    keep = torch.ones(1, 1, 1, 5, dtype=torch.bool)
    keep[..., 0] = False
    torch.testing.assert_close(mha(x, keep), plain(x, bias.masked_fill(~keep, float("-inf"))), atol=TOL, rtol=0)


@pytest.mark.parametrize("sdpa", [True, False])
def test_rope_with_a_cache_continues_counting_positions(sdpa):
    torch.manual_seed(9)
    mha = MultiHeadAttention(16, 4, rope_base=10000.0, n_kv_heads=2, sdpa=sdpa).eval()
    x = torch.randn(2, 7, 16)
    full = mha(x, causal=True)
    cache = KVCache()
    parts = [mha(x[:, :3], causal=True, kv_cache=cache)] + [mha(x[:, t:t + 1], causal=True, kv_cache=cache)
                                                            for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=TOL, rtol=0)
    shifted = torch.cat([torch.randn(2, 2, 16), x[:, :3]], dim=1)  # the same three tokens, two positions later
    _, w_start = mha.forward_with_weights(x[:, :3], causal=True)
    _, w_later = mha.forward_with_weights(shifted, causal=True)
    # relative positions only: the last token's weights over the three tokens have the same ratios
    ratio = lambda w: w / w.sum(-1, keepdim=True)
    torch.testing.assert_close(ratio(w_start[:, :, 2, :3]), ratio(w_later[:, :, 4, 2:5]), atol=1e-4, rtol=0)
