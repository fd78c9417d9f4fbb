"""Lesson 11, the capstone: the learner's own GPT and training loop, graded in five stages.

1. ``capstone_shapes``: each module's parameter names, shapes and count, and its output shape.
2. ``capstone_equivalence``: each module loaded with the reference's weights (``course_utils``'
   attention, feed-forward network, block and GPT, renamed to the interface) gives the reference's
   output to 1e-4.
3. ``capstone_no_peeking``: changing tokens from position t on leaves the logits before t unchanged.
4. ``capstone_training``: the learner's loop trains the learner's model on Shakespeare's characters
   for a fixed number of steps, from two grader seeds; the weights come back and their loss is
   computed here, on the trusted side, with the course's causal GPT, on the corpus's last 5 %, which
   the sandbox never receives (``course_tools.grading.held_out``), in windows at an offset drawn after
   the weights came back, so a loop that peeks, reports a wrong loss or fits the grader's windows
   gains nothing. The loop itself is judged from its optimiser trace (``checks.optimizer_trace``):
   exactly ``steps`` optimiser steps, the learning rate at the warm-up's start and end, halfway
   through the cosine and at the last step, and the gradients' global norm at most ``grad_clip``;
   a third case starts from weights whose gradients are about a thousand times too large, where
   only clipping the global norm gives a norm of exactly ``grad_clip``.
5. ``capstone_sampling``: generated ids keep the prompt, have the right length and vocabulary,
   crop the context to ``max_len``, with ``top_k=1`` follow the reference's greedy path, and over
   20,000 samples of one next token match softmax(logits / temperature) restricted to the top k.

Each stage judges one model, so each counts only while the stages it builds on pass (``requires``):
the shapes and equivalence of the modules go together, the others need both (training also no
peeking). A later stage's feedback then opens by naming the earlier stage that failed.

The learner's modules use PyTorch's names (``nn.LayerNorm`` has ``weight`` and ``bias``); the
course's have ``gamma`` and ``beta``. ``to_learner_names`` and ``to_reference_names`` are the one
mapping between the two. The training stage needs more time than a cell usually gets: the
solutions notebook's metadata raises the grader's limits for this lesson (``"course": {"grading":
{"cell_timeout": 600, "notebook_timeout": 1200}}``, carried into ``exercises/`` by ``course assign``
and read by ``course grade``'s ``Limits.for_lesson``).
"""

from __future__ import annotations

import math
import re
import secrets
from functools import lru_cache
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.grading import held_out
from course_tools.messages import N_, N_n, _, say
from course_utils import attention, blocks, counting, data, gpt
from course_utils.generate import next_token_probs

# What the capstone asks the learner to write, removed from the sandbox while it is graded
# (course_tools.grading.shortcuts): "capstone_*" for every stage (not the questions), the loop and the sampler
# for their own; the from-the-metal stages are guarded by course_tools.grading.metal instead.
TEACHES = {
    "capstone_*": ("course_utils.attention.MultiHeadAttention", "course_utils.attention.SelfAttentionHead",
          "course_utils.attention.scaled_dot_product_attention", "course_utils.attention.attend",
          "course_utils.attention.explicit_attention", "course_utils.blocks.FeedForward",
          "course_utils.blocks.LayerNorm", "course_utils.blocks.TransformerBlock", "course_utils.blocks.make_block",
          "course_utils.gpt.GPT", "course_utils.gpt.gpt_block", "course_utils.positional.LearnedPositionalEmbedding"),
    "capstone_training": ("course_utils.train.train", "course_utils.train.train_step", "course_utils.train.set_up",
                          "course_utils.train.lr_at", "course_utils.train.get_batch",
                          "course_utils.train.make_optimizer", "course_utils.train.lm_loss"),
    "capstone_sampling": ("course_utils.generate.generate", "course_utils.generate.sample_next",
                          "course_utils.generate.next_token_probs", "course_utils.generate.top_k_filter"),
}

# --- the fixed contract of the training stage (stated in the notebook) --------------------------
TRAIN_SIZES = {"max_len": 64, "n_layers": 2, "n_heads": 4, "d_model": 64}
TRAIN_SETTINGS = {"steps": 500, "batch_size": 32, "lr": 1e-2, "warmup_steps": 50, "grad_clip": 1.0}
THRESHOLD = 2.2  # nats per character on the held-out text; the reference reaches about 2.03
TRAINING_SEEDS = 2  # training runs judged, each from its own grader seed
CLIP_SETTINGS = {"steps": 3, "batch_size": 4, "lr": 1e-3, "warmup_steps": 1, "grad_clip": 1.0}
CLIP_GAIN = 1000.0  # the final norm's gain in the clipping case: every tensor's gradient ~1,000× too large
NORM_SLACK = 1e-3  # relative: a clipped norm may exceed grad_clip by clip_grad_norm_'s rounding, no more
ACTIVATION = "gelu"  # the exact GELU, PyTorch's nn.GELU() default

# What each stage builds on (checks.Exercise.requires): why it means nothing while that one fails.
BUILT = N_("the modules' names or shapes differ from the interface, so the same weights cannot be compared")
COMPUTES = N_("a module that differs from the reference (a forward returning zeros, say) can pass this "
              "stage without computing a GPT")
CAUSAL = N_("a model that peeks at the next token learns to copy it, so its training proves nothing")
TRAINS = N_("training a model that differs from the reference is not meaningful: the grader scores your "
            "weights in the reference model, so its loss is not the one your loop printed")


# --- names: PyTorch's LayerNorm (weight, bias) <-> the course's (gamma, beta) ---------------------
_NORM = re.compile(r"((?:^|\.)(?:norm1|norm2|final_norm))\.(gamma|beta|weight|bias)$")
TO_LEARNER = {"gamma": "weight", "beta": "bias", "weight": "weight", "bias": "bias"}
TO_REFERENCE = {"weight": "gamma", "bias": "beta", "gamma": "gamma", "beta": "beta"}


def _renamed(state: dict[str, torch.Tensor], table: dict[str, str]) -> dict[str, torch.Tensor]:
    return {_NORM.sub(lambda m: f"{m.group(1)}.{table[m.group(2)]}", key): value for key, value in state.items()}


def to_learner_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A course_utils state dict with the interface's names (the norms' gamma/beta -> weight/bias)."""
    return _renamed(state, TO_LEARNER)


def to_reference_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The interface's names back to course_utils' (the norms' weight/bias -> gamma/beta)."""
    return _renamed(state, TO_REFERENCE)


def reference_module(kind: str, sizes: dict[str, int], activation: str = ACTIVATION) -> nn.Module:
    """The course's version of one interface class, in eval mode."""
    d, h = sizes["d_model"], sizes.get("n_heads", 1)
    if kind == "attention":
        module: nn.Module = attention.MultiHeadAttention(d, h)
    elif kind == "ffn":
        module = blocks.FeedForward(d, activation=activation)
    elif kind == "block":
        module = blocks.make_block(d, h, activation=activation)
    elif kind == "gpt":
        module = gpt.GPT(gpt.GPTConfig(activation=activation, **sizes))
    else:
        raise ValueError(f"unknown module kind {kind!r}")
    return module.eval()


@torch.no_grad()
def reference_forward(kind: str, module: nn.Module, x: torch.Tensor, causal: bool = True,
                      norm_first: bool = True) -> torch.Tensor:
    """The reference module's output: attention and blocks causal; GPTs return logits only.
    ``causal=False`` and ``norm_first=False`` rebuild two usual mistakes for the hints."""
    if kind == "gpt" and causal:
        return module(x)[0]
    if kind == "gpt":  # the same layers with the mask left out
        h = module.token_embedding(x) + module.position_embedding(x.shape[1])
        for block in module.blocks:
            h = block(h, causal=False)
        return F.linear(module.final_norm(h), module.token_embedding.weight)
    if kind == "attention":
        return module(x, causal=causal)
    if kind == "block" and not norm_first:
        x = module.norm1(x + module.attn(x, causal=causal))
        return module.norm2(x + module.ffn(x))
    return module(x, causal=causal) if kind == "block" else module(x)


