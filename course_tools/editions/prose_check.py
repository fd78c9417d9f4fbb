"""Truth that a test keeps: the numbers of a lesson's prose against its stored outputs, its claims against their proofs.

Two outside reads found sentences that quoted numbers no cell had printed ("5.4 times fewer" where the outputs
give 5.57, a run time from an older run). This module makes the suite catch that class of mistake:

- ``unmatched_numbers(nb, allowed)``: every number written in a Markdown cell must appear in a stored output of
  the same notebook (or be a literal of one of its executed code cells, or in its ``metadata.course`` run
  record), read at the precision the prose prints it: "5.4"
  matches an output 5.43, "84 s" an output 83.9, "22.7M" an output 22,713,216, "32%" an output 0.32, and
  Korean "1억 2,444만" an output 124,439,808. Not checked: code spans, math, link targets and HTML; section
  and list numbers, lesson numbers (``lesson 07``, ``단원 09``, a zero-padded ``07``), syllabus ids (``X6``), years
  of papers, names with digits (``GPT-2``, ``float16``), numbers that appear in the same cell's math or code
  spans (a formula's constants), the writer's reading-time estimate, and every number of a sentence that
  cites a source (a link, an author-year citation, the further-reading list). Anything else is declared in
  the lesson's allow-list (``tests/prose_numbers/NN_topic.yaml``), each entry with its reason, or with a
  ``derived`` rule whose operands are themselves printed numbers.
- ``claim_problems(nb)``: each syllabus claim the goal cell lists names the sections (``§3``) whose executed
  check proves it; each named section exists and holds a code cell with an assertion or a comparison that
  was executed in the stored run.

``python -m course_tools.editions.prose_check NOTEBOOK...`` prints what a lesson writer has to fix.
"""

from __future__ import annotations

import ast
import bisect
import operator
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import yaml

from course_tools.editions import po_catalogue

ROOT = Path(__file__).resolve().parents[2]
ALLOW_DIR = ROOT / "tests" / "prose_numbers"

# A number as prose writes it: digits with thousands separators, decimals, an exponent or a superscript one.
_NUMBER = re.compile(
    r"(?P<sign>[-−])?(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d+))?"
    r"(?:(?:[eE](?P<exp>[-−+]?\d+))|(?:\s*[×x]\s*10(?P<sup>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+)))?"
)
_SUPERSCRIPT = str.maketrans("⁻⁺⁰¹²³⁴⁵⁶⁷⁸⁹", "-+0123456789")
# What may stand right after a number and what it scales the number by (output numbers are divided by it).
_MULTIPLIERS = {
    "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12,
    "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12,
    "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2.0**10, "MiB": 2.0**20, "GiB": 2.0**30,
    "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9, "%": 1e-2,
    "천": 1e3, "만": 1e4, "억": 1e8, "조": 1e12,
}
_UNIT_AFTER = re.compile(
    r"\s?(thousand|million|billion|trillion|KiB|MiB|GiB|KB|MB|GB|TB|ms|µs|us|ns|%|[kKMBGT](?![A-Za-z])|천|만(?!큼)|억|조)"
)
_KOREAN_PART = r"(\d[\d,]*(?:\.\d+)?)\s*(천)?\s*(조|억|만(?!큼))"  # 만큼 is a particle, not 10,000
_KOREAN_COMPOUND = re.compile(rf"(?:{_KOREAN_PART}\s*)+")
_LESSON_REF = re.compile(
    r"(?:\b[Ll]essons?|단원|Lektion)\s*\d{1,2}(?:\s*(?:[–\-,]|and|or|to|와|과|및|,\s*and)\s*\d{1,2})*"
)
_SECTION_REF = re.compile(
    r"\d+절|(?:§\s*|\b[Ss]ections?\s+)\d+(?:\.\d+)*(?:\s*(?:[–\-,]|and|or|to|와|과|및)\s*§?\s*\d+(?:\.\d+)*)*"
)
_CITATION = re.compile(
    r"\]\([^)\s]+\)|\bet al\.?\s*,?\s*\(?(?:19|20)\d\d|외\s*\(?(?:19|20)\d\d|"
    r"[A-Z][A-Za-z\-]+(?:,? (?:and |& )?[A-Z][A-Za-z\-]+)*,? \(?(?:19|20)\d\d[a-z]?\)|"
    r"[Ff]urther reading|더 읽을거리|arXiv"
)
_YEAR = re.compile(r"(?<!\d)(?:19[5-9]\d|20[0-3]\d)(?!\d)")
_HEADING_NUMBER = re.compile(r"^(#+\s*)(\d+(?:\.\d+)*)", re.M)
_LIST_NUMBER = re.compile(r"^(\s*)(\d+)([.)]\s)", re.M)


