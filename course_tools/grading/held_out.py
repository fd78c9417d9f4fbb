"""Text a lesson is judged on that its submissions never receive.

The capstone (lesson 11) scores the trained weights on the last ``HELD_OUT`` of the Shakespeare
corpus. While that lesson is graded the sandbox's data folder holds the corpus without that end
(``excerpt_folder``): ``course_utils.data.shakespeare`` reads it as the corpus (the ``.excerpt``
marker beside it stands in for the checksum), so nothing the submission runs can see, let alone
fit, the text its loss is measured on.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from course_utils import data

HELD_OUT = {"11": 0.05}  # lesson number -> fraction of the corpus, from its end, kept from the sandbox


def fraction(lesson: str | None) -> float:
    """The share of the corpus withheld while ``lesson`` (a notebook stem or its number) is graded; 0: none."""
    return HELD_OUT.get((lesson or "")[:2], 0.0)


def split(text: str, withheld: float) -> tuple[str, str]:
    """(what the sandbox gets, what it never sees): the text cut ``withheld`` of its length before the end."""
    if not 0.0 < withheld < 1.0:
        raise ValueError(f"the withheld fraction must be in (0, 1), got {withheld}")
    cut = int(len(text) * (1.0 - withheld))
    return text[:cut], text[cut:]


def excerpt_folder(lesson: str | None) -> Path | None:
    """A new folder (the caller deletes it) holding the corpus without its held-out end and the marker,
    readable by the sandbox's user; None when ``lesson`` withholds nothing."""
    withheld = fraction(lesson)
    if not withheld:
        return None
    folder = Path(tempfile.mkdtemp(prefix="course-data-"))
    (folder / data.CORPUS_FILE).write_text(split(data.shakespeare(), withheld)[0], encoding="utf-8")
    (folder / (data.CORPUS_FILE + data.EXCERPT_SUFFIX)).write_text(f"the last {withheld:.0%} is held out\n")
    for path in [folder, *folder.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return folder
