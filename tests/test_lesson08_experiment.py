"""Lesson 08's experiment: the learner's notebook and the grader's reference sweep the same data.

The grader hides ``course_tools.exercises.references`` from submissions, so solutions/08 defines the bigram
tokens and the learning-rate grid itself; they must stay equal to the reference's."""

from pathlib import Path

import nbformat
import torch

from course_tools.exercises.references import lesson08

ROOT = Path(__file__).resolve().parent.parent


def notebook_definitions() -> dict:
    nb = nbformat.read(ROOT / "solutions" / "08_train_gpt.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and "def bigram_tokens" in c.source)
    namespace: dict = {"torch": torch}  # imported by the notebook's setup cell
    threads = torch.get_num_threads()
    try:
        exec(source.split("\nbigram = ")[0], namespace)  # the definitions, not the 20,000-token draw
    finally:
        torch.set_num_threads(threads)  # the cell sets one thread for its tiny model
    return namespace


def test_notebook_builds_the_reference_tokens_and_grid():
    defined = notebook_definitions()
    assert defined["LR_GRID"] == lesson08.LR_GRID
    for seed in (0, 3):
        assert torch.equal(defined["bigram_tokens"](500, seed), lesson08.bigram_tokens(500, seed))
