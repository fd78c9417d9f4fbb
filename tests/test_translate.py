"""Language editions (translations/<lang>/*.yaml -> notebooks/<lang>/, exercises/<lang>/) stay in sync with English."""

import ast
import copy
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from course_tools import messages
from course_tools.editions import banner, po_catalogue, translate
from course_tools.exercises import predict
from course_tools.grading import submission

ROOT = Path(__file__).resolve().parent.parent
LANGS = sorted(p.name for p in (ROOT / translate.TRANSLATIONS).iterdir() if p.is_dir())
FILES = [p for lang in LANGS for p in translate.translation_files(ROOT, lang)]
HANGUL = re.compile(r"[\uac00-\ud7a3]")


def built(lang):
    return translate.build(ROOT, lang)


@pytest.mark.parametrize("lang", LANGS)
def test_every_prose_cell_translated_and_current(lang):
    assert built(lang).problems == []


@pytest.mark.parametrize("lang", LANGS)
def test_committed_notebooks_equal_the_build(lang):
    edition = built(lang)
    assert len(edition.files) == 2 * len(translate.translation_files(ROOT, lang)) + \
        len(translate.document_files(ROOT, lang)) + 2  # the PO file and its compiled catalogue
    assert translate.out_of_date(ROOT, edition) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_code_and_outputs_identical_to_english(path):
    for folder in translate.SECTIONS.values():
        english = banner.without(nbformat.read(ROOT / folder / f"{path.stem}.ipynb", as_version=4))
        other = nbformat.read(ROOT / folder / path.parent.name / f"{path.stem}.ipynb", as_version=4)
        assert other.cells[0].id == banner.TAG and f"`{path.relative_to(ROOT)}`" in other.cells[0].source
        banner.without(other)
        assert [(c.id, c.cell_type) for c in other.cells] == [(c.id, c.cell_type) for c in english.cells]
        lang = path.parent.name
        setup = next(c.id for c in english.cells if c.cell_type == "code")
        language = translate.LANGUAGE_LINE.format(lang=lang, name=translate.NAMES.get(lang, lang))
        for mine, theirs in zip(other.cells, english.cells, strict=True):
            assert mine.metadata == theirs.metadata
            if mine.cell_type == "code":  # the same, but for the setup cell's language line and translated reveals
                assert mine.source == (theirs.source + "\n" + language if mine.id == setup else theirs.source)
                assert mine.execution_count == theirs.execution_count
                assert [o.output_type for o in mine.outputs] == [o.output_type for o in theirs.outputs]
                streams = [o for o in theirs.outputs if o.output_type == "stream"]
                if translate.RERUN_TAG in theirs.metadata.get("tags", []):
                    continue  # printed again in its language: test_a_tagged_cell_prints_again_in_each_language
                for a, b in zip(mine.outputs, theirs.outputs, strict=True):
                    if "reveal(" not in theirs.source or b is not streams[-1]:
                        assert a == b
                        continue
                    why = next(po_catalogue.whys(ast.parse(po_catalogue.cell_source(theirs.source))))[1]
                    with messages.speaking(lang):
                        assert a.text == predict.stored_reveal(b.text, why)


def _rerun(lang: str, english: nbformat.NotebookNode, cell_id: str) -> tuple[str, list[str]]:
    code = [c for c in copy.deepcopy(english).cells if c.cell_type == "code"]
    index = next(i for i, c in enumerate(code) if c.id == cell_id)
    with messages.speaking(lang):
        problems = translate.rerun_in_language(code[index], code[:index], "test")
    return "".join(code[index].outputs[0].text), problems


def test_a_tagged_cell_prints_again_in_each_language():
    """Lesson 00 shows a check's report on functions it defines: in English the cell, run again, prints
    exactly its stored output (so it depends on nothing but its imports), and the Korean edition stores
    the same report in Korean."""
    english = nbformat.read(ROOT / "notebooks" / "00_setup.ipynb", as_version=4)
    korean = nbformat.read(ROOT / "notebooks" / "ko" / "00_setup.ipynb", as_version=4)
    tagged = [c for c in english.cells if translate.RERUN_TAG in c.metadata.get("tags", [])]
    assert len(tagged) == 2
    for cell in tagged:
        again, problems = _rerun("en", english, cell.id)
        assert problems == [] and again == "".join(cell.outputs[0].text)
        in_korean, problems = _rerun("ko", english, cell.id)
        stored = next(c for c in korean.cells if c.id == cell.id)
        assert problems == [] and in_korean == "".join(stored.outputs[0].text)
        assert "cases passed" not in in_korean and "경우" in in_korean


