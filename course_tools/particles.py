"""Korean particles that depend on the word before them: 은/는, 이/가, 을/를, 과/와, (으)로.

A Korean translation writes the pair after a placeholder (``{shape}은(는)``) and ``choose`` picks the
form that fits the value filled in, by how that value is read aloud: its last Hangul syllable; a
number in Sino-Korean (16 육 -> 은, 10 십 -> 은, 4 사 -> 는, 1000 천 -> 은); an acronym or a single
letter by the letters' Korean names (GPT 지피티 -> 는, M 엠 -> 은); a code word by its English
ending (Block 블록 -> 을, FeedForward 피드포워드 -> 를, attention 어텐션 -> 은). Brackets and
punctuation at the end are not read: ``(2, 7, 16)`` is read as its last number, ``nn.GELU()`` as GELU.

Written here rather than taken from PyPI: ``tossi`` (BSD, 2017) returns the ambiguous "은(는)"
for any Latin word, ``korean-josa`` treats every Latin word as vowel-final (M -> "M는") and ``pyjosa``
raises on anything but Hangul; the course's values are mostly code names, numbers and shapes.
"""

from __future__ import annotations

import re

# the pair a translation writes -> (form after a final consonant, form after a vowel)
PAIRS = {"은(는)": ("은", "는"), "이(가)": ("이", "가"), "을(를)": ("을", "를"), "과(와)": ("과", "와"),
         "(으)로": ("으로", "로")}
PAIR = re.compile("|".join(re.escape(p) for p in PAIRS))

HANGUL_FIRST, HANGUL_LAST, CODAS = 0xAC00, 0xD7A3, 28
RIEUL = 8  # the index of ㄹ among the final consonants
DIGITS = "영일이삼사오육칠팔구"
POWERS = [(12, "조"), (8, "억"), (4, "만"), (3, "천"), (2, "백"), (1, "십")]  # a round number is read by its unit
# 엘, 엠, 엔, 알: every other letter's Korean name ends in a vowel
LETTERS_WITH_CODA = {"l": "ㄹ", "m": "ㅁ", "n": "ㄴ", "r": "ㄹ"}
READ = re.compile(r"[0-9]+(?:\.[0-9]+)?$|[A-Za-z]+$|[\uac00-\ud7a3]$")
# a stop after one short vowel keeps its consonant: block 블록, input 인풋, step 스텝 (but text 텍스트)
SHORT_VOWEL_STOP = re.compile(r"(?:^|[^aeiou])[aeiou](?:ck|[ktp])$")


def _syllable(char: str) -> tuple[bool, bool]:
    coda = (ord(char) - HANGUL_FIRST) % CODAS
    return coda != 0, coda == RIEUL


def _number(text: str) -> tuple[bool, bool]:
    if "." in text:  # a decimal is read digit by digit after the point
        return _syllable(DIGITS[int(text[-1])])
    digits = text.lstrip("0") or "0"
    zeros = len(digits) - len(digits.rstrip("0"))
    for power, unit in POWERS:
        if zeros >= power:
            return _syllable(unit)
    return _syllable(DIGITS[int(digits[-1])])


def _latin(word: str) -> tuple[bool, bool]:
    if len(word) == 1 or (word.isupper() and len(word) <= 5):  # x, GPT, MLP: read letter by letter
        coda = LETTERS_WITH_CODA.get(word[-1].lower())
        return coda is not None, coda == "ㄹ"
    word = word.lower()
    if word.endswith(("le", "l")):
        return True, True
    if word.endswith(("m", "n", "ng")) or SHORT_VOWEL_STOP.search(word):
        return True, False
    return False, False


def final_consonant(value: str) -> tuple[bool, bool]:
    """(whether ``value`` read aloud in Korean ends in a consonant, whether that consonant is ㄹ)."""
    text = value.rstrip()
    while text and not (text[-1].isalnum() or HANGUL_FIRST <= ord(text[-1]) <= HANGUL_LAST):
        text = text[:-1].rstrip()  # closing brackets, quotes, dots: not read
    found = READ.search(text)
    if not found:
        return False, False
    word = found.group()
    if word[0].isdigit():
        return _number(word)
    if word.isascii():
        return _latin(word)
    return _syllable(word)


def choose(pair: str, value: str) -> str:
    """The form of ``pair`` (a key of ``PAIRS``) that follows ``value``: ``choose("은(는)", "GPT") == "는"``."""
    if pair not in PAIRS:
        raise ValueError(f"unknown particle pair {pair!r}; use one of {', '.join(PAIRS)}")
    after_consonant, after_vowel = PAIRS[pair]
    coda, rieul = final_consonant(value)
    if pair == "(으)로":
        return after_consonant if coda and not rieul else after_vowel
    return after_consonant if coda else after_vowel