@dataclass(frozen=True)
class ProseNumber:
    """One number of a Markdown cell: as written, its value, the decimals printed and the scales to try."""

    cell: int
    cell_id: str
    text: str
    value: float
    decimals: int
    scales: tuple[float, ...]
    sentence: str


@dataclass(frozen=True)
class Finding:
    """A problem a lesson writer must fix, named by notebook, cell and what is wrong."""

    notebook: str
    cell: int
    cell_id: str
    what: str

    def __str__(self) -> str:
        return f"{self.notebook} cell {self.cell} ({self.cell_id}): {self.what}"


def _blank(text: str, pattern: re.Pattern[str] | str, flags: int = 0) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (positions kept for the sentences)."""
    return re.sub(pattern, lambda m: " " * len(m.group()), text, flags=flags)


def _spans(text: str) -> tuple[str, str]:
    """``(prose, formulas)``: the prose with code, math, HTML and link targets blanked; the blanked code and math."""
    hidden = []
    for pattern, flags in (
        (r"```.*?```|~~~.*?~~~", re.S),
        (r"\$\$.*?\$\$", re.S),
        (r"(?<!\\)\$[^$\n]+?(?<!\\)\$", 0),
        (r"`[^`]+?`", 0),  # a code span may run across a line break
    ):
        hidden += [m.group() for m in re.finditer(pattern, text, flags)]
        text = _blank(text, pattern, flags)
    text = _blank(text, r"<[^>\n]+>")
    text = _blank(text, r"\]\([^)\s]*\)")  # link targets (the text in brackets stays)
    text = _blank(text, r"https?://\S+")
    return text, "\n".join(hidden)


def _structural(text: str) -> str:
    """``text`` with the numbers that are structure, not results, blanked."""
    text = _HEADING_NUMBER.sub(lambda m: m.group(1) + " " * len(m.group(2)), text)
    text = _LIST_NUMBER.sub(lambda m: m.group(1) + " " * len(m.group(2)) + m.group(3), text)
    for pattern in (_LESSON_REF, _SECTION_REF):
        text = pattern.sub(lambda m: re.sub(r"\d", " ", m.group()), text)
    # a year beside a citation or in brackets: (2017), 2017), Vaswani 2017, 2017년
    year = (r"(?<=\()\s*(?:1[5-9]|20)\d\d[a-z]?|(?:1[5-9]|20)\d\d[a-z]?(?=\s*[),;]|년)"
            r"|(?:19|20)\d\d(?= (?:paper|model|order|translation|Transformer|architecture|논문|모델|번역|구조))")
    text = re.sub(year, lambda m: " " * len(m.group()), text)
    # the writer's estimate of the reading time is no result: "about 60 minutes of reading", "읽는 데 약 60분"
    text = re.sub(r"\d+(?:[–\-]\d+)?(?= (?:minutes|hours) of (?:reading|writing))|(?<=읽는 데 약 )\d+",
                  lambda m: " " * len(m.group()), text)
    # zero-padded lesson numbers (01, 07_gpt_model) and notebook file names
    text = re.sub(r"(?<![\w.,])0\d(?![\d.,]\d)", "  ", text)
    text = re.sub(r"\b\d\d_[a-z_]+", lambda m: " " * len(m.group()), text)
    return text


def _sentences(text: str) -> list[tuple[int, int]]:
    """Character ranges of the sentences (and list items, headings, table rows) of a Markdown text."""
    bounds = [0]
    breaks = r"(?<=[.!?。])\s+(?=[A-Z가-힣*\[`\"“])|\n\s*\n|\n(?=\s*(?:[-*+]|\d+[.)])\s)|\n(?=#)|\n(?=\|)"
    for m in re.finditer(breaks, text):
        if re.search(r"(?:\bet al|\be\.g|\bi\.e|\bvs|\bcf|\bFig|\bEq|\bNo)\.$", text[:m.start()]):
            continue  # an abbreviation's full stop ends no sentence
        bounds.append(m.end())
    bounds.append(len(text))
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _korean(text: str) -> tuple[float, int, float]:
    """``(value, decimals, scale)`` of a number written with Korean units: 12억 9천만 is (129, 0, 1e7)."""
    parts = [(float(n.replace(",", "")), len(n.partition(".")[2]), (1e3 if thousand else 1.0) * _MULTIPLIERS[unit])
             for n, thousand, unit in re.findall(_KOREAN_PART, text)]
    scale = min(unit for _, _, unit in parts)
    decimals = parts[-1][1]
    return sum(n * unit for n, _, unit in parts) / scale, decimals, scale


def _value(m: re.Match[str]) -> tuple[float, int, float]:
    """``(mantissa, decimals, scale)`` of a number match: 3.8e-5 is (3.8, 1, 1e-5)."""
    frac = m.group("frac") or ""
    mantissa = float(m.group("int").replace(",", "") + ("." + frac if frac else ""))
    exp = m.group("exp") or (m.group("sup") or "").translate(_SUPERSCRIPT)
    scale = 10.0 ** int(exp.replace("−", "-")) if exp else 1.0
    return mantissa, len(frac), scale


def _skipped(part: str, m: re.Match[str]) -> bool:
    """True when the number ``m`` of ``part`` is part of a name, an identifier or a formula, not a quantity."""
    before, after = part[max(0, m.start() - 1):m.start()], part[m.end():m.end() + 1]
    if re.match(r"[\w.]", before) or (before == "-" and re.search(r"[A-Za-z]-$", part[:m.start()])):
        return True  # inside a name or an identifier: GPT-2, float16, Q4_1, v0.6
    if "·" in (before, after):
        return True  # a formula written in the prose: 2·L·d
    if re.match(r"[A-Za-z_]", after) and not _UNIT_AFTER.match(part, m.end()):
        return not re.match(r"(st|nd|rd|th|x|s|h|d)\b", part[m.end():])  # 4bit, 135M-Instruct's parts
    return bool(_YEAR.fullmatch(m.group()) and re.search(r"(?:in|since|of|until|by|from)\s$", part[:m.start()]))


def _sentence_numbers(part: str, constants: set[float]) -> list[tuple[str, float, int, tuple[float, ...]]]:
    """``(text, mantissa, decimals, scales)`` of each number of one sentence that has to be found in an output."""
    found, taken = [], set()
    for m in _KOREAN_COMPOUND.finditer(part):
        value, decimals, scale = _korean(m.group())
        found.append((m.group().strip(), value, decimals, (scale,)))
        taken.update(range(m.start(), m.end()))
    for m in _NUMBER.finditer(part):
        if m.start() in taken or _skipped(part, m):
            continue
        mantissa, decimals, scale = _value(m)
        if scale == 1.0 and mantissa in constants:
            continue  # a constant of the same cell's formula or code
        unit = _UNIT_AFTER.match(part, m.end())
        scales = (scale, scale * _MULTIPLIERS[unit.group(1)]) if unit else (scale,)
        found.append((m.group(), mantissa, decimals, scales))
    return found


def prose_numbers(text: str, cell: int = 0, cell_id: str = "") -> list[ProseNumber]:
    """The numbers of one Markdown cell's prose that must be found in an output, each with its sentence."""
    if re.search(r"^#+\s*(Further reading|더 읽을거리)", text, re.M):
        return []  # a further-reading list: every line cites its source
    prose, formulas = _spans(text)
    constants = {_value(m)[0] for m in _NUMBER.finditer(formulas)}
    checked = _structural(prose)
    found = []
    for start, end in _sentences(prose):
        if _CITATION.search(text[start:end]):
            continue
        sentence = " ".join(prose[start:end].split())
        found += [ProseNumber(cell, cell_id, number, value, decimals, scales, sentence)
                  for number, value, decimals, scales in _sentence_numbers(checked[start:end], constants)]
    return found


