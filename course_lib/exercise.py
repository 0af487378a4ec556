"""Exercises: warm-ups that compare an answer with what the lesson computed, and speed or memory exercises graded
by measurement, where the learner's code and the baseline are measured alternately in the same run on the same
hardware, and the check passes when the learner reaches a target ratio. Here: the framework and the checks of
lessons 01-03 and 08; those of lessons 04-07, whose levers are the hardware's, are in exercise_hardware.py.

A lesson's speed exercise is two cells: one that starts with `# EXERCISE <n>` holding the starter code the learner
edits, and one that starts with `# CHECK <n>` that sets `passed` from a check function. Reference solutions
live in notebooks/solutions/NN_topic.py; tests/test_exercises.py runs every check with the starter (it must fail)
and with the solution (it must pass)."""
from __future__ import annotations

import math
import statistics
from typing import Callable


def check(name: str, answer, expected, rel_tol: float = 0.05) -> bool | None:
    """Warm-up: compare a learner's answer with the expected value; None means not attempted yet (no error)."""
    if answer is None:
        print(f"{name}: not attempted yet. Replace the None above with your answer and re-run.")
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        ok = math.isclose(float(answer), float(expected), rel_tol=rel_tol)
    else:
        ok = answer == expected
    if not ok:
        raise AssertionError(f"{name}: {answer!r} is not right yet (hint: it should be close to what the lesson "
                             f"measured or computed). Try again.")
    print(f"{name}: correct.")
    return True


def ratio_check(name: str, learner: Callable[[], float], baseline: Callable[[], float], target: float,
                repeats: int = 3, what: str = "time", hardware: str | None = None) -> bool:
    """Measure baseline() and learner() alternately `repeats` times; each returns a cost (seconds, bytes, ...;
    lower is better). Passes when median(baseline) / median(learner) reaches `target`; prints the verdict with the
    spread of the per-round ratios, and never raises for a miss (a notebook cell keeps running)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")
    base, mine = [], []
    for _ in range(repeats):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(float(baseline()))
        mine.append(float(learner()))
    if min(mine) <= 0:
        raise ValueError(f"{name}: the learner's {what} must be positive, got {mine}.")
    ratio = statistics.median(base) / statistics.median(mine)
    rounds = sorted(b / m for b, m in zip(base, mine))
    passed = ratio >= target
    where = f" on {hardware}" if hardware else ""
    print(f"{name}: the baseline's {what} / yours = {ratio:.2f}x{where} (target >= {target:g}x; per round "
          f"{rounds[0]:.2f}-{rounds[-1]:.2f}x, {repeats} rounds): {'passed' if passed else 'not yet'}")
    return passed


# --- lesson 01: the loop ---------------------------------------------------------------------------------
_01_DM: dict = {}


def _01_data():
    """Lesson 01's training data, decoded once per process."""
    if "dm" not in _01_DM:
        from . import runs
        dm = runs.datamodule("01_pytorch_baseline", seed=0)
        dm.prepare_data()
        dm.setup("fit")
        _01_DM["dm"] = dm
    return _01_DM["dm"]


