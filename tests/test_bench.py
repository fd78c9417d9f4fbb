"""``course-dev bench``: ``cpu`` at a tiny size (both models the same size, a table with the ratio), the
interleaved rounds all three modes share, and the mistakes argparse turns away."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch

from course_tools.dev import main as course_dev
from course_tools.dev.bench import cpu as bench
from course_tools.dev.bench import shared


def test_the_two_models_have_the_same_parameters():
    size = bench.SIZES["tiny"]
    ours, theirs = bench.course_model(size), bench.reference_model(size)
    count = lambda m: sum(p.numel() for p in m.parameters())  # tied embeddings count once
    assert count(ours) == count(theirs) == (65 + 16) * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
    x = torch.randint(65, (2, 16))
    assert ours(x).shape == theirs(x).shape == (2, 16, 65)


def test_bench_prints_speeds_the_ratio_and_its_interval(capsys):
    threads = torch.get_num_threads()
    assert course_dev(["bench", "cpu", "--sizes", "tiny", "--threads", "1", "--rounds", "1", "--steps", "1"]) == 0
    assert torch.get_num_threads() == threads  # restored
    out = capsys.readouterr().out
    row = re.search(r"^tiny\s+1\s+1\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)-([\d.]+)$", out, re.M)
    assert row, out
    ours, theirs, ratio, low, high = (float(g.replace(",", "")) for g in row.groups())
    assert ours > 0 and theirs > 0
    # one round: the ratio of the two speeds, up to how they are printed (speeds to the token, the ratio to
    # 3 decimals): on a loaded machine the speeds are small and their rounding moves the quotient most
    rounding = ratio * (0.5 / ours + 0.5 / theirs) + 0.0005
    assert abs(ratio - ours / theirs) <= rounding + 1e-9, (ratio, ours, theirs)
    assert low == high == ratio  # one round: the interval is that round
    assert "1 step(s) of each model per round" in out
    assert "load average before" in out and "load average after" in out


class FakeTrainer:
    """Stands in for ``cpu.Trainer``: each call takes the next of ``times`` and logs its name."""

    def __init__(self, name: str, times: list[float], log: list[str]) -> None:
        self.name, self.times, self.log, self.tokens_per_step = name, iter(times), log, 100

    def steps(self, n: int) -> float:
        self.log.append(self.name)
        return n * next(self.times)


def fake_trainers(monkeypatch, ours_times: list[float], theirs_times: list[float]) -> list[str]:
    log: list[str] = []
    made = iter([FakeTrainer("ours", ours_times, log), FakeTrainer("theirs", theirs_times, log)])
    monkeypatch.setattr(bench, "Trainer", lambda model, size: next(made))
    monkeypatch.setattr(bench, "course_model", lambda size: None)
    monkeypatch.setattr(bench, "reference_model", lambda size: None)
    return log


def test_rounds_alternate_the_order_and_the_ratio_is_the_median_of_pairs(monkeypatch):
    # two warm-up calls each (0 steps, then the timed one), then 5 rounds; round 2 is disturbed for
    # both (a neighbour), round 4 for ours only
    log = fake_trainers(monkeypatch, [1.0, 1.0, 1.0, 1.0, 3.0, 1.0, 5.0], [1.0, 1.0, 1.1, 1.1, 3.3, 1.1, 1.1])
    r = bench.compare(bench.SIZES["tiny"], 1, rounds=5, steps=1, warmup=1)
    assert log == ["ours", "theirs"] * 2 + ["ours", "theirs", "theirs", "ours"] * 2 + ["ours", "theirs"]
    # ratios per round: 1.1, 1.1, 1.1, 1.1, 0.22 -> the median ignores the one-sided disturbance
    assert r.ratio == pytest.approx(1.1)
    assert (r.low, r.high) == (pytest.approx(0.22), pytest.approx(1.1))  # 5 rounds: the range
    assert r.course_tokens_per_s == pytest.approx(100 / 1.0) and r.reference_tokens_per_s == pytest.approx(100 / 1.1)
    assert r.rounds == 5


def test_without_rounds_as_many_as_fit_in_the_seconds(monkeypatch):
    # the timed warm-up round takes 0.2 + 0.3 s, so 20 s hold 40 rounds
    fake_trainers(monkeypatch, [0.0, 0.2] + [0.2] * 40, [0.0, 0.3] + [0.3] * 40)
    assert bench.compare(bench.SIZES["tiny"], 1, seconds=20.0).rounds == 40
    # 10 s would hold 20 rounds: too few for a narrow interval, so MIN_ROUNDS (31) run
    fake_trainers(monkeypatch, [0.0, 0.2] + [0.2] * 31, [0.0, 0.3] + [0.3] * 31)
    assert bench.compare(bench.SIZES["tiny"], 1, seconds=10.0).rounds == bench.MIN_ROUNDS == 31


def test_median_interval_has_its_stated_coverage():
    # n = 41: ranks 14 and 28 (1-based) from the binomial, the textbook values for a 95% interval
    xs = [float(i) for i in range(41)]
    assert shared.median_interval(xs[::-1]) == (13.0, 27.0)
    assert shared.median_interval([2.0, 1.0, 3.0]) == (1.0, 3.0)  # too few for 95%: the range
    assert shared.median_interval([4.0]) == (4.0, 4.0)
    # coverage on random samples from a skewed distribution whose median is known (exponential: ln 2)
    gen = torch.Generator().manual_seed(0)
    samples = torch.empty(4000, 41).exponential_(generator=gen)
    hits = sum(lo <= math.log(2) <= hi for lo, hi in (shared.median_interval(s.tolist()) for s in samples))
    assert 0.96 <= hits / 4000 <= 0.985  # exact coverage for n = 41: 1 - 2 P(Binomial(41, 1/2) <= 13) = 0.972
    with pytest.raises(ValueError, match="at least one value"):
        shared.median_interval([])
    with pytest.raises(ValueError, match="confidence"):
        shared.median_interval([1.0], confidence=1.0)


def test_interleave_rotates_the_order_every_round():
    log: list[str] = []
    runs = {name: (lambda name=name: log.append(name) or len(log)) for name in "abc"}
    assert shared.interleave(runs, 4) == {"a": [1, 6, 8, 10], "b": [2, 4, 9, 11], "c": [3, 5, 7, 12]}
    assert log == list("abc" "bca" "cab" "abc")
    assert shared.interleave({"x": lambda: 1}, 0) == {"x": []}


@pytest.mark.parametrize(("argv", "message"), [
    (["bench"], "the following arguments are required: mode"),
    (["bench", "cpu", "--dry-run"], "unrecognized arguments: --dry-run"),
    (["bench", "cpu", "--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
    (["bench", "cpu", "--steps", "two"], "argument --steps: 'two' is not a whole number"),
    (["bench", "cpu", "--sizes", "huge"], "argument --sizes: invalid choice: 'huge' (choose from"),
    (["bench", "gpu", "--batch", "-4"], "argument --batch: must be at least 1, got -4"),
    (["bench", "llama-cpp", "--threads", "1", "2"], "unrecognized arguments: 2"),
    (["bench", "group-sampling", "--G", "0"], "argument --G: must be at least 1, got 0"),
    (["bench", "group-sampling", "--new-tokens", "many"], "argument --new-tokens: 'many' is not a whole number"),
])
def test_bench_mistakes_are_one_line_from_argparse(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        course_dev(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1], err


def test_gpu_without_cuda_names_the_fix(capsys):
    assert course_dev(["bench", "gpu"]) == 2  # no CUDA on this machine
    assert capsys.readouterr().err == ("course-dev bench gpu: error: no CUDA device here (found cpu); use `course-dev "
                                       "bench cpu`, or `course-dev bench gpu --dry-run` to test the command\n")


def test_llama_cpp_missing_names_the_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where llama-cpp-python was never built
    assert course_dev(["bench", "llama-cpp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("course-dev bench llama-cpp: error: llama-cpp-python is not installed; "
                          "`pip install llama-cpp-python`")
    assert err.count("\n") == 1


def test_group_sampling_without_transformers_names_the_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as where the lesson12 extra is not installed
    assert course_dev(["bench", "group-sampling"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("course-dev bench group-sampling: error: transformers is not installed; "
                          'pip install -e ".[lesson12]" installs it')
    assert err.count("\n") == 1