def _output_text(output: dict[str, Any]) -> str:
    """The text a stored output shows: a stream, a result's or a display's text, HTML or Markdown."""
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    texts = ["".join(data.get(kind, "")) for kind in ("text/plain", "text/markdown", "text/latex")]
    if "text/html" in data:
        texts.append(re.sub(r"<[^>]+>", " ", "".join(data["text/html"])))
    return "\n".join(texts)


_OUTPUT_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _code_literals(source: str) -> str:
    """The numeric literals of a code cell's source (its comments left out: a comment is prose, not code;
    its IPython lines blanked, so a ``%time`` line does not hide the cell's literals)."""
    try:
        tree = ast.parse(po_catalogue.cell_source(source))
    except SyntaxError:  # not Python even without its magics: no literal counts
        return ""
    return " ".join(repr(node.value) for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and type(node.value) in (int, float))


def output_numbers(nb: nbformat.NotebookNode) -> list[float]:
    """Every number (absolute value) of a notebook's stored run: printed in an output, a literal of an executed
    code cell (the run used it: ``steps=500``, ``lr=5e-3``), or in the run record ``metadata.course``."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    texts = [_output_text(o) for c in code for o in c.get("outputs", [])]
    texts += [_code_literals(c.source) for c in code if c.get("execution_count") is not None]
    texts.append(str(nb.metadata.get("course", {})))
    numbers = []
    for text in texts:
        for m in _OUTPUT_NUMBER.finditer(text):
            try:
                numbers.append(abs(float(m.group().replace(",", "").replace("−", "-"))))
            except ValueError:
                continue
    return sorted(numbers)


def is_printed(number: ProseNumber, printed: list[float]) -> bool:
    """True when some printed value, at one of the number's scales, rounds to it at the prose's precision."""
    half = 0.5 * 10.0 ** -number.decimals
    for scale in number.scales:
        low, high = (number.value - half) * scale, (number.value + half) * scale
        low, high = min(low, high), max(low, high)
        eps = 1e-9 * max(abs(low), abs(high), 1e-300)
        i = bisect.bisect_left(printed, low - eps)
        if i < len(printed) and printed[i] <= high + eps:
            return True
    return False


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def derive(rule: str, printed: list[float]) -> float:
    """The value of a declared derivation such as ``"538.1 / 96.6"``; every operand must be a printed number."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            operand = float(node.value)
            digits = len(repr(node.value).partition(".")[2]) if isinstance(node.value, float) else 0
            probe = ProseNumber(0, "", str(node.value), operand, digits, (1.0,), "")
            if not is_printed(probe, printed):
                raise ValueError(f"the operand {node.value} of {rule!r} is printed by no output")
            return operand
        raise ValueError(f"{rule!r}: a derivation uses printed numbers with + - * / only")
    return value(ast.parse(rule, mode="eval"))


