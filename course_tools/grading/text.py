"""Text that came from a submission, made safe to print, to write to feedback and to open in a
spreadsheet: no terminal escape sequences, no control, format or separator characters, bounded
length; escaped for Markdown and HTML where it lands in feedback; file names that never collide."""

from __future__ import annotations

import getpass
import hashlib
import html
import os
import re
import sys
import tempfile
import unicodedata
from pathlib import Path

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-character ESC sequences.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# Removed everywhere: control characters (Cc; tab and newline are kept where lines are allowed), format
# characters (Cf: bidi marks and overrides, zero-width spaces and joiners, tag characters, the soft
# hyphen), which make a cell read differently from what it contains, the line and paragraph
# separators (Zl, Zp), which some readers split rows on, and lone surrogates (Cs), which cannot be
# written as UTF-8.
_REMOVED = {"Cc", "Cf", "Zl", "Zp", "Cs"}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
# ASCII punctuation that Markdown (GitHub's included: tables, strike-through, math) reads as syntax
# inside a line; each gets a backslash (CommonMark allows one on any ASCII punctuation). <, >, & and
# quotes become HTML entities instead, so no tag survives. Student text never starts a line.
_MARKDOWN = re.compile(r"([\\`*_\[\]()#!|~$])")
_FILE_SAFE = re.compile(r"[A-Za-z0-9_.-]")


def clean(text: object, limit: int = 500, lines: bool = False) -> str:
    """``text`` without escape sequences, control, format and separator characters, cut to ``limit``
    characters. With ``lines=False`` newlines and tabs become spaces too (one-line fields)."""
    raw = str(text)[: 4 * limit + 64]  # bounds the work; what is removed below is rarely that much
    raw = _ESCAPES.sub("", raw)
    if not lines:
        raw = raw.replace("\n", " ").replace("\t", " ")
    out = "".join(ch for ch in raw if ch in "\n\t" or unicodedata.category(ch) not in _REMOVED)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def csv_cell(value: object) -> str:
    """A cleaned CSV cell that a spreadsheet shows as text, never runs as a formula."""
    text = clean(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def markdown_text(value: object, limit: int = 500) -> str:
    """One line of cleaned text that a Markdown (or HTML) renderer shows as the characters it holds:
    no tag, image, link, emphasis, heading or table syntax takes effect."""
    return html.escape(_MARKDOWN.sub(r"\\\1", clean(value, limit)), quote=True)


def code_block(lines: list[str]) -> list[str]:
    """Cleaned lines as a fenced Markdown code block whose fence no line can close."""
    body = [clean(line, 1000) for line in lines] or ["(no cases)"]
    longest = max((len(run) for line in body for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *body, fence]


def file_name(text: str, limit: int = 100) -> str:
    """A file-name stem for ``text`` that no other text gets: ASCII letters, digits, ``_ . -`` and
    letters of other scripts stay; every other character becomes ``%XX`` (its UTF-8 bytes), ``%``
    included, so two different names never share a stem ("kim lee" -> ``kim%20lee``, "kim_lee" stays).
    A leading dot is encoded (no hidden files); a name with capitals ends in ``^`` and a hash of it, so
    stems differ even where the file system ignores case (macOS, Windows: "Kim" and "kim" would be one
    file); a stem over ``limit`` is cut and ends in a hash of the whole name."""
    text = str(text)
    parts = []
    for i, ch in enumerate(text):
        keep = _FILE_SAFE.fullmatch(ch) is not None or (
            ord(ch) > 127 and unicodedata.category(ch)[0] in "LN" and unicodedata.is_normalized("NFC", ch))
        parts.append(ch if keep and not (i == 0 and ch == ".") else "".join(f"%{b:02X}" for b in ch.encode()))
    stem = "".join(parts) or "%00"
    if stem != stem.casefold():
        stem += "^" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    if len(stem.encode()) > limit:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        stem = stem.encode()[: limit - 17].decode(errors="ignore") + "~" + digest
    return stem


def _host_strings() -> list[tuple[str, str]]:
    """(text, placeholder) for what names this machine: the course folder, Python's folders, the
    temporary folder, the home folder and the account name; longest first."""
    places = {str(Path(__file__).resolve().parents[2]): "<course>", tempfile.gettempdir(): "<tmp>",
              os.path.expanduser("~"): "<home>"}
    for prefix in {sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}:
        places[prefix] = "<python>"
    return sorted(((path, name) for path, name in places.items() if len(path) > 1), key=lambda item: -len(item[0]))


def _account() -> str | None:
    """This account's name, to hide where it stands as a word ("root" names no person, and is a word)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        return None
    return user if len(user) > 1 and user != "root" else None


_COMMAND_LINE = re.compile(r"\S*bwrap\b.*|(?:^|\s)--(?:unshare|ro-bind|bind|setenv|tmpfs|proc|dev|seccomp)\b.*")


def redact(text: str) -> str:
    """``text`` as a student may read it: no folder of this machine, no account name, no sandbox
    command line (cut where one starts)."""
    text = _COMMAND_LINE.sub(" [sandbox command line removed]", text)
    for found, placeholder in _host_strings():
        text = text.replace(found, placeholder)
    user = _account()
    return re.sub(rf"\b{re.escape(user)}\b", "<user>", text) if user else text
