"""Lesson 08's measurements, shared with scripts/gpu_capstone.py and scripts/fidelity_cpu.py: the one seed loop under a
time budget (seed_loop; seed_runs for the speedrun), the twin comparison and the FLOP summary."""
from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar

import lightning as L
import torch

from ..base import hardware
from ..data.data import CIFAR10DataModule
from ..measure import flops
from ..measure.timing import DeviceTimer, EpochTimer, duration, flop_rate
from . import speedrun
from .models import AirNet
from .twin import Twin, TwinFit

T, R = TypeVar("T"), TypeVar("R")  # seed_loop's items and results


@dataclass(frozen=True)
class SeedRun:
    """One seed of the speedrun through Lightning: test accuracy, device-timed phases and per-step losses."""

    seed: int
    acc: float  # test accuracy, with the recipe's test-time augmentation
    train_s: float  # the training epochs only (EpochTimer), seconds
    epoch_s: list[float]  # each training epoch, seconds
    fit_s: float  # trainer.fit: whitening init and training
    test_s: float  # trainer.test: test-time augmentation
    total_s: float  # fit_s + test_s
    steps: int  # optimiser steps taken
    losses: torch.Tensor  # (steps,) float32 training losses on the CPU


def run_seed(module: speedrun.SpeedrunModule, dm: CIFAR10DataModule, *, seed: int, epochs: float,
             precision: str | None = None) -> SeedRun:
    """Fresh weights and batch order for `seed` (a compiled net stays compiled), train, test with TTA; timed on the
    device: whitening init and training in fit_s, TTA in test_s (total_s both), data loading in neither.
    Fractional epochs (speedrun.EPOCHS) train ceil(epochs x batches per epoch) steps."""
    speedrun.fresh_weights(module, seed)  # in place: the compiled graphs stay valid; unwhitened, so the fit whitens
    dm.batching.shuffle_seed = seed
    timer, clock = EpochTimer(), DeviceTimer(dm.train_set.images.device)
    trainer = speedrun.make_trainer(epochs, precision, steps_per_epoch=len(dm.train_dataloader()), callbacks=[timer])
    start = clock.mark()
    trainer.fit(module, datamodule=dm)
    fitted = clock.mark()
    acc = trainer.test(module, datamodule=dm, verbose=False)[0]["test_acc"]
    tested = clock.mark()
    return SeedRun(seed=seed, acc=acc, train_s=sum(timer.seconds), epoch_s=timer.seconds,
                   fit_s=clock.seconds(start, fitted), test_s=clock.seconds(fitted, tested),
                   total_s=clock.seconds(start, tested), steps=trainer.global_step,
                   losses=torch.stack(module.step_losses).float().cpu())


def seed_loop(run: Callable[[T], R], items: Iterable[T], *, warmup: Callable[[], object] | None = None,
              deadline: float | None = None, on_run: Callable[[list[R]], object] | None = None) -> list[R]:
    """The one loop of seeds (or any runs) under a time budget: warmup() first, untimed (compilation, cuDNN
    autotuning); then run(item) for each item, stopping before one that would start after `deadline`
    (time.monotonic()); on_run(results so far) after each (e.g. to rewrite a results file, so an interrupted job
    keeps its figures). Fewer results than items: the budget was spent."""
    if warmup is not None:
        warmup()
    done = []
    for item in items:
        if deadline is not None and time.monotonic() > deadline:
            break
        done.append(run(item))
        if on_run is not None:
            on_run(done)
    return done


def seed_runs(module: speedrun.SpeedrunModule, dm: CIFAR10DataModule, *, seeds: list[int], epochs: float,
              precision: str | None = None, warmup_seed: int | None = None, deadline: float | None = None,
              on_run: Callable[[list[SeedRun]], object] | None = None) -> list[SeedRun]:
    """run_seed for each seed through seed_loop: after an untimed warm-up run when warmup_seed is set, until
    `deadline` (time.monotonic()) where one is given."""
    one = functools.partial(run_seed, module, dm, epochs=epochs, precision=precision)
    warm = None if warmup_seed is None else functools.partial(one, seed=warmup_seed)
    return seed_loop(lambda seed: one(seed=seed), seeds, warmup=warm, deadline=deadline, on_run=on_run)


