"""What a CLI run shows and keeps when it goes wrong (issue 44): a diverging fit stops with the remedy and writes no
checkpoint from its weights; a full disk is one message and the previous last.ckpt stays; the output on a CPU is the
lessons' quiet one, which --debug or COURSE_DEBUG=1 undoes; the logs go to TensorBoard where installed, else CSV."""
from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import run_main
from lightning.pytorch.loggers import CSVLogger

from course_lib.base import hardware
from course_lib.data.data import CIFAR10DataModule
from course_lib.data.sampling import Loader
from course_lib.entry import runfolder
from course_lib.entry.cli import main
from course_lib.entry.divergence import StopOnDivergence
from course_lib.training.modules import ImageClassifierModule

REPO = Path(__file__).resolve().parents[1]
LENET, RESNET9 = str(REPO / "configs" / "lenet.yaml"), str(REPO / "configs" / "resnet9.yaml")
STEPS = 6  # the tiny folder's 48 training images in batches of 8: steps per epoch
TWO_EPOCHS = ["--model.num_classes", "3", "--data.batch_size", "8", "--trainer.max_epochs", "2"]


class NanWeightsAt(L.Callback):
    """Before optimizer step `step` (0-based), one weight becomes NaN: a run that diverges there, after a good epoch."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")


@pytest.fixture
def course_env(tiny_folder, tmp_path, monkeypatch):
    """This process's COURSE_* for main(): smoke size, the tiny folder, and a build folder of this test's own."""
    monkeypatch.setenv("COURSE_SIZE", "smoke")
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path / "build"))
    monkeypatch.delenv("COURSE_DEBUG", raising=False)
    return tmp_path / "build"


def finite(path: Path) -> bool:
    """Whether every weight of a checkpoint is finite."""
    state = torch.load(path, weights_only=True)["state_dict"]
    return all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


def test_a_diverging_learning_rate_stops_in_the_first_epoch_naming_the_step_and_the_remedy(course_env, capsys):
    """--model.lr 1e12 (a mistyped 1e-2): the fit stops within its first epoch, exit 1, with one message naming the
    step, the loss and the remedies (a lower --model.lr, gradient clipping); no checkpoint and no epoch line."""
    code, out, err = run_main(capsys, "fit", "--config", LENET, "--model.lr", "1e12", *TWO_EPOCHS)
    assert code == 1, err[-2000:]
    found = re.search(r"the loss of step (\d+) \(epoch 1\) is (nan|inf|-inf)", err)
    assert found and 1 <= int(found[1]) <= STEPS, err[-2000:]
    assert "--model.lr, this run's: 1e+12" in err and "--trainer.gradient_clip_val" in err
    assert "Traceback" not in err and err.count("error:") == 1
    assert not [line for line in out.splitlines() if line.startswith("epoch ")]
    assert not list(course_env.rglob("*.ckpt"))


def test_divergence_after_a_good_epoch_keeps_that_epochs_checkpoints(course_env, capsys):
    """Weights that turn NaN at step 9 (epoch 2) stop the run there, naming that step; last.ckpt and best.ckpt still
    hold epoch 1's finite weights (neither the epoch's end nor the exception wrote the diverged ones)."""
    code, _, err = run_main(capsys, "fit", "--config", LENET, *TWO_EPOCHS, "--trainer.callbacks+=test_cli_output"
                            ".NanWeightsAt", f"--trainer.callbacks.step={STEPS + 2}")
    assert code == 1, err[-2000:]
    assert f"the loss of step {STEPS + 3} (epoch 2) is nan" in err and "epoch 1 and before are kept" in err
    folder = course_env / "runs" / "lenet" / "checkpoints"
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (0, STEPS)
    assert finite(folder / "last.ckpt") and finite(folder / "best.ckpt")


def test_the_divergence_check_reads_nothing_on_the_host_per_step():
    """StopOnDivergence's per-step check stays on the device: a fit with it makes as many host reads per step as one
    without it, none (test_gpu_syncs' count; on a GPU each read would wait for the queued work, every step)."""
    from test_gpu_syncs import BATCH, per_step

    data = torch.utils.data.TensorDataset(torch.randn(8 * BATCH, 3, 32, 32), torch.randint(0, 10, (8 * BATCH,)))

    def fit(callbacks):
        def run(steps):
            trainer = L.Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks())
            trainer.fit(ImageClassifierModule("lenet", schedule="constant"),
                        train_dataloaders=torch.utils.data.DataLoader(data, batch_size=BATCH))
        return run

    assert per_step(fit(lambda: [StopOnDivergence()])) == per_step(fit(list)) == {"reads": 0, "aten": 0}


