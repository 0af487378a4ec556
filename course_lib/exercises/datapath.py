"""Measured exercises of the data path: a pipeline that keeps the step fed (lesson 03) and augmentation as one batch
operation (lesson 08). Graded as core.py grades: a mechanism check without a clock, then the learner's code and
the baseline measured alternately in the same run."""
from __future__ import annotations

import statistics
from typing import Callable

import PIL.Image
import torch
import torch.nn.functional as F
import torchvision.io

from ..base import config, hardware
from ..benchmark import bench
from ..data import data, ondevice, sources
from ..data.jpeg import JpegDataModule
from ..measure import ceilings, timing
from ..training import runs
from ..training.models import LeNet
from ..training.modules import ImageClassifierModule
from .core import Grading, forbidden, grade_prediction, prediction_tolerance, torch_calls

#: the ceilings a prediction of batch work (gather, pad, crop, mirror, uint8 to float) rests on: the bytes, in cache
#: or DRAM, into reused or new outputs, and the fixed cost per op
DATA_CEILINGS = ("memory", "memory cache", "add reused", "add fresh", "per op")

# ---- lesson 03: a data pipeline that keeps the device busy ----------------------------------------------------
#: the JPEG decoders a pipeline may call: PIL's open, torchvision.io's, course_lib's decode_image
DECODERS = (PIL.Image.open, torchvision.io.decode_image, torchvision.io.decode_jpeg, sources.decode_image)
#: course_lib's own finished pipelines, which the exercise asks the learner to build instead
FINISHED_PIPELINES = (runs.datamodule, sources.load_image_folder, data.CIFAR10DataModule.setup,
                      ondevice.DeviceBatches.__iter__)


def mechanism_03(make_data: Callable, batch_size: int = 256, steps: int = 3, *, grading: Grading) -> bool:
    """No clock: make_data(batch_size, subset) builds no course_lib finished pipeline, and nothing is decoded
    during training, in the training process or in DataLoader workers: the files are decoded once, before it
    (more workers, `num_workers=2`, only move the same decoding onto cores the step also needs)."""
    with forbidden(*FINISHED_PIPELINES) as library:
        dm = make_data(batch_size, batch_size * (steps + 3))
        dm.prepare_data()
        dm.setup("fit")  # where a DataModule decodes, splits or caches: before the watched training
        with forbidden(*DECODERS) as decoded:
            bench.bench(ImageClassifierModule(LeNet()), dm, "mechanism", steps=steps, warmup=1)
    loader = dm.train_dataloader()
    workers = isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers > 0
    if workers:  # a worker's decoding is out of this process's sight: fetch one sample here, watched, instead
        with forbidden(*DECODERS) as per_sample:
            loader.dataset[0]
        decoded = decoded or per_sample
    problems = []
    if library:
        problems.append(f"it uses course_lib's finished pipeline ({', '.join(sorted(set(library)))})\nbuild it "
                        f"yourself from the JPEG files")
    if decoded:
        where = "DataLoader workers decoded the JPEG files" if workers else \
            f"the training process decoded {len(decoded):,} images"
        problems.append(f"{where} during training\ndecode the files once, in setup, into one uint8 tensor, and "
                        f"augment whole batches\n(setup runs again inside fit: keep what the first call built)")
    return grading.mechanism("Exercise 1", problems)


def _ready(dm):
    """The DataModule, prepared and set up for fit."""
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _03_seconds_per_batch(dm, batches: int) -> float:
    """Seconds per batch the DataModule's training loader delivers, after its first batch (workers start there)."""
    it = iter(dm.train_dataloader())
    next(it)
    with timing.Stopwatch() as watch:  # the loader's host work: its batches stay on the CPU here
        for _ in range(batches):
            next(it)
    return watch.seconds / batches


