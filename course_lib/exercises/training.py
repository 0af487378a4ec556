"""The measured exercises of lessons 01 and 02: the learner's training loop against the starter loop, and a Trainer
that keeps the debugging setup's purpose without its cost (grading in core.py)."""
from __future__ import annotations

import statistics
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from ..base import config, hardware
from ..measure import ceilings, timing
from ..training import loops, runs
from ..training.models import LeNet
from .core import Grading, forbidden, grade_prediction, prediction_tolerance

# --- lesson 01: batch a classifier that runs one image at a time ---------------------------------------------------
EX01_IMAGES = 512  # images the check classifies per call
EX01_TARGET = 3.0  # batched against one image per forward: the fixed cost per op shared among many images


def one_at_a_time(net, images: torch.Tensor) -> torch.Tensor:
    """Lesson 01's starter: labels (N,) for images (N, 3, 32, 32), one forward per image, as a naive server would."""
    with torch.no_grad():
        return torch.cat([net(img.unsqueeze(0)).argmax(dim=1) for img in images])


def inputs_01(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    """A seeded LeNet in eval mode and EX01_IMAGES normalised-scale random images (N, 3, 32, 32)."""
    torch.manual_seed(seed)
    return LeNet().eval(), torch.randn(EX01_IMAGES, 3, 32, 32)


def mechanism_01(classify: Callable, net, images: torch.Tensor, *, grading: Grading) -> bool:
    """No clock: the same labels as one image at a time, forwards of more than one image, no call of the course's
    finished prediction loop (loops.predict)."""
    sizes: list[int] = []
    hook = net.register_forward_pre_hook(lambda m, a: sizes.append(len(a[0])))
    try:
        with forbidden(loops.predict) as called:
            mine = classify(net, images)
    finally:
        hook.remove()
    problems = [f"it called {', '.join(sorted(set(called)))}: batch the forwards yourself"] if called else []
    expected = one_at_a_time(net, images)
    if not isinstance(mine, torch.Tensor) or mine.shape != expected.shape:
        problems.append(f"return the {len(images)} labels as one tensor of shape {tuple(expected.shape)}")
    elif (mine != expected).sum() > 1:  # one near-tie may flip with a batched kernel's summation order
        problems.append(f"{int((mine != expected).sum())} labels differ from one image at a time: same net, same "
                        "images, the same answers")
    if sizes and max(sizes) == 1:
        problems.append("every forward still saw one image: give each forward many")
    print(f"Exercise 1: {len(sizes)} forwards, largest batch {max(sizes, default=0)}")
    return grading.mechanism("Exercise 1", problems)


def check_01_batching(classify: Callable, predict_speedup: Callable | None = None, *, ceil=None,
                      timer: Callable | None = None, target: float = EX01_TARGET, measure: bool = True,
                      grading: Grading | None = None) -> bool:
    """Lesson 01: classify(net, images) -> labels is the learner's batched classifier and predict_speedup(ceil) their
    prediction of its speed-up over one image at a time, written from their ceilings first. Mechanism (no clock);
    then the speed-up measured in alternating rounds (>= target) and the prediction against it, within
    core.prediction_tolerance(ceil). timer(fn) -> seconds of one call of fn() (a Stopwatch; tests inject one)."""
    grading = grading or Grading()
    net, images = inputs_01()
    ok = mechanism_01(classify, net, images, grading=grading)
    if not (ok and measure):
        return ok
    from ..measure import ceilings

    ceil = ceil or ceilings.load("cpu", verbose=False)
    timer = timer or (lambda fn: _seconds(fn))
    fast = grading.ratio_check("Exercise 1 (batched)", lambda: timer(lambda: classify(net, images)),
                               lambda: timer(lambda: one_at_a_time(net, images)), target, repeats=3,
                               what=f"seconds to classify {len(images)} images", hardware=hardware.label())
    predicted = predict_speedup(ceil) if predict_speedup else None
    told = grade_prediction("Exercise 1", predicted, grading.grades[-1].ratio, prediction_tolerance(ceil))
    return bool(ok and fast and told)


def _seconds(fn: Callable) -> float:
    """Seconds of one call of fn(), on the host clock."""
    with timing.Stopwatch() as watch:
        fn()
    return watch.seconds


# ---- lesson 02: what the Trainer does around each step ------------------------------------------------------------
EX02_BATCH = 64
EX02_POISON, EX02_SHORT = 5, 12  # the mechanism's runs: the loss turns NaN at step 5 of 12


class _StepOnly(L.LightningModule):
    """LeNet with a training step that logs train_loss and SGD; poison_at: the loss turns NaN from that step on."""

    def __init__(self, poison_at: int | None = None):
        super().__init__()
        self.net, self.poison_at = LeNet(), poison_at

    def forward(self, x):  # (B, 3, 32, 32) -> (B, 10)
        return self.net(x)

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch[0]), batch[1])
        if self.poison_at is not None and self.global_step >= self.poison_at:
            loss = loss * float("nan")  # a diverged step, as a too-large learning rate gives
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def starter_02(folder: str | None = None) -> dict:
    """The starter of lesson 02's exercise: anomaly detection, a CSV row and a checkpoint every step."""
    folder = tempfile.mkdtemp(prefix="course02_", dir=folder)
    return dict(detect_anomaly=True, logger=CSVLogger(folder), log_every_n_steps=1,
                callbacks=[ModelCheckpoint(dirpath=f"{folder}/checkpoints", every_n_train_steps=1)])


