"""Exercises of lesson 14: a verifiable reward (the answer checked), group advantages, GRPO's loss (the
clipped surrogate with the k3 KL, over per-token log-probabilities with a mask, DeepSeekMath's
normalisation) and one GRPO step on a policy small enough to pass as a tensor (a bigram table: the
logits of the token after token t are W[t]); five self-check questions and one experiment (the group
size G at a fixed number of completions per step, over three seeds).

The cases are drawn by the grader: random numbers in the texts, random rewards, log-probabilities,
masks, tables and uniform draws. The hints name the usual mistakes: the first number taken instead of
the last, thousands commas kept, answers compared as text; the population std, one mean for the whole
batch, no epsilon for a group whose rewards are all equal; the token mean instead of each completion's
mean, k1 instead of k3, the clip without the min, the mask left out; a reward given to a completion
that never stopped, the step taken uphill, the advantages in the wrong order.

The library's versions (``course_utils.rewards``, ``course_utils.grpo``) are removed while grading
(``TEACHES`` and the names the references call).
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache

import torch
from torch import nn

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, _
from course_utils import grpo, rewards
from course_utils.cpu_threads import torch_threads

# What the exercises ask the learner to write, beyond the functions their references call: the answer
# extractor and comparison behind exact_match, and the group sampler and group rewards a step could use.
TEACHES = {
    "answer_reward": ("course_utils.rewards.last_number", "course_utils.rewards.same_answer",
                      "course_utils.rewards.exact_match"),
    "group_advantages": ("course_utils.grpo.group_advantages",),
    "grpo_loss": ("course_utils.grpo.grpo_loss",),
    "grpo_step": ("course_utils.grpo.sample_group", "course_utils.grpo.completion_logprobs",
                  "course_utils.grpo.group_advantages", "course_utils.grpo.grpo_loss",
                  "course_utils.rewards.group_rewards"),
}

# ------------------------------------------------------------------ a verifiable reward

_TEXTS = {
    "last": N_("the answer is the last number of the text"),
    "wrong": N_("the last number is a wrong answer"),
    "earlier": N_("the answer appears, then another number after it"),
    "commas": N_("the answer written with thousands commas"),
    "decimal": N_("the answer written as a decimal (.0)"),
    "negative": N_("a negative answer"),
    "none": N_("no number at all"),
}


def _reward_cases(gen: torch.Generator) -> list[Case]:
    def num(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi, (1,), generator=gen))

    a, b = num(10, 99), num(10, 99)
    big = num(1_000, 999_999)
    other = num(1, 9)
    neg = -num(2, 90)
    texts = {
        "last": (f"{a} plus {b} makes {a + b}. So the answer is {a + b}", str(a + b)),
        "wrong": (f"{a} plus {b}: I get {a + b + other}.", str(a + b)),
        "earlier": (f"{a + b} is my first guess, but the total is {a + b + other}", str(a + b)),
        "commas": (f"The total comes to {big:,} in all.", str(big)),
        "decimal": (f"{a} + {b} = {a + b}.0", str(a + b)),
        "negative": (f"{a} minus {a - neg} leaves {neg}", str(neg)),
        "none": ("I do not know the answer.", str(a)),
    }
    return [Case(_TEXTS[kind], texts[kind]) for kind in _TEXTS]


def _first_number(text: str) -> str | None:
    found = rewards.NUMBER.findall(text)
    return found[0].replace(",", "") if found else None


def _reward_hint(case: Case, got, expected) -> str | None:
    completion, answer = case.args
    if isinstance(got, bool) or not isinstance(got, (int, float, torch.Tensor)):
        return _("return a number: 1.0 when the answer is right, 0.0 otherwise")
    found = rewards.NUMBER.findall(completion)
    if found and _close(got, rewards.exact_match(completion, answer, extract=_first_number)):
        return _("take the last number of the text: a model often writes other numbers (its working) before the "
                 "final answer")
    if found and "," in found[-1] and _close(got, float(found[-1] == answer)):
        return _("remove the thousands commas before comparing: 12,345 and 12345 are the same number")
    if found and _close(got, float(found[-1].replace(",", "") == answer)):
        return _("compare the two as numbers (42.0 and 42 are the same answer), not as strings")
    return None


@exercise(cases=_reward_cases, hints=[_reward_hint])
def answer_reward(completion: str, answer: str) -> float:
    """1.0 if the last number in ``completion`` (thousands commas removed) equals ``answer`` as a number,
    else 0.0 (also when the text holds no number)."""
    return rewards.exact_match(completion, answer)


# ------------------------------------------------------------------ group advantages


def _advantage_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for P, G in [(3, 4), (5, 8)]:
        r = (torch.rand(P, G, generator=gen) < 0.5).float()
        r[0] = float(torch.rand((), generator=gen) < 0.5)  # a group whose rewards are all equal
        r[1, 0], r[1, 1] = 0.0, 1.0  # and one that is not
        cases.append(Case(N_("{P} prompts, G={G}, rewards 0 or 1, one group all equal", P=P, G=G), (r,)))
    cases.append(Case(N_("{P} prompts, G={G}, real-valued rewards", P=4, G=6),
                      (2 * torch.randn(4, 6, generator=gen) + 1,)))
    cases.append(Case(N_("{P} prompts, G={G}, real-valued rewards", P=2, G=2), (torch.randn(2, 2, generator=gen),)))
    return cases


def _advantage_hint(case: Case, got, expected) -> str | None:
    (r,) = case.args
    if not isinstance(got, torch.Tensor) or got.shape != r.shape:
        return _("return one advantage per completion, the rewards' shape (P, G)")
    if bool(torch.isnan(got).any()):
        return _("a group whose rewards are all equal has std 0: add eps = 1e-4 to the std, so its advantages are 0")
    centred = r - r.mean(1, keepdim=True)
    if _close(got, centred / (r.std(1, unbiased=False, keepdim=True) + 1e-4)):
        return _("use the sample standard deviation (divide by G − 1, torch's default), as TRL does")
    if _close(got, centred):
        return _("divide by the group's standard deviation (plus eps)")
    if _close(got, (r - r.mean()) / (r.std() + 1e-4)):
        return _("each prompt's group is its own baseline: the mean and std over dim=1 (G), not over the whole batch")
    if _close(got, (r - r.mean(0, keepdim=True)) / (r.std(0, keepdim=True) + 1e-4)):
        return _("the statistics go along the G completions of a prompt (dim=1), not across prompts")
    return None


@exercise(cases=_advantage_cases, hints=[_advantage_hint])
def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards -> (P, G) advantages: (r − mean) / (std + 1e-4) within each group (row), std the sample
    standard deviation (n − 1)."""
    return grpo.group_advantages(rewards)