def load_allowed(notebook: Path) -> list[dict[str, str]]:
    """The allow-list of a lesson (shared by its English and Korean notebooks), or [] when it has none."""
    path = ALLOW_DIR / f"{notebook.stem}.yaml"
    if not path.exists():
        return []
    entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    for entry in entries:
        if not isinstance(entry, dict) or not {"cell", "number", "reason"} <= entry.keys():
            raise ValueError(f"{path.name}: every entry needs cell, number and reason; got {entry!r}")
    return entries


def _number_key(text: str) -> str:
    return text.replace(",", "").replace("−", "-").replace(" ", "")


def unmatched_numbers(path: Path, allowed: Iterable[dict[str, str]] | None = None) -> list[Finding]:
    """The numbers of ``path``'s Markdown that no output prints and no allow-list entry explains."""
    nb = nbformat.read(path, as_version=4)
    printed = output_numbers(nb)
    allowed = list(load_allowed(path) if allowed is None else allowed)
    lang = "ko" if "ko" in path.parts else "en"
    excused: dict[tuple[str, str], dict[str, str]] = {}
    findings = []
    for entry in allowed:
        if entry.get("lang", lang) != lang:
            continue
        key = (str(entry["cell"]), _number_key(str(entry["number"])))
        excused[key] = entry
        if "derived" in entry:
            try:
                got = derive(str(entry["derived"]), printed)
            except ValueError as err:
                findings.append(Finding(str(path), -1, str(entry["cell"]), f"allow-list: {err}"))
                continue
            probe = prose_numbers(str(entry["number"]))
            if not probe or not is_printed(probe[0], [abs(got)]):
                findings.append(Finding(str(path), -1, str(entry["cell"]),
                                        f"allow-list: {entry['derived']} = {got:.6g}, not {entry['number']}"))
    used = set()
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown" or "generated-banner" in cell.get("metadata", {}).get("tags", []):
            continue
        for number in prose_numbers(cell.source, index, cell.get("id", "")):
            key = (number.cell_id, _number_key(number.text))
            if key in excused:
                used.add(key)
                continue
            if not is_printed(number, printed):
                findings.append(Finding(str(path), index, number.cell_id,
                                        f"{number.text!r} is in no stored output: {number.sentence[:160]}"))
    for key in excused.keys() - used:
        findings.append(Finding(str(path), -1, key[0], f"allow-list entry for {key[1]!r} matches no number there"))
    return findings


# ---- claims and their proofs ---------------------------------------------------------------------------------

