import pytest
import torch

from course_utils import runtime


def test_mode_reads_environment(monkeypatch):
    for value in runtime.MODES:
        monkeypatch.setenv("COURSE_MODE", value)
        assert runtime.mode() == value
    monkeypatch.setenv("COURSE_MODE", " CPU ")
    assert runtime.mode() == "cpu"


def test_unset_mode_follows_hardware(monkeypatch):
    monkeypatch.delenv("COURSE_MODE", raising=False)
    assert runtime.mode() == ("gpu" if torch.cuda.is_available() else "cpu")


def test_bad_mode_names_the_valid_ones(monkeypatch):
    monkeypatch.setenv("COURSE_MODE", "bogus")
    with pytest.raises(ValueError, match="smoke, cpu, gpu"):
        runtime.mode()


def test_pick(monkeypatch):
    monkeypatch.setenv("COURSE_MODE", "cpu")
    assert runtime.pick(smoke=1, cpu=2, gpu=3) == 2
    monkeypatch.setenv("COURSE_MODE", "smoke")
    assert runtime.pick(smoke=1, cpu=2, gpu=3) == 1


def test_seed_everything_is_reproducible():
    runtime.seed_everything(7)
    a = torch.randn(5)
    gen = runtime.seed_everything(7)
    assert torch.equal(a, torch.randn(5))
    assert torch.equal(torch.randn(3, generator=gen), torch.randn(3, generator=torch.Generator().manual_seed(7)))


def test_device_is_usable():
    assert torch.zeros(1, device=runtime.device()).device.type == runtime.device().type
