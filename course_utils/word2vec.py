"""word2vec: skip-gram with negative sampling (SGNS), trained in PyTorch, and its evaluation.

Skip-gram learns one dense vector per word by predicting the words around it (Mikolov et al.
2013). For a centre word c and a context word o it raises σ(u_o · v_c) and, for K noise words
n_k drawn from the unigram distribution to the power 0.75, lowers σ(u_{n_k} · v_c):

    loss(c, o) = -log σ(u_o · v_c) - Σ_k log σ(-u_{n_k} · v_c)

``v`` rows live in ``in_embed`` (the word vectors we keep), ``u`` rows in ``out_embed``.
Frequent words are subsampled and the window shrinks at random, as in the original C tool and
in gensim, whose benchmark files (shipped inside the gensim wheel) we evaluate on.
"""

from __future__ import annotations

import importlib.resources
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from course_utils.cpu_threads import torch_threads
from course_utils.sampling import AliasTable
from course_utils.tokenizer import Vocab


@dataclass
class Word2VecConfig:
    """Hyper-parameters; the defaults are those of gensim's ``Word2Vec(sg=1)``."""

    dim: int = 100
    window: int = 5
    negatives: int = 5
    min_count: int = 5
    sample: float = 1e-3
    noise_power: float = 0.75
    epochs: int = 5
    lr: float = 0.025
    min_lr: float = 1e-4
    batch_size: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dim", "window", "negatives", "min_count", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if not 0 < self.min_lr <= self.lr:
            raise ValueError(f"need 0 < min_lr <= lr, got lr={self.lr}, min_lr={self.min_lr}")


# --- sampling --------------------------------------------------------------------------------

def keep_probabilities(counts: torch.Tensor, sample: float = 1e-3) -> torch.Tensor:
    """(V,) probability of keeping each occurrence of a word (word2vec's subsampling).

    A word whose share of the text is f is kept with probability min(1, (√(f/s) + 1) · s/f) for
    s = ``sample`` (gensim's rule), so "the" and "and" lose most occurrences and rare words none.
    ``sample=0`` keeps everything.
    """
    counts = torch.as_tensor(counts, dtype=torch.float64)
    if sample <= 0:
        return torch.ones_like(counts)
    threshold = sample * counts.sum()
    return (((counts / threshold).sqrt() + 1) * threshold / counts.clamp(min=1e-12)).clamp(max=1.0)


def noise_distribution(counts: torch.Tensor, power: float = 0.75) -> torch.Tensor:
    """(V,) probabilities of drawing each word as a negative: count**power, normalised.

    The power 0.75 flattens the unigram distribution, so rare words are drawn more often than
    their frequency alone would give.
    """
    weights = torch.as_tensor(counts, dtype=torch.float64) ** power
    return weights / weights.sum()


