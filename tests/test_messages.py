"""Feedback in the learner's language: every check message has a current Korean translation in the PO
file, the compiled catalogue is the PO file's, a Korean notebook's checks answer in Korean (in a kernel,
and in `course grade`'s feedback), and English stays exactly as it was."""

import copy
import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import nbformat
import pytest
from babel.messages.pofile import read_po
from nbclient import NotebookClient

from course_tools import messages
from course_tools.cli import main
from course_tools.editions import banner, po_catalogue, translate
from course_tools.exercises import checks as check_registry
from course_tools.exercises import predict
from course_tools.exercises.checks import check
from course_tools.grading import submission

ROOT = Path(__file__).resolve().parent.parent
PO = po_catalogue.po_path(ROOT, "ko")
# a wrong answer of lesson 00 whose hint is known: the right numbers, merged (t b) instead of (b t)
WRONG_ORDER = "def flatten_tokens(x):\n    return x.transpose(0, 1).reshape(-1, x.shape[-1])\n"


def korean(english: str) -> str:
    """The committed translation of one message."""
    return messages.translations("ko").gettext(english)


ORDER_HINT = korean("the right numbers in the wrong order: merge (b t), not (t b)")
HEADS_HINT = korean("the heads are cut out of D: each keeps D/H = 3 features, not all 12")


@pytest.fixture
def in_korean():
    messages.use("ko")
    yield
    messages.use("en")


def printed(fn, *args) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        fn(*args)
    return out.getvalue()


def test_every_message_has_a_current_korean_translation():
    catalog = po_catalogue.merged(ROOT, "ko")
    assert po_catalogue.problems(catalog, "course.po") == []
    assert len(catalog) > 750  # the checker, the grader, 14 lessons' hints, notes, case labels and reveals
    assert PO.read_text(encoding="utf-8") == po_catalogue.po_text(catalog), "run `course translate ko`"


def test_the_committed_catalogue_is_a_fresh_compile_of_the_po_file():
    assert messages.catalogue_path("ko").read_bytes() == po_catalogue.compiled(PO, "ko"), "run `course translate ko`"
    assert ORDER_HINT.startswith("숫자는 맞지만") and HEADS_HINT != "the heads are cut out of D"


def test_messages_are_found_in_the_code_and_the_notebooks():
    found = {m.id: m for m in po_catalogue.template(ROOT) if m.id}
    heads = found["the heads are cut out of D: each keeps D/H = 3 features, not all 12"]  # a known wrong answer
    assert heads.locations == [("course_tools/exercises/references/lesson00.py", heads.locations[0][1])]
    assert "{name}: not right yet" in found and "you normalised over axis {dim}; each query's row of scores is " \
        "the last axis (dim=-1)" in found
    why = next(m for m in found.values() if isinstance(m.id, str) and m.id.startswith("small random weights give"))
    assert why.locations[0][0] == "notebooks/08_train_gpt.ipynb" and why.auto_comments == ["cell d1e7261c"]
    plural = next(k for k in found if isinstance(k, tuple) and k[0].startswith("GPT with {n_layers} layer,"))
    assert plural[1].startswith("GPT with {n_layers} layers,")


def copy_for_messages(tmp_path: Path) -> Path:
    """The sources the PO file translates, and the PO file, in a scratch root."""
    shutil.copytree(ROOT / "course_tools", tmp_path / "course_tools", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "notebooks").mkdir()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        shutil.copy(path, tmp_path / "notebooks" / path.name)
    shutil.copy(ROOT / po_catalogue.MAPPING, tmp_path / po_catalogue.MAPPING)
    shutil.copytree(PO.parent, po_catalogue.po_path(tmp_path, "ko").parent)
    return tmp_path


