"""Slides: every lesson with slide metadata fits the budget, and the reveal.js build uses the stored outputs."""

import re
from pathlib import Path

import nbformat
import pytest

from course_tools import slides

ROOT = Path(__file__).resolve().parent.parent
DECKS = sorted(p for pattern in ("notebooks/*.ipynb", "notebooks/*/*.ipynb") for p in ROOT.glob(pattern)
               if any("slideshow" in c.metadata for c in nbformat.read(p, as_version=4).cells))


def test_every_lesson_has_slides_in_both_languages():
    lessons = sorted(p.name for p in ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
    assert {str(p.relative_to(ROOT)) for p in DECKS} >= {f"notebooks/{lang}{name}" for name in lessons
                                                        for lang in ("", "ko/")}


@pytest.mark.parametrize("path", DECKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_slide_over_budget(path):
    nb = nbformat.read(path, as_version=4)
    assert slides.over_budget(nb) == []
    setup = next(c for c in nb.cells if c.cell_type == "code")  # lesson 00 opens with two markdown cells
    assert slides.slide_type(setup) == "skip"  # the setup cell is not shown in a lecture


def test_budget_counts_code_outputs_and_figures():
    cell = nbformat.v4.new_code_cell("a\nb\nc")
    cell.outputs = [nbformat.v4.new_output("stream", text="x\ny\n"),
                    nbformat.v4.new_output("display_data", data={"image/png": "AAAA", "text/plain": "<Figure>"})]
    assert slides.cell_lines(cell) == 3 + 2 + slides.IMAGE_LINES
    cell.metadata["tags"] = [slides.HIDE_INPUT_TAG]
    assert slides.cell_lines(cell) == 2 + slides.IMAGE_LINES
    nb = nbformat.v4.new_notebook(cells=[cell, nbformat.v4.new_markdown_cell("p\nq")])
    assert slides.over_budget(nb, budget=10) == [f"slide 1 (cell {cell.id}): {slides.cell_lines(cell) + 2} lines > 10"]


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_build_offline_slides(tmp_path, lang):
    assets = tmp_path / "node_modules"
    for name in slides.ASSETS.values():
        file = assets / name.split("?")[0]
        file.parent.mkdir(parents=True, exist_ok=True)
        file.touch()
    path = slides.lesson_path(ROOT, "09", lang)
    nb = nbformat.read(path, as_version=4)
    html = slides.build_slides(path, tmp_path / "out", assets).read_text(encoding="utf-8")
    horizontal = sum(slides.slide_type(group[0]) == "slide" for group in slides.slides(nb))
    assert html.count("<section") == len(slides.slides(nb)) + horizontal
    assert html.count("data:image/png;base64") >= 2  # both figures, from the stored outputs
    assert "\\underbrace" in html  # the math goes to MathJax
    assert not re.search(r"unpkg\.com|cdnjs\.cloudflare\.com/ajax/libs/(mathjax|require|jquery|font-awesome)", html)
    assert "../node_modules/mathjax/MathJax.js" in html
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)  # a figure's bytes may spell anything
    assert ("# YOUR CODE HERE" not in text) and ("HIDE" not in text)
    # a tall slide scrolls within the canvas (in canvas pixels), not within 95 % of the window
    assert "calc(95vh)" not in html and "$('.reveal').height()" not in html
    assert all(fixed in html for fixed in slides.SCROLL_FIXES.values())
    assert "word-break: keep-all" in html
    title = nb.cells[0].source.splitlines()[0].lstrip("# ")
    assert f"<title>{title} slides</title>" in html
    if lang == "ko":
        assert "어블레이션 사다리" in html


def test_missing_assets_and_lesson_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="npm install"):
        slides.exporter(tmp_path, tmp_path)
    with pytest.raises(FileNotFoundError, match="course translate fr"):
        slides.lesson_path(ROOT, "09", "fr")


@pytest.mark.parametrize("path", DECKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_deck_builds_with_one_section_per_slide(tmp_path, path):
    html = slides.build_slides(path, tmp_path, None).read_text(encoding="utf-8")
    nb = nbformat.read(path, as_version=4)
    horizontal = sum(slides.slide_type(group[0]) == "slide" for group in slides.slides(nb))
    assert html.count("<section") == len(slides.slides(nb)) + horizontal
    assert "NBVAL" not in html  # the tests' markers are not shown to the audience
