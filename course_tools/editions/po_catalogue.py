"""The check messages' translations: Babel extracts, a PO file per language holds them, an MO file ships them.

``babel.cfg`` names where the messages are: the course's Python code (the calls of ``_``, ``N_``, ``_n``
and ``N_n``, ``course_tools.messages.KEYWORDS``) and the notebooks (``extract_notebook``: each
``reveal(..., why="...")`` sentence and any marked call in a code cell). ``course translate <lang>``
extracts them, merges them into ``translations/<lang>/LC_MESSAGES/course.po`` as ``pybabel update``
does (a message whose English changed keeps its old translation marked "fuzzy"; a new one comes in
untranslated) and compiles the PO file into ``course_tools/locale/<lang>/LC_MESSAGES/course.mo``,
which ``course_tools.messages`` reads with the standard library. Babel is a developer's tool, imported
only here and only inside the functions that need it: a learner's kernel reads the compiled file alone.
``--check`` reports every fuzzy or untranslated entry, a translation that drops or renames a
placeholder, and a particle pair that follows no placeholder.
"""

from __future__ import annotations

import ast
import io
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import IO, Any

from course_tools import messages, particles

MAPPING = "babel.cfg"  # at the root: which files hold messages, and with which extractor
PROJECT = "transformer-course"


def po_path(root: Path, lang: str) -> Path:
    return root / "translations" / lang / "LC_MESSAGES" / f"{messages.DOMAIN}.po"


def mo_path(root: Path, lang: str) -> Path:
    return root / messages.catalogue_path(lang).relative_to(messages.LOCALE.parent.parent)


def cell_source(source: str) -> str:
    """A code cell as Python: its IPython lines (``%magic``, ``!shell``) blanked, so lines keep their numbers."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def whys(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        func = getattr(node, "func", None)
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if isinstance(node, ast.Call) and name == "reveal":
            for kw in node.keywords:
                if kw.arg == "why" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    yield kw.value.lineno, kw.value.value
                elif kw.arg == "why":
                    raise ValueError(f"line {kw.value.lineno}: reveal's why= must be one string, not an expression, "
                                     "so that it can be translated")


def extract_notebook(fileobj: IO[bytes], keywords: Any, comment_tags: Any, options: Any) -> Iterator[tuple]:
    """Babel's extractor for a notebook: the ``why=`` of every ``reveal`` (looked up as it is, by
    ``messages.say``) and the marked calls in its code cells. A message's line is its cell's number."""
    from babel.messages.extract import extract_python

    cells = json.loads(fileobj.read().decode("utf-8")).get("cells", [])
    for number, cell in enumerate(cells, 1):
        if cell.get("cell_type") != "code":
            continue
        source = cell_source("".join(cell.get("source", "")))
        comment = [f"cell {cell.get('id', number)}"]
        if "reveal(" in source:
            for _line, why in whys(ast.parse(source)):
                yield number, "_", why, comment  # looked up by messages.say, as _ would
        for _line, funcname, message, _comments in extract_python(io.BytesIO(source.encode("utf-8")), keywords, (), {}):
            yield number, funcname, message, comment


def template(root: Path):
    """Every message in the code and the notebooks, as a Babel catalogue (what ``pybabel extract`` writes)."""
    from babel.messages.catalog import Catalog
    from babel.messages.extract import extract_from_dir
    from babel.messages.frontend import parse_mapping_cfg

    with open(root / MAPPING, encoding="utf-8") as f:
        method_map, options_map = parse_mapping_cfg(f)
    tops = {pattern.split("/")[0] for pattern, _method in method_map}

    def wanted(path: str) -> bool:
        parts = Path(path).relative_to(root).parts
        return bool(parts) and parts[0] in tops and not any(p.startswith((".", "_")) for p in parts)

    catalog = Catalog(project=PROJECT, fuzzy=False)
    found = extract_from_dir(root, method_map, options_map, keywords=messages.KEYWORDS, directory_filter=wanted)
    for filename, lineno, message, comments, context in found:
        catalog.add(message, None, [(filename, lineno)], auto_comments=comments, context=context)
    return catalog


def merged(root: Path, lang: str):
    """The PO catalogue of ``lang`` brought up to the messages in the code (``pybabel update``): changed
    messages marked fuzzy, removed ones dropped; the header's dates kept, so a rebuild changes nothing."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po

    path = po_path(root, lang)
    if path.exists():
        with open(path, "rb") as f:
            catalog = read_po(f, locale=lang, domain=messages.DOMAIN)
    else:
        catalog = Catalog(locale=lang, domain=messages.DOMAIN, project=PROJECT, fuzzy=False)
    fresh = template(root)
    fresh.creation_date = catalog.creation_date
    catalog.update(fresh, update_header_comment=False)
    catalog.obsolete.clear()
    return catalog