# ------------------------------------------------------------------ GRPO's loss


def _loss_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for B, T, clip_eps, beta in [(2, 3, 0.2, 0.0), (4, 6, 0.2, 0.04), (6, 9, 0.1, 0.5)]:
        logp = -3 * torch.rand(B, T, generator=gen) - 0.05
        old_logp = logp + 0.5 * torch.randn(B, T, generator=gen)  # ratios on both sides of the clip
        ref_logp = logp + 0.5 * torch.randn(B, T, generator=gen)
        lengths = torch.randint(1, T + 1, (B,), generator=gen)
        lengths[0] = T
        lengths[-1] = 1 if T > 2 else lengths[-1]
        mask = torch.arange(T) < lengths[:, None]
        A = torch.randn(B, generator=gen)
        label = N_("B={B} completions of up to T={T} tokens, clip_eps={clip_eps:g}, beta={beta:g}", B=B, T=T,
                   clip_eps=clip_eps, beta=beta)
        cases.append(Case(label, (logp, old_logp, ref_logp, A, mask, clip_eps, beta)))
    return cases


def _loss_variant(logp, old_logp, ref_logp, A, mask, clip_eps, beta, *, norm="sequence", kl="k3", clip="min",
                  kl_sign=1.0, use_mask=True, ratio_sign=1.0) -> torch.Tensor:
    """The loss and its usual wrong twins."""
    ratio = torch.exp(ratio_sign * (logp - old_logp))
    A = A[:, None]
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * A
    surrogate = {"min": torch.min(ratio * A, clipped), "none": ratio * A, "only": clipped,
                 "max": torch.max(ratio * A, clipped)}[clip]
    d = ref_logp - logp
    k = torch.exp(d) - d - 1 if kl == "k3" else -d
    per_token = -surrogate + kl_sign * beta * k
    m = mask.float() if use_mask else torch.ones_like(logp)
    if norm == "sequence":
        return ((per_token * m).sum(-1) / m.sum(-1)).mean()
    return (per_token * m).sum() / m.sum()


