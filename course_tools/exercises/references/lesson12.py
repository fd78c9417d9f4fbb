"""Exercises of lesson 12: dequantise Q4_1 blocks, quantise to Q8_0 and back, write a ChatML prompt,
turn a loss into bits per byte; then the learner's own LLaMA runs SmolLM2, graded in stages:

1. ``llama_mapping``: one GGUF tensor -> (the interface's name, the tensor), W_Q and W_K rows permuted
   from the file's neighbour-pair order to the rotate-half order of the interface; synthetic tensors and
   the real file's W_Q and W_K of a drawn block.
2. ``llama_forward``: the learner's LLaMA (RMSNorm, RoPE, SwiGLU, grouped-query attention), built from
   their classes and loaded with random weights, gives the reference's logits to 1e-4.
3. ``llama_smollm2``: SmolLM2-135M-Instruct read from its GGUF file through the learner's mapping into
   the learner's model gives the course's logits to 1e-4 on prompts drawn by the grader.
4. ``llama_kv_cache``: prefill then one token at a time through the learner's cache gives the full
   forward's logits.
5. ``llama_top_p``: next-token probabilities after temperature and top-p.
6. ``llama_generate``: the learner's decoding loop follows the reference's greedy path.

The reference model is the course's GPT, reached through ``convert.from_llama_state_dict`` (which turns
the rotate-half rows back into neighbour pairs). Every ``llama_*`` stage counts only while the stages it
builds on pass (``requires``), and the library's versions are removed while grading (``TEACHES``).

Five self-check questions, each a computation on a configuration the lesson does not print (a larger SmolLM2's
file, the KV cache of a full context, top-p on given logits, a Q4_1 block holding zeros) or an inference from
its mechanism (which positions survive a forgotten RoPE permutation), and one experiment: what 4-bit
quantisation costs the Shakespeare model with a scale per block of 32 (Q4_1) and with one scale per row, over
three seeds of random validation windows."""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong, near_wrong
from course_tools.messages import N_, N_n, _
from course_utils import chat, convert, data, generate, gguf, pretrained, quantize
from course_utils.config import llama
from course_utils.cpu_threads import torch_threads
from course_utils.gpt import GPT

# What the llama_* stages ask the learner to write, removed from the sandbox while they are graded
# (course_tools.grading.shortcuts): the course's model, its pieces, its loaders and its decoding.
TEACHES = {
    "llama_*": ("course_utils.gpt.GPT", "course_utils.gpt.gpt_block", "course_utils.blocks.RMSNorm",
                "course_utils.blocks.rms_norm", "course_utils.blocks.FeedForward",
                "course_utils.blocks.TransformerBlock", "course_utils.blocks.make_block",
                "course_utils.blocks.make_norm",
                "course_utils.attention.MultiHeadAttention", "course_utils.attention.attend",
                "course_utils.attention.scaled_dot_product_attention", "course_utils.attention.explicit_attention",
                "course_utils.attention.repeat_kv", "course_utils.attention.rotate_qk",
                "course_utils.attention.rope_table", "course_utils.attention.KVCache",
                "course_utils.attention.ModelKVCache", "course_utils.positional.apply_rope",
                "course_utils.positional.rotate_pairs", "course_utils.positional.rope_angles",
                "course_utils.positional.rope_halves_to_pairs", "course_utils.convert.from_llama_state_dict",
                "course_utils.convert.llama_config", "course_utils.gguf.llama_state_dict",
                "course_utils.gguf.state_dict_names", "course_utils.gguf.gpt_config",
                "course_utils.generate.generate", "course_utils.generate.sample_next",
                "course_utils.generate.next_token_probs", "course_utils.generate.top_p_filter",
                "course_utils.generate.top_k_filter", "course_utils.chat.reply", "course_utils.chat.stream_ids"),
}

# ------------------------------------------------------------------ dequantise Q4_1


def _q4_1_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n in (1, 3, 8):
        w = torch.randn(n, 32, generator=gen) * 0.1
        label = N_n("raw uint8 ({n}, 20): {n} Q4_1 block", "raw uint8 ({n}, 20): {n} Q4_1 blocks", n, n=n)
        cases.append(Case(label, (quantize.quantize(w, "Q4_1"),)))
    return cases


def _q4_1_wrong(raw: torch.Tensor, interleave=False, no_min=False, swap=False) -> torch.Tensor:
    d = raw[:, :2].contiguous().view(torch.float16).float()
    m = raw[:, 2:4].contiguous().view(torch.float16).float()
    if swap:
        d, m = m, d
    lo, hi = raw[:, 4:] & 0x0F, raw[:, 4:] >> 4
    q = torch.stack([lo, hi], dim=-1).flatten(1) if interleave else torch.cat([lo, hi], dim=1)
    return d * q.float() + (0 if no_min else m)


def _q4_1_hint(case: Case, got, expected) -> str | None:
    (raw,) = case.args
    if _close(got, _q4_1_wrong(raw, interleave=True)):
        return (_("the nibbles are not interleaved: the low nibbles of the 16 bytes are weights 0..15, the high ones "
                  "16..31"))
    if _close(got, _q4_1_wrong(raw, no_min=True)):
        return _("add the block's minimum m: Q4_1 stores w = d·q + m (Q4_0 has no m)")
    if _close(got, _q4_1_wrong(raw, swap=True)):
        return _("the first float16 is the scale d, the second the minimum m")
    return (_("view bytes 0-1 and 2-3 of each block as float16 (d, m), split bytes 4..19 into low (& 0x0F) and high "
              "(>> 4) nibbles, put the 16 low ones first, then d·q + m in float32"))


