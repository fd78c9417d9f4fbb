"""Slides: every lesson has slide metadata, each deck fits the canvas (long slides are continued, a cell
taller than a slide is cut into pieces, and in Chromium no slide scrolls), and a built deck is a lecture
hall's: it loads nothing from outside its folder, and at 1280 x 720 its text is at least 24 px and its figures
as wide as the slide."""

import base64
import re
import shutil
import struct
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest
from browser import Links, chromium

from course_tools.editions import slide_fit, slides

ROOT = Path(__file__).resolve().parent.parent
DECKS = sorted(p for pattern in ("notebooks/*.ipynb", "notebooks/*/*.ipynb") for p in ROOT.glob(pattern)
               if any("slideshow" in c.metadata for c in nbformat.read(p, as_version=4).cells))


def test_every_lesson_has_slides_in_both_languages():
    lessons = sorted(p.name for p in ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
    assert {str(p.relative_to(ROOT)) for p in DECKS} >= {f"notebooks/{lang}{name}" for name in lessons
                                                        for lang in ("", "ko/")}


@pytest.mark.parametrize("path", DECKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_slide_fits_the_canvas(path):
    nb = nbformat.read(path, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")  # lesson 00 opens with two markdown cells
    assert slides.slide_type(setup) == "skip"  # the setup cell is not shown in a lecture
    for group in slides.slides(slides.hall_deck(path)):
        px = sum(map(slide_fit.height, group))
        assert px <= slide_fit.PAGE or (len(group) == 1 and px <= slide_fit.CANVAS), \
            f"slide at cell {group[0].id}: about {px} px in {len(group)} cells"


def png(width: int, height: int) -> str:
    """The first bytes of a PNG of that size, base64: all that ``figure_height`` reads."""
    head = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height) + b"\x08\x06\x00\x00\x00"
    return base64.b64encode(head).decode()


def test_heights_count_code_printouts_and_figures():
    cell = nbformat.v4.new_code_cell("a\nb\nc")
    figure = {"image/png": png(1000, 300), "text/plain": "<Figure>"}
    cell.outputs = [nbformat.v4.new_output("stream", text="x\ny\n\n"),
                    nbformat.v4.new_output("display_data", data=figure)]
    code = slide_fit.CODE_PAD + 3 * slide_fit.CODE_LINE
    printout = slide_fit.OUTPUT_PAD + 3 * slide_fit.OUTPUT_LINE  # "x", "y" and the empty line before the last newline
    drawn = round(slide_fit.FIGURE_WIDTH * 300 / 1000) + slide_fit.FIGURE_PAD  # as wide as the slide
    assert slide_fit.height(cell) == code + printout + drawn
    cell.metadata["tags"] = [slides.HIDE_INPUT_TAG]
    assert slide_fit.height(cell) == printout + drawn
    tall = nbformat.v4.new_output("display_data", data={"image/png": png(500, 1000)})
    assert slide_fit.output_height(tall) == slide_fit.FIGURE_PX + slide_fit.FIGURE_PAD  # drawn at most FIGURE_PX tall
    assert slide_fit.code_height("x" * (slide_fit.CODE_COLUMNS + 1)) == slide_fit.CODE_PAD + 2 * slide_fit.CODE_LINE
    assert slide_fit.columns("어텐션 x") == 8  # a Hangul letter takes two columns
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("p"), cell])
    assert slides.too_tall(nb, canvas=100) == [f"slide 1 (cell {nb.cells[0].id}): about "
                                               f"{slide_fit.height(nb.cells[0]) + printout + drawn} px > 100"]


def test_long_slides_are_continued_and_headings_start_their_own():
    md = nbformat.v4.new_markdown_cell
    cells = [md("# Title\n\nThe goal. More about it.\n\nA second paragraph."), md("a\nb\nc"), md("d\ne"),
             md("f\ng\nh\ni\nj\nk"), md("## Next idea"), md("closing words\n\n## Recap\n\n- x"),
             md("```python\n# a comment, not a heading\n```")]
    cells[1].metadata["slideshow"] = {"slide_type": "slide"}
    page = slide_fit.height(cells[1]) + slide_fit.height(cells[2])  # a and d fit on one slide, f does not join them
    nb = slides.paginated(slides.for_the_hall(nbformat.v4.new_notebook(cells=cells)), page=page)
    assert nb.cells[0].source == "# Title\n\nThe goal."  # the title slide: heading and one sentence
    assert [[c.source.split("\n")[0] for c in group] for group in slides.slides(nb)] == \
        [["# Title"], ["a", "d"], ["f"], ["## Next idea", "closing words"], ["## Recap"], ["```python"]]
    assert nb.cells[-2].id == f"{cells[-2].id}-1"  # a heading inside a cell starts its own slide, as a new cell


