"""Reproducibility: seeded CPU runs repeat exactly, and an interrupted run resumes to the same weights."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from course_lib.data.data import CIFAR10_CLASSES, CIFAR10DataModule
from course_lib.training.modules import ImageClassifierModule


class RecordingModule(ImageClassifierModule):
    """The course module, also keeping every step's loss and each epoch's logged train_loss."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.step_losses: list[float] = []
        self.epoch_losses: list[float] = []

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.step_losses.append(outputs["loss"].item())

    def on_train_epoch_end(self):
        super().on_train_epoch_end()
        self.epoch_losses.append(self.trainer.callback_metrics["train_loss"].item())


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory, make_folder):
    """640 real JPEGs (64 per class): 512 training images after carving 10% val and 10% test."""
    root = tmp_path_factory.mktemp("small")
    make_folder(root / "train", classes=CIFAR10_CLASSES, per_class=64)
    return root


def fit(folder, tmp_path, seed=0, max_epochs=2, callbacks=(), ckpt_path=None):
    """Seed, build LeNet and the data, and fit on CPU; returns the trainer and the module."""
    L.seed_everything(seed, workers=True)
    dm = CIFAR10DataModule(image_folder=str(folder), data_dir=str(tmp_path / "data"), batch_size=64, subset=512,
                           eval_subset=64, augment=False)
    module = RecordingModule(backbone="lenet", lr=0.05)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, deterministic=True, logger=False,
                        enable_checkpointing=bool(callbacks), enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=list(callbacks))
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, module


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """Every state_dict tensor of a equals b's to 1e-6."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-6, rtol=0, msg=f"{k} differs")


def test_same_seed_gives_identical_losses(small_folder, tmp_path):
    """Two seeded CPU runs give identical per-step and per-epoch train losses and identical weights."""
    _, a = fit(small_folder, tmp_path / "a")
    _, b = fit(small_folder, tmp_path / "b")
    assert len(a.step_losses) == 16 and len(a.epoch_losses) == 2  # 512 / 64 = 8 steps per epoch
    assert a.step_losses == b.step_losses
    assert a.epoch_losses == b.epoch_losses
    assert a.epoch_losses[1] < a.epoch_losses[0]  # it learns something
    assert_same_weights(a, b)


def test_other_seed_gives_other_losses(small_folder, tmp_path):
    """A different seed changes the initial weights and so the losses (the check above is not vacuous)."""
    _, a = fit(small_folder, tmp_path / "a", max_epochs=1)
    _, c = fit(small_folder, tmp_path / "c", seed=1, max_epochs=1)
    assert a.step_losses != c.step_losses


def test_interrupted_run_resumes_to_same_weights(small_folder, tmp_path):
    """2 epochs straight == the checkpoint after epoch 1, resumed by a fresh Trainer(max_epochs=2)."""
    every_epoch = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, save_last=True)
    _, straight = fit(small_folder, tmp_path / "straight", callbacks=[every_epoch])
    first_epoch = tmp_path / "ckpt" / "epoch=0-step=8.ckpt"  # what a run killed during epoch 2 leaves behind
    assert first_epoch.exists()
    # another seed: anything not restored from the checkpoint (weights, optimiser, schedule, order) would show
    # resumed as the CLI resumes: with its checkpoint callback, writing to the same folder
    trainer, resumed = fit(small_folder, tmp_path / "resumed", seed=123, ckpt_path=first_epoch,
                           callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)])
    assert trainer.current_epoch == 2
    assert resumed.step_losses == pytest.approx(straight.step_losses[8:], abs=1e-6)
    assert resumed.epoch_losses[-1] == pytest.approx(straight.epoch_losses[-1], abs=1e-6)
    assert_same_weights(straight, resumed)


def test_resume_with_more_epochs_names_the_remedy(small_folder, tmp_path):
    """Resuming a one-cycle run with a different length fails with a message that names the remedy."""
    fit(small_folder, tmp_path / "one", max_epochs=1,
        callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
    with pytest.raises(ValueError, match="same max_epochs"):
        fit(small_folder, tmp_path / "two", max_epochs=2, ckpt_path=tmp_path / "ckpt" / "last.ckpt",
            callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