@exercise(cases=_q4_1_cases, hints=[_q4_1_hint], atol=0.0, rtol=0.0)
def dequantize_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """raw uint8 (N, 20), N Q4_1 blocks -> float32 (N, 32): w = d·q + m, d and m float16, q the 4-bit numbers
    (byte j of the 16 holds weight j in its low nibble and weight j + 16 in its high nibble)."""
    return quantize.dequantize(raw, "Q4_1")


# ------------------------------------------------------------------ Q8_0 there and back


def _q8_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for n, scale in ((1, 1.0), (4, 0.05), (6, 3.0)):
        w = torch.randn(n, 32, generator=gen) * scale
        w[0, 0] = 4 * scale  # the largest |w| of block 0 is known: it must come back exactly
        cases.append(Case(N_("w ({n}, 32), scale {scale:g}", n=n, scale=scale), (w,)))
    return cases


def _q8_wrong(w: torch.Tensor, levels=127, signed_max=False, trunc=False, f16=True) -> torch.Tensor:
    d = (w.amax(1, keepdim=True) if signed_max else w.abs().amax(1, keepdim=True)) / levels
    if f16:
        d = d.half().float()
    x = w / torch.where(d == 0, 1.0, d)
    q = (torch.trunc(x) if trunc else torch.round(x)).clamp(-127, 127)
    return q * d


def _q8_hint(case: Case, got, expected) -> str | None:
    (w,) = case.args
    if _close(got, _q8_wrong(w, trunc=True)):
        return _("round to the nearest integer (torch.round), do not cut off the fraction")
    if _close(got, _q8_wrong(w, levels=128)):
        return _("divide max|w| by 127, so the largest weight maps to ±127 and fits in an int8 either way")
    if _close(got, _q8_wrong(w, signed_max=True)):
        return _("the scale comes from the largest absolute value max|w|, not the largest weight")
    return _("d = max|w| / 127 per row of 32 (rounded to float16), q = round(w / d) clipped to ±127, then q·d")


@exercise(cases=_q8_cases, hints=[_q8_hint], atol=1e-6, rtol=1e-5)
def q8_0_roundtrip(w: torch.Tensor) -> torch.Tensor:
    """w (N, 32), N blocks -> (N, 32): each block quantised to Q8_0 (d = max|w|/127 stored as float16,
    q = round(w/d) as int8) and dequantised again, q·d."""
    return quantize.roundtrip(w, "Q8_0")


# ------------------------------------------------------------------ the chat template


SYSTEM_MESSAGES = ("Answer briefly.", "You are a patient maths tutor.", "Reply in one sentence.", "한국어로 답하세요.")
COLOURS = ("red", "green", "blue", "yellow", "violet", "orange", "grey", "white")


def _pick(options: tuple[str, ...], gen: torch.Generator) -> str:
    return options[int(torch.randint(len(options), (), generator=gen))]


def _number(gen: torch.Generator) -> int:
    return int(torch.randint(100, (), generator=gen))


def _chat_cases(gen: torch.Generator) -> list[Case]:
    """Three conversations whose words are drawn per seed (the labels stay fixed): the expected prompts
    differ from draw to draw, so no table of prompts answers them."""
    a, b, c = _number(gen), _number(gen), _number(gen)
    return [
        Case(N_("one user message"), ([{"role": "user", "content": f"What is {a} + {b}?"}],)),
        Case(N_("a system message and a user message"), ([
            {"role": "system", "content": _pick(SYSTEM_MESSAGES, gen)},
            {"role": "user", "content": f"Name a colour other than {_pick(COLOURS, gen)}."}],)),
        Case(N_("two turns"), ([{"role": "user", "content": f"Hi, I am {c}."},
                                {"role": "assistant", "content": _pick(("Hello!", "Hi there!", "안녕하세요!"), gen)},
                                {"role": "user", "content": f"{c} 더하기 {a}의 값은?"}],)),
    ]


def _chat_hint(case: Case, got, expected) -> str | None:
    (messages,) = case.args
    if not isinstance(got, str):
        return _("return the prompt as one string")
    if got == expected.removesuffix("<|im_start|>assistant\n"):
        return _("end with the header of the reply the model is to write: <|im_start|>assistant and a newline")
    if messages[0]["role"] != "system" and chat.DEFAULT_SYSTEM not in got:
        return _("a conversation without a system message gets the default one first")
    if got.replace("<|im_end|>\n", "<|im_end|>") == expected.replace("<|im_end|>\n", "<|im_end|>"):
        return _("every <|im_end|> is followed by a newline")
    return _("each message is <|im_start|>ROLE, a newline, the content, <|im_end|>, a newline")


@exercise(cases=_chat_cases, hints=[_chat_hint])
def chatml_prompt(messages: list) -> str:
    """messages (a list of {"role", "content"} dicts) -> SmolLM2's ChatML prompt, ending with the header
    of the assistant's reply; without a system message first, the default system message comes first."""
    return chat.apply_chat_template(messages)


# ------------------------------------------------------------------ bits per byte


