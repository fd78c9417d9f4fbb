"""The translation files of the check messages: what English there is to translate, and the build.

``translations/<lang>/messages/lessonNN.yaml`` translates the messages of one lesson: section
``references`` those of ``course_tools/exercises/references/lessonNN.py`` (hints, the ``explain`` notes, the
known wrong answers' reasons, case labels), section ``reveals`` the ``why=`` of every
``predict.reveal`` in ``notebooks/NN_*.ipynb``; ``course.yaml`` those of the checker, the shared
hints, ``predict`` and the grader. Each entry is keyed by a stable id (``<exercise>.explain``,
``<exercise>.wrong.<answer>``, ``<function>.<n>``: the n-th message of that function, or
``<cell id>.why``) and holds the English it translates (``en``) and the translation (``text``):
when the English changes, the entry is stale. The messages are found in the code, not listed:

- in a reference module: what a function returns (not the exercise or question functions, which
  return answers), ``explain=`` and the reasons of ``known_wrong({...})``. Case labels stay English:
  they name the inputs with the code's names and shapes (a function that builds one returns a
  template, which a translation may add to the file; ``say`` translates every label it knows);
- anywhere: the first argument of ``messages.say``, ``fill`` and ``marked``.

An f-string becomes a template, each ``{expression}`` a placeholder the translation keeps; a sum
or a conditional of strings gives one template per combination. ``course translate <lang>`` compiles
the files into ``course_tools/messages_<lang>.json`` (``messages.catalogue``) and, in the built
notebooks, adds the setup cell's ``messages.use`` line and translates the stored reveal lines.
"""

from __future__ import annotations

import ast
import copy
import itertools
import json
import re
from pathlib import Path

from course_tools import messages
from course_tools.editions.translation_yaml import literal_str, load_translation
from course_tools.exercises import REFERENCES

FOLDER = "messages"  # translations/<lang>/messages/
CODE = {"checks": "course_tools/exercises/checks.py", "shared": f"{REFERENCES}/_shared.py",
        "predict": "course_tools/exercises/predict.py", "grade": "course_tools/grading/grade.py",
        "submission": "course_tools/grading/submission.py", "report": "course_tools/grading/report.py",
        "shortcuts": "course_tools/grading/shortcuts.py"}
MARKERS = ("say", "fill", "marked")
REGISTERS = ("exercise", "question")
WORDS = re.compile(r"[A-Za-z]{2}")
# what `course translate <lang>` appends to the first code cell (the setup) of a built notebook
LANGUAGE_LINE = "from course_tools import messages\nmessages.use({lang!r})  # checks and reveals speak {name}"
NAMES = {"ko": "Korean"}


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _placeholder(node: ast.FormattedValue) -> str:
    conversion = {-1: "", 115: "!s", 114: "!r", 97: "!a"}[node.conversion]
    spec = "".join(v.value for v in node.format_spec.values if isinstance(v, ast.Constant)) \
        if node.format_spec is not None else ""
    return "{" + ast.unparse(node.value) + conversion + (":" + spec if spec else "") + "}"


