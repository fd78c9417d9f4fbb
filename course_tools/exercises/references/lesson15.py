"""Exercises of lesson 15: the induction score of every head, the logit lens, an activation-patching
sweep over (layer, position) written with forward hooks, and a linear probe judged against its control
task; five self-check questions and one experiment (the selectivity of a probe of the shipped
Shakespeare model, over three draws of the control task).

The hints name the usual mistakes: the induction score read at the earlier token itself (t − L) instead
of the one after it, the first copy's rows counted, the final norm left out of the logit lens, a patch
that replaces every position, a hook that returns nothing, the control task drawn per occurrence
instead of per type, accuracy reported without the control.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _
from course_utils import blocks, data, pretrained
from course_utils.activations import patch_activation, run_with_cache
from course_utils.config import GPTConfig
from course_utils.cpu_threads import torch_threads
from course_utils.gpt import GPT

# The library names each exercise rebuilds (the shortcut rule): a learner who calls them has not written it.
TEACHES = {"patch_sweep": ("course_utils.activations.run_with_cache", "course_utils.activations.patch_activation")}

# ------------------------------------------------------------------ the induction score


def _attention(gen: torch.Generator, b: int, h: int, t: int) -> torch.Tensor:
    scores = 3 * torch.randn(b, h, t, t, generator=gen)
    keep = torch.ones(t, t, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)


def _induction_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("attention (B={b}, H={h}, {t}, {t}) of sequences of {length} tokens repeated once", b=b, h=h,
                    t=2 * length, length=length), (_attention(gen, b, h, 2 * length), length))
            for b, h, length in [(1, 2, 3), (2, 4, 6), (3, 9, 10)]]


def _diagonal_mean(attn: torch.Tensor, offset: int, first_row: int) -> torch.Tensor:
    rows = torch.arange(first_row, attn.shape[-2])
    return attn[..., rows, rows - offset].mean(dim=(0, 2))


def _induction_hint(case: Case, got, expected) -> str | None:
    attn, length = case.args
    if _close(got, _diagonal_mean(attn, length, length)):
        return _("that is the attention to the same token's first occurrence (t − L); an induction head reads the "
                 "token after it, t − L + 1")
    if _close(got, _diagonal_mean(attn, length - 1, length - 1)):
        return _("only the rows of the second copy count, t from L to 2L − 1: row L − 1 ends the first copy")
    if _close(got, _diagonal_mean(attn, 1, 1)):
        return _("that is the previous-token score (t − 1); the induction score reads t − L + 1")
    return _("for each query row t of the second copy (t = L … 2L − 1), take the weight on column t − L + 1, and "
             "average over the batch and those rows: one number per head")


@exercise(cases=_induction_cases, hints=[_induction_hint])
def induction_score(attn: torch.Tensor, length: int) -> torch.Tensor:
    """attention (B, H, 2L, 2L) on sequences of L random tokens repeated once -> (H,): each head's mean weight,
    from a position t of the second copy, on position t − L + 1 (the token after the current token's first
    occurrence)."""
    return _diagonal_mean(attn, length - 1, length)


# ------------------------------------------------------------------ the logit lens


def _lens_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for layers, d, v in [(2, 4, 7), (5, 8, 20), (6, 16, 50)]:
        streams = 3 * torch.randn(layers, d, generator=gen)
        weight = 1 + 0.5 * torch.randn(d, generator=gen)
        W_U = torch.randn(v, d, generator=gen)
        target = int(torch.randint(v, (1,), generator=gen))
        cases.append(Case(N_("streams ({layers}, {d}), norm weight ({d},), unembedding ({v}, {d}), a random target",
                             layers=layers, d=d, v=v), (streams, weight, W_U, target)))
    return cases


def _lens_from(streams: torch.Tensor, weight: torch.Tensor, W_U: torch.Tensor, target: int,
               norm: bool = True) -> torch.Tensor:
    x = streams * torch.rsqrt(streams.pow(2).mean(-1, keepdim=True) + 1e-5) * weight if norm else streams
    return (x @ W_U.T).softmax(-1)[:, target]


def _lens_hint(case: Case, got, expected) -> str | None:
    streams, weight, W_U, target = case.args
    if _close(got, _lens_from(streams, weight, W_U, target, norm=False)):
        return _("the final norm is missing: the unembedding reads the stream only after the final RMSNorm, at every "
                 "layer as at the last")
    if _close(got, torch.log(expected)):
        return _("that is the log-probability; return the probability itself (softmax over the vocabulary)")
    return _("each layer's stream through the final RMSNorm (x / √(mean(x²) + 1e-5) · weight), then the "
             "unembedding (x W_Uᵀ), a softmax over the vocabulary, and the target's column")


@exercise(cases=_lens_cases, hints=[_lens_hint])
def logit_lens(streams: torch.Tensor, weight: torch.Tensor, W_U: torch.Tensor, target: int) -> torch.Tensor:
    """streams (L, D) at one position, the final RMSNorm's weight (D,) (eps 1e-5), the unembedding W_U (V, D)
    and a target token -> (L,): the target's probability when each layer's stream is read as the last."""
    norm = blocks.RMSNorm(weight.shape[0], eps=1e-5)
    with torch.no_grad():
        norm.gamma.copy_(weight)
        return (norm(streams) @ W_U.T).softmax(-1)[:, target]


# ------------------------------------------------------------------ the patching sweep

PATCH_VOCAB, PATCH_LEN = 20, 6


def tiny_model(seed: int) -> GPT:
    """The random 3-block GPT (vocabulary 20, width 32, 4 heads, context 8) that the patching exercise's
    cases run, its matrices drawn with standard deviation 0.3 so that a patch visibly moves the logits; the
    exercise notebook gives the learner the same function."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(PATCH_VOCAB, 8, n_layers=3, n_heads=4, d_model=32))
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() == 2:
                weight.normal_(0.0, 0.3)
    return model.eval()


