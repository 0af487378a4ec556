"""The benchmark harness: a timed fit gives one result row (images/s with its spread over repeats, step time, memory
after warm-up), speedups over a baseline, autograd's saved bytes, and the rows' table and chart."""
from __future__ import annotations

import time
from typing import Callable

import lightning as L
import torch

from . import config, hardware, runs, verdict
from .timing import BenchCallback

FIELDS = ["name", "images_per_s", "images_per_s_min", "images_per_s_max", "step_ms", "peak_mem_mb", "data_wait",
          "warmup_s", "steps", "batch_size", "precision", "device"]


def bench(module: L.LightningModule, datamodule: L.LightningDataModule, name: str, *, steps: int, warmup: int = 5,
          precision: str = "32-true", accelerator: str = "auto", clock: Callable[[], float] = time.perf_counter,
          callback: BenchCallback | None = None, **trainer_kwargs) -> dict | None:
    """Train `warmup + steps` steps and return one result row (see FIELDS) for the timed steps.

    `callback` replaces the default BenchCallback(warmup, steps, clock) (scaling.DDPBenchCallback for several
    processes); trainer_kwargs (devices, strategy, ...) go to the Trainer. None where the callback has no row (a
    DDP rank other than 0)."""
    cb = callback or BenchCallback(warmup, steps, clock)
    trainer = runs.trainer(None, precision, timing=True, **{"max_epochs": None, "max_steps": warmup + steps,
                                                             "accelerator": accelerator, "callbacks": [cb],
                                                             **trainer_kwargs})
    trainer.fit(module, datamodule=datamodule)
    row = cb.summary(module.device)
    return row and {"name": name, **row, "images_per_s_min": row["images_per_s"],
                    "images_per_s_max": row["images_per_s"], "precision": precision}  # one run: no spread yet


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
            done.append(bench(module, dm, cfg["name"], steps=steps, warmup=warmup,
                              precision=cfg.get("precision", "32-true"), **cfg.get("trainer", {})))
    return [{**median_row(done), "first_warmup_s": done[0]["warmup_s"]} for done in runs_of]


def median_row(done: list[dict]) -> dict:
    """One configuration's runs (in round order) as one row: the run with the median images/s, the fastest and
    slowest run's images/s as its spread, every round's images/s in round order (rounds) and their count."""
    ranked = sorted(done, key=lambda r: r["images_per_s"])
    return {**ranked[len(ranked) // 2], "images_per_s_min": ranked[0]["images_per_s"],
            "images_per_s_max": ranked[-1]["images_per_s"], "rounds": [r["images_per_s"] for r in done],
            "repeats": len(done)}


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
    return "\n".join(lines) + f"\n\nHardware: {hardware.label()}; size {config.run_size().name}"


def plot_speedups(rows: list[dict], title: str):
    """Horizontal bar chart of each row's speedup over the baseline (1.0 marked)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
    ax.barh([r["name"] for r in rows][::-1], [r["speedup"] for r in rows][::-1], color="tab:blue")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("speedup over baseline (images/s ratio)")
    ax.set_title(f"{title}\n{hardware.label()}, size {config.run_size().name}", fontsize=9)
    fig.tight_layout()
    return fig

