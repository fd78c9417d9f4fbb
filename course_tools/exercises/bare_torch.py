"""The from-the-metal track's run-time guard: PyTorch without its layers, losses and optimisers.

Lesson 11's from-the-metal exercises (every exercise whose name starts with ``PREFIX``) ask the learner
to write Linear, Embedding, LayerNorm, softmax, cross-entropy, AdamW, the schedule and clipping from
tensor operations. ``torch.nn``, ``torch.nn.functional`` and ``torch.optim`` are off limits but for
``ALLOWED`` (``nn.Parameter``, ``nn.Module``, ``nn.ModuleList``/``ModuleDict``, ``optim.Optimizer``).
While such an exercise's function runs (``guard``, entered by ``checks.run`` in the notebook and by the
grader's ``kernel_side.Answerer`` in the sandbox):

* every public callable of ``torch.nn.functional`` and ``torch._C._nn``, the ``torch.*`` and
  ``torch.special.*`` functions that compute a whole layer or loss (``TORCH_FUNCTIONS``), the same
  ``Tensor`` methods and the ``torch.ops.aten`` packets behind them (their overloads, ``.default``, stay
  readable for PyTorch's own imports) are replaced by stubs that raise
  ``forbidden_message``: a PyTorch layer called the usual way (``nn.Linear(...)(x)`` calls
  ``F.linear``) raises too;
* a global forward pre-hook checks the class of every module called: its whole MRO must be classes
  the learner defined (``__module__ == "__main__"``, the notebook) or ``ALLOWED``, so a PyTorch layer,
  a subclass of one, or another library's module fails at its first call;
* a global optimiser pre-step hook does the same for every ``torch.optim.Optimizer`` that steps
  (``torch.optim.AdamW``, a subclass of it, another library's optimiser);
* on leaving, every stub and hook must still be in place: a function that undid the guard errs.

Its messages (``forbidden_message``) are in the learner's language (``course_tools.messages``).

What it does not stop, and what does: a reference captured *before* the guard (``lin = F.linear`` in
a cell) keeps the real function, and the learner's code shares this kernel, so it could switch the
guard off. Both need the answer cells to name something the static check of the grader reads and
refuses (``course_tools.grading.metal``: forbidden torch names, followed through imports, aliases and
definitions across cells, and any dynamic lookup). Pure-Python or NumPy maths would pass this guard,
but the checks compare gradients too, which only autograd through tensor operations gives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks

from course_tools.messages import _

PREFIX = "metal_"
ALLOWED = (torch.nn.Parameter, torch.nn.Module, torch.nn.ModuleList, torch.nn.ModuleDict, torch.optim.Optimizer,
           object)
# torch.* functions that compute a whole layer, loss or optimiser step (F's functions call most of them)
TORCH_FUNCTIONS = ("softmax", "log_softmax", "logsumexp", "_softmax", "_log_softmax", "layer_norm",
                   "native_layer_norm", "embedding", "embedding_bag", "rms_norm", "group_norm", "batch_norm",
                   "instance_norm", "_fused_adamw_", "_fused_adam_", "cross_entropy_loss", "nll_loss", "nll_loss_nd",
                   "bilinear", "_foreach_norm")
SPECIAL_FUNCTIONS = ("softmax", "log_softmax", "logsumexp")
TENSOR_METHODS = ("softmax", "log_softmax", "logsumexp")
ATEN_OPS = ("linear", "softmax", "log_softmax", "_softmax", "_log_softmax", "logsumexp", "layer_norm",
            "native_layer_norm", "embedding", "cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d",
            "_fused_adamw_", "_fused_adam_", "rms_norm")
_MISSING = object()


class ForbiddenOnMetal(RuntimeError):
    """A forbidden PyTorch layer, loss or optimiser was used on the from-the-metal track."""


def guarded(name: str) -> bool:
    """Whether exercise ``name`` belongs to the from-the-metal track."""
    return name.startswith(PREFIX)


def forbidden_message(name: str) -> str:
    """Why ``name`` raised, in the learner's language."""
    return _("{name} is not available on the from-the-metal track: write it from tensor operations (torch.nn, "
             "torch.nn.functional and torch.optim are off limits but for nn.Parameter, nn.Module, nn.ModuleList, "
             "nn.ModuleDict and optim.Optimizer)", name=name)


