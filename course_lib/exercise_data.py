"""Measured exercises of the data path: a pipeline that keeps the step fed (lesson 03) and augmentation as one batch
operation (lesson 08). Graded like exercise.py's: a mechanism check without a clock, then the learner's code and
the baseline measured alternately in the same run (exercise.grade)."""
from __future__ import annotations

import statistics
from typing import Callable

from .exercise import forbidden, grade, mechanism, ratio_check, torch_calls


# ---- lesson 03: a data pipeline that keeps the device busy ----------------------------------------------------
def _decoders() -> list[Callable]:
    """The JPEG decoders a pipeline may call: PIL's open, torchvision.io's, course_lib's decode_image."""
    import PIL.Image
    import torchvision.io

    from . import sources

    return [PIL.Image.open, torchvision.io.decode_image, torchvision.io.decode_jpeg, sources.decode_image]


def _finished_pipelines() -> list[Callable]:
    """course_lib's own finished pipelines, which the exercise asks the learner to build instead."""
    from . import data, ondevice, runs, sources

    return [runs.datamodule, sources.load_image_folder, data.CIFAR10DataModule.setup, ondevice.DeviceBatches.__iter__]


def mechanism_03(make_data: Callable, batch_size: int = 256, steps: int = 3) -> bool:
    """No clock: make_data(batch_size, subset) builds no course_lib finished pipeline, and during training either
    a DataLoader's worker processes do the decoding or nothing is decoded in the training process at all."""
    import torch

    from . import bench
    from .models import LeNet
    from .modules import ImageClassifierModule

    with forbidden(*_finished_pipelines()) as library:
        dm = make_data(batch_size, batch_size * (steps + 3))
        dm.prepare_data()
        dm.setup("fit")  # where a DataModule decodes, splits or caches: before the watched training
        with forbidden(*_decoders()) as decoded:
            bench.bench(ImageClassifierModule(LeNet()), dm, "mechanism", steps=steps, warmup=1)
    loader = dm.train_dataloader()
    workers = isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers > 0
    problems = []
    if library:
        problems.append(f"it uses course_lib's finished pipeline ({', '.join(sorted(set(library)))}): build it "
                        f"yourself from the JPEG files")
    if decoded and not workers:
        problems.append(f"the training process decoded {len(decoded)} images during training: decode once in "
                        f"setup (setup runs again inside fit: keep what the first call built), or decode in "
                        f"DataLoader workers")
    return mechanism("Exercise 1", problems)


def _03_seconds_per_batch(dm, batches: int) -> float:
    """Seconds per batch the DataModule's training loader delivers, after its first batch (workers start there)."""
    import time

    it = iter(dm.train_dataloader())
    next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) / batches


def check_03_data_wait(make_data: Callable, target: float = 1.5, max_wait: float | None = None,
                       batch_size: int = 256, measure: bool = True) -> bool:
    """Lesson 03: make_data(batch_size, subset) -> a DataModule over the first `subset` JPEG files (the
    mechanism_03 rules); passes when it delivers batches >= target x faster than the JPEG pipeline (num_workers=0)
    and LeNet's training on it waits for data less than max_wait of the time, measured alternately in this run.
    max_wait None: 10 % on a GPU; 35 % on a CPU, where the "device" is the host and its batch work runs between
    the steps whatever the pipeline. (The training speed-up itself is capped by the step: with the JPEG pipeline
    waiting a fraction w of the time, no pipeline trains more than 1 / (1 - w) times faster.)"""
    import torch

    from . import bench, config, hardware
    from .jpeg import JpegDataModule
    from .models import LeNet
    from .modules import ImageClassifierModule

    ok = mechanism_03(make_data, batch_size)
    if not (ok and measure):
        return ok
    size = config.run_size("03_gpu_and_data")
    steps, rounds = max(10, min(size.bench_steps, 30)), 3  # a JPEG round takes about a second even on 2 cores
    max_wait = max_wait if max_wait is not None else 0.10 if torch.cuda.is_available() else 0.35
    subset = batch_size * (steps + 3)

    def ready(dm):
        dm.prepare_data()
        dm.setup("fit")
        return dm

    base, mine, waits = [], [], []
    for _ in range(rounds):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(_03_seconds_per_batch(ready(JpegDataModule(batch_size, subset=subset)), steps))
        mine.append(_03_seconds_per_batch(ready(make_data(batch_size, subset)), steps))
        waits.append(bench.bench(ImageClassifierModule(LeNet()), make_data(batch_size, subset), "check", steps=steps,
                                 warmup=2)["data_wait"])
    fast = grade("Exercise 1 (batches delivered)", base, mine, target, what="time per batch",
                 hardware=hardware.label())
    wait = statistics.median(waits)
    fed = wait < max_wait
    print(f"Exercise 1 (data wait): LeNet training on your pipeline waits {wait:.0%} of the time (target < "
          f"{max_wait:.0%}), median of {rounds} runs of {steps} steps: {'passed' if fed else 'not yet'}")
    return bool(ok and fast and fed)