def inputs_02():
    """Lesson 02's check data: batches of EX02_BATCH made on the device (no loader), set up for fit."""
    dm = runs.datamodule("02_lightning", kind="device", batch_size=EX02_BATCH)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _02_fit(settings: Callable[[], dict], dm, steps: int, *, warmup: int = 5, poison_at: int | None = None) -> dict:
    """Train the check's LeNet with Trainer(**settings()); seconds per image, steps taken, loggers, checkpoints."""
    kwargs, cb = dict(settings()), timing.BenchCallback(warmup, steps)
    # runs.TIMING but for what the exercise is about: the learner's settings choose the logger and checkpoints
    quiet = {k: v for k, v in runs.TIMING.items() if k not in ("logger", "enable_checkpointing")}
    # the precision through the one decision: the learner's, else Lightning's default, the fp32 baseline lesson 02 uses
    precision = kwargs.pop("precision", hardware.BASELINE)
    trainer = runs.trainer(None, precision, **{"accelerator": "auto", "devices": 1, "max_epochs": None, **quiet,
                                               **kwargs, "max_steps": warmup + steps,
                                               "callbacks": [*kwargs.get("callbacks", []), cb]})
    L.seed_everything(0, verbose=False)
    error = None
    try:
        trainer.fit(_StepOnly(poison_at), train_dataloaders=dm.train_dataloader())
    except Exception as err:  # a guard may stop a diverged run by raising (as detect_anomaly does)
        if poison_at is None:
            raise
        error = err
    saved = any(c.dirpath and Path(c.dirpath).is_dir() and any(Path(c.dirpath).glob("*.ckpt"))
                for c in trainer.callbacks if isinstance(c, ModelCheckpoint))
    timed = poison_at is None and len(cb.step_s) >= steps
    # each step's own time plus the gap before it (where the checkpoint of the previous step is written); the
    # median step: a step the machine preempted is an outlier, not the setting's cost
    per_step = statistics.median(a + b for a, b in zip(cb.step_s, cb.wait_s)) if timed else None
    return {"seconds_per_image": per_step / EX02_BATCH if timed else None,
            "steps": trainer.global_step, "loggers": len(trainer.loggers), "saved": bool(saved), "error": error}


def mechanism_02(trainer_settings: Callable[[], dict], dm, *, grading: Grading) -> bool:
    """No clock: a logger, a checkpoint at the end of training, no anomaly detection, and a run whose loss turns
    NaN stopped within one step of it."""
    with warnings.catch_warnings():  # anomaly detection's report of the NaN it found, a page of traceback
        warnings.simplefilter("ignore")
        stopped = _02_fit(trainer_settings, dm, EX02_SHORT, warmup=0, poison_at=EX02_POISON)
    problems = []
    if stopped["steps"] > EX02_POISON + 1:
        problems.append(f"a run whose loss turned NaN at step {EX02_POISON} went on to step {stopped['steps']}\n"
                        f"stop it at the first non-finite loss (a Callback's on_train_batch_end sees the step's loss)")
    if trainer_settings().get("detect_anomaly"):
        problems.append("anomaly detection is still on: it checks every backward op, the slow way to catch a NaN\n"
                        "write the cheap check of the loss yourself")
    normal = _02_fit(trainer_settings, dm, EX02_SHORT, warmup=0)
    if not normal["loggers"]:
        problems.append("no logger: the run must still log its training loss")
    if not normal["saved"]:
        problems.append("no checkpoint was saved: the run must still leave one at the end of training")
    return grading.mechanism("Exercise 3", problems)


def check_02_trainer(trainer_settings: Callable[[], dict], predict_step_seconds: Callable | None = None, *,
                     ceil=None, times: tuple[list, list] | None = None, data=None, target: float = 1.5,
                     measure: bool = True, grading: Grading | None = None) -> bool:
    """Lesson 02: Trainer(**trainer_settings()) must keep what the debugging setup was for (mechanism_02, no clock)
    and train LeNet at >= `target`x the starter's images/s, alternately in this run; predict_step_seconds(ceil),
    written first from the ceilings (`ceil`: lesson 00's, loaded when None), must land within
    core.prediction_tolerance(ceil) of the seconds per step your settings measured (batch EX02_BATCH). data:
    inputs_02()'s, built here when None; times: injected (starter's, yours) seconds per image per round (tests)."""
    grading, dm = grading or Grading(), data or inputs_02()
    ok = mechanism_02(trainer_settings, dm, grading=grading)
    if not (ok and measure):
        return ok
    steps = max(30, min(config.run_size("02_lightning").bench_steps, 60))
    what, label = "time per image", hardware.label()
    if times:
        fast = grading.grade("Exercise 3 (Trainer overhead)", *times, target, what=what, hardware=label)
    else:
        with tempfile.TemporaryDirectory(prefix="course02_starter_") as scratch:  # the starter's logs and checkpoints
            fast = grading.ratio_check("Exercise 3 (Trainer overhead)",
                                       lambda: _02_fit(trainer_settings, dm, steps)["seconds_per_image"],
                                       lambda: _02_fit(lambda: starter_02(scratch), dm, steps)["seconds_per_image"],
                                       target, repeats=5, what=what, hardware=label)  # short rounds: 5
    mine = grading.grades[-1].mine * EX02_BATCH  # seconds per step with your settings, the median round
    ceil = ceil or ceilings.load("cuda" if hardware.gpu_count() else "cpu", verbose=False)
    predicted = predict_step_seconds(ceil) if predict_step_seconds else None
    told = grade_prediction("Exercise 3", predicted, mine, prediction_tolerance(ceil), "seconds per step",
                            timing.duration)
    return bool(ok and fast and told)
