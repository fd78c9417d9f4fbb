"""The command line: ``course`` and its subcommands (doctor, run, assign, grade, train, sample, translate,
slides, chat), what learners and instructors use; the developers' tools are ``course-dev`` (``course_tools.dev``).

The modules of this package are the subcommands that run models and notebooks (``doctor``, ``run``,
``train``, ``sample``, ``chat``), the run-time tuning of training (``tuning``) and its processes
(``process_group``); ``assign``, ``grade``, ``translate`` and ``slides`` register from the subpackage
whose job they are (``exercises``, ``grading``, ``editions``). Every module registers its subcommand with
``add_parser(subparsers)``; ``errors`` turns a user's mistake into one line.
"""

from __future__ import annotations

import argparse
import sys

from course_tools.cli import chat, doctor, run, sample, train
from course_tools.editions import slides, translate
from course_tools.exercises import assign
from course_tools.grading import grade

# subcommand -> the module that registers it with add_parser(subparsers)
COMMANDS = {
    "doctor": doctor,
    "run": run,
    "assign": assign,
    "grade": grade,
    "train": train,
    "sample": sample,
    "translate": translate,
    "slides": slides,
    "chat": chat,
}
DESCRIPTION = ("The Transformer course's command: check the setup, run and grade the notebooks, train and "
               "sample a GPT, chat with SmolLM2, build slides. `course X --help` describes X.")


def command_parser(prog: str, description: str, commands: dict) -> argparse.ArgumentParser:
    """A command (``course``, ``course-dev``) with each module of ``commands`` registering its subcommand."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    sub = p.add_subparsers(dest="command", required=True)
    for module in commands.values():
        module.add_parser(sub)
    return p


def parser() -> argparse.ArgumentParser:
    """``course`` with every subcommand registered."""
    return command_parser("course", DESCRIPTION, COMMANDS)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
