"""Lecture slides from a lesson's stored outputs: reveal.js through nbconvert's slides exporter.

Cells carry Jupyter's slide metadata (`slideshow.slide_type`: slide, subslide, fragment, skip; no
metadata = "-", the same slide); cells tagged `slides-hide-input` show only their output (figures).
Nothing is executed. `--assets DIR` points at a local folder holding the npm packages reveal.js,
mathjax@2, requirejs, jquery@2 and font-awesome@4, so the slides work offline (see CONTRIBUTING).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
HIDE_INPUT_TAG = "slides-hide-input"
STARTS = ("slide", "subslide")
IMAGE_LINES = 18  # a figure takes about as much height as this many lines of text
BUDGET = 40  # the most lines (prose + code + text output + figures) one slide may hold
# local file of each asset inside the --assets folder (npm's node_modules layout)
ASSETS = {
    "reveal_url_prefix": "reveal.js",
    "mathjax_url": "mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    "require_js_url": "requirejs/require.js",
    "jquery_url": "jquery/dist/jquery.min.js",
    "font_awesome_url": "font-awesome/css/font-awesome.min.css",
}


def slide_type(cell: nbformat.NotebookNode) -> str:
    return cell.metadata.get("slideshow", {}).get("slide_type", "-")


def cell_lines(cell: nbformat.NotebookNode) -> int:
    """Height of a cell on a slide, in lines: its source (unless hidden), text outputs, figures."""
    hidden = HIDE_INPUT_TAG in cell.metadata.get("tags", [])
    lines = 0 if hidden or not cell.source else len(cell.source.splitlines())
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if any(k.startswith("image/") for k in data):
            lines += IMAGE_LINES
        else:
            lines += len((out.get("text") or data.get("text/plain") or "").splitlines())
    return lines


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


def over_budget(nb: nbformat.NotebookNode, budget: int = BUDGET) -> list[str]:
    """One line per slide over the budget, naming its first cell's id."""
    return [f"slide {i} (cell {group[0].id}): {n} lines > {budget}"
            for i, group in enumerate(slides(nb), 1) if (n := sum(map(cell_lines, group))) > budget]


def lesson_path(root: Path, lesson: str, lang: str) -> Path:
    """notebooks[/<lang>]/NN_*.ipynb for a lesson given as NN or NN_topic."""
    folder = root / "notebooks" / (lang if lang != "en" else "")
    found = sorted(folder.glob(f"{lesson}*.ipynb"))
    if len(found) != 1:
        hint = f"; build it with `course translate {lang}`" if lang != "en" else ""
        raise FileNotFoundError(f"no single lesson {lesson!r} in {folder.relative_to(root)}/ "
                                f"({len(found)} found){hint}")
    return found[0]


def exporter(out_dir: Path, assets: Path | None):
    """nbconvert's slides exporter; with `assets`, every script and style points at the local copy."""
    from nbconvert import SlidesExporter
    from traitlets.config import Config

    config = Config()
    config.TagRemovePreprocessor.remove_input_tags = {HIDE_INPUT_TAG}
    config.TagRemovePreprocessor.enabled = True
    config.SlidesExporter.reveal_scroll = True
    config.SlidesExporter.reveal_number = "c/t"
    config.SlidesExporter.reveal_width = "1600"  # a wide canvas scaled to the screen: 30 lines of a cell fit
    config.SlidesExporter.reveal_height = "1100"
    if assets is not None:
        missing = [name for name in ASSETS.values() if not (assets / name.split("?")[0]).exists()]
        if missing:
            raise FileNotFoundError(f"{assets} lacks {missing[0]}; run `npm install --prefix <dir> reveal.js@4 "
                                    "mathjax@2 requirejs jquery@2 font-awesome@4` and pass <dir>/node_modules")
        rel = Path(os.path.relpath(assets.resolve(), out_dir.resolve()))
        for trait, name in ASSETS.items():
            setattr(config.SlidesExporter, trait, (rel / name).as_posix())
    return SlidesExporter(config=config)


# nbconvert's scrolling script measures a slide (in canvas pixels) against the window's height and
# caps it at 95vh, which reveal.js then scales down with the canvas: a slide taller than 95 % of the
# window, not of the canvas, was clipped to about two thirds of the screen. Measure and cap it in
# canvas pixels instead, and apply it to the slide a page opens on as well.
SCROLL_FIXES = {
    "var h = $('.reveal').height() * 0.95;": "var h = Reveal.getConfig().height * 0.95;",
    ".css('height', 'calc(95vh)')": ".css('height', h + 'px')",
    "Reveal.addEventListener('slidechanged', setScrollingSlide);":
        "Reveal.addEventListener('slidechanged', setScrollingSlide);\n"
        "        Reveal.addEventListener('ready', setScrollingSlide);",
}


# Korean (and other CJK) text breaks lines between words, not inside them, as Korean typesetting does.
KEEP_WORDS = "<style>.reveal .slides { word-break: keep-all; }</style>\n</head>"


def fit_scrolling(html: str) -> str:
    """The page with the scrolling script measuring in canvas pixels (see SCROLL_FIXES) and
    Korean lines broken between words."""
    for old, new in SCROLL_FIXES.items():
        html = html.replace(old, new)
    return html.replace("</head>", KEEP_WORDS, 1)


def without_test_markers(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop the `# NBVAL_...` lines (instructions to the tests, not to the audience) from code cells."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = "\n".join(line for line in cell.source.split("\n") if not line.startswith("# NBVAL_"))
    return nb


def build_slides(path: Path, out_dir: Path, assets: Path | None = None) -> Path:
    """Write out_dir/<lesson>.slides.html from the stored outputs of the notebook at `path`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = without_test_markers(nbformat.read(path, as_version=4))
    heading = next((c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown" and c.source), "")
    title = heading.lstrip("# ").strip() or path.stem  # the browser tab shows the lesson, not "Notebook"
    html, _ = exporter(out_dir, assets).from_notebook_node(nb, resources={"metadata": {"name": title}})
    html = fit_scrolling(html)
    target = out_dir / f"{path.stem}.slides.html"
    target.write_text(html, encoding="utf-8")
    return target


def main(args: argparse.Namespace) -> int:
    root = Path(args.root)
    try:
        path = lesson_path(root, args.lesson, args.lang)
        target = build_slides(path, Path(args.out) / args.lang, Path(args.assets) if args.assets else None)
    except (FileNotFoundError, ValueError) as exc:
        print(f"course slides: {exc}", file=sys.stderr)
        return 2
    nb = nbformat.read(path, as_version=4)
    for line in over_budget(nb):
        print(f"warning: {path.name} {line}", file=sys.stderr)
    print(f"wrote {target} ({len(slides(nb))} slides)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slides", help="build reveal.js slides of a lesson from its stored outputs")
    p.add_argument("lesson", help="lesson number or name, e.g. 09")
    p.add_argument("--lang", default="en", help="en (default) or a language edition, e.g. ko")
    p.add_argument("--out", default="build/slides", help="output folder (default build/slides; one per language)")
    p.add_argument("--assets", default=os.environ.get("COURSE_SLIDES_ASSETS"),
                   help="local node_modules with reveal.js, mathjax@2, requirejs, jquery, font-awesome "
                        "(default $COURSE_SLIDES_ASSETS; without it the slides load them from CDNs)")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    p.set_defaults(func=main)