def pieces_text(parts: list) -> str:
    return "\n".join(p.source for p in parts if slides.HIDE_INPUT_TAG not in p.metadata.get("tags", []))


def test_a_long_code_cell_is_cut_at_blank_lines_and_its_printout_follows():
    blocks = ["\n".join(f"step_{b}_{i} = {i}" for i in range(12)) for b in range(3)]
    cell = nbformat.v4.new_code_cell("\n\n".join(blocks), metadata={"slideshow": {"slide_type": "subslide"}})
    cell.outputs = [nbformat.v4.new_output("stream", text="".join(f"line {i}\n" for i in range(40)))]
    parts = slide_fit.pieces(cell)
    assert all(slide_fit.height(p) <= slide_fit.PAGE for p in parts)
    inputs = [p for p in parts if slides.HIDE_INPUT_TAG not in p.metadata.get("tags", [])]
    assert [p.source.split("\n")[0] for p in inputs] == ["step_0_0 = 0", "step_1_0 = 0", "step_2_0 = 0"]  # at blanks
    assert pieces_text(parts).replace("\n", "") == cell.source.replace("\n", "")  # nothing lost
    printed = "".join(o.text for p in parts[len(inputs):] for o in p.outputs)
    assert printed == cell.outputs[0].text and len(parts) > len(inputs) + 1  # the printout, in order, cut by lines
    assert parts[0].id == cell.id and slides.slide_type(parts[0]) == "subslide"
    assert [p.id for p in parts[1:]] == [f"{cell.id}-p{i}" for i in range(1, len(parts))]


def test_a_long_list_is_cut_at_its_items_and_a_long_table_keeps_its_header():
    items = "\n".join(f"{i}. item {i}, " + "words " * 30 for i in range(1, 13))
    parts = slide_fit.pieces(nbformat.v4.new_markdown_cell(f"Intro.\n\n{items}"))
    assert len(parts) > 1 and all(slide_fit.height(p) <= slide_fit.PAGE for p in parts)
    assert parts[0].source.startswith("Intro.\n\n1. item 1")
    assert parts[1].source.split(".")[0].isdigit()  # a cut numbered list goes on from its number
    assert "\n".join(p.source for p in parts) == f"Intro.\n\n{items}"
    rows = "\n".join(f"| {i} | " + "cell " * 10 + "|" for i in range(30))
    parts = slide_fit.pieces(nbformat.v4.new_markdown_cell(f"| n | text |\n|---|---|\n{rows}"))
    assert len(parts) > 1 and all(p.source.startswith("| n | text |\n|---|---|\n| ") for p in parts)
    assert [row for p in parts for row in p.source.split("\n")[2:]] == rows.split("\n")  # every row, in order


def test_a_cut_keeps_stream_names_tags_attachments_and_whole_errors():
    out = nbformat.v4.new_output("stream", name="stderr", text="".join(f"w{i}\n" for i in range(40)))
    cell = nbformat.v4.new_code_cell("warn()", outputs=[out], metadata={"tags": ["keep-me"]})
    parts = slide_fit.pieces(cell)
    assert len(parts) > 2 and {o.name for p in parts for o in p.outputs} == {"stderr"}
    cell.metadata["tags"] = ["keep-me", slides.HIDE_INPUT_TAG]  # the first piece is an output piece
    assert slide_fit.pieces(cell)[0].metadata["tags"] == ["keep-me", slides.HIDE_INPUT_TAG]
    text = "\n\n".join(["![x](attachment:a.png)"] + [f"Paragraph {i}." for i in range(30)])
    figure = {"a.png": {"image/png": png(10, 10)}}
    parts = slide_fit.pieces(nbformat.v4.new_markdown_cell(text, attachments=figure))
    assert len(parts) > 1 and all(p.attachments == figure for p in parts)
    red = [f"\x1b[0;31mline {i}\x1b[0m" for i in range(40)]
    error = nbformat.v4.new_output("error", ename="E", evalue="", traceback=red)
    assert slide_fit.output_height(error) == slide_fit.OUTPUT_PAD + 40 * slide_fit.OUTPUT_LINE  # colours not counted
    parts = slide_fit.pieces(nbformat.v4.new_code_cell("fail()", outputs=[error]))
    assert [o for p in parts for o in p.outputs] == [error]  # shown whole, never turned into a printout


