"""Looking inside a model: record its activations during one forward (``run_with_cache``), replace one
of them by another run's (``patch_activation``), silence attention heads (``ablate_heads``).

The model's code stays as it is, with no recording argument to thread through every ``forward``:
PyTorch's module hooks watch the boundaries the model already has. A block's input and output are the
residual stream before and after it; the input of an attention layer's ``W_O`` is every head's output
side by side (B, T, H·d_v), one head per slice of d_v columns; a final norm's output is the stream the
unembedding reads. The attention weights never cross a module boundary (PyTorch's fused kernel does
not even form them), so while recording, each attention layer runs its ``forward_with_weights``
(``attention.weights_kept``): the explicit softmax the lessons derive, once, in place of the fused
kernel, which gives the same numbers. Every hook is removed when its context closes.

Keys name an activation and, for those of a block, its layer: ``cache["resid_post", 3]``, or
``cache["final_norm"]``; a negative layer counts from the last block. For the ``gpt.GPT``:

- ``"resid_pre", l``: the residual stream entering block l (B, T, D); layer 0's is the embeddings;
- ``"resid_post", l``: the residual stream leaving block l (B, T, D);
- ``"attn", l``: block l's attention probabilities (B, H, T, T), each row summing to 1 (recorded only);
- ``"head_out", l``: each head's output before ``W_O`` mixes them, (B, H, T, d_v);
- ``"final_norm"``: the last stream after the final norm (B, T, D); the logits are its unembedding.

For the ``encoder_decoder.EncoderDecoder`` the same names carry the half they belong to:
``"encoder.resid_pre"``, ``"encoder.resid_post"``, ``"encoder.attn"`` (B, H, S, S), ``"encoder.head_out"``,
``"encoder.final_norm"`` (the memory); ``"decoder.resid_pre"``, ``"decoder.resid_post"``,
``"decoder.attn"`` (causal self-attention, (B, H, T, T)), ``"decoder.head_out"``, ``"decoder.cross_attn"``
(B, H, T, S), ``"decoder.cross_head_out"``, ``"decoder.final_norm"``.

Shapes: ``B`` batch, ``T`` positions (``S`` source positions), ``D`` = d_model, ``H`` heads, ``d_v`` per head.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import nn

from course_utils.attention import MultiHeadAttention, merge_heads, split_heads, weights_kept
from course_utils.encoder_decoder import CrossAttention, EncoderDecoder
from course_utils.gpt import GPT

Key = str | tuple[str, int]
Edit = Callable[[torch.Tensor], torch.Tensor]


class ActivationKeyError(KeyError):
    """A key that names no activation of the model; its message (one line) lists what there is."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Site:
    """Where an activation is seen: the ``input`` or ``output`` of ``module``, the ``heads`` entering
    ``module`` (an attention layer's ``W_O``, split into ``n_heads``), or the attention ``weights`` of
    ``module``."""

    module: nn.Module
    kind: Literal["input", "output", "heads", "weights"]
    n_heads: int = 0


def _attention_sites(prefix: str, attns: Sequence[MultiHeadAttention | CrossAttention], weights: str = "attn",
                     heads: str = "head_out") -> dict[str, list[Site]]:
    return {prefix + weights: [Site(a, "weights") for a in attns],
            prefix + heads: [Site(a.W_O, "heads", a.n_heads) for a in attns]}


def _stream_sites(prefix: str, blocks: Iterable[nn.Module]) -> dict[str, list[Site]]:
    blocks = list(blocks)
    return {prefix + "resid_pre": [Site(b, "input") for b in blocks],
            prefix + "resid_post": [Site(b, "output") for b in blocks]}


def sites(model: nn.Module) -> dict[str, list[Site]]:
    """Every activation of ``model`` by name: one site per block (a layerless one, such as
    ``"final_norm"``, is a list of one that its key names without a layer). An encoder without
    blocks has no ``"encoder.resid_pre"`` and the like."""
    if isinstance(model, GPT):  # its blocks hold MultiHeadAttention (gpt.gpt_block)
        attns = [cast(MultiHeadAttention, block.attn) for block in model.blocks]
        return {**_stream_sites("", model.blocks), **_attention_sites("", attns),
                "final_norm": [Site(model.final_norm, "output")]}
    if isinstance(model, EncoderDecoder):
        encoder, decoder = model.transformer.encoder, model.transformer.decoder_blocks()
        found = {**_stream_sites("encoder.", encoder.blocks),
                 **_attention_sites("encoder.", [cast(MultiHeadAttention, block.attn) for block in encoder.blocks]),
                 "encoder.final_norm": [Site(encoder.final_norm, "output")],
                 **_stream_sites("decoder.", decoder),
                 **_attention_sites("decoder.", [block.self_attn for block in decoder]),
                 **_attention_sites("decoder.", [block.cross_attn for block in decoder], "cross_attn",
                                    "cross_head_out"),
                 "decoder.final_norm": [Site(model.transformer.decoder.final_norm, "output")]}
        return {name: layer_sites for name, layer_sites in found.items() if layer_sites}  # no encoder blocks
    raise TypeError(f"cannot look inside a {type(model).__name__}; use a gpt.GPT or an "
                    "encoder_decoder.EncoderDecoder")