def test_changed_english_is_fuzzy_and_a_lost_placeholder_is_refused(tmp_path):
    root = copy_for_messages(tmp_path)
    module = root / "course_tools" / "exercises" / "references" / "lesson00.py"
    module.write_text(module.read_text().replace("average over the time axis T", "average over the axis T"))
    path = po_catalogue.po_path(root, "ko")
    hint = "you normalised over axis {dim}; each query's row of scores is the last axis (dim=-1)"
    with open(path, "rb") as f:
        catalog = read_po(f, locale="ko")
    catalog[hint].string = "축이 틀렸습니다"  # {dim} left out
    path.write_text(po_catalogue.po_text(catalog), encoding="utf-8")
    problems = po_catalogue.problems(po_catalogue.merged(root, "ko"), "course.po")
    assert len(problems) == 2
    assert problems[0].startswith("course.po: fuzzy (its English changed; check the translation, then drop the flag)")
    assert "over the axis T" in problems[0]
    assert problems[1] == f"course.po: the translation of {hint[:67] + '...'!r} must keep the placeholders ['dim'] " \
        "(it has [])"
    assert po_catalogue.mo_bytes(po_catalogue.merged(root, "ko")) != messages.catalogue_path("ko").read_bytes()


def test_a_new_message_is_reported_untranslated(tmp_path):
    root = copy_for_messages(tmp_path)
    module = root / "course_tools" / "exercises" / "references" / "lesson00.py"
    module.write_text(module.read_text() + '\nNOTE = N_("zebra crossings are striped")\n')
    problems = po_catalogue.problems(po_catalogue.merged(root, "ko"), "course.po")
    assert problems == ["course.po: untranslated: 'zebra crossings are striped'"]


def test_a_wrong_answer_gets_korean_feedback_in_process(in_korean):
    text = printed(check.flatten_tokens, lambda x: x.transpose(0, 1).reshape(-1, x.shape[-1]))
    assert text.startswith("flatten_tokens: 경우 3개 중 1개 통과(일부 경우 실패)")
    assert f"— 힌트: {ORDER_HINT}" in text and "hint" not in text
    text = printed(check.merged_heads_shape, (8, 5, 12))
    assert text.splitlines() == ["merged_heads_shape: 아직 틀렸습니다",
                                 f"  ✗ 내 답: (8, 5, 12): 답이 아닙니다 — 힌트: {HEADS_HINT}"]
    text = printed(check.merged_heads_shape, (8, 5, 3))
    assert text.splitlines()[-1] == "  이유: " + korean(check_registry.get("merged_heads_shape").explain)


def test_a_filled_in_hint_keeps_its_value_in_korean(in_korean):
    import torch

    text = printed(check.stable_softmax, lambda x: torch.softmax(x, dim=1))
    template = korean("you normalised over axis {dim}; each query's row of scores is the last axis (dim=-1)")
    assert "{dim}" in template and f"— 힌트: {template.replace('{dim}', '1')}" in text


def test_english_is_unchanged():
    text = printed(check.merged_heads_shape, (8, 5, 12))
    assert text.splitlines() == ["merged_heads_shape: not right yet", "  ✗ your answer: (8, 5, 12) is not the answer — "
                                 "hint: the heads are cut out of D: each keeps D/H = 3 features, not all 12"]
    assert messages.say("the right numbers in the wrong order: merge (b t), not (t b)") == \
        "the right numbers in the wrong order: merge (b t), not (t b)"


def test_messages_are_translated_then_filled_and_plain_text_is_looked_up_as_it_is():
    label = messages.N_("{module} with the reference weights", module=messages.N_("missing {name}", name="W_Q"))
    assert label == "missing W_Q with the reference weights"  # a Message is its English
    assert messages.say(label, "ko") == "참조 가중치를 넣은 W_Q 없음"  # and its values are given in Korean too
    assert messages.say("not attempted", "ko") == "아직 시도하지 않음"  # a status read back from the gradebook
    assert messages.say("a sentence no message has", "ko") == "a sentence no message has"
    with messages.speaking("ko"):
        assert messages._("{wrong} of {expected_numel} entries differ", wrong=3, expected_numel=12) == \
            "12개 원소 가운데 3개가 다릅니다"
        assert messages._n("raw uint8 ({n}, 20): {n} Q4_1 block", "raw uint8 ({n}, 20): {n} Q4_1 blocks", 2, n=2) == \
            "원시 uint8 (2, 20): Q4_1 블록 2개"
    assert messages._n("raw uint8 ({n}, 20): {n} Q4_1 block", "raw uint8 ({n}, 20): {n} Q4_1 blocks", 1, n=1) == \
        "raw uint8 (1, 20): 1 Q4_1 block"
    with pytest.raises(ValueError, match="unknown language 'xx'; use one of en, ko"):
        messages.use("xx")


