"""Lecture slides from a lesson's stored outputs: reveal.js through nbconvert's slides exporter.

Cells carry Jupyter's slide metadata (`slideshow.slide_type`: slide, subslide, fragment, skip; no
metadata = "-", the same slide); cells tagged `slides-hide-input` show only their output (figures).
Nothing is executed. A deck is made for a lecture hall without internet: `build/slides/assets/` beside
the decks holds reveal.js and MathJax 3 (copied from the npm packages of `docs/package.json`, installed
with `npm ci` on the first build), the page loads nothing else, and its type is large on a 1280 x 720
canvas; a cell taller than the canvas is cut into pieces (`slide_fit`), and a slide longer than the canvas
holds is continued on a new (vertical) slide at a cell boundary, so that no slide has to scroll.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

from course_tools.editions import banner, slide_fit

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().parent / "slide_templates"  # course_reveal: nbconvert's reveal, offline
NODE_MODULES = ROOT / "docs" / "node_modules"  # the npm packages of docs/package.json, shared with the website
# what a deck loads, copied from NODE_MODULES into the assets folder beside the decks (same relative paths)
ASSETS = ["reveal.js/dist/reveal.js", "reveal.js/dist/reveal.css", "reveal.js/dist/theme/white.css",
          "reveal.js/dist/theme/fonts/source-sans-pro", "reveal.js/plugin/notes/notes.js",
          "mathjax/es5/tex-chtml.js", "mathjax/es5/input/tex/extensions", "mathjax/es5/output/chtml/fonts/woff-v2"]
HIDE_INPUT_TAG = slide_fit.HIDE_INPUT_TAG
STARTS = ("slide", "subslide")
WIDTH, HEIGHT = 1280, 720  # the canvas, in pixels: a projector's 720p (reveal.js keeps a 4 % margin: scale 0.96)
FONT_PX, CODE_PX = 26, 25  # prose and code (and text output) in canvas pixels: at least 24 px on a 1280 x 720 screen
FIGURE_PX = slide_fit.FIGURE_PX  # the tallest a figure is drawn; as wide as the slide otherwise
# a deck's text is drawn with the fonts of the machine that shows it (only the Latin font is bundled), so
# Hangul shows as boxes where no installed font has it: its jamo, compatibility jamo and syllables
HANGUL = re.compile("[\u1100-\u11ff\u3130-\u318f\uac00-\ud7a3]")


def slide_type(cell: nbformat.NotebookNode) -> str:
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def slides(nb: nbformat.NotebookNode) -> list[list[nbformat.NotebookNode]]:
    """The cells of each slide (slide and subslide start one; skip and notes cells are left out)."""
    groups: list[list[nbformat.NotebookNode]] = []
    for cell in nb.cells:
        kind = slide_type(cell)
        if kind in ("skip", "notes"):
            continue
        if kind in STARTS or not groups:
            groups.append([])
        groups[-1].append(cell)
    return groups


def too_tall(nb: nbformat.NotebookNode, canvas: int = slide_fit.CANVAS) -> list[str]:
    """One line per slide still taller than the canvas (a single block or figure that cannot be cut)."""
    return [f"slide {i} (cell {group[0].id}): about {n} px > {canvas}"
            for i, group in enumerate(slides(nb), 1) if (n := sum(map(slide_fit.height, group))) > canvas]


def paginated(nb: nbformat.NotebookNode, page: int = slide_fit.PAGE) -> nbformat.NotebookNode:
    """`nb` with each slide that is taller than `page` (canvas pixels, ``slide_fit.height``) continued on a new
    subslide, at the first cell boundary that would take it over, and with each heading that an author left
    inside a slide starting a subslide of its own (one idea per slide). ``for_the_hall`` has already cut every
    cell taller than a page into pieces (``slide_fit.pieces``)."""
    for group in slides(nb):
        used = 0
        for cell in group:
            h = slide_fit.height(cell)
            heading = cell.cell_type == "markdown" and cell.source.startswith("#")
            if used and (used + h > page or heading):
                cell.metadata.setdefault("slideshow", {})["slide_type"] = "subslide"
                used = 0
            used += h
    return nb


def lesson_path(root: Path, lesson: str, lang: str) -> Path:
    """notebooks[/<lang>]/NN_*.ipynb for a lesson given as NN or NN_topic."""
    folder = root / "notebooks" / (lang if lang != "en" else "")
    found = sorted(folder.glob(f"{lesson}*.ipynb"))
    if len(found) != 1:
        hint = f"; build it with `course translate {lang}`" if lang != "en" else ""
        raise FileNotFoundError(f"no single lesson {lesson!r} in {folder.relative_to(root)}/ "
                                f"({len(found)} found){hint}")
    return found[0]


def bundle(dest: Path, modules: Path = NODE_MODULES) -> Path:
    """Copy the decks' scripts, styles and fonts (ASSETS) from `modules` into `dest`; run `npm ci` in
    docs/ first when they are not installed. Raises FileNotFoundError naming the fix without npm."""
    if not all((modules / name).exists() for name in ASSETS):
        if shutil.which("npm") is None:
            raise FileNotFoundError("npm not found: install Node.js and npm (the slides bundle reveal.js and MathJax "
                                    "from the npm packages of docs/package.json)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=modules.parent, check=True)
    for name in ASSETS:
        source, target = modules / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    return dest


def exporter(assets: str):
    """nbconvert's slides exporter with the course's template; `assets` is the assets folder's URL from the deck."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    config = Config()
    config.TagRemovePreprocessor.remove_input_tags = {HIDE_INPUT_TAG}
    config.TagRemovePreprocessor.enabled = True
    config.SlidesExporter.reveal_number = "c/t"
    config.SlidesExporter.reveal_theme = "white"
    config.SlidesExporter.reveal_width = str(WIDTH)
    config.SlidesExporter.reveal_height = str(HEIGHT)
    config.SlidesExporter.reveal_url_prefix = f"{assets}/reveal.js"
    return SlidesExporter(config=config, template_name="course_reveal", extra_template_basedirs=[str(TEMPLATES)])


