"""Part (d) of scripts/gpu_capstone.py: lessons 03-05's benchmark configurations (scripts/gpu_check.py's) and
lesson 06's one-device row (parallel.scaling's script path, as scripts/gpu_ddp_check.py's first row), one at a
time while a time budget lasts, on a 15,000-image subset made from the capstone's decoded data.

Writes docs/results/<gpu>.md (build/gpu_check-dryrun.md in a dry run) in gpu_check.py's layout."""
from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from course_lib.base import config, hardware, results
from course_lib.benchmark import bench
from course_lib.parallel import scaling
from scripts import gpu_check

LESSON_06 = "lesson 06"


def order(names: list[str]) -> list[str]:
    """The rows in the order a time budget runs them: each lesson target's baseline and row (gpu_check.TARGETS, from
    the specs), then lesson 06's one-device row, then the other rows (of `names`, gpu_check's) in course order."""
    pairs = [n for _, row, base, _ in gpu_check.TARGETS for n in (base, row) if n in names]
    first = list(dict.fromkeys(pairs))
    return [*first, LESSON_06, *(n for n in names if n not in first)]


def run(source: Path, deadline: float, dry: bool, info: dict, show=print) -> list[str]:
    """Bench the configurations one at a time (in `order`) while time.monotonic() is before deadline, rewriting the
    results file after each; show(summary lines) after each too. Returns the summary lines."""
    data = torch.load(source, weights_only=True)
    n = min(15_000, len(data["labels"]))  # as gpu_check.py --make-subset from the folder
    subset = gpu_check.save_subset(data, config.build_dir() / "capstone" / "cifar10-15k.pt", n)
    size = config.run_size("gpu_check", gpu=not dry, size="smoke" if dry else None)
    batch, steps, warmup = size.batch_size, size.bench_steps, gpu_check.warmup_steps(size)
    ddp_size = config.run_size("gpu_ddp_check", gpu=not dry, size="smoke" if dry else None)  # per process
    cfgs = {c["name"]: c for c in gpu_check.configs()}
    names = ["small CNN, GPU-resident data", "ResNet-9 fp32", LESSON_06] if dry else order(list(cfgs))
    out = results.report_path("gpu_check", None if dry else info["gpu"])
    rows, notes = [], []

    for name in names:
        need = 150 if "compile" in name else 60
        if time.monotonic() + need > deadline:
            notes.append(f"- {name}: not run, time budget spent (needs about {need} s)")
            continue
        try:
            if name == LESSON_06:
                with tempfile.TemporaryDirectory() as tmp:
                    row = scaling.measure_script(1, Path(tmp) / "1.json", accelerator="cpu" if dry else "gpu",
                                                  model="lenet" if dry else "resnet9", batch=ddp_size.batch_size,
                                                  precision="32-true" if dry else hardware.choose_precision(),
                                                  warmup=warmup, steps=steps, workers=0 if dry else 4,
                                                  data=str(subset))
                rows.append(replace(row, name="lesson 06: 1 device, DataLoader (gpu_ddp_check's first row)"))
            else:
                rows += bench.run_configs([cfgs[name]], lambda cfg: gpu_check.make_run(cfg, str(subset), batch),
                                         steps=steps, warmup=warmup)
        except Exception as err:  # noqa: BLE001
            notes.append(f"- {name}: FAILED: {type(err).__name__}: {str(err)[-300:]}")
        speed = {r.name: r.images_per_s for r in rows}
        targets = gpu_check.target_lines(speed, unmeasured=False)
        lines = [f"Data: {subset} ({n:,} images, gpu_check.py's subset); batch {batch}; {warmup} warm-up "
                 f"+ {steps} timed steps per row, one run each; part (d) of scripts/gpu_capstone.py.", "",
                 bench.table(bench.add_speedups(rows, rows[0].name)) if rows else "(no row yet)", "",
                 "## Targets", "", *(targets or ["- none measured yet"]), *notes]
        results.write_report(out, f"GPU check (lessons 03-06) on {hardware.label(info)}", lines, info)
        summary = [f"Written to {out}:", "", *[f"- {r.name}: {r.images_per_s:,.0f} images/s" for r in rows],
                   *targets, *notes]
        show(summary)
    return summary
