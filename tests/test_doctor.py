"""course doctor: a missing lesson package fails, a missing extra or developer tool is only noted."""

import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from course_tools.cli import doctor

ROOT = Path(__file__).resolve().parent.parent


def installed(versions: dict[str, str]):
    """A stand-in for importlib.metadata.version that knows only the given packages."""
    def version(name: str) -> str:
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]
    return version


def test_groups_put_lesson_packages_first_and_name_every_extra():
    groups = doctor.requirement_groups()
    names = list(groups)
    assert groups["torch"][1] == [] and groups["ipywidgets"][1] == []
    assert groups["gensim"][1] == ["lesson01"]
    assert groups["transformers"][1] == ["lesson06", "lesson07", "lesson09"]
    assert groups["transformers<6,>=5"][1] == ["lesson12"]  # a newer range: checked on its own
    assert groups["gguf"][1] == ["lesson12"]
    assert groups["pytest"][1] == ["dev"] and groups["jupyterlab"][1] == ["dev"]
    assert names.index("torch") < names.index("gensim") < names.index("pytest")
    assert doctor.DIST not in groups


def test_missing_needed_package_fails_but_missing_extras_are_notes(monkeypatch):
    monkeypatch.setattr(doctor.metadata, "version", installed({"torch": "2.13.0", "transformers": "3.0"}))
    assert doctor.check_requirement(Requirement("torch>=2.4,<3")) == ("OK", "torch 2.13.0")
    status, text = doctor.check_requirement(Requirement("numpy>=1.26"))
    assert status == "FAIL" and "numpy is not installed" in text and "pip install 'numpy>=1.26'" in text
    status, text = doctor.check_requirement(Requirement("gensim>=4.3"), ["lesson01"])
    assert status == "NOTE" and "needed for lesson 01 only" in text and text.endswith('pip install ".[lesson01]"')
    status, text = doctor.check_requirement(Requirement("transformers>=4.44"), ["lesson06", "lesson07"])
    assert status == "NOTE" and "3.0 is outside >=4.44" in text and "lessons 06, 07" in text
    assert text.endswith('pip install ".[lesson07]"')  # the smaller extra: transformers alone
    status, text = doctor.check_requirement(Requirement("ruff>=0.5"), ["dev"])
    assert status == "NOTE" and "not needed for the lessons" in text


def test_a_version_that_suits_some_lessons_only_is_a_note_for_the_others(monkeypatch):
    """transformers 4.50 serves lessons 06-09, not lesson 12 (>=5): doctor says so, naming lesson 12's extra."""
    installed_here = {req.name: metadata.version(req.name) for req, _ in doctor.requirement_groups().values()
                      if _is_installed(req.name)}
    monkeypatch.setattr(doctor.metadata, "version", installed({**installed_here, "transformers": "4.50.0"}))
    lines = [(status, text) for status, text in doctor.diagnose(fetch=False) if text.startswith("transformers ")]
    assert ("OK", "transformers 4.50.0 (lessons 06, 07, 09)") in lines
    assert any(status == "NOTE" and "4.50.0 is outside <6,>=5" in text and "lesson 12 only" in text
               and text.endswith('pip install ".[lesson12]"') for status, text in lines), lines


def _is_installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_lesson_environment_passes_without_extras(monkeypatch):
    """Only the packages every lesson needs (as installed here): no FAIL, the rest are notes."""
    groups = doctor.requirement_groups().values()
    lesson = {req.name: metadata.version(req.name) for req, extras in groups if not extras}
    monkeypatch.setattr(doctor.metadata, "version", installed(lesson))
    results = doctor.diagnose(fetch=False)
    assert not [text for status, text in results if status == "FAIL"]
    notes = [text for status, text in results if status == "NOTE"]
    assert any(t.startswith("gensim is not installed: needed for lesson 01") for t in notes)
    assert any(t.startswith("pytest is not installed: a developer") for t in notes)


def test_installed_copy_reads_its_metadata(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "PYPROJECT", tmp_path / "absent.toml")
    requires = ["torch>=2.4", 'gensim>=4.3; extra == "lesson01"', 'transformers; extra == "lesson06"',
                'transformers; extra == "lesson07"', 'transformer-course[lesson01]; extra == "lessons"']
    monkeypatch.setattr(doctor.metadata, "requires", lambda dist: requires)
    extras = ["lesson01", "lesson06", "lesson07", "lessons"]
    monkeypatch.setattr(doctor.metadata, "metadata", lambda dist: _Meta(extras))
    groups = doctor.requirement_groups()
    assert groups["torch"][1] == [] and groups["gensim"][1] == ["lesson01"]
    assert groups["transformers"][1] == ["lesson06", "lesson07"]  # what this copy's metadata says
    assert "gguf" not in groups and doctor.DIST not in groups


class _Meta:
    def __init__(self, extras: list[str]) -> None:
        self.extras = extras

    def get_all(self, key: str) -> list[str]:
        assert key == "Provides-Extra"
        return self.extras


def test_not_installed_copy_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "PYPROJECT", tmp_path / "absent.toml")

    def missing(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(doctor.metadata, "requires", missing)
    with pytest.raises(ValueError, match="pip install . in the course folder"):
        doctor.declared()


def suggested(text: str) -> list[str]:
    """The pip arguments of the command a Check suggests (after "run: ")."""
    words = shlex.split(text.split("run: ", 1)[1])
    assert words[:4] == ["python", "-m", "pip", "install"], text
    return words[4:]


def dry_run(args: list[str]) -> str:
    """What pip says it would do with `args`, offline (every package it needs is installed here)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_suggested_commands_install_what_is_missing(monkeypatch, tmp_path):
    """pip acts on the suggested commands: it does not answer "Ignoring gensim: markers ... don't match"."""
    monkeypatch.setattr(doctor.metadata, "version", installed({}))
    status, text = doctor.check_requirement(Requirement("gensim>=4.3,<5"), ["lesson01"])
    output = dry_run(suggested(text))
    assert "Ignoring" not in output and "gensim" in output and "Would install transformer-course" in output
    # an installed copy (no pyproject.toml) reads requirements with markers from its metadata
    monkeypatch.setattr(doctor, "PYPROJECT", tmp_path / "absent.toml")
    status, text = doctor.check_requirement(Requirement('gensim>=4.3,<5; extra == "lesson01"'), ["lesson01"])
    assert suggested(text) == ["gensim<5,>=4.3"]
    output = dry_run(suggested(text))
    assert "Ignoring" not in output and "Requirement already satisfied: gensim" in output
    assert "Ignoring" in dry_run(['gensim>=4.3,<5; extra == "lesson01"'])  # what the marker did before


def test_missing_system_tools_are_notes_naming_the_install(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda program: None)
    checks = {program: doctor.check_tool(program) for program in doctor.TOOLS}
    assert all(status == "NOTE" for status, _ in checks.values())
    assert "course grade" in checks["bwrap"].text and "apt-get install bubblewrap" in checks["bwrap"].text
    assert "website" in checks["npm"].text and "apt-get install chromium" in checks["chromium"].text
    monkeypatch.setattr(doctor.shutil, "which", lambda program: f"/usr/bin/{program}")
    assert doctor.check_tool("node") == ("OK", "node found: Node.js, for building the website (python docs/build.py)")
    assert [c for c in doctor.diagnose(fetch=False) if c.text.startswith("chromium")][0].status == "OK"
