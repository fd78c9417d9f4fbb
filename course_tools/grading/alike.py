"""Submissions an instructor should read together, found before any is graded: names that read
alike (equal after NFC normalisation, case-folding or mapping look-alike letters), one file under
two names (a hard link: the same device and inode), the same answers twice, and answers copied
from ``solutions/``.

Each finding goes into the ``alike`` column of every row it concerns and into the run's summary;
never into a student's feedback, which must not name another student.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_tools.grading import submission
from course_tools.grading.submission import SubmissionError

# Look-alikes of Latin letters, after NFKC and case-folding: the lower-case Cyrillic, Greek and Latin
# letters (and two digits) whose upper- or lower-case form Unicode TR39's confusables.txt maps to a
# Latin letter. A subset of TR39, not all of it: the full table is some 6,000 entries for every
# script, and no small maintained package offers its skeleton; this covers the scripts a name of this
# course's students is written in besides Latin and Hangul. "m" (and Cyrillic "м") becomes "rn", as in TR39.
CONFUSABLES = {
    # Cyrillic
    "а": "a", "в": "b", "г": "r", "д": "g", "е": "e", "з": "3", "и": "u", "к": "k", "м": "rn", "н": "h",
    "о": "o", "п": "n", "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "ь": "b", "ѕ": "s", "і": "i",
    "ј": "j", "ԁ": "d", "ԛ": "q", "ԝ": "w", "һ": "h", "ү": "y", "ӏ": "l", "ɡ": "g",
    # Greek
    "α": "a", "β": "b", "γ": "y", "ε": "e", "ζ": "z", "η": "n", "ι": "i", "κ": "k", "μ": "u", "ν": "v",
    "ο": "o", "ρ": "p", "σ": "o", "τ": "t", "υ": "u", "χ": "x", "ω": "w", "ϲ": "c", "ϳ": "j",
    # Latin and digits
    "ı": "i", "ɩ": "i", "ℓ": "l", "ǀ": "l", "0": "o", "1": "l", "|": "l", "m": "rn",
}


def skeleton(name: str) -> str:
    """The key under which two names read alike: NFKC (full-width letters, ligatures, styled
    letters become plain), case folded, format characters dropped (zero-width spaces and joiners),
    ``CONFUSABLES`` mapped, then NFD, as TR39's skeleton ends."""
    text = unicodedata.normalize("NFKC", name).casefold()
    text = "".join(CONFUSABLES.get(ch, ch) for ch in text if unicodedata.category(ch) != "Cf")
    return unicodedata.normalize("NFD", text)


def _canonical(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def answers_digest(parsed: submission.Parsed) -> str:
    """A hash of a notebook's answer cells by grade_id, each with line endings and trailing spaces
    made uniform (an editor's whitespace does not make two copies different)."""
    cells = [[grade_id, ["\n".join(line.rstrip() for line in s.splitlines()).strip() for s in sources]]
             for grade_id, sources in sorted(parsed.answers.items())]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()


def _notebook_digest(nb: nbformat.NotebookNode) -> str:
    return answers_digest(submission.parse(json.dumps(nb).encode()))


@dataclass(frozen=True)
class Seen:
    """What is compared of one submission file."""

    path: Path
    file: str  # as the gradebook shows it
    name: str  # the raw stem, undecoded bytes and all
    inode: tuple[int, int] | None
    content: str | None  # answers digest, the file's hash when it is no notebook, None when nothing is the learner's


def look(path: Path, pristine: dict[str, nbformat.NotebookNode], lesson: str | None,
         blank: dict[str, str]) -> Seen:
    """One file's name, inode and content digest (None for a file left as handed out, an empty
    file, or one that cannot be read)."""
    file = submission.readable(str(path))
    try:
        info = os.lstat(path)
        inode = (info.st_dev, info.st_ino)
        raw = submission.read_bytes(str(path))
    except (OSError, SubmissionError):
        return Seen(path, file, path.stem, None, None)
    if not raw.strip():
        return Seen(path, file, path.stem, inode, None)
    try:
        parsed = submission.parse(raw)
        found = lesson or submission.identify_lesson(parsed, pristine)
        digest = answers_digest(parsed)
        content = None if digest == blank.get(found) else digest
    except SubmissionError:
        content = "file:" + hashlib.sha256(raw).hexdigest()
    return Seen(path, file, path.stem, inode, content)


def _differing(a: str, b: str) -> str:
    """The characters one NFC name has and the other lacks, with their Unicode names."""
    chars = sorted(set(_canonical(a)) ^ set(_canonical(b)))
    return ", ".join(f"{submission.readable(c)} U+{ord(c):04X} {unicodedata.name(c, '?')}" for c in chars[:6])


def _name_finding(mine: str, other: Seen) -> str:
    shown = f"{submission.student_name(other.path)[0]!r} ({other.file})"
    if _canonical(mine) == _canonical(other.name):
        return f"same name as {shown} after NFC normalisation (one is decomposed)"
    if _canonical(mine).casefold() == _canonical(other.name).casefold():
        return f"same name as {shown} but for case"
    return f"name reads like {shown}: look-alike characters {_differing(mine, other.name)}"


def find(paths: list[Path], pristine: dict[str, nbformat.NotebookNode], lesson: str | None,
         solutions: Path | None) -> tuple[dict[Path, list[str]], list[str]]:
    """The findings for each path, and the summary's lines (one per group of rows to read together).
    ``solutions`` is the folder of the lessons' solution notebooks (None: not compared)."""
    blank = {name: _notebook_digest(nb) for name, nb in pristine.items()}
    answers: dict[str, str] = {}
    for name in pristine if solutions is not None else ():
        try:
            answers[answers_digest(submission.parse(submission.read_bytes(str(solutions / f"{name}.ipynb"))))] = name
        except SubmissionError:
            continue  # a lesson without a readable solution is not compared
    seen = [look(path, pristine, lesson, blank) for path in paths]
    findings: dict[Path, list[str]] = defaultdict(list)
    summary: list[str] = []

    def group(key: Callable[[Seen], object], what: str, finding: Callable[[Seen, Seen], str],
              apart: Callable[[Seen, Seen], bool] = lambda s, o: True) -> None:
        """Flag every pair of files with the same ``key`` that are ``apart`` (a hard link is one file,
        not two copies)."""
        groups: dict[object, list[Seen]] = defaultdict(list)
        for s in seen:
            k = key(s)
            if k is not None:
                groups[k].append(s)
        for members in groups.values():
            pairs = {s.path: [o for o in members if o is not s and apart(s, o)] for s in members}
            if any(pairs.values()):
                summary.append(f"{what}: " + ", ".join(s.file for s in members))
                for s in members:
                    findings[s.path] += [finding(s, o) for o in pairs[s.path]]

    group(lambda s: skeleton(s.name), "names that read alike", lambda s, o: _name_finding(s.name, o))
    group(lambda s: s.inode, "one file under several names (hard links)",
          lambda s, o: f"the same file as {o.file} (a hard link)")
    group(lambda s: s.content, "the same answers", lambda s, o: f"the same answers as {o.file}",
          apart=lambda s, o: s.inode != o.inode)
    for s in seen:
        if s.content in answers:
            lesson_name = answers[s.content]
            summary.append(f"the same answers as solutions/{lesson_name}.ipynb: {s.file}")
            findings[s.path].append(f"the same answers as solutions/{lesson_name}.ipynb")
    return dict(findings), summary
