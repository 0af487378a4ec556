"""The measured exercises of lessons 01 and 02: the learner's training loop against the starter loop, and a Trainer
that keeps the debugging setup's purpose without its cost (grading in core.py)."""
from __future__ import annotations

import dataclasses
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
from torch.utils.data import DataLoader, Subset

from .. import config, hardware, loops, runs, timing
from ..models import LeNet
from .core import Grading, forbidden

# --- lesson 01: the loop -----------------------------------------------------------------------------------------
EX01_IMAGES = 2048  # the first 2,048 training images (all of the smoke subset), at every run size
EX01_HELD_OUT = 1024  # held-out images the loss is measured on
EX01_MAX_LOSS = 2.20  # held-out loss bar; the starter loop ends at 2.28 on these images, near chance (ln 10 = 2.30)


def seed_train(net, train_set, images: int) -> None:
    """The seed articles' loop (lesson 01's starter): batch 4, SGD at a constant lr 0.001 with momentum 0.9."""
    opt = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)
    seen = 0
    for x, y in DataLoader(train_set, batch_size=4, shuffle=False, collate_fn=lambda b: b):
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen += len(y)
        if seen >= images:
            break


class _Counted:
    """A dataset view that counts the training images served (__getitems__ batches or single items)."""

    def __init__(self, ds):
        self.ds, self.served = ds, 0

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        self.served += 1
        return self.ds[i]

    def __getitems__(self, idx):
        self.served += len(idx)
        return self.ds.__getitems__(idx)


@dataclasses.dataclass(frozen=True)
class LoopData:
    """Lesson 01's check inputs, built once by inputs_01 and held by the caller: the first EX01_IMAGES training
    images, the held-out batch, and the starter loop's result on them (seeded: the same on every call)."""
    train_set: Subset
    held_out: tuple[torch.Tensor, torch.Tensor]  # (EX01_HELD_OUT, 3, 32, 32) images, (EX01_HELD_OUT,) labels
    seed: dict | None = None  # _01_run(seed_train, ...)


def _01_run(train: Callable, data: LoopData) -> dict:
    """Train a seeded LeNet with train(net, train_set, images); time, images served, batch sizes, held-out loss."""
    torch.manual_seed(0)
    net, batches = LeNet(), []
    net.register_forward_pre_hook(lambda m, a: batches.append(len(a[0])) if m.training else None)
    counted = _Counted(data.train_set)
    with timing.Stopwatch() as watch:  # LeNet on the CPU, as lesson 01 trains it
        train(net.train(), counted, EX01_IMAGES)
    net.eval()
    with torch.no_grad():
        loss = F.cross_entropy(net(data.held_out[0]), data.held_out[1]).item()
    return {"seconds": watch.seconds, "served": counted.served, "batches": batches, "loss": loss}


def inputs_01() -> LoopData:
    """Decode lesson 01's check images (the smoke subsets at every run size: the ones the loss bar was set against)
    and run the starter loop on them once."""
    dm = runs.datamodule("01_pytorch_baseline", seed=0, subset=EX01_IMAGES, eval_subset=EX01_HELD_OUT)
    dm.prepare_data()
    dm.setup("fit")
    held_out = dm.val_set.__getitems__(list(range(min(EX01_HELD_OUT, len(dm.val_set)))))
    data = LoopData(Subset(dm.train_set, range(min(EX01_IMAGES, len(dm.train_set)))), held_out)
    return dataclasses.replace(data, seed=_01_run(seed_train, data))


