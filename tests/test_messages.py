"""Feedback in the learner's language: every check message has a fresh Korean translation, a Korean
notebook's checks answer in Korean (in a kernel, and in `course grade`'s feedback), and English stays
exactly as it was."""

import copy
import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

from course_tools import messages
from course_tools.cli import main
from course_tools.editions import banner, message_catalogue, translate
from course_tools.exercises.checks import check
from course_tools.grading import submission

ROOT = Path(__file__).resolve().parent.parent
KO = yaml.safe_load((ROOT / "translations" / "ko" / "messages" / "lesson00.yaml").read_text(encoding="utf-8"))
COURSE = yaml.safe_load((ROOT / "translations" / "ko" / "messages" / "course.yaml").read_text(encoding="utf-8"))
# a wrong answer of lesson 00 whose hint is known: the right numbers, merged (t b) instead of (b t)
WRONG_ORDER = "def flatten_tokens(x):\n    return x.transpose(0, 1).reshape(-1, x.shape[-1])\n"
ORDER_HINT = KO["references"]["_same_values_other_order.1"]["text"]
HEADS_HINT = KO["references"]["merged_heads_shape.wrong.(8, 5, 12)"]["text"]


@pytest.fixture
def korean():
    messages.use("ko")
    yield
    messages.use("en")


def printed(fn, *args) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def test_every_message_has_a_fresh_korean_translation():
    table, filled, problems, count = message_catalogue.compile_catalogue(ROOT, "ko")
    assert problems == []
    assert count > 600 and len(table) > 550  # the checker, the grader, 14 lessons' hints, notes and reveals
    built = (ROOT / "course_tools" / "messages_ko.json").read_text(encoding="utf-8")
    assert built == message_catalogue.catalogue_text(table, filled, "ko"), "run `course translate ko`"


def test_messages_are_found_in_the_code():
    found = message_catalogue.sources(ROOT)
    lesson00 = found["lesson00"]["references"][1]
    assert lesson00["merged_heads_shape.wrong.(8, 5, 12)"].startswith("the heads are cut out of D")
    assert lesson00["spread_exponent.explain"].startswith("the average of T independent")
    assert "_same_values_other_order.1" in lesson00 and not any(k.startswith("flatten_tokens.") for k in lesson00)
    assert found["lesson02"]["references"][1]["_softmax_hint.2"] == \
        "you normalised over axis {dim}; each query's row of scores is the last axis (dim=-1)"
    assert found["course"]["checks"][1]["summary.4"] == "{name}: not right yet"
    assert all(k.endswith(".why") for k in found["lesson08"]["reveals"][1])


def copy_for_messages(tmp_path: Path) -> Path:
    """The sources the message files translate, and the files, in a scratch root."""
    shutil.copytree(ROOT / "course_tools", tmp_path / "course_tools", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "notebooks").mkdir()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(path, tmp_path / "notebooks" / path.name)
    shutil.copytree(ROOT / "translations" / "ko" / "messages", tmp_path / "translations" / "ko" / "messages")
    return tmp_path


def test_changed_english_is_stale_and_a_lost_placeholder_is_refused(tmp_path):
    root = copy_for_messages(tmp_path)
    module = root / "course_tools" / "exercises" / "references" / "lesson00.py"
    module.write_text(module.read_text().replace("average over the time axis T", "average over the axis T"))
    path = root / "translations" / "ko" / "messages" / "lesson02.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["references"]["_softmax_hint.2"]["text"] = "축이 틀렸습니다"  # {dim} left out
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    problems = "\n".join(message_catalogue.compile_catalogue(root, "ko")[2])
    assert ("lesson00.yaml (references, course_tools/exercises/references/lesson00.py): "
            "message _reduced_wrong_axis.1 is stale") in problems
    assert "_softmax_hint.2 must keep the placeholders ['{dim}']" in problems
    assert problems.count("\n") == 1


def test_a_wrong_answer_gets_korean_feedback_in_process(korean):
    text = printed(check.flatten_tokens, lambda x: x.transpose(0, 1).reshape(-1, x.shape[-1]))
    assert text.startswith("flatten_tokens: 사례 3개 중 1개 통과(일부 사례 실패)")
    assert f"— 힌트: {ORDER_HINT}" in text and "hint" not in text
    text = printed(check.merged_heads_shape, (8, 5, 12))
    assert text.splitlines() == ["merged_heads_shape: 아직 틀렸습니다",
                                 f"  ✗ 내 답: (8, 5, 12): 답이 아닙니다 — 힌트: {HEADS_HINT}"]
    text = printed(check.merged_heads_shape, (8, 5, 3))
    assert text.splitlines()[-1] == "  이유: " + KO["references"]["merged_heads_shape.explain"]["text"]


def test_a_filled_in_hint_keeps_its_value_in_korean(korean):
    import torch

    text = printed(check.stable_softmax, lambda x: torch.softmax(x, dim=1))
    template = yaml.safe_load((ROOT / "translations" / "ko" / "messages" / "lesson02.yaml").read_text())[
        "references"]["_softmax_hint.2"]["text"]
    assert "{dim}" in template and f"— 힌트: {template.replace('{dim}', '1')}" in text


def test_english_is_unchanged():
    text = printed(check.merged_heads_shape, (8, 5, 12))
    assert text.splitlines() == ["merged_heads_shape: not right yet", "  ✗ your answer: (8, 5, 12) is not the answer — "
                                 "hint: the heads are cut out of D: each keeps D/H = 3 features, not all 12"]
    assert messages.say("the right numbers in the wrong order: merge (b t), not (t b)") == \
        "the right numbers in the wrong order: merge (b t), not (t b)"