def test_code_is_cut_before_a_new_statement_and_never_into_blank_pieces():
    call = ["result = f("] + [f"    arg_{i}," for i in range(12)] + [")"]
    source = "\n".join(call * 3)  # no blank line: cut before "result = f(", never inside the call
    inputs = slide_fit.pieces(nbformat.v4.new_code_cell(source))
    assert len(inputs) > 1 and all(p.source.startswith("result = f(") for p in inputs)
    assert len(slide_fit._code_chunks("\n".join(["a = 1"] * 19 + ["   "] * 30), slide_fit.PAGE)) == 1


def test_list_paragraphs_stay_with_their_items_and_tables_fill_their_slides():
    steps = "\n\n".join(f"1. Step {i}\n\n    more about step {i} " + "w " * 30 for i in range(6))
    parts = slide_fit.pieces(nbformat.v4.new_markdown_cell(steps))
    assert len(parts) > 1 and not any(p.source.startswith(" ") for p in parts)  # an indented start is a code block
    rows = "\n".join(f"| {i} | x |" for i in range(12))
    assert len(slide_fit.pieces(nbformat.v4.new_markdown_cell(f"| n | t |\n|---|---|\n{rows}"))) == 2
    assert slide_fit.blocks("Use `$$` for display math.\n\nNext.") == ["Use `$$` for display math.", "Next."]


def test_cells_that_fit_or_are_not_shown_stay_whole():
    short = nbformat.v4.new_code_cell("x = 1")
    assert slide_fit.pieces(short) == [short]
    long = nbformat.v4.new_markdown_cell("\n\n".join(f"Paragraph {i}." for i in range(40)),
                                         metadata={"slideshow": {"slide_type": "skip"}})
    assert slides.fitted(long) == [long]  # skipped: never shown, never cut
    long.metadata["slideshow"]["slide_type"] = "-"
    assert len(slides.fitted(long)) > 1
    one = nbformat.v4.new_markdown_cell("word " * 2000)  # one paragraph taller than a slide: nothing to cut at
    assert slide_fit.pieces(one) == [one]


def test_the_hall_sees_no_test_markers_nor_widgets():
    cell = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nshow()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "x"}, "text/plain": "VBox()"}),
        nbformat.v4.new_output("stream", text="static table\n")]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# T"), cell], metadata={"widgets": {}})
    nb = slides.for_the_hall(nb)
    assert nb.cells[1].source == "show()" and [o.get("text") for o in nb.cells[1].outputs] == ["static table\n"]
    assert "widgets" not in nb.metadata and nb.cells[0].source == "# T"