def mechanism_01(train: Callable, data: LoopData, *, max_loss: float, grading: Grading) -> bool:
    """No clock: the loop trains on at most the first EX01_IMAGES images, takes optimiser steps, does not call
    course_lib's finished loop, and leaves the held-out loss at most `max_loss`."""
    with forbidden(loops.train_plain) as called:
        mine = _01_run(train, data)
    seed, images = data.seed, EX01_IMAGES
    problems = [f"your loop called {', '.join(sorted(set(called)))}: write the loop yourself"] if called else []
    if mine["served"] > images + max(mine["batches"], default=0):
        problems.append(f"it read {mine['served']} training images; the budget is the first {images}")
    if not mine["batches"]:
        problems.append("the network never ran a forward pass in training mode: train it")
    if mine["loss"] > max_loss:
        problems.append(f"held-out loss {mine['loss']:.3f} after {images} images; the bar is {max_loss:.2f} "
                        f"(the starter's: {seed['loss']:.3f}, chance: 2.30)")
    print(f"Exercise 1: your loop took {len(mine['batches'])} steps over {mine['served']} images, held-out loss "
          f"{mine['loss']:.3f} (bar <= {max_loss:.2f}); the starter loop {len(seed['batches'])} steps, "
          f"{seed['loss']:.3f}")
    return grading.mechanism("Exercise 1", problems)


def check_01_loop(train: Callable, *, data: LoopData | None = None, target: float = 2.0,
                  max_loss: float = EX01_MAX_LOSS, measure: bool = True, grading: Grading | None = None) -> bool:
    """Lesson 01: train(net, train_set, images) is the learner's training loop. Mechanism (mechanism_01, no clock);
    measurement: >= `target`x the starter's images/s, alternately in this run. data: inputs_01()'s, built here when
    None (a caller checking several loops builds it once)."""
    grading = grading or Grading()
    data = data or inputs_01()
    ok = mechanism_01(train, data, max_loss=max_loss, grading=grading)
    if not (ok and measure):
        return ok
    fast = grading.ratio_check("Exercise 1 (loop speed)", lambda: _01_run(train, data)["seconds"],
                               lambda: _01_run(seed_train, data)["seconds"], target, repeats=3,
                               what="training time on the same images", hardware=hardware.label())
    return bool(ok and fast)


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
    kwargs, cb = settings(), timing.BenchCallback(warmup, steps)
    # runs.TIMING but for what the exercise is about: the learner's settings choose the logger and checkpoints
    quiet = {k: v for k, v in runs.TIMING.items() if k not in ("logger", "enable_checkpointing")}
    trainer = L.Trainer(**{"accelerator": "auto", "devices": 1, "max_epochs": None, **quiet, **kwargs,
                           "max_steps": warmup + steps, "callbacks": [*kwargs.get("callbacks", []), cb]})
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
        problems.append(f"a run whose loss turned NaN at step {EX02_POISON} went on to step {stopped['steps']}: "
                        f"stop it at the first non-finite loss (a Callback's on_train_batch_end sees the step's loss)")
    if trainer_settings().get("detect_anomaly"):
        problems.append("anomaly detection is still on: it checks every backward op, the slow way to catch a NaN; "
                        "write the cheap check of the loss yourself")
    normal = _02_fit(trainer_settings, dm, EX02_SHORT, warmup=0)
    if not normal["loggers"]:
        problems.append("no logger: the run must still log its training loss")
    if not normal["saved"]:
        problems.append("no checkpoint was saved: the run must still leave one at the end of training")
    return grading.mechanism("Exercise 3", problems)


def check_02_trainer(trainer_settings: Callable[[], dict], *, data=None, target: float = 1.5, measure: bool = True,
                     grading: Grading | None = None) -> bool:
    """Lesson 02: Trainer(**trainer_settings()) must keep what the debugging setup was for (mechanism_02, no clock)
    and train LeNet at >= `target`x the starter's images/s, alternately in this run. data: inputs_02()'s, built
    here when None."""
    grading, dm = grading or Grading(), data or inputs_02()
    ok = mechanism_02(trainer_settings, dm, grading=grading)
    if not (ok and measure):
        return ok
    steps = max(30, min(config.run_size("02_lightning").bench_steps, 60))
    with tempfile.TemporaryDirectory(prefix="course02_starter_") as scratch:  # the starter's logs and checkpoints
        fast = grading.ratio_check("Exercise 3 (Trainer overhead)",
                                   lambda: _02_fit(trainer_settings, dm, steps)["seconds_per_image"],
                                   lambda: _02_fit(lambda: starter_02(scratch), dm, steps)["seconds_per_image"],
                                   target, repeats=5, what="time per image", hardware=hardware.label())  # short: 5
    return bool(ok and fast)
