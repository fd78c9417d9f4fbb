"""``course-dev gpu-check --out DIR``: every GPU path of the course, proven on one CUDA device in one call.

A lent GPU gives about 15 minutes in all, start-up included, so this runs everything in one go, each
step in its own process with its own time limit, and writes what it found as it goes:

1. ``tests``: the GPU tests (``tests/test_gpu.py``: bf16 autocast, TF32, compile, flash/efficient
   scaled-dot-product attention selected, fused AdamW, DDP with NCCL on one process under torchrun,
   exact resume, MFU arithmetic), pass/fail each;
2. ``bench``: ``course-dev bench gpu``: GPT-2 small's tokens/s and MFU for the course's GPT against
   Hugging Face's (and nanoGPT's model.py with ``--nanogpt``), interleaved;
3. ``char``: ``course train --config shakespeare_char`` (nanoGPT's 6 × 384, context 256 recipe) on
   ``--data`` (tinyshakespeare for the published anchor, validation 1.4697), its validation curve
   and the time at which it first reaches 1.47;
4. ``lessons``: lessons 03, 07 and 08 executed with ``course run --mode gpu``, written to DIR so they
   can be committed.

DIR gets ``report.json`` (rewritten after every step), ``gpu-check.log`` (every step's output), the
GPU tests' JUnit XML and the executed notebooks: at most eight flat files, which is what a device
call returns. ``--dry-run`` runs the same steps on the CPU at tiny sizes (smoke mode, a few training
steps, no compiling, lesson 03 alone in smoke mode), saying why each GPU-only part is skipped, so CI
keeps the command working.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from course_tools.cli.errors import fail
from course_utils import runtime

PROG = "course-dev gpu-check"
ROOT = Path(__file__).resolve().parents[2]
LESSONS = ("notebooks/03_multi_head_attention.ipynb", "notebooks/07_gpt_model.ipynb", "notebooks/08_train_gpt.ipynb")
TARGET_VAL_LOSS = 1.47  # nanoGPT's shakespeare_char: 1.4697 in about 3 minutes on an A100 (published)
STEPS = ("tests", "bench", "char", "lessons")
# seconds each step may take on the GPU; the char run's time budget is what remains of its share
BUDGET = {"tests": 80, "bench": 120, "char": 110, "lessons": 170}
DRY_BUDGET = {"tests": 120, "bench": 120, "char": 120, "lessons": 300}


@dataclass
class StepResult:
    """One step: ``status`` pass, fail or skip; ``reason`` why it failed or was skipped."""

    name: str
    status: str
    seconds: float
    reason: str = ""
    figures: dict = field(default_factory=dict)


@dataclass
class Report:
    dry_run: bool
    device: str
    torch: str
    cuda: str | None
    time_limit_s: float
    steps: list[StepResult] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def write(self, out: Path) -> None:
        data = {k: v for k, v in asdict(self).items() if k != "started"}
        data["seconds"] = round(time.perf_counter() - self.started, 1)
        (out / "report.json").write_text(json.dumps(data, indent=1) + "\n")


class Log:
    """Appends every step's command and output to DIR/gpu-check.log, and echoes one line per step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def section(self, title: str, text: str) -> None:
        with self.path.open("a") as f:
            f.write(f"==== {title}\n{text.rstrip()}\n")


def _run(cmd: list[str], timeout: float, log: Log, title: str, env: dict | None = None) -> tuple[int, str]:
    """Run ``cmd`` in the repository with a time limit; (exit status, output). 124 = timed out."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                "PYTHONUNBUFFERED": "1", **(env or {})}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, timeout), env=full_env)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        code = 124
        output = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or "")
        output += f"\n[timed out after {timeout:.0f} s]"
    log.section(f"{title}: {' '.join(cmd)} (exit {code})", output)
    return code, output


def _course(*args: str) -> list[str]:
    return [sys.executable, "-m", "course_tools.cli", *args]


def _course_dev(*args: str) -> list[str]:
    return [sys.executable, "-m", "course_tools.dev", *args]


def step_tests(out: Path, dry_run: bool, timeout: float, log: Log) -> StepResult:
    """The GPU tests, one verdict each from pytest's JUnit XML (on a CPU they skip, saying why)."""
    xml = out / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "tests/test_gpu.py", "-o", "addopts=", "-p", "no:cacheprovider",
           "-q", "-rs", f"--junitxml={xml}"]
    t0 = time.perf_counter()
    code, output = _run(cmd, timeout, log, "tests")
    seconds = time.perf_counter() - t0
    if not xml.is_file():
        return StepResult("tests", "fail", seconds, f"pytest wrote no report (exit {code}): {output[-300:]}")
    tests = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        verdict, why = "pass", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                verdict, why = ("skip" if kind == "skipped" else "fail"), (node.get("message") or "")[:300]
        tests[case.get("name")] = {"status": verdict, "reason": why}
    failed = [name for name, t in tests.items() if t["status"] == "fail"]
    status = "fail" if failed or code not in (0, 5) else "pass"
    return StepResult("tests", status, seconds, f"failed: {', '.join(failed)}" if failed else "", {"tests": tests})