def local_references(page: Path) -> list[str]:
    """Every src/href of an HTML page and every url(...) of the CSS files it links, as found problems:
    one that leaves the deck's folder (scheme, host, or a path outside it) or names a missing file."""
    top, problems, queue = page.parent.parent.resolve(), [], [page]
    seen: set[Path] = set()
    while queue:
        file = queue.pop()
        if file in seen:
            continue
        seen.add(file)
        text = file.read_text(encoding="utf-8", errors="replace")
        if file.suffix == ".html":
            parser = Links()
            parser.feed(text)
            refs = parser.links
        else:
            refs = re.findall(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""", text)
            refs = [a or b for a, b in refs]
        for ref in refs:
            parts = urlsplit(ref)
            if ref.startswith(("#", "data:", "javascript:")) or (not parts.scheme and not parts.path):
                continue
            target = (file.parent / parts.path).resolve()
            if parts.scheme or parts.netloc or not target.is_relative_to(top):
                problems.append(f"{file.name}: {ref} leaves the deck's folder")
            elif not target.exists():
                problems.append(f"{file.name}: {ref} does not exist")
            elif target.suffix == ".css":
                queue.append(target)
    return problems


@pytest.fixture(scope="module")
def decks(tmp_path_factory) -> Path:
    """Lesson 09's decks, English and Korean, built once into a fresh folder (assets bundled)."""
    out = tmp_path_factory.mktemp("slides")
    for lang in ("en", "ko"):
        slides.build_slides(slides.lesson_path(ROOT, "09", lang), out / lang)
    return out


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_deck_uses_the_stored_outputs_and_requests_nothing_outside_its_folder(decks, lang):
    path = slides.lesson_path(ROOT, "09", lang)
    deck = decks / lang / f"{path.stem}.slides.html"
    html = deck.read_text(encoding="utf-8")
    nb = slides.hall_deck(path)
    horizontal = sum(slides.slide_type(group[0]) == "slide" for group in slides.slides(nb))
    assert html.count("<section") == len(slides.slides(nb)) + horizontal
    assert html.count("data:image/png;base64") >= 2  # both figures, from the stored outputs
    assert "\\underbrace" in html  # the math goes to MathJax
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)  # a figure's bytes may spell anything
    assert ("# YOUR CODE HERE" not in text) and ("HIDE" not in text) and "NBVAL" not in text
    assert local_references(deck) == []
    assert not re.search(r"https?://(?!www\.w3\.org)", "\n".join(re.findall(r"<(?:script|link)[^>]*>", html)))
    title = nb.cells[0].source.splitlines()[0].lstrip("# ")
    assert f"<title>{title} slides</title>" in html
    if lang == "ko":
        assert "어블레이션 사다리" in html


def test_reference_check_catches_outside_and_missing_files(tmp_path):
    (tmp_path / "en").mkdir()
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "a.css").write_text("@import url(./fonts/f.css); b { background: url(data:x) }")
    page = tmp_path / "en" / "deck.html"
    page.write_text('<link href="../assets/a.css"><script src="https://unpkg.com/x.js"></script>'
                    '<img src="../../outside.png"><a href="#/3">x</a>')
    (tmp_path / "outside.png").write_bytes(b"")
    assert local_references(page) == ["deck.html: https://unpkg.com/x.js leaves the deck's folder",
                                      "deck.html: ../../outside.png leaves the deck's folder",
                                      "a.css: ./fonts/f.css does not exist"]


MEASURE = """() => {
  const scale = Reveal.getScale(), px = (el) => parseFloat(getComputedStyle(el).fontSize) * scale;
  const text = [...document.querySelectorAll('.reveal .slides p, .reveal .slides li, .reveal .slides pre')];
  const figures = [...document.querySelectorAll('.reveal .slides img')].map((img) => {
    const section = img.closest('section');
    Reveal.slide(Reveal.getIndices(section).h, Reveal.getIndices(section).v);  // shown, so it has a width
    return img.getBoundingClientRect().width / section.getBoundingClientRect().width;
  });
  const limit = Reveal.getConfig().height * 0.95, scrolling = [];  // what scrollTallSlides would scroll
  for (const section of Reveal.getSlides()) {
    const at = Reveal.getIndices(section);
    Reveal.slide(at.h, at.v);
    if (section.scrollHeight > limit) scrolling.push(`${at.h}/${at.v}: ${section.scrollHeight} px`);
  }
  return {smallest: Math.min(...text.map(px)), figures, math: document.querySelectorAll('mjx-container').length,
          slides: Reveal.getTotalSlides(), scrolling};
}"""


