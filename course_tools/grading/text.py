"""Text that came from a submission, made safe to print, to write to feedback and to open in a
spreadsheet: no terminal escape sequences, no control characters, bounded length."""

from __future__ import annotations

import re

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other two-character ESC sequences.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# C0 and C1 controls and DEL (tab and newline are kept where lines are allowed), and the Unicode
# bidirectional overrides that can make a cell read differently from what it contains.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def clean(text: object, limit: int = 500, lines: bool = False) -> str:
    """``text`` without escape sequences and control characters, cut to ``limit`` characters.
    With ``lines=False`` newlines and tabs become spaces too (one-line fields)."""
    out = _CONTROLS.sub("", _ESCAPES.sub("", str(text)))
    if not lines:
        out = out.replace("\n", " ").replace("\t", " ")
    return out if len(out) <= limit else out[: limit - 1] + "…"


def csv_cell(value: object) -> str:
    """A cleaned CSV cell that a spreadsheet shows as text, never runs as a formula."""
    text = clean(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def file_stem(text: str, limit: int = 80) -> str:
    """A name usable as a file name: letters, digits, ``._-`` and non-ASCII letters; nothing else."""
    stem = re.sub(r"[^\w.-]", "_", clean(text, limit)).lstrip(".")
    return stem or "unnamed"
