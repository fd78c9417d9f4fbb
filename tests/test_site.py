"""The website: it builds offline from the repository, every lesson has its page, no internal link is
broken, and in headless Chromium no page has a JavaScript error, lesson 05 shows typeset math and its
figures, lesson 07 its calculator (frozen: no kernel behind it), and search finds lesson 03
(docs/browser_check.py). In CI (CI=true) a missing Chromium is a failure."""

import argparse
import json
import re
from pathlib import Path

import pytest
from browser import chromium, load_docs

ROOT = Path(__file__).resolve().parent.parent


site_build = load_docs("build")
browser_check = load_docs("browser_check")
commands = load_docs("commands")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "html"
    assert site_build.main(["--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_every_lesson_and_exercise_has_a_page_and_a_download(site):
    for folder in ("notebooks", "exercises"):
        for nb in (ROOT / folder).glob("*.ipynb"):
            page = (site / folder / f"{nb.stem}.html").read_text(encoding="utf-8")
            assert f'href="{nb.stem}.ipynb"' in page and (site / folder / nb.name).exists()
    lesson03 = (site / "notebooks" / "03_multi_head_attention.html").read_text(encoding="utf-8")
    assert re.search(r'class="left-prev"\s+href="02_self_attention.html"', lesson03)
    assert re.search(r'class="right-next"\s+href="04_ffn_residual_layernorm.html"', lesson03)
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Course map" in home and 'href="notebooks/03_multi_head_attention.html"' in home


@pytest.mark.slow
def test_command_reference_is_current_and_names_every_flag(site):
    assert commands.main(["--check"]) == 0, "run python docs/commands.py"
    text = commands.PAGE.read_text(encoding="utf-8")
    for words, (parser, _) in every_command().items():
        assert f"### `{words}`" in text
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):  # -h/--help: every command has it, the page says so once
                continue
            assert all(f"`{flag}" in text for flag in action.option_strings if action.help != "==SUPPRESS==")
    assert "/" + "work" not in text and str(ROOT) not in text  # defaults inside the checkout are shown relative
    assert (site / "docs" / "pages" / "commands.html").exists()


@pytest.mark.slow
def test_no_page_loads_a_script_from_elsewhere(site):
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert "cdn.jsdelivr" not in text and "cdnjs" not in text and "unpkg.com" not in text, page


def test_broken_links_and_missing_pages_are_reported(tmp_path):
    (tmp_path / "a.html").write_text('<a href="b.html#here">b</a> <a href="b.html#gone">x</a> <img src="c.png">'
                                     '<a href="https://example.org/">out</a> <a href="#top" id="top">top</a>')
    (tmp_path / "b.html").write_text('<h1 id="here">b</h1>')
    assert site_build.broken_links(tmp_path) == ["a.html: b.html#gone (no such anchor)",
                                                 "a.html: c.png (no such file)"]
    with pytest.raises(site_build.BuildError, match="missing pages: index.html"):
        site_build.check(tmp_path)


@pytest.mark.slow
def test_saved_widgets_are_disabled_on_the_site_but_not_in_the_download(site):
    nb = json.loads((ROOT / "notebooks" / "07_gpt_model.ipynb").read_text(encoding="utf-8"))
    frozen = json.loads(site_build.frozen_widgets(json.dumps(nb)))
    for saved, state in ((nb, False), (frozen, True)):
        models = saved["metadata"]["widgets"][site_build.WIDGET_STATE]["state"].values()
        controls = [m["state"]["disabled"] for m in models if "disabled" in m["state"]]
        assert len(controls) == 6 and set(controls) == {state}  # dropdown, four numbers, the SwiGLU box
    download = site / "notebooks" / "07_gpt_model.ipynb"
    assert download.read_bytes() == (ROOT / "notebooks" / "07_gpt_model.ipynb").read_bytes()
    assert site_build.frozen_widgets('{"cells": []}') == '{"cells": []}'


@pytest.mark.slow
def test_page_errors_fail_the_browser_check(tmp_path):
    from playwright.sync_api import sync_playwright

    (tmp_path / "favicon.ico").write_bytes(b"")  # else the browser's request for it logs a 404
    (tmp_path / "ok.html").write_text("<p>fine</p>")
    (tmp_path / "throws.html").write_text("<script>MathJax.Hub.Queue(['Typeset'])</script>")
    (tmp_path / "logs.html").write_text("<script>console.error('widget failed')</script>")
    assert browser_check.pages(tmp_path) == ["logs.html", "ok.html", "throws.html"]
    server, base = browser_check.serve(tmp_path)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium("the browser check"), headless=True,
                                        args=browser_check.CHROMIUM_ARGS)
            problems = browser_check.check_every_page(browser.new_page(), base, browser_check.pages(tmp_path))
            browser.close()
    finally:
        server.shutdown()
    assert problems == ["logs.html: console error: widget failed", "throws.html: uncaught MathJax is not defined"]


@pytest.mark.slow
def test_readers_see_math_figures_widgets_and_search(site, tmp_path):
    assert browser_check.run(site, chromium("the browser check"), tmp_path / "screenshots") == []
    assert len(list((tmp_path / "screenshots").glob("*.png"))) == 3


@pytest.mark.slow
def test_pages_say_their_language_and_link_to_the_other_one(site):
    conf = load_docs("conf")
    assert conf.counterparts("notebooks/ko/02_self_attention") == ["notebooks/02_self_attention"]
    assert conf.counterparts("exercises/02_self_attention")[0] == "exercises/ko/02_self_attention"
    assert (conf.counterparts("index"), conf.counterparts("README.ko")) == (["README.ko"], ["index"])
    assert conf.counterparts("notebooks/GLOSSARY")[-1] == "notebooks/GLOSSARY.ko"
    glossary = (site / "notebooks" / "GLOSSARY.html").read_text(encoding="utf-8")
    assert 'href="GLOSSARY.ko.html" hreflang="ko"' in glossary
    for folder in ("notebooks", "exercises"):
        for nb in (ROOT / folder / "ko").glob("*.ipynb"):
            korean = (site / folder / "ko" / f"{nb.stem}.html").read_text(encoding="utf-8")
            english = (site / folder / f"{nb.stem}.html").read_text(encoding="utf-8")
            assert '<html lang="ko"' in korean and '<html lang="en"' in english
            assert f'href="../{nb.stem}.html" hreflang="en"' in korean
            assert f'href="ko/{nb.stem}.html" hreflang="ko"' in english
    assert '<html lang="ko"' in (site / "README.ko.html").read_text(encoding="utf-8")
    assert 'href="README.ko.html" hreflang="ko"' in (site / "index.html").read_text(encoding="utf-8")


def test_every_argument_of_every_command_is_described_on_one_table_row():
    """A row without text tells the reader nothing; a line break inside a cell ends the Markdown table."""
    for words, (parser, _) in every_command().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            written, text = commands.argument(action)
            assert text.strip(), f"{words} {written}: add help= to its add_argument"
            assert "\n" not in written + text, f"{words} {written}: a line break in its row"


def every_command() -> dict:
    """``course doctor`` ... ``course-dev bench cpu`` ...: every command of both entry points, with its parser."""
    found = {words: parsed for entry in commands.entry_points() for words, parsed in commands.commands(entry).items()}
    assert "course train" in found and "course-dev bench llama-cpp" in found and "course-dev bench" not in found
    return found