def test_a_particle_after_a_placeholder_fits_the_value():
    with messages.speaking("ko"):
        for name, particle in [("Block", "을"), ("GPT", "를"), ("FeedForward", "를"), ("CausalSelfAttention", "을")]:
            hint = messages._("check the {class_of_kind} stage by stage: the smaller modules' cases above say "
                              "which one differs", class_of_kind=name)
            assert hint.startswith(f"{name}{particle} 단계별로"), hint
        assert messages._("positions 0..{first_1} unchanged (max change {moved:.1g})", first_1=4, moved=0.0) \
            .startswith("위치 0..4는 ")
        assert messages._("positions 0..{first_1} unchanged (max change {moved:.1g})", first_1=8, moved=0.0) \
            .startswith("위치 0..8은 ")


def test_korean_notebooks_set_their_language_and_translate_stored_reveals():
    setup = translate.LANGUAGE_LINE.format(lang="ko", name="Korean")
    for folder in ("notebooks", "exercises"):
        nb = banner.without(nbformat.read(ROOT / folder / "ko" / "00_setup.ipynb", as_version=4))
        english = nbformat.read(ROOT / folder / "00_setup.ipynb", as_version=4)
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert first.source == next(c for c in banner.without(english).cells if c.cell_type == "code").source + \
            "\n" + setup
    nb = nbformat.read(ROOT / "notebooks" / "ko" / "00_setup.ipynb", as_version=4)
    reveal = next(c for c in nb.cells if c.id == "34092bf2")  # the cell whose why= is translated
    text = "".join(o.get("text", "") for o in reveal.outputs)
    why = ("d appears in both inputs but not in the output, so it is summed away; every other name stays, in the "
           "output's order: one score per (sequence, head, query t, key s)")
    assert text.splitlines() == [korean("your prediction: none yet (write it in the cell above, then run this cell "
                                        "again)"), "측정값: (2, 2, 3, 3)", "이유: " + korean(why)]


def test_a_stored_reveal_is_given_again_only_when_it_is_a_reveal():
    why = "16 bytes of 4-bit numbers plus 2 bytes of scale and 2 of minimum: 160 bits for 32 weights"
    stored = ("printed first\nyour prediction: none yet (write it in the cell above, then run this cell again)\n"
              f"measured: 5.0\nwhy: {why}\n")
    with messages.speaking("ko"):
        shown = predict.stored_reveal(stored, why)
        assert shown.splitlines()[0] == "printed first" and shown.splitlines()[2] == "측정값: 5.0"
        assert predict.stored_reveal(stored.replace("measured", "measure"), why) is None
        assert predict.stored_reveal(stored, "another why") is None


@pytest.mark.slow
def test_a_wrong_answer_in_a_korean_exercise_notebook_gets_korean_feedback_in_a_kernel(tmp_path):
    """The Korean exercise notebook's own setup cell, a wrong answer, and its check cell, in a kernel."""
    nb = banner.without(nbformat.read(ROOT / "exercises" / "ko" / "00_setup.ipynb", as_version=4))
    code = [c for c in nb.cells if c.cell_type == "code"]
    check_cell = next(c for c in code if c.source.strip() == "check.flatten_tokens(flatten_tokens)")
    run = nbformat.v4.new_notebook(cells=[copy.deepcopy(code[0]), nbformat.v4.new_code_cell(WRONG_ORDER),
                                          copy.deepcopy(check_cell)], metadata=nb.metadata)
    NotebookClient(run, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in run.cells[2].outputs)
    assert text.startswith("flatten_tokens: 경우 3개 중 1개 통과(일부 경우 실패)") and f"— 힌트: {ORDER_HINT}" in text


@pytest.mark.slow
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


def test_translate_builds_the_po_file_and_the_catalogue_beside_the_messages_module(tmp_path):
    root = copy_for_messages(tmp_path)
    edition, compiled = translate.build_messages(root, "ko")
    assert set(edition.files) == {po_catalogue.po_path(root, "ko"),
                                  root / "course_tools" / "locale" / "ko" / "LC_MESSAGES" / "course.mo"}
    assert compiled.gettext("{name}: not right yet") == "{name}: 아직 틀렸습니다"
