"""The one wiring point: a lesson's DataModule and Trainer settings from the run size, the data source and the
precision policy. Notebooks, the CLI and the scripts build their data and trainers here instead of repeating it."""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import warnings

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

from ..base import config, hardware
from ..data.data import CIFAR10DataModule
from ..data.ondevice import OnDevice, Speedrun
from ..data.sampling import Loader
from ..data.sources import LoadedSplits

#: Trainer settings for a timing run: nothing but training (no validation, logging, checkpoints or progress bar)
TIMING = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
              limit_val_batches=0, num_sanity_val_steps=0)
#: the DataModule's batching strategies by kind, and the DataModule settings a kind changes from their defaults
BATCHING = {"loader": Loader, "device": OnDevice, "speedrun": Speedrun}
KIND_DEFAULTS = {"speedrun": {"val_fraction": 0.0}}  # a speedrun does not validate: all its training images train


def data_kwargs(lesson: str | None = None, **overrides) -> dict:
    """The data source and the run size's subsets for a lesson (None: the plain run size), plus any overrides."""
    size = config.run_size(lesson)
    return {"image_folder": config.data_source(), "subset": size.train_subset, "eval_subset": size.eval_subset,
            **overrides}


def datamodule(lesson: str | None = None, kind: str = "loader", loaded: LoadedSplits | None = None,
               **overrides) -> CIFAR10DataModule:
    """A lesson's CIFAR10DataModule batched by kind: "loader" (a DataLoader over decoded images), "device" (the data on
    the accelerator) or "speedrun" (lesson 08's batches). Keyword overrides go to the DataModule (batch_size, seed,
    ...) or, where the strategy takes them, to the strategy (device, num_workers, eval_batch_size, ...). `loaded`: a
    sources.LoadedSplits the caller's DataModules share (a lesson's benchmarks read the disk cache once)."""
    if kind not in BATCHING:
        raise ValueError(f"kind must be one of {sorted(BATCHING)}, got {kind!r}.")
    strategy = BATCHING[kind]
    own = {k: overrides.pop(k) for k in list(overrides) if k in inspect.signature(strategy).parameters}
    dm = CIFAR10DataModule(**data_kwargs(lesson, **{**KIND_DEFAULTS.get(kind, {}), **overrides}),
                           batching=strategy(**own))
    dm.loaded = loaded if loaded is not None else dm.loaded
    return dm


def shared_splits() -> LoadedSplits:
    """A new sources.LoadedSplits for a lesson's DataModules to share (datamodule(loaded=...)): the disk cache is read
    once per lesson, not once per DataModule; owned by the lesson, so nothing process-wide to clear."""
    return LoadedSplits()


def trainer_kwargs(lesson: str | None = None, precision: str | None = None, timing: bool = False,
                   **overrides) -> dict:
    """Trainer arguments: the run size's epochs, the precision of hardware.choose_precision (the one decision; None:
    the hardware's policy, as everywhere), no progress bar or model summary; timing=True adds TIMING.

    16-mixed on a CPU (the policy's choice for a GPU without bf16, emulated on a CPU by the tests) is passed as
    Lightning's fp16 plugin with a GradScaler("cpu"): given by name, Lightning would quietly run bf16-mixed there."""
    base = {"max_epochs": config.run_size(lesson).epochs, "accelerator": "auto", "devices": 1,
            "enable_progress_bar": False, "enable_model_summary": False}
    kwargs = {**base, **(TIMING if timing else {}), **overrides}
    kwargs["precision"] = hardware.choose_precision(precision, accelerator=kwargs["accelerator"])
    fp16 = hardware.autocast_dtype(kwargs["precision"]) == torch.float16  # 16-mixed: fp16 with loss scaling
    if fp16 and (kwargs["accelerator"] == "cpu" or hardware.gpu_count() == 0):
        kwargs.update(precision=None, plugins=[*kwargs.get("plugins", []), MixedPrecision(kwargs["precision"], "cpu")])
    return kwargs


def trainer(lesson: str | None = None, precision: str | None = None, timing: bool = False,
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
                (r"To copy construct from a tensor", r"torch\._inductor\..*"),
                # a mixed-precision fit's model summary: its size counts the fp32 weights, which is what mixed precision
                # stores, so the warning's "will not be accurate" does not apply (the CLI fits in the policy's bf16)
                (r"Precision [\w-]+ is not supported by the model summary", ""))


#: Lightning's notices (its rank-zero info lines) that the CLI hides: the devices it found, its tips, its bookkeeping
#: before and after a run; the lessons hide every notice (quiet_lightning), the CLI keeps what a run restored
NOTICES = (r"\w+ available: ", r"💡 Tip: ", r"LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES", r"Loading `\w+` to estimate",
           r"`Trainer\.\w+` stopped: ", r"Restoring states from the checkpoint path at ")
NOTICE_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda")
# loggers quiet_lightning turns down, with their levels: the Tuner's temporary checkpoint notes (it saves the full
# state by default: a notice, not a choice); the tuners' and seed_everything's notices, which repeat what the lesson
# prints itself from their results; torch's 'No CUDA runtime' build notice; torchao 0.18's import notice (it registers
# Enum constants the way torch 2.14 deprecates: nothing to act on)
LEVELS = {"lightning.pytorch.trainer.connectors.checkpoint_connector": logging.WARNING,
          "lightning.pytorch.tuner.lr_finder": logging.WARNING,
          "lightning.pytorch.tuner.batch_size_scaling": logging.WARNING,
          "lightning.fabric.utilities.seed": logging.WARNING,
          "torch.utils.cpp_extension": logging.ERROR, "torch.utils._pytree": logging.ERROR}


def quiet_lightning() -> None:
    """Lessons and scripts call this once: Lightning's tips (litlogger, litmodels) and per-Trainer device banners
    off, torch's 'No CUDA runtime' build notice, torchao's import notice and the profiler's C++ log lines off, and
    the UNACTIONABLE warnings hidden; real warnings stay."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    for name, level in LEVELS.items():
        logging.getLogger(name).setLevel(level)
    # the profiler's C++ log lines (no GPU found, USDT start/stop marks): 6 is above every level kineto prints at
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    for message, module in UNACTIONABLE:
        warnings.filterwarnings("ignore", message=message, module=module)


class _DropNotices(logging.Filter):
    """A logging filter that drops the records whose message starts with one of NOTICES."""

    pattern = re.compile("|".join(NOTICES))

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.match(record.getMessage())


@contextlib.contextmanager
def quiet_cli(*more_warnings: str):
    """The CLI's output for a block: quiet_lightning's, but Lightning's notices dropped one by one (NOTICES), so what a
    run restored from a checkpoint still shows; more_warnings: messages (regexes) of further warnings to hide.
    Everything is as before once the block ends, so that in-process callers (tests, notebooks) keep their settings."""
    loggers = [logging.getLogger(name) for name in LEVELS]
    levels, drop, kineto = [lg.level for lg in loggers], _DropNotices(), os.environ.get("KINETO_LOG_LEVEL")
    with warnings.catch_warnings():
        for lg in loggers:
            lg.setLevel(max(lg.getEffectiveLevel(), LEVELS[lg.name]))
        for name in NOTICE_LOGGERS:
            logging.getLogger(name).addFilter(drop)
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        for message, module in [*UNACTIONABLE, *((m, "") for m in more_warnings)]:
            warnings.filterwarnings("ignore", message=message, module=module)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
            for name in NOTICE_LOGGERS:
                logging.getLogger(name).removeFilter(drop)
            if kineto is None:
                os.environ.pop("KINETO_LOG_LEVEL", None)