def step_bench(out: Path, dry_run: bool, timeout: float, log: Log, nanogpt: str | None) -> StepResult:
    """``course-dev bench gpu``: tokens/s, MFU and the ratios, read back from its JSON."""
    path = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "bench.json"
    args = ["bench", "gpu", "--json", str(path)]
    args += ["--dry-run", "--rounds", "1", "--steps", "1"] if dry_run else ["--rounds", "5", "--steps", "10"]
    args += ["--nanogpt", nanogpt] if nanogpt else []
    t0 = time.perf_counter()
    code, output = _run(_course_dev(*args), timeout, log, "bench")
    seconds = time.perf_counter() - t0
    if code != 0 or not path.is_file():
        return StepResult("bench", "fail", seconds, f"exit {code}: {output.strip().splitlines()[-1:] or ''}")
    return StepResult("bench", "pass", seconds, figures=json.loads(path.read_text()))


def time_to_target(history: dict, target: float) -> tuple[int | None, float | None]:
    """(step, seconds) of the first evaluation at or below ``target``; (None, None) if none was."""
    for i, loss in enumerate(history["val_loss"]):
        if loss <= target:
            return history["eval_step"][i], history["eval_elapsed"][i]
    return None, None


def step_char(out: Path, dry_run: bool, timeout: float, log: Log, data: str) -> StepResult:
    """nanoGPT's shakespeare_char recipe with the course's trainer, under a time budget that ends
    inside the step's share; the curve and the time to 1.47 come from the checkpoint's history."""
    from course_utils.train import load_checkpoint

    run_dir = Path(tempfile.mkdtemp(prefix="gpu-check-char-"))
    if dry_run:  # the smoke preset: a few steps of a tiny model
        args = ["train", "--config", "smoke", "--data", data, "--max-iters", "30", "--out", str(run_dir), "--quiet"]
    else:  # compile and data preparation come out of the budget too (course train counts them)
        budget = max(30, int(timeout - 25))
        args = ["train", "--config", "shakespeare_char", "--data", data, "--time-budget", f"{budget}s",
                "--out", str(run_dir), "--quiet"]
    t0 = time.perf_counter()
    code, output = _run(_course(*args), timeout, log, "char")
    seconds = time.perf_counter() - t0
    ckpt = run_dir / "ckpt.pt"
    if code != 0 or not ckpt.is_file():
        return StepResult("char", "fail", seconds, f"exit {code}: {output.strip().splitlines()[-1:] or ''}")
    history = load_checkpoint(ckpt)["history"]
    step, when = time_to_target(history, TARGET_VAL_LOSS)
    figures = {"config": "smoke" if dry_run else "shakespeare_char", "data": data, "steps": history["step"][-1] + 1,
               "final_val_loss": history["val_loss"][-1], "best_val_loss": min(history["val_loss"]),
               "target": TARGET_VAL_LOSS, "step_at_target": step, "seconds_at_target": when,
               "curve": {k: history[k] for k in ("eval_step", "eval_elapsed", "train_loss", "val_loss")},
               "summary": output.strip().splitlines()[-1:]}
    return StepResult("char", "pass", seconds, figures=figures)


