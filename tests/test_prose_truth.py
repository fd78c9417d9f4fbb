"""Every number in a lesson's prose is in a stored output (or declared), every claim points at its proof.

The lessons are checked in both editions; the rules themselves are tested on small texts first, so a rule that
stops catching a wrong number fails here and not only in a later outside read.
"""

from pathlib import Path

import nbformat
import pytest

from course_tools.editions import prose_check as pc

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EDITIONS = LESSONS + sorted((ROOT / "notebooks" / "ko").glob("[0-9][0-9]_*.ipynb"))


def numbers(text: str) -> list[str]:
    return [n.text for n in pc.prose_numbers(text)]


def printed(*values: float) -> list[float]:
    return sorted(abs(v) for v in values)


def found(text: str, *outputs: float) -> bool:
    (number,) = pc.prose_numbers(text)
    return pc.is_printed(number, printed(*outputs))


# ---- the rules ----------------------------------------------------------------------------------------------

def test_a_number_is_read_at_the_precision_the_prose_prints() -> None:
    assert found("The ratio is 5.6 here.", 5.57)
    assert not found("The ratio is 5.4 here.", 5.57)  # the outside read's "5.4 times fewer"
    assert found("It took 84 s.", 83.9)
    assert not found("It took 44.0 s.", 84.0)
    assert found("The loss is 2.515 now.", 2.5149)
    assert not found("The loss is 2.515 now.", 2.52)


def test_thousands_separators_scales_and_percent() -> None:
    assert found("It has 1,234,567 weights.", 1234567)
    assert found("About 22.7M parameters.", 22_713_216)
    assert found("About 124.4 million parameters.", 124_439_808)
    assert found("It is 96.6 MB on disk.", 96_600_123)
    assert found("The share is 32% of all.", 0.3207)
    assert found("The share is 32% of all.", 32.1)
    assert found("A gap of 3.8e-5 remains.", 3.81e-05)
    assert not found("A gap of 3.8e-5 remains.", 3.8e-04)
    assert found("That is 2.5× faster.", 2.46)


def test_korean_units() -> None:
    assert found("매개변수는 1억 2,444만 개입니다.", 124_439_808)
    assert found("12억 9천만 개 더 많습니다.", 1_290_000_000)
    assert not found("12억 9천만 개 더 많습니다.", 1_310_000_000)
    assert found("GPT-3는 1,750억 개입니다.", 175_000_000_000)
    assert found("7.0초 걸렸습니다.", 7.01)
    assert found("0.111만큼 낮습니다.", 0.111)  # 만큼 is a particle


def test_structure_is_not_checked() -> None:
    assert numbers("## 3 · Counting the parameters") == []
    assert numbers("1. first step\n2. second step") == []
    assert numbers("As lesson 07 showed, and lessons 02–04 before it.") == []
    assert numbers("단원 09에서, 그리고 단원 02–04에서.") == []
    assert numbers("See §3 and section 4.2.") == []
    assert numbers("GPT-2 and LLaMA-3 run in float16 as Q4_1.") == []
    assert numbers("Claims A1 and X6.") == []
    assert numbers("Code `steps=500` and math $\\sqrt{64} = 8$.") == []
    assert numbers("Vaswani et al. (2017) measured 28.4 BLEU.") == []  # a cited sentence
    assert numbers("A link [to a page](https://example.org/a/123) with 4.2 in it.") == []
    assert numbers("## Further reading\n- Something with 1,000 numbers 42.") == []
    assert numbers("the 2·d = 128 of $d = 64$: so 64 here.") == ["128"]  # the formula's 64 is its constant
    assert numbers("**Time:** about 60 minutes of reading; 3–4 hours of writing.") == []
    assert numbers("*Paradise Lost* (1667), and 1667 lines.") == ["1667"]
    assert numbers("In the 2017 order, as the 2017 paper has it; 2017 steps.") == ["2017"]


def test_a_wrong_number_is_still_caught_beside_the_structure() -> None:
    assert numbers("In lesson 12 the file holds 48,900 merges (§2).") == ["48,900"]
    assert numbers("단원 13에서 정확도는 5.3%였습니다.") == ["5.3"]


