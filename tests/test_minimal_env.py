"""Lessons 00 and 02 run in a fresh virtual environment holding only the course and what every lesson needs.

No JupyterLab, nbval, pytest, ruff, gensim or transformers there: the course is installed as a plain
(non-editable) package with ``pip install DIR``, torch first the way ``.ci/run`` installs it. About a
minute on two cores, most of it pip.
"""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
DEV_AND_EXTRAS = ["jupyterlab", "nbval", "pytest", "ruff", "gensim", "transformers", "sentence_transformers"]
PROBE = f"""import importlib.util, json, sys
print(json.dumps({{"prefix": sys.prefix, "found": [m for m in {DEV_AND_EXTRAS!r} if importlib.util.find_spec(m)]}}))"""

pytestmark = pytest.mark.slow


def clean_env() -> dict[str, str]:
    """This process's environment without the PYTHONPATH that points kernels at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd: list, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{cmd[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def minimal(tmp_path_factory) -> tuple[Path, Path]:
    """(folder with the notebooks, the venv's bin folder), the course installed from a copy of its files."""
    work = tmp_path_factory.mktemp("minimal")
    source = work / "source"
    for name in ("course_utils", "course_tools"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    venv.create(work / "venv", with_pip=True)
    bin_dir = work / "venv" / ("Scripts" if sys.platform == "win32" else "bin")
    run([bin_dir / "python", "-m", "pip", "install", "-q", "torch==2.13.0"], work)
    run([bin_dir / "python", "-m", "pip", "install", "-q", source], work)
    lessons = work / "lessons" / "notebooks"
    lessons.mkdir(parents=True)
    for name in ("00_setup.ipynb", "02_self_attention.ipynb"):
        shutil.copy2(ROOT / "notebooks" / name, lessons / name)
    return lessons.parent, bin_dir


def test_only_the_lesson_packages_are_installed(minimal):
    folder, bin_dir = minimal
    probe = new_notebook(cells=[new_code_cell(PROBE)])
    probe.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(probe, folder / "probe.ipynb")
    run([bin_dir / "course", "run", "--mode", "cpu", "--inplace", "probe.ipynb"], folder)
    seen = json.loads(nbformat.read(folder / "probe.ipynb", as_version=4).cells[0].outputs[0]["text"])
    assert Path(seen["prefix"]).resolve() == bin_dir.parent.resolve(), "the kernel did not run in the fresh venv"
    assert seen["found"] == []


def test_doctor_notes_the_extras_without_failing(minimal):
    folder, bin_dir = minimal
    out = run([bin_dir / "course", "doctor"], folder).stdout
    assert "FAIL" not in out
    assert "NOTE gensim is not installed: needed for lesson 01 only" in out
    assert "NOTE transformers is not installed: needed for lessons 06, 07, 09 only" in out
    assert "NOTE transformers is not installed: needed for lesson 12 only" in out  # its own range (>=5)
    assert "NOTE pytest is not installed: a developer and instructor tool" in out


def test_lessons_00_and_02_run(minimal):
    folder, bin_dir = minimal
    out = run([bin_dir / "course", "run", "--mode", "smoke", "notebooks/00_setup.ipynb",
               "notebooks/02_self_attention.ipynb"], folder).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith("notebooks/")]
    assert [(row[0], row[-1]) for row in rows] == [("notebooks/00_setup.ipynb", "ok"),
                                                    ("notebooks/02_self_attention.ipynb", "ok")]
