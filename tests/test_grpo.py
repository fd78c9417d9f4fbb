"""GRPO: group sampling with the KV cache, verifiable rewards, group advantages, the loss, and parity
with TRL's GRPOTrainer loss on the same per-token log-probabilities."""

import warnings

import pytest
import torch

from course_utils import pretrained
from course_utils.dpo import sequence_logprobs
from course_utils.generate import generate, sample_next
from course_utils.grpo import completion_logprobs, group_advantages, grpo_loss, sample_group
from course_utils.rewards import exact_match, format_reward, group_rewards, last_number, same_answer, tagged

NORMS = ["sequence", "token", "constant"]


@pytest.fixture(scope="module")
def shakespeare():
    """(model, tokenizer) of the course's shipped character-level GPT."""
    return pretrained.load()


def loss_inputs(B=6, T=7, seed=0, spread=0.3):
    """Per-token log-probabilities (B, T) of a policy (with gradients), the sampler's (ratios around
    1, some beyond the clip) and a reference's; advantages (B,) of mixed signs; a ragged mask."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    logp = (old + spread * torch.randn(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    ref = old + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    advantages = torch.randn(B, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[0] = T  # one completion that fills the budget
    mask = torch.arange(T) < lengths[:, None]
    return logp, old, ref, advantages, mask


# --- group advantages ------------------------------------------------------------------------------

def test_group_advantages_standardise_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    A = group_advantages(rewards)
    assert A.shape == (2, 4)
    std0, std1 = (1 / 3) ** 0.5, (2 / 3) ** 0.5  # sample std (n − 1) of each row
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]]) / torch.tensor([[std0], [std1]])
    torch.testing.assert_close(A, expected, rtol=2e-4, atol=0)  # eps = 1e-4 shrinks it a little
    torch.testing.assert_close(A.sum(1), torch.zeros(2), rtol=0, atol=1e-6)  # mean 0 in each group


def test_a_group_with_equal_rewards_has_zero_advantage():
    A = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(A[:2], torch.zeros(2, 3))
    assert bool((A[2] != 0).all())


def test_group_advantages_without_std_scaling_are_centred_rewards():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [5.0, 1.0, 0.0, 2.0]])
    torch.testing.assert_close(group_advantages(rewards, scale=False), rewards - rewards.mean(1, keepdim=True))


@pytest.mark.parametrize("rewards, message", [
    (torch.ones(4), "must be (P, G)"),
    (torch.ones(3, 1), "G >= 2"),
])
def test_group_advantages_reject_bad_input(rewards, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        group_advantages(rewards)


# --- the loss --------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", NORMS)
def test_loss_is_a_scalar_and_its_statistics_are_numbers(norm):
    logp, old, ref, A, mask = loss_inputs()
    loss, stats = grpo_loss(logp, old, ref, A, mask, 0.2, 0.04, norm=norm)
    assert loss.shape == () and loss.requires_grad
    assert set(stats) == {"kl", "clip_fraction"}
    assert stats["kl"] > 0 and 0 < stats["clip_fraction"] < 1


def test_at_ratio_one_without_kl_the_loss_is_minus_the_mean_advantage():
    logp, _, ref, A, mask = loss_inputs()
    loss, stats = grpo_loss(logp, logp.detach(), ref, A, mask, 0.2, 0.0)
    torch.testing.assert_close(loss, -A.mean())
    assert stats["clip_fraction"] == 0.0


def test_the_token_mean_weighs_completions_by_their_length():
    logp, _, _, A, mask = loss_inputs()
    loss, _ = grpo_loss(logp, logp.detach(), None, A, mask, 0.2, 0.0, norm="token")
    n = mask.sum(1).double()
    torch.testing.assert_close(loss, -(A * n).sum() / n.sum())
    loss, _ = grpo_loss(logp, logp.detach(), None, A, mask, 0.2, 0.0, norm="constant", max_tokens=20)
    torch.testing.assert_close(loss, -(A * n).sum() / (len(A) * 20))


@pytest.mark.parametrize("norm", NORMS)
def test_a_masked_token_contributes_nothing(norm):
    logp, old, ref, A, mask = loss_inputs()
    loss, stats = grpo_loss(logp, old, ref, A, mask, 0.2, 0.04, norm=norm)
    loss.backward()
    grad = logp.grad.clone()
    assert bool((grad[~mask] == 0).all()) and bool((grad[mask] != 0).any())
    changed = [x.detach().clone() for x in (logp, old, ref)]
    for x in changed:
        x[~mask] = torch.randn(int((~mask).sum()), dtype=x.dtype) * 5  # other values where the mask is off
    logp2 = changed[0].requires_grad_()
    loss2, stats2 = grpo_loss(logp2, changed[1], changed[2], A, mask, 0.2, 0.04, norm=norm)
    loss2.backward()
    torch.testing.assert_close(loss2, loss, rtol=0, atol=0)
    torch.testing.assert_close(logp2.grad, grad, rtol=0, atol=0)
    assert stats2 == stats


@pytest.mark.parametrize("norm", NORMS)
def test_at_ratio_one_the_gradient_is_reinforces(norm):
    # REINFORCE: minimise −A·log π(token), averaged the same way; the clipped ratio has the same gradient at ρ = 1
    logp, _, _, A, mask = loss_inputs()
    loss, _ = grpo_loss(logp, logp.detach(), None, A, mask, 0.2, 0.0, norm=norm)
    (ours,) = torch.autograd.grad(loss, logp)
    per_token = -A[:, None] * logp * mask
    n = mask.sum(1)
    reinforce = {"sequence": (per_token.sum(1) / n).mean(), "token": per_token.sum() / n.sum(),
                 "constant": per_token.sum() / mask.numel()}[norm]
    (expected,) = torch.autograd.grad(reinforce, logp)
    torch.testing.assert_close(ours, expected, rtol=1e-12, atol=0)


def test_a_clipped_token_gets_no_gradient_and_is_counted():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)).requires_grad_()
    old = torch.log(torch.tensor([[0.5, 0.3, 0.7, 0.3]], dtype=torch.float64))  # ratios 1, 5/3, 5/7, 5/3
    for sign, clipped in ((1.0, [False, True, False, True]), (-1.0, [False, False, True, False])):
        loss, stats = grpo_loss(logp, old, None, torch.tensor([sign], dtype=torch.float64),
                                torch.ones(1, 4, dtype=torch.bool), 0.2, 0.0)
        (grad,) = torch.autograd.grad(loss, logp)
        assert (grad[0] == 0).tolist() == clipped
        assert stats["clip_fraction"] == sum(clipped) / 4


def test_clip_higher_widens_only_the_upper_bound():
    # DAPO's clip-higher: ε = 0.2 below, ε_high = 0.28 above; ratios 1.25 and 0.75
    logp = torch.log(torch.tensor([[1.25, 0.75]], dtype=torch.float64)).requires_grad_()
    old, mask = torch.zeros(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool)
    for sign, clipped in ((1.0, [False, False]), (-1.0, [False, True])):
        loss, stats = grpo_loss(logp, old, None, torch.tensor([sign], dtype=torch.float64), mask, 0.2, 0.0,
                                clip_eps_high=0.28)
        (grad,) = torch.autograd.grad(loss, logp)
        assert (grad[0] == 0).tolist() == clipped and stats["clip_fraction"] == sum(clipped) / 2
    loss, stats = grpo_loss(logp, old, None, torch.tensor([1.0], dtype=torch.float64), mask, 0.2, 0.0)
    assert stats["clip_fraction"] == 0.5  # without clip-higher, 1.25 > 1.2 is clipped


def test_the_kl_term_is_k3_and_never_negative():
    logp, _, ref, A, mask = loss_inputs()
    with_kl, stats = grpo_loss(logp, logp.detach(), ref, A, mask, 0.2, 0.5)
    without, _ = grpo_loss(logp, logp.detach(), ref, A, mask, 0.2, 0.0)
    d = ref - logp.detach()
    k3 = d.exp() - d - 1
    assert bool((k3 >= 0).all())
    torch.testing.assert_close(with_kl - without, 0.5 * ((k3 * mask).sum(1) / mask.sum(1)).mean())
    torch.testing.assert_close(torch.tensor(stats["kl"], dtype=torch.float64), (k3 * mask).sum() / mask.sum())
    _, same = grpo_loss(logp, logp.detach(), logp.detach(), A, mask, 0.2, 0.5)
    assert same["kl"] == 0.0


def test_the_kl_weighted_by_the_ratio_changes_the_gradient_even_at_ratio_one():
    logp, old, ref, A, mask = loss_inputs()
    plain, stats = grpo_loss(logp, old, ref, A, mask, 0.2, 0.5)
    weighted, weighted_stats = grpo_loss(logp, old, ref, A, mask, 0.2, 0.5, kl_importance_weight=True)
    d = ref - logp.detach()
    ratio = (logp.detach() - old).exp()
    k3 = d.exp() - d - 1
    torch.testing.assert_close(weighted - plain, 0.5 * ((k3 * (ratio - 1) * mask).sum(1) / mask.sum(1)).mean())
    torch.testing.assert_close(torch.tensor(weighted_stats["kl"], dtype=torch.float64),
                               (k3 * ratio * mask).sum() / mask.sum())
    at_one = [torch.autograd.grad(grpo_loss(logp, logp.detach(), ref, A, mask, 0.2, 0.5,
                                            kl_importance_weight=w)[0], logp)[0] for w in (False, True)]
    # d(ρ·k3)/d logp = ρ·k3 + ρ·dk3/d logp: at ρ = 1 the extra term is β·k3 per token (normalised)
    torch.testing.assert_close(at_one[1] - at_one[0], 0.5 * k3 * mask / mask.sum(1, keepdim=True) / len(A))


@pytest.mark.parametrize("change, message", [
    ({"old_logp": torch.zeros(6, 6)}, "old_logp has shape (6, 6)"),
    ({"mask": torch.ones(6, 8, dtype=torch.bool)}, "mask has shape (6, 8)"),
    ({"advantages": torch.zeros(3, 2)}, "advantages must be (B,)"),
    ({"ref_logp": None}, "pass ref_logp"),
    ({"norm": "mean"}, "norm must be"),
    ({"norm": "constant", "max_tokens": 3}, "shorter than the completions"),
    ({"clip_eps": 1.5}, "clip_eps must be"),
])
def test_grpo_loss_rejects_bad_input(change, message):
    logp, old, ref, A, mask = loss_inputs()
    args = {"logp": logp, "old_logp": old, "ref_logp": ref, "advantages": A, "mask": mask, "beta": 0.04} | change
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        grpo_loss(**args)


# --- parity with TRL ---------------------------------------------------------------------------------

TRL_NORMS = {"dapo": "token", "grpo": "sequence", "dr_grpo": "constant"}


def trl_trainer(tmp_path, loss_type, kl_weight, beta, epsilon, max_completion_length, G, B):
    """A real GRPOTrainer (TRL's own set-up from its config) around a tiny random model that is never run."""
    trl = pytest.importorskip("trl", reason="the TRL parity test needs trl (pip install trl)")
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    datasets = pytest.importorskip("datasets", reason="trl's GRPOTrainer needs datasets (a dependency of trl)")
    vocab = {"<pad>": 0, "<eos>": 1, "a": 2}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="a")),
                                        pad_token="<pad>", eos_token="<eos>")
    model_dir = tmp_path / "tiny"  # TRL builds its reference model (beta != 0) by loading the policy's path again
    LlamaForCausalLM(LlamaConfig(vocab_size=3, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(model_dir)
    kwargs = {} if loss_type is None else {"loss_type": loss_type}  # None: TRL's default
    if kl_weight is not None:
        kwargs["use_bias_correction_kl"] = kl_weight
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' notice of renamed training arguments
        args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, beta=beta, epsilon=epsilon,
                              max_completion_length=max_completion_length, num_generations=G,
                              per_device_train_batch_size=B, **kwargs)
    trainer = trl.GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=args, train_dataset=datasets.Dataset.from_dict({"prompt": ["a"] * B}),
                              processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets at each step (no accumulation)
    trainer.model.train()  # as Trainer.train does: the loss and its metrics in training mode
    return trl, trainer


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", [None, "grpo", "dr_grpo"])
@pytest.mark.parametrize("kl_weight", [None, False])
def test_equals_trl_grpo_loss_and_gradient(tmp_path, loss_type, kl_weight):
    """TRL's GRPOTrainer._compute_loss on the same per-token log-probabilities: its one call to the model
    (``_get_per_token_logps_and_entropies``) is replaced by ours, so everything after it is TRL's code.
    None: TRL's default (loss type "dapo" and the KL weighted by the ratio in TRL 1.16); "grpo" without
    the weight is DeepSeekMath's form."""
    G, P, T, eps, beta = 4, 2, 7, 0.2, 0.04
    trl, trainer = trl_trainer(tmp_path, loss_type, kl_weight, beta, eps, T, G, G * P)
    norm = TRL_NORMS[trainer.loss_type]  # the defaults are read from TRL, not assumed
    weighted = trainer.args.use_bias_correction_kl
    logp, old, ref, _, mask = loss_inputs(B=G * P, T=T, spread=0.4)
    logp, old, ref = logp.detach().float().requires_grad_(), old.float(), ref.float()
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    A = group_advantages(rewards).view(-1)

    trl_logp = logp.detach().clone().requires_grad_()
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (trl_logp, torch.zeros_like(trl_logp), None)
    inputs = {"prompt_ids": torch.zeros(G * P, 1, dtype=torch.long), "prompt_mask": torch.ones(G * P, 1),
              "completion_ids": torch.zeros(G * P, T, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": A, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": mask.sum()}
    theirs = trainer._compute_loss(trainer.model, inputs)
    theirs.backward()
    ours, stats = grpo_loss(logp, old, ref, A, mask, eps, beta, norm=norm, max_tokens=T,
                            kl_importance_weight=weighted)
    ours.backward()

    metrics = trainer._metrics["train"]
    assert 0 < stats["clip_fraction"] < 1  # the clip is exercised
    loss_diff = (ours - theirs).abs().item()
    grad_diff = (logp.grad - trl_logp.grad).abs().max().item()
    print(f"TRL {trl.__version__} loss_type={trainer.loss_type} use_bias_correction_kl={weighted}: "
          f"max |Δloss| = {loss_diff:.1e}, "
          f"max |Δgrad| = {grad_diff:.1e}")
    assert loss_diff <= 1e-6 and grad_diff <= 1e-7
    assert stats["kl"] == pytest.approx(metrics["kl"][-1], rel=1e-6)
    assert stats["clip_fraction"] == pytest.approx(metrics["clip_ratio/region_mean"][-1], rel=1e-6)


# --- group sampling ----------------------------------------------------------------------------------

def naive_group(model, prompts, G, max_new_tokens, stop_token, seed):
    """The same draws without a KV cache: each step runs every still-writing row from its first token."""
    generator = torch.Generator().manual_seed(seed)
    rows = prompts.repeat_interleave(G, 0).tolist()
    written = [[] for _ in rows]
    running = list(range(len(rows)))
    for _ in range(max_new_tokens):
        logits, _ = model(torch.tensor([rows[r] + written[r] for r in running]))
        nxt = sample_next(logits[:, -1], generator=generator).tolist()
        for r, token in zip(running, nxt, strict=True):
            written[r].append(token)
        running = [r for r, token in zip(running, nxt, strict=True) if token != stop_token]
        if not running:
            break
    return written


def test_sample_group_shapes_mask_and_padding(shakespeare):
    model, tok = shakespeare
    stop = tok.encode("\n")[0]
    prompts = torch.tensor([tok.encode("ROMEO:"), tok.encode("JULIE:")])
    group = sample_group(model, prompts, 4, 40, stop_token=stop, seed=0)
    B, N = group.completions.shape
    assert (B, group.G) == (8, 4) and group.mask.shape == (B, N) and N <= 40
    assert torch.equal(group.prompts, prompts.repeat_interleave(4, 0))
    lengths = group.mask.sum(1)
    assert int(lengths.max()) == N and len(set(lengths.tolist())) > 1  # rows stopped at different steps
    for row, m, n in zip(group.completions, group.mask, lengths.tolist(), strict=True):
        assert bool(m[:n].all())  # the mask is True on a prefix
        assert row[n - 1] == stop or n == 40  # a row either stopped or used the whole budget
        assert bool((row[n:] == stop).all())  # padding after the stop token
        assert stop not in row[: n - 1].tolist()
    texts = [tok.decode(ids) for ids in group.token_lists()]
    assert [len(tok.encode(t)) for t in texts] == [n - int(row[n - 1] == stop) for row, n in
                                                  zip(group.completions, lengths.tolist(), strict=True)]
    assert not any("\n" in t for t in texts)


def test_sample_group_equals_the_same_draws_without_a_cache(shakespeare):
    model, tok = shakespeare
    stop = tok.encode("\n")[0]
    prompts = torch.tensor([tok.encode("ROMEO:"), tok.encode("JULIE:"), tok.encode("KING R")])
    group = sample_group(model, prompts, 3, 30, stop_token=stop, seed=1)
    expected = naive_group(model, prompts, 3, 30, stop, seed=1)
    assert [row[m].tolist() for row, m in zip(group.completions, group.mask, strict=True)] == expected
    assert len({len(e) for e in expected}) > 1


def test_one_completion_of_one_prompt_equals_generate(shakespeare):
    model, tok = shakespeare
    stop = tok.encode("\n")[0]
    prompt = torch.tensor([tok.encode("ROMEO:")])
    group = sample_group(model, prompt, 1, 40, stop_token=stop, seed=0)
    out = generate(model, prompt, 40, seed=0, stop_token=stop)[:, prompt.shape[1]:]
    assert out.shape[1] > 5 and torch.equal(group.completions, out)


def test_greedy_groups_equal_generate_row_by_row(shakespeare):
    model, tok = shakespeare
    stop = tok.encode("e")[0]  # greedy text reaches an "e" after a few steps, at different steps per prompt
    prompts = [tok.encode(p) for p in ("KING:", "First", "BRUTU")]
    group = sample_group(model, torch.tensor(prompts), 2, 20, stop_token=stop, temperature=0)
    lengths = []
    for i, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), 20, temperature=0, stop_token=stop)[0, len(prompt):]
        for row in (2 * i, 2 * i + 1):
            got = group.completions[row][group.mask[row]]
            assert torch.equal(got, alone[: len(got)]) and (got[-1] == stop or len(got) == 20)
            lengths.append(len(got))
    assert len(set(lengths)) > 1


