"""What fits on a slide: the height of a cell on the 1280 x 720 canvas, and cells cut into pieces that fit.

A deck's type is large (``slides.FONT_PX``, ``slides.CODE_PX``), so a long cell of code, a long printout or a
long Markdown cell does not fit on one slide; shown whole it would scroll, which the back of a hall cannot
follow. ``height`` estimates a cell's height in canvas pixels from its text; ``pieces`` cuts a cell taller than
a page into cells that each fit (code at blank lines, a printout by lines, Markdown between its blocks, a
long list at its items, a long table at its rows), so that ``slides.paginated`` can put them on slides of
their own. Every line of text and every output is shown, in order; only prompts' execution counts, which a
deck hides, are not carried over.

The constants were measured in Chromium on the built decks of lessons 00-13, English and Korean (the
rendered height of each of 1,348 cells against its text, with the fonts of this course's build machine).
Against those heights the estimate of a code input is exact for 526 of 558 and never too low; of 650 cells'
outputs, 6 are more than 20 px taller than estimated (at most 100 px); Markdown is a rougher fit: 57 of 630
cells are more than 20 px taller (at most 108 px). ``PAGE`` leaves 84 px of the canvas for that error; with it,
no slide of the 28 decks is taller than the canvas in Chromium (``tests/test_slides.py`` checks lesson 09's).
"""

from __future__ import annotations

import base64
import copy
import re
import struct
import unicodedata

import nbformat

HIDE_INPUT_TAG = "slides-hide-input"  # a cell tagged so shows only its outputs (figures)
CANVAS = 684  # what reveal.js shows of a slide 720 px high before it scrolls (95 %)
PAGE = 600  # the height a slide is planned to: the canvas less the error of the estimates
CODE_LINE, CODE_COLUMNS, CODE_PAD = 30, 82, 27  # code: px a line, columns a line, px a cell
OUTPUT_LINE, OUTPUT_COLUMNS, OUTPUT_PAD = 35, 76, 20  # a printout: px a line, columns a line, px an output
PROSE_LINE, PROSE_COLUMNS, BLOCK_PAD, CELL_PAD = 36, 115, 16, 24  # Hangul and other wide letters take two columns
HEADING_EXTRA = {1: 126, 2: 72, 3: 60}  # px a heading of that level takes beyond one line of prose
MATH_BLOCK, TABLE_ROW, FENCED_LINE, LIST_ITEM_PAD = 95, 60, 44, 20  # px: $$ display, table row, ``` line, list item
FIGURE_WIDTH, FIGURE_PX, FIGURE_PAD = 1260, 560, 16  # a figure is drawn this wide, at most this tall


def columns(text: str) -> int:
    """The width of ``text`` in columns of a monospace font: two for Hangul and other wide letters."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def wrapped(text: str, width: int) -> int:
    """How many lines ``text`` takes when every line wraps at ``width`` columns (an empty line takes one)."""
    return sum(max(1, -(-columns(line) // width)) for line in text.split("\n"))


def figure_height(png_base64: str) -> int:
    """The drawn height of a PNG figure: as wide as the slide, at most FIGURE_PX tall (its size from its header)."""
    head = base64.b64decode(png_base64[:32])
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return FIGURE_PX + FIGURE_PAD
    width, height = struct.unpack(">II", head[16:24])
    return min(FIGURE_PX, round(FIGURE_WIDTH * height / max(width, 1))) + FIGURE_PAD


def output_height(out: nbformat.NotebookNode) -> int:
    """Height of one output: a figure, or its text as a printout."""
    data = out.get("data", {})
    if "image/png" in data:
        return figure_height(data["image/png"])
    if any(k.startswith("image/") for k in data):
        return FIGURE_PX + FIGURE_PAD
    return OUTPUT_PAD + OUTPUT_LINE * wrapped(_printout(out), OUTPUT_COLUMNS)


def _printout(out: nbformat.NotebookNode) -> str:
    """The text of an output as it is drawn: its last newline ends the last line, an empty line before it shows;
    an error shows its traceback (without its colour codes)."""
    if out.get("output_type") == "error":
        return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(out.get("traceback", [])))
    text = out.get("text") or out.get("data", {}).get("text/plain") or ""
    return text[:-1] if text.endswith("\n") else text


def code_height(source: str) -> int:
    """Height of a code cell's input."""
    return CODE_PAD + CODE_LINE * wrapped(source, CODE_COLUMNS)


LIST_ITEM = re.compile(r"([-*+]|\d+[.)]) ")  # the first line of an item of a list (not a nested one)


