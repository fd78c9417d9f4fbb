"""Korean particles chosen by how the word before them is read: Hangul, numbers, acronyms, code words."""

import pytest

from course_tools.particles import PAIRS, choose, final_consonant


@pytest.mark.parametrize("word, topic", [
    ("모델", "은"), ("헤드", "는"),  # Hangul: the last syllable's final consonant
    ("GPT", "는"), ("MLP", "는"), ("M", "은"), ("x", "는"), ("L", "은"),  # letters by their Korean names
    ("Block", "은"), ("attention", "은"), ("FeedForward", "는"), ("model", "은"), ("step", "은"),
    ("text", "는"), ("input", "은"), ("softmax", "는"),  # code words by their English ending
    ("16", "은"), ("4", "는"), ("2", "는"), ("10", "은"), ("1000", "은"), ("10000", "은"), ("0.5", "는"),
    ("(2, 7, 16)", "은"), ("0..4", "는"), ("0..8", "은"), ("nn.GELU()", "는"), ("'b'", "는"), ("()", "는"),
])
def test_the_topic_particle_follows_the_reading(word, topic):
    assert choose("은(는)", word) == topic


def test_each_pair_and_the_rieul_exception_of_euro():
    assert [choose(pair, "GPT") for pair in PAIRS] == ["는", "가", "를", "와", "로"]
    assert [choose(pair, "Block") for pair in PAIRS] == ["은", "이", "을", "과", "으로"]
    assert choose("(으)로", "model") == "로" and choose("(으)로", "7") == "로" and choose("(으)로", "3") == "으로"
    assert final_consonant("칠") == (True, True) and final_consonant("") == (False, False)


def test_an_unknown_pair_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown particle pair '이\(랑\)'; use one of 은\(는\), 이\(가\)"):
        choose("이(랑)", "GPT")
