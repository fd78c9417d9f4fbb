"""The pages a reader is sent to name files and library names that exist.

The README, CONTRIBUTING, the website's pages and the lesson guides quote paths (`course_utils/train.py`)
and library names (`LayerNorm.fused`, `attention.rope_table`) in code spans. When code moves or a name
goes, the page must follow: a reader who looks for `tests/test_fast_path.py` and finds nothing stops
trusting the rest. Only paths with a file's extension are checked; placeholders (`lessonNN.py`,
`test_<concept>.py`) and globs are left out.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import course_utils

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "README.ko.md", ROOT / "CONTRIBUTING.md",
         *sorted((ROOT / "docs" / "pages").glob("*.md")), *sorted((ROOT / "notebooks").glob("*.md"))]
TOP = ("course_utils", "course_tools", "tests", "docs", "notebooks", "solutions", "exercises", "translations",
       "binder", ".ci")
# a path is a top-level folder, then anything up to a space, ending in a file's extension
PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(re.escape(t) for t in TOP)})/[^\s`'\"),;:]*\.\w+)")
DOTTED = re.compile(r"^([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(.*\))?$")
PLACEHOLDER = re.compile(r"NN|<|\*|OWNER")


def code_spans(text: str) -> list[str]:
    """The inline code spans of a Markdown text, one line at a time."""
    return re.findall(r"`([^`\n]+)`", text)


@functools.cache
def library_names() -> dict[str, object]:
    """Every module of course_utils by its short name, and every class defined in one, by name (once
    per session: every page's test reads the same table)."""
    names: dict[str, object] = {}
    for info in pkgutil.walk_packages(course_utils.__path__, "course_utils."):
        module = importlib.import_module(info.name)
        names[info.name.rsplit(".", 1)[-1]] = module
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__:
                names[name] = obj
    return names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_in_code_spans_exist(page):
    missing = sorted({m for span in code_spans(page.read_text()) for m in PATH.findall(span)
                      if not PLACEHOLDER.search(m) and not (ROOT / m).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_library_names_in_code_spans_exist(page):
    names = library_names()
    gone = sorted({span for span in code_spans(page.read_text()) if (m := DOTTED.match(span.strip()))
                   and m[1] in names and not hasattr(names[m[1]], m[2])})
    assert not gone, f"{page.relative_to(ROOT)} names library attributes that do not exist: {gone}"


def test_the_checks_catch_a_name_that_is_gone():
    names = library_names()
    assert hasattr(names["attention"], "rope_table") and not hasattr(names["LayerNorm"], "fused")
    assert PATH.findall("see course_utils/train.py and tests/test_fast_path.py.") == [
        "course_utils/train.py", "tests/test_fast_path.py"]
    assert PATH.findall("tests/test_<concept>.py") == ["tests/test_<concept>.py"]  # whole, so the placeholder shows


def test_the_instructors_pages_state_the_graders_defaults():
    """The grading manual repeats the default limits in prose; they must be the code's (both languages)."""
    from course_tools.grading.grade import WALL_GRACE
    from course_tools.grading.job import Limits
    from course_tools.grading.sandbox import Caps

    limits, caps = Limits(), Caps()
    english = (ROOT / "docs" / "pages" / "instructors.md").read_text(encoding="utf-8")
    korean = (ROOT / "docs" / "pages" / "instructors.ko.md").read_text(encoding="utf-8")
    for text, unit in ((english, " s"), (korean, "초")):
        assert f"(`--cell-timeout`, {limits.cell_timeout}{unit})" in text
        assert f"(`--notebook-timeout`, {limits.notebook_timeout}{unit}; {WALL_GRACE}{unit}" in text
        assert f"`--memory-mb`, {caps.memory_mb};" in text
    assert f"`--max-processes`, {caps.processes} tasks" in english
    assert f"`--max-processes`, 작업 {caps.processes}개" in korean
