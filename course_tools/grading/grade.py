"""``course grade``: score submitted exercise notebooks fairly, whatever they contain.

For each submission the grader
1. reads it without trusting it (size and cell count first, every field type-checked) and finds
   the lesson (notebook metadata written by ``course assign``, else the answer cells' ids);
2. rebuilds the pristine ``exercises/`` notebook with only the learner's answer cells put in
   (matched by nbgrader ``grade_id``; check cells are dropped);
3. draws fresh random inputs here and writes them to a private job folder;
4. runs the rebuilt notebook in its own sandbox (``course_tools.grading.sandbox``): a worker and a
   kernel with time, output, memory and process limits; appended cells call the learner's
   functions on the inputs and the outputs come back through a size- and time-limited channel;
5. reads what came back as untrusted data in a fixed format, safetensors and JSON checked
   against caps (``course_tools.grading.results``), then compares it with the reference here, in
   the grader's process, so nothing the learner's code does can change the verdict or cost the grader.
An exercise scores its points when every case passes, else 0; a manually graded answer (a written
explanation) is reported with its text and its points pending. Every problem becomes the
student's status; the gradebook is rewritten after each student, with the seed of its cases.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import nbformat
import torch

from course_tools import messages
from course_tools.exercises import checks
from course_tools.grading import alike, metal, results, shortcuts, submission
from course_tools.grading.job import Limits, RunReport
from course_tools.grading.report import PENDING, ExerciseScore, Gradebook, Submission, table
from course_tools.grading.sandbox import Caps, Sandbox, SandboxError
from course_tools.grading.submission import SubmissionError
from course_tools.grading.text import clean

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_EXERCISES = ROOT / "exercises"
WALL_GRACE = 15  # seconds past the notebook limit before the sandbox is ended from outside
REFERENCE_FLAG = messages.N_("tried to use the exercise references")
SETUP = """import course_tools.grading.kernel_side as _course_grading
_course_answer = _course_grading.Answerer({jobdir!r}, globals())
"""


@dataclass
class Job:
    """One rebuilt submission with its cases, ready to run."""

    notebook: nbformat.NotebookNode
    problems: dict[str, str]
    answer_index: dict[str, int]
    collect_index: dict[str, int]
    cases: dict[str, list[checks.Case]]
    points: dict[str, float]
    answer_cells: dict[str, list[str]] = field(default_factory=dict)  # submission.answer_cells


def prepare(base: nbformat.NotebookNode, parsed: submission.Parsed, jobdir: Path, kernel_jobdir: str,
            seed: int) -> Job:
    """Rebuild the notebook, draw the cases, write them to ``jobdir/inputs``, append the collect cells."""
    _, points = submission.exercise_cells(base)
    notebook, problems, answer_index = submission.rebuild(base, parsed, SETUP.format(jobdir=kernel_jobdir))
    job = Job(notebook, problems, answer_index, {}, {}, points, submission.answer_cells(base))
    (jobdir / "inputs").mkdir()
    for name in points:
        ex = checks.get(name)
        job.cases[name] = checks.draw(name, seed)
        inputs = results.encode([(c.args, c.kwargs) for c in job.cases[name]])
        (jobdir / "inputs" / results.file_name(name)).write_bytes(inputs)
        if name not in problems:
            job.collect_index[name] = len(notebook.cells)
            cell = nbformat.v4.new_code_cell(f"_course_answer({name!r}, {ex.function!r})")
            cell.metadata[submission.GRADER_CELL] = "timed"
            notebook.cells.append(cell)
    nbformat.write(notebook, jobdir / "submission.ipynb")
    return job


def _numel(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return sum(_numel(v) for v in value)
    return 1


def judge_case(ex: checks.Exercise, case: checks.Case, result: Any) -> checks.Outcome:
    """One case's record from the learner's kernel, judged against the reference computed here."""
    status = result.get("status") if isinstance(result, dict) else None
    if status == checks.ATTEMPT_NONE:
        return checks.not_attempted(case)
    if status == checks.ATTEMPT_ERROR:
        return checks.raised(case, clean(result.get("message"), 300))
    if status != checks.ATTEMPT_OK:
        return checks.Outcome(checks.ERROR, "  ✗ " + messages._("{label}: malformed result",
                                                                label=messages.say(case.label)))
    expected = checks.call(ex.reference, case)
    got = result.get("value")
    hints = _numel(got) <= 4 * _numel(expected) + 1024  # hints compute on the answer: only on bounded sizes
    if ex.traced:
        got = (got, _trace(result.get("trace")))
    return checks.judge(ex, case, got, expected, hints=hints)


def _trace(value: Any) -> torch.Tensor:
    """A case record's optimiser trace (``checks.optimizer_trace``): none is zero steps; anything but a
    (steps, 2) tensor is kept as it came, for the verdict to refuse."""
    return checks.trace_tensor([]) if value is None else value


def apply_requirements(exercises: list[ExerciseScore], raised: frozenset[str] = frozenset()) -> None:
    """An exercise whose required exercises (``Exercise.requires``) did not all pass scores nothing,
    and its feedback names the first one that failed (judged on their own verdicts) and counts its own cases
    without their details: measured on a model that differs from the reference, their hints would mislead.
    An exercise in ``raised`` keeps its first line, its own answer cell's error (``with_answer_error``), first."""
    statuses = {e.name: e.status for e in exercises}
    for score in exercises:
        if score.name not in checks.REGISTRY or score.status == checks.NOT_ATTEMPTED:
            continue
        blocked = checks.unmet(checks.get(score.name), statuses)
        if blocked:
            score.points = 0
            score.status = checks.FAIL if score.status == checks.PASS else score.status
            own, cases = (score.lines[:1], score.lines[1:]) if score.name in raised else ([], score.lines)
            passed = sum(line.startswith("  ✓") for line in cases)
            score.lines = [*own, "  ✗ " + blocked, "  ✗ " + checks.held_back(passed, len(cases))]


