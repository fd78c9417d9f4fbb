"""SFT batches: the prompt is out of the loss, padding never counts, the loss equals a per-token loop."""

import pytest
import torch
import torch.nn.functional as F

from course_utils import sft


def test_masked_example_marks_only_the_answer():
    ids, mask = sft.masked_example([5, 6, 7], [8, 9])
    assert ids == [5, 6, 7, 8, 9] and mask == [False, False, False, True, True]
    with pytest.raises(ValueError, match="the answer is empty"):
        sft.masked_example([1], [])


def test_collate_shifts_pads_right_and_masks_the_prompt():
    examples = [sft.masked_example([1, 2, 3], [4, 5]), sft.masked_example([1, 2], [6])]
    x, y, mask = sft.collate(examples, pad_id=0)
    assert x.tolist() == [[1, 2, 3, 4], [1, 2, 6, 0]]
    assert y.tolist() == [[2, 3, 4, 5], [2, 6, 0, 0]]
    # position t predicts y[t]: only the answer tokens 4, 5 and 6 are scored
    assert mask.tolist() == [[False, False, True, True], [False, True, False, False]]
    _, _, everything = sft.collate(examples, pad_id=0, mask_prompt=False)
    assert everything.tolist() == [[True, True, True, True], [True, True, False, False]]


def test_masked_loss_equals_the_mean_over_answer_tokens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 7, generator=g)
    y = torch.randint(7, (2, 4), generator=g)
    mask = torch.tensor([[False, False, True, True], [False, True, False, False]])
    per_token = [F.cross_entropy(logits[b, t], y[b, t]) for b in range(2) for t in range(4) if mask[b, t]]
    torch.testing.assert_close(sft.masked_loss(logits, y, mask), torch.stack(per_token).mean())
    changed = logits.clone()
    changed[0, 0] += 50 * torch.randn(7, generator=g)  # a prompt position: no effect
    torch.testing.assert_close(sft.masked_loss(changed, y, mask), sft.masked_loss(logits, y, mask))
    with pytest.raises(ValueError, match="selects no position"):
        sft.masked_loss(logits, y, torch.zeros_like(mask))


@pytest.mark.parametrize("tied", [True, False])
def test_answer_loss_equals_masked_loss_on_the_full_logits(tied):
    from course_utils.gpt import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, max_len=16, n_layers=2, n_heads=2, d_model=32, tie_embeddings=tied)).double()
    examples = [sft.masked_example([1, 2, 3, 4, 5], [6, 7]), sft.masked_example([1, 2], [8, 9, 10, 11])]
    x, y, mask = sft.collate(examples, pad_id=0)
    full = sft.masked_loss(model(x)[0], y, mask)
    full_grads = torch.autograd.grad(full, list(model.parameters()), allow_unused=True)
    cheap = sft.answer_loss(model, x, y, mask)
    cheap_grads = torch.autograd.grad(cheap, list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(cheap, full.float(), rtol=1e-6, atol=1e-7)
    for a, b in zip(cheap_grads, full_grads, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="selects no position"):
        sft.answer_loss(model, x, y, torch.zeros_like(mask))
    with pytest.raises(TypeError, match="needs a course GPT"):
        sft.answer_loss(torch.nn.Linear(2, 2), x, y, mask)