_CLAIMS_START = re.compile(r"(?:Syllabus )?claims? proved here[^\n]*?:|이 단원에서 증명하는 주장[^\n]*?:", re.I)
_CLAIM_ID = re.compile(r"\b([A-Z]\d{1,2})\b")
_SECTION = re.compile(r"§\s*(\d+)|(\d+)절")
_CHECK = re.compile(
    r"^\s*assert\b|assert_close|assert_allclose|allclose\(|\bcheck\.\w+\(|reveal\(|torch\.equal\(|array_equal\(", re.M
)


_STAGES = re.compile(r"(?:\b[Ss]tages?|채점 단계)\s*(\d+)(?:\s*[–\-]\s*(\d+))?")


def _stages(text: str) -> list[int]:
    """The graded stages an entry names when it points at the solutions notebook ("stages 1–4")."""
    if "solutions/" not in text:
        return []
    return [n for a, b in _STAGES.findall(text) for n in range(int(a), int(b or a) + 1)]


def claimed(goal: str) -> dict[str, list[int]]:
    """The claim ids of a goal cell's claims paragraph, each with the sections it names (``§3``)."""
    m = _CLAIMS_START.search(goal)
    if not m:
        return {}
    block = goal[m.end():].split("\n\n**", 1)[0].split("\n\n", 2)
    text = block[0] if block[0].strip() else "\n\n".join(block[:2])
    claims: dict[str, list[int]] = {}
    # an entry runs from its id to the next id of the same paragraph
    ids = [(mm.start(), mm.group(1)) for mm in _CLAIM_ID.finditer(text)]
    for (start, cid), (end, _) in zip(ids, ids[1:] + [(len(text), "")], strict=True):
        sections = [int(a or b) for a, b in _SECTION.findall(text[start:end])]
        sections += [-n for n in _stages(text[start:end])]  # negative: a stage of the solutions notebook
        claims.setdefault(cid, []).extend(sections)
    return claims


def sections(nb: nbformat.NotebookNode, heading: str = r"^##\s+(\d+)\b") -> dict[int, list[int]]:
    """Section number -> the indices of the cells under that ``## N`` heading (or the ``heading`` pattern's
    number), up to the next ``##`` heading."""
    result: dict[int, list[int]] = {}
    current: int | None = None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(heading, line)
                if m:
                    current = int(m.group(1))
                    result.setdefault(current, [])
                elif re.match(r"^##\s", line):
                    current = None
        if current is not None:
            result[current].append(index)
    return result


def claim_problems(path: Path) -> list[Finding]:
    """What is wrong with the goal cell's claims: an id without a section, a section missing or without a check."""
    nb = nbformat.read(path, as_version=4)
    goal = next((c for c in nb.cells if c.cell_type == "markdown"
                 and "generated-banner" not in c.get("metadata", {}).get("tags", [])), None)
    if goal is None:
        return [Finding(str(path), 0, "", "no goal cell")]
    index = nb.cells.index(goal)
    claims = claimed(goal.source)
    parts = sections(nb)
    solutions = ROOT / "solutions" / path.name
    if solutions.exists():  # the graded stages of the lesson's solutions notebook, as negative numbers
        graded = nbformat.read(solutions, as_version=4)
        parts.update({-n: cells for n, cells in sections(graded, r"^##\s+Stage\s+(\d+)\b").items()})
        stage_cells = graded.cells
    findings = []
    if not claims and not path.name.startswith("00_"):  # lesson 00 sets up the machine and claims nothing
        findings.append(Finding(str(path), index, goal.get("id", ""), "the goal cell lists no syllabus claims"))
    for cid, numbers in claims.items():
        if not numbers:
            findings.append(Finding(str(path), index, goal.get("id", ""),
                                    f"claim {cid} names no section (§N) that proves it"))
        for n in numbers:
            where = f"section {n}" if n > 0 else f"stage {-n} of {solutions.relative_to(ROOT)}"
            if n not in parts:
                findings.append(Finding(str(path), index, goal.get("id", ""), f"claim {cid}: there is no {where}"))
                continue
            cells = nb.cells if n > 0 else stage_cells
            proofs = [i for i in parts[n] if cells[i].cell_type == "code" and _CHECK.search(cells[i].source)
                      and cells[i].get("execution_count") is not None]
            if not proofs:
                findings.append(Finding(str(path), index, goal.get("id", ""),
                                        f"claim {cid}: {where} has no executed assertion or comparison"))
    return findings


def main(argv: list[str] | None = None) -> int:
    """Print the findings of the notebooks named on the command line; exit 1 if there is any."""
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m course_tools.editions.prose_check NOTEBOOK.ipynb ...")
        return 2
    findings = [f for p in paths for f in unmatched_numbers(p) + claim_problems(p)]
    for finding in findings:
        print(finding)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
