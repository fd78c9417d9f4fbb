"""``course bench --cpu`` at a tiny size: both models the same size, a table with the ratio."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from course_tools.cli import bench
from course_tools.cli import main as cli


def test_the_two_models_have_the_same_parameters():
    size = bench.SIZES["tiny"]
    ours, theirs = bench.course_model(size), bench.reference_model(size)
    count = lambda m: sum(p.numel() for p in m.parameters())  # tied embeddings count once
    assert count(ours) == count(theirs) == (65 + 16) * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32
    x = torch.randint(65, (2, 16))
    assert ours(x).shape == theirs(x).shape == (2, 16, 65)


def test_bench_prints_speeds_and_the_ratio(capsys):
    threads = torch.get_num_threads()
    assert cli(["bench", "--cpu", "--sizes", "tiny", "--threads", "1", "--rounds", "1", "--steps", "1"]) == 0
    assert torch.get_num_threads() == threads  # restored
    out = capsys.readouterr().out
    row = re.search(r"^tiny\s+1\s+([\d,]+)\s+([\d,]+)\s+([\d.]+)$", out, re.M)
    assert row, out
    ours, theirs, ratio = (float(g.replace(",", "")) for g in row.groups())
    assert ours > 0 and theirs > 0
    assert ratio == pytest.approx(ours / theirs, rel=0.02)  # one round: the ratio of the two speeds
    assert "load average before" in out and "load average after" in out


def test_bench_mistakes_are_one_line(capsys):
    assert cli(["bench"]) == 2
    assert capsys.readouterr().err == "course bench: error: say where: `course bench --cpu` or `course bench --gpu`\n"
    assert cli(["bench", "--cpu", "--dry-run"]) == 2
    assert capsys.readouterr().err == "course bench: error: --dry-run, --nanogpt and --json go with --gpu\n"
    assert cli(["bench", "--gpu"]) == 2  # no CUDA on this machine
    assert capsys.readouterr().err.startswith("course bench: error: course bench --gpu needs a CUDA device")
    assert cli(["bench", "--cpu", "--sizes", "huge"]) == 2
    assert capsys.readouterr().err.startswith("course bench: error: unknown size 'huge'; choose from cpu, char")


def test_llama_cpp_missing_names_the_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where llama-cpp-python was never built
    assert cli(["bench", "--llama-cpp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("course bench: error: llama-cpp-python is not installed; `pip install llama-cpp-python`")
    assert err.count("\n") == 1
