"""The one wiring point: a lesson's DataModule and Trainer settings from the run size, the data source and the
precision policy. Notebooks, the CLI and the scripts build their data and trainers here instead of repeating it."""
from __future__ import annotations

import logging
import os
import warnings

import lightning as L
from lightning.pytorch.plugins.precision import MixedPrecision

from . import config, hardware
from .data import CIFAR10DataModule
from .ondevice import DeviceCIFAR10DataModule, SpeedrunDataModule

#: Trainer settings for a timing run: nothing but training (no validation, logging, checkpoints or progress bar)
TIMING = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              limit_val_batches=0, num_sanity_val_steps=0)
DATAMODULES = {"loader": CIFAR10DataModule, "device": DeviceCIFAR10DataModule, "speedrun": SpeedrunDataModule}


def data_kwargs(lesson: str | None = None, **overrides) -> dict:
    """The data source and the run size's subsets for a lesson (None: the plain run size), plus any overrides."""
    size = config.run_size(lesson)
    return {"image_folder": config.data_source(), "subset": size.train_subset, "eval_subset": size.eval_subset,
            **overrides}


def datamodule(lesson: str | None = None, kind: str = "loader", **overrides) -> L.LightningDataModule:
    """A lesson's DataModule: "loader" (DataLoader over decoded images), "device" (data on the accelerator) or
    "speedrun" (lesson 08's batches); keyword overrides go to its constructor (batch_size, seed, device, ...)."""
    if kind not in DATAMODULES:
        raise ValueError(f"kind must be one of {sorted(DATAMODULES)}, got {kind!r}.")
    return DATAMODULES[kind](**data_kwargs(lesson, **overrides))


def trainer_kwargs(lesson: str | None = None, precision: str | None = "32-true", timing: bool = False,
                   **overrides) -> dict:
    """Trainer arguments: the run size's epochs, a precision checked against this hardware (None: the policy's
    choice, hardware.choose_precision), no progress bar or model summary; timing=True adds TIMING.

    16-mixed on a CPU (the policy's choice for a GPU without bf16, emulated on a CPU by the tests) is passed as
    Lightning's fp16 plugin with a GradScaler("cpu"): given by name, Lightning would quietly run bf16-mixed there."""
    base = {"max_epochs": config.run_size(lesson).epochs, "accelerator": "auto", "devices": 1,
            "precision": hardware.choose_precision(precision), "enable_progress_bar": False,
            "enable_model_summary": False}
    kwargs = {**base, **(TIMING if timing else {}), **overrides}
    if kwargs["precision"] == "16-mixed" and (kwargs["accelerator"] == "cpu" or hardware.gpu_count() == 0):
        kwargs.update(precision=None, plugins=[*kwargs.get("plugins", []), MixedPrecision("16-mixed", "cpu")])
    return kwargs


def trainer(lesson: str | None = None, precision: str | None = "32-true", timing: bool = False,
            **overrides) -> L.Trainer:
    """A Trainer built from trainer_kwargs."""
    return L.Trainer(**trainer_kwargs(lesson, precision, timing, **overrides))


def cli_defaults() -> dict:
    """LightningCLI defaults (dotted keys) for the data source and run size; flags and configs override them."""
    return {**{f"data.{k}": v for k, v in data_kwargs().items()}, "trainer.max_epochs": config.run_size().epochs}


#: warnings no learner can act on, as (message, module) regexes ("": raised anywhere): Lightning 2.6 calling a pytree
#: API torch 2.14 deprecates, and the notice that a timing run (validation off on purpose) skips the validation loop
UNACTIONABLE = ((r".*isinstance\(treespec, LeafSpec\)` is deprecated.*", ""),
                (r".*defined a `validation_step` but have no `val_dataloader`.*", ""),
                # torch 2.11's torch.export.load wraps its own archive's bytes (compress.load_program; gone by 2.14)
                (r"The given buffer is not writable, and PyTorch does not support non-writable tensors.*", ""),
                # torch 2.14's own int8 lowering copies a tensor the way it warns users not to; course code does not
                (r"To copy construct from a tensor", r"torch\._inductor\..*"))


def quiet_lightning() -> None:
    """Lessons and scripts call this once: Lightning's tips (litlogger, litmodels) and per-Trainer device banners
    off, torch's 'No CUDA runtime' build notice, torchao's import notice and the profiler's C++ log lines off, and
    the UNACTIONABLE warnings hidden; real warnings stay."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    # the Tuner's temporary checkpoint notes that it saves the full state by default (a notice, not a choice)
    logging.getLogger("lightning.pytorch.trainer.connectors.checkpoint_connector").setLevel(logging.WARNING)
    # the tuners' and seed_everything's notices repeat what the lesson prints itself from their results
    for notice in ("lightning.pytorch.tuner.lr_finder", "lightning.pytorch.tuner.batch_size_scaling",
                   "lightning.fabric.utilities.seed"):
        logging.getLogger(notice).setLevel(logging.WARNING)
    # torchao 0.18 registers Enum constants the way torch 2.14 deprecates (a notice at import, nothing to act on)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    # the profiler's C++ log lines (no GPU found, USDT start/stop marks): 6 is above every level kineto prints at
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    for message, module in UNACTIONABLE:
        warnings.filterwarnings("ignore", message=message, module=module)
