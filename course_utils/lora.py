"""LoRA (low-rank adaptation, Hu et al. 2021): fine-tune a frozen linear layer through a rank-r update.

A frozen layer computes ``y = x Wᵀ + b`` with ``W`` (out, in). LoRA learns ``ΔW = (α/r)·B A`` with
``A`` (r, in) and ``B`` (out, r), so the layer computes ``y = x Wᵀ + b + (α/r)·x Aᵀ Bᵀ``:

- ``B`` starts at zero, so the adapted model is *exactly* the pretrained one at step 0, while ``A``
  starts random (Kaiming-uniform, as in the paper's code and ``peft``) so that B gets a gradient;
- only ``A`` and ``B`` are trained: r·(in + out) numbers per layer instead of in·out (and AdamW keeps
  two moments of each trained number, so its state shrinks by the same factor);
- ``α/r`` keeps the size of the update comparable across ranks, so one learning rate serves all r;
- after training, ``merge`` folds ``ΔW`` into ``W``: the merged model is a plain model, no slower.

``add_lora(model, targets, rank, alpha)`` puts adapters on the linear layers whose names end with
one of ``targets`` (e.g. ``("attn.W_Q", "attn.W_V")``); ``save_adapter``/``load_adapter`` store only
the adapters (A, B, rank, α, the adapted names and a fingerprint of the model they belong to).

Shapes: ``*`` any leading dimensions, ``I`` = in_features, ``O`` = out_features, ``r`` = rank.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import torch
from torch import nn

from course_utils.train import save_checkpoint

ADAPTER_FORMAT = "course-lora-1"


class AdapterError(ValueError):
    """An adapter file that does not fit the model it is loaded into; the message says why."""


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) · x Aᵀ Bᵀ`` with ``base`` frozen, ``A`` (r, I) and ``B`` (O, r) trained."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear adapts an nn.Linear, got {type(base).__name__}")
        out_features, in_features = base.weight.shape
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= min(in_features, out_features):
            raise ValueError(f"rank={rank!r} does not fit a {in_features}→{out_features} layer; "
                             f"use an int from 1 to min(in, out) = {min(in_features, out_features)}")
        if not alpha > 0:
            raise ValueError(f"alpha must be positive (the update is scaled by alpha/rank), got {alpha!r}")
        self.base = base.requires_grad_(False)
        self.rank, self.alpha = rank, float(alpha)
        device, dtype = base.weight.device, base.weight.dtype
        self.A = nn.Parameter(torch.empty(rank, in_features, device=device, dtype=dtype))
        self.B = nn.Parameter(torch.zeros(out_features, rank, device=device, dtype=dtype))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # nn.Linear's own init, as peft does
        self.merged = False

    @property
    def scale(self) -> float:
        """α / r, the factor in front of B A."""
        return self.alpha / self.rank

    def delta_weight(self) -> torch.Tensor:
        """ΔW = (α/r)·B A, (O, I): what training has added to the frozen weight."""
        return self.scale * (self.B @ self.A)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (*, I) -> (*, O). Two thin products, x Aᵀ (*, r) then · Bᵀ, never the full (O, I) ΔW."""
        y = self.base(x)
        if self.merged:
            return y
        return y + self.scale * ((x @ self.A.T) @ self.B.T)

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """Fold ΔW into the base weight (in place) and return the base ``nn.Linear``, which now
        computes what the adapted layer computed; ``unmerge`` takes ΔW out again."""
        if not self.merged:
            self.base.weight += self.delta_weight()
            self.merged = True
        return self.base

    @torch.no_grad()
    def unmerge(self) -> nn.Linear:
        """Undo ``merge``: the base weight is the pretrained one again (up to float rounding)."""
        if self.merged:
            self.base.weight -= self.delta_weight()
            self.merged = False
        return self.base

    def extra_repr(self) -> str:
        out_features, in_features = self.base.weight.shape
        return f"in={in_features}, out={out_features}, rank={self.rank}, alpha={self.alpha:g}, merged={self.merged}"


# ---------------------------------------------------------------------------------------------
# Adapters on a whole model
def linear_names(model: nn.Module) -> list[str]:
    """The names of every ``nn.Linear`` in ``model`` (not inside an adapter), in module order."""
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and not name.endswith(".base")]


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def add_lora(model: nn.Module, targets: str | tuple[str, ...] | list[str], rank: int, alpha: float) -> list[str]:
    """Freeze every parameter of ``model`` and replace each ``nn.Linear`` whose name ends with one of
    ``targets`` (``"W_Q"``, ``"attn.W_V"``, ``"blocks.3.ffn.W_in"``) by a ``LoRALinear``; returns
    the names adapted. Afterwards only the adapters' A and B have ``requires_grad``."""
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    chosen = [name for name in linear_names(model) if _matches(name, targets)]
    if not chosen:
        known = sorted({name.split(".")[-1] for name in linear_names(model)})
        raise ValueError(f"no linear layer of the model is named like {', '.join(targets)}; "
                         f"its linear layers end with: {', '.join(known) or 'none'}")
    model.requires_grad_(False)
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, alpha))
    return chosen


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every adapter of ``model`` by the name of the layer it adapts."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def trainable_parameters(model: nn.Module) -> int:
    """How many numbers the optimiser updates (``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def lora_parameter_count(shapes: list[tuple[int, int]], rank: int) -> int:
    """The formula: r·(in + out) for each adapted layer given as (out, in)."""
    return sum(rank * (in_features + out_features) for out_features, in_features in shapes)


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter and put the plain ``nn.Linear`` back in its place (in place): the
    result has the original architecture and computes what the adapted model computed."""
    for name, layer in lora_layers(model).items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.merge())
    return model


