"""course chat --adapter: LoRA adapters (lesson 13) put on the model and merged; bad files are one line."""

import torch

from course_tools import cli
from course_utils import chat, gpt, lora, pretrained


def tiny(d_model: int = 32) -> gpt.GPT:
    torch.manual_seed(0)
    return gpt.GPT(gpt.GPTConfig(vocab_size=40, max_len=32, n_layers=2, n_heads=4, d_model=d_model)).eval()


def saved_adapter(tmp_path, d_model: int = 32):
    model = tiny(d_model)
    lora.add_lora(model, ("W_Q", "W_V"), 2, 4.0)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.B.normal_()
    return lora.save_adapter(model, tmp_path / "adapter.pt"), model


def test_adapter_is_loaded_and_merged(tmp_path, monkeypatch, capsys):
    path, adapted = saved_adapter(tmp_path)
    seen = {}
    monkeypatch.setattr(pretrained, "load", lambda name: (tiny(), object()))

    def fake_reply(model, tokenizer, messages, **_):
        seen["model"] = model
        yield "ok"

    monkeypatch.setattr(chat, "reply", fake_reply)
    assert cli.main(["chat", "--prompt", "hi", "--adapter", str(path)]) == 0
    model = seen["model"]
    assert not lora.lora_layers(model)  # merged back into plain linear layers
    idx = torch.randint(40, (1, 8))
    torch.testing.assert_close(model(idx)[0], adapted(idx)[0], atol=1e-5, rtol=1e-5)
    assert capsys.readouterr().out.strip() == "ok"


def test_missing_adapter_is_one_line_before_loading(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pretrained, "load", lambda name: (_ for _ in ()).throw(AssertionError("loaded")))
    assert cli.main(["chat", "--prompt", "hi", "--adapter", str(tmp_path / "none.pt")]) != 0
    err = capsys.readouterr().err.strip()
    assert "no adapter file" in err and "\n" not in err


def test_adapter_for_another_model_is_one_line(tmp_path, monkeypatch, capsys):
    path, _ = saved_adapter(tmp_path, d_model=64)
    monkeypatch.setattr(pretrained, "load", lambda name: (tiny(32), object()))
    assert cli.main(["chat", "--prompt", "hi", "--adapter", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert "saved for another model (d_model=64 there, 32 here)" in err and "\n" not in err
