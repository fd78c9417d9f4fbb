"""The ``course`` command: doctor, run, assign, grade, train, sample, bench."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that provides add_parser(subparsers)
COMMANDS = {
    "doctor": "course_utils.doctor",
    "run": "course_utils.notebook_run",
    "assign": "course_utils.assign",
    "grade": "course_utils.grade",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