def _timed_out(name: str, max_points: float) -> ExerciseScore:
    return ExerciseScore(name, 0, max_points, messages.N_("timeout"),
                         ["  ✗ " + messages._("timed out: the function did not return in time")])


def _failed(name: str, max_points: float, reason: str, line: str | None = None) -> ExerciseScore:
    """An exercise that scored nothing because of ``reason`` (the status stays English, for the
    instructor); the learner's ``line`` says it in the learner's language (default: ``reason`` translated)."""
    return ExerciseScore(name, 0, max_points, messages.N_("error: {reason}", reason=reason),
                         ["  ✗ " + (line or messages.say(reason))])


def _first_error(result: Any) -> str:
    """The status of an exercise whose every case failed to run: the first case's error."""
    if isinstance(result, dict) and result.get("status") == "error":
        return clean(result.get("message"), 300)
    return messages.N_("malformed result")


def score(name: str, max_points: float, cases: list[checks.Case], loaded: dict, answer_error: str | None) \
        -> ExerciseScore:
    """The verdict on one exercise from its checked results."""
    if loaded["kind"] == "timeout":
        return _timed_out(name, max_points)
    if loaded["kind"] == "missing":
        if answer_error:
            return _failed(name, max_points, answer_error, answer_error)
        function = clean(loaded["function"], 80)
        return _failed(name, max_points, messages.N_("NameError: the answer cell does not define {function}()",
                                                     function=function))
    if len(loaded["results"]) != len(cases):
        return _failed(name, max_points, messages.N_("malformed results"))
    ex = checks.get(name)
    outcomes = [judge_case(ex, case, result) for case, result in zip(cases, loaded["results"], strict=True)]
    verdict = checks.result_status(outcomes)
    if verdict == checks.FAIL and all(o.status == checks.ERROR for o in outcomes):
        verdict = messages.N_("error: {reason}", reason=_first_error(loaded["results"][0]))
    points = max_points if verdict == checks.PASS else 0
    return ExerciseScore(name, points, max_points, verdict, [o.line for o in outcomes])


CELL_LINE = re.compile(r"\(<IPY-INPUT>, line (\d+)\)")  # where IPython puts a SyntaxError (notebook_exec names it)


