"""Sphinx configuration of the course website (built by ``python docs/build.py``, which stages the sources)."""

project = "Build a Transformer from nothing"
author = "the course authors"
copyright = "the course authors, MIT licence"

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = [".doctrees", "**.ipynb_checkpoints"]
templates_path = ["_templates"]
html_static_path = ["_static"]

# Notebooks are shown with the outputs stored in the repository; the site never runs them.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type"]

# Every script a page needs is served from the site itself (copied from docs/node_modules by build.py).
mathjax_path = "vendor/mathjax/tex-chtml.js"
# MathJax 3's configuration, with the MathJax 2 `Hub.Queue` the widget manager calls (docs/_static/mathjax-hub.js);
# a plain script, so it runs before the deferred MathJax, and after Sphinx's configuration, which it extends.
html_js_files = [("mathjax-hub.js", {"priority": 900})]
nb_ipywidgets_js = {
    "vendor/require.js": {},
    "vendor/html-manager/embed-amd.js": {"data-jupyter-widgets-cdn": "", "data-jupyter-widgets-cdn-only": "false"},
}

html_theme = "pydata_sphinx_theme"
html_title = project
html_favicon = "_static/favicon.svg"  # browsers ask for one; without it every page logs a 404
html_copy_source = False
html_show_sourcelink = False
html_context = {"default_mode": "auto"}  # the theme's light/dark switch starts from the reader's system setting
html_theme_options = {
    "logo": {"text": "Transformer course"},
    "navigation_with_keys": True,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["language-switch", "page-toc", "notebook-download"],
    "footer_start": ["copyright"],
    "footer_end": [],
}

# Each page says its language (`<html lang="ko">` on the Korean edition) and links to the same page in the
# other language when there is one: notebooks/ko/X <-> notebooks/X, exercises/ko/X <-> exercises/X, X.ko <-> X.
KOREAN_FOLDERS = ("notebooks/ko/", "exercises/ko/")
LANGUAGE_NAMES = {"en": "English", "ko": "한국어"}


def page_language(pagename: str) -> str:
    return "ko" if pagename.startswith(KOREAN_FOLDERS) or pagename.endswith(".ko") else "en"


def counterparts(pagename: str) -> list[str]:
    """The pages that may be the same page in the other language (the first that exists is)."""
    for folder in KOREAN_FOLDERS:
        if pagename.startswith(folder):
            return [folder[: -len("ko/")] + pagename[len(folder):]]
    if pagename.endswith(".ko"):
        english = pagename[: -len(".ko")]
        return ["index" if english == "README" else english]
    found = ["README.ko" if pagename == "index" else pagename + ".ko"]
    for folder in KOREAN_FOLDERS:
        english = folder[: -len("ko/")]
        if pagename.startswith(english) and "/" not in pagename[len(english):]:
            found.insert(0, folder + pagename[len(english):])
    return found


def _language_context(app, pagename, templatename, context, doctree) -> None:
    context["language"] = page_language(pagename)
    other = next((page for page in counterparts(pagename) if page in app.env.all_docs), None)
    if other is not None:
        lang = page_language(other)
        context["other_language"] = {"href": context["pathto"](other), "lang": lang, "name": LANGUAGE_NAMES[lang]}


def setup(app) -> None:
    app.connect("html-page-context", _language_context)
