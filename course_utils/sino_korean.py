"""Reading numbers aloud in Sino-Korean (한자어 수사), the sequence-to-sequence task of lesson 10.

``read_number(2026) == "이천이십육"``. The rules, as a Korean speaker reads a number:

- digits are grouped by four from the right; the groups are named 만 (10⁴), 억 (10⁸), 조 (10¹²);
- inside a group the places are 천 (1000), 백 (100), 십 (10) and the ones, each read as
  digit + place: 3 → 삼, 30 → 삼십, 300 → 삼백;
- a 1 before 십, 백 or 천 is silent (10 → 십, not 일십), and a 만 group that is exactly 1 is read 만
  (10000 → 만, not 일만); the larger groups keep it (10⁸ → 일억);
- zeros are silent (2006 → 이천육); only the number 0 itself is read 영.

Spacing convention of this course: a space after each 만/억/조 group when more follows
(150003 → "십오만 삼", 123456789 → "일억 이천삼백사십오만 육천칠백팔십구"), no other spaces.
"""

from __future__ import annotations

import random

import torch

from course_utils.encoder_decoder import BOS, EOS, PAD

DIGIT_READINGS = "영일이삼사오육칠팔구"
PLACES = ("", "십", "백", "천")      # inside a group of four digits, ones to thousands
GROUPS = ("", "만", "억", "조")      # groups of four digits, from the right
MAX_NUMBER = 10 ** (4 * len(GROUPS)) - 1
SOURCE_CHARS = "0123456789"
TARGET_CHARS = DIGIT_READINGS + "".join(PLACES + GROUPS) + " "


