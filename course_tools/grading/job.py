"""The grader–worker contract, both ways: what ``job.json`` holds (``JobSpec``, written by the grader,
read by the worker), what ``run.json`` says back (``RunReport``, written by the worker, read and
checked by the grader); and the time and output limits of a grading run, with their defaults.

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


RUN_STATUSES = ("finished", "timeout", "crashed")
REPORT_BYTES, REPORTED_ERRORS, ERROR_CHARS = 2**20, 1000, 500  # what the grader reads of a report at most


@dataclass(frozen=True)
class RunReport:
    """How the notebook run ended (``RUN_STATUSES``) and each cell that raised: its index -> "Type: message".
    The worker builds it and sends it as the results channel's entry ``run.json`` (a file of that name
    that the learner's code writes to ``out/`` is replaced by it)."""

    status: str
    errors: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def read(cls, raw: bytes | None) -> RunReport:
        """The report as the grader may use it. The worker shares its sandbox with the learner's code, so
        the bytes are untrusted: anything but a well-formed report reads as a crashed notebook, and the
        errors are cut to ``REPORTED_ERRORS`` of ``ERROR_CHARS`` characters."""
        try:
            data = json.loads(raw) if raw is not None and len(raw) < REPORT_BYTES else None
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict) or data.get("status") not in RUN_STATUSES:
            return cls("crashed")
        errors = data.get("errors")
        if not isinstance(errors, dict):
            errors = {}
        kept = list(errors.items())[:REPORTED_ERRORS]
        return cls(data["status"], {str(k)[:16]: str(v)[:ERROR_CHARS] for k, v in kept})