def templates(node: ast.AST | None, constants: dict[str, str], raw: bool = False) -> list[str] | None:
    """The templates a string expression can produce (None if it is not one); ``raw``: a string
    constant is a template already (``fill``'s first argument), its braces are placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value if raw else _escape(node.value)]
    if isinstance(node, ast.JoinedStr):
        return ["".join(_escape(v.value) if isinstance(v, ast.Constant) else _placeholder(v) for v in node.values)]
    if isinstance(node, ast.Name) and node.id in constants:
        return [_escape(constants[node.id])]
    if isinstance(node, ast.IfExp):
        body, orelse = templates(node.body, constants, raw), templates(node.orelse, constants, raw)
        return body + orelse if body is not None and orelse is not None else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = templates(node.left, constants), templates(node.right, constants)
        if left is None and right is None:
            return None
        left = left or ["{" + ast.unparse(node.left) + "}"]
        right = right or ["{" + ast.unparse(node.right) + "}"]
        return [a + b for a, b in itertools.product(left, right)]
    return None


def is_message(template: str) -> bool:
    """Whether a template holds words (not only placeholders, punctuation or a one-letter answer)."""
    return bool(WORDS.search("".join(t for p, t in messages.parts(template) if not p)))


def _name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else node
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


class _Finder(ast.NodeVisitor):
    """Walks a module and collects id -> template."""

    def __init__(self, constants: dict[str, str]) -> None:
        self.constants, self.found, self.scope, self.counts = constants, {}, [], {}
        self.filled: set[str] = set()  # the templates of fill(), which the code fills itself

    def add(self, key: str, found: list[str] | None) -> None:
        for template in found or []:
            if is_message(template):
                self.found[key] = template

    def add_numbered(self, found: list[str] | None, filled: bool = False) -> None:
        for template in found or []:
            if is_message(template):
                if filled:
                    self.filled.add(template)
                scope = ".".join(self.scope) or "module"
                self.counts[scope] = self.counts.get(scope, 0) + 1
                self.found.setdefault(f"{scope}.{self.counts[scope]}", template)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        registered = [d for d in node.decorator_list if _name(d) in REGISTERS]
        for decorator in registered:
            self.exercise_notes(node.name, decorator)
        self.scope.append(node.name)
        saved, self.registered = getattr(self, "registered", False), bool(registered)
        for child in node.body:
            self.visit(child)
        self.scope.pop()
        self.registered = saved

    def exercise_notes(self, name: str, decorator: ast.AST) -> None:
        if not isinstance(decorator, ast.Call):
            return
        for kw in decorator.keywords:
            if kw.arg == "explain":
                self.add(f"{name}.explain", templates(kw.value, self.constants))
            if kw.arg == "hints" and isinstance(kw.value, (ast.List, ast.Tuple)):
                for hint in kw.value.elts:
                    self.wrong_answers(name, hint)

    def wrong_answers(self, name: str, node: ast.AST) -> None:
        if isinstance(node, ast.Call) and _name(node) == "known_wrong" and node.args \
                and isinstance(node.args[0], ast.Dict):
            for key, value in zip(node.args[0].keys, node.args[0].values, strict=True):
                self.add(f"{name}.wrong.{ast.unparse(key)}", templates(value, self.constants))

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Return(self, node: ast.Return) -> None:
        if not getattr(self, "registered", False) and self.scope:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for value in values:
                self.add_numbered(templates(value, self.constants))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _name(node)
        if name in MARKERS and node.args:
            self.add_numbered(templates(node.args[0], self.constants, raw=name == "fill"), filled=name == "fill")
        self.generic_visit(node)


def python_messages(path: Path, filled: set[str] | None = None) -> dict[str, str]:
    """id -> English template of every message in a Python module (``filled`` collects those of ``fill``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    finder = _Finder(constants)
    finder.visit(tree)
    if filled is not None:
        filled |= finder.filled
    return finder.found


def reveal_messages(path: Path) -> dict[str, str]:
    """``<cell id>.why`` -> the English template of each ``reveal(..., why=...)`` of a notebook."""
    import nbformat

    found = {}
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code" or "reveal(" not in cell.source:
            continue
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.split("\n"))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and _name(node) == "reveal":
                for kw in node.keywords:
                    if kw.arg == "why":
                        for n, template in enumerate(templates(kw.value, {}) or [], 1):
                            found[f"{cell.id}.why" + (f".{n}" if n > 1 else "")] = template
    return found


def sources(root: Path, filled: set[str] | None = None) -> dict[str, dict[str, tuple[str, dict[str, str]]]]:
    """Translation file stem -> section -> (English source path, its messages); ``filled`` collects
    the templates the code fills itself."""
    out: dict[str, dict[str, tuple[str, dict[str, str]]]] = {
        "course": {section: (path, python_messages(root / path, filled)) for section, path in CODE.items()}}
    for module in sorted((root / REFERENCES).glob("lesson*.py")):
        number = module.stem[len("lesson"):]
        sections = {"references": (module.relative_to(root).as_posix(), python_messages(module))}
        for notebook in sorted((root / "notebooks").glob(f"{number}_*.ipynb")):
            sections["reveals"] = (notebook.relative_to(root).as_posix(), reveal_messages(notebook))
        out[module.stem] = sections
    return out


def _load(path: Path) -> dict:
    return load_translation(path, ("references", "reveals", *CODE)) if path.exists() else {}


def compile_catalogue(root: Path, lang: str) -> tuple[dict[str, str], set[str], list[str], int]:
    """English template -> translation from every message file of ``lang``; the templates the code
    fills itself; the problems found (missing, stale, untranslated, orphaned, placeholders changed);
    how many messages there are."""
    folder = root / "translations" / lang / FOLDER
    table, filled, problems, count = {}, set(), [], 0
    for stem, sections in sources(root, filled).items():
        path = folder / f"{stem}.yaml"
        data = _load(path)
        for section in sorted(set(data) - set(sections)):
            problems.append(f"{path.name}: section {section} has no English source; remove it")
        for section, (source, found) in sections.items():
            entries = data.get(section) or {}
            where = f"{FOLDER}/{stem}.yaml ({section}, {source})"
            count += len(found)
            for key, english in found.items():
                entry = entries.get(key)
                if not isinstance(entry, dict) or not str(entry.get("text", "")).strip():
                    problems.append(f"{where}: message {key} has no translation (its English: {english!r})")
                    continue
                text = str(entry["text"]).strip("\n")
                if entry.get("en") != english:
                    problems.append(f"{where}: message {key} is stale: the English changed from {entry.get('en')!r} "
                                    f"to {english!r}; update its text and set en to the new English")
                elif text == english:
                    problems.append(f"{where}: message {key} is untranslated (its text equals the English)")
                elif sorted(messages.placeholders(text)) != sorted(messages.placeholders(english)):
                    problems.append(f"{where}: message {key} must keep the placeholders "
                                    f"{messages.placeholders(english)} (it has {messages.placeholders(text)})")
                else:
                    table.setdefault(english, text)
            for orphan in sorted(set(entries) - set(found)):
                problems.append(f"{where}: entry {orphan} matches no message of the English; remove it")
    return table, filled, problems, count


def catalogue_text(table: dict[str, str], filled: set[str], lang: str) -> str:
    from course_tools.editions import banner

    note = banner.comment(f"`translations/{lang}/{FOLDER}/*.yaml` and the English messages in the code",
                          f"course translate {lang}")
    return json.dumps({"generated": note, "lang": lang, "messages": dict(sorted(table.items())),
                       "filled": sorted(filled & set(table))},
                      ensure_ascii=False, indent=0) + "\n"


def scaffold(root: Path, lang: str) -> list[Path]:
    """Add every message still missing to ``translations/<lang>/messages/*.yaml`` (text = the English)."""
    import yaml

    yaml.add_representer(str, literal_str, Dumper=yaml.SafeDumper)
    written = []
    for stem, sections in sources(root).items():
        path = root / "translations" / lang / FOLDER / f"{stem}.yaml"
        data = _load(path)
        for section, (_, found) in sections.items():
            entries = data.setdefault(section, {})
            for key, english in found.items():
                entries.setdefault(key, {"en": english, "text": english})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=1000), encoding="utf-8")
        written.append(path)
    return written


def speaking(nb, lang: str, catalogue: messages.Catalogue):
    """A copy of a built notebook that speaks ``lang``: the setup cell (the first code cell) gains
    the ``messages.use`` line, and the stored output lines of the cells that reveal or check are
    translated (the English notebook's outputs, so nothing runs again)."""
    out = copy.deepcopy(nb)
    code = [c for c in out.cells if c.cell_type == "code"]
    if code:
        line = LANGUAGE_LINE.format(lang=lang, name=NAMES.get(lang, lang))
        code[0].source = code[0].source.rstrip("\n") + "\n" + line
    for cell in code:
        if "reveal(" in cell.source or "check." in cell.source:
            for output in cell.outputs:
                if output.get("output_type") == "stream":
                    output.text = "\n".join(catalogue.say(line) for line in output.text.split("\n"))
    return out
