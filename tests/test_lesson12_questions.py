"""Lesson 12's self-check questions compute their answers; here each computation is tied to what it stands
for: the file's bits per weight to the real file's memory report, the forgotten RoPE permutation of the
small stand-in to SmolLM2 itself, the zeros of a Q4_1 block to its levels worked out by hand."""

import pytest
import torch

from course_tools.exercises import checks
from course_tools.exercises.references import lesson12 as L
from course_tools.messages import say
from course_utils import gguf, pretrained, quantize


@pytest.fixture(scope="module")
def smollm2_file():
    pytest.importorskip("gguf")
    return gguf.read(pretrained.fetch(pretrained.SMOLLM2))


def test_the_bits_per_weight_of_a_config_is_the_memory_report_of_the_real_file(smollm2_file):
    report = gguf.memory_report(smollm2_file)
    assert L.file_bits_per_weight(L.SMOLLM2_CONFIG) == pytest.approx(report["bits_per_weight"], rel=1e-12)
    assert report["weights"] == 134_515_008


def test_the_360m_answer_and_its_explanation_agree():
    ex = checks.get("smollm2_360m_bits")
    bits = ex.reference()
    assert 5.0 < bits < L.file_bits_per_weight(L.SMOLLM2_CONFIG)  # a larger model: the embedding's share falls
    assert f"{bits:.2f} bits a weight" in ex.explain
    for wrong in ex.hints[0].table:  # every known wrong answer is told apart from the right one
        assert abs(wrong - bits) > ex.atol


def test_the_forgotten_permutation_keeps_only_the_first_position():
    assert L.unpermuted_agreement() == (True,) + (False,) * 5
    assert L.unpermuted_positions() == "a"
    assert [L.agreement_letter(p) for p in ((True,) * 6, (False,) * 6, (True, True, False, False))] == ["b", "c", "d"]
    with pytest.raises(ValueError):
        L.agreement_letter((False, True))


@pytest.mark.slow
def test_smollm2_itself_agrees_only_at_the_first_position_without_the_permutation():
    """The stand-in's answer holds for SmolLM2: the course's GPT holds the file's rows; the bug is a rotate-half
    model holding them, the same as the course's GPT holding them reordered halves-to-pairs."""
    from course_utils.positional import rope_halves_to_pairs

    model, tok = pretrained.load(pretrained.SMOLLM2)
    ids = torch.tensor([tok.encode("The capital of France is Paris, and")[:6]])
    with torch.no_grad():
        right = model(ids)[0][0]
        for block in model.blocks:
            attn = block.attn
            attn.W_Q.weight.copy_(rope_halves_to_pairs(attn.W_Q.weight, 9))
            attn.W_K.weight.copy_(rope_halves_to_pairs(attn.W_K.weight, 3))
        wrong = model(ids)[0][0]
    gap = (right - wrong).abs().amax(-1)
    assert L.agreement_letter(tuple(bool(g <= 1e-4) for g in gap)) == L.unpermuted_positions()


def test_a_q4_1_zero_comes_back_at_the_nearest_level_and_q8_0_keeps_it():
    block = L.q4_1_zero_block()
    m = torch.tensor(-0.3).half().float()
    d = ((torch.tensor(0.9) - m) / 15).half().float()
    assert L.q4_1_zero() == float(m + 4 * d)  # (0 - m)/d = 3.75: level 4
    assert abs(L.q4_1_zero() - 0.020) < 1e-4
    assert torch.equal(quantize.roundtrip(block, "Q8_0")[0, 2:], torch.zeros(30))


@pytest.mark.parametrize("name", ["smollm2_360m_bits", "unpermuted_positions", "q4_1_zero"])
def test_every_known_wrong_answer_gets_its_hint(name):
    ex = checks.get(name)
    for wrong, why in ex.hints[0].table.items():
        report = checks.run(name, lambda wrong=wrong: wrong).report()
        assert say(why) in report and "why:" not in report, report
