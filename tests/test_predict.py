"""Predict, then run: the comparison of a written prediction with a measurement."""

import torch

from course_tools.predict import judge, reveal


def test_missing_prediction_shows_the_measurement_and_the_reason(capsys):
    assert reveal(..., (2, 3), why="because.") is None and not judge(..., (2, 3))
    assert capsys.readouterr().out == ("measured: (2, 3) (write your prediction first, then run this cell again)\n"
                                       "why: because.\n")


def test_numbers_count_as_right_within_the_tolerance(capsys):
    reveal(0.9, torch.tensor(0.93), why="w", tolerance=0.05)
    assert "within 0.05" in capsys.readouterr().out and judge(0.9, torch.tensor(0.93), tolerance=0.05)
    reveal(0.5, 0.93, why="w", tolerance=0.05)
    assert "not what happened" in capsys.readouterr().out and not judge(0.5, 0.93, tolerance=0.05)


def test_shapes_lists_and_flags_compare_exactly(capsys):
    assert judge((2, 2, 3, 3), torch.Size([2, 2, 3, 3]))
    assert judge([2, 3], torch.tensor([2.0, 3.0]))
    assert not judge(True, False) and not judge("cat", "walks")
