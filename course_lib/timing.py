"""Timing on any device: CUDA events with one synchronize per measured window on a GPU, a host clock elsewhere."""
from __future__ import annotations

import time
from typing import Callable

import torch


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a host clock read next measures the work and not just its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class DeviceTimer:
    """Marks points in time on a device: CUDA events on a GPU (read after one synchronize), else a host clock.

    Marking never waits for the GPU; the first `seconds` read after new marks synchronizes once, so a window of
    n steps costs one synchronize, not one per step (a sync per step would also drain the queue the GPU works from)."""

    def __init__(self, device: torch.device | str = "cpu", clock: Callable[[], float] = time.perf_counter):
        self.device, self.clock = torch.device(device), clock
        self.cuda = self.device.type == "cuda"
        self._pending = False  # events recorded since the last synchronize

    def mark(self):
        """Now: a CUDA event on the current stream (reached once the work queued before it is done), else clock()."""
        if not self.cuda:
            return self.clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending = True
        return event

    def seconds(self, start, end) -> float:
        """Seconds from mark `start` to mark `end`."""
        if not self.cuda:
            return end - start
        if self._pending:  # once per window: every event recorded so far is then complete
            torch.cuda.synchronize(self.device)
            self._pending = False
        return start.elapsed_time(end) / 1e3  # elapsed_time is in ms


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 0, device: torch.device | str = "cpu",
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds taken by each of `repeats` calls of `fn()` after `warmup` untimed ones; one synchronize in all."""
    for _ in range(warmup):
        fn()
    timer = DeviceTimer(device, clock)
    marks = [timer.mark()]
    for _ in range(repeats):
        fn()
        marks.append(timer.mark())  # one mark ends a call and starts the next
    return [timer.seconds(a, b) for a, b in zip(marks, marks[1:])]
