"""The learner's language, and what the checks say in it: GNU gettext, read with the standard library.

A message is written in English where it is used and marked with one of four functions, which Babel
finds by name (``KEYWORDS``: ``course translate <lang>`` extracts with them, like ``pybabel extract -F
babel.cfg`` with the keywords CONTRIBUTING names):

- ``_(template, **values)``: the message in the current language now;
- ``_n(singular, plural, n, **values)``: the same, with a count that chooses the form (``ngettext``);
- ``N_(template, **values)`` and ``N_n(...)``: a ``Message``, a ``str`` that stays English (a status
  in the gradebook, a case label, an ``explain=`` note registered at import) and is given in the
  learner's language where it is shown, by ``say``.

A template's ``{name}`` placeholders are filled after translation (``str.format``: ``{loss:.3f}`` and
``{got!r}`` work; a literal brace is doubled). A value that is itself a ``Message`` is given in the same
language. In a Korean translation a particle pair after a placeholder (``{shape}은(는)``) becomes the
form that fits the value (``course_tools.particles``).

The translations are ``translations/<lang>/LC_MESSAGES/course.po``, compiled by ``course translate
<lang>`` into ``course_tools/locale/<lang>/LC_MESSAGES/course.mo`` beside this module, so a learner's
kernel needs nothing but the standard library's ``gettext``. A message without a translation stays
English. The language is chosen by the notebook: a Korean edition's setup cell calls ``use("ko")``
(``course translate ko`` adds that line); the grader reads the submission's metadata and grades inside
``speaking(lang)``, which holds for one thread only.
"""

from __future__ import annotations

import gettext
import string
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from typing import Any

from course_tools import particles

LANGUAGES = ("en", "ko")  # the editions that exist; English is the source language
SOURCE = "en"
DOMAIN = "course"  # the catalogue's name: locale/<lang>/LC_MESSAGES/course.mo
LOCALE = Path(__file__).resolve().parent / "locale"
# the marking functions, as Babel's extractor takes them (name -> the arguments that are messages)
KEYWORDS = {"_": (1,), "N_": (1,), "_n": (1, 2), "N_n": (1, 2)}

_chosen = SOURCE  # the kernel's language, set by use() (a notebook's cells do not share a context)
_override: ContextVar[str | None] = ContextVar("course_language", default=None)  # speaking(), per thread
# speaking(lang, catalogue): messages not yet written to disk (`course translate` renders notebooks with them)
_given: ContextVar[tuple[str, gettext.NullTranslations] | None] = ContextVar("course_catalogue", default=None)
_FORMATTER = string.Formatter()


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
def speaking(lang: str, catalogue: gettext.NullTranslations | None = None) -> Iterator[None]:
    """Give messages in ``lang`` inside the block, in this thread only (the grader, one submission each);
    from ``catalogue`` instead of the installed file when one is given."""
    token = _override.set(known(lang))
    given = _given.set((known(lang), catalogue) if catalogue is not None else _given.get())
    try:
        yield
    finally:
        _given.reset(given)
        _override.reset(token)


def catalogue_path(lang: str) -> Path:
    """Where the compiled catalogue of ``lang`` lives in the package."""
    return LOCALE / lang / "LC_MESSAGES" / f"{DOMAIN}.mo"


@cache
def translations(lang: str) -> gettext.NullTranslations:
    """The compiled messages of ``lang``, read once (none for English, or when none were built)."""
    if lang == SOURCE:
        return gettext.NullTranslations()
    return gettext.translation(DOMAIN, localedir=LOCALE, languages=[lang], fallback=True)


def fill(template: str, values: dict[str, Any], lang: str) -> str:
    """``template`` (already translated) with its placeholders filled; a particle pair right after a
    placeholder takes the form that fits the value."""
    pieces: list[str] = []
    previous: str | None = None  # the text of the placeholder just filled, if the template continues with its particle
    for literal, field, spec, conversion in _FORMATTER.parse(template):
        if previous is not None:
            pair = particles.PAIR.match(literal)
            if pair:
                literal = particles.choose(pair.group(), previous) + literal[pair.end():]
        pieces.append(literal)
        previous = None
        if field is not None:
            value, _ = _FORMATTER.get_field(field, (), values)
            value = say(value, lang) if isinstance(value, Message) else value
            previous = format(_FORMATTER.convert_field(value, conversion), spec or "")
            pieces.append(previous)
    return "".join(pieces)


def render(template: str, values: dict[str, Any], lang: str, plural: str | None = None, n: int = 1) -> str:
    """An English message given in ``lang``: translated, then filled."""
    given = _given.get()
    found = given[1] if given is not None and given[0] == lang else translations(lang)
    chosen = found.ngettext(template, plural, n) if plural is not None else found.gettext(template)
    return fill(chosen, values, lang)


class Message(str):
    """An English message that can be given in another language: the text is the English, filled;
    ``say`` renders the template and values again in the language asked for."""

    template: str
    values: dict[str, Any]
    plural: str | None
    n: int

    def __new__(cls, template: str, values: dict[str, Any], plural: str | None = None, n: int = 1) -> Message:
        self = super().__new__(cls, render(template, values, SOURCE, plural, n))
        self.template, self.values, self.plural, self.n = template, values, plural, n
        return self

    def __reduce__(self) -> tuple:
        return Message, (self.template, self.values, self.plural, self.n)

    def in_language(self, lang: str) -> str:
        return render(self.template, self.values, lang, self.plural, self.n)


def _(template: str, /, **values: Any) -> str:
    """``template`` in the current language, its placeholders filled with ``values``."""
    return render(template, values, current())


def _n(singular: str, plural: str, n: int, /, **values: Any) -> str:
    """The singular or plural form (by ``n``, as the language counts) in the current language, filled."""
    return render(singular, values, current(), plural, n)


def N_(template: str, /, **values: Any) -> Message:
    """``template`` filled, kept in English until ``say`` gives it in a language (a deferred ``_``)."""
    return Message(template, values)


def N_n(singular: str, plural: str, n: int, /, **values: Any) -> Message:
    """A deferred ``_n``."""
    return Message(singular, values, plural, n)


def say(text: str, lang: str | None = None) -> str:
    """``text`` in ``lang`` (default: the current language): a ``Message`` is rendered in it; any other
    text is looked up as it is, as a message without placeholders (a status read back as its English,
    a reveal's ``why``), and kept when it is none."""
    lang = lang or current()
    if isinstance(text, Message):
        return text.in_language(lang)
    if lang == SOURCE or not text or not isinstance(text, str):
        return text
    given = _given.get()
    return (given[1] if given is not None and given[0] == lang else translations(lang)).gettext(text)