@dataclass(frozen=True)
class TwinComparison:
    """Lightning against its plain-PyTorch twin on one seed's batches: epoch times, loss and accuracy gaps."""

    seed: int
    ratio: float  # Lightning's steady epoch time / the twin's (> 1: the twin is faster)
    lit_epoch_s: float  # median steady epoch, seconds
    twin_epoch_s: float
    twin_fit_s: float  # whitening init and training
    twin_test_s: float  # test-time augmentation
    twin_total_s: float
    steady_from: int  # the first epoch counted as steady (epoch 0 holds warm-up and compilation)
    first: int  # how many first steps loss_diff_first covers
    loss_diff_first: float  # largest |Lightning loss - twin loss| over the first steps
    loss_diff_all: float  # ... over all steps
    lit_acc: float
    twin_acc: float
    twin: TwinFit  # the twin's own fit (losses, epoch_s, net)


def compare_twin(module: speedrun.SpeedrunModule, dm: CIFAR10DataModule, run: SeedRun, *, epochs: float,
                 precision: str | None = None, twin: Twin | None = None) -> TwinComparison:
    """Train the plain-PyTorch twin on the same seed and batches as `run`; epoch-time ratio, loss and accuracy gaps.

    twin: a Twin to reuse (fresh weights for the seed are loaded into its net, so a compiled one stays
    compiled); default a new one with the module's recipe. Timed as run_seed: whitening and training in
    twin_fit_s, TTA in twin_test_s."""
    recipe = module.recipe
    dm.batching.shuffle_seed = run.seed
    L.seed_everything(run.seed, verbose=False)  # the same initial weights as fresh_weights gave the module
    fresh = speedrun.recipe_net(recipe)
    if twin is None:
        twin = Twin(fresh, recipe)
    else:
        twin.net.load_state_dict(fresh.state_dict())  # in place, whitened flag reset: the fit whitens again
    precision = hardware.choose_precision(precision)
    batches, clock = dm.train_dataloader(), DeviceTimer(dm.train_set.images.device)
    start = clock.mark()
    result = twin.fit(batches, epochs, precision)
    fitted = clock.mark()
    steady = slice(1, None) if epochs > 1 else slice(None)  # epoch 0 holds warm-up (and compilation on a GPU)
    lit_epoch, twin_epoch = statistics.median(run.epoch_s[steady]), statistics.median(result.epoch_s[steady])
    diff = (run.losses - result.losses).abs()
    first = min(10, len(diff))
    # the compiled handle, as the module tests with its compiled net
    acc = speedrun.evaluate_tta(twin.forward, dm.test_set.images, dm.test_set.labels, level=recipe.tta_level,
                                batch_size=dm.batching.eval_batch_size, precision=precision)
    tested = clock.mark()
    return TwinComparison(
        seed=run.seed, ratio=lit_epoch / twin_epoch, lit_epoch_s=lit_epoch, twin_epoch_s=twin_epoch,
        twin_fit_s=clock.seconds(start, fitted), twin_test_s=clock.seconds(fitted, tested),
        twin_total_s=clock.seconds(start, tested), steady_from=steady.start or 0, first=first,
        loss_diff_first=diff[:first].max().item(), loss_diff_all=diff.max().item(), lit_acc=run.acc, twin_acc=acc,
        twin=result)


@dataclass(frozen=True)
class FlopSummary:
    """One training epoch's FLOPs and the rate achieved (flops.Achieved's fields), with the line that says both."""
    tflop_per_epoch: float
    tflops: float
    peak_tflops: float | None
    fraction_of_peak: float | None
    peak_text: str
    text: str  # '290 GFLOP per epoch in 1.78 s: 163 GFLOP/s, <fraction of the peak or why there is none>'


def flop_summary(*, widths: tuple[int, int, int], batch_size: int, steps: int, epoch_s: float,
                 info: dict | None = None) -> FlopSummary:
    """FLOPs of one training epoch, the rate achieved in `epoch_s`, and its fraction of the device's listed peak in
    the number format the policy trains in (hardware.choose_precision: bf16 where native, else fp16 on a GPU, fp32 on
    a CPU)."""
    step_flops = flops.train_step_flops(AirNet(widths), batch_size) * steps
    precision = hardware.number_format(hardware.choose_precision(info=info))  # the format the policy trains in
    rate = flops.achieved(step_flops, epoch_s, info, precision)
    peak = f"{100 * rate.fraction_of_peak:.1f} % of the {rate.peak_text}" if rate.peak_tflops else rate.peak_text
    # in the unit that reads best: '290 GFLOP per epoch in 1.78 s: 163 GFLOP/s' on a CPU, TFLOP on a GPU
    count = flop_rate(step_flops).removesuffix("/s")
    text = f"{count} per epoch in {duration(epoch_s)}: {flop_rate(rate.tflops * 1e12)}, {peak}"
    return FlopSummary(step_flops / 1e12, **dataclasses.asdict(rate), text=text)