def _loss_hint(case: Case, got, expected) -> str | None:
    logp, old_logp, ref_logp, A, mask, clip_eps, beta = case.args
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        return _("return the loss, one number (a scalar tensor)")
    if _close(got, -expected):
        return _("the loss is to be minimised: the negative of the clipped surrogate, plus β·KL")
    slips = [
        ({"norm": "token"}, _("that is the token mean over the batch (DAPO); DeepSeekMath averages each completion's "
                              "tokens first (1/|o_i|), then the completions")),
        ({"use_mask": False}, _("the padding is in the loss: average over each completion's own tokens (the mask), "
                                "not over all T positions")),
        ({"kl": "k1"}, _("that is the naive KL estimate log(π/π_ref); use k3 = π_ref/π − log(π_ref/π) − 1")),
        ({"kl_sign": -1.0}, _("the KL is a penalty: + β·KL in the loss, not − β·KL")),
        ({"clip": "none"}, _("the clip is missing: take min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A)")),
        ({"clip": "only"}, _("keep the min of the unclipped and the clipped term: the clip only ever lowers the "
                             "objective")),
        ({"clip": "max"}, _("min, not max, of the two terms")),
        ({"ratio_sign": -1.0}, _("ρ = π_θ / π_old = exp(logp − old_logp), not the inverse")),
    ]
    for change, why in slips:
        if _close(got, _loss_variant(*case.args, **change)):
            return why
    return None


@exercise(cases=_loss_cases, hints=[_loss_hint])
def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, clip_eps: float, beta: float) -> torch.Tensor:
    """GRPO's loss (DeepSeekMath): per token −min(ρA, clip(ρ, 1 − ε, 1 + ε)A) + β·KL_k3, averaged over each
    completion's masked tokens, then over the B completions. logp, old_logp, ref_logp, mask (B, T);
    advantages (B,)."""
    loss, _stats = grpo.grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta)
    return loss


# ------------------------------------------------------------------ one GRPO step on a bigram policy


class _Bigram(nn.Module):
    """A policy whose next-token logits depend only on the last token: logits = W[idx]."""

    def __init__(self, W: torch.Tensor) -> None:
        super().__init__()
        self.W = W

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.W[idx], None


