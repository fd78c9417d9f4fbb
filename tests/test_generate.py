import pytest
import torch

from course_utils.attention import ModelKVCache
from course_utils.generate import (
    generate,
    next_token_probs,
    sample_from_probs,
    sample_next,
    top_k_filter,
    top_p_filter,
)

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])


def empirical(logits: torch.Tensor, n: int = 200_000, seed: int = 0, **rules) -> torch.Tensor:
    """Frequencies of each token over n seeded draws from one row of logits."""
    probs = next_token_probs(logits, **rules).expand(n, -1)
    draws = sample_from_probs(probs, torch.Generator().manual_seed(seed))
    return torch.bincount(draws, minlength=logits.shape[-1]).double() / n


def test_top_k_keeps_the_k_largest():
    kept = top_k_filter(LOGITS, 3)
    assert torch.equal(torch.isfinite(kept), torch.tensor([[True, True, True, False, False, False]]))
    assert torch.equal(kept[0, :3], LOGITS[0, :3])
    assert torch.equal(top_k_filter(LOGITS, 100), LOGITS)  # k >= V keeps everything


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.softmax(LOGITS, -1)[0]  # ≈ 0.574, 0.211, 0.128, 0.078, 0.029, 0.004
    p = float(probs[0] + 0.5 * probs[1])  # the threshold falls inside token 1's mass
    kept = torch.isfinite(top_p_filter(LOGITS, p))[0]
    assert kept.tolist() == [True, True, False, False, False, False]
    exact = float(probs[0] + probs[1]) + 1e-6  # just past the sum of the top two: token 2 crosses it
    assert torch.isfinite(top_p_filter(LOGITS, exact))[0].tolist() == [True, True, True, False, False, False]
    assert torch.isfinite(top_p_filter(LOGITS, 1e-9))[0].tolist() == [True] + [False] * 5  # top token survives


def test_top_p_works_in_vocabulary_order():
    shuffled = LOGITS[:, torch.tensor([3, 0, 5, 1, 4, 2])]
    kept = torch.isfinite(top_p_filter(shuffled, 0.7))[0]
    assert kept.tolist() == [False, True, False, True, False, False]


@pytest.mark.parametrize("rules", [
    {"temperature": 1.0},
    {"temperature": 0.5},
    {"temperature": 2.0},
    {"temperature": 1.0, "top_k": 3},
    {"temperature": 1.0, "top_p": 0.8},
    {"temperature": 0.7, "top_k": 4, "top_p": 0.9},
])
def test_sampling_frequencies_match_renormalised_probabilities(rules):
    expected = next_token_probs(LOGITS, **rules)[0].double()
    got = empirical(LOGITS, **rules)
    assert (got - expected).abs().max() < 0.01
    assert bool((got[expected == 0] == 0).all())  # filtered tokens are never drawn


def test_renormalised_probabilities():
    probs = next_token_probs(LOGITS, top_k=2)[0]
    e = LOGITS[0, :2].exp()
    assert torch.allclose(probs[:2], e / e.sum()) and float(probs[2:].sum()) == 0.0
    hot = next_token_probs(LOGITS, temperature=100.0)[0]
    assert float(hot.max() - hot.min()) < 0.01  # high temperature flattens towards uniform


def test_temperature_zero_and_near_zero_are_greedy():
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(1))
    greedy = logits.argmax(-1)
    assert torch.equal(sample_next(logits, temperature=0.0), greedy)
    assert torch.equal(next_token_probs(logits, temperature=0.0).argmax(-1), greedy)
    cold = sample_next(logits, temperature=1e-4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(cold, greedy)


def test_seeded_sampling_is_reproducible():
    logits = torch.randn(8, 30)
    a = sample_next(logits, generator=torch.Generator().manual_seed(5))
    b = sample_next(logits, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, message", [
    ({"top_k": 0}, "top_k must be a positive"),
    ({"top_k": -3}, "top_k must be a positive"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"temperature": -0.1}, "temperature must be >= 0"),
])
def test_invalid_rules_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        next_token_probs(LOGITS, **kwargs)
    with pytest.raises(ValueError, match=message):
        sample_next(LOGITS, **kwargs)


def test_sampling_from_logits_instead_of_probabilities_is_refused():
    with pytest.raises(ValueError, match="softmax"):
        sample_from_probs(LOGITS)


