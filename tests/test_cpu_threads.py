"""ThreadTuner: measured thread counts, the fall-back under contention, and its use by course train."""

import pytest
import torch

from course_tools.cli import main as course
from course_utils.cpu_threads import ThreadTuner


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
