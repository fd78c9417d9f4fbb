"""Scaled dot-product attention, masks, one attention head, multi-head attention and the KV cache.

Attention is computed on one of two paths that give the same numbers (``attend``): the explicit
softmax(q kᵀ/√d_k) v of lesson 02 (``scaled_dot_product_attention``, which also returns the
weights) or PyTorch's fused ``F.scaled_dot_product_attention`` (fast, no weights kept).
``weights_kept`` keeps a model's attention weights during its forward by running the first path.

Shapes: B batch, H heads, T queries, S keys/values, D = d_model, d_k / d_v per-head widths.
Masks are boolean with True = may attend (as in ``torch.nn.functional.scaled_dot_product_attention``)
or additive floats (0 = keep, -inf = block), broadcastable to ``(..., T, S)``.
A query whose every key is masked gets all-zero weights and a zero output (never NaN), which is
also what PyTorch's own kernel returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from course_utils.positional import alibi_bias, rope_angles, rotate_pairs


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / sum exp(x) along ``dim``, computed as exp(x - max) so large scores cannot overflow.

    A slice that is entirely -inf (every key masked) gives zeros instead of 0/0 = NaN.
    """
    x_max = x.amax(dim=dim, keepdim=True)
    x_max = torch.where(x_max == float("-inf"), torch.zeros_like(x_max), x_max)
    e = torch.exp(x - x_max)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total == 0, torch.ones_like(total), total)


