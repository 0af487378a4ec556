"""Lesson 08's measurements, shared with scripts/gpu_capstone.py: the seed loop, the twin comparison, the FLOP
summary, and the results report every GPU script writes (command, versions, hardware)."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Callable

import lightning as L
import torch

from . import config, flops, speedrun
from .models import AirNet
from .ondevice import SpeedrunDataModule
from .timing import DeviceTimer, EpochTimer
from .verdict import mean_diff, mean_ratio, spread  # noqa: F401  (their home is verdict; scripts call them here)


def run_seed(module: speedrun.SpeedrunModule, dm: SpeedrunDataModule, seed: int, epochs: float,
             precision: str | None = None) -> dict:
    """Fresh weights and batch order for `seed` (a compiled net stays compiled), train, test with TTA; timed on the
    device: whitening init and training in fit_s, TTA in test_s (total_s both), data loading in neither.
    Fractional epochs (speedrun.EPOCHS) train ceil(epochs x batches per epoch) steps."""
    speedrun.fresh_weights(module, seed)  # in place: the compiled graphs stay valid
    dm.shuffle_seed, module.whiten_images = seed, dm.train_set.images
    timer, clock = EpochTimer(), DeviceTimer(dm.train_set.images.device)
    trainer = speedrun.make_trainer(epochs, precision, steps_per_epoch=len(dm.train_dataloader()), callbacks=[timer])
    start = clock.mark()
    trainer.fit(module, datamodule=dm)
    fitted = clock.mark()
    acc = trainer.test(module, datamodule=dm, verbose=False)[0]["test_acc"]
    tested = clock.mark()
    return {"seed": seed, "acc": acc, "train_s": sum(timer.seconds), "epoch_s": timer.seconds,
            "fit_s": clock.seconds(start, fitted), "test_s": clock.seconds(fitted, tested),
            "total_s": clock.seconds(start, tested), "steps": trainer.global_step,
            "losses": torch.stack(module.step_losses).float().cpu()}


def seed_runs(module: speedrun.SpeedrunModule, dm: SpeedrunDataModule, seeds: list[int], epochs: float,
              precision: str | None = None, warmup_seed: int | None = None,
              on_run: Callable[[list[dict]], object] | None = None) -> list[dict]:
    """run_seed for each seed, after an untimed warm-up run (compilation, cuDNN autotuning) when warmup_seed is set;
    on_run(runs so far) after each run (e.g. to rewrite a results file, so an interrupted job keeps its figures)."""
    if warmup_seed is not None:
        run_seed(module, dm, warmup_seed, epochs, precision)
    runs = []
    for seed in seeds:
        runs.append(run_seed(module, dm, seed, epochs, precision))
        if on_run is not None:
            on_run(runs)
    return runs


def compare_twin(module: speedrun.SpeedrunModule, dm: SpeedrunDataModule, run: dict, epochs: float,
                 precision: str | None = None, net: AirNet | None = None) -> dict:
    """Train the plain-PyTorch twin on the same seed and batches as `run`; epoch-time ratio, loss and accuracy gaps.

    net: a twin AirNet to reuse (fresh weights for the seed are loaded into it, so a compiled one stays compiled);
    default a new one. Timed as run_seed: whitening and training in twin_fit_s, TTA in twin_test_s."""
    dm.shuffle_seed = run["seed"]
    L.seed_everything(run["seed"], verbose=False)  # the same initial weights as fresh_weights gave the module
    fresh = AirNet(module.recipe.widths)
    if net is None:
        net = fresh
    else:
        net.load_state_dict(fresh.state_dict())  # in place, whitened flag reset: train_twin whitens again
    precision = config.choose_precision(precision)
    batches, clock = dm.train_dataloader(), DeviceTimer(dm.train_set.images.device)
    start = clock.mark()
    twin = speedrun.train_twin(net, batches, epochs, module.recipe, precision)
    fitted = clock.mark()
    steady = slice(1, None) if epochs > 1 else slice(None)  # epoch 0 holds warm-up (and compilation on a GPU)
    lit_epoch, twin_epoch = statistics.median(run["epoch_s"][steady]), statistics.median(twin["epoch_s"][steady])
    diff = (run["losses"] - twin["losses"]).abs()
    first = min(10, len(diff))
    acc = speedrun.evaluate_tta(twin["net"], dm.test_set.images, dm.test_set.labels, module.hparams.tta_level,
                                batch_size=dm.eval_batch_size, precision=precision)
    tested = clock.mark()
    return {"ratio": lit_epoch / twin_epoch, "lit_epoch_s": lit_epoch, "twin_epoch_s": twin_epoch,
            "twin_fit_s": clock.seconds(start, fitted), "twin_test_s": clock.seconds(fitted, tested),
            "twin_total_s": clock.seconds(start, tested), "seed": run["seed"],
            "steady_from": steady.start or 0, "loss_diff_first": diff[:first].max().item(), "first": first,
            "loss_diff_all": diff.max().item(), "twin_acc": acc, "lit_acc": run["acc"], "twin": twin}


def flop_summary(widths: tuple[int, int, int], batch: int, steps: int, epoch_s: float,
                 info: dict | None = None) -> dict:
    """FLOPs of one training epoch, the rate achieved in `epoch_s`, and its fraction of the device's listed peak."""
    step_flops = flops.train_step_flops(AirNet(widths), batch) * steps
    precision = "fp16" if config.choose_precision(info=info) == "16-mixed" else "bf16"  # what the policy trains in
    rate = flops.achieved(step_flops, epoch_s, info, precision)
    peak = (f"{rate['fraction_of_peak']:.1%} of the {rate['peak_text']}" if rate["peak_tflops"] else rate["peak_text"])
    text = f"{step_flops / 1e12:.3g} TFLOP per epoch in {epoch_s:.3g} s: {rate['tflops']:.3g} TFLOP/s, {peak}"
    return {"tflop_per_epoch": step_flops / 1e12, **rate, "text": text}


def write_report(path: str | Path, title: str, lines: list[str], info: dict | None = None) -> Path:
    """A markdown results file: title, the exact command, hardware, the given lines, then every library version."""
    info = info or config.hardware()
    command = " ".join(["python", *sys.argv]) if sys.argv and sys.argv[0] else "(interactive)"
    text = [f"# {title}", "", f"Command: `{command}`", "", f"Hardware: {config.hardware_label(info)}", "", *lines,
            "", "Versions and hardware facts: " + ", ".join(f"{k} {v}" for k, v in info.items())]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n")
    return path


def committed_results(pattern: str = "*-capstone.md", folder: str | Path | None = None) -> list[dict] | None:
    """The headline of every results file a GPU run committed under docs/results/ (file, title, hardware, the
    "## Comparison" bullets); None when this installation has no docs/ folder (installed without the checkout)."""
    root = config.repo_root()
    folder = Path(folder) if folder else root / "docs" / "results" if root else None
    if folder is None or not folder.is_dir():
        return None
    found = []
    for path in sorted(folder.glob(pattern)):
        lines = path.read_text().splitlines()
        start = lines.index("## Comparison") + 1 if "## Comparison" in lines else len(lines)
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
        found.append({"file": path.name, "title": lines[0].lstrip("# ") if lines else path.name,
                      "hardware": next((ln for ln in lines if ln.startswith("Hardware: ")), "Hardware: not named"),
                      "comparison": [ln for ln in lines[start:end] if ln.startswith("- ")]})
    return found
