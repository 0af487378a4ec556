"""Lesson 06's throughput on N devices through bench.bench: a rank-0 bench callback, in-process launches
(ddp_notebook), the script path `python -m course_lib.parallel.scaling --devices N --out row.json` (strategy ddp, fresh
processes); and with `--collectives`, the collectives a training step makes, counted with torch.profiler."""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.accelerators.cuda import num_cuda_devices

from ..base import config, hardware, results
from ..base.records import BenchRow
from ..benchmark import bench
from ..measure.timing import BenchCallback
from ..training import runs
from ..training.modules import ImageClassifierModule


class DDPBenchCallback(BenchCallback):
    """BenchCallback whose rank 0 writes the all-process row to a JSON file, which summary reads back in the process
    that launched the fit (forked workers return no objects); None where rank 0 wrote none (other ranks)."""

    def __init__(self, warmup: int, steps: int, out: str | Path):
        super().__init__(warmup, steps)
        self.out = Path(out)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:  # BenchCallback's figures already count every process (rate x world)
            results.write_json(self.out, super().summary(pl_module.device).to_json())

    def summary(self, device: torch.device) -> BenchRow | None:
        """The row rank 0 wrote, or None."""
        row = results.read_json(self.out)
        return row and BenchRow.from_json(row)


class CollectiveCounter(L.Callback):
    """Counts the collectives of `steps` training steps after `warmup`, the loop's between steps included: the
    profiler's events named after the backend (gloo:broadcast, nccl:all_reduce, ...); rank 0 writes {kind: calls per
    step} to `out`. Profiled steps run slower, so this runs apart from any timed run."""

    EVENT = re.compile(r"^(?:gloo|nccl|mpi|ucc):(\w+)$")  # one event per call, on every backend's process group

    def __init__(self, warmup: int, steps: int, out: str | Path):
        if warmup < 1 or steps < 1:  # the profiler starts at the end of the last warm-up step
            raise ValueError(f"Counting collectives needs warmup >= 1 and steps >= 1, got {warmup} and {steps}.")
        self.warmup, self.steps, self.out, self.seen, self.profiler = warmup, steps, Path(out), 0, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.seen += 1
        if self.seen == self.warmup:  # from the end of the last warm-up step: whole cycles, loop and step
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.start()
        elif self.seen == self.warmup + self.steps and self.profiler is not None:
            self.profiler.stop()
            kinds = [m.group(1) for e in self.profiler.events() if (m := self.EVENT.match(e.name))]
            if trainer.is_global_zero:
                results.write_json(self.out, {k: kinds.count(k) / self.steps for k in sorted(set(kinds))})


def measure(make, *, devices: int, accelerator: str = "cpu", strategy: str = "auto", warmup: int = 3,
            steps: int = 10, precision: str = hardware.BASELINE, name: str | None = None) -> BenchRow | None:
    """Train `make()` -> (module, datamodule) on `devices` processes with bench.bench; the result row on rank 0,
    None elsewhere."""
    module, dm = make()
    with tempfile.TemporaryDirectory() as tmp:
        return bench.bench(module, dm, name or f"{devices} x {accelerator}", steps=steps, warmup=warmup,
                           precision=precision, accelerator=accelerator, devices=devices, strategy=strategy,
                           callback=DDPBenchCallback(warmup, steps, Path(tmp) / "row.json"))


def _script(devices: int, out: str | Path, timeout: float, opts: dict) -> dict:
    """What rank 0 of `python -m course_lib.parallel.scaling` (strategy ddp, fresh processes) wrote to `out`."""
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else f"={v}") for k, v in opts.items()
             if v is not None and v is not False]
    cmd = [sys.executable, "-m", "course_lib.parallel.scaling", f"--devices={devices}", f"--out={out}", *flags]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=config.child_env())
    if res.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    found = results.read_json(out)
    if found is None:
        raise RuntimeError(f"{' '.join(cmd)} exited cleanly but wrote nothing to {out} (rank 0 writes it).")
    return found


def measure_script(devices: int, out: str | Path, timeout: float = 900, **opts) -> BenchRow:
    """`measure` through the script path: `python -m course_lib.parallel.scaling` (strategy ddp), in fresh processes."""
    return BenchRow.from_json(_script(devices, out, timeout, opts))


def count_collectives(devices: int, out: str | Path, timeout: float = 900, **opts) -> dict:
    """The collectives a DDP training step makes on `devices` processes (the script path with --collectives):
    {kind: calls per step}, e.g. {"all_reduce": 1.0, "broadcast": 1.0}; DDP's bucket all-reduces and the loop's own."""
    return _script(devices, out, timeout, {**opts, "collectives": True})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="DDP training throughput on N devices; rank 0 writes the row to --out.")
    for flag, kind, default in [("devices", int, 1), ("accelerator", str, "gpu" if num_cuda_devices() else "cpu"),
                                ("model", str, "resnet9"), ("batch", int, 64), ("precision", str, hardware.BASELINE),
                                ("warmup", int, 3), ("steps", int, 10), ("workers", int, 0), ("data", str, None),
                                ("lesson", str, None), ("threads", int, None)]:
        p.add_argument(f"--{flag}", type=kind, default=default)
    p.add_argument("--out", required=True)
    p.add_argument("--collectives", action="store_true", help="count each step's collectives (profiled) instead")
    a = p.parse_args(argv)
    hardware.check_devices(a.accelerator, a.devices)
    if a.threads:  # one process's threads (with several, Lightning gives each CPU process cores / processes)
        torch.set_num_threads(a.threads)
    make = lambda: (ImageClassifierModule(a.model), runs.datamodule(  # noqa: E731  (per-process batch size)
        a.lesson, image_folder=config.data_source(a.data), batch_size=a.batch,
        num_workers=a.workers, persistent_workers=a.workers > 0, pin_memory=a.accelerator != "cpu"))
    strategy = "ddp" if a.devices > 1 else "auto"
    if a.collectives:  # a short profiled fit, apart from any timed one
        module, dm = make()
        count = CollectiveCounter(a.warmup, a.steps, a.out)
        runs.trainer(None, a.precision, **{"max_epochs": None, "max_steps": a.warmup + a.steps, "callbacks": [count],
                                           "accelerator": a.accelerator, "devices": a.devices, "logger": False,
                                           "enable_checkpointing": False, "strategy": strategy}).fit(module, dm)
        return
    row = measure(make, devices=a.devices, accelerator=a.accelerator, strategy=strategy, warmup=a.warmup,
                  steps=a.steps, precision=a.precision)
    if row:
        results.write_json(a.out, row.to_json())


if __name__ == "__main__":
    main()
