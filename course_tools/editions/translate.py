"""Language editions built from one source: translation files + the English notebooks -> notebooks/<lang>/.

A translation file `translations/<lang>/NN_topic.yaml` holds, per English markdown cell id, the translated
text and a short hash of the English source it translates. `course translate ko` copies the English
notebook (code cells and stored outputs unchanged, so nothing is executed again) and swaps the prose;
`--check` reports stale, missing and untranslated entries and built files that differ from the committed ones.
Documents (the README, the glossary) work the same way, per `## ` section: `translations/<lang>/docs/README.yaml`
builds `README.<lang>.md`; a section a translation leaves in English is listed, with the reason, under `english_only`.
Every built file opens with a banner naming its two sources and this command (`course_tools.editions.banner`).
The check messages are translated in `translations/<lang>/LC_MESSAGES/course.po` and compiled into
`course_tools/locale/<lang>/LC_MESSAGES/course.mo` (`course_tools.editions.po_catalogue`); a built
notebook's setup cell gains the line that makes the checks speak its language, and its stored reveal
lines are given in that language (`course_tools.exercises.predict.stored_reveal`). A cell tagged
`edition-rerun` (a lesson cell that shows a check's report on a function it defines) is the one exception to
"nothing is executed": its printout is made again in the edition's language (`rerun_in_language`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import gettext
import hashlib
import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_tools import messages
from course_tools.editions import banner, po_catalogue
from course_tools.editions.translation_yaml import literal_str, load_translation
from course_tools.exercises import predict

ROOT = Path(__file__).resolve().parents[2]
TRANSLATIONS = "translations"  # the sources of every edition: translations/<lang>/NN_topic.yaml, .../docs/DOC.yaml
# section of a translation file -> the English folder whose notebook it translates
SECTIONS = {"notebooks": "notebooks", "exercises": "exercises"}
# nbgrader's solution marker: a translation may not bring back an answer that `course assign` removed.
SOLUTION_MARK = "BEGIN SOLUTION"
# English documents translated section by section: translation file stem -> path from the root
DOCUMENTS = {"README": "README.md", "GLOSSARY": "notebooks/GLOSSARY.md", "LECTURE_MAP": "notebooks/LECTURE_MAP.md",
             "LECTURER": "notebooks/LECTURER.md", "INSTRUCTORS": "docs/pages/instructors.md"}
DOC_SECTIONS = ("sections", "english_only")
# what `course translate <lang>` appends to the first code cell (the setup) of a built notebook
LANGUAGE_LINE = "from course_tools import messages\nmessages.use({lang!r})  # checks and reveals speak {name}"
NAMES = {"ko": "Korean"}
# a lesson cell whose printout is a check's report, made again in each edition's language
RERUN_TAG = "edition-rerun"


def source_hash(text: str) -> str:
    """Short hash of an English cell's source: 8 hex digits of its SHA-256."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


