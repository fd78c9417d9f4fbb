"""Write the `course` command reference, ``docs/pages/commands.md``, from the command line's own parser.

``python docs/commands.py`` (``--check``: write nothing, exit 1 if the page differs from what the parser says;
tests/test_site.py runs it). Every subcommand of ``course_tools.cli.COMMANDS``, its help line, and each of
its arguments with its help text and default: the page cannot drift from ``course X --help``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "pages" / "commands.md"
INTRO = """# The `course` command

Generated from the command line's parser by `python docs/commands.py` (edit the `add_parser` functions
instead; `tests/test_site.py` fails when this page is out of date). `course X --help` says the same.
Installed with the course (`python -m pip install .`); from a source checkout without installing, run
`PYTHONPATH=. python -m course_tools.cli X`.
"""


def subcommands() -> tuple[dict[str, argparse.ArgumentParser], dict[str, str]]:
    """Each subcommand's parser, built as ``course`` builds them, and its help line."""
    sys.path.insert(0, str(ROOT))
    from course_tools.cli import COMMANDS

    sub = argparse.ArgumentParser(prog="course").add_subparsers(dest="command")
    for module in COMMANDS.values():
        module.add_parser(sub)
    return dict(sub.choices), {a.dest: a.help for a in sub._choices_actions}


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
    text = (action.help or "") % {"default": default, "prog": "course"}
    if action.choices and "choices" not in text:
        text += f" (one of {', '.join(map(str, action.choices))})"
    if action.option_strings and action.nargs != 0 and default not in (None, argparse.SUPPRESS) \
            and "default" not in text:
        text += f" (default {default})"
    return written, text.replace("|", "\\|")


def page() -> str:
    parsers, helps = subcommands()
    parts = [INTRO]
    for name, parser in parsers.items():
        rows = [argument(a) for a in parser._actions
                if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        table = "\n".join(f"| {written} | {text} |" for written, text in rows)
        parts.append(f"## `course {name}`\n\n{helps[name]}.\n\n| argument | what it does |\n|---|---|\n{table}\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write docs/pages/commands.md from the `course` parser.")
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
