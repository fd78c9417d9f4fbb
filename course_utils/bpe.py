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

    kind = "bpe"  # recorded by ``to_dict``; ``tokenizer.load_tokenizer`` dispatches on it

    def __init__(self, merges: Iterable[Sequence[int]] = ()) -> None:
        self.merges: list[tuple[int, int]] = []
        self.vocab: list[bytes] = [bytes([b]) for b in range(N_BYTES)]
        for a, b in merges:
            if not (0 <= a < len(self.vocab) and 0 <= b < len(self.vocab)):
                raise ValueError(f"merge ({a}, {b}) uses a token that does not exist yet; "
                                 "merges must be listed in the order they were learned")
            self.merges.append((int(a), int(b)))
            self.vocab.append(self.vocab[a] + self.vocab[b])
        self.ranks = {pair: k for k, pair in enumerate(self.merges)}  # earlier merges first
        self.merged = {pair: N_BYTES + k for k, pair in enumerate(self.merges)}  # the token each pair becomes
        self.byte_ids: list[int | None] = list(range(N_BYTES))  # the token of each byte value
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
        ids = [t for b in to_bytes(chunk) if (t := self.byte_ids[b]) is not None]  # a byte without a token is dropped
        while len(ids) >= 2:
            # Apply the earliest-learned merge present, exactly as training did.
            pair = min(pairwise(ids), key=lambda p: self.ranks.get(p, float("inf")))
            if pair not in self.ranks:
                break
            ids = merge(ids, pair, self.merged[pair])
        self._cache[chunk] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}; decode bytes first")
        return [t for chunk in self.chunks(text) for t in self._encode_chunk(chunk)]

    def chunks(self, text: str) -> list[str]:
        """The pieces merges stay inside (the module's ``chunks``; a loaded vocabulary has its own)."""
        return chunks(text)

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


# ---------------------------------------------------------------- a vocabulary learned elsewhere

# GPT-2's pre-tokeniser (also SmolLM2's as Hugging Face builds it from a GGUF file): contractions,
# letters (\p{L}), numbers (\p{N}), other symbols, each with at most one leading space, then spaces.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_spelling() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 bytes, in which vocabularies and merges are written.

    Bytes that are visible characters of Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
    themselves; the other 68 (space, control bytes, ...) get the characters from U+0100 on, in
    byte order, so a space is 'Ġ' (U+0120) and a newline 'Ċ' (U+010A).
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in visible}
    for n, b in enumerate(b for b in range(N_BYTES) if b not in spelling):
        spelling[b] = chr(N_BYTES + n)
    return spelling


class PretrainedBPETokenizer(BPETokenizer):
    """A byte-level BPE tokenizer with someone else's vocabulary, merges and pre-tokeniser.

    ``tokens[i]`` is token i written in ``byte_spelling``; ``merges[k]`` is the k-th merge learned,
    two tokens separated by a space ("Ġ t"); ``special`` tokens (e.g. "<|im_start|>") are matched
    whole in the text before anything is split, and never merged. Encoding is the same loop as
    ``BPETokenizer``: the token ids are only numbered differently (the file decides them).
    """

    kind = "bpe_pretrained"

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], special: Sequence[str] = (),
                 pattern: str = GPT2_PATTERN) -> None:
        import regex  # the third-party module: Python's re knows no \p{L}

        spelled = {c: b for b, c in byte_spelling().items()}
        self.tokens = list(tokens)
        self.vocab = []
        for i, token in enumerate(self.tokens):
            if not set(token) <= spelled.keys():
                raise ValueError(f"token {i} ({token!r}) is not written in GPT-2's byte spelling; "
                                 "this is not a byte-level BPE vocabulary")
            self.vocab.append(bytes(spelled[c] for c in token))
        ids = {token: i for i, token in enumerate(self.tokens)}
        # A vocabulary may lack some bytes (SmolLM2 lacks 21: six control characters, bytes that never
        # occur in UTF-8, two lead bytes of rare 4-byte characters). Like Hugging Face's tokenizer,
        # encoding then drops them: such text does not round-trip (``missing_bytes`` lists them).
        self.byte_ids = [ids.get(byte_spelling()[b]) for b in range(N_BYTES)]
        self.merge_strings = list(merges)
        self.merges, self.ranks, self.merged = [], {}, {}
        for k, line in enumerate(self.merge_strings):
            left, _, right = line.partition(" ")
            if left not in ids or right not in ids or left + right not in ids:
                raise ValueError(f"merge {k} ({line!r}) names a token that is not in the vocabulary")
            pair = (ids[left], ids[right])
            self.merges.append(pair)
            self.ranks.setdefault(pair, k)
            self.merged.setdefault(pair, ids[left + right])
        self.special = {s: ids[s] for s in special}
        self.pattern = pattern
        self._split = regex.compile(pattern)
        self._special_split = (regex.compile("(" + "|".join(regex.escape(s) for s in
                                                            sorted(special, key=len, reverse=True)) + ")")
                               if special else None)
        self._cache = {}

    def chunks(self, text: str) -> list[str]:
        """The pre-tokeniser's pieces (special tokens are handled by ``encode`` before this)."""
        return self._split.findall(text)

    def encode(self, text: str) -> list[int]:
        """Text -> token ids; special tokens in the text become their own id."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}; decode bytes first")
        pieces = self._special_split.split(text) if self._special_split else [text]
        ids: list[int] = []
        for i, piece in enumerate(pieces):  # odd positions hold the special tokens the split kept
            if i % 2:
                ids.append(self.special[piece])
            else:
                ids.extend(t for chunk in self.chunks(piece) for t in self._encode_chunk(chunk))
        return ids

    @property
    def missing_bytes(self) -> list[int]:
        """The byte values that have no token, so ``encode`` drops them."""
        return [b for b, t in enumerate(self.byte_ids) if t is None]

    def token_id(self, token: str) -> int:
        """The id of a token written as in the vocabulary, e.g. ``token_id("<|im_end|>")``."""
        try:
            return self.tokens.index(token)
        except ValueError:
            raise KeyError(f"{token!r} is not in the vocabulary") from None

    def to_dict(self) -> dict:
        """Plain strings and lists: the vocabulary, the merges, the special tokens and the pattern."""
        return {"kind": self.kind, "tokens": self.tokens, "merges": self.merge_strings,
                "special": list(self.special), "pattern": self.pattern}

    @classmethod
    def from_dict(cls, state: dict) -> PretrainedBPETokenizer:
        if state.get("kind") != cls.kind:
            raise ValueError(f"not a pretrained BPE tokenizer state (kind={state.get('kind')!r})")
        return cls(state["tokens"], state["merges"], state["special"], state["pattern"])

    def __repr__(self) -> str:
        return f"PretrainedBPETokenizer(vocab_size={self.vocab_size}, special={len(self.special)})"