def _check_number(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_NUMBER:
        raise ValueError(f"read_number takes an int in [0, {MAX_NUMBER:,}] (up to 조), got {n!r}")


def _read_group(digits: str, first: int, skip_lone_one: bool) -> list[tuple[str, int]]:
    """Syllables of one group of up to four digits, each with the index of the digit it reads."""
    out: list[tuple[str, int]] = []
    for i, ch in enumerate(digits):
        place = len(digits) - 1 - i
        d = int(ch)
        if d == 0:
            continue
        silent_one = d == 1 and (place > 0 or skip_lone_one)
        if not silent_one:
            out.append((DIGIT_READINGS[d], first + i))
        if PLACES[place]:
            out.append((PLACES[place], first + i))
    return out


def read_aligned(n: int) -> list[tuple[str, int]]:
    """The reading of ``n`` as (character, source digit index) pairs; a space has index −1.

    A digit syllable points at its digit, a place name (십/백/천) at the digit of that place, a group
    name (만/억/조) at the group's last digit. 2026 → [(이, 0), (천, 0), (이, 2), (십, 2), (육, 3)].
    """
    _check_number(n)
    if n == 0:
        return [(DIGIT_READINGS[0], 0)]
    s = str(n)
    starts = list(range(len(s) % 4 or 4, len(s), 4))
    bounds = list(zip([0, *starts], [*starts, len(s)], strict=True))
    pieces: list[list[tuple[str, int]]] = []
    for k, (a, b) in enumerate(bounds):
        group = len(bounds) - 1 - k
        value = int(s[a:b])
        if value == 0:
            continue
        syllables = _read_group(s[a:b], a, skip_lone_one=(group == 1 and value == 1))
        if GROUPS[group]:
            syllables.append((GROUPS[group], b - 1))
        pieces.append(syllables)
    out = pieces[0]
    for piece in pieces[1:]:
        out = [*out, (" ", -1), *piece]
    return out


def read_number(n: int) -> str:
    """n (0 ≤ n < 10¹⁶) -> its Sino-Korean reading, e.g. 150003 -> "십오만 삼"."""
    return "".join(ch for ch, _ in read_aligned(n))


def read_number_formal(n: int) -> str:
    """The formal reading of 0 ≤ n < 10⁴ used for amounts (on cheques and contracts, 금 일천일백원정):
    a 1 before 천, 백 or 십 is said, 일, instead of being silent, so that no syllable can be
    slipped in later. 1110 -> "일천일백일십", 2026 -> "이천이십육" (the same as ``read_number``)."""
    _check_number(n)
    if n >= 10_000:
        raise ValueError(f"read_number_formal reads numbers below 10,000 (one group), got {n:,}")
    if n == 0:
        return DIGIT_READINGS[0]
    digits = str(n)
    return "".join(DIGIT_READINGS[int(d)] + PLACES[len(digits) - 1 - i]
                   for i, d in enumerate(digits) if d != "0")


def _parse_group(text: str, reading: str) -> int:
    """Value (0..9999) of a group's syllables such as "이천이십육"; a place without a digit means 1."""
    value, digit = 0, None
    for ch in text:
        if ch in DIGIT_READINGS[1:]:
            if digit is not None:
                raise ValueError(f"{reading!r} is not a reading: two digits in a row at {ch!r}")
            digit = DIGIT_READINGS.index(ch)
        elif ch in PLACES[1:]:
            value += (1 if digit is None else digit) * 10 ** PLACES.index(ch)
            digit = None
        else:
            raise ValueError(f"{reading!r} is not a reading: unexpected character {ch!r}")
    return value + (digit or 0)


def parse_reading(reading: str) -> int:
    """The inverse of ``read_number``: "이천이십육" -> 2026. Spaces are ignored."""
    text = reading.replace(" ", "")
    if not text:
        raise ValueError("an empty string is not a reading; 0 is read 영")
    if text == DIGIT_READINGS[0]:
        return 0
    total, rest = 0, text
    for group in (3, 2, 1):
        head, sep, tail = rest.partition(GROUPS[group])
        if sep:
            total += (_parse_group(head, reading) if head else 1) * 10 ** (4 * group)
            rest = tail
    return total + _parse_group(rest, reading)


def numbers_with_digits(n_digits: int) -> range:
    """All numbers written with exactly ``n_digits`` digits (0 counts as one digit)."""
    if n_digits < 1:
        raise ValueError(f"n_digits must be at least 1, got {n_digits}")
    return range(0 if n_digits == 1 else 10 ** (n_digits - 1), 10 ** n_digits)


def sample_numbers(n_per_length: int, digit_lengths: range | list[int], seed: int) -> list[list[int]]:
    """For each digit length, ``n_per_length`` distinct numbers of that length (all of them if fewer
    exist), in random order: lengths are balanced, so short numbers are not drowned out."""
    rng = random.Random(seed)
    out = []
    for n_digits in digit_lengths:
        pool = numbers_with_digits(n_digits)
        out.append(rng.sample(pool, min(n_per_length, len(pool))))
    return out


def split_by_number(n_per_length: int, max_digits: int, fractions: tuple[float, float] = (0.8, 0.1),
                    seed: int = 0) -> dict[str, list[int]]:
    """Train / validation / test numbers with 1..max_digits digits; no number is in two splits.

    Each length is split on its own by ``fractions`` (train, validation; the rest is test), so every
    split holds numbers of every length. Returns ``{"train": [...], "val": [...], "test": [...]}``.
    """
    train_frac, val_frac = fractions
    if not (0 < train_frac and 0 <= val_frac and train_frac + val_frac < 1):
        raise ValueError(f"fractions={fractions} must be positive and leave a share for the test split")
    splits: dict[str, list[int]] = {"train": [], "val": [], "test": []}
    for numbers in sample_numbers(n_per_length, range(1, max_digits + 1), seed):
        a = max(1, round(train_frac * len(numbers)))
        b = a + max(1, round(val_frac * len(numbers)))
        splits["train"] += numbers[:a]
        splits["val"] += numbers[a:b]
        splits["test"] += numbers[b:]
    return splits


SPECIALS = ("<pad>", "<s>", "</s>")
DIRECTIONS = ("read", "write")


class CharVocab:
    """One id per character, after the specials <pad> = 0, <s> = 1 (start) and </s> = 2 (end)."""

    def __init__(self, chars: str) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"the characters {chars!r} contain duplicates")
        self.itos = [*SPECIALS, *chars]
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """text -> ids, optionally framed by <s> ... </s>."""
        unknown = sorted(set(text) - set(self.itos[len(SPECIALS):]))
        if unknown:
            raise ValueError(f"characters {unknown} are not in this vocabulary; "
                             f"it knows {''.join(self.itos[len(SPECIALS):])!r}")
        return [BOS] * bos + [self.stoi[ch] for ch in text] + [EOS] * eos

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        """ids -> text: stops at the first </s>, skips <pad> and <s>."""
        out = []
        for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids):
            if i == EOS:
                break
            if i >= len(SPECIALS):
                out.append(self.itos[i])
        return "".join(out)


DIGIT_VOCAB = CharVocab(SOURCE_CHARS)
HANGUL_VOCAB = CharVocab(TARGET_CHARS)


def pad_right(seqs: list[list[int]]) -> torch.Tensor:
    """Sequences of ids -> (B, L) with <pad> = 0 after each one, L the longest length."""
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [PAD] * (width - len(s)) for s in seqs], dtype=torch.long)


def make_pairs(numbers: list[int], direction: str = "read") -> tuple[torch.Tensor, torch.Tensor]:
    """Source (B, S) and target (B, T) ids for a list of numbers.

    ``"read"``: digits -> <s> reading </s> (2026 -> 이천이십육); ``"write"``: reading -> <s> digits </s>.
    The target keeps its <s> and </s>: the model reads target[:, :-1] and predicts target[:, 1:].
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} is unknown; use 'read' (digits -> Hangul) or 'write'")
    digits = [str(n) for n in numbers]
    readings = [read_number(n) for n in numbers]
    if direction == "read":
        src = [DIGIT_VOCAB.encode(s) for s in digits]
        tgt = [HANGUL_VOCAB.encode(r, bos=True, eos=True) for r in readings]
    else:
        src = [HANGUL_VOCAB.encode(r) for r in readings]
        tgt = [DIGIT_VOCAB.encode(s, bos=True, eos=True) for s in digits]
    return pad_right(src), pad_right(tgt)
