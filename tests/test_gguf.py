"""Reading GGUF files into the course's GPT: a tiny LLaMA written here, and every rejected file."""

import dataclasses

import numpy as np
import pytest
import torch

from course_utils import gguf, quantize
from course_utils.bpe import byte_spelling
from course_utils.gpt import GPT, GPTConfig
from course_utils.pretrained import load_gguf

gguf_pkg = pytest.importorskip("gguf")  # writes the test files, and course_utils.gguf reads with it

CONFIG = GPTConfig(vocab_size=256 + 3 + 2, max_len=64, n_layers=2, n_heads=4, d_model=64, bias=False, d_ff=96,
                   activation="swiglu", eps=1e-5, n_kv_heads=2, norm="rmsnorm", position="rope",
                   tie_embeddings=True, rope_base=10000.0)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(CONFIG).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.5, 1.5)  # norms that are not all ones, so a swapped norm would show
    return model


def write(path, model: GPT, arch="llama", qtype="Q4_1", drop=None, tokenizer_model="gpt2"):
    """A GGUF file holding ``model``: matrices in ``qtype`` (the embedding in Q8_0), norms in F32."""
    w = gguf_pkg.GGUFWriter(str(path), arch)
    c = model.config
    w.add_context_length(c.max_len)
    w.add_embedding_length(c.d_model)
    w.add_block_count(c.n_layers)
    w.add_feed_forward_length(c.d_ff)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.kv_heads)
    w.add_layer_norm_rms_eps(c.eps)
    w.add_rope_freq_base(c.rope_base)
    w.add_tokenizer_model(tokenizer_model)
    tokens = SPECIAL + [byte_spelling()[b] for b in range(256)] + ["Ġt", "Ġth"]
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * 258)
    w.add_token_merges(["Ġ t", "Ġt h"])
    w.add_chat_template("{{ ChatML }}")
    state = model.state_dict()
    for ours, theirs in gguf.state_dict_names(c).items():
        if theirs == drop:
            continue
        t = state[ours].float()
        if t.dim() == 1:
            w.add_tensor(theirs, t.numpy())
            continue
        fmt = "Q8_0" if theirs == "token_embd.weight" else qtype
        if fmt == "F16":
            w.add_tensor(theirs, t.half().numpy())
        elif fmt in quantize.FORMATS:
            raw = quantize.quantize(t, fmt).numpy()
            w.add_tensor(theirs, raw, raw_shape=raw.shape, raw_dtype=getattr(gguf_pkg.GGMLQuantizationType, fmt))
        else:  # a format the course does not read, written by the gguf package
            raw = gguf_pkg.quants.quantize(t.numpy(), getattr(gguf_pkg.GGMLQuantizationType, fmt))
            w.add_tensor(theirs, raw, raw_shape=raw.shape, raw_dtype=getattr(gguf_pkg.GGMLQuantizationType, fmt))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_tiny_llama_loads_into_the_course_gpt(tmp_path):
    pytest.importorskip("regex")  # the loaded tokenizer's pre-tokeniser
    model = tiny_model()
    path = write(tmp_path / "tiny.gguf", model)
    loaded, tok = load_gguf(path)
    assert loaded.config == dataclasses.replace(CONFIG, eps=float(np.float32(CONFIG.eps)))  # the file holds float32
    # the weights that went in, as the file's formats bring them back
    expected = GPT(CONFIG).eval()
    state = {k: (v if v.dim() == 1 else quantize.roundtrip(v, "Q8_0" if k == "token_embedding.weight" else "Q4_1"))
             for k, v in model.state_dict().items()}
    expected.load_state_dict(state)
    idx = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], expected(idx)[0])
        assert not torch.allclose(loaded(idx)[0], model(idx)[0])  # Q4_1 is lossy: the comparison can fail
    assert tok.encode(" the<|im_end|>") == [260, 3 + ord("e"), 2]  # "Ġth", "e", <|im_end|>
    assert tok.decode(tok.encode("héllo <|im_start|>")) == "héllo <|im_start|>"


def test_file_table(tmp_path):
    file = gguf.read(write(tmp_path / "tiny.gguf", tiny_model()))
    assert file.version == 3 and file.metadata["general.architecture"] == "llama"
    assert file.tensors["token_embd.weight"].type == "Q8_0" and file.tensors["token_embd.weight"].shape == (261, 64)
    assert file.tensors["blk.0.attn_k.weight"].type == "Q4_1" and file.tensors["blk.0.attn_k.weight"].shape == (32, 64)
    report = gguf.memory_report(file)
    assert report["float32_bytes"] == 4 * report["weights"] and 5.0 < report["bits_per_weight"] < 8.5


def test_float16_tensors_load(tmp_path):
    pytest.importorskip("regex")  # the loaded tokenizer's pre-tokeniser
    loaded, _ = load_gguf(write(tmp_path / "f16.gguf", tiny_model(), qtype="F16"))
    expected = tiny_model().state_dict()["blocks.0.attn.W_Q.weight"].half().float()
    assert torch.equal(loaded.state_dict()["blocks.0.attn.W_Q.weight"], expected)


@pytest.mark.parametrize("kind, match", [
    ("missing", "no GGUF file"),
    ("corrupt", "not a readable GGUF file"),
    ("truncated", "not a readable GGUF file"),
    ("arch", "'gpt2' model; the course loads the 'llama' architecture"),
    ("qtype", "stored as Q4_0, which the course cannot read"),
    ("tensor", "has no tensor 'blk.1.ffn_up.weight'"),
    ("tokenizer", "'llama' tokenizer; the course reads byte-level BPE"),
])
def test_bad_files_give_one_line_naming_the_fix(tmp_path, kind, match):
    if kind in ("qtype", "tensor"):
        pytest.importorskip("regex")  # the loader builds the tokenizer before it reads the tensors
    path = tmp_path / "bad.gguf"
    if kind == "corrupt":
        path.write_bytes(b"not a gguf file at all" * 10)
    elif kind == "truncated":
        good = write(tmp_path / "good.gguf", tiny_model()).read_bytes()
        path.write_bytes(good[:200])
    elif kind != "missing":
        options = {"arch": {"arch": "gpt2"}, "qtype": {"qtype": "Q4_0"}, "tensor": {"drop": "blk.1.ffn_up.weight"},
                   "tokenizer": {"tokenizer_model": "llama"}}[kind]
        write(path, tiny_model(), **options)
    with pytest.raises(gguf.GGUFError, match=match) as info:
        load_gguf(path)
    assert "\n" not in str(info.value)