@dataclass
class Edition:
    """What one translation file builds: output path -> notebook text (or bytes: a compiled catalogue),
    plus the problems found."""

    files: dict[Path, str | bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lang: str = ""


def translation_files(root: Path, lang: str) -> list[Path]:
    return sorted((root / TRANSLATIONS / lang).glob("*.yaml"))


def document_files(root: Path, lang: str) -> list[Path]:
    return sorted((root / TRANSLATIONS / lang / "docs").glob("*.yaml"))


def translated(entry: dict | None, english: str, what: str) -> tuple[str | None, list[str]]:
    """The text of one entry translating `english`, or None when it has none; with the problems
    (stale hash, text equal to the English). `what` names the unit, e.g. "09_x (notebooks): cell 1a2b3c4d"."""
    current = source_hash(english)
    if not entry or not str(entry.get("text", "")).strip():
        return None, [f"{what} has no translation (add it with hash: {current})"]
    text = str(entry["text"]).rstrip("\n")
    if str(entry.get("hash")) != current:
        return text, [f"{what} is stale: the English changed (hash {entry.get('hash')} -> {current}); "
                      f"update its text and set hash: {current}"]
    if text == english:
        return text, [f"{what} is untranslated (its text equals the English)"]
    return text, []


def translate_cells(nb: nbformat.NotebookNode, entries: dict, where: str) -> tuple[nbformat.NotebookNode, list[str]]:
    """Copy `nb`, replacing each markdown cell by its translation; return the copy and the problems.

    `where` names the lesson in messages, e.g. "09_modern_decoder (notebooks)".
    """
    out, problems = copy.deepcopy(nb), []
    entries = entries or {}
    prose_ids = set()
    for cell in out.cells:
        if cell.cell_type != "markdown":
            continue
        prose_ids.add(cell.id)
        text, found = translated(entries.get(cell.id), cell.source, f"{where}: cell {cell.id}")
        problems += found
        if text is not None and SOLUTION_MARK in text and SOLUTION_MARK not in cell.source:
            problems.append(f"{where}: cell {cell.id} translates an answer the English cell hides; "
                            "keep its \"YOUR ANSWER HERE\" instead of the solution")
            text = None
        if text is not None:
            cell.source = text
    for orphan in sorted(set(entries) - prose_ids):
        problems.append(f"{where}: entry {orphan} matches no markdown cell of the English notebook; remove it")
    return out, problems


def document_sections(text: str) -> list[tuple[str, str]]:
    """Split a markdown document at its `## ` headings (not inside code fences): (key, text) pairs,
    the key a slug of the heading ("intro" for what comes before the first one)."""
    sections, key, lines, fenced = [], "intro", [], False
    for line in text.rstrip("\n").split("\n"):
        fenced ^= line.startswith("```")
        if line.startswith("## ") and not fenced:
            sections.append((key, "\n".join(lines).strip("\n")))
            key, lines = re.sub(r"[^a-z0-9]+", "-", line[3:].lower()).strip("-"), []
        lines.append(line)
    sections.append((key, "\n".join(lines).strip("\n")))
    return [(k, t) for k, t in sections if t]


def build_document(root: Path, path: Path) -> Edition:
    """Build `<doc>.<lang>.md` from `translations/<lang>/docs/<doc>.yaml`: every English section translated,
    or listed under `english_only` (then left out of the translated document)."""
    lang, stem, edition = path.parent.parent.name, path.stem, Edition()
    if stem not in DOCUMENTS:
        edition.problems.append(f"{path.name}: no English document {stem!r}; use one of {', '.join(DOCUMENTS)}")
        return edition
    data = load_translation(path, DOC_SECTIONS)
    entries, kept = data.get("sections") or {}, data.get("english_only") or {}
    english = root / DOCUMENTS[stem]
    parts, keys = [], []
    for key, text in document_sections(english.read_text(encoding="utf-8")):
        keys.append(key)
        if key in kept and key not in entries:
            continue
        done, problems = translated(entries.get(key), text, f"{DOCUMENTS[stem]}: section {key}")
        edition.problems += problems
        parts.append(done if done is not None else text)
    for orphan in sorted((set(entries) | set(kept)) - set(keys)):
        edition.problems.append(f"{DOCUMENTS[stem]}: entry {orphan} matches no section of the English; remove it")
    sources = f"`{path.relative_to(root).as_posix()}` and `{DOCUMENTS[stem]}`"
    edition.files[english.with_suffix(f".{lang}.md")] = "\n\n".join(
        [banner.comment(sources, f"course translate {lang}")] + parts) + "\n"
    return edition


def build_messages(root: Path, lang: str) -> tuple[Edition, gettext.NullTranslations]:
    """Bring `translations/<lang>/LC_MESSAGES/course.po` up to the messages in the code and compile it
    into `course_tools/locale/<lang>/LC_MESSAGES/course.mo`; with the compiled messages, for the notebooks.
    Nothing when `translations/<lang>/LC_MESSAGES/` does not exist (a language whose messages are not
    translated yet: make the folder, and the build adds every message to its new PO file)."""
    edition = Edition(lang=lang)
    if not po_catalogue.po_path(root, lang).parent.is_dir():
        return edition, gettext.NullTranslations()
    catalog = po_catalogue.merged(root, lang)
    compiled = po_catalogue.mo_bytes(catalog)
    po = po_catalogue.po_path(root, lang)
    edition.files[po] = po_catalogue.po_text(catalog)
    edition.files[po_catalogue.mo_path(root, lang)] = compiled
    edition.problems = po_catalogue.problems(catalog, po.relative_to(root).as_posix())
    return edition, gettext.GNUTranslations(io.BytesIO(compiled))


def speaking(nb: nbformat.NotebookNode, lang: str, where: str) -> tuple[nbformat.NotebookNode, list[str]]:
    """A copy of a built notebook that speaks ``lang``: the setup cell (the first code cell) gains the
    ``messages.use`` line, and the stored lines of each reveal are given in ``lang`` (the English
    notebook's outputs, so nothing runs again). Call it inside ``messages.speaking(lang, catalogue)``."""
    out, problems = copy.deepcopy(nb), []
    code = [c for c in out.cells if c.cell_type == "code"]
    if code:
        line = LANGUAGE_LINE.format(lang=lang, name=NAMES.get(lang, lang))
        code[0].source = code[0].source.rstrip("\n") + "\n" + line
    for cell in code:
        if "reveal(" not in cell.source:
            continue
        whys = [why for _line, why in po_catalogue.whys(ast.parse(po_catalogue.cell_source(cell.source)))]
        streams = [o for o in cell.outputs if o.get("output_type") == "stream"]
        shown = predict.stored_reveal(streams[-1].text, whys[0]) if streams and len(whys) == 1 else None
        if shown is None:
            problems.append(f"{where}: cell {cell.id}: its stored output does not end with one unanswered reveal's "
                            "lines; they stay English")
        else:
            streams[-1].text = shown
    for index, cell in enumerate(code):
        if RERUN_TAG in cell.metadata.get("tags", []):
            problems += rerun_in_language(cell, code[:index], where)
    return out, problems


def rerun_in_language(cell: nbformat.NotebookNode, before: list[nbformat.NotebookNode], where: str) -> list[str]:
    """Execute ``cell`` again, in this process and the language now spoken, and store its printout in place
    of the English one. The cell runs in a fresh namespace in which only the import statements of the code
    cells ``before`` it have run: a tagged cell must define what it checks itself, so its output depends on
    nothing else the notebook computed. Returns the problems (an error, or an output that is not one stream)."""
    streams = [o for o in cell.outputs if o.get("output_type") == "stream" and o.get("name") == "stdout"]
    if len(streams) != 1 or len(cell.outputs) != 1:
        return [f"{where}: cell {cell.id}: tagged {RERUN_TAG} but its stored output is not one printout"]
    imports = [node for c in before for node in ast.parse(po_catalogue.cell_source(c.source)).body
               if isinstance(node, (ast.Import, ast.ImportFrom))]
    namespace: dict = {"__name__": "__edition__"}
    printed = io.StringIO()
    try:
        exec(compile(ast.Module(body=imports, type_ignores=[]), f"<{where} imports>", "exec"), namespace)
        with contextlib.redirect_stdout(printed):
            exec(compile(po_catalogue.cell_source(cell.source), f"<{where} cell {cell.id}>", "exec"), namespace)
    except Exception as error:  # a problem of the notebook, reported like a stale translation
        return [f"{where}: cell {cell.id}: running it again failed: {type(error).__name__}: {error}"]
    streams[0].text = printed.getvalue()
    return []


def build_file(root: Path, path: Path, catalogue: gettext.NullTranslations | None = None) -> Edition:
    """Build the notebooks one translation file describes (notebooks/<lang>/NN.ipynb, exercises/<lang>/NN.ipynb)."""
    lang, lesson = path.parent.name, path.stem
    edition = Edition()
    data = load_translation(path, tuple(SECTIONS))
    for section, folder in SECTIONS.items():
        english = root / folder / f"{lesson}.ipynb"
        if not english.exists():
            if section in data:
                edition.problems.append(f"{lesson} ({section}): no English notebook {folder}/{lesson}.ipynb")
            continue
        nb = banner.without(nbformat.read(english, as_version=4))  # exercises/ carry course assign's banner
        built, problems = translate_cells(nb, data.get(section), f"{lesson} ({section})")
        with messages.speaking(lang, catalogue or build_messages(root, lang)[1]):
            built, spoken = speaking(built, lang, f"{lesson} ({section})")
        problems += spoken
        built.metadata["course_edition"] = {"lang": lang, "source": f"{folder}/{lesson}.ipynb"}
        sources = [path.relative_to(root).as_posix(), f"{folder}/{lesson}.ipynb"]
        banner.with_banner(built, banner.text(sources, f"course translate {lang}", lang, fill_in=folder == "exercises"))
        edition.files[root / folder / lang / f"{lesson}.ipynb"] = nbformat.writes(built) + "\n"
        edition.problems += problems
    return edition


def build(root: Path, lang: str) -> Edition:
    """Build every lesson that has a translation file for `lang`."""
    edition = Edition(lang=lang)
    compiled, catalogue = build_messages(root, lang)
    parts = [build_file(root, p, catalogue) for p in translation_files(root, lang)] + \
        [build_document(root, p) for p in document_files(root, lang)] + [compiled]
    if not parts:
        edition.problems.append(f"no translation files in {TRANSLATIONS}/{lang}/; start one with "
                                f"`course translate {lang} --scaffold NN_topic`")
    for part in parts:
        edition.files.update(part.files)
        edition.problems += part.problems
    return edition


def out_of_date(root: Path, edition: Edition) -> list[str]:
    """Built files that differ from (or are missing among) the committed ones."""
    stale = []
    for path, text in edition.files.items():
        committed = (path.read_bytes() if isinstance(text, bytes) else path.read_text(encoding="utf-8")) \
            if path.exists() else None
        if committed != text:
            stale.append(f"{path.relative_to(root)} differs from its build; run `course translate {edition.lang}`")
    return stale


def scaffold(root: Path, lang: str, lesson: str) -> Path:
    """Write translations/<lang>/<lesson>.yaml with every missing prose cell (English text + hash) to translate
    (for a document, e.g. README, translations/<lang>/docs/README.yaml with every missing section)."""
    import yaml

    if lesson in DOCUMENTS:
        path = root / TRANSLATIONS / lang / "docs" / f"{lesson}.yaml"
        data = load_translation(path, DOC_SECTIONS) if path.exists() else {}
        entries, kept = data.setdefault("sections", {}), data.get("english_only") or {}
        for key, text in document_sections((root / DOCUMENTS[lesson]).read_text(encoding="utf-8")):
            if key not in entries and key not in kept:
                entries[key] = {"hash": source_hash(text), "text": text}
    else:
        path = root / TRANSLATIONS / lang / f"{lesson}.yaml"
        data = load_translation(path, tuple(SECTIONS)) if path.exists() else {}
        for section, folder in SECTIONS.items():
            english = root / folder / f"{lesson}.ipynb"
            if not english.exists():
                continue
            entries = data.setdefault(section, {})
            for cell in banner.without(nbformat.read(english, as_version=4)).cells:
                if cell.cell_type == "markdown" and cell.id not in entries:
                    entries[cell.id] = {"hash": source_hash(cell.source), "text": cell.source}
    yaml.add_representer(str, literal_str, Dumper=yaml.SafeDumper)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=1000), encoding="utf-8")
    return path


