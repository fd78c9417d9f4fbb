"""``course-dev bench group-sampling``: GRPO's group sampling on SmolLM2-135M-Instruct, the course's
``grpo.sample_group`` against Hugging Face's ``generate(num_return_sequences=G)``.

Both read the same GGUF file (dequantised to float32), sample G completions of each of the same P prompts
at temperature 1 with no top-k or top-p, exactly ``--new-tokens`` tokens each (Hugging Face's
``min_new_tokens`` keeps the end token away, and the course's sampler is given no stop token), on the
same threads, prefill included. The course runs each prompt once and repeats its KV cache G times;
``generate`` repeats each prompt G times before its prefill. Each round times one call of each, the
order alternating; the result is the median over rounds of tokens/s, the ratio course / Hugging Face
with its distribution-free 95% interval and its range, and the load average before and after. A greedy
check first: both continue the first prompt greedily and must agree (parity of the two models, not a
timing). Needs ``transformers`` (the lesson12 extra).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from course_tools.cli.errors import fail
from course_tools.dev.bench.shared import ROUNDS, at_least_one, interleave, load_average, median_interval

PROG = "course-dev bench group-sampling"
QUESTIONS = ["What is 17 + 25?", "Name a prime number larger than 10.", "What is the capital of France?",
             "Spell the word cat backwards.", "How many legs does a spider have?", "What is 9 times 6?",
             "What colour is the sky on a clear day?", "Which planet is closest to the sun?"]


def prompts_of(tok, P: int) -> torch.Tensor:
    """(P, T) chat-templated questions of one length: each cut to the last T tokens of the shortest, so that
    one batch holds them (the templates share their opening, so the cut takes only the system prompt's start)."""
    from course_utils import chat

    ids = [tok.encode(chat.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS[:P]]
    T = min(len(i) for i in ids)
    return torch.tensor([i[-T:] for i in ids])


def main(args: argparse.Namespace) -> int:
    """Print tokens/s of both, their ratio, and whether their greedy continuations agree."""
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        return fail(PROG, ImportError("transformers is not installed; pip install -e \".[lesson12]\" installs it"))
    from course_utils import chat, grpo, pretrained

    if args.prompts > len(QUESTIONS):
        return fail(PROG, ValueError(f"--prompts must lie in 1..{len(QUESTIONS)}, got {args.prompts}"))
    torch.set_num_threads(args.threads)
    try:
        path = pretrained.fetch(pretrained.SMOLLM2)
        model, tok = pretrained.load(pretrained.SMOLLM2)
        hf = transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    except (OSError, ValueError) as err:
        return fail(PROG, err)
    prompts, G, n = prompts_of(tok, args.prompts), args.G, args.new_tokens
    if prompts.shape[1] + n > model.config.max_len:
        return fail(PROG, ValueError(f"--new-tokens must be at most {model.config.max_len - prompts.shape[1]}"))
    tokens = prompts.shape[0] * G * n
    seed = iter(range(10**6))

    def course() -> float:
        start = time.perf_counter()
        sample = grpo.sample_group(model, prompts, G, n, temperature=1.0, seed=next(seed))
        seconds = time.perf_counter() - start
        assert sample.completions.shape == (prompts.shape[0] * G, n)
        return tokens / seconds

    @torch.no_grad()
    def hugging_face() -> float:
        torch.manual_seed(next(seed))
        start = time.perf_counter()
        out = hf.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                          temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n,
                          num_return_sequences=G, pad_token_id=tok.token_id(chat.END))
        seconds = time.perf_counter() - start
        assert out.shape == (prompts.shape[0] * G, prompts.shape[1] + n)
        return tokens / seconds

    with torch.no_grad():
        ours = grpo.sample_group(model, prompts[:1], 1, n, temperature=0.0).completions[0].tolist()
        theirs = hf.generate(input_ids=prompts[:1], attention_mask=torch.ones_like(prompts[:1]), do_sample=False,
                             max_new_tokens=n, pad_token_id=tok.token_id(chat.END))  # it stops at <|im_end|>
    theirs = theirs[0, prompts.shape[1]:].tolist()
    shared = min(len(ours), len(theirs))
    same = next((i for i in range(shared) if ours[i] != theirs[i]), shared)
    course(), hugging_face()  # warm-up
    load_before = load_average()
    runs = interleave({"course": course, "Hugging Face": hugging_face}, args.rounds)
    ratios = [a / b for a, b in zip(runs["course"], runs["Hugging Face"], strict=True)]
    low, high = median_interval(ratios)
    print(f"SmolLM2-135M-Instruct, {prompts.shape[0]} prompts of {prompts.shape[1]} tokens, G = {G}, {n} new tokens "
          f"each, {args.threads} threads, load average {load_before} before and {load_average()} after, "
          f"{args.rounds} interleaved rounds")
    print(f"  greedy continuations of the first prompt agree for the first {same} of {len(theirs)} tokens "
          f"(Hugging Face's stops at the end token)")
    for name, values in runs.items():
        print(f"  {name:<13} {statistics.median(values):7.1f} tokens/s (from {min(values):.1f} to {max(values):.1f})")
    print(f"  course / Hugging Face: median {statistics.median(ratios):.3f} (95% interval {low:.3f}-{high:.3f}; "
          f"from {min(ratios):.3f} to {max(ratios):.3f})")
    return 0


def add_parser(modes: argparse._SubParsersAction) -> None:
    """Register ``course-dev bench group-sampling``."""
    p = modes.add_parser("group-sampling", help="GRPO's group sampling on SmolLM2, tokens/s: the course's "
                         "grpo.sample_group vs Hugging Face's generate(num_return_sequences=G)")
    p.add_argument("--threads", type=at_least_one, default=1, metavar="N", help="threads of both (default 1)")
    p.add_argument("--prompts", type=at_least_one, default=2, metavar="P",
                   help=f"prompts per call, at most {len(QUESTIONS)} (default 2)")
    p.add_argument("--G", type=at_least_one, default=8, metavar="G", help="completions per prompt (default 8)")
    p.add_argument("--new-tokens", type=at_least_one, default=32, metavar="N",
                   help="tokens each completion writes (default 32)")
    p.add_argument("--rounds", type=at_least_one, default=ROUNDS, metavar="N",
                   help=f"interleaved rounds (default {ROUNDS})")
    p.set_defaults(func=main)
