"""The lessons keep their truth: every number of the prose is a stored output or declared with its reason, and every
syllabus claim names the section whose executed check proves it (both editions; the rules are tested in
tests/test_prose_truth.py, the checker is course_tools/editions/prose_check.py)."""

from pathlib import Path

import pytest

from course_tools.editions import prose_check as pc

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EDITIONS = LESSONS + sorted((ROOT / "notebooks" / "ko").glob("[0-9][0-9]_*.ipynb"))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_both_editions_of_every_lesson_are_checked() -> None:
    assert len(LESSONS) >= 14 and len(EDITIONS) == 2 * len(LESSONS)


@pytest.mark.parametrize("path", EDITIONS, ids=_name)
def test_every_number_in_the_prose_is_printed_or_declared(path: Path) -> None:
    findings = pc.unmatched_numbers(path)
    listed = "\n".join(map(str, findings))
    assert not findings, f"{len(findings)} numbers of the prose are in no stored output:\n{listed}"


@pytest.mark.parametrize("path", EDITIONS, ids=_name)
def test_every_claim_points_at_its_proof(path: Path) -> None:
    findings = pc.claim_problems(path)
    assert not findings, "\n".join(map(str, findings))


def test_every_allow_list_belongs_to_a_lesson_and_gives_reasons() -> None:
    names = {p.stem for p in LESSONS}
    for path in sorted(pc.ALLOW_DIR.glob("*.yaml")):
        assert path.stem in names, f"{path.name} names no lesson of notebooks/"
        for entry in pc.load_allowed(ROOT / "notebooks" / f"{path.stem}.ipynb"):
            assert len(str(entry["reason"]).split()) >= 3, f"{path.name}: say why, not just a word: {entry}"