def _patch_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for seed, changed in [(0, [2]), (1, [0, 3]), (2, [1, 2, 4])]:
        clean = torch.randint(PATCH_VOCAB, (1, PATCH_LEN), generator=gen)
        corrupt = clean.clone()
        corrupt[0, changed] = (clean[0, changed] + 1 + torch.randint(PATCH_VOCAB - 1, (len(changed),),
                                                                     generator=gen)) % PATCH_VOCAB
        good, bad = torch.randperm(PATCH_VOCAB, generator=gen)[:2].tolist()
        cases.append(Case(N_("tiny_model({seed}), prompts of {t} tokens differing at positions {changed}, two "
                             "random tokens", seed=seed, t=PATCH_LEN, changed=str(changed)),
                          (seed, clean, corrupt, good, bad)))
    return cases


def _sweep(seed: int, clean: torch.Tensor, corrupt: torch.Tensor, good: int, bad: int,
           every_position: bool = False) -> torch.Tensor:
    model = tiny_model(seed)
    with torch.no_grad():
        saved = []
        hooks = [block.register_forward_hook(lambda _m, _a, out: saved.append(out)) for block in model.blocks]
        model(clean)
        for hook in hooks:
            hook.remove()
        out = torch.zeros(len(model.blocks), clean.shape[1])
        for layer in range(len(model.blocks)):
            for pos in range(clean.shape[1]):
                positions = None if every_position else pos
                with patch_activation(model, ("resid_post", layer), saved[layer], positions=positions):
                    logits = model(corrupt)[0]
                out[layer, pos] = logits[0, -1, good] - logits[0, -1, bad]
    return out


def _patch_hint(case: Case, got, expected) -> str | None:
    seed, clean, corrupt, good, bad = case.args
    model = tiny_model(seed)
    with torch.no_grad():
        clean_logits, corrupt_logits = model(clean)[0], model(corrupt)[0]
    diff = [float(x[0, -1, good] - x[0, -1, bad]) for x in (clean_logits, corrupt_logits)]
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and got.is_floating_point():
        if _close(got, torch.full_like(expected, diff[1])):
            return _("every patched run gives the corrupted run's number: the hook must return the patched "
                     "output (a forward hook's return value replaces the block's output)")
        if _close(got, torch.full_like(expected, diff[0])):
            return _("every patched run gives the clean run's number: replace the one position only, not the "
                     "whole stream")
        if _close(got, _sweep(seed, clean, corrupt, good, bad, every_position=True)):
            return _("replace the stream at the one position pos only; the rest stays the corrupted run's")
    return _("for each block l and position p: run the corrupted prompt with block l's output at position p set "
             "to the clean run's, and record logit[good] − logit[bad] at the last position; shape (blocks, T)")


@exercise(cases=_patch_cases, hints=[_patch_hint], atol=1e-4)
def patch_sweep(seed: int, clean: torch.Tensor, corrupt: torch.Tensor, good: int, bad: int) -> torch.Tensor:
    """tiny_model(seed), a clean and a corrupted prompt (1, T) of the same length, two tokens -> (blocks, T): the
    last position's logit[good] − logit[bad] when the corrupted run's residual stream after block l at position
    p is replaced by the clean run's."""
    return _sweep(seed, clean, corrupt, good, bad)