def _bpb_cases(gen: torch.Generator) -> list[Case]:
    return [Case(N_("loss {loss:g} nats/token, {n_tok} tokens, {n_bytes} bytes", loss=loss, n_tok=n_tok,
                    n_bytes=n_bytes), (loss, n_tok, n_bytes))
            for loss, n_tok, n_bytes in ((1.5, 1000, 1000), (3.2, 250, 1000), (2.0, 300, 1321))]


def _bpb_hint(case: Case, got, expected) -> str | None:
    loss, n_tok, n_bytes = case.args
    if _close(got, loss * n_tok / n_bytes):
        return _("that is nats per byte: divide by ln 2 for bits")
    if _close(got, loss / math.log(2)):
        return _("that is bits per token: multiply by the tokens and divide by the bytes")
    if _close(got, loss * n_bytes / n_tok / math.log(2)):
        return _("tokens per byte, not bytes per token: the total is loss · tokens, shared out over the bytes")
    return _("total nats = loss · tokens; bits = nats / ln 2; divide by the number of bytes")


@exercise(cases=_bpb_cases, hints=[_bpb_hint])
def bits_per_byte(loss: float, n_tokens: int, n_bytes: int) -> float:
    """A mean loss of ``loss`` nats per token over ``n_tokens`` tokens that spell ``n_bytes`` bytes of text
    -> bits per byte: what the model pays to encode each byte, whatever its tokenizer."""
    return loss * n_tokens / n_bytes / math.log(2)


# ------------------------------------------------------------------ the learner's own LLaMA

# GGUF's names -> the interface's (Hugging Face's LLaMA names without the "model." prefix)
MODEL_NAMES = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
               "output.weight": "lm_head.weight"}
BLOCK_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
               "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
               "ffn_down.weight": "mlp.down_proj.weight"}
SMOLLM2_CONFIG = {"vocab_size": 49152, "d_model": 576, "n_layers": 30, "n_heads": 9, "n_kv_heads": 3,
                  "d_ff": 1536, "rope_base": 100000.0, "eps": 1e-5, "tie_embeddings": True}

# What each stage builds on (checks.Exercise.requires): why it means nothing while that one fails.
MAPS = N_("SmolLM2's weights reach your model through your mapping, so the logits cannot match while it differs")
COMPUTES = N_("a model that differs from the reference on random weights cannot give SmolLM2's logits, and its "
              "cache and decoding are not the reference's either")
CACHES = N_("decoding continues from the cache, so a cache that changes the logits changes every token after "
            "the first")