def _random_state(module: nn.Module, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights drawn from ``gen`` (gains near 1, biases and the rest of size ~0.3/√fan-in) so that
    every component matters to the output."""
    state = {}
    for key, value in module.state_dict().items():
        noise = torch.randn(value.shape, generator=gen)
        if key.endswith("gamma"):
            state[key] = 1.0 + 0.2 * noise
        elif value.dim() == 2:
            state[key] = noise / math.sqrt(value.shape[-1])
        else:
            state[key] = 0.2 * noise
    return state


def _module_input(kind: str, sizes: dict[str, int], batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "gpt":
        return torch.randint(sizes["vocab_size"], (batch, length), generator=gen)
    return torch.randn(batch, length, sizes["d_model"], generator=gen)


MODULE_CASES = [  # (kind, sizes, batch, length)
    ("attention", {"d_model": 16, "n_heads": 4}, 2, 7),
    ("ffn", {"d_model": 12}, 3, 5),
    ("block", {"d_model": 16, "n_heads": 2}, 2, 6),
    ("gpt", {"vocab_size": 11, "max_len": 8, "n_layers": 2, "n_heads": 2, "d_model": 16}, 2, 8),
    ("gpt", {"vocab_size": 84, "max_len": 64, "n_layers": 1, "n_heads": 4, "d_model": 32}, 3, 20),
]
CLASS_OF = {"attention": "CausalSelfAttention", "ffn": "FeedForward", "block": "Block", "gpt": "GPT"}


def _label(kind: str, sizes: dict[str, int], x: torch.Tensor) -> str:
    args = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return N_("{class_of_kind}({args}) on input {x_shape}", class_of_kind=CLASS_OF[kind], args=args,
              x_shape=tuple(x.shape))


# --- stage 1: shapes and parameter counts --------------------------------------------------------


def _shape_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for kind, sizes, batch, length in MODULE_CASES:
        x = _module_input(kind, sizes, batch, length, gen)
        cases.append(Case(_label(kind, sizes, x), (kind, sizes, x)))
    return cases


def _parameter_names(entries: Any) -> dict[str, str]:
    return dict(e.split(" ", 1) for e in entries if isinstance(e, str) and " " in e)


def _shapes_hint(case: Case, got: Any, expected: Any) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return _("shapes_of returns (number of parameters, output shape, names): keep the helper as given")
    want, have = _parameter_names(expected[2]), _parameter_names(got[2])
    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
    if any(name.endswith("lm_head.weight") for name in extra):
        return (_("there is an lm_head: the head is tied, logits = final_norm(x) @ token_embedding.weight.T, with no "
                  "module of its own"))
    buffers = [n for n in extra if not n.endswith((".weight", ".bias"))]
    if buffers:
        return (_("{buffers_0} is saved with the weights: register a mask buffer with persistent=False, or build the "
                  "mask inside forward", buffers_0=buffers[0]))
    if missing or extra:
        shown = N_("missing {name}", name=missing[0]) if missing else N_("unexpected {name}", name=extra[0])
        return (_("{shown}: name the submodules exactly as the interface does (W_Q, W_K, W_V, W_O, W_in, W_out, "
                  "norm1, ...)", shown=shown))
    wrong = [n for n in want if want[n] != have.get(n)]
    if wrong:
        return _("{wrong_0} has shape {have_wrong_0}, expected {want_wrong_0} (nn.Linear stores (out, in))",
                 wrong_0=wrong[0], have_wrong_0=have[wrong[0]], want_wrong_0=want[wrong[0]])
    if tuple(got[1]) != tuple(expected[1]):
        return _("the output should have shape {expected_1}", expected_1=tuple(expected[1]))
    return None


@exercise(cases=_shape_cases, function="shapes_of", hints=[_shapes_hint], requires={"capstone_equivalence": COMPUTES},
          explain=N_("every parameter has the interface's name and shape, and the head adds no parameters: it is "
                     "tied."))
def capstone_shapes(kind: str, sizes: dict[str, int], x: torch.Tensor) -> tuple[int, tuple[int, ...], list[str]]:
    """(parameter count, output shape, sorted "name (shape)" of the state dict) of one module."""
    module = reference_module(kind, sizes)
    names = sorted(f"{k} {tuple(v.shape)}" for k, v in to_learner_names(module.state_dict()).items())
    count = sum(p.numel() for p in module.parameters())
    return count, tuple(reference_forward(kind, module, x).shape), names


# --- stage 2: equivalence with the reference weights ---------------------------------------------


def _equivalence_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for kind, sizes, batch, length in MODULE_CASES:
        module = reference_module(kind, sizes)
        state = to_learner_names(_random_state(module, gen))
        x = _module_input(kind, sizes, batch, length, gen)
        cases.append(Case(N_("{module} with the reference weights", module=_label(kind, sizes, x)),
                          (kind, sizes, state, x)))
    return cases


def _run_reference(kind: str, sizes: dict, state: dict, x: torch.Tensor, activation: str = ACTIVATION,
                   **options: Any) -> torch.Tensor:
    module = reference_module(kind, sizes, activation)
    module.load_state_dict(to_reference_names(state))
    return reference_forward(kind, module, x, **options)


def _unscaled_attention(sizes: dict, state: dict, x: torch.Tensor) -> torch.Tensor:
    """The attention with the scores left unscaled (no 1/√d_head): the multiplier √d_head put back in."""
    d, h = sizes["d_model"], sizes["n_heads"]
    scaled = {k: v for k, v in state.items()}
    scaled["W_Q.weight"] = state["W_Q.weight"] * math.sqrt(d // h)
    scaled["W_Q.bias"] = state["W_Q.bias"] * math.sqrt(d // h)
    return _run_reference("attention", sizes, scaled, x)


def _equivalence_hint(case: Case, got: Any, expected: Any) -> str | None:
    kind, sizes, state, x = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    if kind != "ffn" and x.shape[1] > 1 and close(got, _run_reference(kind, sizes, state, x, causal=False)):
        return _("the output equals attention without the causal mask: mask the scores above the diagonal")
    if kind == "attention" and close(got, _unscaled_attention(sizes, state, x)):
        return _("the scores are not divided by √d_head (the width of one head, d_model / n_heads)")
    if kind in ("ffn", "block", "gpt") and close(got, _run_reference(kind, sizes, state, x, activation="gelu_tanh")):
        return _("that is GELU's tanh approximation; the interface uses the exact nn.GELU()")
    if kind in ("ffn", "block", "gpt") and close(got, _run_reference(kind, sizes, state, x, activation="relu")):
        return _("that is ReLU; the feed-forward network uses the exact GELU, nn.GELU()")
    if kind == "block" and close(got, _run_reference(kind, sizes, state, x, norm_first=False)):
        return _("that is post-LN (norm(x + f(x))); the interface's blocks are pre-LN: x + f(norm(x))")
    if kind == "gpt":
        zeros = torch.zeros_like(state["position_embedding.weight"])
        no_positions = dict(state, **{"position_embedding.weight": zeros})
        if close(got, _run_reference(kind, sizes, no_positions, x)):
            return _("the position embeddings are not added to the token embeddings")
    return _("check the {class_of_kind} stage by stage: the smaller modules' cases above say which one differs",
             class_of_kind=CLASS_OF[kind])


@exercise(cases=_equivalence_cases, function="outputs_with", atol=1e-4, rtol=1e-4, hints=[_equivalence_hint],
          requires={"capstone_shapes": BUILT},
          explain=N_("with the same weights your modules compute the same function as the course's, to 1e-4."))
def capstone_equivalence(kind: str, sizes: dict[str, int], state: dict[str, torch.Tensor], x: torch.Tensor) \
        -> torch.Tensor:
    """The reference module loaded with ``state`` (interface names) applied to ``x``: (B, T, D), or logits (B, T, V)."""
    return _run_reference(kind, sizes, state, x)


# --- stage 3: no peeking --------------------------------------------------------------------------


def _peeking_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for sizes, batch, length, first in [(MODULE_CASES[3][1], 2, 8, 5), (MODULE_CASES[4][1], 2, 32, 16),
                                        (MODULE_CASES[4][1], 1, 10, 9)]:
        idx = torch.randint(sizes["vocab_size"], (batch, length), generator=gen)
        changed = idx.clone()
        changed[:, first:] = (idx[:, first:] + 1 + torch.randint(sizes["vocab_size"] - 1, changed[:, first:].shape,
                                                                   generator=gen)) % sizes["vocab_size"]
        cases.append(Case(N_n("GPT with {n_layers} layer, {length} tokens, tokens from position {first} on changed",
                              "GPT with {n_layers} layers, {length} tokens, tokens from position {first} on changed",
                              sizes["n_layers"], n_layers=sizes["n_layers"], length=length, first=first),
                          (sizes, idx, changed)))
    return cases


def _peeking_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    sizes, idx, changed = case.args
    first = int((idx != changed).any(0).nonzero()[0])
    shape = (*idx.shape, sizes["vocab_size"])
    if not isinstance(got, (tuple, list)) or len(got) != 2 or \
            not all(isinstance(t, torch.Tensor) and tuple(t.shape) == shape for t in got):
        return False, _("expected two logits tensors of shape {shape}", shape=shape)
    before, after = (t.detach().double() for t in got)
    moved = (before[:, :first] - after[:, :first]).abs().amax().item()
    if not math.isfinite(moved):
        return False, _("the logits hold NaN or inf")
    if moved > 1e-5:
        return False, (_("the logits before position {first} changed by up to {moved:.3g} when only later tokens "
                         "changed: the model peeks at the future — set the scores above the diagonal to -inf before "
                         "the softmax (a causal mask)", first=first, moved=moved))
    return True, _("positions 0..{first_1} unchanged (max change {moved:.1g})", first_1=first - 1, moved=moved)


@exercise(cases=_peeking_cases, function="logits_pair", verdict=_peeking_verdict,
          requires={"capstone_shapes": BUILT, "capstone_equivalence": COMPUTES},
          explain=N_("a token's logits depend only on it and the tokens before it: training on all positions at once "
                     "is fair."))
@torch.no_grad()
def capstone_no_peeking(sizes: dict[str, int], idx: torch.Tensor, changed: torch.Tensor) \
        -> tuple[torch.Tensor, torch.Tensor]:
    """A freshly initialised course GPT's logits for both sequences (the verdict judges the learner's pair)."""
    model = reference_module("gpt", sizes)
    return model(idx)[0], model(changed)[0]


# --- stage 4: it trains ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def shakespeare_splits() -> tuple[int, torch.Tensor]:
    """(vocabulary size, held-out ids): one id per distinct character of the whole corpus in sorted
    order (the sandbox's excerpt has the same 84), and the corpus's last ``held_out.HELD_OUT`` share,
    which the sandbox never receives."""
    text = data.shakespeare()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    tail = held_out.split(text, held_out.fraction("11"))[1]
    return len(chars), torch.tensor([stoi[c] for c in tail], dtype=torch.long)


@torch.no_grad()
def held_out_loss(model: gpt.GPT, offset: int | None = None) -> float:
    """Mean next-token cross-entropy of a course GPT over every window of the held-out text, the windows
    starting at ``offset`` (default: a secret one, drawn now, after the weights were returned)."""
    _, tail = shakespeare_splits()
    block = model.config.max_len
    offset = secrets.randbelow(block) if offset is None else offset
    starts = offset + block * torch.arange((len(tail) - 1 - offset) // block)
    total = 0.0
    for chunk in starts.split(512):
        windows = tail[chunk[:, None] + torch.arange(block + 1)]
        logits, _ = model(windows[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten(), reduction="sum").item()
    return total / (len(starts) * block)


def reference_lr(step: int, steps: int, lr: float, warmup_steps: int) -> float:
    """The contract's schedule: linear warm-up to lr over warmup_steps, then a cosine to lr / 10."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return lr / 10 + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - lr / 10)


def schedule_points(settings: dict[str, Any]) -> list[tuple[int, str, float]]:
    """(step, what it is, tolerance) where the loop's learning rate is checked: the warm-up's start and
    end (within one warm-up increment, so a warm-up from 0 or from lr / warmup_steps both pass), halfway
    through the cosine and the last step (within 2 % of lr)."""
    steps, lr, warmup = settings["steps"], settings["lr"], settings["warmup_steps"]
    step_size = lr / warmup
    return [(0, N_("the warm-up's start"), step_size), (warmup - 1, N_("the warm-up's end"), step_size),
            (warmup + (steps - warmup) // 2, N_("halfway through the cosine"), 0.02 * lr),
            (steps - 1, N_("the last step"), 0.02 * lr)]


def _clip_init(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Training-stage weights whose final norm has gain and bias CLIP_GAIN times their size: the logits,
    and so every tensor's gradient, are about a thousand times larger than at a usual start."""
    state = _random_state(reference_module("gpt", dict(TRAIN_SIZES, vocab_size=shakespeare_splits()[0])), gen)
    state["final_norm.gamma"] = CLIP_GAIN * state["final_norm.gamma"]
    state["final_norm.beta"] = CLIP_GAIN * state["final_norm.beta"]
    return to_learner_names(state)


def _training_cases(gen: torch.Generator) -> list[Case]:
    sizes = ", ".join(f"{k}={v}" for k, v in TRAIN_SIZES.items())
    clip = dict(CLIP_SETTINGS, seed=int(torch.randint(2**30, (1,), generator=gen)))
    cases = [Case(N_("train_gpt for {steps} steps from weights whose gradients are about 1,000 times too large, "
                     "grad_clip={grad_clip}", steps=clip["steps"], grad_clip=clip["grad_clip"]),
                  (dict(TRAIN_SIZES), clip, _clip_init(gen)))]
    shown = ", ".join(f"{k}={v}" for k, v in TRAIN_SETTINGS.items())
    for run in range(1, TRAINING_SEEDS + 1):
        settings = dict(TRAIN_SETTINGS, seed=int(torch.randint(2**30, (1,), generator=gen)))
        cases.append(Case(N_("train_gpt on Shakespeare's characters, GPT({sizes}), {settings}, grader seed {run} of "
                             "{runs}", sizes=sizes, settings=shown, run=run, runs=TRAINING_SEEDS),
                          (dict(TRAIN_SIZES), settings)))
    return cases


def trained_reference_model(state: Any) -> gpt.GPT:
    """The course's causal GPT holding the learner's returned weights; a one-line ValueError otherwise."""
    vocab, _ = shakespeare_splits()
    model = reference_module("gpt", dict(TRAIN_SIZES, vocab_size=vocab))
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(N_("trained_weights must return the model's state_dict() (names -> tensors)"))
    want = {k: v.shape for k, v in to_learner_names(model.state_dict()).items()}
    missing, extra = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or extra:
        first = N_("missing {name}", name=missing[0]) if missing else N_("unexpected {name}", name=extra[0])
        raise ValueError(N_("the state dict's names differ from the interface ({first}); pass capstone_shapes "
                                   "first", first=first))
    wrong = [k for k in want if tuple(state[k].shape) != tuple(want[k])]
    if wrong:
        shape, wanted = tuple(state[wrong[0]].shape), tuple(want[wrong[0]])
        raise ValueError(N_("{wrong_0} has shape {shape}, expected {wanted}", wrong_0=wrong[0], shape=shape,
                                   wanted=wanted))
    model.load_state_dict(to_reference_names({k: v.float() for k, v in state.items()}))
    return model.eval()


def _counted(trace: Any, settings: dict[str, Any]) -> str | None:
    """What is wrong with the number of optimiser steps the trace holds, else None."""
    if not isinstance(trace, torch.Tensor) or trace.dim() != 2 or trace.shape[1] != 2 or trace.is_complex():
        return _("the grader's record of your optimiser steps is malformed")
    if trace.shape[0] == 0:
        return _("the grader counted no optimizer.step(): update the weights with a torch.optim optimiser "
                 "(torch.optim.AdamW, or your own torch.optim.Optimizer)")
    if trace.shape[0] != settings["steps"]:
        return _("the grader counted {counted} optimizer.step() calls; the contract is exactly steps={steps}",
                 counted=trace.shape[0], steps=settings["steps"])
    return None


def _loop_problem(trace: torch.Tensor, settings: dict[str, Any]) -> str | None:
    """The first way the loop's trace breaks the contract (step count, schedule, clipping), else None."""
    wrong = _counted(trace, settings)
    if wrong:
        return wrong
    for step, where, tolerance in schedule_points(settings):
        want = reference_lr(step, settings["steps"], settings["lr"], settings["warmup_steps"])
        got = float(trace[step, 0])
        if not abs(got - want) <= tolerance:
            return _("at step {step} ({where}) the learning rate was {got:.3g}, expected about {want:.3g}: warm up "
                     "linearly to lr over warmup_steps, then follow a cosine from lr to lr / 10 over the remaining "
                     "steps", step=step, where=say(where), got=got, want=want)
    over = (~(trace[:, 1] <= settings["grad_clip"] * (1 + NORM_SLACK))).nonzero()
    if len(over):
        step = int(over[0])
        return _("at step {step} the gradients' global norm was {norm:.3g} > grad_clip={clip}: clip the norm of all "
                 "gradients together before optimizer.step()", step=step, norm=float(trace[step, 1]),
                 clip=settings["grad_clip"])
    return None


def _clipping_verdict(trace: Any, settings: dict[str, Any]) -> tuple[bool, str]:
    """The large-gradient case: every step's global norm must be exactly grad_clip."""
    wrong = _counted(trace, settings)
    if wrong:
        return False, wrong
    clip, norms = settings["grad_clip"], trace[:, 1]
    tensors = len(reference_module("gpt", dict(TRAIN_SIZES, vocab_size=shakespeare_splits()[0])).state_dict())
    if bool(((norms - clip).abs() <= clip * NORM_SLACK).all()):
        return True, _("every step's gradients clipped to a global norm of {clip}", clip=clip)
    norm = float(norms[int((~((norms - clip).abs() <= clip * NORM_SLACK)).nonzero()[0])])
    if clip < norm <= clip * math.sqrt(tensors) * (1 + NORM_SLACK):
        return False, _("the global norm was {norm:.3g}, not grad_clip={clip}: each tensor was clipped on its own; "
                        "clip the norm of all gradients together (torch.nn.utils.clip_grad_norm_(model.parameters(), "
                        "grad_clip))", norm=norm, clip=clip)
    if norm > clip:
        return False, _("the global norm was {norm:.3g}, not grad_clip={clip}: the gradients were not clipped",
                        norm=norm, clip=clip)
    return False, _("the global norm was {norm:.3g}, below grad_clip={clip}: scale all gradients by grad_clip / their "
                    "global norm, only when that norm exceeds grad_clip", norm=norm, clip=clip)


def _training_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    state, trace = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
    settings = case.args[1]
    if len(case.args) == 3:
        return _clipping_verdict(trace, settings)
    try:
        model = trained_reference_model(state)
    except ValueError as exc:  # its message is a Message: given in the learner's language by the checker
        return False, exc.args[0]
    wrong = _loop_problem(trace, settings)
    if wrong:
        return False, wrong
    loss = held_out_loss(model)
    if not math.isfinite(loss):
        return False, _("the held-out loss is not finite: the weights hold NaN or inf (did the loss diverge?)")
    if loss < THRESHOLD:
        return True, _("held-out loss {loss:.3f} (the grader's, with a causal reference model) < {threshold}",
                       loss=loss, threshold=THRESHOLD)
    vocab = shakespeare_splits()[0]
    if loss > math.log(vocab) + 0.5:
        why = N_("far above an untrained model's ln V: if your own training loss is near 0, the model saw the "
                        "future (check capstone_no_peeking) or learned to copy its input (are the targets shifted by "
                        "one?)")
    elif loss > 2.7:
        why = N_("the loop hardly learned: zero the gradients every step (optimizer.zero_grad()), use the "
                        "learning rate you are given, and step the optimiser after backward()")
    else:
        why = N_("close but not there: warm the learning rate up linearly over warmup_steps before the cosine "
                        "decay, and clip the gradient norm to grad_clip")
    return False, _("held-out loss {loss:.3f} ≥ {threshold} — {why}. The grader measures the reference model holding "
                    "your weights on text your loop never receives, with its own seed and windows: that moves the "
                    "loss a few hundredths from your printout; much more means the model it loads is not the one "
                    "your loop trained", loss=loss, threshold=THRESHOLD, why=say(why))


@exercise(cases=_training_cases, function="trained_weights", verdict=_training_verdict, traced=True,
          requires={"capstone_shapes": BUILT, "capstone_equivalence": TRAINS, "capstone_no_peeking": CAUSAL},
          explain=N_("{train_settings_steps} steps of AdamW with warm-up, cosine decay and clipping take the model "
                     "well below a character bigram's validation loss: it uses its context.",
                     train_settings_steps=TRAIN_SETTINGS['steps']))
def capstone_training(sizes: dict[str, int], settings: dict[str, Any], init: dict | None = None) -> float:
    """The threshold the grader's held-out loss must beat (judged by ``_training_verdict``)."""
    return THRESHOLD


# --- stage 5: sampling ----------------------------------------------------------------------------

# The distribution cases: DRAWS rows of one prompt, one new token each; the sampled frequencies must lie
# within TOLERANCE of the reference's probabilities for every token. By Hoeffding's inequality and a union
# bound over the V tokens, a correct sampler misses that with probability at most 2·V·exp(−2·DRAWS·TOLERANCE²)
# = FALSE_FAILURE per case (so below 2e-9 for the stage's two cases). Each case is drawn where a sampler that
# ignores the option it tests (the temperature, the top-k) moves some token's probability by at least
# 3·TOLERANCE, so such a sampler fails it unless its frequencies stray twice as far, which is rarer still.
DRAWS = 20_000
FALSE_FAILURE = 1e-9
DISTRIBUTIONS = (({"temperature": 0.5}, "temperature"), ({"temperature": 0.8, "top_k": 5}, "top_k"))


def sampling_tolerance(vocab: int, draws: int = DRAWS, false_failure: float = FALSE_FAILURE) -> float:
    """The largest |frequency − probability| a correct sampler exceeds with probability ≤ false_failure."""
    return math.sqrt(math.log(2 * vocab / false_failure) / (2 * draws))


@torch.no_grad()
def next_token_distribution(sizes: dict[str, int], state: dict[str, torch.Tensor], prompt: torch.Tensor,
                            temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """The reference's probabilities (V,) for the token after ``prompt`` (T,): softmax(logits / temperature)
    over the top_k largest logits, 0 elsewhere."""
    model = reference_module("gpt", sizes)
    model.load_state_dict(to_reference_names(state))
    logits = model(prompt[None, -sizes["max_len"]:])[0][0, -1] / temperature
    if top_k is not None:
        logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
    return logits.softmax(-1)


def _wrong_samplers(sizes: dict, state: dict, prompt: torch.Tensor, options: dict) -> dict[str, torch.Tensor]:
    """The distributions a sampler gives that ignores the temperature, or the top-k (those the case sets)."""
    wrong = {}
    if options.get("temperature", 1.0) != 1.0:
        wrong["temperature"] = next_token_distribution(sizes, state, prompt, top_k=options.get("top_k"))
    if options.get("top_k") is not None:
        wrong["top_k"] = next_token_distribution(sizes, state, prompt, options.get("temperature", 1.0))
    return wrong


_DISTRIBUTION_DRAWS = 20  # weights drawn at most for one case (scaling alone failed 1 draw in 8,001, seeds 0-3999)


def _separate(sizes: dict[str, int], state: dict[str, torch.Tensor], prompt: torch.Tensor, options: dict[str, Any],
              tested: str, bound: float) -> dict[str, torch.Tensor] | None:
    """``state`` with its final norm scaled up (×1.5 at a time, at most 7 times) until a sampler that ignores
    ``tested`` is at least ``bound`` from the right distribution; None where no scale gets there."""
    for _attempt in range(8):
        right = next_token_distribution(sizes, state, prompt, **options)
        if float((_wrong_samplers(sizes, state, prompt, options)[tested] - right).abs().max()) >= bound:
            return state
        state = dict(state, **{k: 1.5 * v for k, v in state.items() if k.startswith("final_norm.")})
    return None


def _distribution_case(sizes: dict[str, int], options: dict[str, Any], tested: str, gen: torch.Generator) -> Case:
    """One prompt repeated DRAWS times, on weights where a sampler that ignores the ``tested`` option is
    far from the right one (the logits are scaled up by the final norm until it is)."""
    bound = 3 * sampling_tolerance(sizes["vocab_size"])
    for _draw in range(_DISTRIBUTION_DRAWS):  # scaling does not separate every draw: then draw new weights
        state = to_learner_names(_random_state(reference_module("gpt", sizes), gen))
        prompt = torch.randint(sizes["vocab_size"], (4,), generator=gen)
        separated = _separate(sizes, state, prompt, options, tested, bound)
        if separated is not None:
            state = separated
            break
    else:
        raise RuntimeError(f"no distribution case in {_DISTRIBUTION_DRAWS} draws separates the wrong samplers")
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    return Case(N_("generate(the same prompt {draws} times, max_new_tokens=1, {shown})", draws=DRAWS, shown=shown),
                (sizes, state, prompt.expand(DRAWS, -1).clone(), 1, dict(options)))


def _sampling_cases(gen: torch.Generator) -> list[Case]:
    sizes = MODULE_CASES[4][1]
    cases = []
    for batch, prompt, new, options in [(2, 5, 12, {"temperature": 1.0}), (2, 6, 10, {"top_k": 1}),
                                        (1, 60, 9, {"top_k": 1}), (3, 4, 8, {"temperature": 0.7, "top_k": 5})]:
        state = to_learner_names(_random_state(reference_module("gpt", sizes), gen))
        idx = torch.randint(sizes["vocab_size"], (batch, prompt), generator=gen)
        shown = ", ".join(f"{k}={v}" for k, v in options.items())
        cases.append(Case(N_("generate(prompt {idx_shape}, max_new_tokens={new}, {shown}), max_len {sizes_max_len}",
                             idx_shape=tuple(idx.shape), new=new, shown=shown, sizes_max_len=sizes['max_len']),
                          (sizes, state, idx, new, options)))
    return cases + [_distribution_case(sizes, options, tested, gen) for options, tested in DISTRIBUTIONS]


@torch.no_grad()
def greedy(sizes: dict[str, int], state: dict[str, torch.Tensor], idx: torch.Tensor, new: int) -> torch.Tensor:
    """The reference's greedy continuation, feeding at most max_len tokens each step."""
    model = reference_module("gpt", sizes)
    model.load_state_dict(to_reference_names(state))
    for _step in range(new):
        logits = model(idx[:, -sizes["max_len"]:])[0]
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def _distribution_verdict(case: Case, got: torch.Tensor) -> tuple[bool, str]:
    """The sampled next tokens against the reference's distribution (see DRAWS)."""
    sizes, state, idx, _new, options = case.args
    right = next_token_distribution(sizes, state, idx[0], **options)
    counts = torch.bincount(got[:, -1].long(), minlength=sizes["vocab_size"]).double()
    outside = ((counts > 0) & (right == 0)).nonzero()
    if len(outside):
        token = int(outside[0])
        return False, _("token {token} was sampled {count:.0f} times but is not among the top_k={top_k}: set every "
                        "logit below the k-th largest to -inf before the softmax", token=token,
                        count=float(counts[token]), top_k=options.get("top_k"))
    frequency, tolerance = counts / len(got), sampling_tolerance(sizes["vocab_size"])
    gap = (frequency - right).abs()
    if float(gap.max()) <= tolerance:
        return True, _("{draws} samples within {tolerance:.3f} of softmax(logits / temperature) over the top k",
                       draws=len(got), tolerance=tolerance)
    token = int(gap.argmax())
    detail = _("token {token} was sampled with frequency {got:.3f}, the reference's probability is {want:.3f} "
               "(a correct sampler stays within {tolerance:.3f})", token=token, got=float(frequency[token]),
               want=float(right[token]), tolerance=tolerance)
    nearest = min(_wrong_samplers(sizes, state, idx[0], options).items(),
                  key=lambda item: float((frequency - item[1]).abs().max()), default=None)
    if nearest and float((frequency - nearest[1]).abs().max()) <= tolerance:
        fix = (N_("divide the logits by the temperature before the softmax") if nearest[0] == "temperature" else
               N_("keep only the top_k largest logits"))
        detail = _("{detail} — these are the frequencies of a sampler that ignores {option}: {fix}", detail=detail,
                   option=nearest[0], fix=fix)
    return False, detail


def _sampling_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    sizes, idx, new, options = case.args[0], *case.args[2:]
    shape = (idx.shape[0], idx.shape[1] + new)
    if not isinstance(got, torch.Tensor) or got.dtype not in (torch.int64, torch.int32):
        return False, _("generate must return a tensor of integer token ids")
    if tuple(got.shape) != shape:
        return False, _("expected shape {shape} (the prompt plus max_new_tokens), got {got_shape}", shape=shape,
                        got_shape=tuple(got.shape))
    if not torch.equal(got[:, :idx.shape[1]].long(), idx):
        return False, _("the prompt is not kept: return torch.cat([idx, new_tokens], dim=1)")
    if int(got.min()) < 0 or int(got.max()) >= sizes["vocab_size"]:
        return False, _("ids outside the vocabulary [0, {sizes_vocab_size})", sizes_vocab_size=sizes['vocab_size'])
    if idx.shape[0] == DRAWS:
        return _distribution_verdict(case, got)
    if options.get("top_k") == 1 and not torch.equal(got.long(), expected):
        wrong = int((got.long() != expected).any(0).nonzero()[0])
        if shape[1] > sizes["max_len"]:
            return False, (_("with top_k=1 the tokens should follow the greedy path; they differ from position "
                             "{wrong} (feed only the last max_len tokens: idx[:, -max_len:])", wrong=wrong))
        return False, _("with top_k=1 the tokens should follow the greedy path; they differ from position {wrong}",
                        wrong=wrong)
    if options.get("top_k") == 1:
        return True, _("shape {shape}, prompt kept, ids in [0, {vocab_size}), the greedy path", shape=shape,
                       vocab_size=sizes["vocab_size"])
    return True, _("shape {shape}, prompt kept, ids in [0, {vocab_size})", shape=shape, vocab_size=sizes["vocab_size"])


@exercise(cases=_sampling_cases, function="sampled", verdict=_sampling_verdict,
          requires={"capstone_shapes": BUILT, "capstone_equivalence": COMPUTES},
          explain=N_("one token at a time from the last position's distribution at the temperature, over the top k, "
                     "the context cropped to max_len."))
def capstone_sampling(sizes: dict[str, int], state: dict[str, torch.Tensor], idx: torch.Tensor, new: int,
                      options: dict[str, Any]) -> torch.Tensor:
    """The greedy continuation (what ``top_k=1`` must give; other cases are judged on form only), or for a
    distribution case the prompts followed by tokens drawn from the reference's distribution."""
    if idx.shape[0] == DRAWS:
        probs = next_token_distribution(sizes, state, idx[0], **options)
        drawn = torch.multinomial(probs, DRAWS, replacement=True, generator=torch.Generator().manual_seed(0))
        return torch.cat([idx, drawn[:, None]], dim=1)
    return greedy(sizes, state, idx, new)


# --- self-check -------------------------------------------------------------------------------------


def _count_params(**changes: int) -> int:
    """Parameters of the course's GPT at the training stage's sizes, with some of them changed."""
    return counting.count_params(gpt.GPTConfig(vocab_size=84, activation=ACTIVATION, **dict(TRAIN_SIZES, **changes)))


@question(explain=N_("the heads split d_model: W_Q, W_K, W_V and W_O stay 64 × 64 whatever n_heads is, so 8 heads "
                     "add nothing; the learned position table grows from 64 to 256 rows of 64: 192 · 64 = 12,288."),
          hints=[known_wrong({0: N_("max_len is the number of rows of the learned position table: it has a row of "
                                    "d_model parameters per position"),
                              16384: N_("that is the whole new position table; the old one already had 64 of its "
                                        "rows"),
                              45568: N_("the heads split d_model into narrower pieces: the four projections stay "
                                        "d_model × d_model, so doubling n_heads adds no parameters"),
                              33280: N_("the heads split d_model into narrower pieces, so doubling n_heads adds no "
                                        "parameters; and max_len sets the rows of the position table"),
                              121856: N_("that is the whole new model; the question asks how many parameters it "
                                         "has more")})])
def capstone_params_added() -> int:
    """How many parameters GPT(84, 256, 2, 8, 64) has more than the training stage's GPT(84, 64, 2, 4, 64)."""
    return _count_params(max_len=256, n_heads=8) - _count_params()


@question(explain=N_("evaluate scores the same kind of batches as training and agrees with the grader, so what differs "
                     "between the two printouts is train mode against eval mode: a mask that is on only in eval mode "
                     "lets training read the next character, while evaluate, stage 3 and the grader run with it."),
          hints=[known_wrong({"a": N_("a missing mask fails the no-peeking stage, which passes here"),
                              "b": N_("unshifted targets would fool evaluate as well: it scores the same kind of "
                                      "batches, so its loss would fall too"),
                              "d": N_("gradients that pile up spoil training and validation alike; they do not open a "
                                      "gap between the two")})])
def capstone_diagnosis() -> str:
    """Stages 1–3 pass; the loop's own training loss ends well below its own validation loss, which the grader's
    matches: which bug?"""
    return "c"


_TOP_K_LOGITS = (2.0, 1.5, 1.0, 1.0)  # the last position's logits in question 3


def _drawn(logits: tuple[float, ...], temperature: float, top_k: int | None, token: int) -> float:
    """The probability that sampling draws ``token`` from ``logits`` at ``temperature``, restricted to the top_k
    (the course's own rule, ``course_utils.generate.next_token_probs``)."""
    return next_token_probs(torch.tensor(logits), temperature, top_k)[token].item()


@question(explain=N_("divide by the temperature first: (4, 3, 2, 2); keep the two largest and renormalise over them: "
                     "e³ / (e⁴ + e³) = 1 / (1 + e) = 0.269."),
          atol=1e-3,
          hints=[known_wrong({_drawn(_TOP_K_LOGITS, 1.0, 2, 1):
                                  N_("the temperature divides the logits before the softmax: at 0.5 every gap doubles"),
                              _drawn(_TOP_K_LOGITS, 2.0, 2, 1):
                                  N_("divide the logits by the temperature: multiplying by it flattens the "
                                     "distribution instead of sharpening it"),
                              _drawn(_TOP_K_LOGITS, 0.5, None, 1):
                                  N_("top_k=2 keeps the two largest logits and renormalises over them: set the others "
                                     "to -inf before the softmax"),
                              _drawn(_TOP_K_LOGITS, 1.0, None, 1):
                                  N_("neither the temperature nor top_k is applied"),
                              _drawn(_TOP_K_LOGITS, 0.5, 2, 0):
                                  N_("that is token 0; the question asks for token 1, the second")})])
def capstone_top_k_prob() -> float:
    """The probability of drawing token 1 from logits (2, 1.5, 1, 1) at temperature 0.5 with top_k=2."""
    return _drawn(_TOP_K_LOGITS, 0.5, 2, 1)


@question(explain=N_("progress (275 − 50) / 450 = 0.5 puts the cosine at 0: the rate is halfway between lr = 0.01 "
                     "and min_lr = 0.001, 0.0055."),
          atol=1e-5,
          hints=[known_wrong({0.005: N_("that is lr / 2: the cosine ends at min_lr = lr / 10, not at 0"),
                              0.01: N_("step 275 is past the warm-up (50 steps): the cosine has started"),
                              0.001 + 0.0045 * (1 + math.cos(math.pi * 275 / 500)):
                                  N_("the cosine starts after the warm-up: (step − warmup) / (steps − warmup)")})])
def capstone_lr_mid() -> float:
    """The learning rate at step 275 of 500, warm-up 50, lr 0.01, min_lr = lr / 10."""
    return 0.001 + 0.5 * (0.01 - 0.001)


# --- experiment: let the model peek -----------------------------------------------------------------


@question(explain=N_("without the mask each position can read the next character, its target, and the weights learn "
                     "to lean on it; under the mask that help is gone, so the same weights score worse."),
          hints=[known_wrong({"a": N_("compare the two numbers your function printed: the mask changes the loss"),
                              "c": N_("a short run does not reach 0; look at which of the two losses is lower"),
                              "b": N_("read the two numbers your function printed again, in the order it printed "
                                      "them: which one is the loss without the mask?")})])
def peeking_verdict() -> str:
    """Experiment: which of four outcomes the peeking run measures (the loss without the mask, against the causal
    loss of the same weights)."""
    return "d"


# --- the from-the-metal track: the pieces without torch.nn, torch.nn.functional or torch.optim -------
# Each piece is compared with PyTorch's own on random inputs, its value and the gradients that a random
# upstream gradient sends back. The learner's functions run under course_tools.exercises.bare_torch's
# guard (every exercise named metal_*), and the grader's static check (course_tools.grading.metal) reads
# the metal answer cells; the reference side below may use PyTorch freely: it runs in the grader.

METAL_EPS = 1e-5  # LayerNorm's epsilon, as nn.LayerNorm's default
METAL_ADAMW_STEPS = 6
METAL_TRAIN_SETTINGS = dict(TRAIN_SETTINGS)  # the same contract and threshold as stage 4


def _value_and_grads(fn: Any, inputs: list[torch.Tensor], grad_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(fn(*inputs), the gradient of sum(fn(...) · grad_out) for each floating-point input)."""
    leaves = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    (out * grad_out).sum().backward()
    return (out.detach(), *(t.grad for t in leaves if t.is_floating_point()))


def _metal_label(piece: str, shapes: dict[str, Any]) -> str:
    args = ", ".join(f"{k} {v}" for k, v in shapes.items())
    return N_("{piece}: value and gradients on {args}", piece=piece, args=args)


def _linear_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for batch, d_in, d_out in [(2, 5, 3), (3, 16, 8), (1, 7, 1)]:
        x = torch.randn(batch, 4, d_in, generator=gen)
        weight, bias = torch.randn(d_out, d_in, generator=gen) / math.sqrt(d_in), torch.randn(d_out, generator=gen)
        grad = torch.randn(batch, 4, d_out, generator=gen)
        cases.append(Case(_metal_label("Linear", {"x": tuple(x.shape), "weight": tuple(weight.shape)}),
                          (x, weight, bias, grad)))
    return cases


def _linear_hint(case: Case, got: Any, expected: Any) -> str | None:
    x, weight, bias, grad = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 4 or not isinstance(got[0], torch.Tensor):
        return None
    if close(got[0], x @ weight.T):
        return _("the bias is not added: y = x Wᵀ + b")
    if got[0].shape != expected[0].shape:
        return _("the weight is stored (d_out, d_in), as nn.Linear stores it: y = x @ weight.T + bias")
    return None


@exercise(cases=_linear_cases, function="metal_linear_run", hints=[_linear_hint],
          explain=N_("y = x Wᵀ + b with W stored (d_out, d_in); autograd gives the same gradients as nn.Linear's."))
def metal_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, grad: torch.Tensor) \
        -> tuple[torch.Tensor, ...]:
    """(y (B, T, d_out), dL/dx, dL/dweight, dL/dbias) of F.linear for the upstream gradient ``grad``."""
    return _value_and_grads(F.linear, [x, weight, bias], grad)


def _embedding_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for vocab, d, shape in [(11, 4, (2, 6)), (50, 8, (3, 20)), (5, 3, (1, 12))]:
        idx = torch.randint(vocab, shape, generator=gen)  # short vocabularies: ids repeat, their gradients add
        weight = torch.randn(vocab, d, generator=gen)
        grad = torch.randn(*shape, d, generator=gen)
        cases.append(Case(_metal_label("Embedding", {"idx": shape, "weight": (vocab, d)}), (idx, weight, grad)))
    return cases


def _embedding_hint(case: Case, got: Any, expected: Any) -> str | None:
    if isinstance(got, (tuple, list)) and len(got) == 2 and close(got[0], expected[0]) and \
            isinstance(got[1], torch.Tensor) and got[1].shape == expected[1].shape:
        return _("the rows are right but their gradients are not: index the weight (weight[idx]) so that "
                 "autograd adds the gradients of repeated ids")
    return None


@exercise(cases=_embedding_cases, function="metal_embedding_run", hints=[_embedding_hint],
          explain=N_("an embedding is a row lookup, weight[idx]; a row used twice collects both gradients."))
def metal_embedding(idx: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(weight[idx] (B, T, D), dL/dweight) of F.embedding for the upstream gradient ``grad``."""
    return _value_and_grads(lambda w: F.embedding(idx, w), [weight], grad)


# LayerNorm's cases: (shape, dtype, mean, spread) of x. The second has a spread so small that epsilon's place
# matters (√(σ² + eps) and √σ² + eps differ by about 5% there; its upstream gradient is scaled down with the
# spread, so that dL/dx stays near 1 and float32's round-off far below the tolerance). The third sits far from
# zero, where the one-pass variance E[x²] − μ² cancels catastrophically; it is float64 (the learner's layer
# follows its input's dtype). In float32, at a mean 33 times the spread (the case this replaces), a correct
# layer's own round-off reached the tolerance (up to 5 seeds in 500 failed a correct layer) while the one-pass
# variance was not always above it (it passed 3 seeds in 500). In float64 at a mean 10⁷ times the spread, over
# 3,000 seeds, seven correct ways of writing the layer stayed below 1% of the tolerance on that case and the
# one-pass variance above 130 times it (tests/test_metal_track.py runs the same variants on 200 seeds).
LAYER_NORM_CASES = [((2, 5, 8), torch.float32, 0.0, 3.0), ((3, 4, 16), torch.float32, 0.0, 0.01),
                    ((2, 3, 6), torch.float64, 1e7, 1.0)]


def _layer_norm_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for shape, dtype, mean, spread in LAYER_NORM_CASES:
        x = mean + spread * torch.randn(shape, generator=gen, dtype=dtype)
        d = shape[-1]
        # float32 draws in every case: the learner's float32 parameters hold the float64 case's weights exactly
        weight, bias = 1 + 0.2 * torch.randn(d, generator=gen), 0.2 * torch.randn(d, generator=gen)
        grad = min(1.0, spread) * torch.randn(shape, generator=gen)  # dL/dx grows as 1/spread: keep it near 1
        label = N_("LayerNorm: value and gradients on x {shape} in {dtype}, mean {mean:g}, spread {spread:g}",
                   shape=shape, dtype=str(dtype).removeprefix("torch."), mean=mean, spread=spread)
        cases.append(Case(label, (x, weight.to(dtype), bias.to(dtype), grad.to(dtype))))
    return cases


def _far_from_zero(x: torch.Tensor) -> bool:
    """Whether the rows' mean is large against their spread (the case where E[x²] − μ² cancels)."""
    return bool((x.double().mean(-1).abs() > 1e3 * x.double().std(-1)).all())


def _layer_norm_hint(case: Case, got: Any, expected: Any) -> str | None:
    x, weight, bias, _grad = case.args
    if not isinstance(got, (tuple, list)) or not got or not isinstance(got[0], torch.Tensor):
        return None
    unbiased = (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + METAL_EPS).sqrt() * weight + bias
    if close(got[0], unbiased):
        return _("that divides the variance by D − 1: LayerNorm uses the biased variance, the mean of (x − μ)²")
    outside = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True).sqrt() + METAL_EPS)
    if close(got[0], outside * weight + bias):
        return _("epsilon goes inside the square root: (x − μ) / √(σ² + eps)")
    if _far_from_zero(x) and _rows_rescaled(got[0], expected[0], bias):
        return _("each row comes out scaled by a wrong factor on these inputs far from zero: the variance is lost "
                 "to rounding. E[x²] − μ² subtracts two nearly equal large numbers; average (x − μ)² instead")
    return None


def _rows_rescaled(got: torch.Tensor, expected: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether ``got`` is ``expected`` with each row's normalised part (before the bias) multiplied by its own
    factor, some factor not 1, or NaN in whole rows: what a wrong variance per row gives."""
    if got.shape != expected.shape or not got.is_floating_point():
        return False
    g, e = (got.double() - bias.double()).flatten(0, -2), (expected.double() - bias.double()).flatten(0, -2)
    nan_rows = torch.isnan(g).all(-1)
    g, e = g[~nan_rows], e[~nan_rows]
    if not bool(torch.isfinite(g).all()):
        return False
    factor = (g * e).sum(-1, keepdim=True) / (e * e).sum(-1, keepdim=True)
    proportional = bool(((g - factor * e).abs() <= 1e-3 * e.abs().amax(-1, keepdim=True)).all())
    return proportional and (bool(nan_rows.any()) or bool(((factor - 1).abs() > 1e-4).any()))


@exercise(cases=_layer_norm_cases, function="metal_layer_norm_run", hints=[_layer_norm_hint],
          explain=N_("normalise over the last axis with the biased variance and eps inside the root, then scale "
                     "and shift."))
def metal_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, grad: torch.Tensor) \
        -> tuple[torch.Tensor, ...]:
    """(y, dL/dx, dL/dweight, dL/dbias) of F.layer_norm over the last axis, eps 1e-5."""
    return _value_and_grads(lambda x_, w, b: F.layer_norm(x_, (x.shape[-1],), w, b, METAL_EPS), [x, weight, bias],
                            grad)


def _softmax_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for shape, dim, scale, shift in [((3, 7), -1, 1.0, 0.0), ((2, 4, 5), 1, 2.0, 0.0), ((2, 6), -1, 10.0, 1000.0),
                                     ((4, 5), 0, 10.0, -1000.0)]:
        x = shift + scale * torch.randn(shape, generator=gen)
        label = N_("softmax over dim {dim} of {shape}, logits near {shift:g}", dim=dim, shape=shape, shift=shift)
        cases.append(Case(label, (x, dim, torch.randn(shape, generator=gen))))
    return cases


def _stability_hint(case: Case, got: Any, expected: Any) -> str | None:
    tensors = [t for t in (got if isinstance(got, (tuple, list)) else [got]) if isinstance(t, torch.Tensor)]
    if any(not bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point()):
        return _("NaN or inf on large logits: subtract the maximum along the axis before exp (it cancels out)")
    return None


@exercise(cases=_softmax_cases, function="metal_softmax_run", hints=[_stability_hint],
          explain=N_("exp(x − max) / Σ exp(x − max) equals the softmax and never overflows: the largest term is "
                     "exp(0) = 1."))
def metal_softmax(x: torch.Tensor, dim: int, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(softmax(x, dim), dL/dx) of torch.softmax for the upstream gradient ``grad``."""
    return _value_and_grads(lambda x_: torch.softmax(x_, dim), [x], grad)


def _cross_entropy_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n, vocab, scale, shift in [(8, 5, 1.0, 0.0), (32, 84, 3.0, 0.0), (6, 10, 50.0, 5000.0)]:
        logits = shift + scale * torch.randn(n, vocab, generator=gen)
        targets = torch.randint(vocab, (n,), generator=gen)
        label = N_("cross-entropy of logits {shape}, near {shift:g}", shape=(n, vocab), shift=shift)
        cases.append(Case(label, (logits, targets)))
    return cases


def _cross_entropy_hint(case: Case, got: Any, expected: Any) -> str | None:
    stable = _stability_hint(case, got, expected)
    if stable:
        return _("NaN or inf on large logits: compute log Σ exp(x) as m + log Σ exp(x − m), with m the maximum")
    if isinstance(got, (tuple, list)) and got and close(got[0], expected[0] * case.args[0].shape[0]):
        return _("that is the sum over the rows: the loss is their mean")
    return None


@exercise(cases=_cross_entropy_cases, function="metal_cross_entropy_run", hints=[_cross_entropy_hint],
          explain=N_("the loss of a row is log Σ exp(logits) − logits[target], the log-sum-exp taken with its "
                     "maximum factored out; the mean over the rows."))
def metal_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(mean cross-entropy, dL/dlogits) of F.cross_entropy on logits (N, V) and targets (N,)."""
    leaf = logits.clone().requires_grad_(True)
    loss = F.cross_entropy(leaf, targets)
    loss.backward()
    return loss.detach(), leaf.grad


def _adamw_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for shapes, betas, weight_decay in [([(3, 4), (4,)], (0.9, 0.95), 0.1), ([(5,), (2, 3, 2)], (0.8, 0.99), 0.5)]:
        params = [torch.randn(s, generator=gen) for s in shapes]
        grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(METAL_ADAMW_STEPS)]
        lrs = [float(v) for v in 0.01 + 0.05 * torch.rand(METAL_ADAMW_STEPS, generator=gen)]  # changes every step
        options = {"betas": betas, "eps": 1e-8, "weight_decay": weight_decay}
        label = N_("AdamW, {steps} steps on parameters {shapes}, a new lr each step, betas {betas}, weight decay "
                   "{weight_decay}", steps=METAL_ADAMW_STEPS, shapes=shapes, betas=betas, weight_decay=weight_decay)
        cases.append(Case(label, (params, grads, lrs, options)))
    return cases


def _optimised(optimizer_class: type, params: list[torch.Tensor], grads: list[list[torch.Tensor]], lrs: list[float],
               options: dict[str, Any]) -> list[list[torch.Tensor]]:
    """The parameters after each step of ``optimizer_class`` fed these gradients and rates."""
    leaves = [nn.Parameter(p.clone()) for p in params]
    optimizer = optimizer_class(leaves, lr=lrs[0], foreach=False, **options)
    out = []
    for step_grads, lr in zip(grads, lrs, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = lr
        for leaf, grad in zip(leaves, step_grads, strict=True):
            leaf.grad = grad.clone()
        optimizer.step()
        out.append([leaf.detach().clone() for leaf in leaves])
    return out


def _adamw_hint(case: Case, got: Any, expected: Any) -> str | None:
    params, grads, lrs, options = case.args
    coupled = _optimised(torch.optim.Adam, params, grads, lrs, options)
    if isinstance(got, (tuple, list)) and len(got) == len(coupled) and all(
            isinstance(g, (tuple, list)) and len(g) == len(c) and all(close(a, b) for a, b in zip(g, c, strict=True))
            for g, c in zip(got, coupled, strict=True)):
        return _("that is Adam with L2 decay (the decay added to the gradient): AdamW decays the weights "
                 "directly, p ← p − lr · weight_decay · p, apart from the adaptive step")
    if isinstance(got, (tuple, list)) and got and isinstance(got[0], (tuple, list)) and got[0] and \
            isinstance(got[0][0], torch.Tensor) and not close(got[0][0], expected[0][0]):
        return _("the first step already differs: with bias correction the first update is about lr · sign(g), "
                 "m̂ = m / (1 − β₁ᵗ), v̂ = v / (1 − β₂ᵗ)")
    return _("the first steps agree and later ones do not: read the learning rate from the parameter group at "
             "every step (the schedule changes it) and count t per step")


@exercise(cases=_adamw_cases, function="metal_adamw_run", hints=[_adamw_hint],
          explain=N_("decoupled weight decay, moment estimates with bias correction, and the rate read from the "
                     "parameter group at each step: torch.optim.AdamW's numbers, step by step."))
def metal_adamw(params: list[torch.Tensor], grads: list[list[torch.Tensor]], lrs: list[float],
                options: dict[str, Any]) -> list[list[torch.Tensor]]:
    """The parameters after each of torch.optim.AdamW's steps on these gradients, at these rates."""
    return _optimised(torch.optim.AdamW, params, grads, lrs, options)


def _schedule_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for _case in range(3):
        warmup = int(torch.randint(5, 60, (1,), generator=gen))
        steps = warmup + int(torch.randint(40, 600, (1,), generator=gen))
        lr = float(torch.empty(1).uniform_(1e-3, 3e-2, generator=gen))
        middle = warmup + (steps - warmup) // 2
        # one more step inside the cosine, never one of the others: every case checks seven distinct steps
        others = [s for s in range(warmup + 1, steps - 1) if s != middle]
        drawn = others[int(torch.randint(len(others), (1,), generator=gen))]
        at = sorted([0, warmup // 2, warmup - 1, warmup, middle, steps - 1, drawn])
        label = N_("the rate at the warm-up's first and last steps, the cosine's first, middle and last, and one "
                   "step drawn at random")
        cases.append(Case(label, (steps, lr, warmup, at)))
    return cases


def _schedule_hint(case: Case, got: Any, expected: Any) -> str | None:
    steps, lr, warmup, at = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    from_zero = torch.tensor([lr / 10 + 0.45 * lr * (1 + math.cos(math.pi * s / steps)) if s >= warmup
                              else lr * (s + 1) / warmup for s in at], dtype=torch.float64)
    if close(got, from_zero):
        return _("the cosine starts after the warm-up: progress = (step − warmup) / (steps − warmup)")
    if not close(got[:at.index(warmup)], expected[:at.index(warmup)]):
        return _("during the warm-up the rate is lr · (step + 1) / warmup_steps, so step 0 already moves")
    return _("after the warm-up the rate falls along a cosine from lr to lr / 10 at the last step")


@exercise(cases=_schedule_cases, function="metal_schedule_run", atol=1e-9, rtol=1e-7, hints=[_schedule_hint],
          explain=N_("linear warm-up, then a cosine to lr / 10: the same rates as PyTorch's LinearLR followed by "
                     "CosineAnnealingLR."))
def metal_schedule(steps: int, lr: float, warmup: int, at: list[int]) -> torch.Tensor:
    """The rates at steps ``at`` (float64) of PyTorch's SequentialLR(LinearLR, CosineAnnealingLR)."""
    from torch.optim import lr_scheduler

    leaf = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([leaf], lr=lr)
    schedule = lr_scheduler.SequentialLR(optimizer, [
        lr_scheduler.LinearLR(optimizer, 1 / warmup, 1.0, max(1, warmup - 1)),
        lr_scheduler.CosineAnnealingLR(optimizer, steps - warmup, lr / 10)], milestones=[warmup])
    rates = []
    for _step in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return torch.tensor([rates[s] for s in at], dtype=torch.float64)


def _clipping_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for shapes, scale, max_norm in [([(4, 3), (3,), (2, 2)], 10.0, 1.0), ([(5,), (3, 3)], 0.01, 1.0),
                                    ([(8, 8), (8,)], 3.0, 0.5)]:
        grads = [scale * torch.randn(s, generator=gen) for s in shapes]
        label = N_("clipping gradients {shapes} of scale {scale:g} to {max_norm:g}", shapes=shapes, scale=scale,
                   max_norm=max_norm)
        cases.append(Case(label, (grads, max_norm)))
    return cases


def _clipping_hint(case: Case, got: Any, expected: Any) -> str | None:
    grads, max_norm = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 2 or not isinstance(got[1], (tuple, list)):
        return None
    per_parameter = [g * min(1.0, max_norm / (float(g.norm()) + 1e-6)) for g in grads]
    if len(got[1]) == len(grads) and all(close(a, b) for a, b in zip(got[1], per_parameter, strict=True)):
        return _("each gradient was clipped on its own: the norm is global, √(Σ over all parameters of ‖g‖²), "
                 "and one factor scales them all")
    if float(expected[0]) < max_norm:
        return _("below max_norm the gradients stay as they are: the factor is min(1, max_norm / norm)")
    return None


@exercise(cases=_clipping_cases, function="metal_clipping_run", hints=[_clipping_hint],
          explain=N_("one norm over all the gradients together, and one factor min(1, max_norm / (norm + 1e-6)) for "
                     "all of them, as torch.nn.utils.clip_grad_norm_."))
def metal_clipping(grads: list[torch.Tensor], max_norm: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the global norm before clipping, the clipped gradients) of torch.nn.utils.clip_grad_norm_."""
    leaves = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for leaf, grad in zip(leaves, grads, strict=True):
        leaf.grad = grad.clone()
    norm = torch.nn.utils.clip_grad_norm_(leaves, max_norm)
    return norm, [leaf.grad for leaf in leaves]


def _metal_training_cases(gen: torch.Generator) -> list[Case]:
    seed = int(torch.randint(2**30, (1,), generator=gen))
    shown = ", ".join(f"{k}={v}" for k, v in METAL_TRAIN_SETTINGS.items())
    sizes = ", ".join(f"{k}={v}" for k, v in TRAIN_SIZES.items())
    return [Case(N_("metal_train_gpt on Shakespeare's characters, MetalGPT({sizes}), {settings}", sizes=sizes,
                    settings=shown), (dict(TRAIN_SIZES), dict(METAL_TRAIN_SETTINGS, seed=seed)))]


def _metal_training_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    try:
        model = trained_reference_model(got)
    except ValueError as exc:  # its message is a Message: given in the learner's language by the checker
        return False, exc.args[0]
    loss = held_out_loss(model)  # the base stage's measure: text the sandbox never receives, a secret offset
    if loss < THRESHOLD:
        return True, _("held-out loss {loss:.3f} (the grader's, with a causal reference model) < {threshold}",
                       loss=loss, threshold=THRESHOLD)
    return False, _("held-out loss {loss:.3f} is not below {threshold}: pass every other from-the-metal stage "
                    "first; the model, the loss and the optimiser are the pieces they check", loss=loss,
                    threshold=THRESHOLD)


@exercise(cases=_metal_training_cases, function="metal_trained_weights", verdict=_metal_training_verdict,
          explain=N_("a GPT built only from your own pieces, trained by your own AdamW, schedule and clipping, "
                     "passes the base capstone's threshold."))
def metal_training(sizes: dict[str, int], settings: dict[str, Any]) -> float:
    """The threshold the grader's held-out loss must beat (judged by ``_metal_training_verdict``)."""
    return THRESHOLD