@pytest.mark.parametrize("failure", ["torch", "os"])
def test_a_full_disk_at_a_checkpoint_write_is_one_message_and_last_ckpt_stays(failure, course_env, monkeypatch,
                                                                              capsys):
    """Epoch 2's first checkpoint write fails as on a full disk (torch's serializer reports it as a RuntimeError,
    'unexpected pos'; a flush or fsync as ENOSPC): one message naming the file, its folder, the space it needs and
    COURSE_BUILD, exit 1; last.ckpt still loads and holds epoch 1, and no temporary file is left."""
    real_save, calls = torch.save, []

    def save(obj, f, *args, **kwargs):
        if not (isinstance(obj, dict) and "state_dict" in obj):  # not a checkpoint: the data cache, say
            return real_save(obj, f, *args, **kwargs)
        calls.append(f)
        if len(calls) <= 2:  # epoch 1's best.ckpt and last.ckpt
            return real_save(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04 the first bytes of a checkpoint")
        if failure == "torch":
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 19072 vs 19024")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", save)
    code, _, err = run_main(capsys, "fit", "--config", LENET, *TWO_EPOCHS)
    folder = course_env.resolve() / "runs" / "lenet" / "checkpoints"
    assert code == 1 and len(calls) == 3, err[-2000:]
    assert f"Cannot write {folder}/" in err and "it needs about" in err and "COURSE_BUILD" in err, err[-2000:]
    assert "Traceback" not in err and err.count("error:") == 1
    last = torch.load(folder / "last.ckpt", weights_only=True)
    assert last["global_step"] == STEPS and finite(folder / "last.ckpt")
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "last.ckpt"]


def test_a_full_disk_at_a_log_write_is_one_message(course_env, monkeypatch, capsys):
    """metrics.csv cannot be written (ENOSPC, again when Lightning finalizes the failed run's logger): one message
    naming the file and COURSE_BUILD, exit 1, not the OSError's traceback."""
    def save(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(self.log_dir) / "metrics.csv"))

    monkeypatch.setattr(CSVLogger, "save", save)
    monkeypatch.setattr(runfolder, "find_spec", lambda name: None)  # CSV even where TensorBoard is installed
    code, _, err = run_main(capsys, "fit", "--config", LENET, "--model.num_classes", "3")
    assert code == 1, err[-2000:]
    assert "metrics.csv (OSError: No space left on device)" in err and "COURSE_BUILD" in err, err[-2000:]
    assert "Traceback" not in err and err.count("error:") == 1


# what a plain run on a CPU printed before issue 44 (each asserted below to appear with --debug or COURSE_DEBUG=1)
NOISE = {"tip": "💡 Tip:", "gpu": "GPU available:", "tpu": "TPU available:",
         "pytree": "isinstance(treespec, LeafSpec)` is deprecated", "dirpath": "The dirpath has changed from"}
PINNED = "'pin_memory' argument is set as true but no accelerator is found"  # fixed where it arose: never printed


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, tiny_folder):
    """`python -m course_lib fit|test|predict --config configs/resnet9.yaml` (which asks for pinned memory) as a user
    runs them, each plain and with --debug or COURSE_DEBUG=1; test and predict read the plain fit's checkpoint from
    another run folder. {(command, loud): stdout + stderr}."""
    root = tmp_path_factory.mktemp("quiet")
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder), "OMP_NUM_THREADS": "1",
           "COURSE_DATA_ROOT": str(root / "data"), "COURSE_BUILD": str(root / "build")}
    env.pop("COURSE_DEBUG", None)
    ckpt = str(root / "build" / "runs" / "base" / "checkpoints" / "last.ckpt")
    commands = {("fit", False): ["fit", "--model.num_classes", "3", "--run_name", "base"],
                ("fit", True): ["fit", "--model.num_classes", "3", "--run_name", "loud"],
                ("test", False): ["test", "--ckpt_path", ckpt],
                ("test", True): ["test", "--ckpt_path", ckpt, "--debug"],
                ("predict", False): ["predict", "--ckpt_path", ckpt],
                ("predict", True): ["predict", "--ckpt_path", ckpt]}
    found = {}
    for (command, loud), args in commands.items():
        run = subprocess.run([sys.executable, "-m", "course_lib", *args, "--config", RESNET9], cwd=root, text=True,
                             env={**env, "COURSE_DEBUG": "1"} if loud and command != "test" else env,
                             capture_output=True, timeout=240)
        assert run.returncode == 0, f"{args}: exit {run.returncode}\n{run.stderr[-3000:]}"
        found[command, loud] = run.stdout + run.stderr
    return found