def test_a_tagged_cell_that_fails_is_a_problem_not_a_crash():
    cell = nbformat.v4.new_code_cell("print(undefined_name)", id="abcd1234")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x\n")]
    problems = translate.rerun_in_language(cell, [], "00 (notebooks)")
    assert problems == ["00 (notebooks): cell abcd1234: running it again failed: NameError: "
                        "name 'undefined_name' is not defined"]
    assert cell.outputs[0].text == "x\n"


@pytest.mark.parametrize("path", [p for p in FILES if p.parent.name == "ko"], ids=lambda p: p.stem)
def test_korean_prose_is_korean(path):
    nb = banner.without(nbformat.read(ROOT / "notebooks" / "ko" / f"{path.stem}.ipynb", as_version=4))
    english = [c for c in nb.cells if c.cell_type == "markdown" and not HANGUL.search(c.source)]
    assert english == [], [c.id for c in english]


# What is not prose: fenced code, display and inline maths, code spans, HTML tags, link targets, bare URLs.
NOT_PROSE = re.compile(r"```.*?```|\$\$.*?\$\$|\$[^$\n]+\$|`[^`\n]*`|<[^>\n]+>|\]\([^)\s]*\)|https?://\S+", re.S)
MIN_HANGUL_SHARE = 0.6  # the lessons measure 0.71-0.92; untranslated English prose pulls a lesson under it


def hangul_share(markdown: str) -> float:
    """Share of Hangul syllables among the letters of Markdown prose (code, maths and link targets left out)."""
    letters = [ch for ch in NOT_PROSE.sub(" ", markdown) if ch.isalpha()]
    return sum(bool(HANGUL.match(ch)) for ch in letters) / len(letters)


@pytest.mark.parametrize("path", [p for p in FILES if p.parent.name == "ko"], ids=lambda p: p.stem)
def test_korean_prose_letters_are_mostly_hangul(path):
    """A cell may keep an English term or title, but a lesson's prose as a whole reads in Korean."""
    for folder in translate.SECTIONS.values():
        nb = banner.without(nbformat.read(ROOT / folder / "ko" / f"{path.stem}.ipynb", as_version=4))
        share = hangul_share("\n".join(c.source for c in nb.cells if c.cell_type == "markdown"))
        assert share >= MIN_HANGUL_SHARE, f"{folder}/ko/{path.stem}: {share:.0%} of its prose letters are Hangul"


def test_hangul_share_counts_prose_letters_only():
    assert hangul_share("한국어 `code_span` $x + y$ [글](https://example.org)") == 1.0
    assert hangul_share("```python\nprint('x')\n```\n한글 ab") == 0.5


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_exercise_edition_grades_like_english(path):
    """Same grade ids, points and lesson metadata: the grader identifies it as the English lesson."""
    english = nbformat.read(ROOT / "exercises" / f"{path.stem}.ipynb", as_version=4)
    mine_path = ROOT / "exercises" / path.parent.name / f"{path.stem}.ipynb"
    assert submission.exercise_cells(nbformat.read(mine_path, as_version=4)) == submission.exercise_cells(english)
    parsed = submission.parse(mine_path.read_bytes())
    assert submission.identify_lesson(parsed, {path.stem: english}) == path.stem


def copy_lesson(tmp_path, lesson="09_modern_decoder", lang="ko"):
    for folder in ("notebooks", "exercises"):
        (tmp_path / folder).mkdir()
        shutil.copy(ROOT / folder / f"{lesson}.ipynb", tmp_path / folder)
    (tmp_path / "translations" / lang).mkdir(parents=True)
    shutil.copy(ROOT / "translations" / lang / f"{lesson}.yaml", tmp_path / "translations" / lang)
    return tmp_path / "notebooks" / f"{lesson}.ipynb"


def first_markdown(nb):
    return next(c for c in nb.cells if c.cell_type == "markdown")


