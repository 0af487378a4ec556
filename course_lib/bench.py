"""Throughput benchmarks (images/s, step time, memory after warm-up) and FLOP counts against the GPU's peak."""
from __future__ import annotations

import copy
import json
import re
import statistics
import time
from pathlib import Path
from typing import Callable

import lightning as L
import psutil
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import Throughput
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from . import config, runs, verdict
from .timing import DeviceTimer

# Dense peaks in TFLOP/s (no 2:4 sparsity) per precision, from the pages named beside each: figures that the vendor
# lists "with sparsity" are halved, as its footnotes say. A precision missing from a row has no sourced figure here.
# Patterns are matched against torch.cuda.get_device_name(); first match wins, so variants come before their family.
GPU_PEAKS = [  # (pattern, part, {precision: TFLOP/s}, source)
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", {"fp32": 51, "tf32": 378, "fp16": 756.5, "bf16": 756.5, "fp8": 1513},
     "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),  # NVIDIA's table; sparse figures halved
    (r"\bH100\b(?!.*\b(PCIe|NVL)\b)", "H100 SXM",
     {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979},
     "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),
    (r"\bH200\b(?!.*\bNVL\b)", "H200 SXM", {"fp32": 66.91, "fp16": 989, "bf16": 989, "fp8": 1979},
     "https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html (dense); fp32: "
     "https://hmc-tech.com/gpu/nvidia-h100-vs-nvidia-h200-sxm-vs-nvidia-gb200"),
    (r"\bA100\b", "A100", {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},
     "https://glennklockwood.com/garden/processors/A100 (from NVIDIA's A100 data sheet)"),
    (r"\bL4\b", "L4", {"fp32": 30.29, "tf32": 60, "fp16": 121, "bf16": 121, "fp8": 242.5},
     "https://grokipedia.com/page/NVIDIA_L4_vs_L40S (fp16 242, fp8 485 with sparsity), "
     "https://store.sourcecode.com/en-us/bg-bucket-compare/125/9820 (tf32 120 with sparsity), fp32: "
     "https://fpsbench.com/compare/gpu/nvidia-l4-vs-nvidia-tesla-m40"),
    (r"\bA10\b", "A10", {"fp32": 31.24},  # no sourced tensor-core figure yet
     "https://sysrqmts.com/ru/gpus/compare/nvidia-a10-pcie-vs-nvidia-quadro-rtx-4000"),
    (r"\bT4\b", "T4", {"fp32": 8.141, "fp16": 65.13},  # Turing: no bf16, no tf32
     "https://sysrqmts.com/en/gpus/nvidia/tesla/t4"),
]
FIELDS = ["name", "images_per_s", "images_per_s_min", "images_per_s_max", "step_ms", "peak_mem_mb", "data_wait",
          "warmup_s", "steps", "batch_size", "precision", "device"]


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
        self.samples, self.peak_rss, self._process = 0, 0, None  # _process: this process's psutil handle (CPU)
        self._begin, self._marks = None, []  # per batch: (global_step, previous end, start, end, images)
        self._read = None  # (number of marks, figures) from the last reading

    def on_train_start(self, trainer, pl_module) -> None:
        self.timer = DeviceTimer(pl_module.device, self.clock)
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
            self.samples += self.batch_size
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

    def summary(self, device: torch.device) -> dict:
        """The timed steps' figures of a result row (see FIELDS) on `device`: images/s, median step, peak memory
        (CUDA's allocator on a GPU, the process's RSS elsewhere), data-wait fraction, warm-up, steps, batch."""
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else self.peak_rss
        step_s, wait_s = self.step_s, self.wait_s
        return {"images_per_s": self.throughput.compute()["device/samples_per_sec"],
                "step_ms": 1e3 * statistics.median(step_s), "peak_mem_mb": peak / 2**20,
                "data_wait": sum(wait_s) / (sum(wait_s) + sum(step_s)), "warmup_s": self.warmup_s,
                "steps": len(step_s), "batch_size": self.batch_size, "device": device.type}

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


def bench(module: L.LightningModule, datamodule: L.LightningDataModule, name: str, steps: int, warmup: int = 5,
          precision: str = "32-true", accelerator: str = "auto", clock: Callable[[], float] = time.perf_counter,
          **trainer_kwargs) -> dict:
    """Train `warmup + steps` steps and return one result row (see FIELDS) for the timed steps."""
    cb = BenchCallback(warmup, steps, clock)
    trainer = runs.trainer(None, precision, timing=True, **{"max_epochs": None, "max_steps": warmup + steps,
                                                             "accelerator": accelerator, "callbacks": [cb],
                                                             **trainer_kwargs})
    trainer.fit(module, datamodule=datamodule)
    if len(cb.step_s) < steps:
        raise ValueError(f"Benchmark {name!r} ran only {len(cb.step_s)} timed steps of {steps}: the training set is "
                         f"too small for warm-up + steps; use a larger subset or fewer steps.")
    row = cb.summary(module.device)
    return {"name": name, **row, "images_per_s_min": row["images_per_s"], "images_per_s_max": row["images_per_s"],
            "precision": precision}  # one run: no spread yet (run_configs adds it over repeats)


def run_configs(configs: list[dict], make: Callable[[dict], tuple], steps: int, warmup: int = 5,
                repeats: int = 1) -> list[dict]:
    """Bench each config (`make(cfg)` -> module, datamodule) in `repeats` interleaved rounds (every config once
    per round, so a drift of the machine hits all alike); keep the run with the median images/s and add the
    fastest and slowest repeat's (images_per_s_min, images_per_s_max: the spread), every round's images/s in
    round order (rounds: pair them across rows for verdict.compare(paired=True)) and the first round's warm-up
    (first_warmup_s: compilation from cold caches lands there)."""
    runs_of = [[] for _ in configs]
    for _ in range(repeats):
        for cfg, done in zip(configs, runs_of):
            module, dm = make(cfg)
            done.append(bench(module, dm, cfg["name"], steps, warmup, cfg.get("precision", "32-true"),
                              **cfg.get("trainer", {})))
    rows = []
    for done in runs_of:
        first_warmup_s, rounds = done[0]["warmup_s"], [r["images_per_s"] for r in done]  # round order
        ranked = sorted(done, key=lambda r: r["images_per_s"])
        rows.append({**ranked[len(ranked) // 2], "images_per_s_min": ranked[0]["images_per_s"],
                     "images_per_s_max": ranked[-1]["images_per_s"], "first_warmup_s": first_warmup_s,
                     "rounds": rounds, "repeats": repeats})
    return rows


def add_speedups(rows: list[dict], baseline: str) -> list[dict]:
    """Add a `speedup` field: images/s relative to the row named `baseline`."""
    base = next((r for r in rows if r["name"] == baseline), None)
    if base is None:
        raise ValueError(f"No row named {baseline!r}; rows are {[r['name'] for r in rows]}.")
    return [{**r, "speedup": r["images_per_s"] / base["images_per_s"]} for r in rows]


def saved_bytes_peak(step: Callable[[], object]) -> int:
    """Peak bytes of tensors autograd holds for backward while step() runs (saved_tensors_hooks; counted per save)."""
    live, peak = [0], [0]

    class _Held:
        """One saved tensor; its bytes leave the count when autograd frees it."""
        __slots__ = ("t", "n")

        def __init__(self, t):
            self.t, self.n = t, t.numel() * t.element_size()
            live[0] += self.n
            peak[0] = max(peak[0], live[0])

        def __del__(self):
            live[0] -= self.n

    with torch.autograd.graph.saved_tensors_hooks(_Held, lambda held: held.t):
        step()
    return peak[0]


def table(rows: list[dict], fields: list[str] | None = None) -> str:
    """A markdown table of result rows (the given fields, default FIELDS), with the hardware and size under it."""
    cols = fields or [c for c in FIELDS + ["speedup", "repeats"] if c in rows[0]]
    fmt = lambda v: verdict.number(v) if isinstance(v, float) else str(v)  # noqa: E731  (7,770, not 7.77e+03)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + f"\n\nHardware: {config.hardware_label()}; size {config.run_size().name}"


def plot_speedups(rows: list[dict], title: str):
    """Horizontal bar chart of each row's speedup over the baseline (1.0 marked)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
    ax.barh([r["name"] for r in rows][::-1], [r["speedup"] for r in rows][::-1], color="tab:blue")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("speedup over baseline (images/s ratio)")
    ax.set_title(f"{title}\n{config.hardware_label()}, size {config.run_size().name}", fontsize=9)
    fig.tight_layout()
    return fig


def save_results(rows: list[dict], lesson: str, path: str | Path | None = None) -> Path:
    """Write rows with hardware and versions to build/results/bench-<lesson>.json; record images/s for the summary."""
    path = Path(path or config.build_dir() / "results" / f"bench-{lesson}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"lesson": lesson, "size": config.run_size().name, "hardware": config.hardware(),
                                "rows": rows}, indent=1))
    for r in rows:
        config.record(lesson, f"{r['name']} images/s", r["images_per_s"], "images/s",
                      f"batch {r['batch_size']}, {r['precision']}, median step {r['step_ms']:.3g} ms")
    return path


def load_results(path: str | Path) -> dict:
    """Read a results file written by save_results."""
    return json.loads(Path(path).read_text())


def train_step_flops(net: nn.Module, batch_size: int, image_size: int = 32) -> int:
    """FLOPs of one training step (forward + backward) at this batch, counted on the meta device (no compute)."""
    meta = copy.deepcopy(net).to("meta").train()  # pass an uncompiled net
    x = torch.zeros(batch_size, 3, image_size, image_size, device="meta")
    y = torch.zeros(batch_size, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(meta(x), y).backward()
    return counter.get_total_flops()


def gpu_peaks(name: str | None) -> tuple[str, dict, str] | None:
    """(part, {precision: dense TFLOP/s}, source) for a torch.cuda.get_device_name() string; None if not listed."""
    return next(((part, peaks, source) for pattern, part, peaks, source in GPU_PEAKS
                 if name and re.search(pattern, name)), None)


def peak_tflops(info: dict | None = None, precision: str = "bf16") -> float | None:
    """Dense peak of this machine's GPU in `precision` (fp32, tf32, fp16, bf16, fp8), from GPU_PEAKS; None on a CPU,
    an unlisted GPU or a precision without a sourced figure."""
    found = gpu_peaks((info or config.hardware()).get("gpu"))
    return found[1].get(precision) if found else None


def peak_text(info: dict | None = None, precision: str = "bf16") -> str:
    """Where the peak comes from, or a clear 'no peak known' naming the GPU and the table."""
    gpu = (info or config.hardware()).get("gpu")
    found = gpu_peaks(gpu)
    if found and precision in found[1]:
        return f"{found[1][precision]:g} TFLOP/s dense {precision} on the {found[0]} ({found[2]})"
    return (f"no {precision} peak known for {gpu or 'this CPU'} (bench.GPU_PEAKS lists "
            f"{', '.join(part for _, part, _, _ in GPU_PEAKS)})")


def achieved(flops: float, seconds: float, info: dict | None = None, precision: str = "bf16") -> dict:
    """Achieved TFLOP/s for `flops` done in `seconds`, and its fraction of the dense peak in `precision` if known."""
    tflops, peak = flops / seconds / 1e12, peak_tflops(info, precision)
    return {"tflops": tflops, "peak_tflops": peak, "fraction_of_peak": tflops / peak if peak else None,
            "peak_text": peak_text(info, precision)}