# ---- lesson 08: augmentation as one batch operation ---------------------------------------------------------------
def per_image_augment(x, shifts, flips, pad):
    """Lesson 08's starter: one image at a time, as a Dataset's transform works, then stacked as a DataLoader does."""
    import torch
    import torch.nn.functional as F

    from .data import to_float

    h, w = x.shape[-2:]
    out = []
    for i in range(len(x)):
        img = F.pad(to_float(x[i:i + 1]), (pad,) * 4, mode="reflect")[0]  # (C, H + 2 pad, W + 2 pad)
        r, c = int(shifts[0, i]), int(shifts[1, i])
        img = img[:, r:r + h, c:c + w]
        out.append(img.flip(-1) if flips[i] else img)
    return torch.stack(out)


def check_08_batch_augment(augment: Callable, target: float = 3.0, pad: int = 2, measure: bool = True) -> bool:
    """Lesson 08: augment(x, shifts, flips, pad) on a uint8 batch must equal the per-image starter (normalise, reflect
    pad, crop, mirror, stack) without calling course_lib's batch kernel (data.crop_flip) or its augmenters, and take
    >= `target`x less time, timed alternately in this run."""
    import torch

    from . import data, hardware, ondevice, timing

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    batch = 1024 if device == "cuda" else 512  # the speedrun's batch on a GPU; a CPU-sized one here
    x = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)  # (B, 3, 32, 32)
    shifts = torch.randint(0, 2 * pad + 1, (2, batch), generator=g).to(device)  # (2, B) row and column offsets
    flips = (torch.rand(batch, generator=g) < 0.5).to(device)  # (B,) mirror or not
    with forbidden(data.crop_flip, data.augment_batch, ondevice.RandomCropFlip.__call__,
                   ondevice.AlternatingFlipTranslate.__call__) as library:
        out = augment(x, shifts, flips, pad)
    problems = [f"it calls course_lib's finished kernel ({', '.join(sorted(set(library)))}): write the batch "
                f"operation yourself"] if library else []
    if not (out.shape == x.shape and torch.allclose(out, per_image_augment(x, shifts, flips, pad), atol=1e-6)):
        problems.append("the result differs from the starter's: it must normalise, crop and mirror exactly as the "
                        "starter does")
    small, large = (torch_calls(augment, x[:n], shifts[:, :n], flips[:n], pad) for n in (8, 64))
    if large > small + 8:  # a batch operation makes the same calls for 8 images as for 64
        problems.append(f"it makes {small} torch calls for 8 images and {large} for 64: it still works one image "
                        f"at a time")
    ok = mechanism("Exercise 2", problems)
    if not (ok and measure):
        return ok

    def cost(fn) -> float:
        """Seconds per call of fn's fastest block of calls (a busy machine only ever adds time)."""
        return min(timing.time_calls(lambda: fn(x, shifts, flips, pad)))

    return ratio_check("Exercise 2 (batch augmentation)", lambda: cost(augment), lambda: cost(per_image_augment),
                       target, repeats=3, what="time per batch", hardware=hardware.label())
