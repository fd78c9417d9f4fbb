"""``course doctor``: one OK/FAIL line per check of the learner's environment."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from course_utils import data, runtime

REQUIREMENTS = Path(__file__).resolve().parent.parent / "requirements.txt"


def requirement_lines(path: Path = REQUIREMENTS) -> list[Requirement]:
    """The package requirements of requirements.txt (comments and ``-e .`` skipped)."""
    reqs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement as exc:
            raise ValueError(f"{path}: cannot read requirement {line!r}: {exc}") from None
    return reqs


def check_requirement(req: Requirement) -> tuple[bool, str]:
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return False, (f"{req.name} is not installed (wanted {req.specifier}); "
                       "run: python -m pip install -r requirements.txt")
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        return False, f"{req.name} {version} is outside {req.specifier}"
    return True, f"{req.name} {version}"


def shown(path: Path) -> str:
    """A path with the home folder written as ~ (no user names in shared outputs)."""
    home = str(Path.home())
    return "~" + str(path)[len(home):] if str(path).startswith(home) else str(path)


def diagnose(fetch: bool) -> list[tuple[bool, str]]:
    """(ok, one line) per check of the environment: Python, packages, run mode, device, data cache."""
    results = [(sys.version_info >= (3, 10), f"Python {sys.version.split()[0]} (3.10 or newer)")]
    if REQUIREMENTS.exists():
        results += [check_requirement(r) for r in requirement_lines()]
    else:
        results.append((True, "requirements.txt not found next to course_utils (installed copy): packages not checked"))
    try:
        results.append((True, f"run mode {runtime.mode()} (COURSE_MODE)"))
    except ValueError as exc:
        results.append((False, str(exc)))
    results.append((True, f"device {runtime.device()}"))
    corpus = data.cache_dir() / data.CORPUS_FILE
    if corpus.exists() and data.sha256_of(corpus) == data.CORPUS_SHA256:
        results.append((True, f"course corpus cached in {shown(data.cache_dir())}"))
    elif fetch:
        try:
            data.shakespeare()
            results.append((True, f"course corpus downloaded to {shown(data.cache_dir())}"))
        except data.CorpusUnavailable as exc:
            results.append((False, str(exc).splitlines()[0] + " (see `course doctor --fetch` output above)"))
            print(exc, file=sys.stderr)
    else:
        results.append((True, f"course corpus not cached yet in {shown(data.cache_dir())}: "
                              "lesson 01 fetches it (or run `course doctor --fetch`)"))
    return results


def main(args: argparse.Namespace) -> int:
    results = diagnose(args.fetch)
    for ok, text in results:
        print(f"{'OK  ' if ok else 'FAIL'} {text}")
    return 0 if all(ok for ok, _ in results) else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check Python, packages, device, run mode and the data cache")
    p.add_argument("--fetch", action="store_true", help="download the course corpus if it is not cached")
    p.set_defaults(func=main)