def test_sample_group_leaves_the_model_in_its_mode_and_is_seeded(shakespeare):
    model, tok = shakespeare
    prompts = torch.tensor([tok.encode("ROMEO:")])
    model.train()
    try:
        a = sample_group(model, prompts, 3, 10, seed=5)
        assert model.training
    finally:
        model.eval()
    b = sample_group(model, prompts, 3, 10, seed=5)
    assert torch.equal(a.completions, b.completions) and bool(a.mask.all()) and a.completions.shape == (3, 10)


@pytest.mark.parametrize("prompts, G, n, message", [
    (torch.tensor([1, 2, 3]), 2, 5, "must be (P, T)"),
    (torch.tensor([[1.0, 2.0]]), 2, 5, "integer token ids"),
    (torch.tensor([[1, 2]]), 0, 5, "G must be >= 1"),
    (torch.tensor([[1, 2]]), 2, 0, "max_new_tokens must be >= 1"),
    (torch.tensor([[1, 2]]), 2, 200, "exceed the context of 128"),
])
def test_sample_group_rejects_bad_input(shakespeare, prompts, G, n, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sample_group(shakespeare[0], prompts, G, n)


def test_completion_logprobs_sum_to_the_sequence_logprob(shakespeare):
    model, tok = shakespeare
    prompts = torch.tensor([tok.encode("ROMEO:"), tok.encode("JULIE:")])
    group = sample_group(model, prompts, 2, 12, stop_token=tok.encode("\n")[0], seed=0)
    logp = completion_logprobs(model, group.prompts, group.completions)
    assert logp.shape == group.completions.shape and logp.requires_grad
    ids = torch.cat([group.prompts, group.completions], 1)
    logits, _ = model(ids[:, :-1])
    answer = torch.zeros_like(ids[:, 1:], dtype=torch.bool)
    answer[:, prompts.shape[1] - 1:] = group.mask
    torch.testing.assert_close((logp * group.mask).sum(1), sequence_logprobs(logits, ids[:, 1:], answer))
    hot = completion_logprobs(model, group.prompts, group.completions, temperature=2.0)
    assert not torch.allclose(hot, logp)
    with pytest.raises(ValueError, match="same B"):
        completion_logprobs(model, group.prompts[:1], group.completions)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        completion_logprobs(model, group.prompts, group.completions, temperature=0)


# --- rewards -------------------------------------------------------------------------------------------

def test_answer_extractors():
    assert last_number("12 + 30 = 42.") == "42"
    assert last_number("a total of 1,234 apples, -3.5 left") == "-3.5"
    assert last_number("about 1,234 apples") == "1234"
    assert last_number("no digits") is None
    assert tagged("<think>4?</think><answer> 5 </answer> <answer>6</answer>") == "6"
    assert tagged("<answer>5") is None


def test_exact_match_checks_the_extracted_answer():
    assert exact_match("so the answer is 42", "42") == 1.0
    assert exact_match("42, or rather 41", "42") == 0.0  # the last number is the answer
    assert exact_match("it is 42.0", "42") == 1.0 and same_answer("042", "42")
    assert exact_match("no number", "42") == 0.0
    assert exact_match("<answer>Paris</answer>", "Paris", extract=tagged) == 1.0
    assert exact_match(" 이십삼 ", "이십삼", extract=str.strip) == 1.0
    assert exact_match("이십사", "이십삼", extract=str.strip) == 0.0


def test_format_reward_checks_the_shape_not_the_answer():
    assert format_reward("<think>6 times 7</think>\n<answer>41</answer>") == 1.0  # wrong, well formed
    assert format_reward("<answer>42</answer>") == 0.0
    assert format_reward("<think>x</think><answer>42</answer> and more") == 0.0


def test_group_rewards_are_one_row_per_prompt():
    completions = ["1", "2", "2", "3", "5", "5"]
    rewards = group_rewards(exact_match, completions, ["2", "5"])
    assert rewards.tolist() == [[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]]
    with pytest.raises(ValueError, match="one answer per prompt"):
        group_rewards(exact_match, completions, ["2", "5", "1", "1"])
