"""The ``course`` command: doctor, run, assign, grade, train, sample."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> "module:function" that registers it, called as function(subparsers)
COMMANDS = {
    "doctor": "course_tools.doctor:add_parser",
    "run": "course_tools.notebook_run:add_parser",
    "assign": "course_tools.assign:add_parser",
    "grade": "course_tools.grade:add_parser",
    "train": "course_utils.train:add_parser",
    "sample": "course_utils.train:add_sample_parser",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for spec in COMMANDS.values():
        module, function = spec.split(":")
        getattr(importlib.import_module(module), function)(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
