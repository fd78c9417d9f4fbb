"""``course doctor``: one line per check of the learner's environment.

FAIL means a lesson cannot run (a package every lesson needs is missing or too old); NOTE marks a
package that only some lessons, or only developers and instructors, need, and a missing system tool
(bubblewrap for `course grade`, Node.js and npm for the website, Chromium for its browser check).
Every fix names a command pip acts on: an extra as `".[lesson01]"` in a source checkout, otherwise
the requirement without its environment marker (pip ignores `gensim; extra == "lesson01"`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from packaging.requirements import Requirement

from course_utils import data, pretrained, runtime

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
DIST = "transformer-course"
OK, FAIL, NOTE = "OK", "FAIL", "NOTE"


class Check(NamedTuple):
    """One line of the report: OK, FAIL (the lessons cannot run) or NOTE (an optional package is missing)."""

    status: str
    text: str


def declared() -> dict[str, list[Requirement]]:
    """The course's requirements by group: "" is what every lesson needs, other keys are extras.

    A source checkout's pyproject.toml is the truth there (its installed metadata may be older);
    an installed copy reads its own metadata.
    """
    if PYPROJECT.exists() and sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads(PYPROJECT.read_text())["project"]
        groups = {"": project["dependencies"], **project["optional-dependencies"]}
        return {group: [Requirement(line) for line in lines] for group, lines in groups.items()}
    try:
        lines = [Requirement(line) for line in metadata.requires(DIST) or []]
        extras = metadata.metadata(DIST).get_all("Provides-Extra") or []
    except metadata.PackageNotFoundError:
        raise ValueError(f"{DIST} is not installed: run python -m pip install . in the course folder") from None
    groups = {"": [r for r in lines if r.marker is None]}
    for extra in extras:
        groups[extra] = [r for r in lines if r.marker is not None and r.marker.evaluate({"extra": extra})]
    return groups


def requirement_groups() -> dict[str, tuple[Requirement, list[str]]]:
    """Each package once per version range it is asked for in, with the extras that ask for it in that
    range (empty: every lesson needs it). Keyed by the package's name, or ``name<6,>=5`` for a second
    range (lesson 12 needs a newer transformers than lessons 06-09, so that is checked on its own)."""
    found: dict[str, tuple[Requirement, list[str]]] = {}
    for group, reqs in declared().items():
        for req in reqs:
            if req.name == DIST:  # an extra made of other extras
                continue
            first = found.get(req.name)
            key = req.name if first is None or first[0].specifier == req.specifier else f"{req.name}{req.specifier}"
            if key not in found:
                found[key] = (req, [])
            if group:
                found[key][1].append(group)
            else:
                found[key] = (req, [])
    return dict(sorted(found.items(), key=lambda item: rank(item[1][1])))


def rank(extras: list[str]) -> int:
    """Report order: what every lesson needs, then each lesson's extras, then the developer tools."""
    return 0 if not extras else 2 if purpose(extras) == "developer tool" else 1


def purpose(extras: list[str]) -> str:
    """Who needs an optional package, e.g. "lessons 06, 07" or "developer tool"."""
    lessons = [e.removeprefix("lesson") for e in extras if e.startswith("lesson") and e[6:].isdigit()]
    return f"lesson{'s' if len(lessons) > 1 else ''} {', '.join(lessons)}" if lessons else "developer tool"


def install_command(req: Requirement, extras: list[str] = ()) -> str:
    """The pip command that installs `req`: the smallest extra asking for it (``".[lesson07]"``, run in
    the course folder) when this is a source checkout, else the requirement itself without its marker."""
    if extras and PYPROJECT.exists():
        groups = declared()
        extra = min(extras, key=lambda e: (len(groups.get(e, [])), e))
        return f'python -m pip install ".[{extra}]"'
    bare = Requirement(str(req))
    bare.marker = None
    return f"python -m pip install '{bare}'"


