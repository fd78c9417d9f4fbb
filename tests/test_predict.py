"""Predict, then run: the comparison of a written prediction with a measurement."""

import torch

from course_tools.exercises.predict import judge, reveal


def test_missing_prediction_shows_the_measurement_and_the_reason(capsys):
    assert reveal(..., (2, 3), why="because.") is None and not judge(..., (2, 3))
    assert capsys.readouterr().out == (
        "your prediction: none yet (write it in the cell above, then run this cell again)\n"
        "measured: (2, 3)\nwhy: because.\n")


def test_the_first_line_never_holds_the_measurement(capsys):
    # JupyterLab shows the first line of a collapsed output: it must not give the answer away
    for prediction in (..., 7, (2, 3)):
        reveal(prediction, (2, 3), why="w")
        first = capsys.readouterr().out.splitlines()[0]
        assert first.startswith("your prediction:") and "(2, 3)" not in first.replace(repr(prediction), "")


def test_numbers_count_as_right_within_the_tolerance(capsys):
    reveal(0.9, torch.tensor(0.93), why="w", tolerance=0.05)
    assert "within 0.05" in capsys.readouterr().out and judge(0.9, torch.tensor(0.93), tolerance=0.05)
    reveal(0.5, 0.93, why="w", tolerance=0.05)
    assert "not what happened" in capsys.readouterr().out and not judge(0.5, 0.93, tolerance=0.05)


def test_shapes_lists_and_flags_compare_exactly(capsys):
    assert judge((2, 2, 3, 3), torch.Size([2, 2, 3, 3]))
    assert judge([2, 3], torch.tensor([2.0, 3.0]))
    assert not judge(True, False) and not judge("cat", "walks")


def test_the_cells_from_a_prediction_to_its_reveal_are_hidden_and_nothing_else():
    import nbformat

    from course_tools.exercises.predict import hide_reveals, is_hidden, reveal_span

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("**Predict, then run.**"),
        nbformat.v4.new_code_cell("prediction_x = ...  # a number"),
        nbformat.v4.new_code_cell("y = x + 1\nprint(y)", metadata={"slideshow": {"slide_type": "skip"}}),
        nbformat.v4.new_code_cell("reveal(prediction_x, y, why='.')"),
        nbformat.v4.new_code_cell("print('after')"),
    ])
    assert reveal_span(nb.cells) == [3, 4] and not any(is_hidden(c) for c in nb.cells)
    assert hide_reveals(nb) == 2 and hide_reveals(nb) == 0
    assert [is_hidden(c) for c in nb.cells] == [False, False, False, True, True, False]
    meta = [c.metadata for c in nb.cells]
    assert meta[3]["slideshow"]["slide_type"] == "skip"        # a skipped cell stays off the slides
    assert meta[4]["slideshow"]["slide_type"] == "fragment"
    assert meta[4]["jupyter"]["outputs_hidden"] is True and "hide-output" in meta[4]["tags"]
    assert meta[4]["jupyter"]["source_hidden"] is True and "hide-input" in meta[4]["tags"]   # why= tells
    assert "source_hidden" not in meta[3]["jupyter"] and "hide-input" not in meta[3]["tags"]
