"""Run modes, devices and seeds: the switches every lesson reads before choosing its sizes."""

from __future__ import annotations

import os
import random
from typing import TypeVar

import numpy as np
import torch

MODES = ("smoke", "cpu", "gpu")
T = TypeVar("T")


def mode() -> str:
    """The run mode from ``COURSE_MODE``; unset means ``gpu`` with CUDA, else ``cpu``."""
    value = os.environ.get("COURSE_MODE", "").strip().lower()
    if not value:
        return "gpu" if torch.cuda.is_available() else "cpu"
    if value not in MODES:
        raise ValueError(
            f"COURSE_MODE={value!r} is not a run mode; use one of {', '.join(MODES)} "
            "(or leave it unset to pick gpu/cpu from the hardware)"
        )
    return value


def pick(*, smoke: T, cpu: T, gpu: T) -> T:
    """Return the value for the current mode, e.g. ``pick(smoke=50, cpu=2_000, gpu=5_000)``."""
    return {"smoke": smoke, "cpu": cpu, "gpu": gpu}[mode()]


def device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def exact_dtype(device: torch.device | str) -> torch.dtype:
    """The most precise float a device computes in: float64, except on MPS, which has none (float32)."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); returns a CPU generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def describe() -> str:
    """One line naming the mode, device and torch version (for the top of a lesson)."""
    dev = device()
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type
    return f"mode={mode()} device={name} torch={torch.__version__}"