def test_editing_english_cell_fails_naming_lesson_and_cell(tmp_path, capsys):
    english = copy_lesson(tmp_path)
    nb = nbformat.read(english, as_version=4)
    cell = first_markdown(nb)
    cell.source += "\nOne more sentence."
    nbformat.write(nb, english)
    problems = translate.build(tmp_path, "ko").problems
    assert len(problems) == 1
    assert problems[0].startswith(f"09_modern_decoder (notebooks): cell {cell.id} is stale")
    assert translate.source_hash(cell.source) in problems[0]
    rc = translate.main(type("A", (), {"root": str(tmp_path), "lang": "ko", "check": True, "scaffold": None})())
    assert rc == 1 and f"cell {cell.id} is stale" in capsys.readouterr().err


def test_missing_orphan_and_untranslated_entries_are_reported(tmp_path):
    english = copy_lesson(tmp_path)
    nb = nbformat.read(english, as_version=4)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell("A new paragraph.", id="feedf00d"))
    nbformat.write(nb, english)
    yaml_path = tmp_path / "translations" / "ko" / "09_modern_decoder.yaml"
    text = yaml_path.read_text(encoding="utf-8").replace("  163e11a0:", "  deadbeef:")
    yaml_path.write_text(text, encoding="utf-8")
    problems = "\n".join(translate.build(tmp_path, "ko").problems)
    assert "cell feedf00d has no translation" in problems
    assert "cell 163e11a0 has no translation" in problems
    assert "entry deadbeef matches no markdown cell" in problems
    translate.scaffold(tmp_path, "ko", "09_modern_decoder")  # adds the English as a placeholder
    problems = "\n".join(translate.build(tmp_path, "ko").problems)
    assert "cell feedf00d is untranslated" in problems and "has no translation" not in problems


def test_build_writes_then_check_passes(tmp_path):
    copy_lesson(tmp_path)
    args = type("A", (), {"root": str(tmp_path), "lang": "ko", "check": False, "scaffold": None})()
    assert translate.main(args) == 0
    args.check = True
    assert translate.main(args) == 0
    assert (tmp_path / "exercises" / "ko" / "09_modern_decoder.ipynb").exists()


def test_korean_notebooks_are_not_collected_by_nbval():
    """pytest itself, asked to collect the edition folders, finds nothing there (their conftest.py)."""
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "notebooks/ko", "exercises/ko"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 5 and "no tests collected" in run.stdout, run.stdout[-2000:]


def test_documents_split_at_level_two_headings_outside_code_fences():
    text = "# Title\n\nIntro.\n\n## Quick start\n\n```bash\n## not a heading\n```\n\n## The `course` command\nx\n"
    assert translate.document_sections(text) == [
        ("intro", "# Title\n\nIntro."), ("quick-start", "## Quick start\n\n```bash\n## not a heading\n```"),
        ("the-course-command", "## The `course` command\nx")]


def test_document_sections_are_translated_or_kept_in_english_with_a_reason(tmp_path):
    (tmp_path / "README.md").write_text("# T\n\nHello.\n\n## Learners\n\nRead.\n\n## Developers\n\nCode.\n")
    docs = tmp_path / "translations" / "ko" / "docs"
    docs.mkdir(parents=True)
    sections = dict(translate.document_sections((tmp_path / "README.md").read_text()))
    entry = {"hash": translate.source_hash(sections["intro"]), "text": "# 제목\n\n안녕하세요."}
    (docs / "README.yaml").write_text(
        f"sections:\n  intro:\n    hash: '{entry['hash']}'\n    text: |-\n      # 제목\n\n      안녕하세요.\n"
        "english_only:\n  developers: contributors read the English\n", encoding="utf-8")
    edition = translate.build(tmp_path, "ko")
    assert edition.problems == ["README.md: section learners has no translation (add it with hash: "
                                f"{translate.source_hash(sections['learners'])})"]
    translate.scaffold(tmp_path, "ko", "README")
    edition = translate.build(tmp_path, "ko")
    assert edition.problems == ["README.md: section learners is untranslated (its text equals the English)"]
    comment = banner.comment("`translations/ko/docs/README.yaml` and `README.md`", "course translate ko")
    assert edition.files[tmp_path / "README.ko.md"] == f"{comment}\n\n# 제목\n\n안녕하세요.\n\n## Learners\n\nRead.\n"
    (tmp_path / "README.md").write_text("# T\n\nHello again.\n\n## Learners\n\nRead.\n")
    problems = "\n".join(translate.build(tmp_path, "ko").problems)
    assert "section intro is stale" in problems and "entry developers matches no section" in problems