def blocks(markdown: str) -> list[str]:
    """The blocks of a Markdown text: pieces between blank lines, a ``` block and a $$ block kept whole."""
    found, current, fence, math = [], [], False, False
    for line in markdown.split("\n"):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fence = not fence
        elif not fence and re.sub(r"`[^`]*`", "", stripped).count("$$") % 2:  # not a $$ in inline code
            math = not math
        if stripped or fence or math:
            if not current and found and line[:1] in " \t":  # an item's indented paragraph stays with its item
                current = [found.pop(), ""]
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    if current:
        found.append("\n".join(current))
    return found


def block_height(block: str) -> int:
    """Height of one Markdown block: a heading and its lines, a list, a table, a ``` or $$ block, a paragraph."""
    lines = block.split("\n")
    first = lines[0].lstrip()
    if first.startswith("```"):
        return BLOCK_PAD + FENCED_LINE * len(lines)
    if first.startswith("$$"):
        return BLOCK_PAD + MATH_BLOCK
    if first.startswith("|"):  # a row wraps within the table's width; the |---| line draws nothing
        rows = [line for i, line in enumerate(lines) if i != 1]
        return BLOCK_PAD + sum(TABLE_ROW + PROSE_LINE * (wrapped(_shown(row), PROSE_COLUMNS) - 1) for row in rows)
    extra = 0
    if first.startswith("#"):
        extra = HEADING_EXTRA[min(3, len(first) - len(first.lstrip("#")))]
    items = sum(1 for line in lines if LIST_ITEM.match(line))
    return BLOCK_PAD + extra + LIST_ITEM_PAD * items + PROSE_LINE * sum(wrapped(_shown(line), PROSE_COLUMNS)
                                                                     for line in lines)


def _shown(line: str) -> str:
    """A Markdown line as it is drawn, roughly: a link shows its text; *, ` and | show nothing."""
    return re.sub(r"\]\([^)]*\)|[*`|]", "", line)


def parts_of(block: str) -> list[str]:
    """A block that may be cut: a list at its items, a table at its rows (each part keeps the header); other
    blocks whole. Markdown numbers a cut list from the number its part starts with."""
    lines = block.split("\n")
    if LIST_ITEM.match(lines[0]):
        starts = [i for i, line in enumerate(lines) if LIST_ITEM.match(line)] + [len(lines)]
        return ["\n".join(lines[a:b]) for a, b in zip(starts, starts[1:], strict=False)]
    if lines[0].startswith("|") and len(lines) > 3:
        return ["\n".join(lines[:2] + [row]) for row in lines[2:]]
    return [block]


def input_shown(cell: nbformat.NotebookNode) -> bool:
    """Whether a code cell's input is on the slide: it has one and is not tagged HIDE_INPUT_TAG."""
    return bool(cell.source) and HIDE_INPUT_TAG not in cell.metadata.get("tags", [])


def height(cell: nbformat.NotebookNode) -> int:
    """Height of a cell on a slide, in canvas pixels: its input (unless hidden) and its outputs."""
    if cell.cell_type == "markdown":
        return CELL_PAD + sum(map(block_height, blocks(cell.source)))
    return (code_height(cell.source) if input_shown(cell) else 0) + sum(map(output_height, cell.get("outputs", [])))


def pieces(cell: nbformat.NotebookNode, page: int = PAGE) -> list:
    """``cell`` as cells that each fit in ``page`` px: itself if it fits; else a code cell's input in pieces cut
    at blank lines or before a new statement (``_code_chunks``), then its outputs on their own, a printout cut
    by lines; a Markdown cell in runs of blocks, a list or a table too tall for a page cut at its
    items or rows. What cannot be cut stays whole: a paragraph, list item, table row, ``` or $$ block, figure,
    HTML output or error. The first piece keeps the cell's id and metadata (with its tags and the hide-input
    tag of an output piece), a Markdown piece the cell's attachments; the others get ids "<id>-p1", "<id>-p2"..."""
    if height(cell) <= page:
        return [cell]
    if cell.cell_type == "markdown":
        units = [(i, part) for i, block in enumerate(blocks(cell.source))
                 for part in (parts_of(block) if block_height(block) > page - CELL_PAD else [block])]
        parts = [nbformat.v4.new_markdown_cell(_joined(run)) for run in _runs(units, page, _unit_height, CELL_PAD)]
        for part in parts if "attachments" in cell else []:
            part.attachments = copy.deepcopy(cell.attachments)
    elif cell.cell_type == "code":
        parts = []
        if input_shown(cell):
            parts = [nbformat.v4.new_code_cell(chunk) for chunk in _code_chunks(cell.source, page)]
        outputs = [piece for out in cell.get("outputs", []) for piece in _printout_pieces(out, page)]
        for run in _runs(outputs, page, lambda out, _: output_height(out), 0):
            part = nbformat.v4.new_code_cell("", metadata={"tags": [HIDE_INPUT_TAG]})
            part.outputs = run
            parts.append(part)
    else:
        return [cell]
    if not parts:
        return [cell]
    first, rest = parts[0], parts[1:]
    tags = cell.metadata.get("tags", [])
    tags = tags + [tag for tag in first.metadata.get("tags", []) if tag not in tags]
    first.id, first.metadata = cell.id, copy.deepcopy(dict(cell.metadata)) | ({"tags": tags} if tags else {})
    for i, part in enumerate(rest, 1):
        part.id = f"{cell.id}-p{i}"
    return parts


