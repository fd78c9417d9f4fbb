import io

import pytest
import torch

from course_utils import bpe, tokenizer
from course_utils.tokenizer import CharTokenizer, Vocab, sentences, words


def test_words_lowercase_and_punctuation():
    text = "O Romeo, Romeo! wherefore art thou Romeo?\nI'll o'er-look it -- 'tis 1599."
    assert words(text) == ["o", "romeo", "romeo", "wherefore", "art", "thou", "romeo",
                           "i'll", "o'er", "look", "it", "tis"]


def test_words_curly_apostrophe_becomes_straight():
    assert words("Thou’rt ne’er") == ["thou'rt", "ne'er"]


def test_sentences_split_at_ends_and_blank_lines():
    text = "ROMEO.\nHe jests at scars; that never felt a wound.\n\nBut soft what light\n\nJULIET.\nAy me!"
    assert sentences(text) == [
        ["romeo"],
        ["he", "jests", "at", "scars", "that", "never", "felt", "a", "wound"],
        ["but", "soft", "what", "light"],
        ["juliet"],
        ["ay", "me"],
    ]
    assert sentences("... !!") == []


def test_vocab_orders_by_count_then_alphabet_and_counts_unknowns():
    vocab = Vocab.build(["b", "a", "c", "a", "b", "d", "a"], min_count=2)
    assert vocab.itos == ["<unk>", "a", "b"]
    assert vocab.counts == [2, 3, 2]  # c and d were dropped into <unk>
    assert len(vocab) == 3 and "a" in vocab and "c" not in vocab
    assert vocab.count("a") == 3 and vocab.count("zzz") == 0
    assert vocab.encode(["a", "zzz", "b"]) == [1, 0, 2]
    assert vocab.decode(torch.tensor([2, 1, 0])) == ["b", "a", "<unk>"]


def test_vocab_from_sentences_round_trip():
    sents = [["to", "be", "or", "not", "to", "be"], ["that", "is", "the", "question"]]
    vocab = Vocab.build(sents, unk=None)
    flat = [w for s in sents for w in s]
    assert vocab.decode(vocab.encode(flat)) == flat
    assert vocab.itos[:2] == ["be", "to"]


def test_vocab_without_unk_errors_and_drops():
    vocab = Vocab.build(["a", "a", "b"], min_count=2, unk=None)
    with pytest.raises(KeyError, match="unk='<unk>'"):
        vocab.encode(["a", "b"])
    assert vocab.encode(["b", "a", "b"], drop_unknown=True) == [0]


def test_vocab_errors():
    vocab = Vocab.build(["a", "b"])
    with pytest.raises(IndexError, match=r"ids 0\.\.2"):
        vocab.token(3)
    with pytest.raises(IndexError, match="out of range"):
        vocab.decode([-1])
    with pytest.raises(ValueError, match="min_count"):
        Vocab.build(["a"], min_count=0)
    with pytest.raises(ValueError, match="lower min_count"):
        Vocab.build(["a"], min_count=2, unk=None)
    with pytest.raises(ValueError, match="another unk"):
        Vocab.build(["<unk>", "a"])


def test_char_tokenizer_round_trip():
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    tok = CharTokenizer(text)
    assert tok.vocab_size == len(set(text))
    assert tok.chars == sorted(set(text))
    ids = tok.encode(text)
    assert len(ids) == len(text) and max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.encode("") == [] and tok.decode([]) == ""


def test_char_tokenizer_errors():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match="'z' was not in the text"):
        tok.encode("abz")
    with pytest.raises(ValueError, match=r"ids 0\.\.2"):
        tok.decode([0, 3])
    with pytest.raises(ValueError, match="non-empty"):
        CharTokenizer("")


def test_both_tokenizers_round_trip_through_one_interface():
    text = "O Romeo, Romeo! wherefore art thou Romeo?\n트랜스포머 🙂\n" * 20
    for tok in (CharTokenizer(text), bpe.BPETokenizer.train(text, 300)):
        assert isinstance(tok, tokenizer.Tokenizer)
        state = tok.to_dict()
        assert state["kind"] == tok.kind
        buffer = io.BytesIO()
        torch.save(state, buffer)  # plain data: loads with weights_only=True
        buffer.seek(0)
        again = tokenizer.load_tokenizer(torch.load(buffer, weights_only=True))
        assert type(again) is type(tok) and again.vocab_size == tok.vocab_size
        assert again.encode(text) == tok.encode(text) and again.decode(tok.encode(text)) == text


def test_load_tokenizer_dispatches_on_kind_only():
    assert tokenizer.load_tokenizer({"kind": "char", "chars": "ba"}).encode("ab") == [0, 1]
    for state in ({"kind": "sentencepiece"}, {"chars": "ab"}, "char"):
        with pytest.raises(ValueError, match="unknown tokenizer kind"):
            tokenizer.load_tokenizer(state)
    with pytest.raises(ValueError, match="not a character tokenizer"):
        CharTokenizer.from_dict({"kind": "bpe", "merges": []})
    assert not isinstance(object(), tokenizer.Tokenizer)
