"""Tokenizers: text to token ids and back.

A *token* (토큰) is the unit a model reads. Lesson 01 uses words: ``words`` lower-cases the text
and keeps runs of letters, so "Love's" and "love's" are one token and punctuation, digits and
line breaks separate words. Apostrophes *inside* a word are kept ("o'er", "ne'er", "i'll"), since
Early Modern English spells many words that way; a leading or trailing apostrophe is a quote mark
and is dropped. ``Vocab`` numbers the words that occur often enough. Lesson 08 reads characters
instead (``CharTokenizer``) or byte-pair pieces (``BPETokenizer``, from ``course_utils.bpe``).

Both of those follow one interface, ``Tokenizer``: ``encode``, ``decode``, ``vocab_size``, and
``to_dict()`` -> plain lists and strings tagged with the tokenizer's ``kind``, which is what a
checkpoint stores; ``load_tokenizer(state)`` rebuilds the right class from that ``kind``.

The module is ``tokenizer``, not ``tokenize``: a file named like a standard-library module would be
imported in its place by any script run from inside this folder.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from course_utils.bpe import BPETokenizer, PretrainedBPETokenizer

__all__ = ["CharTokenizer", "Tokenizer", "Vocab", "load_tokenizer", "sentences", "words"]

WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
SENTENCE_END = re.compile(r"[.!?]+|\n\s*\n")


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``: letters with inner apostrophes; everything else separates."""
    return [w.replace("’", "'") for w in WORD.findall(text.lower())]


def sentences(text: str) -> list[list[str]]:
    """``text`` split at ``.``, ``!``, ``?`` and blank lines, each piece as a list of ``words``.

    Context windows should not run across sentences; empty pieces are dropped. In a play this
    also makes each speaker's name ("COUNTESS.") a sentence of its own, away from the speech.
    """
    pieces = (words(piece) for piece in SENTENCE_END.split(text))
    return [piece for piece in pieces if piece]


class Vocab:
    """Token ↔ id for the tokens seen at least ``min_count`` times, most frequent first.

    ``unk`` (e.g. ``"<unk>"``) adds id 0 for every rarer or unseen token; with ``unk=None``
    unknown tokens are an error unless ``encode(..., drop_unknown=True)`` skips them, which is
    what word2vec does. Ties in frequency are broken alphabetically, so ids are reproducible.
    """

    def __init__(self, counts: Counter | dict[str, int], min_count: int = 1, unk: str | None = "<unk>"):
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        if unk is not None and unk in counts:
            raise ValueError(f"the unknown token {unk!r} occurs in the text; pick another unk string")
        kept = sorted(((t, c) for t, c in counts.items() if c >= min_count), key=lambda tc: (-tc[1], tc[0]))
        self.min_count = min_count
        self.unk = unk
        self.itos: list[str] = ([unk] if unk is not None else []) + [t for t, _ in kept]
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}
        dropped = sum(counts.values()) - sum(c for _, c in kept)
        self.counts: list[int] = ([dropped] if unk is not None else []) + [c for _, c in kept]
        if not self.itos:
            raise ValueError(f"no token occurs {min_count} times or more; lower min_count or use more text")

    @classmethod
    def build(cls, tokens: Iterable[str] | Iterable[Sequence[str]], min_count: int = 1,
              unk: str | None = "<unk>") -> Vocab:
        """Count ``tokens`` (a flat list of strings, or a list of sentences) and build the vocabulary."""
        counts: Counter = Counter()
        for item in tokens:
            if isinstance(item, str):
                counts[item] += 1
            else:
                counts.update(item)
        return cls(counts, min_count=min_count, unk=unk)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, min_count={self.min_count}, unk={self.unk!r})"

    def id(self, token: str) -> int:
        """The id of ``token``; the ``unk`` id for unknown tokens, or a KeyError without ``unk``."""
        if token in self.stoi:
            return self.stoi[token]
        if self.unk is not None:
            return 0
        raise KeyError(f"{token!r} is not in the vocabulary (seen fewer than {self.min_count} times?); "
                       "build the Vocab with unk='<unk>' or check `token in vocab` first")

    def token(self, idx: int) -> str:
        """The token with id ``idx``; an IndexError names the valid range."""
        idx = int(idx)
        if not 0 <= idx < len(self.itos):
            raise IndexError(f"token id {idx} is out of range: this vocabulary has ids 0..{len(self) - 1}")
        return self.itos[idx]

    def count(self, token: str) -> int:
        """How often ``token`` occurred in the text the vocabulary was built from (0 if it was dropped)."""
        return self.counts[self.stoi[token]] if token in self.stoi else 0

    def encode(self, tokens: Iterable[str], drop_unknown: bool = False) -> list[int]:
        """Ids of ``tokens``; with ``drop_unknown`` tokens outside the vocabulary are skipped."""
        if drop_unknown:
            return [self.stoi[t] for t in tokens if t in self.stoi]
        return [self.id(t) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` (a list or a 1-D tensor)."""
        return [self.token(i) for i in ids]


@runtime_checkable
class Tokenizer(Protocol):
    """What the trainer and ``course sample`` need from a tokenizer (text <-> ids, and a saved form)."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def to_dict(self) -> dict: ...


class CharTokenizer:
    """One id per distinct character of a text, in sorted order (the char-level GPT of lesson 08)."""

    kind = "char"  # recorded by ``to_dict``; ``load_tokenizer`` dispatches on it

    def __init__(self, text: str):
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to collect its characters from")
        self.chars: list[str] = sorted(set(text))
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> list[int]:
        """The id of every character of ``text``; a character not seen when building is an error."""
        try:
            return [self.stoi[c] for c in text]
        except KeyError as err:
            raise ValueError(f"character {err.args[0]!r} was not in the text this tokenizer was built from; "
                             "build it from a text that contains it") from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` (a list or a 1-D tensor of ints)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"id {i} is out of range: this tokenizer has ids 0..{self.vocab_size - 1}")
            out.append(self.chars[i])
        return "".join(out)

    def to_dict(self) -> dict:
        """Its alphabet as one string, so a checkpoint holding it loads with ``weights_only=True``."""
        return {"kind": self.kind, "chars": "".join(self.chars)}

    @classmethod
    def from_dict(cls, state: dict) -> CharTokenizer:
        """The tokenizer that ``to_dict`` described (the sorted alphabet rebuilds the same ids)."""
        if state.get("kind") != cls.kind:
            raise ValueError(f"not a character tokenizer state (kind={state.get('kind')!r})")
        return cls(state["chars"])


class TokenizerClass(Protocol):
    """A tokenizer class as the registry holds it: it rebuilds its instances from ``to_dict()``."""

    def from_dict(self, state: dict) -> Tokenizer: ...


TOKENIZERS: dict[str, TokenizerClass] = {cls.kind: cls for cls in (CharTokenizer, BPETokenizer, PretrainedBPETokenizer)}


def load_tokenizer(state: dict) -> Tokenizer:
    """Rebuild a tokenizer from its ``to_dict()`` form, choosing the class by the recorded ``kind``."""
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {', '.join(TOKENIZERS)}")
    return TOKENIZERS[kind].from_dict(state)