def _sample(W: torch.Tensor, prompts: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions (B, N) and their mask (B, N) drawn from the bigram table W with the uniform numbers u
    (P, G, N) by the inverse CDF; token 0 is the stop token, written after a stop as padding."""
    P, G, N = u.shape
    B = P * G
    prev = prompts.repeat_interleave(G)
    u = u.reshape(B, N).double()
    out = torch.zeros(B, N, dtype=torch.long)
    stopped = torch.zeros(B, dtype=torch.bool)
    mask = torch.zeros(B, N, dtype=torch.bool)
    for n in range(N):
        cdf = torch.softmax(W[prev].double(), dim=-1).cumsum(-1)
        token = torch.searchsorted(cdf, u[:, n:n + 1] * cdf[:, -1:], right=True).squeeze(-1).clamp_max(W.shape[0] - 1)
        token = torch.where(stopped, torch.zeros_like(token), token)
        mask[:, n] = ~stopped
        out[:, n] = token
        stopped = stopped | (token == 0)
        prev = token
    return out, mask


def _step_rewards(out: torch.Tensor, mask: torch.Tensor, answers: torch.Tensor, G: int,
                  slip: str | None = None) -> torch.Tensor:
    """(P, G) rewards: 1.0 when the completion stopped and the token just before its stop is its prompt's
    answer. ``slip`` builds the usual mistakes: "unfinished" (a completion that never stopped counts its
    last token), "stop" (the last token, the stop itself, compared with the answer)."""
    n = mask.sum(-1)  # tokens written, the stop included
    last = out.gather(1, (n - 1)[:, None]).squeeze(1)
    before = out.gather(1, (n - 2).clamp(min=0)[:, None]).squeeze(1)
    stopped, target = last == 0, answers.repeat_interleave(G)
    right = stopped & (n >= 2) & (before == target)
    if slip == "unfinished":
        right = torch.where(stopped, right, last == target)
    elif slip == "stop":
        right = last == target
    return right.float().view(-1, G)


def _step_parts(W, W_ref, prompts, answers, u, lr, beta, *, sign=1.0, use_mask=True, transpose=False):
    """The step of ``grpo_step`` and its usual wrong twins: (rewards (P, G), new W)."""
    G = u.shape[1]
    out, mask = _sample(W, prompts, u)
    r = _step_rewards(out, mask, answers, G)
    A = grpo.group_advantages(r)
    A = A.T.reshape(-1) if transpose else A.reshape(-1)
    repeated = prompts.repeat_interleave(G)[:, None]
    policy = W.detach().clone().requires_grad_(True)
    logp = grpo.completion_logprobs(_Bigram(policy), repeated, out)
    with torch.no_grad():
        ref_logp = grpo.completion_logprobs(_Bigram(W_ref), repeated, out)
    m = mask if use_mask else torch.ones_like(mask)
    loss, _stats = grpo.grpo_loss(logp, logp.detach(), ref_logp, A, m, 0.2, beta)
    (grad,) = torch.autograd.grad(loss, policy)
    return r, (W - sign * lr * grad).detach()


def _step_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n_q, n_a, P, G, N, lr, beta in [(2, 2, 2, 4, 3, 1.0, 0.0), (3, 3, 3, 6, 4, 2.0, 0.04),
                                        (4, 3, 4, 8, 5, 0.5, 0.3)]:
        V = 1 + n_q + n_a
        for _attempt in range(100):  # draw until some group has a right and a wrong completion
            W = 1.5 * torch.randn(V, V, generator=gen)
            prompts = 1 + torch.randint(n_q, (P,), generator=gen)
            answers = 1 + n_q + torch.randint(n_a, (P,), generator=gen)
            W[prompts, answers] += 2.0  # the answer is a likely first token
            W[1 + n_q:, 0] += 1.5       # and the stop a likely next one
            W_ref = W + 0.3 * torch.randn(V, V, generator=gen)
            u = torch.rand(P, G, N, generator=gen, dtype=torch.float64)
            r = _step_rewards(*_sample(W, prompts, u), answers, G)
            if bool(((r.min(1).values == 0) & (r.max(1).values == 1)).any()):
                break
        label = N_("V={V} tokens, {P} prompts, G={G}, up to N={N} tokens, lr={lr:g}, beta={beta:g}", V=V, P=P, G=G,
                   N=N, lr=lr, beta=beta)
        cases.append(Case(label, (W, W_ref, prompts, answers, u, lr, beta)))
    return cases


def _step_hint(case: Case, got, expected) -> str | None:
    W, W_ref, prompts, answers, u, lr, beta = case.args
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return _("return a pair: the rewards (P, G) and the new table W (V, V)")
    r, new_W = got
    if not isinstance(r, torch.Tensor) or r.shape != expected[0].shape:
        return _("the rewards are one per completion, shape (P, G): row p holds prompt p's G completions")
    if not _close(r, expected[0]):
        G = u.shape[1]
        out, mask = _sample(W, prompts, u)
        if _close(r, _step_rewards(out, mask, answers, G, slip="unfinished")):
            return _("a completion that never wrote the stop token gets reward 0: it did not finish")
        if _close(r, _step_rewards(out, mask, answers, G, slip="stop")):
            return _("the stop token ends the completion: check the token just before it")
        return _("the rewards differ: draw token n of completion g of prompt p with u[p, g, n] from "
                 "softmax(W[previous token]) (the first index whose cumulative probability exceeds u), and stop "
                 "a completion after it writes token 0")
    if not isinstance(new_W, torch.Tensor) or new_W.shape != W.shape:
        return _("the second item is the updated table, W's shape (V, V)")
    if _close(new_W, W):
        return _("W did not move: take one step W − lr · ∂loss/∂W")
    variants = [({"sign": -1.0}, _("the step went uphill: W − lr · gradient of the loss (the loss is minimised)")),
                ({"use_mask": False}, _("the padding after a stop token is in the loss: pass the completions' mask")),
                ({"transpose": True}, _("the advantages are in the wrong order: flatten (P, G) row by row, so "
                                        "completion g of prompt p is row p·G + g"))]
    for change, why in variants:
        if _close(new_W, _step_parts(*case.args, **change)[1]):
            return why
    return _("the rewards are right; check the log-probabilities (log_softmax(W[previous token]) at the drawn "
             "token), the old ones (the same, detached: one step per group), the reference's from W_ref, and the "
             "loss with clip_eps = 0.2")


@exercise(cases=_step_cases, hints=[_step_hint])
def grpo_step(W: torch.Tensor, W_ref: torch.Tensor, prompts: torch.Tensor, answers: torch.Tensor, u: torch.Tensor,
              lr: float, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One GRPO step on the bigram policy W (V, V) (the logits after token t are W[t]; token 0 stops):
    sample G completions of each of the P prompt tokens with u (P, G, N), reward 1.0 each that stopped with
    its prompt's answer as the token before the stop, group advantages, GRPO's loss (old = the policy,
    clip_eps 0.2, beta) against W_ref, one step W − lr·∇W -> (rewards (P, G), new W (V, V))."""
    P, G, N = u.shape
    out, mask = _sample(W, prompts, u)
    r = _step_rewards(out, mask, answers, G)
    repeated = prompts.repeat_interleave(G)[:, None]
    policy = W.detach().clone().requires_grad_(True)
    logp = grpo.completion_logprobs(_Bigram(policy), repeated, out)
    with torch.no_grad():
        ref_logp = grpo.completion_logprobs(_Bigram(W_ref), repeated, out)
    loss, _stats = grpo.grpo_loss(logp, logp.detach(), ref_logp, grpo.group_advantages(r).reshape(-1), mask, 0.2,
                                  beta)
    (grad,) = torch.autograd.grad(loss, policy)
    return r, (W - lr * grad).detach()


# ------------------------------------------------------------------ self-check questions


def _near(table: dict[float, str], atol: float):
    """``known_wrong`` for numbers typed with a few digits: the misconception of a known wrong value
    within ``atol``."""
    def hint(case: Case, got, expected) -> str | None:
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return None
        return next((why for wrong, why in table.items() if abs(got - wrong) <= atol), None)

    hint.table = table  # the known wrong answers, for the tests that try them
    return hint



@question(explain=N_("one right answer out of G = 8: the mean is 1/8, so the right one is 7/8 above it; the sample std "
                     "is √(1/8) ≈ 0.354, and 0.875 / 0.354 ≈ 2.47. The rarer the right answer, the larger its "
                     "advantage."), atol=0.01,
          hints=[_near({
              2.646: N_("that divides by the population std (n); group_advantages uses the sample std (n − 1)"),
              0.875: N_("that is the advantage without the division by the std (Dr. GRPO's form)"),
              1.5: N_("that is the lone right answer of a group of 4, which the lesson shows; here G = 8"),
              -0.354: N_("that is the advantage of each wrong answer; the question asks about the right one"),
          }, atol=0.01)])
def lone_right_advantage() -> float:
    """The advantage of the only right completion in a group of 8 (rewards 1 and seven 0)."""
    r = torch.tensor([1.0] + [0.0] * 7)
    return round(float((r[0] - r.mean()) / (r.std() + 1e-4)), 3)


@question(explain=N_("a token whose ratio is already below 1 − ε with A < 0 takes the clipped term, a constant: the "
                     "surrogate gives it no gradient, and only the KL term (pulling toward the reference) still acts "
                     "on it."),
          hints=[known_wrong({
              "a": N_("min(ρA, clip(ρ)A) with A < 0 and ρ = 0.7: ρA = −0.7·|A| is larger than 0.8·A = −0.8·|A|, so the "
                      "min is the clipped term, a constant in θ"),
              "b": N_("a negative advantage never pushes a token up; and here the surrogate does not push at all"),
              "c": N_("the clip sets the push of this token to zero; it does not double it"),
          })])
def clipped_negative_choice() -> str:
    """Multiple choice: what the next step does to a token with A < 0 whose ratio has fallen to 0.7 (ε = 0.2)."""
    return "d"


@question(explain=N_("k3 = r − log r − 1 with r = π_ref/π = 0.25/0.5 = 0.5: 0.5 + 0.693 − 1 ≈ 0.193 (always ≥ 0; "
                     "k1 = log(π/π_ref) = 0.693 would be the naive estimate)."), atol=2e-3,
          hints=[_near({
              0.693: N_("that is k1 = log(π/π_ref), the naive estimate; k3 = r − log r − 1 with r = π_ref/π"),
              -0.693: N_("that is log(π_ref/π); k3 = r − log r − 1 with r = π_ref/π"),
              0.307: N_("r is π_ref/π = 0.5, not π/π_ref = 2"),
          }, atol=0.005)])
def k3_token_kl() -> float:
    """The k3 KL term of a token the policy gives probability 0.5 and the reference 0.25."""
    r = 0.25 / 0.5
    return round(r - math.log(r) - 1, 3)


@question(explain=N_("a group carries no gradient when its 4 completions are all right (0.6⁴ = 0.1296) or all wrong "
                     "(0.4⁴ = 0.0256): 16 · 0.1552 ≈ 2.48 of the 16 groups are wasted."), atol=0.05,
          hints=[_near({
              2.074: N_("a group whose completions are all wrong carries no gradient either: add 0.4⁴"),
              0.41: N_("a group whose completions are all right carries no gradient either: add 0.6⁴"),
              0.155: N_("that is the chance for one group; the question asks how many of the 16"),
              13.517: N_("that counts the groups with a signal; the question asks for those without"),
          }, atol=0.05)])
def wasted_groups() -> float:
    """Expected number of groups with zero advantages among 16 prompts, G = 4, each completion right with 0.6."""
    return round(16 * (0.6 ** 4 + 0.4 ** 4), 3)


@question(explain=N_("GRPO samples during training and scores each sample with a reward (here a program); DPO learns "
                     "from fixed preference pairs. Both keep a frozen reference, and neither has a value network."),
          hints=[known_wrong({
              "b": N_("both keep a frozen reference: DPO's log-ratios and GRPO's KL penalty are taken against it"),
              "c": N_("preference pairs are what DPO needs; GRPO scores its own samples instead"),
              "d": N_("no value network in either: GRPO's baseline is the group's mean reward"),
          })])
def grpo_needs_choice() -> str:
    """Multiple choice: what GRPO needs during training that DPO does not."""
    return "a"


# ------------------------------------------------------------------ the experiment

EXPERIMENT_G = (2, 4, 8, 16)
EXPERIMENT_SEEDS = (0, 1, 2)
BUDGET, STEPS, STEP_LR, STEP_BETA, MAX_TOKENS = 32, 30, 20.0, 0.04, 4
QUESTIONS, ANSWERS = torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6, 7, 8])


