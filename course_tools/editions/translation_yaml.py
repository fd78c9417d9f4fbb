"""The YAML files of a translation (``translations/<lang>/``): read one with its allowed sections, write
one with multi-line texts as block strings, for the lessons and documents (``translate``; the check
messages are a PO file, ``po_catalogue``). PyYAML is a developer tool, so it is imported only when a file
is read."""

from __future__ import annotations

from pathlib import Path


def load_translation(path: Path, allowed: tuple[str, ...]) -> dict:
    """Read a translation file; a malformed one raises ValueError naming the file."""
    import yaml  # a developer tool: imported here so the learners' `course` runs without PyYAML

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path.name}: not valid YAML ({str(exc).splitlines()[0]})") from None
    unknown = set(data) - set(allowed)
    if unknown:
        raise ValueError(f"{path.name}: unknown sections {sorted(unknown)}; use {sorted(allowed)}")
    return data


def literal_str(dumper, text: str):
    """PyYAML representer: a text with line breaks as a ``|`` block, so the files read like the prose."""
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)
