"""``course grade``: score submitted exercise notebooks fairly.

The grader grades the answers, not the notebook. For each submission it
1. finds the lesson (notebook metadata written by ``course assign``, else the answer cells' ids),
2. rebuilds the pristine ``exercises/`` notebook with only the learner's answer cells put in
   (matched by nbgrader ``grade_id``; check cells are dropped),
3. draws fresh random inputs here and writes them to a private job folder,
4. runs the rebuilt notebook in a separate worker process and kernel, with per-cell and
   per-notebook time limits, an output cap, a memory cap and a temporary working directory;
   appended cells call the learner's functions on the inputs and save the outputs,
5. reads the outputs back with ``torch.load(weights_only=True)`` and compares them with the
   reference in this process, so nothing the learner's code does can change the verdict.
An exercise scores its points when every case passes, else 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
import torch

from course_tools import checks

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_EXERCISES = ROOT / "exercises"

# Runs first in the learner's kernel: limits, and the function that answers the grader's cases.
KERNEL_SETUP = '''
import os as _os, resource as _resource, torch as _torch, numpy as _np
_cap = {memory_bytes}
if _cap > 0:
    _resource.setrlimit(_resource.RLIMIT_AS, (_cap, _cap))

def _course_plain(value):
    if isinstance(value, _torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, _np.ndarray):
        return _torch.from_numpy(value.copy())
    if isinstance(value, _np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return type(value)(_course_plain(v) for v in value)
    if isinstance(value, dict):
        return {{k: _course_plain(v) for k, v in value.items()}}
    return value

def _course_answer(name, function, jobdir={jobdir!r}):
    cases = _torch.load(_os.path.join(jobdir, "inputs", name + ".pt"), weights_only=True)
    fn = globals().get(function)
    if not callable(fn):
        results = {{"missing": function}}
    else:
        results = []
        try:
            for args, kwargs in cases:
                try:
                    results.append({{"status": "ok", "value": _course_plain(fn(*args, **kwargs))}})
                except NotImplementedError:
                    results.append({{"status": "not attempted"}})
                except Exception as exc:
                    text = str(exc).strip().splitlines()
                    message = type(exc).__name__ + (": " + text[0] if text else "")
                    results.append({{"status": "error", "message": message}})
        except KeyboardInterrupt:  # the grader interrupts a cell that runs past its time limit
            results = {{"timeout": True}}
    _torch.save(results, _os.path.join(jobdir, "outputs", name + ".pt"))
'''


class SubmissionError(ValueError):
    """A file that cannot be graded as a submission; the message is the report line."""


@dataclass
class ExerciseScore:
    name: str
    points: float
    max_points: float
    status: str  # pass | fail | not attempted | error: ... | timeout | missing answer cell
    lines: list[str] = field(default_factory=list)


@dataclass
class Submission:
    file: str
    student: str
    lesson: str = ""
    status: str = "graded"
    exercises: list[ExerciseScore] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> float:
        return sum(e.points for e in self.exercises)

    @property
    def max_points(self) -> float:
        return sum(e.max_points for e in self.exercises)


@dataclass
class Limits:
    cell_timeout: int = 60
    notebook_timeout: int = 600
    output_cap: int = 100_000
    memory_mb: int = 4096


def exercise_cells(nb: nbformat.NotebookNode) -> tuple[dict[str, list[int]], dict[str, dict]]:
    """Answer-cell indices by grade_id, and the check cells' nbgrader metadata by exercise name."""
    answers: dict[str, list[int]] = {}
    graded: dict[str, dict] = {}
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        grade_id = meta.get("grade_id")
        if meta.get("solution") and grade_id:
            answers.setdefault(grade_id, []).append(index)
        elif meta.get("grade") and grade_id and grade_id.endswith("_check"):
            graded[grade_id[: -len("_check")]] = meta
    return answers, graded


def read_submission(path: Path) -> nbformat.NotebookNode:
    """Parse a file as a notebook, or raise SubmissionError with one clear line."""
    raw = path.read_bytes()
    if not raw.strip():
        raise SubmissionError("empty file")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SubmissionError(f"not JSON ({type(exc).__name__}): not a notebook file") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list) or "nbformat" not in data:
        raise SubmissionError("JSON but not a Jupyter notebook (no cells/nbformat)")
    try:
        return nbformat.reads(raw.decode("utf-8"), as_version=4)
    except Exception as exc:
        raise SubmissionError(f"not a readable notebook: {checks.error_line(exc)}") from None