def adamw_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held in the optimiser's state (AdamW: both moments and the step count of every
    parameter it has updated); call it after at least one step, when the state exists."""
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if torch.is_tensor(t))


# ---------------------------------------------------------------------------------------------
# Saving and loading adapters
# config fields that say how a model computes or trains, not which weights it has: an adapter fits either way
NOT_IDENTITY = ("sdpa", "dropout")


def fingerprint(model: nn.Module) -> dict:
    """What an adapter must match: the model's config (when it has one; not the attention path or the
    dropout, ``NOT_IDENTITY``) and its parameter count."""
    config = getattr(model, "config", None)
    described = (dataclasses.asdict(config)
                 if dataclasses.is_dataclass(config) and not isinstance(config, type) else {})
    base = sum(p.numel() for name, p in model.named_parameters() if not name.endswith((".A", ".B")))
    plain = {k: v for k, v in described.items() if isinstance(v, (int, float, str, bool, type(None)))}
    return {"config": _identity(plain), "base_parameters": base}


def _identity(config: dict) -> dict:
    """The fields of a described config that say which weights a model has (``NOT_IDENTITY`` left out)."""
    return {k: v for k, v in config.items() if k not in NOT_IDENTITY}


def adapter_state(model: nn.Module) -> dict:
    """The adapters as plain tensors, numbers and strings (loads with ``weights_only=True``)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("the model has no LoRA adapters; call add_lora(model, targets, rank, alpha) first")
    ranks = {m.rank for m in layers.values()}
    alphas = {m.alpha for m in layers.values()}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError("the adapters have different ranks or alphas; save_adapter stores one rank and one alpha")
    return {"format": ADAPTER_FORMAT, "rank": ranks.pop(), "alpha": alphas.pop(), "names": list(layers),
            "model": fingerprint(model),
            "tensors": {f"{name}.{p}": getattr(m, p).detach().cpu().clone() for name, m in layers.items()
                        for p in ("A", "B")}}


def save_adapter(model: nn.Module, path: str | os.PathLike) -> Path:
    """Write the adapters of ``model`` to ``path`` (unmerged A and B only; a few hundred KB), atomically
    like a training checkpoint (``train.save_checkpoint``): a crash midway leaves the previous file intact."""
    state = adapter_state(model)
    if any(m.merged for m in lora_layers(model).values()):
        raise ValueError("unmerge the adapters before saving them (the base weights hold ΔW while merged)")
    path = Path(path)
    save_checkpoint(path, state)
    return path


def _first_difference(saved: dict, ours: dict) -> str:
    for key in sorted(set(saved["config"]) | set(ours["config"])):
        if saved["config"].get(key) != ours["config"].get(key):
            return f"{key}={saved['config'].get(key)!r} there, {ours['config'].get(key)!r} here"
    return f"{saved['base_parameters']:,} parameters there, {ours['base_parameters']:,} here"


def load_adapter(model: nn.Module, path: str | os.PathLike) -> list[str]:
    """Put the adapters saved at ``path`` on ``model`` (adding them if the model has none) and
    return the adapted names; an adapter saved for another model raises ``AdapterError``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no adapter file at {path}; save one with lora.save_adapter(model, path)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a truncated or foreign file: say what it is, not torch's traceback
        raise AdapterError(f"{path} is not an adapter file ({type(err).__name__}); "
                           "write one with lora.save_adapter") from None
    if not isinstance(state, dict) or state.get("format") != ADAPTER_FORMAT:
        raise AdapterError(f"{path} is not an adapter file of this course (format {ADAPTER_FORMAT}); "
                           "write one with lora.save_adapter")
    ours = fingerprint(model)
    saved = {**state["model"], "config": _identity(state["model"]["config"])}  # older files list NOT_IDENTITY too
    if saved != ours:
        raise AdapterError(f"{path} was saved for another model ({_first_difference(saved, ours)}); "
                           "load it into the model it was trained on")
    if not lora_layers(model):
        add_lora(model, tuple(state["names"]), state["rank"], state["alpha"])
    layers = lora_layers(model)
    if sorted(layers) != sorted(state["names"]):
        raise AdapterError(f"{path} adapts {len(state['names'])} layers, the model has adapters on "
                           f"{len(layers)} others; load it into a model without adapters")
    with torch.no_grad():
        for name, layer in layers.items():
            if (layer.rank, layer.alpha) != (state["rank"], state["alpha"]):
                raise AdapterError(f"{path} has rank {state['rank']}, alpha {state['alpha']:g}; the model's "
                                   f"adapters have rank {layer.rank}, alpha {layer.alpha:g}")
            layer.unmerge()
            layer.A.copy_(state["tensors"][f"{name}.A"])
            layer.B.copy_(state["tensors"][f"{name}.B"])
    return list(layers)
