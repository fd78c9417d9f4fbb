"""The grader–worker contract: what ``job.json`` holds, defined once, written by the grader and
read by the worker; and the time and output limits of a grading run, with their defaults.

(No torch here: the worker imports this module, and it should start fast.)
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    """Time and output limits per submission (``course grade`` options of the same names)."""

    cell_timeout: int = 60  # seconds per answer cell and per exercise's collect call
    notebook_timeout: int = 600  # seconds for the whole notebook
    output_cap: int = 100_000  # characters of output kept per notebook

    def for_lesson(self, metadata: dict, explicit: set[str]) -> Limits:
        """These limits with the lesson's own where it sets them and the instructor did not: a lesson
        whose answers need longer (one that trains a model) says so in its solutions notebook's
        metadata, ``"course": {"grading": {"cell_timeout": 240, "notebook_timeout": 900}}``, and
        ``course assign`` carries it into ``exercises/``."""
        grading = metadata.get("course", {}).get("grading", {})
        own = {key: int(grading[key]) for key in ("cell_timeout", "notebook_timeout")
               if key in grading and key not in explicit}
        return replace(self, **own)

    def within(self, seconds: float | None) -> Limits:
        """These limits cut to a share of the class's time budget (``None``: no budget)."""
        if seconds is None:
            return self
        share = max(1, int(seconds))
        return replace(self, cell_timeout=min(self.cell_timeout, share),
                       notebook_timeout=min(self.notebook_timeout, share))


RLIMIT_NAMES = ("address_space", "processes", "file_size")


@dataclass(frozen=True)
class JobSpec:
    """Everything the worker needs to run one submission (``JOBDIR/job.json``)."""

    cell_timeout: int
    notebook_timeout: int
    output_cap: int
    workdir: str  # the kernel's working folder, as the worker sees it
    channel_fd: int  # the results pipe's write end
    env: dict[str, str] = field(default_factory=dict)  # the kernel's environment ({}: the worker's own)
    rlimits: dict[str, int] = field(default_factory=dict)  # per-process limits, by name in RLIMIT_NAMES
    confine_self: bool = False  # no bubblewrap: the worker loads the seccomp filter itself

    @classmethod
    def make(cls, limits: Limits, **rest) -> JobSpec:
        return cls(cell_timeout=limits.cell_timeout, notebook_timeout=limits.notebook_timeout,
                   output_cap=limits.output_cap, **rest)

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        """The spec in ``path``, type-checked field by field; ValueError names the first bad field."""
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            raise ValueError(f"{path}: not a job spec (fields {sorted(data) if isinstance(data, dict) else data!r})")
        # each field's type from its annotation (dict[str, str] -> dict), so a new field is checked too
        kinds = {name: typing.get_origin(hint) or hint for name, hint in typing.get_type_hints(cls).items()}
        for name, kind in kinds.items():
            if type(data[name]) is not kind:
                raise ValueError(f"{path}: job field {name} is not {kind.__name__}")
        if not all(type(k) is str and type(v) is str for k, v in data["env"].items()):
            raise ValueError(f"{path}: job field env must map text to text")
        if not all(k in RLIMIT_NAMES and type(v) is int for k, v in data["rlimits"].items()):
            raise ValueError(f"{path}: job field rlimits must map {RLIMIT_NAMES} to integers")
        return cls(**data)