def _03_measure(make_data: Callable, batch_size: int, steps: int, rounds: int) -> dict[str, list[float]]:
    """Alternating rounds (a slow spell of the machine hits both sides alike): seconds per batch of the JPEG
    pipeline ("base") and the learner's ("mine"), and the data-wait fraction of LeNet training on the learner's."""
    subset = batch_size * (steps + 3)
    found: dict[str, list[float]] = {"base": [], "mine": [], "waits": []}
    for _ in range(rounds):
        found["base"].append(_03_seconds_per_batch(_ready(JpegDataModule(batch_size, subset=subset)), steps))
        found["mine"].append(_03_seconds_per_batch(_ready(make_data(batch_size, subset)), steps))
        found["waits"].append(bench.bench(ImageClassifierModule(LeNet()), make_data(batch_size, subset), "check",
                                          steps=steps, warmup=2).data_wait)
    return found


def check_03_data_wait(make_data: Callable, predict_batch_seconds: Callable | None = None, *, ceil=None,
                       measured: dict | None = None, target: float = 1.5, max_wait: float | None = None,
                       batch_size: int = 256, measure: bool = True, grading: Grading | None = None) -> bool:
    """Lesson 03: make_data(batch_size, subset) -> a DataModule over the first `subset` JPEG files (the
    mechanism_03 rules); passes when it delivers batches >= target x faster than the JPEG pipeline (num_workers=0)
    and LeNet's training on it waits for data less than max_wait of the time, measured alternately in this run, and
    predict_batch_seconds(ceil, batch_size), written first from the ceilings (`ceil`: lesson 00's, loaded when None),
    lands within core.prediction_tolerance(ceil, DATA_CEILINGS) of the seconds per batch your pipeline measured.
    measured: injected rounds {"base": [s], "mine": [s], "waits": [fraction]} (tests; no clock then).
    max_wait None: 10 % on a GPU; 35 % on a CPU, where the "device" is the host and its batch work runs between
    the steps whatever the pipeline. (The training speed-up itself is capped by the step: with the JPEG pipeline
    waiting a fraction w of the time, no pipeline trains more than 1 / (1 - w) times faster.)"""
    grading = grading or Grading()
    ok = mechanism_03(make_data, batch_size, grading=grading)
    if not (ok and measure):
        return ok
    steps, rounds = max(10, min(config.run_size("03_gpu_and_data").bench_steps, 30)), 3  # a JPEG round: ~1 s
    max_wait = max_wait if max_wait is not None else 0.10 if hardware.gpu_count() else 0.35
    found = measured or _03_measure(make_data, batch_size, steps, rounds)
    fast = grading.grade("Exercise 1 (batches delivered)", found["base"], found["mine"], target,
                         what="time per batch", hardware=hardware.label())
    wait = statistics.median(found["waits"])
    fed = wait < max_wait
    print(f"Exercise 1 (data wait): {'passed' if fed else 'not yet'} (training waits {100 * wait:.0f} % of the time, "
          f"target < {100 * max_wait:.0f} %)\n  LeNet on your pipeline, median of {len(found['waits'])} runs")
    ceil = ceil or ceilings.load("cuda" if hardware.gpu_count() else "cpu", verbose=False)
    predicted = predict_batch_seconds(ceil, batch_size) if predict_batch_seconds else None
    told = grade_prediction("Exercise 1", predicted, statistics.median(found["mine"]),
                            prediction_tolerance(ceil, DATA_CEILINGS), "seconds per batch", timing.duration)
    return bool(ok and fast and fed and told)


# ---- lesson 08: augmentation as one batch operation ---------------------------------------------------------------
#: course_lib's batch kernel and augmenters, which the exercise asks the learner to write instead
FINISHED_AUGMENTERS = (data.crop_flip, data.augment_batch, ondevice.RandomCropFlip.__call__,
                       ondevice.AlternatingFlipTranslate.__call__)
EX08_EXTRA_CALLS = 8  # torch calls a batch operation may add between 8 and 64 images (one per image is a loop)


