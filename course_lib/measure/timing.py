"""The one home of the course's timing; each need has one tool, and every device is synchronized where it must be:

- a region timed by hand (a check's run, a script's phase, a communication call): `Stopwatch`, a host clock with
  the device synchronized at both ends (`sync`); lessons 01, 03 and 05 write that loop out, since they teach it;
- training steps and epochs inside a fit: `BenchCallback` (step, data wait, warm-up, memory) and `EpochTimer`, on
  `DeviceTimer` marks (CUDA events on a GPU, one synchronize per measured window, not one per step);
- one call, repeated: `time_calls`, torch.utils.benchmark.Timer's adaptive blocks;
- what they measure, in human units: `duration` (ns, µs, ms or s) and `flop_rate` (MFLOP/s, GFLOP/s or TFLOP/s)."""
from __future__ import annotations

import math
import statistics
import time
import timeit
from typing import Callable

import lightning as L
import psutil
import torch
from lightning.fabric.utilities.throughput import Throughput

from ..base.records import BenchRow

MAX_RUN_TIME = 10.0  # seconds: time_calls stops here even before four blocks (a call slower than 2.5 s)


def _three(value: float) -> str:
    """Three significant figures in plain digits (427, 30.6, 1.14), never e-notation."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{round(value, decimals):,.{decimals}f}"


def duration(seconds: float) -> str:
    """A time in the unit that reads best: 1.14e-08 -> '11.4 ns', 0.000427 -> '427 µs', 0.0306 -> '30.6 ms', 8.03 ->
    '8.03 s'; never e-notation."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if abs(seconds) >= scale or unit == "ns" or seconds == 0:
            return f"{_three(seconds / scale)} {unit}"
    raise AssertionError("unreachable")


def flop_rate(flop_per_s: float) -> str:
    """A FLOP rate in the unit that reads best: 7.02e10 -> '70.2 GFLOP/s', 1.35e12 -> '1.35 TFLOP/s'."""
    if flop_per_s == 0:
        return "0 GFLOP/s"
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if abs(flop_per_s) >= scale or unit == "MFLOP/s":
            return f"{_three(flop_per_s / scale)} {unit}"
    raise AssertionError("unreachable")