# ------------------------------------------------------------------ a probe and its control


def _probe_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n_train, n_test, d, n_types, n_classes, seed in [(60, 30, 4, 5, 2, 0), (200, 80, 8, 12, 3, 1),
                                                         (400, 200, 16, 30, 4, 2)]:
        types = torch.randint(n_types, (n_train + n_test,), generator=gen)
        labels = torch.randint(n_classes, (n_train + n_test,), generator=gen)
        x = (torch.randn(n_types, d, generator=gen)[types] + torch.randn(n_classes, d, generator=gen)[labels]
             + 0.5 * torch.randn(n_train + n_test, d, generator=gen)).double()
        cases.append(Case(N_("{n_train} training and {n_test} test vectors of width {d}, {n_types} types, "
                             "{n_classes} classes, control seed {seed}", n_train=n_train, n_test=n_test, d=d,
                             n_types=n_types, n_classes=n_classes, seed=seed),
                          (x[:n_train], labels[:n_train], types[:n_train], x[n_train:], labels[n_train:],
                           types[n_train:], n_types, n_classes, seed)))
    return cases


def _ridge_accuracy(x_train, y_train, x_test, y_test, n_classes: int) -> float:
    X = torch.cat([x_train, torch.ones(len(x_train), 1, dtype=x_train.dtype)], 1)
    Y = F.one_hot(y_train, n_classes).to(X.dtype)
    W = torch.linalg.solve(X.T @ X + 1e-2 * torch.eye(X.shape[1], dtype=X.dtype), X.T @ Y)
    Xt = torch.cat([x_test, torch.ones(len(x_test), 1, dtype=x_test.dtype)], 1)
    return (Xt @ W).argmax(-1).eq(y_test).double().mean().item()


def _control(types: torch.Tensor, n_types: int, n_classes: int, seed: int) -> torch.Tensor:
    return torch.randint(n_classes, (n_types,), generator=torch.Generator().manual_seed(seed))[types]


def _probe_hint(case: Case, got, expected) -> str | None:
    x_tr, y_tr, t_tr, x_te, y_te, t_te, n_types, n_classes, seed = case.args
    real = _ridge_accuracy(x_tr, y_tr, x_te, y_te, n_classes)
    if _close(got, real):
        return _("that is the real task's accuracy alone; selectivity subtracts the control task's accuracy")
    if _close(got, _ridge_accuracy(x_tr, _control(t_tr, n_types, n_classes, seed), x_te,
                                   _control(t_te, n_types, n_classes, seed), n_classes)):
        return _("that is the control task's accuracy; selectivity is the real task's minus the control's")
    if _close(got, -expected):
        return _("the other way round: real accuracy minus control accuracy")
    return _("draw the control's classes per type (one draw of n_types classes from the seeded generator, indexed "
             "by the types), fit the same ridge probe to both tasks, and subtract the control's test accuracy")


@exercise(cases=_probe_cases, hints=[_probe_hint])
def selectivity(x_train: torch.Tensor, y_train: torch.Tensor, types_train: torch.Tensor, x_test: torch.Tensor,
                y_test: torch.Tensor, types_test: torch.Tensor, n_types: int, n_classes: int, seed: int) -> float:
    """Test accuracy of a ridge probe (λ = 1e-2, a column of ones appended, one-hot targets, argmax) on the real
    classes minus its accuracy on the control task: one random class per type,
    torch.randint(n_classes, (n_types,), generator=torch.Generator().manual_seed(seed)), indexed by the types."""
    real = _ridge_accuracy(x_train, y_train, x_test, y_test, n_classes)
    control = _ridge_accuracy(x_train, _control(types_train, n_types, n_classes, seed), x_test,
                              _control(types_test, n_types, n_classes, seed), n_classes)
    return real - control


# ------------------------------------------------------------------ self-check questions
@question(explain=N_("the two prompts have the same token there, and before block 0 nothing has mixed positions, so "
                     "the clean stream at that position equals the corrupted one: the patch changes nothing, 0.0."),
          atol=1e-6,
          hints=[known_wrong({
              1.0: N_("a patch restores only what differs between the runs; at that position, before any block, "
                      "nothing does"),
              0.5: N_("work out what the clean and the corrupted streams are at that position before block 0"),
          })])
def identical_position_patch() -> float:
    """Share restored by patching the embeddings (before block 0) at a position whose token both prompts share."""
    return 0.0