def _layerless(name: str) -> bool:
    return name.endswith("final_norm")


def resolve(names: dict[str, int], key: Key) -> tuple[str, int]:
    """(name, layer ≥ 0) of ``key`` among ``names`` (name -> number of layers; layerless names have
    one, layer 0), or a one-line ``ActivationKeyError`` saying what the key should be."""
    pair = isinstance(key, tuple) and len(key) == 2
    name, layer = (key, None) if isinstance(key, str) else key if pair else (None, None)
    if name not in names:
        layered, alone = ([n for n in names if _layerless(n) is want] for want in (False, True))
        raise ActivationKeyError(f"no activation {key!r}; keys are (name, layer) with a name from "
                                 f"{', '.join(layered)}; or {' or '.join(alone)} alone")
    if _layerless(name):
        if layer is not None:
            raise ActivationKeyError(f"{name!r} belongs to no block; write it without a layer: [{name!r}]")
        return name, 0
    n = names[name]
    if layer is None:
        raise ActivationKeyError(f"{name!r} has one activation per block; give a layer: [{name!r}, 0]")
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
        raise ActivationKeyError(f"layer {layer!r} of {name!r} does not exist: the model has {n} blocks, "
                                 f"layers 0 to {n - 1} (or -1 for the last)")
    return name, layer % n


class ActivationCache:
    """The activations of one forward, read by key: ``cache["resid_post", l]``, ``cache["final_norm"]``
    (the module docstring lists the names); ``stack(name)`` puts every layer's in one tensor."""

    def __init__(self, tensors: dict[str, list[torch.Tensor]]) -> None:
        self.tensors = tensors

    def names(self) -> list[str]:
        """The names this cache holds."""
        return list(self.tensors)

    def __getitem__(self, key: Key) -> torch.Tensor:
        name, layer = resolve({n: len(t) for n, t in self.tensors.items()}, key)
        return self.tensors[name][layer]

    def stack(self, name: str) -> torch.Tensor:
        """Every layer's activation ``name``, stacked: (L, ...) (e.g. (L, B, T, D) for a residual stream)."""
        resolve({n: len(t) for n, t in self.tensors.items()}, (name, 0))
        return torch.stack(self.tensors[name])


@contextmanager
def _hooked(site: Site, edit: Edit) -> Iterator[None]:
    """While open, ``edit`` sees (and may replace) the activation at ``site`` at every forward."""
    module, n_heads = site.module, site.n_heads
    if site.kind == "output":
        handle = module.register_forward_hook(lambda _m, _args, out: edit(out))
    elif site.kind == "input":
        handle = module.register_forward_pre_hook(lambda _m, args: (edit(args[0]), *args[1:]))
    elif site.kind == "heads":  # W_O's input (B, T, H·d_v) seen as (B, H, T, d_v)
        handle = module.register_forward_pre_hook(
            lambda _m, args: (merge_heads(edit(split_heads(args[0], n_heads))), *args[1:]))
    else:
        raise ValueError("attention weights are recorded, not replaced; patch the heads' outputs "
                         "('head_out') instead")
    try:
        yield
    finally:
        handle.remove()


