"""Class lists: a module records the data's class names it is given (the CLI links them), in every checkpoint; a head
too small for the data fails before training, a head larger than the data warns."""
from __future__ import annotations

import shutil

import lightning as L
import pytest

from course_lib.data.data import CIFAR10DataModule
from course_lib.training.modules import ImageClassifierModule


def fit_one_step(folder, tmp_path, num_classes: int) -> ImageClassifierModule:
    """One training step of LeNet on the folder; returns the module."""
    dm = CIFAR10DataModule(image_folder=str(folder), data_dir=str(tmp_path / "data"), batch_size=8)
    # the data's class names passed explicitly (the CLI links them): the module never reads the DataModule
    module = ImageClassifierModule(num_classes=num_classes, schedule="constant", classes=dm.classes)  # one step
    L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
              enable_progress_bar=False, enable_model_summary=False).fit(module, datamodule=dm)
    return module


def test_fit_records_the_class_names(tiny_folder, tmp_path):
    module = fit_one_step(tiny_folder, tmp_path, num_classes=3)
    assert module.hparams.classes == ["airplane", "cat", "ship"]


def test_fewer_classes_than_outputs_warns_with_the_remedy(tiny_folder, tmp_path):
    """3 classes on a 10-way head train, but not without a word."""
    with pytest.warns(UserWarning, match="--model.num_classes 3"):
        fit_one_step(tiny_folder, tmp_path, num_classes=10)


def test_more_classes_than_outputs_fail_before_training(tmp_path, make_folder, cifar_folder):
    """An 11-class folder on a 10-way head fails when the module is built, naming the remedy (not IndexError)."""
    from course_lib.data.data import CIFAR10_CLASSES

    folder = tmp_path / "eleven"
    make_folder(folder / "train", classes=CIFAR10_CLASSES, per_class=2)
    shutil.copytree(folder / "train" / "cat", folder / "train" / "lynx")
    with pytest.raises(ValueError, match="11 classes.*--model.num_classes 11"):
        fit_one_step(folder, tmp_path, num_classes=10)
