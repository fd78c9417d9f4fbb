"""The shipped GPT: its files match the card, it loads without pickled code, and it still scores
the validation loss its card records on the fixed slice of the corpus."""

import shutil

import pytest
import torch

from course_tools import shipped_model as build
from course_utils import pretrained
from course_utils.generate import generate
from course_utils.tokenizer import words

NAME = "shakespeare_char_small"


@pytest.fixture(scope="module")
def shipped():
    return pretrained.load(NAME)


def test_card_describes_the_file():
    info = pretrained.card(NAME)
    path = pretrained.FOLDER / info["file"]
    assert info["sha256"] == pretrained.sha256_of(path)
    assert info["size_bytes"] == path.stat().st_size < 5 * 2**20, "the shipped model must stay a few MB"
    assert info["command"].startswith("course train --data shakespeare --config shakespeare_char_small")
    assert info["steps"] == info["train_config"]["max_iters"], "a finished run, not a paused one"
    assert torch.load(path, weights_only=True).keys() == {"model", "model_config", "tokenizer"}


def test_validation_loss_matches_the_card(shipped, corpus):
    model, tokenizer = shipped
    loss = pretrained.validation_loss(model, tokenizer, text=corpus)
    assert loss == pytest.approx(pretrained.card(NAME)["validation_loss"], abs=1e-4)
    assert loss < 0.5 * torch.log(torch.tensor(float(tokenizer.vocab_size))).item()  # far from a uniform guess


def test_it_writes_words_of_the_corpus(shipped, corpus):
    model, tokenizer = shipped
    out = generate(model, torch.tensor([tokenizer.encode("\n")] * 8), 127, temperature=0.8, seed=0)
    written = [w for row in out.tolist() for w in words(tokenizer.decode(row))]
    known = set(words(corpus))
    assert len(written) > 100 and sum(w in known for w in written) / len(written) >= 0.8


def test_a_changed_file_is_refused(tmp_path, monkeypatch):
    info = pretrained.card(NAME)
    shutil.copy(pretrained.FOLDER / f"{NAME}.json", tmp_path)
    blob = bytearray((pretrained.FOLDER / info["file"]).read_bytes())
    blob[-100] ^= 1
    (tmp_path / info["file"]).write_bytes(bytes(blob))
    monkeypatch.setattr(pretrained, "FOLDER", tmp_path)
    with pytest.raises(ValueError, match="sha256"):
        pretrained.load(NAME)
    with pytest.raises(KeyError, match="no shipped model"):
        pretrained.card("gpt5")


def test_export_refuses_an_unfinished_run(tmp_path):
    ckpt = {key: None for key in ("model", "optimizer", "elapsed", "history", "model_config", "tokenizer", "rng")}
    ckpt.update(step=10, train_config={"max_iters": 4000})
    torch.save(ckpt, tmp_path / "ckpt.pt")
    with pytest.raises(ValueError, match="step 10 of 4000"):
        build.export(tmp_path / "ckpt.pt", folder=tmp_path)
    assert build.train_command(tmp_path)[3:6] == ["train", "--data", "shakespeare"]
