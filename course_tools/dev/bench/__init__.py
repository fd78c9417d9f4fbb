"""``course-dev bench MODE``: the course's code timed against a reference, one mode per subcommand.

- ``cpu``: training tokens/s of the course's GPT and Hugging Face's GPT-2 at the same sizes, on the CPU;
- ``gpu``: GPT-2 small's training tokens/s and MFU on a CUDA device (and nanoGPT's ``model.py``);
- ``llama-cpp``: SmolLM2 decoding, the course's float32 GPT against llama.cpp's quantised kernels;
- ``group-sampling``: GRPO's G completions per prompt on SmolLM2, ``grpo.sample_group`` against Hugging Face's
  ``generate(num_return_sequences=G)``.

What the modes share (the reference model, the interleaved rounds, the median's interval, the load
average) is in ``shared``; each mode's module registers its subcommand with ``add_parser(modes)``.
"""

from __future__ import annotations

import argparse

from course_tools.dev.bench import cpu, gpu, group_sampling, llama_cpp


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course-dev bench`` and its modes."""
    p = sub.add_parser("bench", help="the course's GPT timed against a reference: on the CPU, on a CUDA device, "
                       "or decoding against llama.cpp")
    modes = p.add_subparsers(dest="mode", required=True)
    for mode in (cpu, gpu, llama_cpp, group_sampling):
        mode.add_parser(modes)
