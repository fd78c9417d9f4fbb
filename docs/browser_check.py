"""Open the built site in headless Chromium and check what a reader sees.

``python docs/browser_check.py [--site docs/_build/html] [--screenshots DIR]``. Needs Playwright (PyPI)
and a Chromium: Debian's ``chromium`` package, ``--chromium PATH``, or ``--chromium bundled`` (Playwright's
own download). Every page of the site is opened; an uncaught JavaScript error or a console error on any
of them is a failure, and so is every request that leaves localhost (blocked: the pages must work offline).
Then lesson 05's math and figures, lesson 07's calculator and the search are checked in detail.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

DOCS = Path(__file__).resolve().parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(site: Path) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def check_math_and_figures(page, base: str) -> list[str]:
    """Lesson 05: MathJax typeset the formulas (no raw $$ left) and every figure loaded."""
    page.goto(base + "notebooks/05_positional_encoding.html")
    page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate("MathJax.startup.promise")
    n_math = page.locator("mjx-container").count()
    raw = page.evaluate("document.querySelector('main').innerText.includes('$$')")
    page.wait_for_load_state("load")
    images = page.evaluate("[...document.querySelectorAll('main img')].map(i => [i.src, i.naturalWidth])")
    empty = [src for src, width in images if width == 0]
    problems = []
    if n_math < 5 or raw:
        problems.append(f"lesson 05: {n_math} typeset formulas, raw $$ left: {raw}")
    if not images or empty:
        problems.append(f"lesson 05: {len(images)} figures, {len(empty)} not loaded (first: {empty[:1]})")
    print(f"lesson 05: {n_math} formulas typeset, no raw $$: {not raw}; {len(images)} figures, all loaded: {not empty}")
    return problems


def check_calculator(page, base: str) -> list[str]:
    """Lesson 07: the calculator's saved widgets render with their controls disabled (no kernel computes a
    new choice, so picking gpt2_medium must not be possible beside GPT-2 small's numbers), and the static
    table below gives every model's count."""
    page.goto(base + "notebooks/07_gpt_model.html")
    page.wait_for_selector(".widget-dropdown select", timeout=20_000)
    choice = page.locator(".widget-dropdown select").first
    live, disabled = choice.input_value(), choice.is_disabled()
    inputs = page.locator(".widget-inline-hbox input")
    editable = [i for i in range(inputs.count()) if not inputs.nth(i).is_disabled()]
    shown = page.locator(".widget-html-content", has_text="124,439,808").count()
    static = page.locator("main pre", has_text="354,823,168").count()  # gpt2_medium, GELU
    print(f"lesson 07: calculator shows model {live!r} with GPT-2 small's count: {shown > 0}; dropdown disabled: "
          f"{disabled}, {len(editable)} editable inputs; static table with gpt2_medium: {static > 0}")
    problems = []
    if not (live == "gpt2" and shown and disabled and not editable):
        problems.append(f"lesson 07: the calculator's saved widgets can be changed without a kernel (model {live!r},"
                        f" dropdown disabled: {disabled}, {len(editable)} editable inputs)")
    if not static:
        problems.append("lesson 07: the static table (gpt2_medium: 354,823,168) is not on the page")
    return problems


def check_search(page, base: str) -> list[str]:
    """Search for "multi-head" lists lesson 03."""
    page.goto(base + "search.html?q=multi-head")
    page.wait_for_selector("#search-results ul.search li", timeout=20_000)
    hrefs = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.href)")
    hit = any("03_multi_head_attention" in h for h in hrefs)
    print(f"search 'multi-head': {len(hrefs)} results, lesson 03 among them: {hit}")
    return [] if hit else [f"search 'multi-head' does not list lesson 03 (got {hrefs[:3]})"]


def pages(site: Path) -> list[str]:
    """Every HTML page of the site (the theme's own files under _static excluded)."""
    return [p.relative_to(site).as_posix() for p in sorted(site.rglob("*.html"))
            if p.relative_to(site).parts[0] not in ("_static", "_sources")]


def listen(page) -> list[str]:
    """A list that collects, from now on, every uncaught error and console error of ``page``."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught {str(exc).splitlines()[0]}"))
    page.on("console", lambda msg: errors.append(f"console error: {msg.text[:200]}") if msg.type == "error" else None)
    return errors


def check_every_page(page, base: str, names: list[str], errors: list[str] | None = None) -> list[str]:
    """Open each page and wait until its scripts are done; any uncaught error or console error fails.
    ``errors`` is the page's ``listen`` list, when the caller listens for longer than this check."""
    errors = listen(page) if errors is None else errors
    problems = []
    for name in names:
        try:
            page.goto(base + name, wait_until="networkidle", timeout=60_000)
        except Exception as exc:  # noqa: BLE001 - Playwright's TimeoutError
            problems.append(f"{name}: {str(exc).splitlines()[0]}")
            problems += [f"{name}: {error}" for error in errors]
            errors.clear()
            continue
        if page.locator(".jupyter-widgets, script[type='application/vnd.jupyter.widget-view+json']").count():
            page.wait_for_timeout(1500)  # the widget manager renders after the load, in its own time
        problems += [f"{name}: {error}" for error in errors]
        errors.clear()
    print(f"{len(names)} pages opened, {len(problems)} JavaScript errors")
    return problems


def screenshots(page, base: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    page.goto(base + "index.html")
    page.screenshot(path=str(folder / "home.png"))
    page.goto(base + "notebooks/05_positional_encoding.html")
    page.evaluate("MathJax.startup.promise")
    page.locator("mjx-container[display='true']").first.scroll_into_view_if_needed()
    page.screenshot(path=str(folder / "lesson05_math.png"))
    page.goto(base + "notebooks/07_gpt_model.html")
    page.locator("#the-live-parameter-calculator").first.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(folder / "lesson07_calculator.png"))


def run(site: Path, chromium: str, shots: Path | None) -> list[str]:
    from playwright.sync_api import sync_playwright

    server, base = serve(site)
    outside: list[str] = []

    def route(r) -> None:
        if urlsplit(r.request.url).hostname == "127.0.0.1":
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()

    try:
        with sync_playwright() as pw:
            path = None if chromium == "bundled" else chromium
            browser = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.route("**/*", route)
            errors = listen(page)
            problems = check_every_page(page, base, pages(site), errors)
            problems += check_math_and_figures(page, base) + check_calculator(page, base) + check_search(page, base)
            problems += [f"during the math, calculator and search checks: {error}" for error in errors]
            if shots:
                screenshots(page, base, shots)
            browser.close()
    finally:
        server.shutdown()
    if outside:
        problems.append(f"{len(outside)} requests left the site (blocked), first: {outside[0]}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the built course website in headless Chromium.")
    parser.add_argument("--site", type=Path, default=DOCS / "_build" / "html", help="the built site")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium",
                        help="Chromium binary (Debian: apt-get install chromium), or 'bundled' for the one "
                             "that `python -m playwright install chromium` downloads")
    parser.add_argument("--screenshots", type=Path, help="also save screenshots of three pages here")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").exists():
        print(f"no site in {args.site}: build it first with python docs/build.py", file=sys.stderr)
        return 1
    if args.chromium != "bundled" and not Path(args.chromium).exists():
        print(f"Chromium not found at {args.chromium}: apt-get install chromium, or pass --chromium", file=sys.stderr)
        return 1
    problems = run(args.site, args.chromium, args.screenshots)
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