def main(args: argparse.Namespace) -> int:
    root = Path(args.root)
    try:
        if args.scaffold:
            print(f"wrote {scaffold(root, args.lang, args.scaffold).relative_to(root)}: translate each text "
                  "(entries equal to the English are reported as untranslated)")
            return 0
        edition = build(root, args.lang)
    except (ValueError, FileNotFoundError) as exc:
        print(f"course translate: {exc}", file=sys.stderr)
        return 2
    problems = edition.problems + (out_of_date(root, edition) if args.check else [])
    for line in problems:
        print(line, file=sys.stderr)
    if args.check:
        print(f"{len(edition.files)} files checked, {len(problems)} problems")
        return 1 if problems else 0
    for path, text in edition.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    print(f"wrote {len(edition.files)} files ({len(edition.problems)} problems; "
          "cells without a translation keep the English)")
    return 1 if edition.problems else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="build the notebooks of a language edition from translations/<lang>/*.yaml")
    p.add_argument("lang", help="language code, e.g. ko")
    p.add_argument("--check", action="store_true", help="write nothing; report stale, missing or out-of-date files")
    p.add_argument("--scaffold", metavar="LESSON", help="start or complete translations/<lang>/LESSON.yaml "
                   f"(or a document's, LESSON one of {', '.join(DOCUMENTS)}); the check messages need no scaffold: "
                   "each build adds the new ones to translations/<lang>/LC_MESSAGES/course.po")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    p.set_defaults(func=main)
