"""Lesson 11, the capstone: the learner's own GPT and training loop, graded in five stages.

1. ``capstone_shapes``: each module's parameter names, shapes and count, and its output shape.
2. ``capstone_equivalence``: each module loaded with the reference's weights (``course_utils``'
   attention, feed-forward network, block and GPT, renamed to the interface) gives the reference's
   output to 1e-4.
3. ``capstone_no_peeking``: changing tokens from position t on leaves the logits before t unchanged.
4. ``capstone_training``: the learner's loop trains the learner's model on Shakespeare's characters
   for a fixed number of steps; the weights come back and the validation loss is computed here, on
   the trusted side, with the course's causal GPT, so a loop that peeks or reports a wrong loss
   gains nothing.
5. ``capstone_sampling``: generated ids keep the prompt, have the right length and vocabulary,
   crop the context to ``max_len``, and with ``top_k=1`` follow the reference's greedy path.

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
from functools import lru_cache
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close, known_wrong
from course_tools.messages import N_, N_n, _
from course_utils import attention, blocks, counting, data, gpt
from course_utils.generate import next_token_probs

# What the capstone asks the learner to write, removed from the sandbox while it is graded
# (course_tools.grading.shortcuts): "*" for every stage, and the loop and the sampler for their own.
TEACHES = {
    "*": ("course_utils.attention.MultiHeadAttention", "course_utils.attention.SelfAttentionHead",
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
THRESHOLD = 2.2  # nats per character on the validation split; the reference reaches about 2.03
EVAL_BATCHES, EVAL_BATCH = 16, 64  # windows the grader scores: 16 × 64 × 64 = 65,536 characters
ACTIVATION = "gelu"  # the exact GELU, PyTorch's nn.GELU() default


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


@exercise(cases=_shape_cases, function="shapes_of", hints=[_shapes_hint],
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
    """(vocabulary size, validation ids) of the character-level Shakespeare split the notebook uses:
    one id per distinct character in sorted order, the last 10 % of the text for validation."""
    text = data.shakespeare()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    return len(chars), data.train_val_split(ids)[1]


@torch.no_grad()
def validation_loss(model: nn.Module, seed: int) -> float:
    """Mean next-token cross-entropy of a course GPT over EVAL_BATCHES fixed windows of the split."""
    _, val = shakespeare_splits()
    gen = torch.Generator().manual_seed(seed)
    block = model.config.max_len
    total = 0.0
    for _ in range(EVAL_BATCHES):
        starts = torch.randint(len(val) - block, (EVAL_BATCH,), generator=gen)
        windows = val[starts[:, None] + torch.arange(block + 1)]
        logits, _ = model(windows[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()).item()
    return total / EVAL_BATCHES


def _training_cases(gen: torch.Generator) -> list[Case]:
    seed = int(torch.randint(2**30, (1,), generator=gen))
    settings = dict(TRAIN_SETTINGS, seed=seed)
    shown = ", ".join(f"{k}={v}" for k, v in TRAIN_SETTINGS.items())
    sizes = ", ".join(f"{k}={v}" for k, v in TRAIN_SIZES.items())
    return [Case(N_("train_gpt on Shakespeare's characters, GPT({sizes}), {settings}", sizes=sizes, settings=shown),
                 (dict(TRAIN_SIZES), settings))]


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


def _training_verdict(case: Case, got: Any, expected: Any) -> tuple[bool, str]:
    try:
        model = trained_reference_model(got)
    except ValueError as exc:  # its message is a Message: given in the learner's language by the checker
        return False, exc.args[0]
    loss = validation_loss(model, case.args[1]["seed"])
    if not math.isfinite(loss):
        return False, _("the validation loss is not finite: the weights hold NaN or inf (did the loss diverge?)")
    if loss < THRESHOLD:
        return True, _("validation loss {loss:.3f} (the grader's, with a causal reference model) < {threshold}",
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
    return False, _("validation loss {loss:.3f} ≥ {threshold} — {why}", loss=loss, threshold=THRESHOLD, why=why)


@exercise(cases=_training_cases, function="trained_weights", verdict=_training_verdict,
          explain=N_("{train_settings_steps} steps of AdamW with warm-up, cosine decay and clipping take the model "
                     "well below a character bigram's validation loss: it uses its context.",
                     train_settings_steps=TRAIN_SETTINGS['steps']))
def capstone_training(sizes: dict[str, int], settings: dict[str, Any]) -> float:
    """The threshold the grader's validation loss must beat (judged by ``_training_verdict``)."""
    return THRESHOLD


# --- stage 5: sampling ----------------------------------------------------------------------------


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
    return cases


@torch.no_grad()
def greedy(sizes: dict[str, int], state: dict[str, torch.Tensor], idx: torch.Tensor, new: int) -> torch.Tensor:
    """The reference's greedy continuation, feeding at most max_len tokens each step."""
    model = reference_module("gpt", sizes)
    model.load_state_dict(to_reference_names(state))
    for _step in range(new):
        logits = model(idx[:, -sizes["max_len"]:])[0]
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


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
          explain=N_("one token at a time from the last position's distribution, the context cropped to max_len."))
def capstone_sampling(sizes: dict[str, int], state: dict[str, torch.Tensor], idx: torch.Tensor, new: int,
                      options: dict[str, Any]) -> torch.Tensor:
    """The greedy continuation (what ``top_k=1`` must give; other cases are judged on form only)."""
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


def _layer_norm_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for shape, offset in [((2, 5, 8), 0.0), ((3, 4, 16), 0.0), ((2, 3, 6), 100.0)]:
        x = offset + 3 * torch.randn(shape, generator=gen)
        d = shape[-1]
        weight, bias = 1 + 0.2 * torch.randn(d, generator=gen), 0.2 * torch.randn(d, generator=gen)
        grad = torch.randn(shape, generator=gen)
        cases.append(Case(_metal_label("LayerNorm", {"x": shape}), (x, weight, bias, grad)))
    return cases


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
    return None


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
        at = sorted({0, warmup // 2, warmup - 1, warmup, middle, steps - 1,
                     int(torch.randint(warmup, steps, (1,), generator=gen))})
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
    loss = validation_loss(model, case.args[1]["seed"])
    if loss < THRESHOLD:
        return True, _("validation loss {loss:.3f} (the grader's, with a causal reference model) < {threshold}",
                       loss=loss, threshold=THRESHOLD)
    return False, _("validation loss {loss:.3f} is not below {threshold}: pass every other from-the-metal stage "
                    "first; the model, the loss and the optimiser are the pieces they check", loss=loss,
                    threshold=THRESHOLD)


@exercise(cases=_metal_training_cases, function="metal_trained_weights", verdict=_metal_training_verdict,
          explain=N_("a GPT built only from your own pieces, trained by your own AdamW, schedule and clipping, "
                     "passes the base capstone's threshold."))
def metal_training(sizes: dict[str, int], settings: dict[str, Any]) -> float:
    """The threshold the grader's validation loss must beat (judged by ``_metal_training_verdict``)."""
    return THRESHOLD
