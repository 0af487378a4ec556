"""The measured exercises of lessons 01 and 02: the learner's training loop against the starter loop, and a Trainer
that keeps the debugging setup's purpose without its cost (grading in exercise.py)."""
from __future__ import annotations

import statistics
from typing import Callable

from .exercise import forbidden, mechanism, ratio_check

# --- lesson 01: the loop -----------------------------------------------------------------------------------------
EX01_IMAGES = 2048  # the first 2,048 training images (all of the smoke subset), at every run size
EX01_MAX_LOSS = 2.20  # held-out loss bar; the starter loop ends at 2.28 on these images, near chance (ln 10 = 2.30)


def seed_train(net, train_set, images: int) -> None:
    """The seed articles' loop (lesson 01's starter): batch 4, SGD at a constant lr 0.001 with momentum 0.9."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

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


def _01_run(train: Callable, images: int) -> dict:
    """Train a seeded LeNet with train(net, train_set, images); time, images served, batch sizes, held-out loss."""
    import time

    import torch
    import torch.nn.functional as F

    from . import runs
    from .models import LeNet

    if "dm" not in _01_DM:
        # the same images at every run size: the smoke subsets, whose seed-loop loss the bar was set against
        dm = runs.datamodule("01_pytorch_baseline", seed=0, subset=EX01_IMAGES, eval_subset=1024)
        dm.prepare_data()
        dm.setup("fit")
        _01_DM["dm"] = dm
    dm = _01_DM["dm"]
    torch.manual_seed(0)
    net, batches = LeNet(), []
    net.register_forward_pre_hook(lambda m, a: batches.append(len(a[0])) if m.training else None)
    counted = _Counted(torch.utils.data.Subset(dm.train_set, range(min(images, len(dm.train_set)))))
    start = time.perf_counter()
    train(net.train(), counted, images)
    seconds = time.perf_counter() - start
    net.eval()
    with torch.no_grad():
        x, y = dm.val_set.__getitems__(list(range(min(1024, len(dm.val_set)))))
        loss = F.cross_entropy(net(x), y).item()
    return {"seconds": seconds, "served": counted.served, "batches": batches, "loss": loss}


_01_DM: dict = {}  # lesson 01's data, decoded once per process, and the starter's result


def check_01_loop(train: Callable, target: float = 2.0, max_loss: float = EX01_MAX_LOSS, measure: bool = True) -> bool:
    """Lesson 01: train(net, train_set, images) is the learner's training loop. Mechanism (no clock): it trains on
    at most the first `images` images, takes optimiser steps, does not call course_lib's finished loop, and leaves
    the network's held-out loss at most `max_loss` (the starter loop does not get there on the same images).
    Measurement: >= `target`x the starter's images/s, alternately in this run."""
    from . import hardware, loops

    images = EX01_IMAGES
    with forbidden(loops.train_plain) as called:
        mine = _01_run(train, images)
    if "seed" not in _01_DM:  # seeded and deterministic: its loss is the same on every call
        _01_DM["seed"] = _01_run(seed_train, images)
    seed = _01_DM["seed"]
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
    ok = mechanism("Exercise 1", problems)
    if not (ok and measure):
        return ok
    fast = ratio_check("Exercise 1 (loop speed)", lambda: _01_run(train, images)["seconds"],
                       lambda: _01_run(seed_train, images)["seconds"], target, repeats=3,
                       what="training time on the same images", hardware=hardware.label())
    return bool(ok and fast)


