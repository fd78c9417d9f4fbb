"""Test-session setup shared by unit tests and notebooks (nbval runs kernels with this environment)."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# Notebooks run in the tiny `smoke` mode in the test suite; the kernels inherit this environment.
os.environ["COURSE_MODE"] = "smoke"
os.environ["TQDM_DISABLE"] = "1"
os.environ["IPYKERNEL_CELL_NAME"] = "<IPY-INPUT>"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Two test workers on a small machine: one thread each avoids oversubscribing the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
# Kernels import this checkout's course_utils even if another copy is installed.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