def test_korean_edition_covers_every_lesson_and_every_document():
    lessons = {p.stem for p in ROOT.glob("notebooks/[0-9][0-9]_*.ipynb")}
    assert {p.stem for p in translate.translation_files(ROOT, "ko")} == lessons
    assert {p.stem for p in translate.document_files(ROOT, "ko")} == set(translate.DOCUMENTS)


def test_every_generated_file_names_its_source_and_command():
    """exercises/ (course assign), the Korean notebooks and documents (course translate ko)."""
    for path in sorted((ROOT / "exercises").glob("*.ipynb")):
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.id == banner.TAG and f"`solutions/{path.name}`" in first.source
        assert "`course assign`" in first.source
        assert first.source.startswith("*Your copy to fill in."), path  # the learner's own copy: said first
    for path in sorted(ROOT.glob("*/ko/*.ipynb")):
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.id == banner.TAG and "`course translate ko`" in first.source, path
        assert slides_type(first) == "skip"
        fill_in = path.parent.parent.name == "exercises"
        assert first.source.startswith("*여러분이 채워 넣을 사본" if fill_in else "*`translations/ko/"), path
        assert "Generated" not in first.source, path  # in Korean, like the rest of the edition
    for path in [ROOT / "README.ko.md", *sorted(ROOT.glob("*/*.ko.md")), *sorted(ROOT.glob("docs/pages/*.ko.md"))]:
        line = path.read_text(encoding="utf-8").splitlines()[0]
        assert line.startswith("<!-- Generated from `translations/ko/docs/") and "`course translate ko`" in line, path


def slides_type(cell):
    return cell.metadata.get("slideshow", {}).get("slide_type")


def test_a_rebuild_replaces_the_banner_instead_of_stacking_them(tmp_path):
    copy_lesson(tmp_path)
    for _ in range(2):
        translate.main(type("A", (), {"root": str(tmp_path), "lang": "ko", "check": False, "scaffold": None})())
    nb = nbformat.read(tmp_path / "notebooks" / "ko" / "09_modern_decoder.ipynb", as_version=4)
    assert [c.id for c in nb.cells].count(banner.TAG) == 1 and nb.cells[0].id == banner.TAG


def test_a_translation_cannot_put_a_hidden_answer_back_into_an_exercise(tmp_path):
    """An exercise cell reads YOUR ANSWER HERE; a translation that still holds the solution is refused, and the
    built Korean exercise keeps the English placeholder (no answer reaches the student)."""
    lesson = "13_adapting"
    copy_lesson(tmp_path, lesson)
    exercise = nbformat.read(tmp_path / "exercises" / f"{lesson}.ipynb", as_version=4)
    cell = next(c for c in exercise.cells if c.cell_type == "markdown" and c.source.endswith("YOUR ANSWER HERE"))
    path = tmp_path / "translations" / "ko" / f"{lesson}.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["exercises"][cell.id]["text"] += "\n\n### BEGIN SOLUTION\n정답\n### END SOLUTION"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    edition = translate.build_file(tmp_path, path)
    assert any(cell.id in p and "YOUR ANSWER HERE" in p for p in edition.problems), edition.problems
    built = nbformat.reads(edition.files[tmp_path / "exercises" / "ko" / f"{lesson}.ipynb"], as_version=4)
    assert "정답" not in "".join(c.source for c in built.cells)


def test_no_exercise_notebook_in_any_language_holds_a_solution():
    """What a student is handed carries no solution region and no 'why this answer' note, in either edition."""
    for path in sorted((ROOT / "exercises").rglob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            assert "BEGIN SOLUTION" not in cell.source, f"{path.relative_to(ROOT)}: cell {cell.id}"
            assert "solution-note" not in cell.metadata.get("tags", []), f"{path.relative_to(ROOT)}: cell {cell.id}"
