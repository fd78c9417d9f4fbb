"""PyTorch's CPU threads inside a block of code.

Small models on shared cores often run faster on one thread than on several (each step waits for
its slowest thread); word2vec and the graders' references pin the count for a block with
``torch_threads``. How ``course train`` picks its thread count is run-time tuning
(``course_tools.cli.tuning``), not part of the library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """PyTorch's intra-op threads set to ``n`` (None: unchanged) inside the block, restored after it."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
