import math

import pytest
import torch
import torch.nn.functional as F

from course_utils import tokenizer
from course_utils import word2vec as w2v
from course_utils.sampling import AliasTable


def test_keep_probabilities_follow_gensims_rule():
    counts = torch.tensor([1000.0, 100.0, 10.0, 1.0])
    sample = 0.01
    keep = w2v.keep_probabilities(counts, sample)
    threshold = sample * counts.sum()
    expected = [min(1.0, (math.sqrt(c / threshold) + 1) * threshold / c) for c in counts.tolist()]
    assert torch.allclose(keep, torch.tensor(expected, dtype=torch.float64))
    assert keep[0] < 0.2 and keep[-1] == 1.0  # the frequent word loses most occurrences
    assert torch.equal(w2v.keep_probabilities(counts, 0.0), torch.ones(4, dtype=torch.float64))


def test_noise_distribution_and_draws():
    counts = torch.tensor([81.0, 16.0, 1.0])
    p = w2v.noise_distribution(counts)
    assert torch.allclose(p, torch.tensor([27.0, 8.0, 1.0], dtype=torch.float64) / 36)
    draws = AliasTable(p).sample((50_000, 4), torch.Generator().manual_seed(0))  # as train_sgns draws
    freq = torch.bincount(draws.flatten(), minlength=3) / draws.numel()
    assert (freq - p).abs().max() < 0.01


