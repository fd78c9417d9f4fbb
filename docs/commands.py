"""Write the command reference, ``docs/pages/commands.md``, from the command lines' own parsers.

``python docs/commands.py`` (``--check``: write nothing, exit 1 if the page differs from what the parsers say;
tests/test_site.py runs it). Both entry points, ``course`` (learners and instructors, ``course_tools.cli``)
and ``course-dev`` (developers, ``course_tools.dev``): every command down to the last subcommand
(``course-dev bench cpu``), its help line, and each of its arguments with its help text and default:
the page cannot drift from ``course X --help``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "pages" / "commands.md"
INTRO = """# The `course` and `course-dev` commands

Generated from the command lines' parsers by `python docs/commands.py` (edit the `add_parser` functions
instead; `tests/test_site.py` fails when this page is out of date). `course X --help` says the same.
Both are installed with the course (`python -m pip install .`); from a source checkout without installing,
run `PYTHONPATH=. python -m course_tools.cli X` (`course`) or `PYTHONPATH=. python -m course_tools.dev X`
(`course-dev`).
"""
# entry point -> who it is for, the heading of its part of the page
AUDIENCE = {"course": "learners and instructors", "course-dev": "developers"}


def entry_points() -> list[argparse.ArgumentParser]:
    """The parsers of ``course`` and ``course-dev``, built as the commands build them."""
    sys.path.insert(0, str(ROOT))
    from course_tools import cli, dev

    return [cli.parser(), dev.parser()]


def commands(parser: argparse.ArgumentParser, help_line: str = "") -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every command ``parser`` takes, as one types it (``course-dev bench cpu``) -> its parser and help
    line; a command with subcommands of its own is listed by them."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {parser.prog: (parser, help_line)}
    helps = {a.dest: a.help for a in subs[0]._choices_actions}
    return {words: found for name, child in subs[0].choices.items()
            for words, found in commands(child, helps[name]).items()}


def argument(action: argparse.Action) -> tuple[str, str]:
    """(how it is written, what it does) for one argument, with its default when it has one."""
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    takes = "" if action.nargs == 0 else f" {metavar}" + (" …" if action.nargs in ("+", "*") else "")
    written = ", ".join(f"`{flag}{takes}`" for flag in action.option_strings) or f"`{metavar}`" + \
        (" …" if action.nargs in ("+", "*") else "")
    default = action.default
    if isinstance(default, str) and not default.isprintable():  # e.g. a line break: show it as Python writes it
        default = repr(default)
    if isinstance(default, (str, Path)) and str(default).startswith(str(ROOT)):  # the checkout's own folder
        default = Path(default).relative_to(ROOT).as_posix() or "."
    text = (action.help or "") % {"default": default}
    if action.choices and "choices" not in text:
        text += f" (one of {', '.join(map(str, action.choices))})"
    if action.option_strings and action.nargs != 0 and default not in (None, argparse.SUPPRESS) \
            and "default" not in text:
        text += f" (default {default})"
    return written, text.replace("|", "\\|")


def page() -> str:
    parts = [INTRO]
    for entry in entry_points():
        parts.append(f"## `{entry.prog}`: for {AUDIENCE[entry.prog]}\n\n{entry.description}\n")
        for words, (parser, help_line) in commands(entry).items():
            rows = [argument(a) for a in parser._actions
                    if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
            table = "\n".join(f"| {written} | {text} |" for written, text in rows)
            parts.append(f"### `{words}`\n\n{help_line}.\n\n| argument | what it does |\n|---|---|\n{table}\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/pages/commands.md from the `course` and `course-dev` "
                                     "parsers.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is out of date")
    args = parser.parse_args(argv)
    text = page()
    if args.check:
        current = PAGE.exists() and PAGE.read_text(encoding="utf-8") == text
        print(f"{PAGE.relative_to(ROOT)} is {'current' if current else 'out of date: run python docs/commands.py'}")
        return 0 if current else 1
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