# a Markdown link to another file of the course ("[text](../exercises/x.ipynb)"): the deck travels alone
LOCAL_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\((?![a-z][a-z0-9+.-]*:|#)[^)]*\)")


def for_the_hall(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What the audience sees of `nb`: no `# NBVAL_...` lines (instructions to the tests), no widgets (no
    kernel runs behind a slide; their printed static copies stay), links to the course's other files as their
    text only (a deck is copied to the hall without them), a title slide of the lesson's heading and the
    first sentence after it (the first cell's goal, time and prerequisites are for readers), each heading
    starting a cell of its own, and every shown cell taller than a slide cut into pieces that fit."""
    banner.without(nb)  # "generated from ...": for editors, not for the audience
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = LOCAL_LINK.sub(r"\1", cell.source)
        if cell.cell_type == "code":
            cell.source = "\n".join(line for line in cell.source.split("\n") if not line.startswith("# NBVAL_"))
            cell.outputs = [out for out in cell.get("outputs", [])
                            if "application/vnd.jupyter.widget-view+json" not in out.get("data", {})]
    nb.metadata.pop("widgets", None)
    first = next(c for c in nb.cells if c.cell_type == "markdown")
    heading, _, rest = first.source.partition("\n")
    sentence = re.split(r"(?<=[.!?。])\s", rest.strip(), maxsplit=1)[0]
    first.source = f"{heading}\n\n{sentence}" if sentence else heading
    nb.cells = [piece for cell in nb.cells for part in at_headings(cell) for piece in fitted(part)]
    return nb


def fitted(cell: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """A shown cell taller than a slide as pieces that fit (``slide_fit.pieces``); skipped cells and notes whole."""
    if slide_type(cell) in ("skip", "notes"):
        return [cell]
    return slide_fit.pieces(cell)


def at_headings(cell: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """A Markdown cell cut before each heading inside it (e.g. a closing paragraph, then "## Recap"), so
    that ``paginated`` starts every heading on a slide of its own; other cells, and cells with a code
    block (whose "# comment" lines are not headings), stay whole. The pieces get ids "<id>-1", "<id>-2"..."""
    if cell.cell_type != "markdown" or "```" in cell.source:
        return [cell]
    parts = [part.strip("\n") for part in re.split(r"\n(?=#{1,6} )", cell.source)]
    pieces = [cell]
    for i, part in enumerate(parts[1:], 1):
        piece = nbformat.v4.new_markdown_cell(part)
        piece.id = f"{cell.id}-{i}"
        pieces.append(piece)
    cell.source = parts[0]
    return pieces


def hall_deck(path: Path) -> nbformat.NotebookNode:
    """The notebook at `path` as it is shown: cut for the hall (``for_the_hall``), then paginated."""
    return paginated(for_the_hall(nbformat.read(path, as_version=4)))


def build_slides(path: Path, out_dir: Path, nb: nbformat.NotebookNode | None = None) -> Path:
    """Write out_dir/<lesson>.slides.html from the stored outputs of the notebook at `path` (``nb``: its
    ``hall_deck``, when the caller has it already), with the assets it loads in out_dir/../assets (so the
    folder above out_dir is the whole show: copy it, open a deck)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    bundle(out_dir.parent / "assets")
    nb = hall_deck(path) if nb is None else nb
    title = nb.cells[0].source.splitlines()[0].lstrip("# ").strip() if nb.cells else path.stem
    resources = {"metadata": {"name": title or path.stem}, "course_assets": "../assets", "course_font_px": FONT_PX,
                 "course_code_px": CODE_PX, "course_figure_px": FIGURE_PX}
    html, _ = exporter("../assets").from_notebook_node(nb, resources=resources)
    target = out_dir / f"{path.stem}.slides.html"
    target.write_text(html, encoding="utf-8")
    return target


def missing_font(text: str) -> str | None:
    """A one-line note when `text` (a deck) has Hangul and fontconfig finds no font with it (`fc-list
    :lang=ko`): the Korean edition, and the Korean terms the English lessons give. None when there is no
    Hangul, when a font is found, or where there is no fontconfig to ask or it fails (Windows and macOS,
    which ship Korean fonts, have none)."""
    if not HANGUL.search(text) or shutil.which("fc-list") is None:
        return None
    try:
        ran = subprocess.run(["fc-list", ":lang=ko", "family"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if ran.returncode != 0 or ran.stdout.strip():
        return None
    return ("note: no font on this machine has Hangul letters (fc-list :lang=ko finds none), so the deck shows "
            "them as boxes here; install one (e.g. apt-get install fonts-nanum) or show it on a machine that has one")


def main(args: argparse.Namespace) -> int:
    root = Path(args.root)
    try:
        path = lesson_path(root, args.lesson, args.lang)
        nb = hall_deck(path)
        target = build_slides(path, Path(args.out) / args.lang, nb)
    except (FileNotFoundError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"course slides: {exc}", file=sys.stderr)
        return 2
    for line in too_tall(nb):
        print(f"warning: {path.name} {line} (one block taller than the canvas: it scrolls)", file=sys.stderr)
    print(f"wrote {target} ({len(slides(nb))} slides; assets in {target.parent.parent / 'assets'}: "
          "the folder works offline)")
    note = missing_font(target.read_text(encoding="utf-8"))
    if note:
        print(note, file=sys.stderr)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slides", help="build reveal.js slides of a lesson from its stored outputs")
    p.add_argument("lesson", help="lesson number or name, e.g. 09")
    p.add_argument("--lang", default="en", help="en (default) or a language edition, e.g. ko")
    p.add_argument("--out", default="build/slides", help="output folder (default build/slides; one per language)")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    p.set_defaults(func=main)
