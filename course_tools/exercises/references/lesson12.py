"""Exercises of lesson 12: dequantise Q4_1 blocks, quantise to Q8_0 and back, write a ChatML prompt,
turn a loss into bits per byte; five self-check questions and one experiment (the validation loss that
Q4_1 costs the course's shipped Shakespeare model)."""

from __future__ import annotations

import math

import torch

from course_tools.exercises.checks import Case, exercise, question
from course_tools.exercises.references._shared import close as _close
from course_tools.exercises.references._shared import known_wrong
from course_tools.messages import N_, N_n, _
from course_utils import chat, pretrained, quantize
from course_utils.cpu_threads import torch_threads

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


# ------------------------------------------------------------------ self-check questions


@question(explain=N_("16 bytes of 4-bit numbers plus a float16 scale and a float16 minimum: 20 bytes = 160 bits for "
                     "32 weights, 5 bits a weight."),
          hints=[known_wrong({
              4: N_("the 32 four-bit numbers are not all: each block also stores d and m, 2 bytes each"),
              4.5: N_("that is Q4_0 (a scale only); Q4_1 also stores the minimum m"),
          })])
def q4_1_bits() -> float:
    """Bits per weight of Q4_1, scale and minimum included."""
    return quantize.bits_per_weight("Q4_1")


@question(explain=N_("134,515,008 parameters × 4 bytes = 538 MB; the Q4_1 file is 98 MB."),
          hints=[known_wrong({
              134.5: N_("that is one byte per parameter; float32 takes 4"),
              269: N_("that is float16/bfloat16 (2 bytes); float32 takes 4"),
              1076: N_("the tied embedding is one matrix: count it once"),
          })], atol=1.0)
def float32_megabytes() -> float:
    """Megabytes (10⁶ bytes) of SmolLM2-135M's 134,515,008 parameters in float32."""
    return 134_515_008 * 4 / 1e6


@question(explain=N_("one decoded token reads every weight once: 34 GB/s ÷ 0.538 GB ≈ 63 tokens per second at best."),
          hints=[known_wrong({
              0.016: N_("that is seconds per token; the question asks tokens per second"),
              252: N_("that divides by the 0.135 GB of one byte per parameter; float32 weights take 4 bytes"),
              344: N_("that divides by the 98 MB of the Q4_1 file; the float32 path reads 538 MB"),
          })], atol=3.0)
def roofline_tokens_per_s() -> float:
    """The memory-bandwidth ceiling on decoding (tokens/s) for 538 MB of float32 weights read at 34 GB/s."""
    return 34e9 / 538e6


@question(explain=N_("llama.cpp's converter stores W_Q and W_K in the order of Meta's original code, neighbour pairs "
                     "(2j, 2j+1), which is the course's apply_rope; Hugging Face's rotate-half order needs the "
                     "permutation."),
          hints=[known_wrong({
              "a": N_("RoPE does rotate q and k in SmolLM2 (rope.freq_base = 100,000)"),
              "c": N_("the file's rows are permuted relative to Hugging Face's; it is HF's that need "
                      "rope_halves_to_pairs"),
              "b": N_("the score q·k is unchanged by a permutation only if q and k are permuted alike, and the "
                      "rotation must pair the right features"),
          })])
def gguf_rope_layout() -> str:
    """Why do the GGUF file's W_Q and W_K load into the course's GPT without rope_halves_to_pairs?
    (a) SmolLM2 has no RoPE; (b) the order of the rows never matters; (c) the file stores Hugging Face's
    rotate-half order; (d) the file stores neighbour-pair order, the course's."""
    return "d"


@question(explain=N_("the vocabulary was learned mostly from English: a Korean syllable is 3 UTF-8 bytes and few "
                     "merges join them, so Korean text needs more tokens per character and costs more context and "
                     "time."),
          hints=[known_wrong({
              "a": N_("Korean has fewer characters per word, but each syllable is 3 UTF-8 bytes that few merges cover"),
              "b": N_("the model reads every token the same way; the count is fixed by the tokenizer"),
          })])
def korean_tokens() -> str:
    """Korean text takes more SmolLM2 tokens per character than English. Why? (a) Korean words are shorter;
    (b) the model reads Korean more slowly; (c) the merges were learned mostly from English and a Hangul
    syllable is 3 UTF-8 bytes."""
    return "c"


# ------------------------------------------------------------------ experiment

EXPERIMENT_WINDOWS = 64


def q4_1_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every 2-D weight (embeddings and matrices) replaced by its Q4_1 round trip, in place."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and p.shape[1] % quantize.BLOCK == 0:
                p.copy_(quantize.roundtrip(p, "Q4_1"))
    return model


@question(explain=N_("Q4_1 keeps 16 levels per block of 32 weights; on the 820,480-parameter character model that "
                     "costs about a hundredth of a nat on the fixed validation slice."),
          hints=[known_wrong({
              0.0: N_("the loss did not change: quantise the weights of the model you evaluate (p.copy_ inside "
                      "no_grad)"),
          })], atol=2e-3)
def q4_1_loss_increase() -> float:
    """Experiment: validation loss (nats, first 64 windows of the fixed slice) of the shipped Shakespeare
    model with all its 2-D weights Q4_1-quantised, minus the float32 model's; rounded to 3 decimals."""
    with torch_threads(1):
        model, tok = pretrained.load("shakespeare_char_small")
        before = pretrained.validation_loss(model, tok, windows=EXPERIMENT_WINDOWS)
        after = pretrained.validation_loss(q4_1_model(model), tok, windows=EXPERIMENT_WINDOWS)
    return round(after - before, 3)