def answer_cell_error(name: str, job: Job, run: RunReport) -> tuple[str, str] | None:
    """The first of the exercise's own answer cells (``submission.answer_cells``) that raised, and its
    error with the line a SyntaxError points at; else None."""
    for cell in job.answer_cells.get(name, [name]):
        error = run.errors.get(str(job.answer_index.get(cell)))
        if error:
            return cell, CELL_LINE.sub(r"(line \1)", clean(error, 300))
    return None


def with_answer_error(name: str, result: ExerciseScore, raised: tuple[str, str] | None) -> ExerciseScore:
    """An exercise whose answer cell raised: the error is reported first, for this exercise (the cases
    after it often fail only because of it, as a NameError), and is the status unless every case passed."""
    if raised is None:
        return result
    cell, error = raised
    first = "  ✗ " + messages._("the answer cell {cell} raised {error}", cell=clean(cell, 80), error=error)
    lines = [first, *(line for line in result.lines if line != "  ✗ " + error)]
    reason = error if cell == name else messages.N_("{error} in the answer cell {cell}", error=error,
                                                    cell=clean(cell, 80))
    status = result.status if result.status == checks.PASS else messages.N_("error: {reason}", reason=reason)
    return replace(result, status=status, lines=lines)


def score_exercise(name: str, job: Job, files: dict[str, bytes], run: RunReport, killed: bool,
                   checked: dict[str, dict | results.ContractError]) -> ExerciseScore:
    """Score one exercise from what the sandbox sent back (or did not), checked by ``results.check_outputs``;
    an error of its answer cell comes first."""
    if name in job.problems:
        return ExerciseScore(name, 0, job.points[name], job.problems[name],
                             ["  ✗ " + messages.say(job.problems[name])])
    raised = answer_cell_error(name, job, run)
    result = scored_exercise(name, job, files, run, killed, checked, raised[1] if raised else None)
    return with_answer_error(name, result, raised)


def scored_exercise(name: str, job: Job, files: dict[str, bytes], run: RunReport, killed: bool,
                    checked: dict[str, dict | results.ContractError], answer_error: str | None) -> ExerciseScore:
    """The verdict on the cases of one exercise, its answer cell's own ``answer_error`` aside."""
    max_points = job.points[name]
    collect_error = run.errors.get(str(job.collect_index[name]))
    data = files.get(results.file_name(name))
    if data is None:
        timed_out = killed or run.status == "timeout"
        if (collect_error or "").startswith("KeyboardInterrupt") or (timed_out and collect_error is None):
            return _timed_out(name, max_points)
        error = answer_error or collect_error
        reason = clean(error, 300) if error else messages.N_("the notebook stopped before this exercise")
        return _failed(name, max_points, reason)
    loaded = checked[results.file_name(name)]
    if isinstance(loaded, results.ContractError):
        return _failed(name, max_points, str(loaded))
    return score(name, max_points, job.cases[name], loaded, answer_error)


def manual_scores(base: nbformat.NotebookNode, parsed: submission.Parsed) -> list[ExerciseScore]:
    """The manually graded answers (nbgrader cells with ``grade`` and ``solution``: a written
    explanation): their points pending, the student's text kept for the instructor."""
    scores = []
    for cell in base.cells:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        grade_id = meta.get("grade_id")
        if meta.get("grade") and meta.get("solution") and grade_id:
            text = "\n\n".join(parsed.answers.get(grade_id, []))
            scores.append(ExerciseScore(grade_id, 0, float(meta.get("points", 0)), PENDING, answer=text))
    return scores


def overall_status(sub: Submission, job: Job, run_status: str) -> str:
    problems = "; ".join(f"{k}: {v}" for k, v in job.problems.items())
    if run_status == "timeout":
        return messages.N_("notebook timeout; {problems}", problems=problems) if problems \
            else messages.N_("notebook timeout")
    if run_status != "finished":
        return messages.N_("notebook crashed; {problems}", problems=problems) if problems \
            else messages.N_("notebook crashed")
    if problems:
        return messages.N_("graded with problems: {problems}", problems=problems)
    if sub.exercises and all(e.status == checks.NOT_ATTEMPTED for e in sub.exercises if not e.pending):
        return checks.NOT_ATTEMPTED
    return messages.N_("graded")


