"""The library's type hints are checked: mypy on course_utils, with the settings of pyproject.toml's
[tool.mypy] (check_untyped_defs: the bodies of unannotated functions too), must find no error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mypy(*args: str) -> subprocess.CompletedProcess:
    """mypy with the project's configuration, from the repository root (its cache is .mypy_cache/)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_library_type_checks():
    done = mypy()
    assert done.returncode == 0, f"mypy found errors in course_utils:\n{done.stdout}{done.stderr}"
    assert "no issues found" in done.stdout


def test_the_checker_reads_unannotated_functions_too(tmp_path):
    """The configuration is meaningful: an error inside a function without annotations is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def lengths():\n    n: int = 'three'\n    return n\n", encoding="utf-8")
    done = mypy("--cache-dir", str(tmp_path / "cache"), str(bad))
    assert done.returncode == 1 and "Incompatible types in assignment" in done.stdout, done.stdout