def causal_mask(T: int, S: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """(T, S) boolean mask, True where query t may see key s, i.e. s <= t + S - T.

    Aligned bottom-right: with S > T (keys of earlier tokens held in a KV cache) the last query
    sees every key. ``S`` defaults to ``T``, which gives the usual lower-triangular mask.
    """
    S = T if S is None else S
    if T < 0 or S < 0:
        raise ValueError(f"causal_mask needs non-negative sizes, got T={T}, S={S}")
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


def padding_mask(lengths: torch.Tensor | list[int], max_len: int) -> torch.Tensor:
    """(B, S=max_len) boolean mask, True at the first ``lengths[b]`` positions (the real tokens).

    To mask keys in attention scores of shape (B, H, T, S) use ``padding_mask(...)[:, None, None, :]``.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.ndim != 1 or lengths.is_floating_point():
        raise ValueError(f"lengths must be a 1-D list or tensor of integers, got shape {tuple(lengths.shape)}"
                         f" and dtype {lengths.dtype}")
    if len(lengths) and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, max_len={max_len}], got {lengths.tolist()}; "
                         "raise max_len to the longest sequence")
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]


def _check_mask(mask: torch.Tensor, scores_shape: torch.Size) -> None:
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"mask has dtype {mask.dtype}; use a bool mask (True = may attend) "
                        "or a float mask added to the scores (0 = keep, -inf = block)")
    try:
        shape = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        shape = None
    if shape != scores_shape:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape "
                         f"{tuple(scores_shape)} (..., T, S); give it trailing dims (T, S), (1, S) or "
                         "(B, 1, 1, S) for a padding mask")


def _combine(mask: torch.Tensor | None, causal: bool, T: int, S: int, device: torch.device,
             dtype: torch.dtype) -> torch.Tensor | None:
    """One mask from an optional user mask and the causal flag (bool stays bool, float stays float)."""
    if not causal:
        return mask
    tri = causal_mask(T, S, device=device)
    if mask is None or mask.dtype == torch.bool:
        return tri if mask is None else mask & tri
    return torch.where(tri, mask.to(dtype), float("-inf"))


def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
    causal: bool = False, *, dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q kᵀ / √d_k + mask) v, returning ``(out (..., T, d_v), weights (..., T, S))``.

    q (..., T, d_k), k (..., S, d_k), v (..., S, d_v). ``causal`` adds the bottom-right causal mask.
    ``dropout_p`` drops attention weights (training only); the weights returned are the ones used.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share their last dim d_k: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must hold the same number of positions S: k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(f"leading (batch, head) dims do not broadcast: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}") from None
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, S)
    if mask is not None:
        _check_mask(mask, torch.Size((*batch, T, S)))
    mask = _combine(mask, causal, T, S, q.device, scores.dtype)
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(scores.dtype)  # a float32 mask must not promote bf16 scores
    weights = softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v, weights


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, H·d) -> (B, H, T, d): the columns of each head become their own slice.

    The einops pattern ``"b t (h d) -> b h t d"``, written with a reshape and a transpose.
    """
    if x.shape[-1] % n_heads:
        raise ValueError(f"last dim {x.shape[-1]} is not divisible by n_heads={n_heads}")
    return x.unflatten(-1, (n_heads, -1)).transpose(-3, -2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, d) -> (B, T, H·d): concatenate the heads' outputs side by side (the inverse of split)."""
    if x.ndim < 3:
        raise ValueError(f"merge_heads expects (..., H, T, d), got shape {tuple(x.shape)}")
    return x.transpose(-3, -2).flatten(-2)


def _check_input(x: torch.Tensor, d_model: int) -> None:
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(f"expected x of shape (B, T, d_model={d_model}), got {tuple(x.shape)}; "
                         "add a batch axis with x[None] for a single sequence")


class SelfAttentionHead(nn.Module):
    """One attention head: q = x W_Q, k = x W_K, v = x W_V, then softmax(q kᵀ/√d_k) v.

    Maps (B, T, D) to (B, T, d_v); a separate W_O brings d_v back to D.
    """

    def __init__(self, d_model: int, d_k: int, d_v: int | None = None, bias: bool = True) -> None:
        super().__init__()
        self.d_model, self.d_k, self.d_v = d_model, d_k, d_v or d_k
        self.W_Q = nn.Linear(d_model, d_k, bias=bias)
        self.W_K = nn.Linear(d_model, d_k, bias=bias)
        self.W_V = nn.Linear(d_model, self.d_v, bias=bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (out (B, T, d_v), weights (B, T, T))."""
        _check_input(x, self.d_model)
        return scaled_dot_product_attention(self.W_Q(x), self.W_K(x), self.W_V(x), mask, causal)


class Cache(Protocol):
    """What ``MultiHeadAttention`` needs from a KV cache (``KVCache`` below is the simplest one):
    its number of positions (where RoPE continues counting) and ``update``."""

    def __len__(self) -> int: ...

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class KVCache:
    """Keys and values of the tokens seen so far, (B, H, S, d) each; ``update`` appends and returns all."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k (B, H, S_new, d_k), v (B, H, S_new, d_v); return the keys and values of all tokens."""
        if self.k is None or self.v is None:
            self.k, self.v = k, v
        else:
            self.k, self.v = torch.cat([self.k, k], dim=-2), torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def select(self, rows: torch.Tensor) -> None:
        """Keep the batch rows ``rows`` (B_new,) in that order, e.g. the parents of the beams that survive
        a step of beam search; a row may be kept twice."""
        if self.k is None or self.v is None:
            raise ValueError("the cache is empty; select rows after the first update")
        self.k, self.v = self.k[rows], self.v[rows]


class ModelKVCache:
    """One ``KVCache`` per block of a model; ``len(cache)`` is the number of positions already processed.

    Each block's attention appends its new keys and values to its own layer cache (``update``), so
    a step with one new token attends over every earlier position without recomputing them.
    """

    def __init__(self, n_layers: int) -> None:
        if n_layers <= 0:
            raise ValueError(f"n_layers must be positive, got {n_layers}")
        self.layers = [KVCache() for _ in range(n_layers)]

    def __len__(self) -> int:
        return len(self.layers[0])

    def __getitem__(self, i: int) -> KVCache:
        return self.layers[i]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False, *, dropout_p: float = 0.0, sdpa: bool = True, group_size: int = 1) -> torch.Tensor:
    """softmax(q kᵀ/√d_k + mask) v -> (..., T, d_v), by one of two paths that give the same numbers:
    PyTorch's ``F.scaled_dot_product_attention`` (``sdpa=True``: one fused kernel, no weights kept)
    or ``scaled_dot_product_attention`` above (the softmax written out, as lesson 02 derives it).

    The masks follow ``scaled_dot_product_attention``: bool (True = may attend) or additive floats,
    and ``causal`` aligned bottom-right. With ``group_size`` > 1, k and v (..., H_kv, S, d) hold one
    head per group of query heads (grouped-query attention): the explicit path repeats them with
    ``repeat_kv``; PyTorch's kernel reads each shared head in place (``enable_gqa``), without the copy.
    """
    T, S = q.shape[-2], k.shape[-2]
    if causal and mask is None and T == 1:
        causal = False  # one query, the newest token (KV-cache decoding): it sees every key, nothing to mask
    if not sdpa:
        return explicit_attention(q, k, v, mask, causal, dropout_p=dropout_p, group_size=group_size)[0]
    gqa = group_size > 1
    if causal and mask is None and T == S:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa)
    mask = _combine(mask, causal, T, S, q.device, q.dtype)
    if mask is not None and mask.is_floating_point():
        mask = mask.to(q.dtype)  # PyTorch's kernel wants a float mask in the dtype of q
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa)


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                       causal: bool = False, *, dropout_p: float = 0.0,
                       group_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The explicit path of ``attend`` with its weights: ``(out (..., T, d_v), weights (..., H, T, S))``.
    Each key/value head is repeated for the ``group_size`` query heads that read it (``repeat_kv``),
    then ``scaled_dot_product_attention`` (lesson 02) does the rest."""
    k, v = repeat_kv(k, group_size), repeat_kv(v, group_size)
    return scaled_dot_product_attention(q, k, v, mask, causal, dropout_p=dropout_p)


def repeat_kv(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Grouped-query attention: (B, H_kv, S, d) -> (B, H_kv·group_size, S, d), each key/value head
    repeated for the ``group_size`` query heads that read it (query head i reads head i // group_size)."""
    return x if group_size == 1 else x.repeat_interleave(group_size, dim=-3)