def step_lessons(out: Path, dry_run: bool, timeout: float, log: Log) -> StepResult:
    """Lessons 03, 07, 08 in gpu mode, one ``course run`` each (a slow one cannot cost the others their
    copies), written to ``out``. A dry run executes lesson 03 alone in smoke mode: that tests this
    step's plumbing, and the test suite executes every lesson in smoke mode anyway."""
    mode = "smoke" if dry_run else "gpu"
    lessons = LESSONS[:1] if dry_run else LESSONS
    figures: dict = {path: {"status": "skip", "reason": "the dry run executes lesson 03 only"} for path in LESSONS}
    start = time.perf_counter()
    for path in lessons:
        left = timeout - (time.perf_counter() - start)
        if left < 10:
            figures[path] = {"status": "skip", "reason": "the step's time is used up"}
            continue
        timings = Path(tempfile.mkdtemp(prefix="gpu-check-")) / "timings.json"
        code, _ = _run(_course("run", "--mode", mode, "--out-dir", str(out), "--timings", str(timings), path),
                       left, log, f"lessons: {path}")
        row = json.loads(timings.read_text())[0] if timings.is_file() else {"status": f"exit {code}", "seconds": left}
        figures[path] = {"status": "pass" if row["status"] == "ok" else "fail", "reason": row["status"],
                         "seconds": round(row["seconds"], 1)}
    seconds = time.perf_counter() - start
    bad = [path for path, r in figures.items() if r["status"] == "fail"]
    return StepResult("lessons", "fail" if bad else "pass", seconds, f"not ok: {', '.join(bad)}" if bad else "",
                      figures)


def check(out: Path, dry_run: bool, time_limit: float, data: str, nanogpt: str | None,
          only: tuple[str, ...] = STEPS) -> Report:
    """Run the steps in order, each within its share and within what is left of ``time_limit``."""
    out.mkdir(parents=True, exist_ok=True)
    device = runtime.device()
    if device.type != "cuda" and not dry_run:
        raise RuntimeError(f"no CUDA device here (found {device.type}); run with --dry-run to test the command")
    report = Report(dry_run, torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
                    torch.__version__, torch.version.cuda, time_limit)
    log = Log(out / "gpu-check.log")
    shares = DRY_BUDGET if dry_run else BUDGET
    runners = {"tests": lambda t: step_tests(out, dry_run, t, log),
               "bench": lambda t: step_bench(out, dry_run, t, log, nanogpt),
               "char": lambda t: step_char(out, dry_run, t, log, data),
               "lessons": lambda t: step_lessons(out, dry_run, t, log)}
    for name in STEPS:
        left = time_limit - (time.perf_counter() - report.started)
        if name not in only:
            result = StepResult(name, "skip", 0.0, "not asked for (--only)")
        elif left < 20:
            result = StepResult(name, "skip", 0.0, f"the time limit of {time_limit:.0f} s is used up")
        else:
            result = runners[name](min(shares[name], left))
        report.steps.append(result)
        report.write(out)
        print(f"{name:<8} {result.status:<5} {result.seconds:6.1f} s  {result.reason}", flush=True)
    return report


def main(args: argparse.Namespace) -> int:
    only = tuple(args.only.split(",")) if args.only else STEPS
    unknown = [s for s in only if s not in STEPS]
    if unknown:
        return fail(PROG, ValueError(f"unknown step {unknown[0]!r}; choose from {', '.join(STEPS)}"))
    try:
        report = check(Path(args.out), args.dry_run, args.time_limit, args.data, args.nanogpt, only)
    except (OSError, RuntimeError) as err:
        return fail(PROG, err)
    print(f"report: {Path(args.out) / 'report.json'}")
    return 0 if all(s.status != "fail" for s in report.steps) else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``course-dev gpu-check``."""
    p = sub.add_parser("gpu-check", help="prove every GPU path on one CUDA device in one call (--dry-run: on the CPU)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.json, the log and the notebooks")
    p.add_argument("--dry-run", action="store_true", help="the same steps on the CPU at tiny sizes")
    p.add_argument("--data", default="shakespeare",
                   help="text for the shakespeare_char run: PATH.txt (tinyshakespeare for nanoGPT's anchor) "
                   "or 'shakespeare', the course corpus (default)")
    p.add_argument("--nanogpt", metavar="MODEL.PY", help="nanoGPT's model.py, to add it to the benchmark")
    p.add_argument("--time-limit", type=float, default=480.0, help="seconds for all steps together (default 480)")
    p.add_argument("--only", metavar="STEPS", help=f"comma-separated subset of {','.join(STEPS)}")
    p.set_defaults(func=main)
