"""``course-dev bench llama-cpp``: SmolLM2-135M-Instruct decoding, the course's GPT against llama.cpp.

Both read the same GGUF file and continue the same chat prompt greedily by the same number of tokens
on the same threads, prefill included, timed in one process and interleaved (the order alternating);
the result is the median over rounds with the load average. The course dequantises the file to float32
(538 MB read per token); llama.cpp multiplies its Q4_1 and Q8_0 blocks directly (about 100 MB), so at
a memory-bound step it reads about a fifth of the bytes. ``llama-cpp-python`` compiles llama.cpp when
installed (about 20 minutes on 2 cores), so it is not a dependency of the course and CI does not run this.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from course_tools.cli.errors import fail
from course_tools.dev.bench.shared import ROUNDS, at_least_one, interleave, load_average

PROG = "course-dev bench llama-cpp"
PROMPT = "What is the capital of France?"


def main(args: argparse.Namespace) -> int:
    """Print tokens/s of both, their ratio, and whether their greedy continuations agree."""
    try:
        llama_cpp = importlib.import_module("llama_cpp")
    except ImportError:
        return fail(PROG, ImportError("llama-cpp-python is not installed; `pip install llama-cpp-python` "
                                      "compiles llama.cpp (about 20 minutes on 2 cores) outside the course's extras"))
    from course_utils import chat, pretrained
    from course_utils.generate import generate

    threads = args.threads
    torch.set_num_threads(threads)
    try:
        path = pretrained.fetch(pretrained.SMOLLM2)
        model, tok = pretrained.load(pretrained.SMOLLM2)
    except (OSError, ValueError) as err:
        return fail(PROG, err)
    prompt = tok.encode(chat.apply_chat_template([{"role": "user", "content": PROMPT}]))
    n = args.new_tokens
    if not 1 <= n <= model.config.max_len - len(prompt):
        return fail(PROG, ValueError(f"--new-tokens must lie in 1..{model.config.max_len - len(prompt)}, got {n}"))

    def course() -> tuple[float, list[int]]:
        start = time.perf_counter()
        out = generate(model, torch.tensor([prompt]), n, temperature=0.0)
        return n / (time.perf_counter() - start), out[0, len(prompt):].tolist()

    def llama() -> tuple[float, list[int]]:
        # a fresh context each round (loaded before the clock starts): nothing cached, the prefill runs every time
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=len(prompt) + n, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
        start, out = time.perf_counter(), []
        for token in llm.generate(prompt, top_k=1, temp=0.0):
            out.append(token)
            if len(out) == n:
                break
        return n / (time.perf_counter() - start), out

    course(), llama()  # warm-up
    rounds, load_before = args.rounds, load_average()
    runs = interleave({"course": course, "llama.cpp": llama}, rounds)
    speeds = {name: [speed for speed, _ in results] for name, results in runs.items()}
    texts = {name: results[-1][1] for name, results in runs.items()}
    ratios = [a / b for a, b in zip(speeds["course"], speeds["llama.cpp"], strict=True)]
    same = next((i for i, (a, b) in enumerate(zip(texts["course"], texts["llama.cpp"], strict=True)) if a != b), n)
    print(f"SmolLM2-135M-Instruct, {n} new tokens after a {len(prompt)}-token prompt, {threads} threads, "
          f"load average {load_before} before and {load_average()} after, "
          f"median of {rounds} interleaved rounds")
    for name, values in speeds.items():
        print(f"  {name:<10} {statistics.median(values):6.1f} tokens/s (from {min(values):.1f} to {max(values):.1f})")
    print(f"  course / llama.cpp: median {statistics.median(ratios):.2f} (from {min(ratios):.2f} to {max(ratios):.2f})")
    print(f"  greedy continuations agree for the first {same} of {n} tokens")
    print(f"  course:    {tok.decode(texts['course'][:24])!r}")
    print(f"  llama.cpp: {tok.decode(texts['llama.cpp'][:24])!r}")
    ours, theirs = first_logits(model, llama_cpp.Llama(model_path=str(path), n_ctx=len(prompt), n_threads=threads,
                                                         verbose=False, logits_all=True), prompt)
    print(f"  after the prompt: max |logit difference| {float((ours - theirs).abs().max()):.2f}; "
          f"top two, course {top_two(tok, ours)}, llama.cpp {top_two(tok, theirs)}")
    return 0


def first_logits(model: torch.nn.Module, llm, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token logits (V,) after ``prompt`` from the course's float32 model and from llama.cpp, whose
    quantised dot products also round the activations to 8 bits, so the two differ by more than float32 does."""
    with torch.no_grad():
        ours = model(torch.tensor([prompt]))[0][0, -1]
    llm.eval(prompt)
    return ours, torch.tensor(llm.scores[len(prompt) - 1], dtype=ours.dtype)


def top_two(tok, logits: torch.Tensor) -> str:
    """The two likeliest next tokens and their probabilities, e.g. "'The' 0.152, 'L' 0.140"."""
    p, ids = logits.softmax(-1).topk(2)
    return ", ".join(f"{tok.decode([int(i)])!r} {float(q):.3f}" for q, i in zip(p, ids, strict=True))


def add_parser(modes: argparse._SubParsersAction) -> None:
    """Register ``course-dev bench llama-cpp``."""
    p = modes.add_parser("llama-cpp", help="SmolLM2 decoding tokens/s: the course's float32 GPT vs llama.cpp's Q4_1 "
                         "kernels on the same file (needs llama-cpp-python, built outside the course)")
    p.add_argument("--threads", type=at_least_one, default=1, metavar="N", help="threads of both (default 1)")
    p.add_argument("--new-tokens", type=at_least_one, default=64, metavar="N", help="tokens to decode (default 64)")
    p.add_argument("--rounds", type=at_least_one, default=ROUNDS, metavar="N",
                   help=f"interleaved rounds (default {ROUNDS})")
    p.set_defaults(func=main)
