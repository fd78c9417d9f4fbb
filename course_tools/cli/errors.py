"""One-line errors for the ``course`` subcommands: a user's mistake (a missing, unreadable or wrong file,
a text too short, a bad duration) ends in one line that names the fix, not in a traceback;
``USER_ERRORS`` are the exceptions that carry such a line."""

from __future__ import annotations

import sys

from course_utils.data import CorpusUnavailable

# FileNotFoundError/PermissionError (OSError), bad values and CheckpointError (ValueError), no corpus
USER_ERRORS = (OSError, ValueError, CorpusUnavailable)


def fail(prog: str, err: BaseException) -> int:
    """Print ``err`` as ``prog: error: message`` on stderr; the exit status of a usage error (2)."""
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2