# ---- lesson 02: what the Trainer does around each step ------------------------------------------------------------
def _02_module(poison_at: int | None = None):
    """LeNet with a training step that logs train_loss and SGD; poison_at: the loss turns NaN from that step on."""
    import lightning as L
    import torch
    import torch.nn.functional as F

    from .models import LeNet

    class StepOnly(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = LeNet()

        def forward(self, x):  # (B, 3, 32, 32) -> (B, 10)
            return self.net(x)

        def training_step(self, batch, batch_idx):
            loss = F.cross_entropy(self(batch[0]), batch[1])
            if poison_at is not None and self.global_step >= poison_at:
                loss = loss * float("nan")  # a diverged step, as a too-large learning rate gives
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    return StepOnly()


def starter_02(folder: str | None = None) -> dict:
    """The starter of lesson 02's exercise: anomaly detection, a CSV row and a checkpoint every step."""
    import tempfile

    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    folder = tempfile.mkdtemp(prefix="course02_", dir=folder)
    return dict(detect_anomaly=True, logger=CSVLogger(folder), log_every_n_steps=1,
                callbacks=[ModelCheckpoint(dirpath=f"{folder}/checkpoints", every_n_train_steps=1)])


def _02_fit(settings: Callable[[], dict], steps: int, warmup: int = 5, poison_at: int | None = None) -> dict:
    """Train the check's LeNet with Trainer(**settings()); seconds per image, steps taken, loggers, checkpoints."""
    from pathlib import Path

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from . import runs, timing

    if "dm" not in _02_DM:
        dm = runs.datamodule("02_lightning", kind="device", batch_size=64)  # batches made on the device: no loader
        dm.prepare_data()
        dm.setup("fit")
        _02_DM["dm"] = dm
    kwargs, cb = settings(), timing.BenchCallback(warmup, steps)
    trainer = L.Trainer(**{"accelerator": "auto", "devices": 1, "max_epochs": None, "enable_progress_bar": False,
                           "enable_model_summary": False, "num_sanity_val_steps": 0, "limit_val_batches": 0,
                           **kwargs, "max_steps": warmup + steps, "callbacks": [*kwargs.get("callbacks", []), cb]})
    L.seed_everything(0, verbose=False)
    error = None
    try:
        trainer.fit(_02_module(poison_at), train_dataloaders=_02_DM["dm"].train_dataloader())
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
    return {"seconds_per_image": per_step / 64 if timed else None,
            "steps": trainer.global_step, "loggers": len(trainer.loggers), "saved": bool(saved), "error": error}


_02_DM: dict = {}


def check_02_trainer(trainer_settings: Callable[[], dict], target: float = 1.5, measure: bool = True) -> bool:
    """Lesson 02: Trainer(**trainer_settings()) must keep what the debugging setup was for (a logger, a checkpoint
    at the end of training, and a run whose loss turns NaN stopped within one step of it) and train LeNet at
    >= `target`x the starter's images/s, alternately in this run."""
    import tempfile
    import warnings

    from . import config, hardware

    poison, short = 5, 12
    with warnings.catch_warnings():  # anomaly detection's report of the NaN it found, a page of traceback
        warnings.simplefilter("ignore")
        stopped = _02_fit(trainer_settings, short, warmup=0, poison_at=poison)
    problems = []
    if stopped["steps"] > poison + 1:
        problems.append(f"a run whose loss turned NaN at step {poison} went on to step {stopped['steps']}: stop "
                        f"it at the first non-finite loss (a Callback's on_train_batch_end sees the step's loss)")
    if trainer_settings().get("detect_anomaly"):
        problems.append("anomaly detection is still on: it checks every backward op, the slow way to catch a NaN; "
                        "write the cheap check of the loss yourself")
    normal = _02_fit(trainer_settings, short, warmup=0)
    if not normal["loggers"]:
        problems.append("no logger: the run must still log its training loss")
    if not normal["saved"]:
        problems.append("no checkpoint was saved: the run must still leave one at the end of training")
    ok = mechanism("Exercise 3", problems)
    if not (ok and measure):
        return ok
    steps = max(30, min(config.run_size("02_lightning").bench_steps, 60))
    with tempfile.TemporaryDirectory(prefix="course02_starter_") as scratch:  # the starter's logs and checkpoints
        fast = ratio_check("Exercise 3 (Trainer overhead)",
                           lambda: _02_fit(trainer_settings, steps)["seconds_per_image"],
                           lambda: _02_fit(lambda: starter_02(scratch), steps)["seconds_per_image"], target,
                           repeats=5, what="time per image", hardware=hardware.label())  # short rounds: 5
    return bool(ok and fast)
