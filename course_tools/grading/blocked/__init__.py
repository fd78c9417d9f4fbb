"""Stands in for ``course_tools.references`` inside the grading sandbox.

The grader mounts this folder over the reference implementations, so importing them from a
submission fails; the attempt leaves a mark that the grader reads and reports in the gradebook.
"""

from pathlib import Path

_MARK = Path("/job/out/references-import")
try:
    _MARK.touch()
except OSError:  # outside the sandbox (or its output folder is gone): nothing to mark
    pass
raise ImportError("the exercise references are not available while grading")
