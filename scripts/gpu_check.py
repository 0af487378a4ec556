"""The GPU check for lessons 03-05: first this GPU's ceilings (measure.ceilings: matmul per native format, HBM
bandwidth inside and past L2, elementwise and tanh rates, launch cost eager and compiled, host-to-device copies from
pinned and pageable memory), saved where the lessons read them; the lessons' step model against them (ResNet-9's
step per native format, its convolutions at their floors); then the lessons' bench configurations, in about 8
minutes, offline.

    python -m scripts.gpu_check --make-subset data/carry/cifar10-15k.pt   # here: a compact real-data file (46 MB)
    python -m scripts.gpu_check --data data/carry/cifar10-15k.pt          # on the GPU machine

Writes build/results/gpu_check.json and docs/results/<gpu>.md (table, versions, hardware, the command).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from course_lib.base import config, hardware, lessons, results
from course_lib.benchmark import bench
from course_lib.data.sources import ImageFolderSource, load_image_folder, open_source
from course_lib.measure import ceilings, roofline, timing, verdict
from course_lib.training import runs
from course_lib.training.models import ResNet9
from course_lib.training.modules import ImageClassifierModule

SECONDS = {"smoke": 0.2, "full": 1.0}  # timed seconds per step-model row
TARGETS = [(lesson.number, t.config, t.baseline, t.speedup) for lesson in lessons.LESSONS for t in lesson.targets]
# (lesson, config, baseline, required speedup): the targets for an H100/H200-class GPU, from the lesson specs


def target_lines(speed: dict[str, float], *, unmeasured: bool = True) -> list[str]:
    """'- lesson 04: A / B = 2.31x (target 2.0x): met' (or MISSED, by verdict.target_line) for each of TARGETS whose
    rows were measured; with unmeasured, a 'not measured here' line for the others. speed: row name -> images/s."""
    lines = []
    for lesson, name, base, need in TARGETS:
        if name in speed and base in speed:
            got = speed[name] / speed[base]
            lines.append(f"- lesson {lesson}: {verdict.target_line(f'{name} / {base}', got, need)}")
        elif unmeasured:
            lines.append(f"- lesson {lesson}: {name} / {base}: not measured here")
    return lines


def save_subset(data: dict, out: Path, n: int) -> Path:
    """Save a seeded random n-image subset of {'images', 'labels', 'classes'} as one uint8 tensor file."""
    keep = torch.randperm(len(data["labels"]), generator=torch.Generator().manual_seed(0))[:n]
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"images": data["images"][keep].clone(), "labels": data["labels"][keep].clone(),
                "classes": data["classes"]}, out)
    return out


def make_subset(out: Path, n: int) -> None:
    """Save a seeded random subset of the real training images as one uint8 tensor file to carry."""
    source = Path(config.data_source(need_files=True))
    if not isinstance(open_source(source, data_dir=config.data_root()), ImageFolderSource):  # a tensor file: it
        # is already what this would write
        raise ValueError(f"A subset is cut from an image folder, and the data source is the file {source}. Carry "
                         f"that file as it is (--data {source}), or point --data or COURSE_DATA at a folder "
                         f"laid out as <folder>/train/<class>/*.jpg.")
    save_subset(load_image_folder(source / "train"), out, n)
    print(f"wrote {n} images to {out} ({out.stat().st_size / 2**20:.0f} MiB)")


def make_run(cfg: dict, source: str | None, batch: int):
    """One configuration -> (module, datamodule) on `source`, with the TF32 switches the configuration asks for."""
    hardware.set_tf32(bool(cfg.get("tf32")))  # one TF32 API for this torch version
    dm = runs.datamodule("gpu_check", kind="device" if cfg.get("device_data") else "loader", image_folder=source,
                         batch_size=batch, **cfg.get("data", {}))
    return ImageClassifierModule(**cfg["model"]), dm


def warmup_steps(size: config.RunSize) -> int:
    """Untimed steps before a row's timed ones: a fifth of them, at least one (allocation, cuDNN's search)."""
    return max(1, size.bench_steps // 5)


def configs() -> list[dict]:
    """The lessons' GPU rows from their specs (Lesson.gpu_rows: lessons 03, 04 and 05), in course order, as the bench
    configurations run_configs reads; a row for one precision policy only where the policy picks it."""
    policy = hardware.choose_precision()
    return [asdict(row) for lesson in lessons.LESSONS for row in lesson.gpu_rows if row.policy in (None, policy)]


def step_model_lines(ceil: ceilings.Ceilings, batch: int, width: int = 64) -> list[str]:
    """The lessons' step model against these ceilings: ResNet-9's forward and backward at `batch` in every native
    format fp32, bf16 and fp16 (autocast), each counted with its kernels' floors at these shapes (roofline.count) and
    timed (timing.time_calls, synchronized on a GPU): roofline.explain's line per format."""
    net = ResNet9(width=width).to(ceil.device)
    x = torch.randn(batch, 3, 32, 32, device=ceil.device)
    y = torch.randint(0, 10, (batch,), device=ceil.device)
    lines = []
    for fmt in (f for f in ceil.formats() if f in ("fp32", "bf16", "fp16")):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(fmt)

        def step(dtype=dtype):  # forward under the format's autocast, then backward: what the model counts
            with torch.autocast(ceil.device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
        step()  # warm: kernels chosen, gradients allocated
        counts = roofline.count(step, floors=True)
        seconds = timing.time_calls(step, min_run_time=SECONDS[ceil.size])
        name = f"ResNet-9 width {width}, batch {batch}, {fmt}"
        lines.append(f"- {roofline.explain(name, counts, ceil, seconds, fmt)}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="image folder or .pt file from --make-subset (default: COURSE_DATA)")
    p.add_argument("--make-subset", type=Path, help="write a compact subset file here and exit")
    p.add_argument("--subset-size", type=int, default=15000)
    size = config.run_size("gpu_check")  # COURSE_SIZE, scaled for this device in config.LESSON_SCALES
    p.add_argument("--batch", type=int, default=size.batch_size)
    p.add_argument("--steps", type=int, default=size.bench_steps)
    p.add_argument("--warmup", type=int, default=warmup_steps(size))
    args = p.parse_args()
    if args.make_subset:
        make_subset(args.make_subset, args.subset_size)
        return 0
    source = config.data_source(args.data)

    start = time.perf_counter()
    ceil = ceilings.measure("cuda" if hardware.gpu_count() else "cpu")  # first: the figures the step model reads
    try:  # a CPU dry run keeps the lessons' CPU ceilings as they are
        kept = f"saved to {ceilings.save(ceil)}" if hardware.gpu_count() else "dry run: the CPU's ceilings, not saved"
    except ceilings.NoisyCeilings as err:  # a busy machine: reported, not saved
        kept = str(err)
    ceiling_lines = ["## Ceilings", "", *(f"- {line.strip()}" for line in ceil.lines()), "", kept, "",
                     "## The step model against them", "", *step_model_lines(ceil, args.batch), ""]
    runnable, skipped = [], []
    for cfg in configs():  # a precision this hardware lacks is skipped with the policy's reason
        try:
            hardware.choose_precision(cfg.get("precision", "32-true"))
            runnable.append(cfg)
        except ValueError as err:
            skipped.append(f"- {cfg['name']}: skipped: {err}")
    make = lambda cfg: make_run(cfg, source, args.batch)  # noqa: E731
    rows = bench.run_configs([c for c in runnable if not c.get("alone")], make, steps=args.steps, warmup=args.warmup)
    for cfg in (c for c in runnable if c.get("alone")):  # may fail on this GPU: then the report says why
        try:
            rows += bench.run_configs([cfg], make, steps=args.steps, warmup=args.warmup)
        except Exception as err:  # noqa: BLE001
            skipped.append(f"- {cfg['name']}: FAILED here: {type(err).__name__}: {str(err)[-300:]}")
    rows = bench.add_speedups(rows, rows[0].name)
    speed = {r.name: r.images_per_s for r in rows}
    lines = [*ceiling_lines, f"Data: {source}; batch {args.batch}; {args.warmup} warm-up + {args.steps} timed steps "
             f"per row, one run each; total {time.perf_counter() - start:.0f} s.", "", bench.table(rows), "",
             "## Targets", ""]
    lines += target_lines(speed) + skipped
    info = hardware.facts()
    out = results.report_path("gpu_check", info["gpu"])  # without a GPU only a dry run, kept out of docs/
    results.write_report(out, f"GPU check on {hardware.label(info)}", lines, info)
    results.save_rows(rows, "gpu_check")
    print(out.read_text() + f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
