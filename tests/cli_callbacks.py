"""Callbacks the CLI tests add to real `python -m course_lib fit` runs (PYTHONPATH=tests): stop them at a known step."""
from __future__ import annotations

import atexit
import time
from pathlib import Path

import lightning as L


class PauseAtStep(L.Callback):
    """After optimizer step `step`, write `marker` and wait (up to `seconds`) for the test to send a signal."""

    def __init__(self, step: int, marker: str, seconds: float = 60):
        self.step, self.marker, self.seconds = step, marker, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        Path(self.marker).write_text(str(self.step))
        deadline = time.monotonic() + self.seconds
        while not trainer.received_sigterm and time.monotonic() < deadline:  # Ctrl+C turns into this flag too
            time.sleep(0.02)


class RaiseAtStep(L.Callback):
    """After optimizer step `step`, raise RuntimeError: a run that crashes mid-training."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"crash injected after step {self.step}")


class SlowExit(L.Callback):
    """At interpreter exit, write `marker` and take `seconds`: an exit handler slow enough to press Ctrl+C in."""

    def __init__(self, marker: str, seconds: float = 5.0):
        atexit.register(self._exit, marker, seconds)

    @staticmethod
    def _exit(marker: str, seconds: float) -> None:
        Path(marker).write_text("exiting")
        time.sleep(seconds)