def expected_reward(W: torch.Tensor, questions: torch.Tensor, answers: torch.Tensor, max_tokens: int) -> float:
    """The exact mean reward of the bigram policy W over the questions (each weighted equally): the chance
    that a completion of at most ``max_tokens`` tokens writes its answer and then the stop token (the same
    code as the exercise notebook's helper)."""
    probs = torch.softmax(W.double(), dim=-1)
    total = 0.0
    for q, a in zip(questions.tolist(), answers.tolist(), strict=True):
        state = torch.zeros(W.shape[0], dtype=torch.float64)  # P(the last token written is t, not stopped)
        state[q] = 1.0
        for n in range(max_tokens):
            if n >= 1:
                total += float(state[a] * probs[a, 0])
            state = state @ probs
            state[0] = 0.0
    return total / len(questions)


def _final_reward(G: int, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    W = torch.zeros(9, 9)
    W_ref = W.clone()
    for _step in range(STEPS):
        pick = torch.randint(4, (BUDGET // G,), generator=g)
        u = torch.rand(BUDGET // G, G, MAX_TOKENS, generator=g, dtype=torch.float64)
        _r, W = _step_parts(W, W_ref, QUESTIONS[pick], ANSWERS[pick], u, STEP_LR, STEP_BETA)
    return expected_reward(W, QUESTIONS, ANSWERS, MAX_TOKENS)


@lru_cache(maxsize=1)
def _experiment() -> dict[int, list[float]]:
    with torch_threads(1):
        return {G: [_final_reward(G, seed) for seed in EXPERIMENT_SEEDS] for G in EXPERIMENT_G}


def _g_hint(case: Case, got, expected) -> str | None:
    if not isinstance(got, (tuple, list)) or len(got) != len(EXPERIMENT_G):
        return _("set a tuple of four numbers: the mean over the three seeds for G = 2, 4, 8, 16, in that order")
    runs = _experiment()
    if all(isinstance(v, (int, float)) for v in got):
        for seed_index in range(len(EXPERIMENT_SEEDS)):
            if all(abs(v - runs[G][seed_index]) <= 0.02 for v, G in zip(got, EXPERIMENT_G, strict=True)):
                return _("that is one seed's run; report the mean over seeds 0, 1 and 2")
        if all(abs(v - a) <= 0.02 for v, a in zip(got, reversed(expected), strict=True)):
            return _("the order is G = 2, 4, 8, 16")
    return None


@question(explain=N_("from the uniform table (expected reward 0.033) a group of 2 is all wrong with chance "
                     "(1 − 0.033)² ≈ 0.93: most groups carry no signal, and G = 2 learns least. A larger group holds "
                     "a right answer more often, but a run can leave one question unlearned (two of G = 16's three "
                     "seeds, one of G = 4's and of G = 8's), which pulls its mean down."), atol=0.02,
          hints=[_g_hint])
def g_sweep_rewards() -> tuple[float, float, float, float]:
    """Experiment: the mean over seeds 0-2 of the expected reward after 30 GRPO steps of 32 completions, for
    G = 2, 4, 8, 16 (each rounded to three decimals)."""
    runs = _experiment()
    return tuple(round(statistics.fmean(runs[G]), 3) for G in EXPERIMENT_G)