def test_a_derivation_must_use_printed_numbers() -> None:
    outs = printed(538.1, 96.6)
    assert abs(pc.derive("538.1 / 96.6", outs) - 5.5704) < 1e-3
    with pytest.raises(ValueError, match="printed by no output"):
        pc.derive("538.1 / 97.0", outs)
    with pytest.raises(ValueError, match=r"\+ - \* /"):
        pc.derive("__import__('os')", outs)


def _notebook(tmp_path: Path, markdown: str, output: str, name: str = "99_demo.ipynb") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(markdown, id="md1"),
                nbformat.v4.new_code_cell("print(x)", id="code1", execution_count=1,
                                          outputs=[nbformat.v4.new_output("stream", text=output)])]
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def test_findings_name_notebook_cell_and_number(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "The loss fell to 2.9 after 500 steps.", "loss 2.515 after 500 steps\n")
    (finding,) = pc.unmatched_numbers(path, allowed=[])
    assert finding.cell == 0 and finding.cell_id == "md1" and "'2.9'" in str(finding) and str(path) in str(finding)


def test_the_allow_list_excuses_with_a_reason_and_checks_derivations(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "It is 5.57 times smaller, and 600 s is the limit.", "538.1 MB and 96.6 MB\n")
    allowed = [{"cell": "md1", "number": "5.57", "derived": "538.1 / 96.6", "reason": "the ratio of the sizes"},
               {"cell": "md1", "number": "600", "reason": "the grader's limit"}]
    assert pc.unmatched_numbers(path, allowed=allowed) == []
    wrong = [{**allowed[0], "derived": "538.1 / 96.7"}, allowed[1]]
    assert any("printed by no output" in f.what for f in pc.unmatched_numbers(path, allowed=wrong))
    stale = allowed + [{"cell": "md1", "number": "7", "reason": "gone"}]
    assert any("matches no number there" in f.what for f in pc.unmatched_numbers(path, allowed=stale))


def test_the_run_record_counts_as_an_output(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "The run took 55.0 s at a load of 1.2.", "nothing\n")
    assert len(pc.unmatched_numbers(path, allowed=[])) == 2
    nb = nbformat.read(path, as_version=4)
    nb.metadata["course"] = {"mode": "cpu", "seconds": 54.98, "load": [1.2, 1.9]}
    nbformat.write(nb, path)
    assert pc.unmatched_numbers(path, allowed=[]) == []


def test_a_literal_of_an_executed_code_cell_counts_but_not_a_comment(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "We train at a rate of 5e-3 for 4.17 s a step.", "done\n")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "lr = 5e-3  # 4.17 s a step\nprint(x)"
    nbformat.write(nb, path)
    assert [f.what[:6] for f in pc.unmatched_numbers(path, allowed=[])] == ["'4.17'"]
    nb.cells[1].execution_count = None  # a cell the stored run did not execute proves nothing
    nbformat.write(nb, path)
    assert len(pc.unmatched_numbers(path, allowed=[])) == 2


def test_a_magic_line_does_not_hide_the_cell_literals(tmp_path: Path) -> None:
    path = _notebook(tmp_path, "We train at a rate of 5e-3.", "done\n")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].source = "%%time\nlr = 5e-3\n!ls\nprint(x)"
    nbformat.write(nb, path)
    assert pc.unmatched_numbers(path, allowed=[]) == []


def test_claims_must_name_a_section_with_an_executed_check(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 99 · Demo\n\n**Syllabus claims proved here:** A1 (sums; §1), A2 (masks; §2), "
                                      "A3 (nothing)\n\n**Time:** short", id="goal"),
        nbformat.v4.new_markdown_cell("## 1 · Sums", id="s1"),
        nbformat.v4.new_code_cell("assert 1 + 1 == 2", id="c1", execution_count=1),
        nbformat.v4.new_markdown_cell("## 2 · Masks", id="s2"),
        nbformat.v4.new_code_cell("print('no check')", id="c2", execution_count=2),
    ]
    path = tmp_path / "99_demo.ipynb"
    nbformat.write(nb, path)
    assert pc.claimed(nb.cells[0].source) == {"A1": [1], "A2": [2], "A3": []}
    problems = sorted(f.what for f in pc.claim_problems(path))
    assert problems == ["claim A2: section 2 has no executed assertion or comparison",
                        "claim A3 names no section (§N) that proves it"]