def grade_parsed(sub: Submission, parsed: submission.Parsed, base: nbformat.NotebookNode, sandbox: Sandbox,
                 limits: Limits, seed: int) -> None:
    """Run one readable submission in a fresh sandbox and fill in its scores."""
    jobdir = Path(tempfile.mkdtemp(prefix="course-grade-job-"))
    try:
        job = prepare(base, parsed, jobdir, sandbox.kernel_jobdir(jobdir), seed)
        result = sandbox.run(jobdir, limits, limits.notebook_timeout + WALL_GRACE, sub.lesson,
                             shortcuts.pristine_sources(base))
    finally:
        shutil.rmtree(jobdir, ignore_errors=True)
    run = replace(result.report, status="timeout") if result.killed else result.report
    outputs = {file: result.files[file] for file in map(results.file_name, job.points) if file in result.files}
    checked = results.check_outputs(outputs, results.caps_for(sub.lesson), sandbox.host_paths())
    sub.exercises = [score_exercise(name, job, result.files, run, result.killed, checked) for name in job.points]
    apply_requirements(sub.exercises, frozenset(name for name in job.points if answer_cell_error(name, job, run)))
    sub.exercises += manual_scores(base, parsed)
    if submission.names_references(parsed):
        sub.flags.append(REFERENCE_FLAG)
    if shortcuts.apply(sub, parsed, base):
        sub.flags.append(shortcuts.FLAG)
    if metal.apply(sub, parsed, base):
        sub.flags.append(metal.FLAG)
    sub.status = overall_status(sub, job, run.status)


@dataclass
class Class:
    """What every submission of one run is graded with."""

    pristine: dict[str, nbformat.NotebookNode]
    limits: Limits
    sandbox: Sandbox
    lesson: str | None = None  # --lesson: the class's lesson, whatever a submission claims
    seed: int | None = None  # --seed: the same cases for everyone (default: a fresh seed per submission)
    explicit: frozenset[str] = frozenset()  # the limits the instructor set on the command line
    share: float | None = None  # --class-budget: each submission's seconds, over any other limit
    alike: dict[Path, list[str]] = field(default_factory=dict)  # what each file shares with others (alike.find)


def claimed_lesson(parsed: submission.Parsed, lesson: str, pristine: dict[str, nbformat.NotebookNode]) -> str | None:
    """A warning when the submission says (in its metadata) or shows (by its answer cells) another
    lesson than the one it is graded as, else None."""
    if parsed.lesson is not None and parsed.lesson != lesson:
        return messages.N_("claims lesson {claimed!r}; graded as {lesson}", claimed=clean(parsed.lesson, 60),
                           lesson=lesson)
    answers = set(submission.exercise_cells(pristine[lesson])[0])
    if parsed.answers and not set(parsed.answers) & answers:
        return messages.N_("none of its answer cells belongs to lesson {lesson}", lesson=lesson)
    return None


def grade_file(path: Path, run: Class) -> Submission:
    """Grade one submission; never raises (its status says what went wrong)."""
    start = time.perf_counter()
    seed = checks.fresh_seed() if run.seed is None else run.seed
    student, note = submission.student_name(path)
    sub = Submission(file=submission.readable(str(path)), student=student, sandbox=run.sandbox.describe(), seed=seed,
                     flags=[note] if note else [], alike=list(run.alike.get(path, [])))
    try:
        parsed = submission.parse(submission.read_bytes(str(path)))
        sub.lesson = run.lesson or submission.identify_lesson(parsed, run.pristine)
        warning = claimed_lesson(parsed, sub.lesson, run.pristine)
        if warning:
            sub.flags.append(warning)
        base = run.pristine[sub.lesson]
        limits = run.limits.for_lesson(base.metadata, run.explicit).within(run.share)
        sub.lang = parsed.lang  # a Korean edition's submission gets its feedback in Korean
        with messages.speaking(sub.lang):
            grade_parsed(sub, parsed, base, run.sandbox, limits, seed)
    except SubmissionError as exc:
        sub.status = str(exc)
    except Exception as exc:  # a grader bug must cost one row, not the class's gradebook
        sub.status = f"grader error: {checks.error_line(exc)}"
    sub.seconds = time.perf_counter() - start
    return sub


