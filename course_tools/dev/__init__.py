"""The developer tools: ``course-dev`` and its subcommands, which learners and instructors never need.

- ``bench``: the course's code timed against a reference (``course-dev bench cpu|gpu|llama-cpp``);
- ``gpu-check``: every GPU path of the course proven on one CUDA device in one call.

The learners' command is ``course`` (``course_tools.cli``); this package uses it (its one-line
``errors``, the MFU peaks of ``tuning``, its subcommands run in processes of their own), never the
other way round. Every module registers its subcommand with ``add_parser(subparsers)``.
"""

from __future__ import annotations

import argparse
import sys

from course_tools.cli import command_parser
from course_tools.dev import bench, gpu_check

# subcommand -> the module that registers it with add_parser(subparsers)
COMMANDS = {"bench": bench, "gpu-check": gpu_check}
DESCRIPTION = ("The Transformer course's developer tools: benchmarks against reference implementations and the "
               "one-call GPU check. `course-dev X --help` describes X.")


def parser() -> argparse.ArgumentParser:
    """``course-dev`` with every subcommand registered."""
    return command_parser("course-dev", DESCRIPTION, COMMANDS)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