@pytest.mark.parametrize("command", ["fit", "test", "predict"])
def test_cli_output_on_a_cpu_is_quiet_and_debug_brings_lightnings_back(outputs, command):
    """A plain run prints none of Lightning's tip, device lines, pytree deprecation or (testing another run's
    checkpoint) moved-folder notice, nor torch's pin_memory warning, and still prints its results and what it
    loaded; --debug (test) or COURSE_DEBUG=1 (fit, predict) prints Lightning's lines again."""
    quiet, loud = outputs[command, False], outputs[command, True]
    expected = [k for k in NOISE if k != "dirpath" or command != "fit"]
    assert [k for k in NOISE if NOISE[k] in quiet] == [], quiet[-3000:]
    assert [k for k in expected if NOISE[k] not in loud] == [], loud[-3000:]
    assert PINNED not in quiet + loud
    results = {"fit": "epoch 1/1 |", "test": "test_acc", "predict": "Predictions for 6 images written to"}
    assert results[command] in quiet
    if command != "fit":
        assert "Loaded model weights from the checkpoint at" in quiet


def test_pin_memory_only_where_batches_go_to_a_gpu(tiny_folder, tmp_path):
    """pin_memory=True pins the loaders' batches when the Trainer's device is a GPU, not on a CPU (where torch would
    warn and pin nothing); without a Trainer, where this machine has a GPU. pin_memory=False never pins."""
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batching=Loader(pin_memory=True))
    dm.setup("fit")
    assert dm.val_dataloader().pin_memory is (hardware.gpu_count() > 0)
    for device, pinned in (("cpu", False), ("cuda", True)):
        dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
        assert dm.val_dataloader().pin_memory is pinned
    dm.batching.pin_memory = False
    assert dm.val_dataloader().pin_memory is False


def test_logger_is_tensorboard_where_it_is_installed_else_csv(monkeypatch):
    """The CLI's logger follows whether the tensorboard package can be imported (Lightning's own TensorBoardLogger)."""
    monkeypatch.setattr(runfolder, "find_spec", lambda name: object() if name == "tensorboard" else None)
    assert runfolder.logger_class() == "lightning.pytorch.loggers.TensorBoardLogger"
    monkeypatch.setattr(runfolder, "find_spec", lambda name: None)
    assert runfolder.logger_class() == "lightning.pytorch.loggers.CSVLogger"


def test_fit_without_tensorboard_logs_both_losses_to_csv(course_env, monkeypatch):
    """Without tensorboard (as the lock has it; made so here where it is installed), the CLI logs to metrics.csv."""
    monkeypatch.setattr(runfolder, "find_spec", lambda name: None)
    cli = main(["fit", "--config", LENET, "--model.num_classes", "3"])
    assert type(cli.trainer.logger) is CSVLogger
    header = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train_loss", "val_loss"} <= set(header)


def test_fit_with_tensorboard_writes_event_files_with_both_losses(course_env):
    """Where tensorboard is installed (not in the lock: skipped there), a fit writes event files in its run folder's
    logs/version_0 that TensorBoard's own reader reads, each loss once per epoch."""
    reader = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from lightning.pytorch.loggers import TensorBoardLogger

    cli = main(["fit", "--config", LENET, "--model.num_classes", "3"])
    assert isinstance(cli.trainer.logger, TensorBoardLogger)
    assert Path(cli.trainer.logger.log_dir) == course_env.resolve() / "runs" / "lenet" / "logs" / "version_0"
    events = reader.EventAccumulator(cli.trainer.logger.log_dir)
    events.Reload()
    assert {"train_loss", "val_loss"} <= set(events.Tags()["scalars"])
    assert all(len(events.Scalars(tag)) == 1 for tag in ("train_loss", "val_loss"))
