"""Runs stopped mid-epoch lose nothing: real `python -m course_lib fit` runs stopped by SIGINT or SIGTERM exit
non-zero, say how to resume and leave last.ckpt at the step where they stopped, and `--ckpt_path last` finishes with
the step count and weights of an unbroken run of the same seed; so does a run that crashed (in-process)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from cli_callbacks import RaiseAtStep

from course_lib.data.data import CIFAR10DataModule
from course_lib.entry.cli import run_checkpoints
from course_lib.training.modules import ImageClassifierModule

REPO = Path(__file__).resolve().parents[1]
EPOCHS, BATCH = 3, 8  # the tiny folder's 48 training images: 6 steps per epoch, 18 in all
STOP_AT = 8  # mid-way through the second epoch
TOTAL = EPOCHS * 6


def launch(build: Path, data_root: Path, folder: Path, *extra: str) -> subprocess.Popen:
    """Start `python -m course_lib fit` on the tiny folder from a folder outside the checkout; outputs in build."""
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(folder), "COURSE_DATA_ROOT": str(data_root),
           "COURSE_BUILD": str(build), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    args = ["fit", "--config", str(REPO / "configs" / "lenet.yaml"), "--model.num_classes", "3",
            "--trainer.max_epochs", str(EPOCHS), "--data.batch_size", str(BATCH), "--trainer.deterministic", "true",
            *extra]
    return subprocess.Popen([sys.executable, "-m", "course_lib", *args], cwd=build.parent, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    """Wait for a run; its exit code and its output."""
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out + err


def checkpoint(build: Path, name: str = "last") -> dict:
    return torch.load(build / "runs" / "lenet" / "checkpoints" / f"{name}.ckpt", weights_only=True)


def pause(step: int, marker: Path) -> list[str]:
    return ["--trainer.callbacks+=cli_callbacks.PauseAtStep", f"--trainer.callbacks.step={step}",
            f"--trainer.callbacks.marker={marker}"]


@pytest.fixture(scope="module")
def fits(tmp_path_factory, tiny_folder):
    """An unbroken run, runs stopped at step STOP_AT by SIGINT and SIGTERM, and the two resumed; the independent
    runs go in parallel (each on one thread) to keep the test short."""
    root = tmp_path_factory.mktemp("resume")
    data_root = root / "data"
    builds = {k: root / k / "build" for k in ("straight", "SIGINT", "SIGTERM")}
    for b in builds.values():
        b.parent.mkdir()
    markers = {k: root / f"{k}.paused" for k in ("SIGINT", "SIGTERM")}
    procs = {"straight": launch(builds["straight"], data_root, tiny_folder)}  # the cache is written atomically
    procs.update({k: launch(builds[k], data_root, tiny_folder, *pause(STOP_AT, markers[k])) for k in markers})
    deadline = time.monotonic() + 180
    for k, marker in markers.items():  # each run waits at the step until its signal arrives
        while not marker.exists() and procs[k].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        procs[k].send_signal(getattr(signal, k))
    results = {k: finish(p) for k, p in procs.items()}
    stopped = {k: checkpoint(builds[k]) for k in markers if results[k][0] != 0}
    resumed = {k: launch(builds[k], data_root, tiny_folder, "--ckpt_path", "last") for k in stopped}
    resumed = {k: finish(p) for k, p in resumed.items()}
    return {"builds": builds, "results": results, "stopped": stopped, "resumed": resumed}


def test_unbroken_run_writes_last_and_best(fits):
    rc, log = fits["results"]["straight"]
    assert rc == 0, log[-3000:]
    assert checkpoint(fits["builds"]["straight"])["global_step"] == TOTAL
    assert checkpoint(fits["builds"]["straight"], "best")["global_step"] <= TOTAL


@pytest.mark.parametrize("how, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_stopped_run_exits_nonzero_with_last_at_the_stop(fits, how, code):
    """The stopped run's exit status is 128 + the signal; last.ckpt holds the step where it stopped, not the end of
    the previous epoch; the message names the resume command."""
    rc, log = fits["results"][how]
    assert rc == code, log[-3000:]
    assert fits["stopped"][how]["global_step"] == STOP_AT
    assert f"Stopped by {how}" in log and "--ckpt_path last" in log, log[-2000:]


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_resumed_run_matches_the_unbroken_one(fits, how):
    """`fit --ckpt_path last` after the stop ends at the same step, with the same weights, as the unbroken run."""
    rc, log = fits["resumed"][how]
    assert rc == 0, log[-3000:]
    assert "Restored all states" in log
    straight, resumed = checkpoint(fits["builds"]["straight"]), checkpoint(fits["builds"][how])
    assert resumed["global_step"] == straight["global_step"] == TOTAL
    assert resumed["epoch"] == straight["epoch"]
    for key, value in straight["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][key], value, atol=1e-6, rtol=1e-5, msg=key)


def fit_in_process(folder: Path, ckpt_dir: Path, data_root: Path, callbacks=(), ckpt_path=None, epochs=EPOCHS):
    """The CLI's run (same checkpoints, seed and sizes) through a Trainer in this process; returns the module."""
    L.seed_everything(0)
    dm = CIFAR10DataModule(image_folder=str(folder), data_dir=str(data_root), batch_size=BATCH, augment=True)
    module = ImageClassifierModule(num_classes=3)
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, deterministic=True, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[*run_checkpoints(ckpt_dir), *callbacks])
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module