def test_model_cache_grows_per_layer(tiny_gpt):
    model = tiny_gpt()
    cache = ModelKVCache(model.config.n_layers)
    idx = torch.randint(0, 23, (2, 5))
    model(idx, kv_cache=cache)
    assert len(cache) == 5 and all(len(layer) == 5 for layer in cache.layers)
    model(idx[:, :1], kv_cache=cache)
    assert len(cache) == 6
    assert cache[0].k.shape == (2, 4, 6, 8)  # (B, H, T, d_k)


def test_cached_logits_equal_full_forward(tiny_gpt):
    model = tiny_gpt()
    idx = torch.randint(0, 23, (3, 12), generator=torch.Generator().manual_seed(0))
    full, _ = model(idx)
    cache = ModelKVCache(model.config.n_layers)
    first, _ = model(idx[:, :7], kv_cache=cache)
    steps = [model(idx[:, t:t + 1], kv_cache=cache)[0] for t in range(7, 12)]
    stepped = torch.cat([first, *steps], dim=1)
    torch.testing.assert_close(stepped, full, atol=1e-5, rtol=1e-5)


def test_greedy_with_and_without_cache_is_identical(tiny_gpt):
    model = tiny_gpt(1)
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with_cache = generate(model, prompt, 30, temperature=0.0, use_cache=True)
    without = generate(model, prompt, 30, temperature=0.0, use_cache=False)
    assert with_cache.shape == (2, 33)
    assert torch.equal(with_cache, without)
    assert torch.equal(with_cache[:, :3], prompt)


@pytest.mark.parametrize("rules", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 5},
                                   {"temperature": 1.2, "top_p": 0.9}])
def test_seeded_sampling_with_and_without_cache_is_identical(rules, tiny_gpt):
    model = tiny_gpt(2)
    prompt = torch.tensor([[7, 8]])
    a = generate(model, prompt, 20, seed=11, use_cache=True, **rules)
    b = generate(model, prompt, 20, seed=11, use_cache=False, **rules)
    c = generate(model, prompt, 20, seed=12, use_cache=True, **rules)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)  # another seed, another text


def test_generation_past_the_context_slides_the_window(tiny_gpt):
    model = tiny_gpt(3)
    prompt = torch.tensor([[1]])
    a = generate(model, prompt, 50, temperature=0.0, use_cache=True)
    b = generate(model, prompt, 50, temperature=0.0, use_cache=False)
    assert a.shape == (1, 51) and torch.equal(a, b)


def test_stop_token_ends_generation(tiny_gpt):
    model = tiny_gpt(4)
    prompt = torch.tensor([[3, 4]])
    free = generate(model, prompt, 25, temperature=0.0)
    stop = int(free[0, 5])  # the token produced at the 4th step
    stopped = generate(model, prompt, 25, temperature=0.0, stop_token=stop)
    first = int((free[0, 2:] == stop).nonzero()[0]) + 2
    assert torch.equal(stopped[0], free[0, :first + 1])


def test_generate_restores_training_mode_and_checks_input(tiny_gpt):
    model = tiny_gpt().train()
    generate(model, torch.tensor([[1]]), 2)
    assert model.training
    with pytest.raises(ValueError, match=r"idx\[None\]"):
        generate(model, torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, torch.tensor([[1]]), 2, top_p=2.0)


# ------------------------------------------------------------------------ lesson 07 exercises

def test_sampling_exercises_catch_the_classic_mistakes(run_exercise):
    from course_tools.exercises.checks import FAIL
    from course_tools.exercises.references import lesson07 as ex

    def from_logits(logits, temperature, u):  # inverse CDF over logits, not probabilities
        return ex._inverse_cdf(logits / temperature, u) if temperature else logits.argmax(-1)

    result = run_exercise("sample_with_temperature", from_logits)
    assert result.status == FAIL and "softmax" in result.report()
    def drops_crossing_token(logits, p):
        kept = torch.softmax(logits, -1) * ex._kept_without_crossing_token(logits, p)
        return kept / kept.sum(-1, keepdim=True)

    result = run_exercise("top_p_probs", drops_crossing_token)
    assert result.status == FAIL and "carries the sum past p" in result.report()

    def cache_only(q, k_new, v_new, k_cache, v_cache):  # forgot to append the new key and value
        weights = torch.softmax(q @ k_cache.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return weights @ v_cache, torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)

    result = run_exercise("kv_attention_step", cache_only)
    assert result.status == FAIL and "attend to itself" in result.report()
