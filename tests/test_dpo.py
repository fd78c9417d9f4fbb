"""DPO: the loss on a hand-worked case, its gradient by hand = autograd, two implementations agree,
sequence log-probabilities count only the answer, and a few steps raise the chosen answer."""

import copy
import math

import pytest
import torch

from course_utils import dpo, gpt


def test_hand_worked_case():
    # log π(c) = −2, log π(r) = −3, both −2.5 under the reference, β = 0.5:
    # m = (−2 + 2.5) − (−3 + 2.5) = 1, L = −log σ(0.5) = log(1 + e^−0.5) = 0.474077,
    # dL/d log π(c) = −β σ(−βm) = −0.5 · 0.377541 = −0.188771, and +0.188771 for log π(r).
    pc = torch.tensor([-2.0], requires_grad=True)
    pr = torch.tensor([-3.0], requires_grad=True)
    rc = rr = torch.tensor([-2.5])
    loss = dpo.dpo_loss(pc, pr, rc, rr, beta=0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.5)), abs=1e-6)
    assert loss.item() == pytest.approx(0.474077, abs=1e-6)
    loss.backward()
    assert pc.grad.item() == pytest.approx(-0.188771, abs=1e-6)
    assert pr.grad.item() == pytest.approx(0.188771, abs=1e-6)
    by_hand = dpo.dpo_gradient(pc.detach(), pr.detach(), rc, rr, beta=0.5)
    assert by_hand[0].item() == pytest.approx(pc.grad.item(), abs=1e-7)
    assert by_hand[1].item() == pytest.approx(pr.grad.item(), abs=1e-7)


@pytest.mark.parametrize("beta", [0.05, 0.5, 5.0])
def test_gradient_by_hand_and_second_implementation_equal_autograd(beta):
    g = torch.Generator().manual_seed(0)
    pc, pr, rc, rr = (torch.randn(16, generator=g, dtype=torch.float64) * 4 - 10 for _ in range(4))
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    loss = dpo.dpo_loss(pc, pr, rc, rr, beta)
    d_pc, d_pr = torch.autograd.grad(loss, (pc, pr))
    hand_pc, hand_pr = dpo.dpo_gradient(pc.detach(), pr.detach(), rc, rr, beta)
    torch.testing.assert_close(d_pc, hand_pc, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(d_pr, hand_pr, atol=1e-12, rtol=1e-10)
    second = dpo.dpo_loss_as_classification(pc, pr, rc, rr, beta)
    torch.testing.assert_close(second, loss, atol=1e-12, rtol=1e-10)
    s_pc, s_pr = torch.autograd.grad(second, (pc, pr))
    torch.testing.assert_close(s_pc, d_pc, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(s_pr, d_pr, atol=1e-12, rtol=1e-10)


def test_loss_is_log2_when_policy_equals_reference_and_stable_far_away():
    x = torch.tensor([-5.0, -1.0])
    assert dpo.dpo_loss(x, x.flip(0), x, x.flip(0), beta=0.1).item() == pytest.approx(math.log(2), abs=1e-7)
    far = dpo.dpo_loss(torch.tensor([0.0]), torch.tensor([-1e4]), torch.tensor([0.0]), torch.tensor([0.0]), 1.0)
    assert far.item() == 0.0 and torch.isfinite(far)
    wrong = dpo.dpo_loss(torch.tensor([-1e4]), torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([0.0]), 1.0)
    assert wrong.item() == pytest.approx(1e4)


def test_bad_beta_is_a_one_line_error():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="beta must be positive"):
        dpo.dpo_loss(x, x, x, x, beta=0.0)


def test_sequence_logprobs_sum_only_the_answer():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, 7, generator=g)
    targets = torch.randint(7, (2, 5), generator=g)
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    got = dpo.sequence_logprobs(logits, targets, mask)
    logp = logits.log_softmax(-1)
    expected = [sum(logp[b, t, targets[b, t]].item() for t in range(5) if mask[b, t]) for b in range(2)]
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-6, rtol=0)
    changed = logits.clone()
    changed[:, 0] = 100 * torch.randn(2, 7, generator=g)  # the prompt's predictions do not count
    torch.testing.assert_close(dpo.sequence_logprobs(changed, targets, mask), got)
    with pytest.raises(ValueError, match="must agree on"):
        dpo.sequence_logprobs(logits, targets[:, :4], mask[:, :4])


def test_token_kl_is_zero_for_the_reference_and_positive_otherwise():
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(2, 4, 6, generator=g)
    mask = torch.ones(2, 4, dtype=torch.bool)
    assert dpo.token_kl(ref, ref, mask) == pytest.approx(0.0, abs=1e-7)
    assert dpo.token_kl(ref + torch.randn(2, 4, 6, generator=g), ref, mask) > 0.01


def test_a_few_steps_raise_the_chosen_answer_against_a_frozen_reference():
    torch.manual_seed(0)
    policy = gpt.GPT(gpt.GPTConfig(vocab_size=12, max_len=8, n_layers=1, n_heads=2, d_model=16))
    reference = copy.deepcopy(policy).requires_grad_(False)
    prompt = torch.tensor([[1, 2, 3]] * 4)
    chosen = torch.cat([prompt, torch.tensor([[4, 5]] * 4)], 1)
    rejected = torch.cat([prompt, torch.tensor([[6, 7]] * 4)], 1)
    mask = torch.tensor([[0, 0, 1, 1]] * 4, dtype=torch.bool)  # the answer's two tokens, shifted by one

    def logps(model, seq):
        return dpo.sequence_logprobs(model(seq[:, :-1])[0], seq[:, 1:], mask)

    with torch.no_grad():
        ref_c, ref_r = logps(reference, chosen), logps(reference, rejected)
    before = dpo.preference_report(logps(policy, chosen), logps(policy, rejected), ref_c, ref_r, 0.5)
    assert before["reward_margin"] == pytest.approx(0.0, abs=1e-6)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    for _ in range(10):
        loss = dpo.dpo_loss(logps(policy, chosen), logps(policy, rejected), ref_c, ref_r, beta=0.5)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = dpo.preference_report(logps(policy, chosen), logps(policy, rejected), ref_c, ref_r, 0.5)
    assert after["reward_accuracy"] == 1.0 and after["reward_margin"] > 1.0
    # the margin is the two log-ratios' difference, each reported on its own
    difference = after["chosen_logratio"] - after["rejected_logratio"]
    assert after["reward_margin"] == pytest.approx(0.5 * difference, rel=1e-5)
    assert all(not p.requires_grad for p in reference.parameters())