def identify_lesson(nb: nbformat.NotebookNode, pristine: dict[str, nbformat.NotebookNode]) -> str:
    """The lesson from the metadata ``course assign`` writes, else from the answer cells' ids."""
    lesson = nb.metadata.get("course", {}).get("lesson")
    if lesson in pristine:
        return lesson
    ids = set(exercise_cells(nb)[0])
    matches = [name for name, p in pristine.items() if ids and ids <= set(exercise_cells(p)[0])]
    if len(matches) == 1:
        return matches[0]
    named = f" {lesson!r}" if lesson else ""
    raise SubmissionError(f"unknown lesson{named}: no exercise notebook matches its answer cells")


def rebuild(pristine: nbformat.NotebookNode, nb: nbformat.NotebookNode, jobdir: Path,
            memory_mb: int) -> tuple[nbformat.NotebookNode, dict[str, str], dict[str, int]]:
    """The pristine notebook with the learner's answer cells in, check cells out, and the grader's
    cells around it. Returns (notebook, problem per exercise, index of each exercise's answer cell)."""
    theirs, _ = exercise_cells(nb)
    problems: dict[str, str] = {}
    cells = [nbformat.v4.new_code_cell(KERNEL_SETUP.format(memory_bytes=memory_mb * 2**20, jobdir=str(jobdir)))]
    answer_index: dict[str, int] = {}
    for cell in pristine.cells:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if meta.get("grade") and not meta.get("solution"):
            continue  # the check cells: the grader does the checking
        cell = nbformat.from_dict(dict(cell))
        grade_id = meta.get("grade_id")
        if meta.get("solution") and grade_id:
            found = theirs.get(grade_id, [])
            if len(found) == 1:
                cell.source = nb.cells[found[0]].source
            elif not found:
                problems[grade_id] = "missing answer cell"
            else:
                problems[grade_id] = f"{len(found)} answer cells with grade_id {grade_id!r}"
            answer_index[grade_id] = len(cells)
        cells.append(cell)
    rebuilt = nbformat.v4.new_notebook(cells=cells, metadata=pristine.metadata)
    return rebuilt, problems, answer_index


def run_worker(rebuilt: nbformat.NotebookNode, jobdir: Path, workdir: Path, limits: Limits) -> dict:
    """Execute the rebuilt notebook in a separate process; return its run report."""
    nbformat.write(rebuilt, jobdir / "submission.ipynb")
    job = {"workdir": str(workdir), "cell_timeout": limits.cell_timeout,
           "notebook_timeout": limits.notebook_timeout, "output_cap": limits.output_cap}
    (jobdir / "job.json").write_text(json.dumps(job))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    try:
        subprocess.run([sys.executable, "-m", "course_tools.grade_worker", str(jobdir)], cwd=workdir, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=limits.notebook_timeout + 60, start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "errors": {}}
    report = jobdir / "run.json"
    return json.loads(report.read_text()) if report.exists() else {"status": "crashed", "errors": {}}