def _runs(items: list, page: int, size, pad: int) -> list[list]:
    """``items`` in consecutive runs whose sizes (plus ``pad`` a run) fit in ``page``; an item too big is a run.
    ``size(item, previous)`` is an item's size after ``previous`` in its run (None: it starts one)."""
    runs: list[list] = []
    used = page + 1
    for item in items:
        h = size(item, runs[-1][-1] if runs else None)
        if runs and used + h <= page:
            runs[-1].append(item)
            used += h
        else:
            runs.append([item])
            used = pad + size(item, None)
    return runs


def _unit_height(unit: tuple[int, str], previous: tuple[int, str] | None) -> int:
    """Height of a (block number, part) unit; after a part of the same block, ``_joined`` adds it without a
    block's padding and, in a table, without the header."""
    block, part = unit
    if previous is None or previous[0] != block:
        return block_height(part)
    header = block_height("\n".join(part.split("\n")[:2])) if part.startswith("|") else BLOCK_PAD
    return block_height(part) - header


def _joined(units: list[tuple[int, str]]) -> str:
    """Markdown from consecutive (block number, part) pairs: parts of one list on consecutive lines, rows of
    one table under one header, blocks apart."""
    text = ""
    for k, (block, part) in enumerate(units):
        if k and units[k - 1][0] == block:
            text += "\n" + ("\n".join(part.split("\n")[2:]) if part.startswith("|") else part)
        else:
            text += ("\n\n" if text else "") + part
    return text


def _code_chunks(source: str, page: int) -> list[str]:
    """A long input cut into pieces that fit: each piece ends at its last blank line when it has one in its
    second half, else before the least indented line there that starts a statement, else at the last line
    that fits. Blank lines at the ends of a piece are dropped."""
    lines, chunks = source.split("\n"), []
    while lines:
        while lines and not lines[0].strip():
            lines.pop(0)
        n = 0
        while n < len(lines) and code_height("\n".join(lines[:n + 1])) <= page:
            n += 1
        n = max(n, 1)
        if n < len(lines):  # at a blank line, else before the least indented statement (never inside a call)
            blank = [i for i in range(n // 2, n + 1) if not lines[i].strip()]
            starts = [i for i in range(n // 2 + 1, n + 1) if _starts_statement(lines, i)]
            shallowest = sorted(starts, key=lambda i: (_indent(lines[i]), -i))[:1]
            n = (blank or shallowest or [n])[-1]
        piece, lines = lines[:n], lines[n:]
        while piece and not piece[-1].strip():
            piece.pop()
        if piece:
            chunks.append("\n".join(piece))
    return chunks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _starts_statement(lines: list[str], i: int) -> bool:
    """Whether line i begins a statement, roughly: not blank, not a closing bracket, and the line before it
    does not leave a bracket or a backslash open."""
    return bool(lines[i].strip()) and lines[i].lstrip()[:1] not in ")]}" and \
        not lines[i - 1].rstrip().endswith(("(", "[", "{", ",", "\\"))


def _printout_pieces(out: nbformat.NotebookNode, page: int) -> list[nbformat.NotebookNode]:
    """A printout taller than ``page`` as several streams of consecutive lines (of its stream's name; a result
    shown as text becomes stdout, drawn the same); figures, HTML and errors as they are."""
    data = out.get("data", {})
    if output_height(out) <= page or out.get("output_type") == "error" or any(k != "text/plain" for k in data):
        return [out]
    text = _printout(out)
    per_piece = (page - OUTPUT_PAD) // OUTPUT_LINE
    pieces_, current, taken = [], [], 0
    for line in text.split("\n"):
        need = wrapped(line, OUTPUT_COLUMNS)  # a wrapped line counts as the lines it takes
        if current and taken + need > per_piece:
            pieces_.append(current)
            current, taken = [], 0
        current.append(line)
        taken += need
    pieces_.append(current)
    return [nbformat.v4.new_output("stream", name=out.get("name", "stdout"), text="\n".join(p) + "\n") for p in pieces_]
