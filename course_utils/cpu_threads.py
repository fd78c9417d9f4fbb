"""How many CPU threads a training run uses, chosen from measured step times.

On an idle machine several threads make each step faster; when other processes share the cores,
a step waits for its slowest thread and several threads can run many times slower than one
(README, Performance). ``ThreadTuner`` times a few steps with one thread, then with more, keeps the
faster count, and drops back to one thread for good when steps suddenly slow down.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator

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
