import random

import pytest
import torch

from course_utils.sino_korean import (
    BOS,
    DIGIT_VOCAB,
    EOS,
    HANGUL_VOCAB,
    MAX_NUMBER,
    PAD,
    CharVocab,
    make_pairs,
    numbers_with_digits,
    parse_reading,
    read_aligned,
    read_number,
    read_number_formal,
    sample_numbers,
    split_by_number,
)

# Checked by hand against how the numbers are read aloud (spacing: one space after each 만/억/조 group).
HAND_CHECKED = {
    0: "영", 1: "일", 7: "칠", 10: "십", 11: "십일", 20: "이십", 99: "구십구", 100: "백", 101: "백일",
    110: "백십", 111: "백십일", 1000: "천", 1001: "천일", 2006: "이천육", 2026: "이천이십육",
    10000: "만", 10001: "만 일", 11000: "만 천", 20000: "이만", 110000: "십일만", 150003: "십오만 삼",
    210000: "이십일만", 1000000: "백만", 10000000: "천만", 10010000: "천일만", 100000000: "일억",
    100010000: "일억 만", 100000001: "일억 일", 123456789: "일억 이천삼백사십오만 육천칠백팔십구",
    1000000000000: "일조", 10 ** 12 + 10 ** 4: "일조 만",
}


@pytest.mark.parametrize("n, reading", HAND_CHECKED.items())
def test_hand_checked_readings(n, reading):
    assert read_number(n) == reading
    assert parse_reading(reading) == n


def test_round_trip_on_random_numbers():
    rng = random.Random(0)
    numbers = [rng.randrange(10 ** rng.randint(1, 16)) for _ in range(3000)] + [MAX_NUMBER]
    assert [parse_reading(read_number(n)) for n in numbers] == numbers


def test_no_lone_il_before_places_and_no_spaces_inside_groups():
    for n in range(1, 20000):
        r = read_number(n)
        assert "일십" not in r and "일백" not in r and "일천" not in r
        assert not r.startswith("일만")
        assert all(piece[-1] in "만억조" for piece in r.split(" ")[:-1])


def test_alignment_points_at_the_digit_read():
    assert read_aligned(2026) == [("이", 0), ("천", 0), ("이", 2), ("십", 2), ("육", 3)]
    assert read_aligned(150003) == [("십", 0), ("오", 1), ("만", 1), (" ", -1), ("삼", 5)]
    for n in (7, 305, 99999, 4000002, 123456789):
        digits = str(n)
        for ch, i in read_aligned(n):
            if ch in "일이삼사오육칠팔구":
                assert "영일이삼사오육칠팔구".index(ch) == int(digits[i])


@pytest.mark.parametrize("bad", [-1, MAX_NUMBER + 1, 2.0, "12", True])
def test_bad_numbers_raise(bad):
    with pytest.raises(ValueError, match="read_number takes an int"):
        read_number(bad)


@pytest.mark.parametrize("bad, match", [("", "empty"), ("이삼", "two digits"), ("이천x", "unexpected character")])
def test_bad_readings_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_reading(bad)


def test_split_is_disjoint_balanced_and_deterministic():
    splits = split_by_number(300, 5, seed=3)
    sets = {k: set(v) for k, v in splits.items()}
    assert sum(len(v) for v in splits.values()) == sum(len(s) for s in sets.values())  # no repeats
    assert not (sets["train"] & sets["val"] or sets["train"] & sets["test"] or sets["val"] & sets["test"])
    for name in ("train", "val", "test"):
        assert {len(str(n)) for n in splits[name]} == {1, 2, 3, 4, 5}
    assert len(splits["train"]) == 8 + 72 + 3 * 240
    assert split_by_number(300, 5, seed=3) == splits != split_by_number(300, 5, seed=4)


def test_sample_numbers_and_lengths():
    assert numbers_with_digits(1) == range(0, 10) and numbers_with_digits(3) == range(100, 1000)
    (eight,) = sample_numbers(50, [8], seed=0)
    assert len(set(eight)) == 50 and all(len(str(n)) == 8 for n in eight)
    with pytest.raises(ValueError, match="at least 1"):
        numbers_with_digits(0)
    with pytest.raises(ValueError, match="fractions"):
        split_by_number(10, 2, fractions=(0.5, 0.5))


def test_vocab_and_pairs():
    assert (PAD, BOS, EOS) == (0, 1, 2)
    assert DIGIT_VOCAB.decode(DIGIT_VOCAB.encode("2026", bos=True, eos=True) + [5, 0]) == "2026"
    src, tgt = make_pairs([2026, 5], "read")
    assert src.tolist() == [[5, 3, 5, 9], [8, 0, 0, 0]]
    assert tgt[0, 0] == BOS and HANGUL_VOCAB.decode(tgt[0, 1:]) == "이천이십육" and tgt[1, 2] == EOS
    src, tgt = make_pairs([150003], "write")
    assert HANGUL_VOCAB.decode(src[0]) == "십오만 삼" and DIGIT_VOCAB.decode(tgt[0, 1:]) == "150003"
    with pytest.raises(ValueError, match="direction"):
        make_pairs([1], "sing")
    with pytest.raises(ValueError, match="not in this vocabulary"):
        DIGIT_VOCAB.encode("12a")
    with pytest.raises(ValueError, match="duplicates"):
        CharVocab("aa")
    assert torch.equal(make_pairs([7], "read")[0], torch.tensor([[DIGIT_VOCAB.stoi["7"]]]))


FORMAL_HAND_CHECKED = {0: "영", 1: "일", 10: "일십", 11: "일십일", 100: "일백", 110: "일백일십", 1000: "일천",
                       1110: "일천일백일십", 2026: "이천이십육", 1300: "일천삼백", 9999: "구천구백구십구"}


@pytest.mark.parametrize("n, reading", FORMAL_HAND_CHECKED.items())
def test_formal_readings_say_every_one(n, reading):
    assert read_number_formal(n) == reading


def test_formal_reading_differs_exactly_where_a_one_is_silent():
    for n in range(10_000):
        silent_one = any(d == "1" for d in str(n)[:-1])
        assert (read_number_formal(n) != read_number(n)) == silent_one, n
        assert read_number_formal(n).replace("일", "") == read_number(n).replace("일", ""), n


def test_formal_reading_refuses_numbers_of_two_groups():
    with pytest.raises(ValueError, match="below 10,000"):
        read_number_formal(10_000)