def pick_lesson(pristine: dict[str, nbformat.NotebookNode], lesson: str) -> str:
    """The exercise notebook ``--lesson`` names: its full name (``00_setup``) or its number (``00``)."""
    found = [name for name in pristine if name == lesson or name.split("_", 1)[0] == lesson]
    if len(found) != 1:
        raise FileNotFoundError(f"--lesson {lesson!r} names no exercise notebook; use one of: "
                                + ", ".join(sorted(pristine)))
    return found[0]


def load_pristine(exercises_dir: Path) -> dict[str, nbformat.NotebookNode]:
    if not exercises_dir.is_dir():
        raise FileNotFoundError(f"no exercises folder at {exercises_dir}; pass --exercises DIR")
    pristine = {}
    for path in sorted(exercises_dir.glob("*.ipynb")):
        try:
            pristine[path.stem] = nbformat.read(path, as_version=4)
        except Exception as exc:
            raise FileNotFoundError(f"unreadable exercise notebook {path} ({checks.error_line(exc)}); "
                                    "regenerate it with `course assign`") from None
    return pristine


def submissions(target: Path) -> list[Path]:
    if target.is_dir():
        return sorted(p for p in target.iterdir() if p.suffix == ".ipynb" and not p.is_dir())
    if target.exists():
        return [target]
    raise FileNotFoundError(f"no file or folder at {target}")


def make_sandbox(args: argparse.Namespace) -> Sandbox:
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    caps = Caps(memory_mb=args.memory_mb, processes=args.max_processes, cpus=threads)
    sandbox = Sandbox(caps, enabled=not args.no_sandbox, threads=threads)
    sandbox.check()
    return sandbox


def outputs(args: argparse.Namespace, target: Path) -> Gradebook:
    """Where the results go: ``--out DIR`` holds gradebook.csv (for a folder), results.json and
    feedback/; a folder graded without ``--out`` writes them to ``FOLDER.graded/`` beside it (never
    to the current folder). --gradebook, --json and --feedback name other places for each."""
    out = Path(args.out) if args.out else target.resolve().with_name(target.resolve().name + ".graded") \
        if target.is_dir() else None
    csv_path = Path(args.gradebook) if args.gradebook else out / "gradebook.csv" if out and target.is_dir() else None
    json_path = Path(args.json) if args.json else out / "results.json" if out else None
    feedback = Path(args.feedback) if args.feedback else out / "feedback" if out else None
    return Gradebook(csv_path, json_path, feedback)


def share(args: argparse.Namespace, count: int) -> float | None:
    """Each submission's share of ``--class-budget`` minutes (``--jobs`` at a time), or None."""
    if args.class_budget is None or not count:
        return None
    return args.class_budget * 60 * max(1, args.jobs) / count


def solutions_beside(exercises: Path) -> Path | None:
    """The ``solutions/`` folder beside the exercises folder, whose answers a submission must not
    simply be (None where there is none: nothing is compared)."""
    folder = exercises.resolve().parent / "solutions"
    return folder if folder.is_dir() else None