def pairs_to_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The rows of a query or key projection (H·d, ...) from neighbour-pair order (the file's) to rotate-half
    order (the interface's): in every head row 2j goes to j and row 2j + 1 to j + d/2."""
    d = weight.shape[0] // n_heads
    return weight.reshape(n_heads, d // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def interface_name(name: str) -> str:
    if name in MODEL_NAMES:
        return MODEL_NAMES[name]
    _blk, layer, rest = name.split(".", 2)
    return f"layers.{layer}.{BLOCK_NAMES[rest]}"


def _smollm2_file() -> gguf.GGUFFile:
    return gguf.read(pretrained.fetch(pretrained.SMOLLM2))


def _mapping_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    n_heads, n_kv, d_head = 4, 2, 8
    layer = int(torch.randint(4, (), generator=gen))
    shapes = {"attn_q.weight": (n_heads * d_head, 24), "attn_k.weight": (n_kv * d_head, 24),
              "attn_v.weight": (n_kv * d_head, 24), "ffn_down.weight": (24, 40), "attn_norm.weight": (24,)}
    for rest, shape in shapes.items():
        full = f"blk.{layer}.{rest}"  # the block is drawn; the label names the tensor kind only (stable outputs)
        cases.append(Case(N_("{name}, synthetic, shape {shape}", name="blk.i." + rest, shape=shape),
                          (full, torch.randn(*shape, generator=gen), n_heads, n_kv)))
    for name in ("token_embd.weight", "output_norm.weight"):
        shape = (50, 24) if name.startswith("token") else (24,)
        cases.append(Case(N_("{name}, synthetic, shape {shape}", name=name, shape=shape),
                          (name, torch.randn(*shape, generator=gen), n_heads, n_kv)))
    file = _smollm2_file()
    block = int(torch.randint(30, (), generator=gen))
    for rest in ("attn_q.weight", "attn_k.weight"):
        name = f"blk.{block}.{rest}"
        cases.append(Case(N_("{name} of SmolLM2's file", name="blk.i." + rest),
                          (name, file.tensor(name).to_float(), 9, 3)))
    return cases


def _mapping_hint(case: Case, got, expected) -> str | None:
    name, weight, n_heads, n_kv = case.args
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[1], torch.Tensor)):
        return _("return a pair: (the interface's name, the tensor)")
    if got[0] != expected[0]:
        return _("the name: blk.i.X becomes layers.i.<Hugging Face's name of X>; see the table above the exercise")
    heads = n_kv if ".attn_k." in name else n_heads
    if ".attn_q." in name or ".attn_k." in name:
        if _close(got[1], weight):
            return _("W_Q and W_K need their rows permuted: the file pairs neighbours (2j, 2j+1), the interface's "
                     "RoPE pairs j with j + d/2")
        from course_utils.positional import rope_halves_to_pairs
        if _close(got[1], rope_halves_to_pairs(weight, heads)):
            return _("that is the permutation the other way round: file row 2j goes to row j, row 2j+1 to j + d/2")
        other = n_heads if heads == n_kv else n_kv
        if got[1].shape == weight.shape and _close(got[1], pairs_to_halves(weight, other)):
            return _("permute head by head with this projection's own number of heads: n_kv_heads for W_K")
    elif not _close(got[1], weight):
        return _("only W_Q and W_K are permuted; every other tensor keeps its rows")
    return None


@exercise(cases=_mapping_cases, function="map_tensor", hints=[_mapping_hint], atol=0.0, rtol=0.0,
          explain=N_("the names follow the table and W_Q, W_K go back to rotate-half order head by head."))
def llama_mapping(name: str, weight: torch.Tensor, n_heads: int, n_kv_heads: int) -> tuple[str, torch.Tensor]:
    """One GGUF tensor -> (the interface's name, the tensor): W_Q and W_K rows from neighbour pairs to halves."""
    ours = interface_name(name)
    if ".attn_q." in name:
        weight = pairs_to_halves(weight, n_heads)
    elif ".attn_k." in name:
        weight = pairs_to_halves(weight, n_kv_heads)
    return ours, weight


def course_config(config: dict, max_len: int = 256):
    c = config
    return llama(c["vocab_size"], max_len, c["n_layers"], c["n_heads"], c["d_model"], c["d_ff"],
                 n_kv_heads=c["n_kv_heads"], rope_base=float(c["rope_base"]), eps=float(c["eps"]),
                 tie_embeddings=bool(c["tie_embeddings"]))


def reference_llama(config: dict, state: dict[str, torch.Tensor], permute: bool = True) -> GPT:
    """The course's GPT holding ``state`` (interface names, rotate-half rows), in eval mode; ``permute=False``
    loads the rows as they are (what a model with neighbour-pair RoPE computes, for a hint)."""
    c = course_config(config)
    model = GPT(c).eval()
    if permute:
        model.load_state_dict(convert.from_llama_state_dict(state, c))
    else:
        halves = {k: (pairs_to_halves(v, c.n_heads if "q_proj" in k else c.kv_heads) if ("q_proj" in k or "k_proj" in k)
                      else v) for k, v in state.items()}
        model.load_state_dict(convert.from_llama_state_dict(halves, c))
    return model


LLAMA_CONFIGS = (
    {"vocab_size": 40, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_ff": 48,
     "rope_base": 10000.0, "eps": 1e-5, "tie_embeddings": True},
    {"vocab_size": 30, "d_model": 24, "n_layers": 1, "n_heads": 3, "n_kv_heads": 1, "d_ff": 40,
     "rope_base": 500.0, "eps": 1e-6, "tie_embeddings": False},
    {"vocab_size": 50, "d_model": 16, "n_layers": 2, "n_heads": 2, "n_kv_heads": 2, "d_ff": 32,
     "rope_base": 100000.0, "eps": 1e-5, "tie_embeddings": True},
)


def random_llama_state(config: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weights with the interface's names: matrices N(0, 0.2²)·, norms' gains around 1."""
    c = config
    d, h, kv, f = c["d_model"], c["n_heads"], c["n_kv_heads"], c["d_ff"]
    d_head = d // h
    state = {"embed_tokens.weight": torch.randn(c["vocab_size"], d, generator=gen),
             "norm.weight": 1 + 0.1 * torch.randn(d, generator=gen)}
    if not c["tie_embeddings"]:
        state["lm_head.weight"] = 0.2 * torch.randn(c["vocab_size"], d, generator=gen)
    shapes = {"self_attn.q_proj.weight": (h * d_head, d), "self_attn.k_proj.weight": (kv * d_head, d),
              "self_attn.v_proj.weight": (kv * d_head, d), "self_attn.o_proj.weight": (d, h * d_head),
              "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f)}
    for i in range(c["n_layers"]):
        for name, shape in shapes.items():
            state[f"layers.{i}.{name}"] = torch.randn(*shape, generator=gen) / math.sqrt(shape[1])
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            state[f"layers.{i}.{name}"] = 1 + 0.1 * torch.randn(d, generator=gen)
    return state


def _config_label(config: dict, ids: torch.Tensor) -> str:
    return N_("{layers} block(s), {heads} query heads sharing {kv} key/value heads, d_model {d}, RoPE base {base:g}, "
              "ids {shape}", layers=config["n_layers"], heads=config["n_heads"], kv=config["n_kv_heads"],
              d=config["d_model"], base=config["rope_base"], shape=tuple(ids.shape))


def _forward_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for config, (batch, length) in zip(LLAMA_CONFIGS, ((2, 9), (1, 12), (3, 5)), strict=True):
        ids = torch.randint(config["vocab_size"], (batch, length), generator=gen)
        cases.append(Case(_config_label(config, ids), (config, random_llama_state(config, gen), ids)))
    return cases


@torch.no_grad()
def _reference_logits(config: dict, state: dict, ids: torch.Tensor, permute: bool = True) -> torch.Tensor:
    return reference_llama(config, state, permute)(ids)[0]


def _forward_hint(case: Case, got, expected) -> str | None:
    config, state, ids = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _("return the logits, shape (B, T, vocab_size)")
    if _close(got, _reference_logits(config, state, ids, permute=False)):
        return _("your RoPE turns neighbours (2j, 2j+1) together; the interface's turns feature j with j + d/2 "
                 "(rotate-half)")
    if ids.shape[1] > 1 and _close(got[:, :1], expected[:, :1]):
        return _("position 0 is right and later ones are not: look at the causal mask and at RoPE's angles "
                 "(position · base^(−2j/d))")
    return _("check each piece: RMSNorm x / sqrt(mean(x²) + eps) · weight, SwiGLU down(silu(gate x) · up x), "
             "each key/value head shared by n_heads / n_kv_heads query heads, scores scaled by 1/√d_head")


@exercise(cases=_forward_cases, function="llama_logits", atol=1e-4, rtol=1e-4, hints=[_forward_hint],
          explain=N_("with the same weights your LLaMA computes the same function as the course's GPT, to 1e-4."))
def llama_forward(config: dict, state: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The reference LLaMA holding ``state`` (interface names) applied to ``ids``: logits (B, T, V)."""
    return _reference_logits(config, state, ids)


# --- SmolLM2 itself, on prompts the learner never sees

WORDS = ("river", "seven", "garden", "music", "winter", "planet", "bread", "lantern", "mountain", "letter",
         "question", "yellow", "ocean", "library", "engine", "forest")


@lru_cache(maxsize=1)
def _smollm2():
    """The course's GPT holding SmolLM2, in float64 (the stage compares float64 logits: two correct float32
    models differ in their last digits, near 1e-4 after 30 blocks in lesson 12's parity section), and its tokenizer."""
    with torch_threads(1):
        model, tok = pretrained.load(pretrained.SMOLLM2)
        return model.double(), tok


def _smollm2_cases(gen: torch.Generator) -> list[Case]:
    _model, tok = _smollm2()
    words = [WORDS[int(i)] for i in torch.randint(len(WORDS), (3,), generator=gen)]
    a, b = _number(gen), _number(gen)
    question = f"Write one sentence with the words {words[0]}, {words[1]} and {words[2]}, then add {a} and {b}."
    prompt = chat.apply_chat_template([{"role": "user", "content": question}])
    ids = torch.tensor([tok.encode(prompt)[-20:]])
    random_ids = torch.randint(49152, (1, 6), generator=gen)
    return [Case(N_("the last 20 tokens of a chat prompt drawn by the grader"), (ids,)),
            Case(N_("6 random token ids"), (random_ids,))]


@exercise(cases=_smollm2_cases, function="smollm2_logits", atol=1e-4, rtol=0.0,
          requires={"llama_mapping": MAPS, "llama_forward": COMPUTES},
          explain=N_("SmolLM2-135M-Instruct runs in your code: your mapping, your model, the course's logits."))
def llama_smollm2(ids: torch.Tensor) -> torch.Tensor:
    """SmolLM2-135M-Instruct's float64 logits (1, T, 49,152) for ``ids``, computed by the course's GPT."""
    model, _tok = _smollm2()
    with torch.no_grad(), torch_threads(1):
        return model(ids)[0]


# --- the KV cache

def _cache_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for config, (batch, length, prefill) in zip(LLAMA_CONFIGS, ((1, 10, 4), (2, 8, 1), (1, 7, 6)), strict=True):
        ids = torch.randint(config["vocab_size"], (batch, length), generator=gen)
        cases.append(Case(N_("{model}, prefill {prefill} then one token at a time",
                             model=_config_label(config, ids), prefill=prefill),
                          (config, random_llama_state(config, gen), ids, prefill)))
    return cases


def _cache_hint(case: Case, got, expected) -> str | None:
    config, state, ids, prefill = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _("return the logits of every position, prefill and steps together: (B, T, vocab_size)")
    if _close(got[:, :prefill], expected[:, :prefill]):
        cold = torch.cat([_reference_logits(config, state, ids[:, t:t + 1]) for t in range(prefill, ids.shape[1])], 1)
        if _close(got[:, prefill:], cold):
            return _("the steps do not see the cached positions: append each step's keys and values to the cache "
                     "and attend over all of them")
        return _("the prefill is right and the steps are not: a new token's RoPE position is the number of "
                 "positions already cached, not 0")
    return _("the prefill itself differs: without a cache your model must give llama_forward's logits")


@exercise(cases=_cache_cases, function="cached_logits", atol=1e-4, rtol=1e-4, hints=[_cache_hint],
          requires={"llama_forward": COMPUTES},
          explain=N_("one position at a time through the cache gives what the full forward gives."))
def llama_kv_cache(config: dict, state: dict[str, torch.Tensor], ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """The full forward's logits (B, T, V): what prefill + cached steps must reproduce."""
    return _reference_logits(config, state, ids)


# --- temperature and top-p

def _top_p_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for temperature, top_p, shape in ((1.0, 0.9, (1, 12)), (0.7, 0.5, (3, 20)), (1.5, 1.0, (2, 8)),
                                      (0.0, 0.9, (2, 10)), (0.4, 0.95, (1, 50))):
        logits = torch.randn(*shape, generator=gen) * 2
        cases.append(Case(N_("logits {shape}, temperature {t:g}, top-p {p:g}", shape=shape, t=temperature, p=top_p),
                          (logits, temperature, top_p)))
    return cases


def _top_p_wrong(logits: torch.Tensor, temperature: float, top_p: float, before: bool = False,
                 drop_crossing: bool = False) -> torch.Tensor:
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scaled = logits / temperature
    probs = torch.softmax(logits if before else scaled, -1)
    sorted_p, order = probs.sort(-1, descending=True)
    cum = sorted_p.cumsum(-1)
    drop_sorted = (cum > top_p) if drop_crossing else (cum - sorted_p >= top_p)
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return torch.softmax(scaled.masked_fill(drop, float("-inf")), -1)


def _top_p_hint(case: Case, got, expected) -> str | None:
    logits, temperature, top_p = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _("return probabilities of the same shape as the logits")
    if temperature == 0:
        return _("temperature 0 is greedy: all the probability on the arg-max")
    if not _close(got.sum(-1), torch.ones(got.shape[:-1])):
        return _("renormalise: the kept probabilities must sum to 1")
    if _close(got, _top_p_wrong(logits, temperature, top_p, drop_crossing=True)):
        return _("keep the token whose probability carries the running sum across p: drop a token only when the "
                 "tokens ranked above it already reach p")
    if _close(got, _top_p_wrong(logits, temperature, top_p, before=True)):
        return _("divide by the temperature first, then choose the tokens by their probabilities after it")
    return _("divide by the temperature, softmax, sort, keep the most likely tokens until their sum reaches p, "
             "renormalise")


@exercise(cases=_top_p_cases, function="next_token_probs", hints=[_top_p_hint], atol=1e-6, rtol=1e-5,
          explain=N_("temperature first, then the smallest set of most likely tokens whose probability reaches p."))
def llama_top_p(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities after temperature, then top-p (temperature 0: the arg-max)."""
    return generate.next_token_probs(logits, temperature=temperature, top_p=top_p)


# --- the decoding loop

def _generate_cases(gen: torch.Generator) -> list[Case]:
    cases = []
    for config, (length, new, temperature, top_p) in zip(LLAMA_CONFIGS[:2], ((5, 8, 0.0, 1.0), (3, 10, 1.0, 1e-9)),
                                                          strict=True):
        ids = torch.randint(config["vocab_size"], (1, length), generator=gen)
        label = N_("{model}, {new} new tokens, temperature {t:g}, top-p {p:g}", model=_config_label(config, ids),
                   new=new, t=temperature, p=top_p)
        cases.append(Case(label,
                          (config, random_llama_state(config, gen), ids, new, temperature, top_p)))
    return cases


def _generate_hint(case: Case, got, expected) -> str | None:
    config, state, ids, new, temperature, top_p = case.args
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return _("return the prompt followed by the new tokens: shape (1, T + max_new_tokens)")
    if not torch.equal(got[:, :ids.shape[1]], ids):
        return _("keep the prompt at the start of what you return")
    return _("with temperature 0 (or a top-p so small that one token survives) every step takes the arg-max of "
             "the last position's logits; feed only the new token through the cache")


@exercise(cases=_generate_cases, function="decoded", hints=[_generate_hint], atol=0.0, rtol=0.0,
          requires={"llama_kv_cache": CACHES},
          explain=N_("your loop follows the reference's greedy path token for token."))
def llama_generate(config: dict, state: dict[str, torch.Tensor], ids: torch.Tensor, new: int, temperature: float,
                   top_p: float) -> torch.Tensor:
    """The reference's greedy continuation of ``ids`` (both cases leave one token to choose): (1, T + new)."""
    model = reference_llama(config, state)
    with torch.no_grad():
        return generate.generate(model, ids, new, temperature=0.0)


# ------------------------------------------------------------------ self-check questions


SMOLLM2_360M = {"vocab_size": 49152, "d_model": 960, "n_layers": 32, "n_heads": 15, "n_kv_heads": 5, "d_ff": 2560,
                "tie_embeddings": True}


def file_bits_per_weight(config: dict, head_stored: bool = False) -> float:
    """Bits per weight (tensor bytes × 8 over the weights, ``gguf.memory_report``'s measure) of a LLaMA written
    as lesson 12's file is: the embedding in Q8_0, every other matrix in Q4_1, the norms' gains in F32.
    ``head_stored`` counts a tied unembedding a second time, as if the file held ``output.weight`` too."""
    c = config
    d, d_head = c["d_model"], c["d_model"] // c["n_heads"]
    embedding = c["vocab_size"] * d * (2 if head_stored else 1)
    matrices = c["n_layers"] * (2 * d * d + 2 * c["n_kv_heads"] * d_head * d + 3 * d * c["d_ff"])
    norms = (2 * c["n_layers"] + 1) * d
    stored = (embedding * quantize.BLOCK_BYTES["Q8_0"] + matrices * quantize.BLOCK_BYTES["Q4_1"]) / quantize.BLOCK
    return 8 * (stored + 4 * norms) / (embedding + matrices + norms)


@question(explain=N_("the file's 5.74 mixes three formats: the embedding in Q8_0 (8.5 bits), every other matrix in "
                     "Q4_1 (5 bits), the norms in F32. SmolLM2-360M holds 47.2 million embedding weights, 314.6 "
                     "million in its 32 blocks (W_K and W_V have 5 × 64 = 320 rows) and 62,400 in its norms: 5.46 "
                     "bits a weight. The embedding is a smaller share of the larger model, so its file comes closer "
                     "to Q4_1's 5 bits."), atol=0.01,
          hints=[near_wrong({
              file_bits_per_weight(SMOLLM2_CONFIG): N_("that is the 135M file's: recount the weights of each format "
                                                       "for the 360M's sizes"),
              quantize.bits_per_weight("Q4_1"): N_("that is Q4_1 alone: the embedding is stored in Q8_0, 8.5 bits a "
                                                   "weight"),
              file_bits_per_weight({**SMOLLM2_360M, "n_kv_heads": SMOLLM2_360M["n_heads"]}):
                  N_("W_K and W_V have one row per feature of the 5 key/value heads: 320 rows, not 960"),
              file_bits_per_weight(SMOLLM2_360M, head_stored=True):
                  N_("the unembedding is tied to the embedding: the file stores it once (it has no output.weight)"),
          }, atol=0.01)])
def smollm2_360m_bits() -> float:
    """Bits per weight of SmolLM2-360M (d_model 960, 32 blocks, 15 query and 5 key/value heads of 64, SwiGLU
    2,560, vocabulary 49,152, tied) written as lesson 12's file: embedding Q8_0, matrices Q4_1, norms F32."""
    return file_bits_per_weight(SMOLLM2_360M)


@question(explain=N_("keys and values: 2 × 30 blocks × 3 key/value heads × 64 features × 8,192 positions × 4 bytes "
                     "= 377.5 MB; with 9 key/value heads it would be three times as much."),
          hints=[known_wrong({
              1132.5: N_("SmolLM2's 9 query heads share 3 key/value heads: the cache holds 3 heads per block"),
              188.7: N_("the cache holds the keys and the values: two tensors per block"),
              12.6: N_("that is one block; SmolLM2 has 30"),
          })], atol=1.0)
def kv_cache_megabytes() -> float:
    """Megabytes (10⁶ bytes) of SmolLM2-135M's KV cache, float32, for one conversation of 8,192 positions."""
    return 2 * 30 * 3 * 64 * 8192 * 4 / 1e6


@question(explain=N_("divide by 0.5: (4, 2, 0, −2); softmax: 0.865, 0.117, 0.016, 0.002; the first token alone "
                     "holds 0.865 < 0.9, so the second is kept and it reaches 0.98; the second's share of the two: "
                     "e²/(e⁴ + e²) = 0.119."),
          hints=[known_wrong({
              0.117: N_("renormalise over the tokens top-p keeps"),
              0.0: N_("the first token alone holds less than 0.9, so top-p keeps the second as well"),
              0.269: N_("divide the logits by the temperature 0.5 before the softmax"),
          })], atol=2e-3)
def top_p_second_prob() -> float:
    """Logits (2, 1, 0, −1), temperature 0.5, top-p 0.9: the probability that the second token is drawn."""
    probs = torch.softmax(torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=torch.float64) / 0.5, 0)
    return float(probs[1] / (probs[0] + probs[1]))


# A LLaMA with SmolLM2's head width (64), RoPE base and three query heads per key/value head, small enough to
# build on every check; tests/test_lesson12_questions.py finds the same positions on SmolLM2 itself.
UNPERMUTED_CONFIG = {"vocab_size": 64, "d_model": 192, "n_layers": 2, "n_heads": 3, "n_kv_heads": 1, "d_ff": 256,
                     "rope_base": 100000.0, "eps": 1e-5, "tie_embeddings": True}


def file_order(state: dict[str, torch.Tensor], config: dict) -> dict[str, torch.Tensor]:
    """The interface's state with W_Q and W_K back in the file's neighbour-pair order: what a ``map_tensor``
    without the permutation hands over."""
    from course_utils.positional import rope_halves_to_pairs

    heads = {"q_proj": config["n_heads"], "k_proj": config["n_kv_heads"]}
    return {k: next((rope_halves_to_pairs(v, h) for part, h in heads.items() if part in k), v)
            for k, v in state.items()}


@lru_cache(maxsize=1)
def unpermuted_agreement(tokens: int = 6, seed: int = 0) -> tuple[bool, ...]:
    """For each position of a prompt of ``tokens`` tokens: whether a rotate-half LLaMA whose W_Q and W_K are in
    the file's order gives the right model's logits (to 1e-4)."""
    c = UNPERMUTED_CONFIG
    gen = torch.Generator().manual_seed(seed)
    state = random_llama_state(c, gen)
    ids = torch.randint(c["vocab_size"], (1, tokens), generator=gen)
    with torch.no_grad(), torch_threads(1):
        right = reference_llama(c, state).double()(ids)[0][0]
        wrong = reference_llama(c, file_order(state, c)).double()(ids)[0][0]
    return tuple(bool(gap <= 1e-4) for gap in (right - wrong).abs().amax(-1))


def agreement_letter(agree: tuple[bool, ...]) -> str:
    """The option of question 4 that a pattern of agreeing positions is."""
    first = agree.index(False) if False in agree else len(agree)
    if any(agree[first:]):
        raise ValueError(f"positions {agree} agree in no pattern the options name")
    return {len(agree): "b", 0: "c", 1: "a"}.get(first, "d")


@question(explain=N_("at position 0 the angle is 0, so RoPE turns nothing, and position 0 reads only its own key: "
                     "its query and key hold the reference's numbers in another order, q·k is the same sum, and its "
                     "logits agree. From position 1 on, a query also reads keys of other positions, and the turn "
                     "by their distance acts on rows that were never trained as a pair (the file pairs rows 2j and "
                     "2j + 1; rotate-half turns row j with row j + 32): those scores differ, and everything after "
                     "them. A test on a one-token prompt passes with this bug."),
          hints=[known_wrong({
              "b": N_("reordering W_Q's and W_K's rows alike leaves q·k unchanged only without RoPE: the rotation "
                      "pairs features by their row, so the order decides which two features turn together"),
              "c": N_("at position 0 the angle is 0: nothing is turned, and position 0 reads only its own key"),
              "d": N_("at distance 1 the fastest pair already turns by 1 radian (distance · base^(−2j/d) with "
                      "j = 0): no small angle"),
          })])
def unpermuted_positions() -> str:
    """Multiple choice: which positions' logits agree with the reference's (1e-4) on a prompt of 6 tokens when
    W_Q and W_K reach a rotate-half model in the file's neighbour-pair order. (a) only the first; (b) all six;
    (c) none; (d) the first few."""
    return agreement_letter(unpermuted_agreement())


def q4_1_zero_block() -> torch.Tensor:
    """One block of 32 weights: the smallest −0.3, the largest 0.9, the other 30 exactly 0."""
    return torch.tensor([[-0.3, 0.9] + [0.0] * 30])


@question(explain=N_("Q4_1's levels are m + d·q: with m = −0.3 and d = 1.2/15 = 0.08, 0 lies at q = 0.3/0.08 = 3.75, "
                     "between two levels; the nearest is q = 4, so every 0 comes back as −0.3 + 4·0.08 = 0.020 "
                     "(float16's rounding of d and m moves only the fifth decimal). Q8_0's levels d·q always "
                     "include 0: there a zero stays zero."), atol=1e-3,
          hints=[near_wrong({
              0.0: N_("Q4_1's levels are m, m + d, …, m + 15d: 0 is one of them only when −m is a whole multiple of "
                      "d, and 0.3/0.08 = 3.75"),
              -0.06: N_("take the nearest level: 3.75 is nearer 4 than 3"),
          }, atol=1e-3)])
def q4_1_zero() -> float:
    """A block whose smallest weight is −0.3, largest 0.9 and other 30 weights 0, through Q4_1 and back: what each
    0 becomes."""
    return float(quantize.roundtrip(q4_1_zero_block(), "Q4_1")[0, 2])


# ------------------------------------------------------------------ experiment

EXPERIMENT_WINDOWS = 64
EXPERIMENT_SEEDS = (0, 1, 2)


def row_4bit(weight: torch.Tensor) -> torch.Tensor:
    """Each row through 4 bits with one scale and one minimum for the whole row (16 levels from its min to its
    max), and back: Q4_1's formula without the blocks."""
    low, high = weight.amin(-1, keepdim=True), weight.amax(-1, keepdim=True)
    d = (high - low) / 15
    q = torch.round((weight - low) / torch.where(d == 0, 1.0, d)).clamp(0, 15)
    return q * d + low


def quantised_copy(model: torch.nn.Module, fmt: str) -> torch.nn.Module:
    """``model`` with every 2-D weight through ``fmt`` ("Q4_1": blocks of 32; "row4": one scale per row), in place."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(quantize.roundtrip(p, "Q4_1") if fmt == "Q4_1" else row_4bit(p))
    return model


def random_windows(tok, max_len: int, seed: int,
                   windows: int = EXPERIMENT_WINDOWS) -> tuple[torch.Tensor, torch.Tensor]:
    """``windows`` windows of the validation part at offsets drawn with ``seed``: inputs and targets (W, T)."""
    _, val_text = data.train_val_split(data.shakespeare())
    ids = torch.tensor(tok.encode(val_text), dtype=torch.long)
    starts = torch.randint(len(ids) - max_len - 1, (windows,), generator=torch.Generator().manual_seed(seed))
    x = torch.stack([ids[s:s + max_len] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + max_len + 1] for s in starts.tolist()])
    return x, y


@torch.no_grad()
def windows_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    logits, _ = model(x)
    return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), y.flatten()))


def format_costs(seed: int) -> dict[str, float]:
    """Loss increase (nats) of Q4_1 and of row4 over float32 on the windows of ``seed``."""
    costs = {}
    with torch_threads(1):
        base, tok = pretrained.load("shakespeare_char_small")
        x, y = random_windows(tok, base.config.max_len, seed)
        before = windows_loss(base, x, y)
        for fmt in ("Q4_1", "row4"):
            model, _tok = pretrained.load("shakespeare_char_small")
            costs[fmt] = windows_loss(quantised_copy(model, fmt), x, y) - before
    return costs


@question(explain=N_("one scale per row must span the row's extreme weights, so most weights fall into a few of the "
                     "16 levels; a scale per block of 32 follows each block's own range. On every seed the row-wise "
                     "format costs several times more."),
          hints=[known_wrong({
              0.0: N_("the loss did not change: quantise the weights of the model you evaluate (p.copy_ inside "
                      "no_grad)"),
          })], atol=5e-3)
def row_vs_block_cost() -> float:
    """Experiment: the mean over seeds 0, 1, 2 of (loss increase with one 4-bit scale per row) − (loss increase
    with Q4_1), 64 random validation windows per seed; rounded to 3 decimals."""
    gaps = []
    for seed in EXPERIMENT_SEEDS:
        costs = format_costs(seed)
        gaps.append(costs["row4"] - costs["Q4_1"])
    return round(sum(gaps) / len(gaps), 3)