@pytest.mark.slow
@pytest.mark.parametrize("lang", ["en", "ko"])
def test_deck_offline_in_a_browser_is_readable_at_720p(decks, lang):
    """Opened from its file with every other request blocked: nothing fails, text is at least 24 px on a
    1280 x 720 screen, figures span the slide, MathJax typesets, and no slide is taller than the canvas
    (before cells were cut to fit, 11 of the 35 English slides scrolled, 12 of the 34 Korean)."""
    from playwright.sync_api import sync_playwright

    deck = decks / lang / f"{slides.lesson_path(ROOT, '09', lang).stem}.slides.html"
    outside, failed, errors = [], [], []

    def route(r) -> None:
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium("the slides check"), headless=True,
                                        args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.route("**/*", route)
        page.on("requestfailed", lambda r: failed.append(r.url))
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(deck.as_uri(), wait_until="networkidle")
        page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise")
        page.evaluate("MathJax.startup.promise")
        seen = page.evaluate(MEASURE)
        browser.close()
    assert (outside, failed, errors) == ([], [], [])
    assert seen["slides"] == len(slides.slides(slides.hall_deck(slides.lesson_path(ROOT, "09", lang))))
    assert seen["smallest"] >= 24, seen
    assert len(seen["figures"]) >= 2 and min(seen["figures"]) > 0.95, seen
    assert seen["math"] > 0
    assert seen["scrolling"] == []


def test_missing_lesson_names_the_fix():
    with pytest.raises(FileNotFoundError, match="course translate fr"):
        slides.lesson_path(ROOT, "09", "fr")


def test_missing_npm_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(slides.shutil, "which", lambda program: None)
    with pytest.raises(FileNotFoundError, match="install Node.js and npm"):
        slides.bundle(tmp_path / "assets", modules=tmp_path / "node_modules")


@pytest.mark.parametrize("path", DECKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_deck_builds_with_one_section_per_slide(tmp_path, path):
    html = slides.build_slides(path, tmp_path / "deck").read_text(encoding="utf-8")
    nb = slides.hall_deck(path)
    horizontal = sum(slides.slide_type(group[0]) == "slide" for group in slides.slides(nb))
    assert html.count("<section") == len(slides.slides(nb)) + horizontal
    assert "NBVAL" not in html  # the tests' markers are not shown to the audience


def test_links_to_other_course_files_become_their_text_on_a_slide():
    """A deck is copied to the hall alone: a link to a notebook would lead nowhere, a web link or an image stays."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title\n\nGoal."),
                                         nbformat.v4.new_markdown_cell(
        "Do [`exercises/ko/09.ipynb`](../../exercises/ko/09.ipynb), read [the paper](https://arxiv.org/abs/1706.03762),"
        " see [above](#top) and ![a figure](attachment:fig.png).")])
    text = slides.for_the_hall(nb).cells[1].source
    assert text == ("Do `exercises/ko/09.ipynb`, read [the paper](https://arxiv.org/abs/1706.03762), see [above](#top)"
                    " and ![a figure](attachment:fig.png).")


@pytest.mark.parametrize("families, code, expected", [("", 0, "apt-get install fonts-nanum"),
                                                      ("NanumGothic,나눔고딕\n", 0, None),
                                                      ("", 1, None)])  # fontconfig failed: no verdict
def test_a_deck_with_hangul_says_when_no_font_has_it(monkeypatch, families, code, expected):
    asked = []
    monkeypatch.setattr(slides.shutil, "which", lambda program: f"/usr/bin/{program}")
    monkeypatch.setattr(slides.subprocess, "run", lambda cmd, **kw: asked.append(cmd)
                        or subprocess.CompletedProcess(cmd, code, families, ""))
    note = slides.missing_font("<p>이천이십육</p>")
    assert asked == [["fc-list", ":lang=ko", "family"]]
    assert note is None if expected is None else expected in note and "Hangul" in note


def test_no_font_is_asked_for_without_hangul_nor_without_fontconfig(monkeypatch):
    monkeypatch.setattr(slides.subprocess, "run", lambda *a, **kw: pytest.fail("nothing to ask"))
    assert slides.missing_font("<p>Read 2026 in Sino-Korean.</p>") is None
    monkeypatch.setattr(slides.shutil, "which", lambda program: None)
    assert slides.missing_font("<p>이천이십육</p>") is None


@pytest.mark.skipif(shutil.which("fc-list") is None, reason="no fontconfig on this machine")
def test_the_note_follows_this_machines_fontconfig():
    found = subprocess.run(["fc-list", ":lang=ko", "family"], capture_output=True, text=True).stdout.strip()
    assert (slides.missing_font("이천이십육") is None) == bool(found)