@question(explain=N_("a head that spreads its weight evenly gives row t the weight 1/(t + 1) on every column; the "
                     "induction score averages 1/(t + 1) over t = 50 … 99: (H₁₀₀ − H₅₀)/50 ≈ 0.01376."), atol=2e-4,
          hints=[known_wrong({
              0.01: N_("1/100 is row 99 alone; rows 50 to 99 each give 1/(t + 1)"),
              0.02: N_("1/50 is only the first row of the second copy; average 1/(t + 1) over t = 50 … 99"),
          })])
def uniform_induction_score() -> float:
    """Induction score of a head attending uniformly to every position up to its own, on 50 tokens repeated once."""
    return sum(1 / (t + 1) for t in range(50, 100)) / 50


@question(explain=N_("selectivity is 0.40 at layer m and 0.02 at layer k: at k the probe does as well on random labels "
                     "per token as on the property, so its accuracy says only that the token's identity is there."),
          hints=[known_wrong({
              "a": N_("0.95 at layer k, but 0.93 on a control that only memorises token types: the probe learned "
                      "the types, not the property"),
              "c": N_("the two layers' selectivities differ: 0.02 and 0.40"),
              "d": N_("a control task is what lets us say it: compare the two selectivities"),
          })])
def selectivity_choice() -> str:
    """Multiple choice: which of two layers (0.95/0.93 against 0.80/0.40) shows the property beyond token identity."""
    return "b"


@question(explain=N_("mean ablation replaces a head's output by its mean over the reference run; a head that writes "
                     "the same vector everywhere already equals its mean, so nothing changes: 0.0 nats."), atol=1e-6,
          hints=[known_wrong({
              1.0: N_("compare the head's output with its mean over the batch and positions"),
          })])
def mean_ablation_change() -> float:
    """Change of the loss when mean-ablating a head whose output is one constant vector at every position."""
    return 0.0


@question(explain=N_("one patched run per (block, position) and one per (block, head): 30·12 + 30·9 = 630."),
          hints=[known_wrong({
              360: N_("those are the residual stream's runs; add one per head of every block"),
              270: N_("those are the heads' runs; add one per (block, position)"),
              3240: N_("the heads are patched at all positions at once: one run per head, not per head and position"),
          })])
def patched_runs() -> int:
    """Forward passes of a full (block, position) sweep plus a (block, head) sweep of SmolLM2 on a 12-token prompt."""
    return 30 * 12 + 30 * 9


# ------------------------------------------------------------------ the experiment

PROBE_WINDOWS, PROBE_TRAIN, PROBE_SEEDS = 64, 48, (0, 1, 2)


def word_position(row: str) -> list[int]:
    """For each character of ``row``: -1 if it is not a letter, else its index in its run of letters, capped at 3."""
    out, run = [], 0
    for i, ch in enumerate(row):
        run = run + 1 if ch.isalpha() and i and row[i - 1].isalpha() else 0
        out.append(min(run, 3) if ch.isalpha() else -1)
    return out


def _probe_selectivities() -> list[float]:
    """The experiment as its text prescribes: the shipped Shakespeare model's stream after block 1 on 64 windows
    of 128 held-out characters, letters only, the ridge probe's selectivity for each control seed."""
    model, tok = pretrained.load()
    held_out = data.train_val_split(data.shakespeare())[1]
    texts = [held_out[i * 128:(i + 1) * 128] for i in range(PROBE_WINDOWS)]
    ids = torch.tensor([tok.encode(t) for t in texts])
    labels = torch.tensor([word_position(t) for t in texts])
    with torch.no_grad():
        _, cache = run_with_cache(model.eval(), ids)
    stream = cache["resid_post", 0].double()
    train = labels >= 0
    train[PROBE_TRAIN:] = False
    test = labels >= 0
    test[:PROBE_TRAIN] = False
    return [selectivity(stream[train], labels[train], ids[train], stream[test], labels[test], ids[test],
                        tok.vocab_size, 4, seed) for seed in PROBE_SEEDS]


@question(explain=N_("after block 1 the probe reads a letter's place in its word almost perfectly, but it also learns "
                     "a random class per character nearly as well: the stream still carries each character's "
                     "identity, so most of the accuracy is memorised, and only the difference, about 0.09, is "
                     "evidence for the property."), atol=0.005)
def probe_selectivity_block1() -> float:
    """Experiment: the mean over three control seeds of the selectivity after block 1 of the Shakespeare model."""
    with torch_threads(1):
        return sum(_probe_selectivities()) / len(PROBE_SEEDS)
