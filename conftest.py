"""Test-session setup shared by unit tests and notebooks (nbval runs kernels with this environment)."""

import functools
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


def retrying_kernel_start(start, attempts: int = 3):
    """nbval's ``start_new_kernel``, tried up to ``attempts`` times when the kernel dies before it answers.

    Two test processes (xdist workers, or two suites on one machine) can pick the same free TCP port for
    their kernels between jupyter_client choosing it and the kernel binding it; the kernel that loses exits,
    and nbval reports "Kernel died before replying to kernel_info" for every cell of that notebook (seen
    once in five fresh-clone runs with two suites on 2 cores). A kernel that cannot start at all still
    fails, on the last try; any other error is raised at once.
    """
    @functools.wraps(start)
    def start_new_kernel(*args, **kwargs):
        for attempt in range(1, attempts + 1):
            try:
                return start(*args, **kwargs)
            except RuntimeError as err:
                if "died" not in str(err) or attempt == attempts:
                    raise
    return start_new_kernel


try:
    import nbval.kernel
except ImportError:  # nbval is a test dependency; without it there are no notebook tests to start kernels for
    pass
else:
    if not hasattr(nbval.kernel.start_new_kernel, "__wrapped__"):  # once, however often this file is loaded
        nbval.kernel.start_new_kernel = retrying_kernel_start(nbval.kernel.start_new_kernel)
