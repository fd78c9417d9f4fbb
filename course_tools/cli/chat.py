"""``course chat``: talk to SmolLM2-135M-Instruct running in the course's own GPT (lesson 12).

One prompt (``--prompt``) prints one streamed answer; without it, an interactive loop keeps the
conversation until an empty line, ``exit`` or end of input. Decoding is greedy unless
``--temperature`` is above 0; ``--top-k`` and ``--top-p`` then narrow the draw. ``--adapter``
puts LoRA adapters saved with ``course_utils.lora.save_adapter`` (lesson 13) on the model and
merges them, so the adapted model decodes as fast as the original.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from course_tools.cli.errors import USER_ERRORS, fail
from course_tools.cli.sample import SEED, TOP_K, TOP_P
from course_utils import chat, lora, pretrained
from course_utils.pretrained import ModelUnavailable

PROG = "course chat"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course chat``."""
    p = sub.add_parser("chat", help="chat with SmolLM2-135M-Instruct in the course's own GPT (lesson 12)")
    p.add_argument("--prompt", help="one question to answer; without it, an interactive conversation")
    p.add_argument("--system", default=chat.DEFAULT_SYSTEM, help="the system message")
    p.add_argument("--model", help="a LLaMA-architecture GGUF file (default: SmolLM2-135M-Instruct, fetched once)")
    p.add_argument("--adapter", type=Path, help="LoRA adapters for this model (lesson 13's lora.save_adapter)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="most tokens in one answer")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (the default) is greedy decoding")
    p.add_argument("--top-k", type=int, help=TOP_K)
    p.add_argument("--top-p", type=float, help=TOP_P)
    p.add_argument("--seed", type=int, default=0, help=SEED)
    p.add_argument("--threads", type=int, help="PyTorch threads (default: PyTorch's choice)")
    p.set_defaults(func=run)


def _text(value: str, what: str) -> str:
    """``value`` if it is valid UTF-8 text; command lines and terminals deliver undecodable bytes as surrogates."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        byte = ord(value[err.start]) & 0xFF
        raise ValueError(f"the {what} holds the byte 0x{byte:02x}, which is not UTF-8; "
                         "write it in UTF-8 (e.g. iconv -t UTF-8, or set LANG=C.UTF-8)") from None
    return value


def _answer(model, tokenizer, messages: list[dict[str, str]], args: argparse.Namespace) -> str:
    """Stream one answer to stdout and return it."""
    pieces = []
    for piece in chat.reply(model, tokenizer, messages, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed):
        print(piece, end="", flush=True)
        pieces.append(piece)
    print()
    return "".join(pieces)


def _lines():
    """The user's lines from stdin, decoded strictly as UTF-8."""
    while True:
        if sys.stdin.isatty():
            print("> ", end="", flush=True)
        raw = sys.stdin.buffer.readline()
        if not raw:
            return
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as err:
            raise ValueError(f"the input holds the byte 0x{raw[err.start]:02x}, which is not UTF-8; "
                             "type or pipe UTF-8 text (e.g. iconv -t UTF-8, or set LANG=C.UTF-8)") from None


def run(args: argparse.Namespace) -> int:
    """``course chat``: load the model, then answer one prompt or converse."""
    try:
        if args.max_new_tokens <= 0:
            raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        system = _text(args.system, "system message")
        prompt = None if args.prompt is None else _text(args.prompt, "prompt")  # checked before the slow load
        if args.adapter is not None and not args.adapter.is_file():
            raise FileNotFoundError(f"no adapter file at {args.adapter}; save one with lora.save_adapter(model, path)")
        model, tokenizer = (pretrained.load_gguf(args.model) if args.model
                            else pretrained.load(pretrained.SMOLLM2))
        if args.adapter is not None:
            lora.load_adapter(model, args.adapter)  # a file saved for another model: one-line AdapterError
            lora.merge_lora(model.requires_grad_(False))
        messages = [{"role": "system", "content": system}]
        if prompt is not None:
            messages.append({"role": "user", "content": prompt})
            _answer(model, tokenizer, messages, args)
            return 0
        for line in _lines():
            if line.strip() in ("", "exit", "quit"):
                break
            messages.append({"role": "user", "content": line})
            messages.append({"role": "assistant", "content": _answer(model, tokenizer, messages, args)})
    except (*USER_ERRORS, ModelUnavailable) as err:
        return fail(PROG, err)
    except KeyboardInterrupt:
        print()
        return 130
    return 0
