"""``course-dev gpu-check --dry-run``: the one-call GPU check runs every step on the CPU at tiny sizes,
so it cannot rot between the rare runs on a lent GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_tools.dev import gpu_check
from course_tools.dev import main as course_dev

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu-check")
    done = subprocess.run([sys.executable, "-m", "course_tools.dev", "gpu-check", "--dry-run", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    return done, out


@pytest.mark.slow
def test_dry_run_passes_every_step_and_writes_the_report(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["dry_run"] is True and report["device"] == "cpu"
    assert [s["name"] for s in report["steps"]] == list(gpu_check.STEPS)
    assert {s["name"]: s["status"] for s in report["steps"]} == dict.fromkeys(gpu_check.STEPS, "pass")
    # the files a device call brings back: flat, at most eight
    files = sorted(p.name for p in out.iterdir())
    assert all(p.is_file() for p in out.iterdir()) and len(files) <= 8, files


@pytest.mark.slow
def test_dry_run_says_why_each_gpu_test_is_skipped(dry_run):
    _, out = dry_run
    steps = {s["name"]: s for s in json.loads((out / "report.json").read_text())["steps"]}
    tests = steps["tests"]["figures"]["tests"]
    assert tests["test_mfu_arithmetic_uses_the_dense_bf16_peak"]["status"] == "pass"  # arithmetic runs anywhere
    skipped = {name: t for name, t in tests.items() if t["status"] == "skip"}
    assert len(skipped) >= 7 and all("needs a CUDA device" in t["reason"] for t in skipped.values())
    bench = steps["bench"]["figures"]
    assert [r["name"] for r in bench["rows"]] == ["course", "hf"]
    assert bench["rows"][0]["course_over_this"] == 1.0 and bench["rows"][1]["tokens_per_s"] > 0
    assert any("torch.compile" in reason for reason in bench["skipped"])
    char = steps["char"]["figures"]
    assert char["steps"] == 30 and len(char["curve"]["val_loss"]) == len(char["curve"]["eval_elapsed"]) >= 2
    assert char["step_at_target"] is None  # a 30-step smoke model does not reach 1.47


@pytest.mark.slow
def test_dry_run_writes_the_executed_lesson_and_skips_the_others_saying_why(dry_run):
    done, out = dry_run
    first, *others = gpu_check.LESSONS
    nb = nbformat.read(out / Path(first).name, as_version=4)
    assert nb.metadata["course"]["mode"] == "smoke"
    assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    lessons = {s["name"]: s for s in json.loads((out / "report.json").read_text())["steps"]}["lessons"]["figures"]
    assert lessons[first]["status"] == "pass"
    assert all(lessons[p] == {"status": "skip", "reason": "the dry run executes lesson 03 only"} for p in others)
    log = (out / "gpu-check.log").read_text()
    assert all(f"==== {name}" in log for name in gpu_check.STEPS)


def test_time_to_target_reads_the_first_evaluation_at_or_below_it():
    history = {"val_loss": [2.0, 1.5, 1.46, 1.40], "eval_step": [0, 250, 500, 750], "eval_elapsed": [1, 20, 40, 60]}
    assert gpu_check.time_to_target(history, 1.47) == (500, 40)
    assert gpu_check.time_to_target(history, 1.0) == (None, None)


def test_gpu_check_mistakes_are_one_line(capsys, tmp_path):
    assert course_dev(["gpu-check", "--out", str(tmp_path), "--dry-run", "--only", "tests,warp"]) == 2
    assert capsys.readouterr().err == ("course-dev gpu-check: error: unknown step 'warp'; "
                                       "choose from tests, bench, char, lessons\n")
    assert course_dev(["gpu-check", "--out", str(tmp_path)]) == 2  # no CUDA here, no --dry-run
    assert "run with --dry-run" in capsys.readouterr().err
