"""The banner on every generated file: what it is built from and the command that rebuilds it.

A generated notebook opens with one markdown cell tagged `generated-banner` (left out of slides; the
builds that read a generated notebook as their source drop it first, with `without`); a generated
Markdown file opens with an HTML comment, which readers of the rendered page do not see.
"""

from __future__ import annotations

from collections.abc import Sequence

import nbformat

TAG = "generated-banner"


SENTENCES = {  # language -> (a notebook to read, an exercise notebook to fill in), and how sources are joined
    "en": ("*Generated from {sources} by `{command}`: edit the source, not this file, then run `{command}`.*",
           "*Your copy to fill in. (For maintainers: generated from {sources} by `{command}`; change the source "
           "and run `{command}` again.)*", " and "),
    "ko": ("*{sources}에서 `{command}`로 만든 파일입니다. 이 파일이 아니라 원본을 고친 뒤 `{command}`를 실행하세요.*",
           "*여러분이 채워 넣을 사본입니다. (개발자용: {sources}에서 `{command}`로 만들었습니다. 원본을 고친 뒤 "
           "`{command}`를 다시 실행하세요.)*", ", "),
}


def text(sources: Sequence[str], command: str, lang: str = "en", fill_in: bool = False) -> str:
    """One sentence in ``lang``: generated from the files ``sources`` (paths) by ``command``.

    A notebook that readers only read says: edit the source, then rebuild. An exercise notebook
    (``fill_in``) is the learner's own copy, so it says that first and speaks to maintainers after.
    """
    if lang not in SENTENCES:
        raise ValueError(f"no banner in language {lang!r}; add one to banner.SENTENCES (have {', '.join(SENTENCES)})")
    to_read, to_fill, joiner = SENTENCES[lang]
    named = joiner.join(f"`{source}`" for source in sources)
    return (to_fill if fill_in else to_read).format(sources=named, command=command)


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
