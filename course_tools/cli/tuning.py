"""Run-time tuning for ``course train``: CPU threads, when to compile, and the peaks that model FLOPs
utilisation is measured against. None of it is part of what the lessons teach, so it lives here,
beside the command line, and the trainer (``course_utils.train``) receives its choices as arguments
(``TrainConfig.compile``, ``on_step``); the processes are ``process_group``'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from course_utils.train import Dist

# ---------------------------------------------------------------------------------------------
# CPU threads: the one policy
# PyTorch threads for training on a CPU when the count cannot be measured (several processes, or a
# single core). On the shared 2-core machine two threads per process ran 6 % as fast as one under
# load (README, Performance): each step waits for its slowest thread, and a thread that loses its
# core stalls the other. One thread loses at most half the speed on an idle machine.
CPU_THREADS = 1


class ThreadTuner:
    """Feed it every step's wall-clock seconds (``observe``); it sets ``torch.set_num_threads``.

    Phases: ``probe`` steps on one thread, then up to ``probe`` steps on ``many`` threads (cut
    short by the first step slower than the one-thread median: contention), then the faster count.
    While on ``many`` threads, ``patience`` steps in a row slower than ``slowdown`` times the
    median of the last 20 mean another process took a core: back to one thread for the rest.
    The first ``skip`` steps (allocation, first-call overheads) are not timed.
    """

    def __init__(self, many: int, *, probe: int = 6, skip: int = 3, slowdown: float = 2.5, patience: int = 3,
                 set_threads: Callable[[int], None] = torch.set_num_threads) -> None:
        if many < 2:
            raise ValueError(f"ThreadTuner needs at least 2 threads to compare with one, got many={many}")
        self.many, self.probe, self.skip, self.slowdown, self.patience = many, probe, skip, slowdown, patience
        self._set = set_threads
        self.times: dict[int, list[float]] = {1: [], many: []}
        self.threads, self.decided, self.fell_back, self._slow = 1, False, False, 0
        self._seen = 0
        self.log: list[str] = []
        self._set(1)

    def observe(self, seconds: float) -> None:
        """One optimiser step took ``seconds``; maybe change the thread count for the next one."""
        self._seen += 1
        if self._seen <= self.skip or self.fell_back:
            return
        self.times[self.threads].append(seconds)
        if not self.decided:
            self._probe_step(seconds)
        elif self.threads == self.many:
            self._watch(seconds)

    def _switch(self, threads: int, why: str) -> None:
        self.threads = threads
        self._set(threads)
        self.log.append(f"{threads} thread(s): {why}")

    def _probe_step(self, seconds: float) -> None:
        one, many = self.times[1], self.times[self.many]
        if self.threads == 1 and len(one) == self.probe:
            self._switch(self.many, f"probing after {len(one)} steps at {statistics.median(one) * 1e3:.1f} ms")
        elif self.threads == self.many:
            base = statistics.median(one)
            if seconds > base or len(many) == self.probe:
                self.decided = True
                faster = statistics.median(many) < base
                self._switch(self.many if faster else 1, f"{statistics.median(many) * 1e3:.1f} ms per step "
                             f"on {self.many} threads vs {base * 1e3:.1f} ms on one")

    def _watch(self, seconds: float) -> None:
        recent = self.times[self.many][-20:]
        self._slow = self._slow + 1 if seconds > self.slowdown * statistics.median(recent) else 0
        if self._slow >= self.patience:
            self.fell_back = True
            self._switch(1, f"{self.patience} steps in a row over {self.slowdown}x the recent median "
                            "(another process took a core)")


def choose_threads(asked: int | None, where: Dist) -> ThreadTuner | None:
    """Set PyTorch's threads for a training run: the count asked for; else, on a CPU, a
    ``ThreadTuner`` that measures (one process with at least two cores) or ``CPU_THREADS``.
    Returns the tuner, whose ``observe`` must then see every step (``train(on_step=...)``)."""
    if asked is not None:
        if asked < 1:
            raise ValueError(f"--threads must be at least 1, got {asked}")
        torch.set_num_threads(asked)
        return None
    if where.device.type != "cpu":
        return None
    cores = torch.get_num_threads()  # PyTorch's default: one per physical core
    if cores >= 2 and where.world_size == 1:
        return ThreadTuner(cores)  # starts on one thread and measures
    torch.set_num_threads(CPU_THREADS)
    return None


# ---------------------------------------------------------------------------------------------
# torch.compile on a CPU, measured with the cpu config on the shared 2-core machine at load 17-19
# (docs/pages/performance.md): compiling cost COMPILE_SECONDS (the training graph at the first step, 73 s,
# and the evaluation graph at the first evaluation, 33 s), then each step ran COMPILE_SPEEDUP times
# faster, so it pays for itself after COMPILE_SECONDS / (1 - 1 / COMPILE_SPEEDUP) s, about 46 minutes.
# Both sides slow down alike under load, so the rule holds roughly on a quieter machine too.
COMPILE_SECONDS = 106.0
COMPILE_SPEEDUP = 1.04
CPU_COMPILE_BREAK_EVEN = COMPILE_SECONDS / (1 - 1 / COMPILE_SPEEDUP)


def compile_default(time_budget: float | None, device: torch.device) -> bool:
    """Whether ``course train`` compiles when ``--compile`` is not given: on CUDA always; on a CPU
    when the time budget is past the break-even (a run without a budget stays eager: its length is
    not known in advance); on MPS never (its back-end is experimental)."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and time_budget is not None and time_budget >= CPU_COMPILE_BREAK_EVEN


# ---------------------------------------------------------------------------------------------
# Model FLOPs utilisation. Dense peak TFLOP/s from the vendors' data sheets: (bf16/fp16 tensor
# cores, tf32 or fp32). More specific names first ("H100 PCIe" before "H100", "L40S" before "L4").
# The V100 and the T4 have no bf16 units: their first figure is the fp16 peak (see NO_BF16).
PEAK_TFLOPS = [
    ("H200", 989.0, 494.0),
    ("H100 PCIe", 756.0, 378.0),
    ("H100", 989.0, 494.0),
    ("A100", 312.0, 156.0),
    ("L40S", 362.0, 183.0),
    ("L4", 121.0, 60.0),
    ("RTX 4090", 165.2, 82.6),
    ("V100", 125.0, 15.7),
    ("T4", 65.0, 8.1),
]
NO_BF16 = ("V100", "T4")  # tensor cores with fp16 but no bf16


def peak_tflops(device_name: str, dtype: torch.dtype) -> float | None:
    """The device's dense peak for ``dtype`` (bf16/fp16 column, else the tf32/fp32 one); None if
    unknown, or for bf16 on a chip without bf16 units."""
    for key, low_precision, full in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            if dtype == torch.bfloat16 and key in NO_BF16:
                return None
            return low_precision if dtype in (torch.bfloat16, torch.float16) else full
    return None


def mfu(tflops: float, device: torch.device, dtype: torch.dtype) -> float | None:
    """Model FLOPs utilisation: the achieved TFLOP/s over the device's peak; None off CUDA or for an
    unknown GPU."""
    if device.type != "cuda":
        return None
    peak = peak_tflops(torch.cuda.get_device_name(device), dtype)
    return tflops / peak if peak else None
