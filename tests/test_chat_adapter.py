"""course chat --adapter: LoRA adapters (lesson 13) put on the model and merged; bad files are one line."""

import copy

import pytest
import torch

from course_tools import cli
from course_utils import chat, gpt, lora, pretrained, sft


def saved_adapter(model: gpt.GPT, tmp_path):
    lora.add_lora(model, ("W_Q", "W_V"), 2, 4.0)
    with torch.no_grad():
        for layer in lora.lora_layers(model).values():
            layer.B.normal_()
    return lora.save_adapter(model, tmp_path / "adapter.pt"), model


def test_adapter_is_loaded_and_merged(tmp_path, monkeypatch, capsys, tiny_gpt):
    path, adapted = saved_adapter(tiny_gpt(), tmp_path)
    seen = {}
    monkeypatch.setattr(pretrained, "load", lambda name: (tiny_gpt(), object()))

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


def test_adapter_for_another_model_is_one_line(tmp_path, monkeypatch, capsys, tiny_gpt):
    path, _ = saved_adapter(tiny_gpt(d_model=64), tmp_path)
    monkeypatch.setattr(pretrained, "load", lambda name: (tiny_gpt(d_model=32), object()))
    assert cli.main(["chat", "--prompt", "hi", "--adapter", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert "saved for another model (d_model=64 there, 32 here)" in err and "\n" not in err


# ---------------------------------------------------------------------------------------------
# The real model: SmolLM2-135M-Instruct (fetched once and cached, as in tests/test_smollm2.py)
SINO_PROMPT = "Read 2026 in Sino-Korean."


@pytest.fixture(scope="module")
def smollm2():
    return pretrained.load_gguf(pretrained.fetch(pretrained.SMOLLM2))


def chat_answer(monkeypatch, capsys, model, tokenizer, *args: str) -> tuple[int, str, str]:
    """``course chat --system '' --prompt SINO_PROMPT ARGS`` with (model, tokenizer) as the loaded SmolLM2."""
    monkeypatch.setattr(pretrained, "load", lambda name: (model, tokenizer))
    code = cli.main(["chat", "--system", "", "--prompt", SINO_PROMPT, "--max-new-tokens", "16", *args])
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


@pytest.mark.slow
def test_a_trained_smollm2_adapter_changes_the_greedy_answer(smollm2, tmp_path, monkeypatch, capsys):
    base, tok = smollm2
    # A tiny adapter (rank 2 on W_Q and W_V of the top two blocks: 7,680 numbers) fitted to one pair;
    # the backward pass stops at block 28, so a step costs little more than a forward pass.
    student = copy.deepcopy(base)
    lora.add_lora(student, ("blocks.28.attn.W_Q", "blocks.28.attn.W_V", "blocks.29.attn.W_Q", "blocks.29.attn.W_V"),
                  rank=2, alpha=4.0)
    assert lora.trainable_parameters(student) == 2 * (2 * (576 + 576) + 2 * (576 + 192))
    prompt = tok.encode(chat.apply_chat_template([{"role": "system", "content": ""},
                                                  {"role": "user", "content": SINO_PROMPT}]))
    x, y, mask = sft.collate([sft.masked_example(prompt, tok.encode("이천이십육" + chat.END))], pad_id=0)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=2e-2)
    student.train()
    for _ in range(25):
        loss = sft.masked_loss(student(x)[0], y, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = lora.save_adapter(student, tmp_path / "sino.pt")
    assert path.stat().st_size < 100_000

    code, before, _ = chat_answer(monkeypatch, capsys, copy.deepcopy(base), tok)
    assert code == 0 and before != "이천이십육"
    code, after, _ = chat_answer(monkeypatch, capsys, copy.deepcopy(base), tok, "--adapter", str(path))
    assert code == 0 and after == "이천이십육", (before, after)


@pytest.mark.slow
def test_an_adapter_of_the_shakespeare_model_is_refused_in_one_line(smollm2, tmp_path, monkeypatch, capsys):
    char_model, _ = pretrained.load()
    lora.add_lora(char_model, ("W_Q", "W_V"), 4, 8.0)
    path = lora.save_adapter(char_model, tmp_path / "milton.pt")
    code, _, err = chat_answer(monkeypatch, capsys, *smollm2, "--adapter", str(path))
    assert code != 0 and "saved for another model" in err and "\n" not in err and "Traceback" not in err