def per_image_augment(x, shifts, flips, pad):
    """Lesson 08's starter: one image at a time, as a Dataset's transform works, then stacked as a DataLoader does."""
    h, w = x.shape[-2:]
    out = []
    for i in range(len(x)):
        img = F.pad(data.to_float(x[i:i + 1]), (pad,) * 4, mode="reflect")[0]  # (C, H + 2 pad, W + 2 pad)
        r, c = int(shifts[0, i]), int(shifts[1, i])
        img = img[:, r:r + h, c:c + w]
        out.append(img.flip(-1) if flips[i] else img)
    return torch.stack(out)


def inputs_08(pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, shifts, flips): a seeded uint8 batch on the device, its crop offsets and mirror flags."""
    device = "cuda" if hardware.gpu_count() else "cpu"
    g = torch.Generator().manual_seed(0)
    batch = 1024 if device == "cuda" else 512  # the speedrun's batch on a GPU; a CPU-sized one here
    x = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)  # (B, 3, 32, 32)
    shifts = torch.randint(0, 2 * pad + 1, (2, batch), generator=g).to(device)  # (2, B) row and column offsets
    flips = (torch.rand(batch, generator=g) < 0.5).to(device)  # (B,) mirror or not
    return x, shifts, flips


def mechanism_08(augment: Callable, pad: int, *, grading: Grading) -> bool:
    """No clock: the same result as the per-image starter, without course_lib's kernel, in as many torch calls
    for 64 images as for 8 (a batch operation, not a loop over images)."""
    x, shifts, flips = inputs_08(pad)
    with forbidden(*FINISHED_AUGMENTERS) as library:
        out = augment(x, shifts, flips, pad)
    problems = [f"it calls course_lib's finished kernel ({', '.join(sorted(set(library)))})\nwrite the batch "
                f"operation yourself"] if library else []
    if not (out.shape == x.shape and torch.allclose(out, per_image_augment(x, shifts, flips, pad), atol=1e-6)):
        problems.append("the result differs from the starter's\nit must normalise, crop and mirror exactly as the "
                        "starter does")
    small, large = (torch_calls(augment, x[:n], shifts[:, :n], flips[:n], pad) for n in (8, 64))
    if large > small + EX08_EXTRA_CALLS:
        problems.append(f"it makes {small} torch calls for 8 images and {large} for 64\nit still works one image "
                        f"at a time")
    return grading.mechanism("Exercise 2", problems)


def check_08_batch_augment(augment: Callable, predict_speedup: Callable | None = None, *, ceil=None,
                           timer: Callable | None = None, target: float = 3.0, pad: int = 2, measure: bool = True,
                           grading: Grading | None = None) -> bool:
    """Lesson 08: augment(x, shifts, flips, pad) on a uint8 batch must equal the per-image starter (normalise, reflect
    pad, crop, mirror, stack) without calling course_lib's batch kernel (data.crop_flip) or its augmenters, and take
    >= `target`x less time, timed alternately in this run; predict_speedup(ceil, x, shifts, flips, pad), written
    first from the ceilings (`ceil`: lesson 00's, loaded when None), must land within
    core.prediction_tolerance(ceil, DATA_CEILINGS) of that speed-up. timer(fn) -> seconds per call of fn(x, shifts,
    flips, pad) (tests inject one; fn is augment or per_image_augment)."""
    grading = grading or Grading()
    ok = mechanism_08(augment, pad, grading=grading)
    if not (ok and measure):
        return ok
    x, shifts, flips = inputs_08(pad)

    def cost(fn) -> float:
        """Seconds per call of fn's fastest block of calls (a busy machine only ever adds time)."""
        return timer(fn) if timer else min(timing.time_calls(lambda: fn(x, shifts, flips, pad)))

    fast = grading.ratio_check("Exercise 2 (batch augmentation)", lambda: cost(augment),
                               lambda: cost(per_image_augment), target, repeats=3, what="time per batch",
                               hardware=hardware.label())
    ceil = ceil or ceilings.load(x.device.type, verbose=False)
    predicted = predict_speedup(ceil, x, shifts, flips, pad) if predict_speedup else None
    told = grade_prediction("Exercise 2", predicted, grading.grades[-1].ratio,
                            prediction_tolerance(ceil, DATA_CEILINGS))
    return bool(fast and told)