def test_unknown_text_stays_english_and_placeholders_match_only_their_kind():
    ko = messages.catalogue("ko")
    assert ko.say("x of shape (B=2, T=3, D=4)") == "x of shape (B=2, T=3, D=4)"  # not "{type} of {len}"
    assert ko.say("tuple of 2") == "길이 2의 tuple"
    assert ko.say("a sentence no message has") == "a sentence no message has"
    huge = "expected 'a', got '" + "x, got " * 100_000 + "'"  # an answer's repr is no message: not matched
    assert ko.say(huge) == huge and ko.say("expected 'a', got 'b'") == "기대한 값 'a', 받은 값 'b'"
    with pytest.raises(ValueError, match="unknown language 'xx'; use one of en, ko"):
        messages.use("xx")


def test_korean_notebooks_set_their_language_and_translate_stored_reveals():
    setup = message_catalogue.LANGUAGE_LINE.format(lang="ko", name="Korean")
    for folder in ("notebooks", "exercises"):
        nb = banner.without(nbformat.read(ROOT / folder / "ko" / "00_setup.ipynb", as_version=4))
        english = nbformat.read(ROOT / folder / "00_setup.ipynb", as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert first.source == next(c for c in banner.without(english).cells if c.cell_type == "code").source + \
            "\n" + setup
    nb = nbformat.read(ROOT / "notebooks" / "ko" / "00_setup.ipynb", as_version=4)
    reveal = next(c for c in nb.cells if c.id == "34092bf2")  # the cell whose why= is translated
    text = "".join(o.get("text", "") for o in reveal.outputs)
    assert text.splitlines()[0] == COURSE["predict"]["reveal.1"]["text"]
    assert "이유: " + KO["reveals"]["34092bf2.why"]["text"] in text and "why:" not in text


def test_a_wrong_answer_in_a_korean_exercise_notebook_gets_korean_feedback_in_a_kernel(tmp_path):
    """The Korean exercise notebook's own setup cell, a wrong answer, and its check cell, in a kernel."""
    nb = banner.without(nbformat.read(ROOT / "exercises" / "ko" / "00_setup.ipynb", as_version=4))
    code = [c for c in nb.cells if c.cell_type == "code"]
    check_cell = next(c for c in code if c.source.strip() == "check.flatten_tokens(flatten_tokens)")
    run = nbformat.v4.new_notebook(cells=[copy.deepcopy(code[0]), nbformat.v4.new_code_cell(WRONG_ORDER),
                                          copy.deepcopy(check_cell)], metadata=nb.metadata)
    NotebookClient(run, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in run.cells[2].outputs)
    assert text.startswith("flatten_tokens: 사례 3개 중 1개 통과(일부 사례 실패)") and f"— 힌트: {ORDER_HINT}" in text


def test_course_grade_writes_korean_feedback_for_a_korean_submission(tmp_path):
    nb = nbformat.read(ROOT / "exercises" / "ko" / "00_setup.ipynb", as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id == "flatten_tokens":
            cell.source = WRONG_ORDER
        if grade_id == "merged_heads_shape":
            cell.source = "merged_heads_shape = (8, 5, 12)\n"
    english = copy.deepcopy(nb)
    english.metadata.pop("course_edition")
    hostile = copy.deepcopy(nb)
    hostile.metadata["course_edition"] = {"lang": "../../etc"}
    folder = tmp_path / "submissions"
    folder.mkdir()
    for name, book in {"ko": nb, "en": english, "hostile": hostile}.items():
        nbformat.write(book, folder / f"{name}.ipynb")
    out = tmp_path / "out"
    assert main(["grade", str(folder), "--out", str(out), "--cell-timeout", "60", "--seed", "1"]) == 0
    korean = (out / "feedback" / "ko.feedback.md").read_text(encoding="utf-8")
    assert "# 피드백: ko" in korean and "점 만점에" in korean and "(실패)" in korean
    assert f"— 힌트: {ORDER_HINT}" in korean and f"(8, 5, 12): 답이 아닙니다 — 힌트: {HEADS_HINT}" in korean
    rows = {row["student"]: row for row in json.loads((out / "results.json").read_text())}
    assert [rows[name]["lang"] for name in ("ko", "en", "hostile")] == ["ko", "en", "en"]
    assert [e["status"] for e in rows["ko"]["exercises"]] == [e["status"] for e in rows["en"]["exercises"]]
    assert rows["ko"]["total"] == rows["en"]["total"]  # the same cases (one seed), the same score
    for name in ("en", "hostile"):
        text = (out / "feedback" / f"{name}.feedback.md").read_text(encoding="utf-8")
        assert f"# Feedback: {name}" in text and "hint: the right numbers in the wrong order" in text
        assert "힌트" not in text


@pytest.mark.parametrize("value", ["ko", "xx", 5, ["ko"], None, {"lang": "ko"}])
def test_only_known_language_codes_are_read_from_a_submission(value):
    nb = nbformat.v4.new_notebook(metadata={"course_edition": {"lang": value}})
    assert submission.parse(json.dumps(nb).encode()).lang == ("ko" if value == "ko" else "en")


def test_translate_builds_the_catalogue_beside_the_messages_module(tmp_path):
    root = copy_for_messages(tmp_path)
    edition = translate.build_messages(root, "ko")
    (path, text), = edition.files.items()
    assert path == root / "course_tools" / "messages_ko.json"
    assert json.loads(text)["messages"]["{name}: not right yet"] == "{name}: 아직 틀렸습니다"
