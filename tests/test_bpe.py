import random
from collections import Counter

import pytest
import torch

from course_utils.bpe import N_BYTES, BPETokenizer, chunks, merge, pair_counts, to_bytes

TEXT = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n"
) * 3 + "트랜스포머는 토큰 열을 받아 토큰마다 벡터 하나를 내놓습니다. 🙂 naïve café 2024_05\n"


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(TEXT, 400)


def random_string(rng: random.Random, n: int) -> str:
    """Code points from every plane, including controls, combining marks and lone surrogates."""
    pools = [(0x20, 0x7E), (0x00, 0x1F), (0x80, 0x24F), (0x300, 0x36F), (0xAC00, 0xD7A3),
             (0xD800, 0xDFFF), (0x1F300, 0x1F64F), (0x10000, 0x10FFFF), (0x2000, 0x206F)]
    out = []
    for _ in range(n):
        lo, hi = rng.choice(pools)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def naive_encode(tok: BPETokenizer, text: str) -> list[int]:
    """Apply every merge, in the order learned, to every chunk: the definition of BPE encoding."""
    ids = []
    for chunk in chunks(text):
        piece = list(to_bytes(chunk))
        for k, pair in enumerate(tok.merges):
            piece = merge(piece, pair, N_BYTES + k)
        ids += piece
    return ids


def test_merge_replaces_left_to_right_without_overlap():
    assert merge([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]
    assert merge([5, 5, 5], (5, 5), 7) == [7, 5]
    assert merge([5, 5, 5, 5], (5, 5), 7) == [7, 7]
    assert merge([], (1, 2), 9) == []
    assert merge([1], (1, 2), 9) == [1]


def test_pair_counts():
    assert pair_counts([1, 2, 1, 2]) == {(1, 2): 2, (2, 1): 1}
    assert pair_counts([1, 2], weight=3) == {(1, 2): 3}


def test_textbook_example():
    # "aaabdaaabac": aa -> Z, then ab -> Y (ties go to the smaller pair), then ZY -> X
    tok = BPETokenizer.train("aaabdaaabac", N_BYTES + 3)
    a, b = ord("a"), ord("b")
    assert tok.merges == [(a, a), (a, b), (256, 257)]
    assert tok.encode("aaabdaaabac") == [258, ord("d"), 258, a, ord("c")]


def test_chunks_cover_every_character():
    rng = random.Random(0)
    for _ in range(200):
        s = random_string(rng, rng.randint(0, 40))
        assert "".join(chunks(s)) == s
    assert chunks("Hello, world!  I'm here") == ["Hello", ",", " world", "!", " ", " I", "'m", " here"]


def test_round_trip_on_random_unicode(tok):
    rng = random.Random(1)
    for _ in range(300):
        s = random_string(rng, rng.randint(0, 60))
        assert tok.decode(tok.encode(s)) == s
    assert tok.decode(tok.encode("")) == ""


def test_encoding_applies_merges_in_learned_order(tok):
    rng = random.Random(2)
    for text in [TEXT, "speak, speak, resolved famish", random_string(rng, 80)]:
        assert tok.encode(text) == naive_encode(tok, text)


def test_training_is_deterministic_and_merges_stay_inside_chunks(tok):
    again = BPETokenizer.train(TEXT, 400)
    assert again.merges == tok.merges
    assert tok.vocab_size == 400
    for k in range(N_BYTES, tok.vocab_size):
        try:
            piece = tok.token_bytes(k).decode("utf-8")
        except UnicodeDecodeError:  # part of a multi-byte character
            continue
        assert len(chunks(piece)) == 1 or piece.isspace(), piece
    # the most frequent pairs come first: the first merge is at least as frequent as any later one
    first = tok.merges[0]
    counts = Counter()
    for c in chunks(TEXT):
        pair_counts(list(to_bytes(c)), counts)
    assert counts[first] == max(counts.values())


def test_compression_grows_with_the_vocabulary():
    ratios = [BPETokenizer.train(TEXT, v).compression_ratio(TEXT) for v in (256, 300, 400)]
    assert ratios[0] == 1.0
    assert ratios[0] < ratios[1] < ratios[2]
    assert ratios[2] > 2.5


def test_stops_early_when_nothing_is_left_to_merge():
    tok = BPETokenizer.train("ab ab", 1000)
    assert tok.vocab_size == N_BYTES + 2  # "ab", then " ab"
    assert tok.encode("ab ab") == [256, 257]


def test_state_survives_torch_save_with_weights_only(tok, tmp_path):
    torch.save({"tokenizer": tok.to_dict()}, tmp_path / "t.pt")
    state = torch.load(tmp_path / "t.pt", weights_only=True)["tokenizer"]
    again = BPETokenizer.from_dict(state)
    assert again.merges == tok.merges
    assert again.encode(TEXT) == tok.encode(TEXT)


def test_decode_of_a_split_character_is_replaced_not_an_error():
    tok = BPETokenizer()
    ids = tok.encode("é")
    assert len(ids) == 2
    assert tok.decode(ids[:1]) == "\ufffd"


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="at least 256"):
        BPETokenizer.train("abc", 100)
    with pytest.raises(ValueError, match="order they were learned"):
        BPETokenizer([(300, 1)])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        BPETokenizer().decode([256])
    with pytest.raises(TypeError, match="decode bytes first"):
        BPETokenizer().encode(b"abc")
    with pytest.raises(ValueError, match="not a BPE"):
        BPETokenizer.from_dict({"kind": "char"})
