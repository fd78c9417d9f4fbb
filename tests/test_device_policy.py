"""One device policy: ``runtime.device()`` decides (CUDA, then MPS, then the CPU) and every caller
follows it: the lessons, the trainer and ``course sample``. CUDA and MPS are mocked."""

import contextlib
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from course_tools.cli import main as course
from course_tools.cli import process_group
from course_utils import runtime, train
from course_utils.gpt import GPT, GPTConfig

ROOT = Path(__file__).resolve().parent.parent


class StaysOnCPU(GPT):
    """A GPT whose ``.to(device)`` records the device and stays put (no real GPU here)."""

    def to(self, device, *args, **kwargs):
        self.moved_to = torch.device(device)
        return self


@contextlib.contextmanager
def tf32_restored() -> Iterator[None]:
    """``set_up`` turns TF32 on for CUDA: start each test with it off and put back what was there.
    These flags are properties of torch's backend objects, not attributes in their ``__dict__``, so
    ``monkeypatch.setattr`` cannot undo them (pytest >= 9.2 deletes the attribute it thinks it added);
    plain reads and writes through the public flags work on every torch version."""
    flags = [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32")]
    before = [getattr(obj, name) for obj, name in flags]
    try:
        for obj, name in flags:
            setattr(obj, name, False)
        yield
    finally:
        for (obj, name), value in zip(flags, before, strict=True):
            setattr(obj, name, value)


def stand_in(original: Callable, answer: bool) -> Callable:
    """A probe that answers ``answer`` and looks like ``original`` (name, ``__wrapped__``): torch >= 2.14
    builds tables of its own probes (``torch.backends.mps.is_available.__wrapped__``) when
    ``torch._dynamo`` is first imported, and that import must never meet a bare lambda."""
    return functools.wraps(original)(lambda *args, **kwargs: answer)


@pytest.fixture(params=["cuda", "mps", "cpu"])
def hardware(request, monkeypatch) -> Iterator[torch.device]:
    import torch._dynamo  # noqa: F401  (imported with torch's own probes in place; set_up compiles on CUDA)

    # plain module functions: monkeypatch restores them from the modules' __dict__
    monkeypatch.setattr(torch.cuda, "is_available", stand_in(torch.cuda.is_available, request.param == "cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", stand_in(torch.cuda.is_bf16_supported, True))
    monkeypatch.setattr(torch.backends.mps, "is_available",
                        stand_in(torch.backends.mps.is_available, request.param == "mps"))
    monkeypatch.delenv("RANK", raising=False)
    with tf32_restored():
        yield torch.device(request.param)


def test_the_fixture_leaves_torch_as_it_found_it():
    """What leaked into tests/test_train.py before: after the CUDA case, the CPU is the CPU again."""
    before = (torch.cuda.is_available, torch.backends.mps.is_available, torch.backends.cuda.matmul.allow_tf32,
              torch.backends.cudnn.allow_tf32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        with tf32_restored():
            torch.backends.cuda.matmul.allow_tf32 = True
    after = (torch.cuda.is_available, torch.backends.mps.is_available, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    assert after == before


def test_runtime_prefers_cuda_then_mps_then_cpu(hardware):
    assert runtime.device() == hardware


def test_the_trainer_runs_where_runtime_says(hardware):
    assert process_group.join().device == hardware
    torch.manual_seed(0)
    model = StaysOnCPU(GPTConfig(10, max_len=8, n_layers=1, n_heads=1, d_model=8))
    run = train.set_up(model, torch.arange(50) % 10, torch.arange(50) % 10, train.TrainConfig())
    assert run.where.device == model.moved_to == hardware
    on_cuda = hardware.type == "cuda"
    # bf16 and torch.compile on CUDA only; fused AdamW on CUDA and the CPU (MPS: the plain loop)
    assert run.dtype == (torch.bfloat16 if on_cuda else torch.float32)
    assert bool(run.optimizer.defaults["fused"]) == (hardware.type in ("cuda", "cpu"))
    assert (run.model is not run.raw) == on_cuda
    assert torch.backends.cuda.matmul.allow_tf32 == on_cuda


def test_course_sample_loads_on_the_runtime_device(hardware, monkeypatch, capsys):
    seen = []

    def load_model(path, device=None):
        seen.append(torch.device(device))
        raise FileNotFoundError("stop here")

    monkeypatch.setattr(train, "load_model", load_model)
    assert course(["sample", "--ckpt", "ckpt.pt"]) == 2
    assert seen == [hardware]


def test_no_lesson_or_module_has_a_device_policy_of_its_own():
    """A lint, not a behaviour test: only runtime.py asks the hardware (process_group.py too, for the
    per-process GPU under torchrun, which tests/test_train.py runs on the CPU with gloo)."""
    offenders = []
    for path in sorted((ROOT / "course_utils").glob("*.py")) + sorted((ROOT / "course_tools").rglob("*.py")):
        if path.name not in ("runtime.py", "process_group.py") and "cuda.is_available()" in path.read_text():
            offenders.append(str(path.relative_to(ROOT)))
    for folder in ("notebooks", "solutions"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            cells = json.loads(path.read_text())["cells"]
            code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            if "cuda.is_available()" in code:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == [], "use runtime.device() instead"
    processes = (ROOT / "course_tools" / "cli" / "process_group.py").read_text()
    assert processes.count("cuda.is_available()") == 1  # only join's per-process GPU under torchrun


def test_exact_arithmetic_falls_back_to_float32_only_on_mps():
    """Sampling's cumulative sums and RoPE's angles use the device's most precise float."""
    assert runtime.exact_dtype("mps") == torch.float32  # MPS has no float64
    assert runtime.exact_dtype(torch.device("cuda", 1)) == runtime.exact_dtype("cpu") == torch.float64
