"""Byte-level byte-pair encoding (BPE), trained from scratch.

Text is turned into UTF-8 bytes (256 base tokens, so nothing is ever unknown), then the most
frequent adjacent pair of tokens is merged into a new token, again and again, until the
vocabulary has the requested size. As in GPT-2, the text is first cut into chunks (words, numbers,
punctuation, spaces) and merges never cross a chunk boundary, so " the" can become one token but
"e t" cannot.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise

N_BYTES = 256

# Every character falls into exactly one branch: an English contraction, letters, digits (at
# most three in a row), other symbols (punctuation, marks, "_"), or whitespace; a single leading
# space sticks to the chunk that follows it.
CHUNK = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[^\W\d_]+| ?\d{1,3}| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+")


def to_bytes(text: str) -> bytes:
    """UTF-8 bytes of ``text``; lone surrogates (legal in Python strings) pass through, so any
    string round-trips."""
    return text.encode("utf-8", errors="surrogatepass")


def chunks(text: str) -> list[str]:
    """Cut text into the pieces that merges stay inside; ``"".join(chunks(t)) == t``."""
    return CHUNK.findall(text)


def pair_counts(ids: Sequence[int], counts: Counter | None = None, weight: int = 1) -> Counter:
    """Count adjacent pairs in ``ids`` (adding ``weight`` per occurrence to ``counts``)."""
    counts = Counter() if counts is None else counts
    for pair in pairwise(ids):
        counts[pair] += weight
    return counts


def merge(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``ids`` (left to right, no overlaps) by ``new_id``."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _best_pair(counts: dict[tuple[int, int], int]) -> tuple[int, int]:
    # Highest count wins; ties go to the smallest pair, so training is deterministic.
    return min(counts, key=lambda p: (-counts[p], p))


class BPETokenizer:
    """A byte-level BPE tokenizer: ``merges[k]`` is the pair that became token ``256 + k``."""

    kind = "bpe"  # recorded by ``to_dict``; ``tokenize.load_tokenizer`` dispatches on it

    def __init__(self, merges: Iterable[Sequence[int]] = ()) -> None:
        self.merges: list[tuple[int, int]] = []
        self.vocab: list[bytes] = [bytes([b]) for b in range(N_BYTES)]
        for a, b in merges:
            if not (0 <= a < len(self.vocab) and 0 <= b < len(self.vocab)):
                raise ValueError(f"merge ({a}, {b}) uses a token that does not exist yet; "
                                 "merges must be listed in the order they were learned")
            self.merges.append((int(a), int(b)))
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.ranks = {pair: N_BYTES + k for k, pair in enumerate(self.merges)}
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def train(cls, text: str, vocab_size: int, verbose: bool = False) -> BPETokenizer:
        """Learn ``vocab_size - 256`` merges from ``text``. Stops early (smaller vocabulary) only
        when no chunk has two tokens left to merge."""
        if vocab_size < N_BYTES:
            raise ValueError(f"vocab_size={vocab_size} is below the {N_BYTES} byte tokens; "
                             f"ask for at least {N_BYTES}")
        freq = Counter(chunks(text))
        words = [list(to_bytes(w)) for w in freq]
        weights = list(freq.values())
        counts: Counter = Counter()
        where: dict[tuple[int, int], set[int]] = {}
        for i, ids in enumerate(words):
            pair_counts(ids, counts, weights[i])
            for pair in pairwise(ids):
                where.setdefault(pair, set()).add(i)
        merges = []
        for new_id in range(N_BYTES, vocab_size):
            counts = +counts  # drop pairs whose count fell to zero
            if not counts:
                break
            pair = _best_pair(counts)
            merges.append(pair)
            if verbose and (new_id - N_BYTES) % 100 == 0:
                print(f"merge {new_id - N_BYTES}: {pair} -> {new_id} (count {counts[pair]})")
            # Only the words that contain the pair change: remove their old pairs, add the new.
            for i in where.pop(pair):
                old = words[i]
                for p in pairwise(old):
                    counts[p] -= weights[i]
                words[i] = merge(old, pair, new_id)
                for p in pairwise(words[i]):
                    counts[p] += weights[i]
                    where.setdefault(p, set()).add(i)
        return cls(merges)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _encode_chunk(self, chunk: str) -> list[int]:
        if chunk in self._cache:
            return self._cache[chunk]
        ids = list(to_bytes(chunk))
        while len(ids) >= 2:
            # Apply the earliest-learned merge present, exactly as training did.
            pair = min(pairwise(ids), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break
            ids = merge(ids, pair, self.ranks[pair])
        self._cache[chunk] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}; decode bytes first")
        return [t for chunk in chunks(text) for t in self._encode_chunk(chunk)]

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text. Ids that split a character in the middle decode to U+FFFD."""
        data = b"".join(self.token_bytes(int(t)) for t in ids)
        try:
            return data.decode("utf-8", errors="surrogatepass")
        except UnicodeDecodeError:
            return data.decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for."""
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"token {token} is outside the vocabulary 0..{self.vocab_size - 1}")
        return self.vocab[token]

    def compression_ratio(self, text: str) -> float:
        """UTF-8 bytes per token on ``text`` (1.0 = no compression)."""
        ids = self.encode(text)
        return len(to_bytes(text)) / max(len(ids), 1)

    def to_dict(self) -> dict:
        """Plain lists only, so a checkpoint holding it loads with ``torch.load(weights_only=True)``."""
        return {"kind": self.kind, "merges": [list(p) for p in self.merges]}

    @classmethod
    def from_dict(cls, state: dict) -> BPETokenizer:
        """The tokenizer that ``to_dict`` described."""
        if state.get("kind") != cls.kind:
            raise ValueError(f"not a BPE tokenizer state (kind={state.get('kind')!r})")
        return cls(state["merges"])

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"