def skipgram_pairs(ids: torch.Tensor, sentence: torch.Tensor, window: int,
                   gen: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """All (centre, context) pairs of a token stream: ids (N,), sentence index (N,) -> two (P,).

    Position i pairs with i ± o for o = 1..w_i when both lie in the same sentence. With ``gen``
    the window is dynamic, w_i uniform in 1..window (nearer words are used more often); without
    it every w_i = window. Pairs come ordered by offset, then position.
    """
    if ids.shape != sentence.shape or ids.dim() != 1:
        raise ValueError(f"ids and sentence must be 1-D of equal length, got {tuple(ids.shape)} "
                         f"and {tuple(sentence.shape)}")
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    n = ids.numel()
    if gen is None:
        reach = torch.full((n,), window)
    else:
        reach = torch.randint(1, window + 1, (n,), generator=gen)
    centres, contexts = [], []
    for o in range(1, min(window, n - 1) + 1):
        left, right = slice(0, n - o), slice(o, n)  # positions i and i + o
        same = sentence[left] == sentence[right]
        fwd = same & (reach[left] >= o)  # centre i sees i + o
        bwd = same & (reach[right] >= o)  # centre i + o sees i
        centres += [ids[left][fwd], ids[right][bwd]]
        contexts += [ids[right][fwd], ids[left][bwd]]
    if not centres:
        empty = torch.empty(0, dtype=ids.dtype)
        return empty, empty.clone()
    return torch.cat(centres), torch.cat(contexts)


def epoch_pairs(ids: torch.Tensor, sentence: torch.Tensor, keep: torch.Tensor, window: int,
                gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One epoch's shuffled (centre, context) pairs: subsample the tokens, pair them, shuffle the pairs.

    ids and sentence (N,) as ``encode_sentences`` gives them, keep (V,) from ``keep_probabilities``.
    """
    kept = torch.rand(ids.shape, generator=gen, dtype=torch.float64) < keep[ids]
    centre, context = skipgram_pairs(ids[kept], sentence[kept], window, gen)
    # int32: the same permutation as int64 (the same draws), faster to shuffle and to index with
    order = torch.randperm(centre.numel(), generator=gen, dtype=torch.int32)
    return centre.index_select(0, order), context.index_select(0, order)


# --- the model -------------------------------------------------------------------------------

def sgns_loss(v_centre: torch.Tensor, u_context: torch.Tensor, u_noise: torch.Tensor) -> torch.Tensor:
    """Per-pair SGNS loss: v_centre (B, D), u_context (B, D), u_noise (B, K, D) -> (B,).

    -log σ(u_o · v_c) - Σ_k log σ(-u_k · v_c), written with ``logsigmoid`` to stay finite.
    """
    if v_centre.shape != u_context.shape or u_noise.dim() != 3 or u_noise.shape[::2] != v_centre.shape:
        raise ValueError(f"expected v_centre (B, D), u_context (B, D), u_noise (B, K, D); got "
                         f"{tuple(v_centre.shape)}, {tuple(u_context.shape)}, {tuple(u_noise.shape)}")
    positive = F.logsigmoid((u_context * v_centre).sum(-1))
    negative = F.logsigmoid(-torch.einsum("bkd,bd->bk", u_noise, v_centre)).sum(-1)
    return -(positive + negative)


class SkipGram(nn.Module):
    """Two V×D tables: ``in_embed`` (the word vectors) and ``out_embed`` (used only in training).

    Initialised like gensim: input vectors uniform in [-1/D, 1/D), output vectors zero. Both live
    in one (2, V, D) parameter, ``tables``, so that ``sgd_step`` reads the rows of both with one
    call and adds their changes back with one more; ``in_embed`` and ``out_embed`` are its halves.
    """

    def __init__(self, vocab_size: int, dim: int, gen: torch.Generator | None = None):
        super().__init__()
        tables = torch.zeros(2, vocab_size, dim)
        tables[0] = (torch.rand(vocab_size, dim, generator=gen) * 2 - 1) / dim
        self.tables = nn.Parameter(tables)
        self._work: _Workspace | None = None  # sgd_step's blocks, kept between steps

    @property
    def in_embed(self) -> torch.Tensor:
        """(V, D) the centre words' vectors v, the ones we keep (a view of ``tables``)."""
        return self.tables[0]

    @property
    def out_embed(self) -> torch.Tensor:
        """(V, D) the context words' vectors u (a view of ``tables``)."""
        return self.tables[1]

    def forward(self, centre: torch.Tensor, context: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Per-pair loss for ids centre (B,), context (B,), noise (B, K) -> (B,)."""
        return sgns_loss(self.in_embed[centre], self.out_embed[context], self.out_embed[noise])

    @torch.no_grad()
    def sgd_step(self, centre: torch.Tensor, context: torch.Tensor, noise: torch.Tensor, lr: float) -> float:
        """One SGD step on the summed loss of a batch, with the gradient written out by hand.

        The gradient of the loss w.r.t. a score s = u · v is σ(s) - label, so the step touches
        only the B + B·(K+1) rows in play. It equals ``forward(...).sum().backward()`` followed
        by ``p -= lr * p.grad`` (the tests check this), several times faster: rows are read with
        ``index_select`` and their changes added back with ``index_add_`` (repeated ids add up).
        The step is bound by memory traffic, not arithmetic: it moves (B, 1+K, D) blocks, so it
        makes as few passes over them as it can (the scores come from one ``bmm``, not a product
        and a sum; v's change is a weighted sum of table rows, ``embedding_bag``, so the block of
        u is read once; the rows' changes are written over the rows once they are used up) and as few
        calls as it can (both tables' rows in one read and one write), into blocks it keeps from
        step to step (a fresh block costs page faults every step).
        Returns the mean loss of the batch before the step.
        """
        return self._sgd_step(centre, context, noise, lr)

    def _sgd_step(self, centre: torch.Tensor, context: torch.Tensor, noise: torch.Tensor, lr: float) -> float:
        """``sgd_step`` for a caller already under ``torch.no_grad()`` (the training loop: one context per epoch)."""
        (B, K), (_, V, D) = noise.shape, self.tables.shape
        work = self._workspace(B, K + 1)
        rows = work.rows  # row numbers in the (2V, D) stack of both tables: B centre rows, then B·(1+K) others
        rows[:B] = centre
        targets = rows[B:].view(B, K + 1)
        targets[:, 0] = context  # the context word first, then the noise words
        targets[:, 1:] = noise
        targets += V  # out_embed's rows come after in_embed's
        flat = self.tables.view(2 * V, D)
        both = torch.index_select(flat, 0, rows, out=work.block)
        v, u = both[:B], both[B:].view(B, K + 1, D)  # (B, D) and (B, 1+K, D)
        scores = torch.bmm(v[:, None, :], u.mT, out=work.scores).squeeze(1)  # (B, 1+K): u_o · v_c, u_k · v_c
        loss = F.binary_cross_entropy_with_logits(scores, work.labels.expand(B, K + 1), reduction="sum")  # sgns_loss
        step = torch.sigmoid(scores).sub_(work.labels).mul_(-lr)  # -lr · dloss/dscore = -lr · (σ(s) - label)
        # (B, D): -lr · Σ_k g_k u_k, a weighted sum of table rows; read from the table, so u is read once
        delta_v = F.embedding_bag(targets, flat, per_sample_weights=step, mode="sum")
        torch.mul(step[..., None], v[:, None, :], out=u)  # u's rows now hold their change, -lr · g_k v_c
        v.copy_(delta_v)  # and v's rows theirs
        flat.index_add_(0, rows, both)
        return float(loss) / B

    def _workspace(self, B: int, K1: int) -> _Workspace:
        """The blocks ``sgd_step`` writes into for batches of B pairs with K1 - 1 noise words each."""
        like = self.tables
        key = (B, K1, like.shape[-1], like.device, like.dtype)
        if self._work is None or self._work.key != key:
            self._work = _Workspace(key, B, K1, like)
        return self._work


class _Workspace:
    """Blocks reused by every ``sgd_step`` of one batch shape (its last, shorter batch makes new ones)."""

    def __init__(self, key: tuple, B: int, K1: int, like: torch.Tensor):
        D, device = like.shape[-1], like.device
        self.key = key
        self.rows = torch.empty(B + B * K1, dtype=torch.long, device=device)  # int64: index_add_ is slow with int32
        self.block = torch.empty(B + B * K1, D, dtype=like.dtype, device=device)
        self.scores = torch.empty(B, 1, K1, dtype=like.dtype, device=device)
        self.labels = torch.zeros(K1, dtype=like.dtype, device=device)
        self.labels[0] = 1.0  # 1 for the context word, 0 for the noise words


# --- word vectors ----------------------------------------------------------------------------

class WordVectors:
    """Trained vectors with their words: nearest neighbours, analogies, similarities (cosine)."""

    def __init__(self, words: Sequence[str], vectors: torch.Tensor):
        vectors = torch.as_tensor(vectors, dtype=torch.float32)
        if vectors.dim() != 2 or vectors.shape[0] != len(words):
            raise ValueError(f"need one row per word: {len(words)} words but vectors of shape {tuple(vectors.shape)}")
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.vectors = vectors
        self.unit = F.normalize(vectors, dim=1)

    @classmethod
    def from_gensim(cls, keyed_vectors) -> WordVectors:
        """Wrap a gensim ``KeyedVectors`` (e.g. ``model.wv``) so both are evaluated by the same code."""
        return cls(keyed_vectors.index_to_key, torch.from_numpy(keyed_vectors.vectors.copy()))

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self.index

    def _id(self, word: str) -> int:
        if word not in self.index:
            raise KeyError(f"{word!r} is not in the vocabulary ({len(self)} words, seen at least "
                           "min_count times); check `word in vectors` or lower min_count")
        return self.index[word]

    def __getitem__(self, word: str) -> torch.Tensor:
        """The (D,) vector of ``word``."""
        return self.vectors[self._id(word)]

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of two words."""
        return float(self.unit[self._id(a)] @ self.unit[self._id(b)])

    def most_similar(self, query: str | torch.Tensor, topn: int = 10,
                     exclude: Sequence[str] = ()) -> list[tuple[str, float]]:
        """The ``topn`` words with the highest cosine to a word or a (D,) vector.

        A query word is itself excluded, as are the words in ``exclude``.
        """
        if isinstance(query, str):
            exclude = [*exclude, query]
            query = self[query]
        scores = self.unit @ F.normalize(query.float(), dim=0)
        for word in exclude:
            scores[self._id(word)] = -math.inf
        best = scores.topk(min(topn, len(self) - len(set(exclude))))
        return [(self.words[i], round(float(s), 4)) for s, i in zip(best.values, best.indices, strict=True)]

    def analogy(self, a: str, b: str, c: str, topn: int = 1) -> list[tuple[str, float]]:
        """a : b :: c : ?  by 3CosAdd: the words nearest to unit(b) - unit(a) + unit(c), not a, b, c."""
        target = self.unit[self._id(b)] - self.unit[self._id(a)] + self.unit[self._id(c)]
        return self.most_similar(target, topn=topn, exclude=[a, b, c])


# --- training --------------------------------------------------------------------------------

@dataclass
class SGNSResult:
    """What ``train`` returns: the vectors, the model, the vocabulary, the loss curve and timing."""

    vectors: WordVectors
    model: SkipGram
    vocab: Vocab
    losses: list[float] = field(default_factory=list)  # mean loss per logging interval
    pairs_per_epoch: list[int] = field(default_factory=list)
    seconds: float = 0.0
    threads: int = 1  # PyTorch threads it ran with


def encode_sentences(sentences: Sequence[Sequence[str]], vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the in-vocabulary ids of all sentences: ids (N,) and sentence index (N,)."""
    ids, sid = [], []
    for s, sentence in enumerate(sentences):
        encoded = vocab.encode(sentence, drop_unknown=True)
        ids += encoded
        sid += [s] * len(encoded)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(sid, dtype=torch.long)


def train_sgns(sentences: Sequence[Sequence[str]], config: Word2VecConfig | None = None,
               log_every: int = 200, progress: bool = True, device: torch.device | str = "cpu",
               threads: int | None = 1) -> SGNSResult:
    """Train SGNS on tokenised sentences (lists of words), e.g. ``tokenizer.sentences(text)``.

    Each epoch subsamples the text afresh, builds all (centre, context) pairs with a dynamic
    window, shuffles them, and runs SGD over batches with K fresh negatives per pair. The
    learning rate falls linearly from ``lr`` to ``min_lr`` over all batches, as in word2vec.
    Sampling runs on the CPU with one seeded generator; the model and the steps on ``device``.
    ``threads`` PyTorch threads run it (1, like gensim's one worker; several threads slow down
    badly on a shared machine; None keeps PyTorch's setting); the setting is restored afterwards.
    """
    config = config or Word2VecConfig()
    if not sentences or isinstance(sentences[0], str):
        raise ValueError("train_sgns() takes a list of sentences, each a list of words; "
                         "use course_utils.tokenizer.sentences(text)")
    with torch_threads(threads):
        return _train_sgns(sentences, config, log_every, progress, device)


def _train_sgns(sentences: Sequence[Sequence[str]], config: Word2VecConfig, log_every: int, progress: bool,
                device: torch.device | str) -> SGNSResult:
    threads = torch.get_num_threads()
    gen = torch.Generator().manual_seed(config.seed)
    vocab = Vocab.build(sentences, min_count=config.min_count, unk=None)
    ids, sid = encode_sentences(sentences, vocab)
    counts = torch.tensor(vocab.counts, dtype=torch.float64)
    keep = keep_probabilities(counts, config.sample)
    run = _Run(config, SkipGram(len(vocab), config.dim, gen).to(device),
               AliasTable(noise_distribution(counts, config.noise_power)), gen, log_every)
    start = time.perf_counter()
    bar = tqdm(total=config.epochs, desc="word2vec", unit="epoch", disable=not progress)
    for _ in range(config.epochs):
        centre, context = epoch_pairs(ids, sid, keep, config.window, gen)
        run.epoch(centre.to(device), context.to(device))
        bar.set_postfix(loss=f"{run.losses[-1]:.3f}" if run.losses else "")
        bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    vectors = WordVectors(vocab.itos, run.model.in_embed.detach().cpu().clone())
    return SGNSResult(vectors, run.model, vocab, run.losses, run.pairs_per_epoch, seconds, threads)


@dataclass
class _Run:
    """The state of one training run that outlives an epoch: model, noise sampler, lr schedule, losses."""

    config: Word2VecConfig
    model: SkipGram
    noise: AliasTable
    gen: torch.Generator
    log_every: int
    done: int = 0  # pairs trained on so far
    expected: int = 0  # pairs in the whole run, from the first epoch's count (the lr schedule's length)
    losses: list[float] = field(default_factory=list)  # mean loss per log_every batches
    pairs_per_epoch: list[int] = field(default_factory=list)
    _window: list[float] = field(default_factory=list)

    def epoch(self, centre: torch.Tensor, context: torch.Tensor) -> None:
        """SGD over shuffled pairs (P,), (P,) in batches, each with K fresh noise words per pair."""
        c = self.config
        self.pairs_per_epoch.append(centre.numel())
        self.expected = self.expected or max(1, centre.numel() * c.epochs)
        with torch.no_grad():
            self._batches(centre, context)

    def _batches(self, centre: torch.Tensor, context: torch.Tensor) -> None:
        c = self.config
        for s in range(0, centre.numel(), c.batch_size):
            centre_b, context_b = centre[s:s + c.batch_size], context[s:s + c.batch_size]
            noise = self.noise.sample((centre_b.numel(), c.negatives), self.gen).to(centre.device)
            lr = max(c.min_lr, c.lr - (c.lr - c.min_lr) * self.done / self.expected)
            self._window.append(self.model._sgd_step(centre_b, context_b, noise, lr))
            self.done += centre_b.numel()
            if len(self._window) == self.log_every:
                self.losses.append(sum(self._window) / len(self._window))
                self._window.clear()


# --- evaluation on the benchmarks that ship with gensim --------------------------------------

BENCHMARKS = ("questions-words.txt", "wordsim353.tsv", "simlex999.txt", "lee_background.cor")


def benchmark_file(name: str) -> Path:
    """Path of a file in gensim's ``test/test_data`` (installed with gensim, not copied here)."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}")
    try:
        root = importlib.resources.files("gensim")
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the benchmarks ship with gensim: pip install 'gensim>=4.3,<5'") from None
    path = Path(str(root / "test" / "test_data" / name))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall gensim (pip install --force-reinstall gensim)")
    return path


def read_analogies(path: str | Path | None = None) -> list[tuple[str, str, str, str, str]]:
    """Lower-cased (section, a, b, c, d) questions "a is to b as c is to d" (questions-words.txt)."""
    path = Path(path) if path else benchmark_file("questions-words.txt")
    out, section = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(":"):
            section = line[1:].strip()
        elif line.strip():
            if section is None:
                raise ValueError(f"{path}: a question comes before the first ': section' line")
            a, b, c, d = line.lower().split()
            out.append((section, a, b, c, d))
    return out


def read_word_pairs(path: str | Path) -> list[tuple[str, str, float]]:
    """Lower-cased (word, word, human score) rows of a tab-separated file; '#' lines are comments."""
    path = Path(path)
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            a, b, score = line.split("\t")[:3]
            rows.append((a.lower(), b.lower(), float(score)))
    return rows


@dataclass
class AnalogyScore:
    """Correct and asked questions per section, counting only questions whose 4 words are known."""

    correct: dict[str, int]
    total: dict[str, int]
    skipped: int

    @property
    def accuracy(self) -> float:
        asked = sum(self.total.values())
        return sum(self.correct.values()) / asked if asked else 0.0

    def section(self, name: str) -> tuple[int, int]:
        return self.correct.get(name, 0), self.total.get(name, 0)


def evaluate_analogies(vectors: WordVectors, questions: Sequence[tuple[str, str, str, str, str]],
                       batch_size: int = 1024) -> AnalogyScore:
    """3CosAdd accuracy: is d the nearest word to b - a + c (a, b, c excluded)? Same rule as gensim."""
    known = [q for q in questions if all(w in vectors for w in q[1:])]
    correct: dict[str, int] = {}
    total: dict[str, int] = {}
    for q in known:
        total[q[0]] = total.get(q[0], 0) + 1
        correct.setdefault(q[0], 0)
    for s in range(0, len(known), batch_size):
        chunk = known[s:s + batch_size]
        idx = torch.tensor([[vectors.index[w] for w in q[1:]] for q in chunk])  # (n, 4)
        a, b, c, d = idx.unbind(1)
        scores = (vectors.unit[b] - vectors.unit[a] + vectors.unit[c]) @ vectors.unit.T
        rows = torch.arange(len(chunk))
        for col in (a, b, c):
            scores[rows, col] = -math.inf
        hits = scores.argmax(1) == d
        for q, hit in zip(chunk, hits.tolist(), strict=True):
            correct[q[0]] += int(hit)
    return AnalogyScore(correct, total, len(questions) - len(known))


def evaluate_similarity(vectors: WordVectors, pairs: Sequence[tuple[str, str, float]]) -> tuple[float, int]:
    """Spearman correlation between cosine and human scores on the known pairs; also their number."""
    from scipy.stats import spearmanr

    known = [(a, b, s) for a, b, s in pairs if a in vectors and b in vectors]
    if len(known) < 3:
        raise ValueError(f"only {len(known)} word pairs are in the vocabulary; train on more text")
    cosine = [vectors.similarity(a, b) for a, b, _ in known]
    return float(spearmanr(cosine, [s for *_, s in known]).statistic), len(known)
