"""The banner on every generated file: what it is built from and the command that rebuilds it.

A generated notebook opens with one markdown cell tagged `generated-banner` (left out of slides; the
builds that read a generated notebook as their source drop it first, with `without`); a generated
Markdown file opens with an HTML comment, which readers of the rendered page do not see.
"""

from __future__ import annotations

import nbformat

TAG = "generated-banner"


def text(sources: str, command: str) -> str:
    """One sentence: generated from `sources` (Markdown) by `command`; edit those, then rebuild."""
    return f"*Generated from {sources} by `{command}`: edit the source, not this file, then run `{command}`.*"


def cell(sentence: str) -> nbformat.NotebookNode:
    """The banner cell of a generated notebook (its id fixed, so every rebuild writes the same file)."""
    metadata = {"tags": [TAG], "slideshow": {"slide_type": "skip"}}
    return nbformat.v4.new_markdown_cell(sentence, id=TAG, metadata=metadata)


def with_banner(nb: nbformat.NotebookNode, sentence: str) -> nbformat.NotebookNode:
    """`nb` with `sentence` as its banner cell (replacing any banner it had)."""
    nb.cells = [cell(sentence)] + without(nb).cells
    return nb


def without(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` without its banner cell (in place), for a build that reads a generated notebook."""
    nb.cells = [c for c in nb.cells if TAG not in c.metadata.get("tags", [])]
    return nb


def comment(sources: str, command: str) -> str:
    """The first line of a generated Markdown file."""
    return f"<!-- Generated from {sources} by `{command}`: edit the source, not this file, then run `{command}`. -->"