def _01_measure(batch_size: int, lr: float, momentum: float, images: int, seed: int = 0) -> tuple[float, float]:
    """Seconds per image and mean training loss (second half of the images) of lesson 01's LeNet on the first
    `images` training images, in order."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from .models import LeNet

    torch.manual_seed(seed)
    net, sums, counts = LeNet(), [], []
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    loader = DataLoader(_01_data().train_set, batch_size=batch_size, shuffle=False, collate_fn=lambda b: b)
    start = time.perf_counter()
    for x, y in loader:
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sums.append(loss.detach() * len(y))
        counts.append(len(y))
        if sum(counts) >= images:
            break
    seconds = time.perf_counter() - start
    half = len(sums) // 2  # where each setup got to: the loss over the second half of its steps
    return seconds / sum(counts), float(torch.stack(sums[half:]).sum()) / sum(counts[half:])


def check_01_loop_speed(batch_size: int, lr: float, momentum: float = 0.9, target: float = 3.0) -> bool:
    """Lesson 01: the learner's loop settings against the seed's (batch 4, lr 0.001): >= `target`x the images/s on
    the same images, and a training loss over the second half of them no worse than the seed's."""
    from . import config

    images = 512 if config.run_size("01_pytorch_baseline").name == "smoke" else 2048
    _01_measure(batch_size, lr, momentum, 64)  # warm-up: decoding and first-call costs land here
    losses: dict = {}

    def cost(bs, rate, mom, key):
        seconds, loss = _01_measure(bs, rate, mom, images)
        losses.setdefault(key, []).append(loss)
        return seconds

    fast = ratio_check("Exercise 1 (loop speed)", lambda: cost(batch_size, lr, momentum, "you"),
                       lambda: cost(4, 0.001, 0.9, "seed"), target, repeats=3, what="time per image",
                       hardware=config.hardware_label())
    mine, seed = statistics.median(losses["you"]), statistics.median(losses["seed"])
    good = mine <= seed + 0.01
    print(f"Exercise 1 (loss bar): your training loss {mine:.3f} over the second half of {images} images, the "
          f"seed's {seed:.3f} (bar: at most the seed's + 0.01): {'passed' if good else 'not yet'}")
    return bool(fast and good)


# ---- lesson 02: what the Trainer does around each step ------------------------------------------------------------

def check_02_trainer_overhead(trainer_settings: Callable[[], dict], target: float = 2.0) -> bool:
    """Lesson 02: LeNet trained with Trainer(**trainer_settings()) must reach >= `target`x the images/s of the
    starter's settings (anomaly detection on, a CSV row and a checkpoint every step), alternately in this run."""
    import tempfile

    import lightning as L
    import torch
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from . import bench, config, runs
    from .models import LeNet

    class StepOnly(L.LightningModule):
        """LeNet with a training step and SGD, nothing logged: any Trainer setting, barebones too, can train it."""

        def __init__(self):
            super().__init__()
            self.net = LeNet()

        def forward(self, x):  # (B, 3, 32, 32) -> (B, 10)
            return self.net(x)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    scratch = tempfile.TemporaryDirectory(prefix="course02_starter_")  # the starter's logs and checkpoints

    def starter() -> dict:
        folder = tempfile.mkdtemp(dir=scratch.name)  # one per round: each round starts without old checkpoints
        return dict(detect_anomaly=True, logger=CSVLogger(folder), log_every_n_steps=1,
                    callbacks=[ModelCheckpoint(dirpath=f"{folder}/checkpoints", every_n_train_steps=1)])

    steps, warmup = max(30, min(config.run_size("02_lightning").bench_steps, 60)), 5
    dm = runs.datamodule("02_lightning", kind="device", batch_size=64)  # batches made on the device: no loader
    dm.prepare_data()
    dm.setup("fit")

    def seconds_per_image(settings: Callable[[], dict]) -> float:
        kwargs = settings()
        cb = bench.BenchCallback(warmup, steps)
        trainer = L.Trainer(**{"accelerator": "auto", "devices": 1, "max_epochs": None, "enable_progress_bar": False,
                               "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
                               **kwargs, "max_steps": warmup + steps,
                               "callbacks": [*kwargs.get("callbacks", []), cb]})
        L.seed_everything(0, verbose=False)
        trainer.fit(StepOnly(), train_dataloaders=dm.train_dataloader())  # training only: no validation loop
        return 1 / cb.throughput.compute()["device/samples_per_sec"]

    with scratch:
        return ratio_check("Exercise 3 (Trainer overhead)", lambda: seconds_per_image(trainer_settings),
                           lambda: seconds_per_image(starter), target, repeats=3, what="time per image",
                           hardware=config.hardware_label())