def main(args: argparse.Namespace) -> int:
    try:
        pristine = load_pristine(Path(args.exercises))
        lesson = pick_lesson(pristine, args.lesson) if args.lesson else None
        files = submissions(Path(args.submission))
        sandbox = make_sandbox(args)
    except (FileNotFoundError, SandboxError) as exc:
        fix = "; or pass --no-sandbox to grade without isolation" if isinstance(exc, SandboxError) else ""
        print(f"course grade: {exc}{fix}", file=sys.stderr)
        return 2
    print(("WARNING: " if args.no_sandbox else "") + sandbox.describe(), flush=True)
    target = Path(args.submission)
    book = outputs(args, target)
    explicit = frozenset(k for k in ("cell_timeout", "notebook_timeout") if getattr(args, k) is not None)
    limits = Limits(args.cell_timeout or Limits.cell_timeout, args.notebook_timeout or Limits.notebook_timeout,
                    args.output_cap)
    seconds = share(args, len(files))
    if seconds is not None:
        print(f"class budget {args.class_budget:g} min: at most {seconds:.0f} s per submission", flush=True)
    found, together = alike.find(files, pristine, lesson, solutions_beside(Path(args.exercises)))
    run = Class(pristine, limits, sandbox, lesson, args.seed, explicit, seconds, found)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # each grading is its own sandbox
        futures = [pool.submit(grade_file, path, run) for path in files]
        for future in as_completed(futures):
            sub = future.result()
            book.add(sub)
            print(table(sub), flush=True)
    lessons = sorted({sub.lesson for sub in book.rows if sub.lesson})
    if lesson is None and len(lessons) > 1:
        print(f"WARNING: submissions of {len(lessons)} lessons ({', '.join(lessons)}), each graded against its "
              "own; pass --lesson NN to grade a class against one", flush=True)
    if together:
        print(f"read together ({len(together)}; the gradebook's alike column says why):", flush=True)
        for line in together:
            print(f"  {clean(line, 2000)}", flush=True)
    if book.csv_path:
        print(f"gradebook: {book.csv_path} ({len(book.rows)} rows)")
    if book.json_path:
        print(f"results: {book.json_path}")
    if book.feedback:
        print(f"feedback: {book.feedback}/ ({len(book.rows)} files)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("grade", help="grade a submitted exercise notebook, or a folder of them",
                       allow_abbrev=False)
    p.add_argument("submission", help="a submitted .ipynb, or a folder of them (one student per file)")
    p.add_argument("--exercises", default=str(DEFAULT_EXERCISES), help="the pristine exercise notebooks")
    p.add_argument("--lesson", metavar="NN", help="grade every submission as this lesson (00 or 00_setup); a "
                   "submission that claims another is flagged (default: each one's own lesson)")
    p.add_argument("--out", metavar="DIR", help="folder for gradebook.csv, results.json and feedback/, readable by "
                   "your group (default for a folder of submissions: FOLDER.graded beside it)")
    p.add_argument("--json", metavar="FILE", help="results as JSON elsewhere (default DIR/results.json)")
    p.add_argument("--gradebook", metavar="CSV", help="gradebook elsewhere (default DIR/gradebook.csv for a folder)")
    p.add_argument("--feedback", metavar="DIR", help="a Markdown report and the same as an HTML page per "
                   "submission, elsewhere (default DIR/feedback)")
    p.add_argument("--cell-timeout", type=int, help=f"seconds per answer cell and per exercise (default "
                   f"{Limits.cell_timeout}, or the lesson's own)")
    p.add_argument("--notebook-timeout", type=int,
                   help=f"seconds per notebook (default {Limits.notebook_timeout}, or the lesson's own)")
    p.add_argument("--class-budget", type=float, metavar="MINUTES",
                   help="wall-clock minutes for the whole class: each submission gets its share (budget x jobs / "
                   "submissions) as its cell and notebook limit")
    p.add_argument("--output-cap", type=int, default=Limits.output_cap, help="characters of output kept per notebook")
    p.add_argument("--memory-mb", type=int, default=Caps.memory_mb,
                   help=f"memory cap per submission as a whole (cgroup), else per process (default {Caps.memory_mb})")
    p.add_argument("--max-processes", type=int, default=Caps.processes,
                   help="tasks (processes and threads) per submission")
    p.add_argument("--jobs", type=int, default=1, help="submissions graded at the same time (default 1)")
    p.add_argument("--seed", type=int, help="fix the random cases, e.g. to re-grade a row with the seed the "
                   "gradebook recorded (default: a fresh seed per submission)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade without isolation (only for your own trusted notebooks; marked in the gradebook)")
    p.set_defaults(func=main)