def run_with_cache(model: GPT | EncoderDecoder, *inputs: torch.Tensor) -> tuple[torch.Tensor, ActivationCache]:
    """Run ``model(*inputs)`` once (a GPT's ``idx`` (B, T); an encoder–decoder's ``src`` (B, S) and
    ``tgt_in`` (B, T)) and return ``(logits (B, T, V), cache)`` with every activation of that run,
    detached. Inside ``patch_activation`` or ``ablate_heads`` the cache holds the patched run's.
    Gradients follow the caller's mode; call it under ``torch.no_grad()`` to look only.
    """
    found = sites(model)
    recorded: dict[str, list[torch.Tensor | None]] = {n: [None] * len(s) for n, s in found.items()}

    def recorder(name: str, layer: int) -> Edit:
        def record(act: torch.Tensor) -> torch.Tensor:
            recorded[name][layer] = act.detach()
            return act
        return record

    with ExitStack() as stack:
        kept = {}
        for name, layer_sites in found.items():
            if layer_sites[0].kind == "weights":  # sites() keeps no empty list
                kept[name] = stack.enter_context(weights_kept([s.module for s in layer_sites]))
            else:
                for layer, site in enumerate(layer_sites):
                    stack.enter_context(_hooked(site, recorder(name, layer)))
        out = model(*inputs)
    for name, weights in kept.items():
        if len(weights) != len(found[name]):
            raise RuntimeError(f"{name}: {len(weights)} attention calls for {len(found[name])} layers; "
                               "run_with_cache runs the model once, without a KV cache")
        recorded[name] = [w.detach() for w in weights]
    missing = [f"{n}[{layer}]" for n, ts in recorded.items() for layer, t in enumerate(ts) if t is None]
    if missing:
        raise RuntimeError(f"the forward never reached {', '.join(missing)}; was the model built as sites() reads it?")
    logits = out[0] if isinstance(out, tuple) else out  # a GPT returns (logits, loss)
    return logits, ActivationCache({n: [t for t in ts if t is not None] for n, ts in recorded.items()})


def _chosen(index: int | Sequence[int] | None, n: int, what: str) -> torch.Tensor:
    """(n,) bool: True at the chosen indices (all when None); an index outside -n..n-1 is an error."""
    chosen = torch.zeros(n, dtype=torch.bool)
    if index is None:
        return ~chosen
    for i in [index] if isinstance(index, int) else index:
        if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n:
            raise ValueError(f"{what} {i!r} does not exist: there are {n} {what}s, 0 to {n - 1} "
                             "(or negative, from the end)")
        chosen[i] = True
    return chosen


@contextmanager
def patch_activation(model: GPT | EncoderDecoder, key: Key, value: torch.Tensor,
                     positions: int | Sequence[int] | None = None,
                     heads: int | Sequence[int] | None = None) -> Iterator[None]:
    """While open, every forward of ``model`` has the activation ``key`` replaced by ``value`` at the
    chosen ``positions`` (all when None) and, for a heads' output (``"head_out"``), only in the
    chosen ``heads``; everything downstream computes from the replaced values.

    ``value`` is the same activation from another run (a clean prompt of the same length):
    (B or 1, T, D) for a residual stream, (B or 1, H, T, d_v) for the heads; anything that broadcasts
    to it works too (a scalar 0 zeroes, a (1, H, 1, d_v) mean replaces every position).
    """
    found = sites(model)
    name, layer = resolve({n: len(s) for n, s in found.items()}, key)
    site = found[name][layer]
    if heads is not None and site.kind != "heads":
        raise ValueError(f"heads= chooses heads of a heads' output such as 'head_out'; {name!r} is not one")
    head_mask = _chosen(heads, site.n_heads, "head")[:, None, None] if site.kind == "heads" else torch.tensor(True)

    def replace(act: torch.Tensor) -> torch.Tensor:
        try:
            shape = torch.broadcast_shapes(value.shape, act.shape)
        except RuntimeError:
            shape = None
        if shape != act.shape:
            raise ValueError(f"the patch of {key!r} has shape {tuple(value.shape)} but the activation has "
                             f"{tuple(act.shape)}; patch with the same activation of a prompt of the same length")
        where = (_chosen(positions, act.shape[-2], "position")[:, None] & head_mask).to(act.device)  # ([H,] T, 1)
        return torch.where(where, value.to(act), act)

    with _hooked(site, replace):
        yield


@contextmanager
def ablate_heads(model: GPT | EncoderDecoder, heads: Iterable[tuple[int, int]],
                 mean_of: ActivationCache | None = None, name: str = "head_out") -> Iterator[None]:
    """While open, the (layer, head) pairs of ``heads`` contribute nothing of their own: each one's
    output before ``W_O`` (``name``: ``"head_out"``, or an encoder–decoder's ``"decoder.cross_head_out"``
    and the others) is zero, or with ``mean_of`` (the cache of a reference run) its mean over that
    run's batch and positions, which keeps the average the next layers are used to reading.
    Ablating no heads changes nothing.
    """
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    with ExitStack() as stack:
        for layer, chosen in by_layer.items():
            value = torch.zeros(()) if mean_of is None else mean_of[name, layer].mean(dim=(0, 2))[None, :, None]
            stack.enter_context(patch_activation(model, (name, layer), value, heads=chosen))
        yield

