"""``course sample``: continue a prompt with a checkpoint written by ``course train``, on ``runtime.device()``."""

from __future__ import annotations

import argparse

import torch

from course_tools.cli.errors import USER_ERRORS, fail
from course_utils import runtime, train
from course_utils.generate import generate

PROG = "course sample"
TOP_K = "sample only from the k most likely tokens (default: all)"
TOP_P = "sample only from the most likely tokens whose probabilities add up to p (default: all)"
SEED = "seed of the sampler: the same seed gives the same text"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course sample``."""
    p = sub.add_parser("sample", help="generate text from a checkpoint written by course train")
    p.add_argument("--ckpt", required=True, help="path of ckpt.pt")
    p.add_argument("--prompt", default="\n", help="text the samples continue (default: a line break)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens generated per sample")
    p.add_argument("--num-samples", type=int, default=1, help="independent samples of the same prompt")
    p.add_argument("--temperature", type=float, default=0.8, help="logits divided by this before sampling")
    p.add_argument("--top-k", type=int, help=TOP_K)
    p.add_argument("--top-p", type=float, help=TOP_P)
    p.add_argument("--seed", type=int, default=0, help=SEED)
    p.set_defaults(func=run)


def samples(args: argparse.Namespace) -> list[str]:
    """The continuations of the prompt, one per sample."""
    device = runtime.device()
    model, tokenizer = train.load_model(args.ckpt, device)
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character, e.g. --prompt '\\n'")
    idx = torch.tensor([prompt] * args.num_samples, device=device)
    out = generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed)
    return [tokenizer.decode(row) for row in out.tolist()]


def run(args: argparse.Namespace) -> int:
    """``course sample``: print each sample, then a rule."""
    try:
        texts = samples(args)
    except USER_ERRORS as err:
        return fail(PROG, err)
    for text in texts:
        print(text)
        print("-" * 40)
    return 0
