"""What the slide and site tests share: the Chromium they drive and the site's HTML link collector."""

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_docs(name: str):
    """A module of ``docs/`` (the site's builder and browser check), which is not a package."""
    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def chromium(check: str) -> str:
    """The Chromium that Playwright drives for ``check`` (Debian's ``chromium``, or the Google Chrome that
    GitHub's Ubuntu runners ship); missing, it fails in CI and skips elsewhere."""
    path = shutil.which("chromium") or shutil.which("google-chrome") or "/usr/bin/chromium"
    if not Path(path).exists() or importlib.util.find_spec("playwright") is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Chromium (apt-get install chromium) and Playwright for {check}")
        pytest.skip("no Chromium or Playwright here: apt-get install chromium; pip install playwright")
    return path


Links = load_docs("build").Links  # collects every href/src (and the ids) of one HTML page
