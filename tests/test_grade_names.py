"""`course grade` with names and files an instructor can read (issue 48, item 4): a file name that is
not UTF-8, one name spelled NFC and NFD, a look-alike and a case variant of another student's name,
a hard link, two identical copies, a copy of solutions/, and two blank notebooks. One folder run of
lesson 00, two at a time; each test reads its rows.
"""

import json
import os
import unicodedata

import nbformat
import pytest
from test_grade import FULL, FUNCTIONS, RIGHT, SOLUTION, submission
from test_grade_attacks import needs_sandbox

from course_tools.cli import main
from course_tools.grading import alike
from course_tools.grading import submission as reading

CP949 = "김철수".encode("cp949")  # a Korean name as an archive made on Korean Windows stores it
KOREAN = "한지민"
ALICE, ALICE_CYRILLIC = "alice", "\u0430lice"  # the second begins with CYRILLIC SMALL LETTER A


def own(tag: str) -> nbformat.NotebookNode:
    """A submission no other one equals: right answers, each with its own comment."""
    return submission({name: f"# {tag}\n{source}" for name, source in RIGHT.items()})


NOTEBOOKS = {
    KOREAN: own("nfc"),
    unicodedata.normalize("NFD", KOREAN): own("nfd"),
    ALICE: own("alice"),
    ALICE_CYRILLIC: own("cyrillic"),
    "bob": own("bob"),
    "BOB": own("BOB"),
    "carol": own("carol"),  # "dave" is a hard link to it
    "erin": own("shared"),
    "frank": own("shared"),
    "grace": submission(base=SOLUTION),
    "blank1": submission(),
    "blank2": submission(),
    "heidi": own("heidi"),
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("names")
    for name, nb in NOTEBOOKS.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    os.link(folder / "carol.ipynb", folder / "dave.ipynb")
    raw_name = os.fsencode(folder) + b"/" + CP949 + b".ipynb"
    with open(raw_name, "w") as f:
        nbformat.write(own("cp949"), f)
    out = tmp_path_factory.mktemp("names-out")
    args = ["grade", str(folder), "--lesson", "00", "--jobs", "2", "--cell-timeout", "30", "--out", str(out)]
    assert main(args) == 0
    rows = json.loads((out / "results.json").read_text())
    by_file = {os.path.basename(r["file"]).removesuffix(".ipynb"): r for r in rows}
    return {"rows": by_file, "out": out, "all": rows}


ESCAPED = "".join(f"\\x{b:02x}" for b in CP949)


@pytest.mark.slow
@needs_sandbox
def test_a_name_that_is_not_utf8_is_graded_under_its_escaped_bytes(graded):
    row = graded["rows"][ESCAPED]
    assert row["student"] == ESCAPED and row["total"] == sum(FUNCTIONS.values())  # graded like any other
    assert row["flags"] == [f"{reading.NOT_UTF8}; read as CP949 (Korean Windows) it is '김철수'"]
    [feedback] = (graded["out"] / "feedback").glob(ESCAPED.replace("\\", "%5C") + "*.feedback.md")
    assert "read as CP949" in feedback.read_text()


@pytest.mark.slow
@needs_sandbox
def test_nfc_and_nfd_spellings_read_the_same_and_are_flagged_in_both_rows(graded):
    rows = [r for r in graded["all"] if r["student"] == KOREAN]
    assert len(rows) == 2 and len({r["file"] for r in rows}) == 2  # both graded, one NFC display name
    for row in rows:
        assert len(row["alike"]) == 1 and "after NFC normalisation" in row["alike"][0]
    assert len(list((graded["out"] / "feedback").glob(f"{KOREAN}*.feedback.md"))) == 2


@pytest.mark.slow
@needs_sandbox
def test_a_look_alike_and_a_case_variant_are_flagged_in_both_rows(graded):
    rows = graded["rows"]
    assert rows[ALICE]["alike"] == [f"name reads like {ALICE_CYRILLIC!r} ({rows[ALICE_CYRILLIC]['file']}): "
                                    "look-alike characters a U+0061 LATIN SMALL LETTER A, "
                                    "а U+0430 CYRILLIC SMALL LETTER A"]
    assert rows[ALICE_CYRILLIC]["alike"][0].startswith(f"name reads like 'alice' ({rows[ALICE]['file']})")
    assert rows["bob"]["alike"] == [f"same name as 'BOB' ({rows['BOB']['file']}) but for case"]
    assert rows["BOB"]["alike"] == [f"same name as 'bob' ({rows['bob']['file']}) but for case"]


@pytest.mark.slow
@needs_sandbox
def test_a_hard_link_is_flagged_in_both_rows_and_not_as_a_copy(graded):
    rows = graded["rows"]
    assert rows["carol"]["alike"] == [f"the same file as {rows['dave']['file']} (a hard link)"]
    assert rows["dave"]["alike"] == [f"the same file as {rows['carol']['file']} (a hard link)"]


@pytest.mark.slow
@needs_sandbox
def test_identical_copies_and_a_copy_of_the_solutions_are_flagged(graded):
    rows = graded["rows"]
    assert rows["erin"]["alike"] == [f"the same answers as {rows['frank']['file']}"]
    assert rows["frank"]["alike"] == [f"the same answers as {rows['erin']['file']}"]
    assert rows["grace"]["alike"] == ["the same answers as solutions/00_setup.ipynb"]
    assert rows["grace"]["total"] == FULL


@pytest.mark.slow
@needs_sandbox
def test_blank_notebooks_and_a_unique_name_are_not_flagged(graded):
    for name in ("blank1", "blank2", "heidi"):
        assert graded["rows"][name]["alike"] == [] and graded["rows"][name]["flags"] == []


@pytest.mark.slow
@needs_sandbox
def test_findings_are_in_the_gradebook_not_in_feedback(graded):
    text = (graded["out"] / "gradebook.csv").read_text()
    assert "the same answers as solutions/00_setup.ipynb" in text and "(a hard link)" in text
    feedback = "".join(p.read_text() for p in (graded["out"] / "feedback").iterdir())
    assert not any(words in feedback for words in ("the same answers", "the same file", "reads like", "same name"))


@pytest.mark.parametrize("name", ["kim\udcb1", "a\\xb1", "a\\\\", "\x85", "\udcc2\udc85", "x\u200by", "\ud800"])
def test_readable_names_lose_nothing(name):
    """Different names never read the same: the rendering is one-to-one, with no hidden character left."""
    others = ["kim\udcb1", "a\\xb1", "a\\\\", "\x85", "\udcc2\udc85", "x\u200by", "\ud800", "xy", "a\\"]
    shown = reading.readable(name)
    assert all(reading.readable(o) != shown for o in others if o != name)
    assert shown.isprintable() and shown.encode("utf-8")


@pytest.mark.parametrize("a, b", [
    ("alice", "\u0430lice"), ("Alice", "\u0410LICE"), ("pop", "\u0440\u03bf\u0440"), ("kim", "kirn"),
    ("kim", "ki\u200bm"), ("lee", "1ee"), ("Omar", "\u039f\u043car"), ("ｊｏｓｅ", "jose"),
])
def test_look_alike_names_share_a_skeleton(a, b):
    assert alike.skeleton(a) == alike.skeleton(b)


@pytest.mark.parametrize("a, b", [("kim", "kin"), ("josé", "jose"), ("한지민", "한지만"), ("lee", "lea")])
def test_different_names_keep_different_skeletons(a, b):
    assert alike.skeleton(a) != alike.skeleton(b)