def score_exercise(name: str, max_points: float, cases: list[checks.Case], outputs_file: Path,
                   answer_error: str | None, collect_error: str | None, notebook_timed_out: bool) -> ExerciseScore:
    """Compare the learner's saved outputs with the reference, here in the grader's process."""
    ex = checks.get(name)
    timeout = ExerciseScore(name, 0, max_points, "timeout", ["  ✗ timed out: the function did not return in time"])
    if not outputs_file.exists():
        if (collect_error or "").startswith("KeyboardInterrupt") or (notebook_timed_out and collect_error is None):
            return timeout
        reason = answer_error or collect_error or "the notebook stopped before this exercise"
        return ExerciseScore(name, 0, max_points, f"error: {reason}", [f"  ✗ {reason}"])
    try:
        results = torch.load(outputs_file, weights_only=True)
    except Exception as exc:
        reason = f"the answer returned something other than tensors or numbers ({checks.error_line(exc)[:80]})"
        return ExerciseScore(name, 0, max_points, "error: unsupported return value", [f"  ✗ {reason}"])
    if isinstance(results, dict) and results.get("timeout"):
        return timeout
    if isinstance(results, dict) and "missing" in results:
        reason = answer_error or f"NameError: the answer cell does not define {results['missing']}()"
        return ExerciseScore(name, 0, max_points, f"error: {reason}", [f"  ✗ {reason}"])
    if not isinstance(results, list) or len(results) != len(cases):
        return ExerciseScore(name, 0, max_points, "error: malformed results", ["  ✗ malformed results"])
    outcomes = []
    for case, result in zip(cases, results, strict=True):
        status = result.get("status") if isinstance(result, dict) else None
        if status == "not attempted":
            outcomes.append(checks.Outcome(checks.NOT_ATTEMPTED, f"  · {case.label}: not attempted yet"))
        elif status == "error":
            outcomes.append(checks.Outcome(checks.ERROR, f"  ✗ {case.label}: raised {result.get('message')}"))
        elif status == "ok":
            outcomes.append(checks.judge(ex, case, result.get("value"), checks.call(ex.reference, case)))
        else:
            outcomes.append(checks.Outcome(checks.ERROR, f"  ✗ {case.label}: malformed result"))
    verdict = checks.result_status(outcomes)
    if verdict == checks.FAIL and all(o.status == checks.ERROR for o in outcomes):
        verdict = "error: " + outcomes[0].line.split("raised ", 1)[-1]
    points = max_points if verdict == checks.PASS else 0
    return ExerciseScore(name, points, max_points, verdict, [o.line for o in outcomes])


def grade_file(path: Path, pristine: dict[str, nbformat.NotebookNode], limits: Limits,
               seed: int | None = None) -> Submission:
    """Grade one submission; never raises for a bad submission (its status says what went wrong)."""
    start = time.perf_counter()
    sub = Submission(file=str(path), student=path.stem)
    try:
        nb = read_submission(path)
        sub.lesson = identify_lesson(nb, pristine)
    except SubmissionError as exc:
        sub.status = str(exc)
        return sub
    base = pristine[sub.lesson]
    _, graded = exercise_cells(base)
    jobdir = Path(tempfile.mkdtemp(prefix="course-grade-job-"))
    workdir = Path(tempfile.mkdtemp(prefix="course-grade-work-"))
    try:
        (jobdir / "inputs").mkdir()
        (jobdir / "outputs").mkdir()
        rebuilt, problems, answer_index = rebuild(base, nb, jobdir, limits.memory_mb)
        cases: dict[str, list[checks.Case]] = {}
        collect_index: dict[str, int] = {}
        for name in graded:
            ex = checks.get(name)
            cases[name] = checks.draw(name, checks.fresh_seed() if seed is None else seed)
            torch.save([(c.args, c.kwargs) for c in cases[name]], jobdir / "inputs" / f"{name}.pt")
            if name not in problems:
                collect_index[name] = len(rebuilt.cells)
                rebuilt.cells.append(nbformat.v4.new_code_cell(f"_course_answer({name!r}, {ex.function!r})"))
        run = run_worker(rebuilt, jobdir, workdir, limits)
        errors = run.get("errors", {})
        for name, meta in graded.items():
            max_points = float(meta.get("points", 0))
            if name in problems:
                sub.exercises.append(ExerciseScore(name, 0, max_points, problems[name], [f"  ✗ {problems[name]}"]))
                continue
            answer_error = errors.get(str(answer_index.get(name)))
            collect_error = errors.get(str(collect_index[name]))
            outputs = jobdir / "outputs" / f"{name}.pt"
            sub.exercises.append(score_exercise(name, max_points, cases[name], outputs, answer_error, collect_error,
                                                notebook_timed_out=run["status"] == "timeout"))
        problems_text = "; ".join(f"{k}: {v}" for k, v in problems.items())
        if run["status"] != "finished":
            sub.status = f"notebook {run['status']}" + (f"; {problems_text}" if problems_text else "")
        elif problems_text:
            sub.status = f"graded with problems: {problems_text}"
        elif all(e.status == checks.NOT_ATTEMPTED for e in sub.exercises):
            sub.status = "not attempted"
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
        sub.seconds = time.perf_counter() - start
    return sub