def test_crashed_run_saves_last_and_resumes_exactly(tiny_folder, tmp_path):
    """An exception mid-epoch writes last.ckpt at that step; resuming from it (with augmentation, whose random draws
    the checkpoint carries) ends with the unbroken run's weights."""
    straight = fit_in_process(tiny_folder, tmp_path / "a", tmp_path / "data")
    with pytest.raises(RuntimeError, match="crash injected"):
        fit_in_process(tiny_folder, tmp_path / "b", tmp_path / "data", callbacks=[RaiseAtStep(STOP_AT)])
    assert torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)["global_step"] == STOP_AT
    resumed = fit_in_process(tiny_folder, tmp_path / "b", tmp_path / "data", ckpt_path="last")
    assert torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)["global_step"] == TOTAL
    for (key, value), other in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(other, value, atol=1e-6, rtol=1e-5, msg=key)


def test_refused_resume_keeps_the_checkpoint(tiny_folder, tmp_path):
    """Resuming with another max_epochs is refused (the one-cycle schedule would bend); the refusal loses nothing:
    last.ckpt still holds the stopped step, and resuming it with the right settings still completes the run."""
    with pytest.raises(RuntimeError, match="crash injected"):
        fit_in_process(tiny_folder, tmp_path / "b", tmp_path / "data", callbacks=[RaiseAtStep(STOP_AT)])
    before = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    with pytest.raises(ValueError, match=f"spans {TOTAL} steps but this run needs {TOTAL // EPOCHS * (EPOCHS + 1)}"):
        fit_in_process(tiny_folder, tmp_path / "b", tmp_path / "data", ckpt_path="last", epochs=EPOCHS + 1)
    after = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    assert after["global_step"] == before["global_step"] == STOP_AT
    for key, value in before["state_dict"].items():
        torch.testing.assert_close(after["state_dict"][key], value, msg=key)
    fit_in_process(tiny_folder, tmp_path / "b", tmp_path / "data", ckpt_path="last")
    assert torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)["global_step"] == TOTAL


def test_loader_skips_only_on_its_first_pass_after_a_restore(tiny_folder, tmp_path):
    """The skip applies once, and only to a loader built after a checkpoint restore: a DataModule still attached to
    an earlier, finished trainer hands a new fit its whole epoch."""
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path / "data"), batch_size=BATCH)
    dm.setup("fit")
    dm.batches_done = lambda: 2  # what an earlier trainer's finished loop would report
    assert len(list(dm.train_dataloader())) == 6
    dm.load_state_dict(dm.state_dict())
    resumed = dm.train_dataloader()
    assert len(list(resumed)) == 4 and len(list(resumed)) == 6