def _stub(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ForbiddenOnMetal(forbidden_message(name))

    refuse.__name__ = name.rsplit(".", 1)[-1]
    return refuse


class _RefusingPacket:
    """A ``torch.ops.aten`` packet that refuses to be called but lends its overloads (``.default``) to
    PyTorch's own modules, some of which read them when they are first imported."""

    def __init__(self, packet: Any, name: str) -> None:
        self._packet, self._refuse = packet, _stub(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse(*args, **kwargs)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._packet, attribute)


def foreign_class(cls: type) -> type | None:
    """The first class of ``cls``'s MRO neither defined in the notebook nor in ``ALLOWED``, else None."""
    for base in cls.__mro__:
        if base.__module__ != "__main__" and base not in ALLOWED:
            return base
    return None


def _check_module(module: torch.nn.Module, *args: Any) -> None:
    foreign = foreign_class(type(module))
    if foreign is not None:
        raise ForbiddenOnMetal(forbidden_message(f"{foreign.__module__}.{foreign.__qualname__}"))


def _check_optimizer(optimizer: torch.optim.Optimizer, *args: Any) -> None:
    _check_module(optimizer)  # type: ignore[arg-type]  (the same rule on the optimiser's class)


def _targets() -> list[tuple[Any, str, str]]:
    """(owner, attribute, qualified name) of everything the guard replaces."""
    targets = [(F, n, f"torch.nn.functional.{n}") for n in dir(F)
               if not n.startswith("_") and callable(getattr(F, n)) and not isinstance(getattr(F, n), type)
               and getattr(getattr(F, n), "__module__", "") != "typing"]
    targets += [(torch._C._nn, n, f"torch._C._nn.{n}") for n in dir(torch._C._nn) if not n.startswith("__")]
    targets += [(torch, n, f"torch.{n}") for n in TORCH_FUNCTIONS if hasattr(torch, n)]
    targets += [(torch.special, n, f"torch.special.{n}") for n in SPECIAL_FUNCTIONS]
    targets += [(torch.Tensor, n, f"Tensor.{n}") for n in TENSOR_METHODS]
    targets += [(torch.ops.aten, n, f"torch.ops.aten.{n}") for n in ATEN_OPS if hasattr(torch.ops.aten, n)]
    targets += [(torch.nn.utils, n, f"torch.nn.utils.{n}") for n in ("clip_grad_norm_", "clip_grad_value_",
                                                                     "clip_grad_norm", "get_total_norm")
                if hasattr(torch.nn.utils, n)]
    return targets


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Run the body with PyTorch's layers, losses and optimisers unavailable (see the module's docstring);
    a ``ForbiddenOnMetal`` names what was used, and tampering with the guard is an error on leaving."""
    saved = []
    for owner, attribute, qualified in _targets():
        original = owner.__dict__.get(attribute, _MISSING) if isinstance(owner, type) else getattr(owner, attribute)
        stub = _RefusingPacket(original, qualified) if owner is torch.ops.aten else _stub(qualified)
        saved.append((owner, attribute, original, stub))
    for owner, attribute, _original, stub in saved:
        setattr(owner, attribute, stub)
    module_hook = module_hooks.register_module_forward_pre_hook(_check_module)
    optimizer_hook = optimizer_hooks.register_optimizer_step_pre_hook(_check_optimizer)
    try:
        yield
        intact = all(getattr(owner, attribute, None) is stub for owner, attribute, _original, stub in saved) and \
            module_hooks._global_forward_pre_hooks.get(module_hook.id) is _check_module and \
            optimizer_hooks._global_optimizer_pre_hooks.get(optimizer_hook.id) is _check_optimizer
        if not intact:
            raise ForbiddenOnMetal(_("the from-the-metal guard was changed while the answer ran"))
    finally:
        module_hook.remove()
        optimizer_hook.remove()
        for owner, attribute, original, _stub_fn in reversed(saved):
            if original is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, attribute)
            else:
                setattr(owner, attribute, original)