def test_noise_table_keeps_every_words_probability_on_a_zipf_vocabulary():
    # the shape of lesson 01's vocabulary: 9,000 words, counts falling as 1/rank, the rarest at 5
    counts = (45_000 / torch.arange(1, 9_001, dtype=torch.float64)).clamp(min=5).round()
    p = w2v.noise_distribution(counts)
    table = AliasTable(p)
    V = len(p)
    rebuilt = table.accept / V + torch.zeros(V, dtype=torch.float64).index_add_(0, table.alias, (1 - table.accept) / V)
    assert ((rebuilt - p).abs() / p).max() < 1e-9  # the rarest words too, not only the frequent ones
    draws = table.sample((400_000, 5), torch.Generator().manual_seed(1))
    freq = torch.bincount(draws.flatten(), minlength=V).double() / draws.numel()
    assert (freq[:10] - p[:10]).abs().max() < 0.002 and abs(float(freq[V // 2:].sum() - p[V // 2:].sum())) < 0.002


def _brute_pairs(ids, sent, window):
    pairs = []
    for o in range(1, window + 1):
        for i in range(len(ids) - o):
            if sent[i] == sent[i + o]:
                pairs.append((ids[i], ids[i + o]))
        for i in range(len(ids) - o):
            if sent[i] == sent[i + o]:
                pairs.append((ids[i + o], ids[i]))
    return pairs


def test_skipgram_pairs_fixed_window_matches_brute_force():
    ids = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    sent = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    c, o = w2v.skipgram_pairs(ids, sent, window=2)
    assert list(zip(c.tolist(), o.tolist(), strict=True)) == _brute_pairs(ids.tolist(), sent.tolist(), 2)
    assert (11, 10) in zip(c.tolist(), o.tolist(), strict=True)
    assert (13, 14) not in zip(c.tolist(), o.tolist(), strict=True)  # a sentence boundary


def test_skipgram_pairs_dynamic_window_is_a_subset_weighted_to_near_words():
    gen = torch.Generator().manual_seed(0)
    n, window = 20_000, 4
    ids = torch.arange(n)
    c, o = w2v.skipgram_pairs(ids, torch.zeros(n, dtype=torch.long), window, gen)
    offsets = (o - c).abs()
    assert offsets.min() == 1 and offsets.max() == window
    share = torch.bincount(offsets, minlength=window + 1)[1:].double() / (2 * n)
    # offset k is used when the sampled reach w >= k: probability (window - k + 1) / window
    expected = torch.tensor([(window - k + 1) / window for k in range(1, window + 1)], dtype=torch.float64)
    assert (share - expected).abs().max() < 0.02


def test_skipgram_pairs_edge_cases_and_errors():
    c, o = w2v.skipgram_pairs(torch.tensor([3]), torch.tensor([0]), 5)
    assert c.numel() == 0 and o.numel() == 0
    with pytest.raises(ValueError, match="equal length"):
        w2v.skipgram_pairs(torch.arange(3), torch.zeros(2, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="window must be at least 1"):
        w2v.skipgram_pairs(torch.arange(3), torch.zeros(3, dtype=torch.long), 0)


def test_sgns_loss_matches_the_formula():
    gen = torch.Generator().manual_seed(1)
    v, u, n = torch.randn(6, 8, generator=gen), torch.randn(6, 8, generator=gen), torch.randn(6, 3, 8, generator=gen)
    got = w2v.sgns_loss(v, u, n)
    sig = torch.sigmoid
    expected = torch.stack([
        -torch.log(sig(u[b] @ v[b])) - sum(torch.log(sig(-(n[b, k] @ v[b]))) for k in range(3))
        for b in range(6)
    ])
    assert got.shape == (6,)
    assert torch.allclose(got, expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"u_noise \(B, K, D\)"):
        w2v.sgns_loss(v, u, n[:, :, :4])


def test_sgd_step_equals_autograd_sgd():
    gen = torch.Generator().manual_seed(2)
    manual = w2v.SkipGram(12, 5, gen)
    manual.out_embed.data.normal_(generator=gen)
    auto = w2v.SkipGram(12, 5)
    auto.load_state_dict(manual.state_dict())
    centre = torch.tensor([0, 1, 1, 3, 0, 7])  # repeated ids: their updates must add up
    context = torch.tensor([2, 2, 5, 4, 1, 0])
    noise = torch.randint(0, 12, (6, 4), generator=gen)
    loss_before = auto(centre, context, noise).mean().item()
    reported = manual.sgd_step(centre, context, noise, lr=0.1)
    auto(centre, context, noise).sum().backward()
    with torch.no_grad():
        for p in auto.parameters():
            p -= 0.1 * p.grad
    assert reported == pytest.approx(loss_before, rel=1e-5)
    assert torch.allclose(manual.in_embed, auto.in_embed, atol=1e-6)
    assert torch.allclose(manual.out_embed, auto.out_embed, atol=1e-6)


def _elementwise_sgd_step(model, centre, context, noise, lr):
    """The SGD step written plainly: fresh tensors, scores as a product and a sum (the step before its bmm)."""
    with torch.no_grad():
        targets = torch.cat([context[:, None], noise], dim=1)
        labels = torch.zeros(targets.shape[1])
        labels[0] = 1.0
        v, u = model.in_embed[centre], model.out_embed[targets]
        scores = (u * v[:, None, :]).sum(-1)
        loss = -F.logsigmoid(scores * (2 * labels - 1)).sum(-1).mean()
        g = torch.sigmoid(scores) - labels
        delta_v = -lr * (g[..., None] * u).sum(1)
        delta_u = -lr * g[..., None] * v[:, None, :]
        model.out_embed.index_add_(0, targets.reshape(-1), delta_u.reshape(-1, u.shape[-1]))
        model.in_embed.index_add_(0, centre, delta_v)
    return float(loss)


@pytest.mark.parametrize("index_dtype", [torch.long, torch.int32])
def test_sgd_step_matches_the_elementwise_step_over_batches_of_changing_shape(index_dtype):
    # sgd_step keeps its blocks between steps; a shorter batch, other K or other dtype must not reuse stale ones
    gen = torch.Generator().manual_seed(5)
    fast = w2v.SkipGram(50, 16, gen)
    fast.out_embed.data.normal_(std=0.3, generator=gen)
    plain = w2v.SkipGram(50, 16)
    plain.load_state_dict(fast.state_dict())
    for B, K in [(64, 5), (64, 5), (17, 5), (64, 5), (64, 2), (1, 3)]:
        centre, context = torch.randint(0, 50, (2, B), generator=gen, dtype=index_dtype)
        noise = torch.randint(0, 50, (B, K), generator=gen, dtype=index_dtype)
        got = fast.sgd_step(centre, context, noise, lr=0.05)
        want = _elementwise_sgd_step(plain, centre.long(), context.long(), noise.long(), lr=0.05)
        assert got == pytest.approx(want, rel=1e-5)
        torch.testing.assert_close(fast.in_embed, plain.in_embed, rtol=0, atol=1e-6)
        torch.testing.assert_close(fast.out_embed, plain.out_embed, rtol=0, atol=1e-6)


def test_sgd_step_writes_into_the_same_blocks_while_the_batch_shape_stays():
    model = w2v.SkipGram(40, 8, torch.Generator().manual_seed(0))
    ids = torch.randint(0, 40, (3, 32), generator=torch.Generator().manual_seed(1))
    model.sgd_step(ids[0], ids[1], ids[2].view(32, 1).repeat(1, 5), lr=0.1)
    first = model._work
    model.sgd_step(ids[1], ids[2], ids[0].view(32, 1).repeat(1, 5), lr=0.1)
    assert model._work is first
    model.sgd_step(ids[1, :7], ids[2, :7], ids[0, :7].view(7, 1).repeat(1, 5), lr=0.1)
    assert model._work is not first and model._work.block.shape == (7 + 7 * 6, 8)


def _toy_vectors():
    words = ["man", "woman", "king", "queen", "apple"]
    vecs = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [-1.0, 0.2, 0.1]])
    return w2v.WordVectors(words, vecs)


def test_word_vectors_neighbours_and_analogy():
    wv = _toy_vectors()
    assert wv.analogy("man", "woman", "king")[0][0] == "queen"
    top = wv.most_similar("king", topn=10)
    assert [w for w, _ in top][:1] == ["queen"] and "king" not in [w for w, _ in top]
    assert len(top) == 4
    assert top[0][1] == pytest.approx(2 / math.sqrt(6), abs=1e-4)
    assert wv.similarity("man", "man") == pytest.approx(1.0)
    assert torch.equal(wv["apple"], torch.tensor([-1.0, 0.2, 0.1]))
    with pytest.raises(KeyError, match="lower min_count"):
        wv["pear"]
    with pytest.raises(ValueError, match="one row per word"):
        w2v.WordVectors(["a"], torch.zeros(2, 3))


def test_read_benchmarks():
    questions = w2v.read_analogies()
    assert len(questions) == 19544
    assert len({q[0] for q in questions}) == 14
    assert questions[0] == ("capital-common-countries", "athens", "greece", "baghdad", "iraq")
    pairs = w2v.read_word_pairs(w2v.benchmark_file("wordsim353.tsv"))
    assert len(pairs) == 353 and pairs[0] == ("love", "sex", 6.77)
    with pytest.raises(ValueError, match="choose one of"):
        w2v.benchmark_file("nope.txt")


@pytest.fixture(scope="module")
def lee_sentences():
    return tokenizer.sentences(w2v.benchmark_file("lee_background.cor").read_text(encoding="utf-8"))


def test_evaluation_matches_gensim(lee_sentences):
    gensim = pytest.importorskip("gensim")
    model = gensim.models.Word2Vec(lee_sentences, vector_size=20, window=3, min_count=2, sg=1, epochs=3,
                                   seed=0, workers=1)
    wv = w2v.WordVectors.from_gensim(model.wv)
    ours = w2v.evaluate_analogies(wv, w2v.read_analogies())
    _, sections = model.wv.evaluate_word_analogies(str(w2v.benchmark_file("questions-words.txt")))
    theirs = {s["section"]: (len(s["correct"]), len(s["correct"]) + len(s["incorrect"])) for s in sections}
    total = theirs.pop("Total accuracy")
    assert sum(ours.total.values()) == total[1] > 50
    assert sum(ours.correct.values()) == total[0]
    for name, (correct, asked) in theirs.items():
        if asked:
            assert ours.section(name) == (correct, asked)
    path = w2v.benchmark_file("wordsim353.tsv")
    rho, n = w2v.evaluate_similarity(wv, w2v.read_word_pairs(path))
    _, (their_rho, _), _ = model.wv.evaluate_word_pairs(str(path))
    assert rho == pytest.approx(their_rho, abs=1e-6)
    assert n > 30


def test_train_is_deterministic_and_learns(lee_sentences):
    config = w2v.Word2VecConfig(dim=8, window=2, min_count=3, epochs=2, batch_size=512, seed=3)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first = w2v.train_sgns(lee_sentences[:1500], config, log_every=10, progress=False)
        assert first.threads == 1 and torch.get_num_threads() == 2  # one thread inside, restored after
    finally:
        torch.set_num_threads(threads_before)
    second = w2v.train_sgns(lee_sentences[:1500], config, log_every=10, progress=False)
    assert torch.equal(first.vectors.vectors, second.vectors.vectors)
    assert first.vectors.vectors.shape == (len(first.vocab), 8)
    assert first.vocab.itos[0] == "the" and first.vocab.count("the") >= 3
    assert len(first.pairs_per_epoch) == 2 and first.seconds > 0
    assert first.losses[-1] < first.losses[0] < 6 * math.log(2) + 1e-3  # starts at (1+K)·log 2


def test_train_and_config_errors():
    with pytest.raises(ValueError, match="tokenizer.sentences"):
        w2v.train_sgns(["to", "be"])
    with pytest.raises(ValueError, match="window must be a positive integer"):
        w2v.Word2VecConfig(window=0)
    with pytest.raises(ValueError, match="min_lr"):
        w2v.Word2VecConfig(lr=0.01, min_lr=0.1)


# --- exercises of lesson 01: references pass, the usual mistakes get a hint that names them ---------


@pytest.mark.parametrize("name", ["one_hot_lookup", "context_pairs", "negative_sampling_loss",
                                  "nearest_neighbours", "analogy_3cosadd"])
def test_exercises_have_at_least_four_cases(name):
    from course_tools.exercises import checks

    assert len(checks.draw(name, 0)) >= 4


def _pairs_with_self(ids, window):
    n = len(ids)
    rows = [(ids[i], ids[j]) for i in range(n) for j in range(max(0, i - window), min(n, i + window + 1))]
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 2)


def _dot_neighbours(E, query, k):
    scores = E @ E[query]
    scores[query] = -math.inf
    return scores.topk(k).indices


def _analogy_without_exclusion(E, a, b, c):
    unit = torch.nn.functional.normalize(E, dim=1)
    return (unit @ (unit[b] - unit[a] + unit[c])).argmax()


@pytest.mark.parametrize("name,fn,words", [
    ("one_hot_lookup", lambda ids, W: torch.nn.functional.one_hot(ids, W.shape[0]).float(), "one-hot matrix"),
    ("one_hot_lookup", lambda ids, W: W[(ids + 1) % W.shape[0]], "off-by-one"),
    ("context_pairs", _pairs_with_self, "not its own context"),
    ("negative_sampling_loss", lambda v, u, n: -(torch.nn.functional.logsigmoid((u * v).sum(-1))
                                                 + torch.nn.functional.logsigmoid(
                                                     torch.einsum("bkd,bd->bk", n, v)).sum(-1)), "σ(-u·v)"),
    ("negative_sampling_loss", lambda v, u, n: w2v.sgns_loss(v, u, n).mean(), "shape (B,)"),
    ("nearest_neighbours", _dot_neighbours, "normalise"),
    ("analogy_3cosadd", _analogy_without_exclusion, "exclude them"),
])
def test_exercise_hints_name_the_mistake(name, fn, words, first_hint):
    assert words in first_hint(name, fn)
