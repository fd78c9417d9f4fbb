"""When ``course train`` compiles on a CPU, and how many threads it uses there by default."""

from __future__ import annotations

import pytest
import torch

from course_utils import train as T
from course_utils.gpt import GPT, GPTConfig

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")


def test_the_readmes_110_second_cpu_run_stays_eager():
    assert T.CPU_COMPILE_BREAK_EVEN > 110


@pytest.mark.parametrize(("compile_", "budget", "device", "expected"), [
    (None, None, CUDA, True),
    (None, None, CPU, False),  # no budget: the length of the run is unknown
    (None, 110.0, CPU, False),
    (None, 10_000.0, CPU, True),
    (None, 10_000.0, MPS, False),
    (True, 5.0, CPU, True),  # --compile wins over the rule
    (False, 10_000.0, CUDA, False),
])
def test_compiles_only_when_it_pays(compile_, budget, device, expected):
    cfg = T.TrainConfig(compile=compile_, time_budget=budget)
    assert T.compiles(cfg, device) is expected


def test_break_even_budget_is_the_threshold():
    at = T.TrainConfig(time_budget=T.CPU_COMPILE_BREAK_EVEN)
    below = T.TrainConfig(time_budget=T.CPU_COMPILE_BREAK_EVEN - 1)
    assert T.compiles(at, CPU) and not T.compiles(below, CPU)


def test_wrap_compiles_lazily_and_shares_the_weights():
    raw = GPT(GPTConfig(20, 8, 1, 2, 16))
    wrapped = T._wrap(raw, T.TrainConfig(compile=True), T.Dist())
    assert wrapped is not raw and wrapped._orig_mod is raw  # nothing is compiled until the first call
    assert T._wrap(raw, T.TrainConfig(compile=False), T.Dist()) is raw
