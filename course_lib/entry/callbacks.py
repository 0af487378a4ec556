"""The CLI's own callbacks: one line per epoch for logs written to a file (EpochLines), and Ctrl+C that stops a fit
after the step in progress, so that last.ckpt resumes exactly (StopAtStepEnd)."""
from __future__ import annotations

import signal
import sys

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..base import internals
from ..measure import timing


class EpochLines(L.Callback):
    """One line per epoch (time and logged metrics) instead of a progress bar, for logs written to a file."""

    _watch: timing.Stopwatch | None = None  # the running epoch's, validation included
    _resumed_at = 0  # batches of the first epoch done before a mid-epoch resume (its train metrics miss them)

    def _print_finished_epoch(self, trainer) -> None:
        """Print the epoch that just ended; its train metrics exist only once the module's epoch-end hook ran."""
        if self._watch is not None:
            metrics = " | ".join(f"{k} {v.item():.4g}" for k, v in sorted(trainer.callback_metrics.items()))
            resumed = (f" | resumed: train metrics from batch {self._resumed_at + 1} on"
                       if self._resumed_at else "")
            print(f"epoch {trainer.current_epoch}/{trainer.max_epochs} | {self._watch.elapsed():.1f} s "
                  f"with validation | {metrics}{resumed}", flush=True)
            self._resumed_at = 0

    def on_train_start(self, trainer, pl_module) -> None:
        done = internals.epoch_batch_progress(trainer).completed if trainer.ckpt_path else 0
        self._resumed_at = done if 0 < done < trainer.num_training_batches else 0
        # no epoch-start hook for a resumed epoch: its watch starts here
        self._watch = timing.Stopwatch(pl_module.device).start() if self._resumed_at else None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if self._watch is not None:
            self._print_finished_epoch(trainer)  # current_epoch already counts the finished one
        self._watch = timing.Stopwatch(pl_module.device).start()

    def on_train_end(self, trainer, pl_module) -> None:
        self._print_finished_epoch(trainer)
        self._watch = None


class StopAtStepEnd(L.Callback):
    """Ctrl+C (SIGINT) ends a fit the way Lightning ends one on SIGTERM: after the step in progress, so that last.ckpt
    holds a state that resumes exactly. A second Ctrl+C stops at once. Records which signal stopped the run."""

    def __init__(self):
        self.signum: int | None = None  # the signal that stopped the run, once one did
        self.stopped_at: str = ""  # where, e.g. "epoch 2/3, step 17"
        self._previous = None

    def on_train_start(self, trainer, pl_module) -> None:
        self.signum = None
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)  # Lightning already handles SIGTERM

    def _on_sigint(self, signum, frame) -> None:
        if self.signum is not None:  # pressed twice: the user wants out now
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):  # Lightning's handler absent (Windows)
            raise KeyboardInterrupt
        self.signum = signum
        print("\nCtrl+C: stopping after this step and saving last.ckpt (press Ctrl+C again to stop at once) ...",
              file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)  # Lightning's own graceful stop at the end of the step

    def on_exception(self, trainer, pl_module, exception) -> None:
        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            self.signum = self.signum or signal.SIGTERM
            self.stopped_at = f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}, step {trainer.global_step}"
        self._restore()

    def on_train_end(self, trainer, pl_module) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
