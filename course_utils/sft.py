"""Supervised fine-tuning (SFT) on (prompt, answer) pairs: the loss counts only the answer's tokens.

A chat model is trained on conversations: the prompt (system and user messages, then the header of
the assistant's turn) is given, the answer is what the model must learn to write. The sequence fed
to the model is prompt + answer, and every position predicts the next token as in pretraining, but
the positions that predict a *prompt* token are masked out of the loss: the model is not asked to
learn to write the user's questions, and short answers are not drowned out by long prompts.

Shapes: ``B`` examples, ``T`` positions (the longest example minus one), ``V`` vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from course_utils.gpt import GPT


def masked_example(prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> tuple[list[int], list[bool]]:
    """The ids of prompt + answer and, for each id, whether it is an answer token (True = in the loss)."""
    if not answer_ids:
        raise ValueError("the answer is empty: there is nothing to learn from this pair")
    return [*prompt_ids, *answer_ids], [False] * len(prompt_ids) + [True] * len(answer_ids)


def collate(examples: Sequence[tuple[list[int], list[bool]]], pad_id: int,
            mask_prompt: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of ``masked_example`` outputs -> inputs x (B, T), targets y (B, T), loss mask (B, T).

    y is x shifted by one; mask[b, t] is True where y[b, t] is an answer token (or, with
    ``mask_prompt=False``, any real token, prompt included). Padding goes on the right: under the
    causal mask no real position attends to a later pad, and pads are never in the loss."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    loss_on = torch.zeros(len(examples), width, dtype=torch.bool)
    for b, (seq, answer) in enumerate(examples):
        ids[b, :len(seq)] = torch.tensor(seq)
        loss_on[b, :len(seq)] = torch.tensor(answer) if mask_prompt else True
    return ids[:, :-1], ids[:, 1:], loss_on[:, 1:]


def _require_answers(mask: torch.Tensor) -> None:
    """Refuse a mask (B, T) with no True position: its mean cross-entropy would be NaN."""
    if not mask.any():
        raise ValueError("the mask selects no position; every example needs at least one answer token")


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``targets`` (B, T) under ``logits`` (B, T, V) over the positions where
    ``mask`` (B, T) is True: every answer token of the batch weighs the same."""
    _require_answers(mask)
    return F.cross_entropy(logits[mask].float(), targets[mask])


def answer_loss(model: GPT, x: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``masked_loss(model(x)[0], targets, mask)`` for a course GPT, with logits made only where ``mask``
    (B, T) is True: the unembedding is a (D → V) product per position, and with a large vocabulary and a
    long prompt most of them would be thrown away (SmolLM2: V = 49,152; 12 of 38 positions in lesson 13)."""
    _require_answers(mask)
    if not isinstance(model, GPT):
        raise TypeError(f"answer_loss needs a course GPT (hidden and unembed), got {type(model).__name__}; "
                        "for another model use masked_loss(model(x)[0], targets, mask)")
    return F.cross_entropy(model.unembed(model.hidden(x)[mask]).float(), targets[mask])