def with_alibi(mask: torch.Tensor | None, n_heads: int, T: int, S: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    """A mask plus ALiBi's distance bias (1, H, T, S) (lesson 05): a bool mask becomes 0 / −inf first."""
    bias = alibi_bias(n_heads, T, S).to(device=device, dtype=dtype)[None]
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return torch.where(mask, bias, float("-inf"))
    return mask.to(dtype) + bias


RopeTable = tuple[torch.Tensor, torch.Tensor]  # RoPE's (cos, sin), (T, d/2) each


def rope_table(offset: int, T: int, d: int, base: float, dtype: torch.dtype, device: torch.device) -> RopeTable:
    """RoPE's cos and sin (T, d/2) at positions offset .. offset + T − 1 (``positional.rope_angles``).

    Every block of one forward pass rotates by the same angles, so a model computes this once per
    forward and hands it to each attention layer (``GPT.forward``, as Hugging Face's LLaMA does);
    an attention layer used alone computes its own.
    """
    return rope_angles(torch.arange(offset, offset + T, device=device), d, base, dtype)


def rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE (lesson 09) on q (B, H, T, d) and k (B, H_kv, T, d) with one cos/sin table (T, d/2) for
    both (``rope_table``): ``positional.rotate_pairs`` on each. The table is cast to q's dtype
    (a no-op unless the caller made it in another precision)."""
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)


class MultiHeadAttention(nn.Module):
    """m heads, each with its own slice W_Q^i, W_K^i, W_V^i of W_Q, W_K, W_V; concat(H_1..H_m) W_O.

    W_Q: D -> H·d_k, W_K: D -> H_kv·d_k, W_V: D -> H_kv·d_v, W_O: H·d_v -> D; d_k = d_v = D / H
    unless given. All heads are computed at once: ``split_heads`` turns (B, T, H·d) into
    (B, H, T, d) and one batched product does every head (lesson 03 shows it equals the loop over
    heads). Later lessons add one line each: a KV cache (07), ALiBi's bias (``alibi``, 05), RoPE
    (``rope_base``, 09) and grouped-query attention (``n_kv_heads`` H_kv < H, 09: query head i reads
    key/value head i // (H / H_kv), so a cache stores only H_kv heads). ``sdpa`` picks the path of
    ``attend``; ``forward_with_weights`` always takes the explicit one.
    """

    def __init__(self, d_model: int, n_heads: int, d_k: int | None = None, d_v: int | None = None,
                 bias: bool = True, dropout: float = 0.0, n_kv_heads: int | None = None,
                 rope_base: float | None = None, alibi: bool = False, sdpa: bool = True) -> None:
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"n_heads must be at least 1, got {n_heads}")
        if (d_k is None or d_v is None) and d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pick a number of "
                             "heads that divides d_model, or pass d_k and d_v explicitly")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads} (each key/value head "
                             "serves the same number of query heads); use a divisor such as 1 or n_heads")
        if rope_base is not None and alibi:
            raise ValueError("use either RoPE (rope_base) or ALiBi (alibi=True), not both")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.d_k = d_k or d_model // n_heads
        self.d_v = d_v or d_model // n_heads
        self.dropout, self.rope_base, self.alibi, self.sdpa = dropout, rope_base, alibi, sdpa
        self.W_Q = nn.Linear(d_model, n_heads * self.d_k, bias=bias)
        self.W_K = nn.Linear(d_model, n_kv_heads * self.d_k, bias=bias)
        self.W_V = nn.Linear(d_model, n_kv_heads * self.d_v, bias=bias)
        self.W_O = nn.Linear(n_heads * self.d_v, d_model, bias=bias)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: 1 for multi-head, n_heads for multi-query attention."""
        return self.n_heads // self.n_kv_heads

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                kv_cache: Cache | None = None, rope: RopeTable | None = None) -> torch.Tensor:
        """x (B, T, D) -> out (B, T, D), on the path ``sdpa`` picks (``forward_with_weights`` also
        returns the weights).

        ``mask`` broadcasts to (B, H, T, S); a 3-D mask is read as (B, T, S) and shared by the heads.
        With ``kv_cache`` the new keys/values are appended to the cache and the T new queries attend
        to all S cached positions (a causal mask stays aligned bottom-right). ``rope`` is the
        (cos, sin) table of the T new positions (``rope_table``) that a model computes once for all
        its layers; a RoPE layer called without one computes its own.
        """
        q, k, v, mask = self._heads(x, mask, kv_cache, rope)
        p = self.dropout if self.training else 0.0
        return self.W_O(merge_heads(attend(q, k, v, mask, causal, dropout_p=p, sdpa=self.sdpa,
                                           group_size=self.group_size)))

    def forward_with_weights(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False,
                             kv_cache: Cache | None = None,
                             rope: RopeTable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``forward``, also returning the attention weights: (out (B, T, D), weights (B, H, T, S)).
        Always the explicit path (PyTorch's fused kernel keeps no weights); the same numbers."""
        q, k, v, mask = self._heads(x, mask, kv_cache, rope)
        p = self.dropout if self.training else 0.0
        h, weights = explicit_attention(q, k, v, mask, causal, dropout_p=p, group_size=self.group_size)
        return self.W_O(merge_heads(h)), weights

    def _heads(self, x: torch.Tensor, mask: torch.Tensor | None, kv_cache: Cache | None,
               rope: RopeTable | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """q (B, H, T, d_k), k (B, H_kv, S, d_k), v (B, H_kv, S, d_v) with RoPE and the cache applied,
        and the mask checked (plus ALiBi's bias): everything before the attention itself."""
        _check_input(x, self.d_model)
        q = split_heads(self.W_Q(x), self.n_heads)     # (B, H, T, d_k)
        k = split_heads(self.W_K(x), self.n_kv_heads)  # (B, H_kv, T, d_k)
        v = split_heads(self.W_V(x), self.n_kv_heads)  # (B, H_kv, T, d_v)
        if self.rope_base is not None:
            if rope is None:  # used alone: the table of these T positions, after the cached ones
                offset = 0 if kv_cache is None else len(kv_cache)
                rope = rope_table(offset, q.shape[-2], self.d_k, self.rope_base, q.dtype, q.device)
            q, k = rotate_qk(q, k, *rope)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)  # (B, H_kv, S, d): the earlier tokens' keys and values too
        T, S = q.shape[-2], k.shape[-2]
        if mask is not None:
            mask = mask[:, None] if mask.ndim == 3 else mask  # (B, T, S) -> (B, 1, T, S): every head
            _check_mask(mask, torch.Size((x.shape[0], self.n_heads, T, S)))
        if self.alibi:
            mask = with_alibi(mask, self.n_heads, T, S, q.dtype, x.device)
        return q, k, v, mask


class WeightedLayer(Protocol):
    """An attention layer that can return its weights: ``forward_with_weights(...) -> (out, weights)``."""

    def forward_with_weights(self, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]: ...


@contextmanager
def weights_kept(layers: Sequence[nn.Module]) -> Iterator[list[torch.Tensor]]:
    """While open, each layer of ``layers`` (an attention layer with ``forward_with_weights``) runs
    ``forward_with_weights`` where it is called, hands on its output and appends its weights
    (B, H, T, S) to the list this yields, in the order the calls happen.

    The layer is still called through ``nn.Module.__call__``, so hooks on it and inside it fire once,
    and it runs once: on the explicit path, which gives the numbers the fused kernel gives (lesson 03
    checks it) and is the softmax the lessons derive. The model's code needs no recording argument:
    ``encoder_decoder`` keeps its cross-attention maps this way and ``activations`` every layer's.
    """
    kept: list[torch.Tensor] = []

    def keeping(layer: WeightedLayer) -> Callable[..., torch.Tensor]:  # its forward_with_weights, as forward
        def forward(*args: object, **kwargs: object) -> torch.Tensor:
            out, weights = layer.forward_with_weights(*args, **kwargs)
            kept.append(weights)
            return out
        return forward

    if len({id(layer) for layer in layers}) < len(layers) or any("forward" in vars(layer) for layer in layers):
        raise ValueError("a layer would keep its weights twice; give each layer once, to one weights_kept")
    for layer in layers:
        setattr(layer, "forward", keeping(cast(WeightedLayer, layer)))  # noqa: B010 (an instance attribute)
    try:
        yield kept
    finally:
        for layer in layers:
            delattr(layer, "forward")
