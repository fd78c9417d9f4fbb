"""The ``course`` command: doctor, run, assign, grade, train, sample, bench, translate, slides."""

from __future__ import annotations

import argparse
import sys

from course_tools import assign, doctor, grade, notebook_run, slides, translate
from course_tools.commands import bench, chat, sample, train

# subcommand -> the module that registers it with add_parser(subparsers)
COMMANDS = {
    "doctor": doctor,
    "run": notebook_run,
    "assign": assign,
    "grade": grade,
    "train": train,
    "sample": sample,
    "bench": bench,
    "translate": translate,
    "slides": slides,
    "chat": chat,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