def span(lo: str, hi: str) -> str:
    """Two printed figures as a range, a shared unit once: ('6.32 ms', '7.10 ms') -> '6.32–7.10 ms', ('980 µs',
    '1.20 ms') -> '980 µs–1.20 ms', ('0.12', '3.45') -> '0.12–3.45'; one figure where both print alike."""
    if lo == hi:
        return lo
    figure, _, unit = lo.partition(" ")
    return f"{figure}–{hi}" if unit and hi.endswith(f" {unit}") else f"{lo}–{hi}"


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a host clock read next measures the work and not just its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Seconds of hand-timed regions: `with watch:` adds one region's seconds to `watch.seconds` (a host clock read with
    `device` synchronized at both ends, so a GPU's queued work counts, not just its launch); `elapsed()` reads a
    region still running (a per-epoch line).

    One region costs two synchronizes: for whole runs, phases and calls, not for each step of a fit (BenchCallback)."""

    def __init__(self, device: torch.device | str = "cpu", clock: Callable[[], float] = time.perf_counter):
        self.device, self.clock = torch.device(device), clock
        self.seconds = 0.0  # the finished regions' total
        self._start: float | None = None  # clock() at the running region's start

    def start(self) -> Stopwatch:
        """Begin a region (after the device's queued work) and return the watch."""
        sync(self.device)
        self._start = self.clock()
        return self

    def elapsed(self) -> float:
        """Seconds since the running region began, its device work included."""
        if self._start is None:
            raise RuntimeError("Stopwatch.elapsed(): no region is running; call start() or use `with watch:` first.")
        sync(self.device)
        return self.clock() - self._start

    def stop(self) -> float:
        """End the running region, add it to `seconds` and return its own seconds."""
        region = self.elapsed()
        self.seconds, self._start = self.seconds + region, None
        return region

    __enter__ = start

    def __exit__(self, *exc) -> None:
        self.stop()


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


class BenchCallback(L.Callback):
    """Times each training step, the gap before it (waiting for data) and the warm-up, and tracks peak memory.

    Marks are taken with DeviceTimer (CUDA events on a GPU) and turned into seconds on first reading step_s,
    wait_s, warmup_s or throughput after training: one synchronize per run instead of two per step. On a GPU the
    times are on the GPU's timeline: a gap counts only where the GPU sat idle, not while the host ran ahead."""

    def __init__(self, warmup: int, steps: int, clock: Callable[[], float] = time.perf_counter):
        if steps < 2:
            raise ValueError(f"A benchmark needs at least 2 timed steps, got {steps}.")
        self.warmup, self.steps, self.clock = warmup, steps, clock
        self.timer = DeviceTimer("cpu", clock)
        self.peak_rss, self.world, self._process = 0, 1, None  # _process: this process's psutil handle (CPU)
        self._begin, self._marks = None, []  # per batch: (global_step, previous end, start, end, images)
        self._read = None  # (number of marks, figures) from the last reading

    def on_train_start(self, trainer, pl_module) -> None:
        self.timer, self.world = DeviceTimer(pl_module.device, self.clock), trainer.world_size
        self._marks, self._read = [], None
        self._begin = self._prev_end = self.timer.mark()
        # one psutil handle per run, made in the training process (a forked DDP worker's RSS is its own), instead of
        # a new Process object per step: a step then costs one read of /proc, in the gap counted as data wait
        self._process = psutil.Process() if pl_module.device.type == "cpu" else None
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._start = self.timer.mark()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        end = self.timer.mark()
        step = trainer.global_step  # already counts this step
        self._marks.append((step, self._prev_end, self._start, end, len(batch[1])))
        self._prev_end = end
        if step > self.warmup:
            self.batch_size = len(batch[1])
        if self._process is not None:  # the CPU's memory figure; a GPU's comes from its allocator, no polling
            self.peak_rss = max(self.peak_rss, self._process.memory_info().rss)

    def _figures(self) -> dict:
        """Step and wait seconds, warm-up seconds and Lightning's Throughput, from the marks (synchronizes once)."""
        if self._read and self._read[0] == len(self._marks):
            return self._read[1]
        sec, t0 = self.timer.seconds, self._begin
        fig = {"step_s": [], "wait_s": [], "warmup_s": 0.0, "throughput": Throughput(window_size=self.steps)}
        samples = 0
        for step, prev_end, start, end, images in self._marks:
            if step == self.warmup:  # compilation, allocation and autotuning end up here
                fig["warmup_s"], t0 = sec(self._begin, end), end
            elif step > self.warmup:
                fig["step_s"].append(sec(start, end))
                fig["wait_s"].append(sec(prev_end, start))  # gap between the last step's end and this start
                samples += images
                fig["throughput"].update(time=sec(t0, end), batches=len(fig["step_s"]), samples=samples)
        self._read = (len(self._marks), fig)
        return fig

    def summary(self, device: torch.device) -> BenchRow:
        """The timed steps' result row on `device`, unnamed (bench.bench names it and sets its precision): images/s
        (one run: its own spread), median step, peak memory (CUDA's allocator on a GPU, the process's RSS elsewhere),
        data-wait fraction, warm-up, steps, batch, and the processes; a clear error if fewer than `steps` were timed."""
        step_s, wait_s = self.step_s, self.wait_s
        if len(step_s) < self.steps:
            raise ValueError(f"The benchmark ran only {len(step_s)} timed steps of {self.steps}: the training set is "
                             f"too small for warm-up + steps; use a larger subset or fewer steps.")
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else self.peak_rss
        # all ranks step in lock-step (the all-reduce waits for the slowest): the total is this rank's rate x world
        rate = self.throughput.compute()["device/samples_per_sec"] * self.world
        return BenchRow("", rate, step_ms=1e3 * statistics.median(step_s), peak_mem_mb=peak / 2**20,
                        data_wait=sum(wait_s) / (sum(wait_s) + sum(step_s)), warmup_s=self.warmup_s,
                        steps=len(step_s), batch_size=self.batch_size * self.world, device=device.type,
                        processes=self.world, images_per_s_min=rate, images_per_s_max=rate)

    step_s = property(lambda self: self._figures()["step_s"], doc="Seconds per timed step.")
    wait_s = property(lambda self: self._figures()["wait_s"], doc="Seconds before each timed step (data wait).")
    warmup_s = property(lambda self: self._figures()["warmup_s"], doc="Seconds from train start to warm-up end.")
    throughput = property(lambda self: self._figures()["throughput"], doc="Lightning's images/s over timed steps.")


class EpochTimer(L.Callback):
    """Seconds of each training epoch, validation excluded: DeviceTimer marks, read with one synchronize after fit."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self._epochs = clock, []  # per epoch: [start, end, [(validation start, end), ...]]

    def on_train_start(self, trainer, pl_module) -> None:
        self.timer, self._epochs = DeviceTimer(pl_module.device, self.clock), []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._epochs.append([self.timer.mark(), None, []])

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._epochs:  # inside fit: not training
            self._epochs[-1][2].append([self.timer.mark(), None])

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking and self._epochs:
            self._epochs[-1][2][-1][1] = self.timer.mark()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._epochs[-1][1] = self.timer.mark()

    @property
    def seconds(self) -> list[float]:
        """Training seconds per finished epoch."""
        sec = getattr(self, "timer", None) and self.timer.seconds
        return [sec(start, end) - sum(sec(a, b) for a, b in vals) for start, end, vals in self._epochs
                if end is not None]


def time_calls(fn: Callable[[], object], *, min_run_time: float = 0.2,
               clock: Callable[[], float] | None = None, block_s: float | None = None) -> list[float]:
    """Seconds per call of fn(), one figure per block of calls, from torch.utils.benchmark.Timer.adaptive_autorange.

    The Timer warms up while it picks the block size (calls per reading, aiming at blocks of about 0.05 s), then
    times blocks until at least `min_run_time` seconds are spent and at least four blocks are read, so every
    figure comes with a spread (blocked_autorange's larger blocks fitted only one in a short budget). Its default
    clock synchronizes the GPU before each reading. It runs fn on this process's thread count (Timer's own default
    is one thread). clock: None for the Timer's own (benchmark.timer). block_s: blocks of about that many seconds
    instead, after one warm-up call (the Timer's block size grows tenfold, so its blocks can run ten times longer
    than a short budget allows: a smoke run's op floors)."""
    # imported here, not at the top: torch.utils.benchmark imports cpp_extension, whose "No CUDA runtime" notice
    # would print before a lesson's quiet_lightning() could switch it off
    from torch.utils import benchmark

    timer = benchmark.Timer("fn()", globals={"fn": fn}, timer=clock or benchmark.timer,
                            num_threads=torch.get_num_threads())
    # threshold inf: stop on time and block count alone, never wait for the spread to shrink (a busy machine's
    # wouldn't); max_run_time only caps a call so slow that four blocks exceed it
    if block_s is not None:  # the standard library's Timer on the same clock: no warm-up calls before each block
        plain = timeit.Timer(fn, timer=clock or benchmark.timer)
        number = max(1, round(block_s / max(plain.timeit(1), 1e-9)))  # calls per block, from the warm-up call
        return [plain.timeit(number) / number for _ in range(max(4, math.ceil(min_run_time / block_s)))]
    measured = timer.adaptive_autorange(threshold=math.inf, min_run_time=min_run_time,
                                        max_run_time=max(MAX_RUN_TIME, 2 * min_run_time))
    return list(measured.times)
