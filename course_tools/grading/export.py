"""A clean copy of the course's two packages, made for the sandbox instead of the live folders.

The live checkout holds more than the course: ``__pycache__`` folders, ``.pyc`` files orphaned
by a move (readable and unmarshallable by anyone who finds them), untracked experiments, and the
reference solutions. The export holds only

* the *tracked* ``.py`` files of ``course_utils`` and ``course_tools``: in a git checkout, what
  ``git ls-files`` lists; in an installed copy (a wheel: no git), what the distribution's
  ``RECORD`` lists; with neither, refused (``ExportError``) rather than guessed;
* the tracked data files a lesson reads (``course_utils/pretrained/``);
* never ``course_tools/exercises/references`` (the references are simply not in the sandbox) and never a
  ``.pyc``: the sandbox runs with ``PYTHONDONTWRITEBYTECODE`` on a read-only mount, so Python
  compiles from these sources.

One export per lesson: the functions and classes that lesson teaches are replaced by refusals
(``course_tools.grading.shortcuts``).
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import tempfile
from pathlib import Path

from course_tools.exercises import REFERENCES
from course_tools.grading import shortcuts

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("course_utils", "course_tools")
DATA_DIRS = ("course_utils/pretrained/",)
LEFT_OUT = (f"{REFERENCES}/",)


class ExportError(RuntimeError):
    """The course's files cannot be listed here; the message names the fix."""


def _git_files(root: Path) -> list[str] | None:
    if not (root / ".git").exists():
        return None
    try:  # no git installed: OSError
        done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *PACKAGES], capture_output=True,
                              timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [name for name in done.stdout.decode().split("\0") if name]


def _record_files(root: Path) -> list[str] | None:
    """The files an installed distribution of the course lists in its RECORD, if it lives in ``root``."""
    for dist in importlib.metadata.distributions(path=[str(root)]):
        names = [str(f) for f in dist.files or []]
        if any(n.startswith(f"{PACKAGES[1]}/") for n in names):
            return names
    return None


def tracked(root: Path = ROOT) -> list[str]:
    """The course files (relative paths) the sandbox may see: tracked ``.py`` and data files."""
    names = _git_files(root)
    if names is None:
        names = _record_files(root)
    if names is None:
        raise ExportError(f"cannot tell which course files are tracked in {root} (no git checkout, no installed "
                          "RECORD): grade from a git clone or an installed wheel")
    keep = []
    for name in names:
        if name.startswith(LEFT_OUT) or "__pycache__" in name.split("/") or not (root / name).is_file():
            continue
        if name.endswith(".py") or name.startswith(DATA_DIRS):
            keep.append(name)
    return sorted(keep)


def make(lesson: str | None, pristine_sources: list[str], root: Path = ROOT) -> Path:
    """A fresh folder with the export for ``lesson`` (None: nothing removed). The caller deletes it."""
    folder = Path(tempfile.mkdtemp(prefix="course-export-"))
    removed = shortcuts.removed(lesson, pristine_sources) if lesson else {}
    try:
        for name in tracked(root):
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            module = name[:-3].replace("/", ".") if name.endswith(".py") else None
            if module in removed:
                source = (root / name).read_text()
                target.write_text(shortcuts.stub_source(source, module, removed[module]))
            else:
                shutil.copyfile(root / name, target)
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder
