"""Build the course website: ``python docs/build.py [--out DIR]`` (default ``docs/_build/html``).

The README becomes the home page, each notebook of ``notebooks/`` and ``exercises/`` a page with its
stored outputs and a download link, and every other Markdown page (glossary, lecture maps,
CONTRIBUTING) a page under Reference. MathJax and the widget manager come from
the npm registry (``docs/package-lock.json``) and are served by the site itself, so a page needs no
network. The build fails on any Sphinx warning, a missing lesson page or a broken internal link.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PAGES = ["notebooks/*.ipynb", "exercises/*.ipynb", "notebooks/ko/*.ipynb", "exercises/ko/*.ipynb"]
# pages moved out of the README (docs/pages), glossary, lecture maps, CONTRIBUTING: all Markdown but the README
REFERENCE = ["docs/pages/*.md", "notebooks/*.md", "*.md"]
VENDOR = {  # file or folder in docs/node_modules -> where the pages load it from (under _static/vendor)
    "mathjax/es5": "mathjax",
    "requirejs/require.js": "require.js",
    "@jupyter-widgets/html-manager/dist": "html-manager",
}
SECTIONS = {  # folder -> (title, intro) of its index page, which lists the folder's notebooks
    "notebooks": ("Lessons", "Each lesson as stored in the repository, outputs from a `cpu`-mode run. "
                  "Download a notebook (link on each page) to run it in your own Jupyter."),
    "exercises": ("Exercises", "The exercise notebooks, read-only here: download one (link on each page), "
                  "fill in the functions and run the check cells in your own Jupyter."),
    "notebooks/ko": ("한국어판 레슨 (Korean edition)",
                     "영어판과 같은 코드와 저장된 출력에 한국어 설명을 붙인 레슨입니다. "
                     "번역이 끝난 레슨만 실려 있습니다 (`course translate ko`로 만듭니다)."),
    "exercises/ko": ("한국어판 연습문제 (Korean exercises)",
                     "영어판과 채점 ID가 같은 한국어 연습문제 노트북입니다. "
                     "내려받아 자신의 Jupyter에서 풀고 확인 셀을 실행하세요."),
}
HOME_NAV = """

```{toctree}
:hidden:

notebooks/index
exercises/index
notebooks/ko/index
exercises/ko/index
reference
```
"""
REFERENCE_INTRO = ("Grading, performance, the `course` command and the developer notes; the glossary, the maps from "
                   "the source texts to the lessons, and how lessons are written.")


class BuildError(Exception):
    """A one-line reason the site is not fit to publish."""


def lesson_names(folder: str) -> list[str]:
    return [f"{folder}/{p.stem}" for p in sorted((ROOT / folder).glob("*.ipynb"))]


def reference_pages() -> list[Path]:
    """The Markdown pages shown besides the lessons (the README is the home page)."""
    return [p for pattern in REFERENCE for p in sorted(ROOT.glob(pattern)) if p.name != "README.md"]


WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def frozen_widgets(text: str) -> str:
    """A notebook's JSON with every saved widget control disabled: without a kernel behind the page, a
    control the reader could move would leave the numbers and figures it drives as they were saved
    (lesson 07's calculator would show GPT-2 small's count beside "gpt2_medium")."""
    nb = json.loads(text)
    saved = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE)
    if not saved:
        return text
    for model in saved["state"].values():
        if "disabled" in model["state"]:
            model["state"]["disabled"] = True
    return json.dumps(nb, ensure_ascii=False, indent=1) + "\n"


def stage(src: Path) -> None:
    """Copy the pages, the configuration and the vendored scripts into one Sphinx source folder."""
    if src.exists():
        shutil.rmtree(src)
    references = reference_pages()
    for path in [p for pattern in PAGES for p in ROOT.glob(pattern)] + references:
        target = src / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text(encoding="utf-8")
        if path in references:  # the README is the home page: links to it go to index.md
            text = re.sub(r"\]\(((?:\.\./)*)README\.md", r"](\1index.md", text)
        target.write_text(frozen_widgets(text) if path.suffix == ".ipynb" else text, encoding="utf-8")
    shutil.copy2(ROOT / "LICENSE", src / "LICENSE")
    (src / "index.md").write_text((ROOT / "README.md").read_text(encoding="utf-8") + HOME_NAV, encoding="utf-8")
    reference = "\n".join(str(p.relative_to(ROOT).with_suffix("")) for p in references)
    toctree = f"```{{toctree}}\n:maxdepth: 1\n\n{reference}\n```\n"
    (src / "reference.md").write_text(f"# Reference\n\n{REFERENCE_INTRO}\n\n{toctree}", encoding="utf-8")
    for folder, (title, intro) in SECTIONS.items():
        pages = "\n".join(Path(name).name for name in lesson_names(folder))
        toctree = f"```{{toctree}}\n:maxdepth: 1\n\n{pages}\n```\n"
        (src / folder / "index.md").write_text(f"# {title}\n\n{intro}\n\n{toctree}")
    shutil.copy2(DOCS / "conf.py", src / "conf.py")
    shutil.copytree(DOCS / "_templates", src / "_templates")
    shutil.copytree(DOCS / "_static", src / "_static")
    vendor(src / "_static" / "vendor")


def vendor(dest: Path) -> None:
    """Copy MathJax, require.js and the widget manager from docs/node_modules (``npm ci`` if missing)."""
    modules = DOCS / "node_modules"
    if not all((modules / name).exists() for name in VENDOR):
        if shutil.which("npm") is None:
            raise BuildError("npm not found: install Node.js and npm (the site serves MathJax from its npm package)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=DOCS, check=True)
    skip = shutil.ignore_patterns("*.map", "embed.js*", "libembed-amd.js", "*svg*.js", "node-main.js")
    for name, target in VENDOR.items():
        source = modules / name
        if source.is_dir():
            shutil.copytree(source, dest / target, ignore=skip)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / target)


def sphinx(src: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", str(src), str(out),
           "-d", str(src / ".doctrees")]
    if subprocess.run(cmd).returncode != 0:
        raise BuildError("sphinx-build reported warnings or errors (above)")
    for name in [name for folder in SECTIONS for name in lesson_names(folder)]:  # the downloads, as committed
        shutil.copy2(ROOT / f"{name}.ipynb", out / f"{name}.ipynb")


class Links(HTMLParser):
    """Collects the href/src values and the element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("href", "src") and value:
                self.links.append(value)
            elif key in ("id", "name") and value:
                self.ids.add(value)


def parse(page: Path, cache: dict[Path, Links]) -> Links:
    if page not in cache:
        cache[page] = Links()
        cache[page].feed(page.read_text(encoding="utf-8"))
    return cache[page]


def broken_links(out: Path) -> list[str]:
    """Internal links (relative href/src) whose file, or whose #anchor in that file, does not exist."""
    cache: dict[Path, Links] = {}
    broken = []
    for page in sorted(out.rglob("*.html")):
        if page.relative_to(out).parts[0] == "_static":  # theme templates, not pages
            continue
        for link in parse(page, cache).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(out)}: {link} (no such file)")
            elif parts.fragment and target.suffix == ".html" \
                    and unquote(parts.fragment) not in parse(target, cache).ids:
                broken.append(f"{page.relative_to(out)}: {link} (no such anchor)")
    return broken


def check(out: Path) -> None:
    """Every lesson and exercise has its page and download, the home page exists, no internal link is broken."""
    wanted = ["index.html", "search.html", "notebooks/GLOSSARY.html"]
    for name in [name for folder in SECTIONS for name in lesson_names(folder)]:
        wanted += [f"{name}.html", f"{name}.ipynb"]
    missing = [name for name in wanted if not (out / name).exists()]
    if missing:
        raise BuildError(f"missing pages: {', '.join(missing)}")
    broken = broken_links(out)
    if broken:
        raise BuildError(f"{len(broken)} broken internal links, first: " + "; ".join(broken[:5]))


def build(out: Path) -> None:
    """Stage the sources beside ``out`` (in ``out`` + "_src"), build into ``out``, check the result."""
    src = out.with_name(out.name + "_src")
    stage(src)
    sphinx(src, out)
    check(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the course website from the notebooks' stored outputs.")
    parser.add_argument("--out", type=Path, default=DOCS / "_build" / "html", help="output folder (replaced)")
    args = parser.parse_args(argv)
    try:
        build(args.out.resolve())
    except BuildError as exc:
        print(f"site build failed: {exc}", file=sys.stderr)
        return 1
    print(f"site built in {args.out}: open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