def check_requirement(req: Requirement, extras: list[str] = ()) -> Check:
    """OK if installed within its range; a missing or out-of-range extra is a NOTE, a needed package a FAIL."""
    if not extras:
        bad, why = FAIL, ""
    elif purpose(extras) == "developer tool":
        bad, why = NOTE, ": a developer and instructor tool (tests, JupyterLab, website), not needed for the lessons"
    else:
        bad, why = NOTE, f": needed for {purpose(extras)} only"
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return Check(bad, f"{req.name} is not installed{why}; run: {install_command(req, extras)}")
    if req.specifier and not req.specifier.contains(version, prereleases=True):
        return Check(bad, f"{req.name} {version} is outside {req.specifier}{why}; run: {install_command(req, extras)}")
    return Check(OK, f"{req.name} {version}" + (f" ({purpose(extras)})" if extras else ""))


# system programs some tasks need (never the lessons): program -> (what needs it, how to install it)
TOOLS = {
    "bwrap": ("bubblewrap, the sandbox of `course grade`", "apt-get install bubblewrap"),
    "node": ("Node.js, for building the website (python docs/build.py)", "apt-get install nodejs npm"),
    "npm": ("npm, for building the website (python docs/build.py)", "apt-get install nodejs npm"),
    "chromium": ("Chromium, for the website's browser check (docs/browser_check.py)", "apt-get install chromium"),
}


def check_tool(program: str) -> Check:
    """OK when `program` is on PATH, else a NOTE saying who needs it and how to install it."""
    what, install = TOOLS[program]
    if shutil.which(program):
        return Check(OK, f"{program} found: {what}")
    return Check(NOTE, f"{program} not found: {what}, not needed for the lessons; install: {install}")


def shown(path: Path) -> str:
    """A path with the home folder written as ~ (no user names in shared outputs)."""
    home = str(Path.home())
    return "~" + str(path)[len(home):] if str(path).startswith(home) else str(path)


def diagnose(fetch: bool) -> list[Check]:
    """Python, every declared package, the system tools, run mode, device and the data cache, one Check each."""
    results = [Check(OK if sys.version_info >= (3, 10) else FAIL, f"Python {sys.version.split()[0]} (3.10 or newer)")]
    try:
        results += [check_requirement(req, extras) for req, extras in requirement_groups().values()]
    except ValueError as exc:
        results.append(Check(FAIL, str(exc)))
    results += [check_tool(program) for program in TOOLS]
    try:
        results.append(Check(OK, f"run mode {runtime.mode()} (COURSE_MODE)"))
    except ValueError as exc:
        results.append(Check(FAIL, str(exc)))
    results.append(Check(OK, f"device {runtime.device()}"))
    corpus = data.cache_dir() / data.CORPUS_FILE
    if corpus.exists() and data.sha256_of(corpus) == data.CORPUS_SHA256:
        results.append(Check(OK, f"course corpus cached in {shown(data.cache_dir())}"))
    elif fetch:
        try:
            data.shakespeare()
            results.append(Check(OK, f"course corpus downloaded to {shown(data.cache_dir())}"))
        except data.CorpusUnavailable as exc:
            results.append(Check(FAIL, str(exc).splitlines()[0] + " (see `course doctor --fetch` output above)"))
            print(exc, file=sys.stderr)
    else:
        results.append(Check(OK, f"course corpus not cached yet in {shown(data.cache_dir())}: "
                                 "lesson 01 fetches it (or run `course doctor --fetch`)"))
    model = pretrained.FETCHED[pretrained.SMOLLM2]
    cached = (pretrained.models_dir() / model.filename).is_file()
    where = f"in {shown(pretrained.models_dir())}" + ("" if cached else ": lesson 12 fetches it (93 MB)")
    results.append(Check(OK, f"SmolLM2-135M-Instruct (lesson 12) {'cached' if cached else 'not cached yet'} {where}"))
    return results


def main(args: argparse.Namespace) -> int:
    results = diagnose(args.fetch)
    for status, text in results:
        print(f"{status:<4} {text}")
    return 0 if all(status != FAIL for status, _ in results) else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check Python, packages (needed, per lesson, developer tools), "
                                      "system tools, device, run mode and the data cache")
    p.add_argument("--fetch", action="store_true", help="download the course corpus if it is not cached")
    p.set_defaults(func=main)