# ---- lesson 03: a data pipeline that keeps the device busy ----------------------------------------------------
def check_03_data_wait(make_data: Callable, target: float = 2.0, max_wait: float | None = None,
                       batch_size: int = 256) -> bool:
    """Lesson 03: make_data(batch_size) -> a DataModule; passes when its images/s is >= target x the JPEG
    pipeline's (num_workers=0) and its data-wait fraction is under max_wait, measured alternately in this run.
    max_wait None: 10 % on a GPU; 35 % on a CPU, where the "device" is the host and its batch work runs between
    the steps whatever the pipeline (workers on a 2-core machine compete with the step for the same cores)."""
    import torch

    from . import bench, config
    from .jpeg import JpegDataModule
    from .models import SimpleCNN
    from .modules import ImageClassifierModule
    size = config.run_size("03_gpu_and_data")
    steps, rounds = max(10, min(size.bench_steps, 30)), 3  # a JPEG round takes about a second even on 2 cores
    max_wait = max_wait if max_wait is not None else 0.10 if torch.cuda.is_available() else 0.35

    def run(dm) -> dict:
        # a small CNN: cheap enough that the data decide, costly enough that Lightning's own work between
        # steps does not count as most of the wait
        return bench.bench(ImageClassifierModule(SimpleCNN()), dm, "check", steps=steps, warmup=2)

    base, mine = [], []
    for _ in range(rounds):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(run(JpegDataModule(batch_size, subset=batch_size * (steps + 3))))
        mine.append(run(make_data(batch_size)))
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    ratio, wait = med(mine, "images_per_s") / med(base, "images_per_s"), med(mine, "data_wait")
    passed = ratio >= target and wait < max_wait
    print(f"Exercise 1: {ratio:.2f}x the JPEG pipeline's images/s (target >= {target:g}x), data wait {wait:.0%} "
          f"(target < {max_wait:.0%}; the JPEG pipeline's {med(base, 'data_wait'):.0%}) on "
          f"{config.hardware_label()}, median of {rounds} alternating rounds of {steps} steps: "
          f"{'passed' if passed else 'not yet'}")
    return passed


# ---- lesson 08: augmentation as one batch operation ---------------------------------------------------------------

def check_08_batch_augment(augment: Callable, target: float = 3.0, pad: int = 2) -> bool:
    """Lesson 08: augment(x, shifts, flips, pad) on a uint8 batch must equal the per-image starter (normalise, reflect
    pad, crop, mirror, stack) and take >= `target`x less time, timed alternately in this run."""
    import torch
    import torch.nn.functional as F

    from . import config, timing
    from .data import crop_flip, to_float

    def per_image(x, shifts, flips, pad):
        """The starter: one image at a time, as a Dataset's transform works, then stacked as a DataLoader does."""
        h, w = x.shape[-2:]
        out = []
        for i in range(len(x)):
            img = F.pad(to_float(x[i:i + 1]), (pad,) * 4, mode="reflect")[0]  # (C, H + 2 pad, W + 2 pad)
            r, c = int(shifts[0, i]), int(shifts[1, i])
            img = img[:, r:r + h, c:c + w]
            out.append(img.flip(-1) if flips[i] else img)
        return torch.stack(out)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    batch = 1024 if device == "cuda" else 512  # the speedrun's batch on a GPU; a CPU-sized one here
    x = torch.randint(0, 256, (batch, 3, 32, 32), dtype=torch.uint8, generator=g).to(device)  # (B, 3, 32, 32)
    shifts = torch.randint(0, 2 * pad + 1, (2, batch), generator=g).to(device)  # (2, B) row and column offsets
    flips = (torch.rand(batch, generator=g) < 0.5).to(device)  # (B,) mirror or not
    expected = crop_flip(to_float(x), shifts, flips, pad, mode="reflect")  # what the starter computes
    if not torch.allclose(augment(x, shifts, flips, pad), expected, atol=1e-6):
        print("Exercise 2 (batch augmentation): the result differs from the starter's: it must normalise, crop and "
              "mirror exactly as the starter does")
        return False

    def cost(fn) -> float:
        """Seconds of fn's fastest call of 5 after a warm-up (a busy machine only ever adds time)."""
        return min(timing.time_calls(lambda: fn(x, shifts, flips, pad), 5, warmup=1, device=device))

    return ratio_check("Exercise 2 (batch augmentation)", lambda: cost(augment), lambda: cost(per_image), target,
                       repeats=3, what="time per batch", hardware=config.hardware_label())
