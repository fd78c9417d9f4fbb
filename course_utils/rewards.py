"""Verifiable rewards: a number computed by checking a completion, not by a learned reward model.

Reinforcement learning from verifiable rewards (DeepSeekMath 2024, DeepSeek-R1 2025) scores each
sampled completion with a program: extract the final answer and compare it with the known one
(exact match), or check that the completion has the required shape (a format reward). Each check
here is a small pure function of strings, so a reward can be read, tested and fooled on purpose: a
reward with a loophole (say, a format reward alone) is what the policy learns to exploit.

``group_rewards`` applies one check to the P·G completions of a group sample (G per prompt, in the
order ``course_utils.grpo.sample_group`` returns them) and gives the (P, G) tensor that
``grpo.group_advantages`` takes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation

import torch

NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
# DeepSeek-R1's template: the reasoning inside <think>…</think>, then the answer inside <answer>…</answer>
THINK_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def last_number(text: str) -> str | None:
    """The last number written in ``text`` ("so 12 + 30 = 42." -> "42"), thousands commas removed;
    None when there is none. A common extractor for arithmetic and GSM8K-style answers."""
    found = NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def tagged(text: str, tag: str = "answer") -> str | None:
    """The stripped content of the last ``<tag>…</tag>`` in ``text``; None without a closed pair."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    return found[-1].strip() if found else None


def same_answer(got: str, expected: str) -> bool:
    """Whether two answers agree: as numbers when both parse ("42.0" and "42"), else as stripped text."""
    try:
        return Decimal(got.strip()) == Decimal(expected.strip())
    except InvalidOperation:
        return got.strip() == expected.strip()


def exact_match(completion: str, answer: str,
                extract: Callable[[str], str | None] = last_number) -> float:
    """1.0 if the answer extracted from ``completion`` equals ``answer`` (``same_answer``), else 0.0;
    0.0 too when nothing can be extracted. ``extract`` picks the final answer out of the text
    (``last_number``, ``tagged``, or ``str.strip`` for a completion that is only the answer)."""
    got = extract(completion)
    return float(got is not None and same_answer(got, answer))


def format_reward(completion: str, pattern: re.Pattern[str] = THINK_ANSWER) -> float:
    """1.0 if the whole completion (stripped) has the required shape ``pattern``, else 0.0.

    It says nothing about correctness: used alone it is the loophole a policy learns to fill with
    any answer, which is why it is added to an answer check, not used instead of one."""
    return float(pattern.fullmatch(completion.strip()) is not None)


def group_rewards(reward: Callable[[str, str], float], completions: Sequence[str],
                  answers: Sequence[str]) -> torch.Tensor:
    """(P, G) rewards: ``reward(completions[i], answers[i // G])`` for P prompts and P·G completions.

    Completion i belongs to prompt i // G (each prompt's G completions side by side), the order of
    ``grpo.sample_group``; ``answers`` holds one answer per prompt."""
    P = len(answers)
    if P == 0 or len(completions) < P or len(completions) % P:
        raise ValueError(f"{len(completions)} completions for {P} answers: give one answer per prompt and "
                         "G completions for each (len(completions) = P·G)")
    G = len(completions) // P
    scores = [reward(text, answers[i // G]) for i, text in enumerate(completions)]
    return torch.tensor(scores, dtype=torch.float32).view(P, G)
