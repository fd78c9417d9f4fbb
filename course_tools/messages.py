"""The learner's language, and what the checks say in it.

The English of every message stays where it is written (``checks``, ``references/lessonNN.py``,
``predict``, the grader); its translation comes from ``translations/<lang>/messages/*.yaml``, which
``course translate <lang>`` compiles into ``course_tools/messages_<lang>.json`` beside this module
(so a learner's kernel needs no YAML reader). A message is found by its English:

- a plain sentence by its text;
- a sentence written as an f-string (a hint naming the axis it found) by its template, the f-string
  with each ``{expression}`` kept as a placeholder: the filled English is matched against it, and the
  placeholders' values are put into the translated template (each value translated too, when it is
  itself a known message);
- a template of the course's own code (``fill("why: {why}", why=...)``) directly.

A message without a translation stays English. The language is chosen by the notebook: a Korean
edition's setup cell calls ``use("ko")`` (``course translate ko`` adds that line); the grader reads
the submission's metadata and grades inside ``speaking(lang)``, which holds for one thread only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from pathlib import Path

LANGUAGES = ("en", "ko")  # the editions that exist; English is the source language
SOURCE = "en"
HERE = Path(__file__).resolve().parent
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{[^{}]+\}")
_DEPTH = 3  # how deep values inside values are translated ("expected a {tensor of shape (2, 3)}, ...")
LONGEST = 2000  # characters: a longer text is no message (it holds an answer's repr) and is not matched

_chosen = SOURCE  # the kernel's language, set by use() (a notebook's cells do not share a context)
_override: ContextVar[str | None] = ContextVar("course_language", default=None)  # speaking(), per thread


def known(lang: object) -> str:
    """``lang`` if it names an edition, else English: for values read from a submission's metadata."""
    return lang if isinstance(lang, str) and lang in LANGUAGES else SOURCE


def use(lang: str) -> None:
    """Answer in ``lang`` from now on in this process (a Korean notebook's setup cell calls ``use("ko")``)."""
    global _chosen
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}; use one of {', '.join(LANGUAGES)}")
    _chosen = lang


def current() -> str:
    """The language messages are given in now."""
    return _override.get() or _chosen


@contextmanager
def speaking(lang: str) -> Iterator[None]:
    """Give messages in ``lang`` inside the block, in this thread only (the grader, one submission each)."""
    token = _override.set(known(lang))
    try:
        yield
    finally:
        _override.reset(token)


def catalogue_path(lang: str) -> Path:
    return HERE / f"messages_{lang}.json"


def parts(template: str) -> list[tuple[bool, str]]:
    """A template as (is_placeholder, text) pieces; ``{{`` and ``}}`` are literal braces."""
    pieces, at = [], 0
    for m in PLACEHOLDER.finditer(template):
        pieces.append((False, template[at:m.start()]))
        token = m.group()
        pieces.append((False, token[0]) if token in ("{{", "}}") else (True, token))
        at = m.end()
    pieces.append((False, template[at:]))
    return [(p, t) for p, t in pieces if t]


def placeholders(template: str) -> list[str]:
    return [text for is_placeholder, text in parts(template) if is_placeholder]


def literal(template: str) -> str:
    """The text of a template outside its placeholders."""
    return "".join(text for is_placeholder, text in parts(template) if not is_placeholder)


def plain(template: str) -> str:
    """The text of a template without placeholders (its literal braces undoubled)."""
    return "".join(text for _, text in parts(template))


def _substitute(template: str, values: dict[str, str]) -> str:
    return "".join(values.get(text, text) if is_placeholder else text for is_placeholder, text in parts(template))


NUMBER = r"[-+]?(?:\d[\d,._]*(?:[eE][-+]?\d+)?|inf|nan)"
TUPLE = r"\([^()]*\)"


def _value_pattern(placeholder: str) -> str:
    """What a placeholder's value can look like, from its expression: a number where it is formatted
    as one or counted, a tuple where it is a shape, a name where it is a type's name, else any text."""
    body = placeholder[1:-1]
    expression, _, spec = body.partition(":")
    if spec.rstrip("0123456789.,").endswith(("g", "f", "d", "e")) or \
            expression.startswith(("len(", "int(", "float(", "round(")):
        return NUMBER
    if expression.startswith("tuple(") or expression.endswith(".shape"):
        return TUPLE
    if expression.endswith("__name__"):
        return r"[A-Za-z_]\w*"
    return ".+?"


class Catalogue:
    """One language's messages: English template -> translated template.

    ``filled`` names the templates that the code fills itself (``fill``): they are looked up by their
    template; the others (plain messages and f-strings) are found by their text. ``lines=True``
    (for stored outputs, which hold filled templates) matches the former by their text too."""

    def __init__(self, templates: dict[str, str], filled: frozenset[str] = frozenset(), lines: bool = False) -> None:
        self.templates = templates
        self.exact = {plain(en): plain(tr) for en, tr in templates.items() if not placeholders(en)}
        self.patterns = []
        for en, tr in templates.items():
            if placeholders(en) and (lines or en not in filled):
                regex, seen = [], {}
                for is_placeholder, text in parts(en):
                    if not is_placeholder:
                        regex.append(re.escape(text))
                    elif text in seen:
                        regex.append(f"(?:(?P={seen[text]}))")
                    else:
                        seen[text] = f"p{len(seen)}"
                        regex.append(f"(?P<{seen[text]}>{_value_pattern(text)})")
                self.patterns.append((re.compile("".join(regex), re.S), seen, tr, len(literal(en))))
        self.patterns.sort(key=lambda p: -p[3])  # most specific first: "measured: {m}: right", then "measured: {m}"

    def say(self, text: str, depth: int = 0) -> str:
        if text in self.exact:
            return self.exact[text]
        for regex, names, translated, _ in self.patterns if depth < _DEPTH and len(text) <= LONGEST else ():
            m = regex.fullmatch(text)
            if m:
                values = {name: self.say(m.group(group), depth + 1) for name, group in names.items()}
                return _substitute(translated, values)
        return text


def load(lang: str, lines: bool = False) -> Catalogue:
    """The compiled messages of ``lang`` (empty for English, or when none were built)."""
    path = catalogue_path(lang)
    if lang == SOURCE or not path.exists():
        return Catalogue({})
    data = json.loads(path.read_text(encoding="utf-8"))
    return Catalogue(data["messages"], frozenset(data.get("filled", ())), lines)


@cache
def catalogue(lang: str) -> Catalogue:
    """The compiled messages of ``lang``, read once."""
    return load(lang)


def say(text: str, lang: str | None = None) -> str:
    """``text`` (an English message, maybe filled in) in ``lang`` (default: the current language)."""
    lang = lang or current()
    return text if lang == SOURCE or not text else catalogue(lang).say(str(text))


def marked(text: str) -> str:
    """``text`` unchanged: marks an English message that is stored before it is shown (a status
    line), so that ``course translate`` lists it; ``say`` translates it where it is shown."""
    return text


def fill(template: str, lang: str | None = None, **values: object) -> str:
    """``template`` translated into ``lang``, then its ``{name}`` placeholders filled with ``values``."""
    lang = lang or current()
    chosen = template if lang == SOURCE else catalogue(lang).templates.get(template, template)
    return _substitute(chosen, {"{" + k + "}": str(v) for k, v in values.items()})
