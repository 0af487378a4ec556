"""`python -m course_lib fit|validate|test|predict`: LightningCLI over the course's module and data, sized by
COURSE_SIZE."""
from __future__ import annotations

import sys
import time

import lightning as L
from lightning.pytorch.cli import LightningCLI

from . import config, runs
from .data import CIFAR10DataModule
from .modules import ImageClassifierModule


class EpochLines(L.Callback):
    """One line per epoch (time and logged metrics) instead of a progress bar, for logs written to a file."""

    _start: float | None = None

    def _print_finished_epoch(self, trainer) -> None:
        """Print the epoch that just ended; its train metrics exist only once the module's epoch-end hook ran."""
        if self._start is not None:
            metrics = " | ".join(f"{k} {v.item():.4g}" for k, v in sorted(trainer.callback_metrics.items()))
            print(f"epoch {trainer.current_epoch}/{trainer.max_epochs} | {time.perf_counter() - self._start:.1f} s "
                  f"with validation | {metrics}", flush=True)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._print_finished_epoch(trainer)  # current_epoch already counts the finished one
        self._start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self._print_finished_epoch(trainer)
        self._start = None


def log_defaults(interactive: bool) -> dict:
    """Trainer defaults for the output: the progress bar in a terminal, one line per epoch when redirected."""
    return {} if interactive else {"enable_progress_bar": False, "callbacks": [EpochLines()]}


class CourseCLI(LightningCLI):
    """LightningCLI whose defaults follow the run-size switch and the data source; flags and configs override them."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults(runs.cli_defaults())

    def before_instantiate_classes(self) -> None:
        """Asking for more GPUs than this machine has fails here, with the remedy named (see config.check_devices)."""
        trainer = (self.config[self.subcommand] if self.subcommand else self.config).trainer
        config.check_devices(trainer.accelerator, trainer.devices)


def main(args: list[str] | None = None) -> CourseCLI:
    """Entry point; `args` lets tests call it in-process."""
    return CourseCLI(ImageClassifierModule, CIFAR10DataModule, seed_everything_default=0, args=args,
                     save_config_kwargs={"overwrite": True}, trainer_defaults=log_defaults(sys.stdout.isatty()))