def load_pristine(exercises_dir: Path) -> dict[str, nbformat.NotebookNode]:
    if not exercises_dir.is_dir():
        raise FileNotFoundError(f"no exercises folder at {exercises_dir}; pass --exercises DIR")
    return {p.stem: nbformat.read(p, as_version=4) for p in sorted(exercises_dir.glob("*.ipynb"))}


def table(sub: Submission) -> str:
    lines = [f"{sub.student} ({sub.file}) lesson {sub.lesson or '?'}: "
             f"{sub.total:g}/{sub.max_points:g} points, {sub.status}"]
    for e in sub.exercises:
        lines.append(f"  {e.name:<28} {e.points:>5g}/{e.max_points:<5g} {e.status}")
    return "\n".join(lines)


def feedback_markdown(sub: Submission) -> str:
    lines = [f"# Feedback: {sub.student}", "", f"Lesson {sub.lesson or 'unknown'} — "
             f"**{sub.total:g} / {sub.max_points:g} points** ({sub.status}).", ""]
    for e in sub.exercises:
        lines += [f"## {e.name}: {e.points:g} / {e.max_points:g} ({e.status})", "", "```"]
        lines += [line.strip() for line in e.lines] or ["(no cases)"]
        lines += ["```", ""]
    return "\n".join(lines)


def write_gradebook(subs: list[Submission], path: Path) -> None:
    names: list[str] = []
    for sub in subs:
        names += [e.name for e in sub.exercises if e.name not in names]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "file", "lesson", *names, "total", "max", "status"])
        for sub in subs:
            points = {e.name: f"{e.points:g}" for e in sub.exercises}
            writer.writerow([sub.student, sub.file, sub.lesson, *(points.get(n, "") for n in names),
                             f"{sub.total:g}", f"{sub.max_points:g}", sub.status])


def main(args: argparse.Namespace) -> int:
    try:
        pristine = load_pristine(Path(args.exercises))
    except FileNotFoundError as exc:
        print(f"course grade: {exc}", file=sys.stderr)
        return 2
    target = Path(args.submission)
    if target.is_dir():
        files = sorted(p for p in target.iterdir() if p.suffix == ".ipynb" and p.is_file())
    elif target.is_file():
        files = [target]
    else:
        print(f"course grade: no file or folder at {target}", file=sys.stderr)
        return 2
    limits = Limits(args.cell_timeout, args.notebook_timeout, args.output_cap, args.memory_mb)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # each grading is its own process
        subs = []
        for sub in pool.map(lambda path: grade_file(path, pristine, limits, args.seed), files):
            print(table(sub), flush=True)
            subs.append(sub)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(s) | {"total": s.total, "max": s.max_points} for s in subs],
                                              indent=1, ensure_ascii=False))
    if target.is_dir() or args.gradebook:
        gradebook = Path(args.gradebook or "gradebook.csv")
        write_gradebook(subs, gradebook)
        print(f"gradebook: {gradebook} ({len(subs)} rows)")
    if args.feedback:
        folder = Path(args.feedback)
        folder.mkdir(parents=True, exist_ok=True)
        for sub in subs:
            (folder / f"{sub.student}.feedback.md").write_text(feedback_markdown(sub), encoding="utf-8")
        print(f"feedback: {folder}/ ({len(subs)} files)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade", help="grade a submitted exercise notebook, or a folder of them")
    p.add_argument("submission", help="a submitted .ipynb, or a folder of them (one student per file)")
    p.add_argument("--exercises", default=str(DEFAULT_EXERCISES), help="the pristine exercise notebooks")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--gradebook", metavar="CSV", help="gradebook path (default gradebook.csv for a folder)")
    p.add_argument("--feedback", metavar="DIR", nargs="?", const="feedback",
                   help="write a Markdown report per submission into DIR (default ./feedback)")
    p.add_argument("--cell-timeout", type=int, default=60, help="seconds per cell (default 60)")
    p.add_argument("--notebook-timeout", type=int, default=600, help="seconds per notebook (default 600)")
    p.add_argument("--output-cap", type=int, default=100_000, help="characters of output kept per notebook")
    p.add_argument("--memory-mb", type=int, default=4096, help="address-space cap of the kernel (0: none)")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded at the same time (default 1)")
    p.add_argument("--seed", type=int, help="fix the random cases (default: fresh each run)")
    p.set_defaults(func=main)