@cache
def _steady() -> type:
    """Babel's catalogue without Babel's version in its header (``Generated-By``), so that the PO and MO
    files a build writes do not depend on which Babel the developer has."""
    from babel.messages.catalog import Catalog

    class Steady(Catalog):
        def _get_mime_headers(self) -> list[tuple[str, str]]:
            return [(name, value) for name, value in super()._get_mime_headers() if name != "Generated-By"]

    return Steady


def po_text(catalog) -> str:
    from babel.messages.pofile import write_po

    catalog.__class__ = _steady()
    out = io.BytesIO()
    write_po(out, catalog, width=100, include_lineno=False, ignore_obsolete=True, sort_output=True)
    return out.getvalue().decode("utf-8")


def mo_bytes(catalog) -> bytes:
    """The compiled catalogue (fuzzy entries left out, as ``pybabel compile`` does)."""
    from babel.messages.mofile import write_mo

    catalog.__class__ = _steady()
    out = io.BytesIO()
    write_mo(out, catalog, use_fuzzy=False)
    return out.getvalue()


def compiled(po: Path, lang: str) -> bytes:
    """A fresh compile of the PO file at ``po``."""
    from babel.messages.pofile import read_po

    with open(po, "rb") as f:
        return mo_bytes(read_po(f, locale=lang, domain=messages.DOMAIN))


def _placeholders(template: str) -> list[str]:
    import string

    return sorted(field.split(".")[0].split("[")[0] for _text, field, _spec, _conv in string.Formatter().parse(template)
                  if field is not None)


def _stray_pairs(text: str) -> list[str]:
    """Particle pairs that do not follow a placeholder: nothing would choose their form."""
    return [m.group() for m in particles.PAIR.finditer(text) if not text[:m.start()].endswith("}")]


def problems(catalog, where: str) -> list[str]:
    """What keeps the catalogue from being complete: untranslated or fuzzy entries, placeholders
    that a translation drops or renames, particle pairs that would be printed as they are."""
    found = []
    for message in catalog:
        if not message.id:
            continue
        english = message.id if isinstance(message.id, str) else message.id[0]
        texts = message.string if isinstance(message.string, (tuple, list)) else (message.string,)
        shown = english if len(english) <= 70 else english[:67] + "..."
        if message.fuzzy:
            found.append(f"{where}: fuzzy (its English changed; check the translation, then drop the flag): {shown!r}")
        elif not all(texts):
            found.append(f"{where}: untranslated: {shown!r}")
            continue
        formatted = any(loc[0].endswith(".py") for loc in message.locations)
        for text in texts:
            if formatted and _placeholders(text) != _placeholders(english):
                found.append(f"{where}: the translation of {shown!r} must keep the placeholders "
                             f"{_placeholders(english)} (it has {_placeholders(text)})")
            if _stray_pairs(text):
                found.append(f"{where}: the translation of {shown!r} writes {_stray_pairs(text)[0]} after no "
                             "placeholder: write the particle that fits")
    return found
