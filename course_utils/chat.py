"""Chatting with an instruction-tuned model: the ChatML template and streamed decoding.

A chat model was fine-tuned on conversations written in one fixed format, so it answers only when
the prompt is written the same way. SmolLM2 uses ChatML: every message is
``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``; a conversation that does not open with a system message
gets the default one; and the prompt ends with ``<|im_start|>assistant\\n``, the header of the
reply the model is to write. The model ends its reply with ``<|im_end|>``.

``stream_ids`` decodes with the course's KV cache and sampler (``course_utils.generate``'s rules);
``stream_text`` turns those ids into text as soon as they form whole characters, since one token can
hold half of a Korean syllable's UTF-8 bytes.

Shapes: ``T`` prompt tokens, ``V`` vocabulary.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from course_utils.attention import ModelKVCache
from course_utils.generate import sample_next

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
ROLES = ("system", "user", "assistant")
START, END = "<|im_start|>", "<|im_end|>"


def apply_chat_template(messages: Sequence[dict[str, str]], add_generation_prompt: bool = True,
                        default_system: str = DEFAULT_SYSTEM) -> str:
    """The ChatML text of a conversation: ``[{"role": "user", "content": "Hi"}]`` -> the prompt string."""
    parts = []
    for i, message in enumerate(messages):
        if set(message) != {"role", "content"} or message["role"] not in ROLES:
            raise ValueError(f"message {i} must be {{'role': one of {', '.join(ROLES)}, 'content': str}}, "
                             f"got {message!r}")
        if i == 0 and message["role"] != "system":
            parts.append(f"{START}system\n{default_system}{END}\n")
        parts.append(f"{START}{message['role']}\n{message['content']}{END}\n")
    if add_generation_prompt:
        parts.append(f"{START}assistant\n")
    return "".join(parts)


@torch.no_grad()
def stream_ids(model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int, stop_token: int | None = None,
               temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
               seed: int | None = None) -> Iterator[int]:
    """Yield the ids the model writes after ``prompt`` (T ids), one at a time, reusing a KV cache.

    Temperature 0 is greedy. Stops after ``max_new_tokens`` or at ``stop_token`` (not yielded).
    The prompt and the reply must fit in ``model.config.max_len`` positions.
    """
    if not prompt:
        raise ValueError("the prompt is empty; encode some text first")
    config: Any = model.config  # a GPT's, or any config with max_len and n_layers
    if len(prompt) + max_new_tokens > config.max_len:
        raise ValueError(f"the prompt ({len(prompt)} tokens) plus {max_new_tokens} new tokens exceed the context "
                         f"of {config.max_len} tokens; shorten the prompt or lower --max-new-tokens")
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    cache = ModelKVCache(config.n_layers)
    was_training = model.training
    model.eval()
    try:
        new = torch.tensor([list(prompt)], device=device)  # (1, T): the whole prompt in one forward (prefill)
        for _ in range(max_new_tokens):
            logits, _ = model(new, kv_cache=cache)
            token = int(sample_next(logits[:, -1, :], temperature, top_k, top_p, generator))
            if token == stop_token:
                return
            yield token
            new = torch.tensor([[token]], device=device)
    finally:
        model.train(was_training)


def stream_text(tokenizer, ids: Iterator[int]) -> Iterator[str]:
    """Turn a stream of token ids into a stream of text pieces, each made of whole characters.

    Bytes that do not yet form a character wait for the next token; invalid bytes become U+FFFD.
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for token in ids:
        piece = decoder.decode(tokenizer.token_bytes(token))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def reply(model: torch.nn.Module, tokenizer, messages: Sequence[dict[str, str]], max_new_tokens: int = 128,
          **sampling) -> Iterator[str]:
    """Stream the assistant's answer to a conversation (ChatML prompt, stop at ``<|im_end|>``)."""
    prompt = tokenizer.encode(apply_chat_template(messages))
    stop = tokenizer.token_id(END)
    return stream_text(tokenizer, stream_ids(model, prompt, max_new_tokens, stop, **sampling))
