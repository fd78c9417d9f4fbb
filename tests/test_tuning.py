"""Run-time tuning of ``course train`` (course_tools.cli.tuning): measured thread counts and the
fall-back under contention, when to compile on a CPU, the peaks behind MFU; and its processes
(course_tools.cli.process_group)."""

import pytest
import torch

from course_tools.cli import main as course
from course_tools.cli import process_group, tuning
from course_tools.cli.tuning import ThreadTuner
from course_utils import train as T
from course_utils.gpt import GPT, GPTConfig

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")


def tuner(**kw):
    calls = []
    t = ThreadTuner(2, probe=4, skip=2, set_threads=calls.append, **kw)
    return t, calls


def feed(t, seconds):
    for s in seconds:
        t.observe(s)


def test_two_threads_kept_when_faster():
    t, calls = tuner()
    feed(t, [9, 9] + [0.10] * 4 + [0.06] * 4 + [0.06] * 10)
    assert t.decided and t.threads == 2 and calls == [1, 2, 2]
    assert "on 2 threads vs 100.0 ms on one" in t.log[-1]


def test_one_thread_kept_when_two_are_slower_and_the_probe_stops_at_the_first_slow_step():
    t, calls = tuner()
    feed(t, [9, 9] + [0.10] * 4 + [1.6])
    assert t.decided and t.threads == 1 and calls == [1, 2, 1]
    assert t.times[2] == [1.6]  # one slow step was enough: contention costs at most one step


def test_falls_back_to_one_thread_for_good_when_steps_slow_down():
    t, calls = tuner(patience=3)
    feed(t, [9, 9] + [0.10] * 4 + [0.06] * 10 + [0.5, 0.06, 0.5, 0.5])
    assert t.threads == 2  # two slow steps in a row are not enough
    feed(t, [0.5])
    assert t.threads == 1 and t.fell_back and calls[-1] == 1 and "another process took a core" in t.log[-1]
    feed(t, [0.01] * 20)
    assert t.threads == 1 and calls[-1] == 1


def test_needs_more_than_one_thread():
    with pytest.raises(ValueError, match="at least 2 threads"):
        ThreadTuner(1)


def test_course_train_measures_threads_by_default(tmp_path, capsys):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("To be, or not to be, that is the question.\n" * 60, encoding="utf-8")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert course(["train", "--data", str(corpus), "--config", "smoke", "--max-iters", "20", "--quiet",
                       "--out", str(tmp_path / "run")]) == 0
        out = capsys.readouterr().out
        assert "threads: 2 thread(s): probing after 6 steps" in out
        assert torch.get_num_threads() in (1, 2)
        assert course(["train", "--data", str(corpus), "--config", "smoke", "--max-iters", "2", "--threads", "1",
                       "--quiet", "--out", str(tmp_path / "run1")]) == 0
        assert "threads:" not in capsys.readouterr().out and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_threads_asked_for_are_set_and_bad_counts_are_refused():
    before = torch.get_num_threads()
    try:
        assert tuning.choose_threads(1, T.Dist()) is None and torch.get_num_threads() == 1
        with pytest.raises(ValueError, match="at least 1"):
            tuning.choose_threads(0, T.Dist())
    finally:
        torch.set_num_threads(before)


def test_several_processes_or_one_core_use_the_fixed_count(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert tuning.choose_threads(None, T.Dist(0, 2, CPU)) is None and calls == [tuning.CPU_THREADS]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert tuning.choose_threads(None, T.Dist()) is None and calls[-1] == tuning.CPU_THREADS
    assert tuning.choose_threads(None, T.Dist(device=CUDA)) is None and len(calls) == 2  # GPUs: left alone


def test_course_train_refuses_zero_threads_in_one_line(capsys):
    assert course(["train", "--config", "smoke", "--threads", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["course train: error: --threads must be at least 1, got 0"]


@pytest.mark.parametrize(("budget", "device", "expected"), [
    (None, CUDA, True),
    (None, CPU, False),  # no budget: the length of the run is unknown
    (110.0, CPU, False),
    (10_000.0, CPU, True),
    (10_000.0, MPS, False),
])
def test_course_train_compiles_only_when_it_pays(budget, device, expected):
    assert tuning.compile_default(budget, device) is expected


def test_break_even_budget_is_the_threshold():
    at, below = tuning.CPU_COMPILE_BREAK_EVEN, tuning.CPU_COMPILE_BREAK_EVEN - 1
    assert tuning.compile_default(at, CPU) and not tuning.compile_default(below, CPU)


@pytest.mark.parametrize(("compile_", "device", "expected"), [
    (None, CUDA, True), (None, CPU, False), (None, MPS, False), (True, CPU, True), (False, CUDA, False)])
def test_the_trainer_compiles_on_cuda_or_when_told(compile_, device, expected):
    assert T.compiles(T.TrainConfig(compile=compile_, time_budget=10_000.0), device) is expected


def test_peak_table():
    assert tuning.peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.0
    assert tuning.peak_tflops("NVIDIA H100 PCIe", torch.bfloat16) == 756.0
    assert tuning.peak_tflops("NVIDIA A100-SXM4-80GB", torch.float32) == 156.0
    assert tuning.peak_tflops("NVIDIA L40S", torch.bfloat16) == 362.0
    assert tuning.peak_tflops("NVIDIA L4", torch.bfloat16) == 121.0
    assert tuning.peak_tflops("Some Future GPU", torch.bfloat16) is None
    assert tuning.peak_tflops("Tesla V100-SXM2-16GB", torch.float16) == 125.0  # fp16 tensor cores
    assert tuning.peak_tflops("Tesla V100-SXM2-16GB", torch.bfloat16) is None  # no bf16 units
    assert tuning.peak_tflops("Tesla T4", torch.bfloat16) is None


def test_mfu_divides_by_the_peak_on_cuda_only(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert tuning.mfu(31.2, CUDA, torch.bfloat16) == pytest.approx(0.1)
    assert tuning.mfu(31.2, CPU, torch.float32) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert tuning.mfu(31.2, CUDA, torch.bfloat16) is None


def test_one_process_runs_on_the_runtime_device(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert process_group.join() == T.Dist(device=T.runtime.device())
    process_group.leave()  # no process group: nothing to close, no error


def test_wrap_compiles_lazily_and_shares_the_weights():
    raw = GPT(GPTConfig(20, 8, 1, 2, 16))
    wrapped = T._wrap(raw, T.TrainConfig(compile=True), T.Dist())
    assert wrapped is not raw and wrapped._orig_mod is raw  # nothing is compiled until the first call
    assert T._wrap(raw, T.TrainConfig(compile=False), T.Dist()) is raw
