"""ImageClassifierModule under a real Trainer, its metrics against hand counts, optimiser and schedule, loops."""
from __future__ import annotations

import dataclasses
import inspect
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from course_lib.data.data import CIFAR10DataModule, class_folder_split
from course_lib.training.loops import predict
from course_lib.training.modules import ImageClassifierModule
from course_lib.training.optim import LENET, make_optimizer


def quiet_trainer(tmp_path, **kw) -> L.Trainer:
    """A CPU trainer that writes nothing outside tmp_path and prints little."""
    kw = {"accelerator": "cpu", "devices": 1, "logger": False, "enable_checkpointing": False,
          "enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": tmp_path, **kw}
    return L.Trainer(**kw)


def test_fast_dev_run_trains_and_validates(tiny_folder, tmp_path):
    """One train and one val batch run under Trainer(fast_dev_run=True) and change the weights."""
    L.seed_everything(0)
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batch_size=16)
    module = ImageClassifierModule("lenet", num_classes=3)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = quiet_trainer(tmp_path, fast_dev_run=True)
    trainer.fit(module, datamodule=dm)
    assert trainer.state.finished
    metrics = trainer.callback_metrics
    assert {"train_loss", "train_acc", "val_loss", "val_acc"} <= set(metrics)
    assert torch.isfinite(metrics["train_loss"])
    x, y = next(iter(dm.val_dataloader()))  # the one validation batch, scored by the trained weights
    with torch.no_grad():
        hand = (module.eval()(x).argmax(1) == y).float().mean().item()
    assert metrics["val_acc"].item() == pytest.approx(hand)
    assert any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def count_by_hand(module, loader) -> tuple[float, float, int]:
    """Accuracy, per-sample mean cross-entropy and sample count of the module's weights over a loader, by hand."""
    correct, loss_sum, n = 0, 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = module(x)
            correct += (logits.argmax(dim=1) == y).sum().item()
            loss_sum += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
            n += len(y)
    return correct / n, loss_sum / n, n


def run_test_and_count_by_hand(tiny_folder, tmp_path):
    """trainer.test's logged metrics, and accuracy and mean cross-entropy counted by hand with the same weights."""
    L.seed_everything(1)
    # 60 images in batches of 16 (16+16+16+12): an uneven last batch catches mean-of-batch-means mistakes
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batch_size=16)
    dm.hold_out(*class_folder_split(tiny_folder / "train", dm.classes, tmp_path / "cache"))  # as --test_folder
    module = ImageClassifierModule("simple_cnn", num_classes=3)
    with torch.no_grad():  # a bias towards class 1 makes per-batch accuracies differ from each other
        module.net.fc.bias.copy_(torch.tensor([0.0, 0.02, 0.0]))
    logged = quiet_trainer(tmp_path).test(module, datamodule=dm, verbose=False)[0]

    acc, loss, n = count_by_hand(module.eval(), dm.test_dataloader())
    assert n == 60
    return logged, acc, loss


def test_logged_test_acc_matches_hand_count(tiny_folder, tmp_path):
    """trainer.test's test_acc equals (argmax == y).mean() over the whole test set, counted by hand."""
    logged, acc, _ = run_test_and_count_by_hand(tiny_folder, tmp_path)
    assert 0 < acc < 1  # a non-trivial accuracy, so the comparison means something
    assert logged["test_acc"] == pytest.approx(acc, abs=1e-6)


def test_logged_test_loss_is_per_sample_mean(tiny_folder, tmp_path):
    """trainer.test's test_loss equals the mean cross-entropy over all samples (not the mean of batch means)."""
    logged, _, loss = run_test_and_count_by_hand(tiny_folder, tmp_path)
    assert logged["test_loss"] == pytest.approx(loss, rel=1e-5)


def test_training_step_by_hand_outside_a_trainer_returns_the_loss_quietly():
    """Lesson 02 calls training_step on a module attached to no Trainer: it returns the batch's mean cross-entropy,
    logs nothing and warns nothing."""
    torch.manual_seed(0)
    module = ImageClassifierModule("lenet")
    batch = (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = module.training_step(batch, 0)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(module(batch[0]), batch[1]))


def test_predict_step_returns_probabilities(tiny_folder, tmp_path):
    """predict_step gives (B, classes) rows that sum to one."""
    module = ImageClassifierModule("lenet", num_classes=3)
    probs = module.predict_step((torch.randn(5, 3, 32, 32), torch.zeros(5, dtype=torch.long)), 0)
    assert probs.shape == (5, 3)
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(5))


@pytest.mark.parametrize("kw", [{"optimizer": "adam"}, {"schedule": "cosine"}])
def test_invalid_optimizer_or_schedule_raises(kw):
    """Unknown optimizer or schedule names raise ValueError naming the bad value."""
    with pytest.raises(ValueError, match=next(iter(kw.values()))):
        ImageClassifierModule("lenet", **kw)


@pytest.mark.parametrize("total_steps", [4, 5, 100])
def test_make_optimizer_gives_the_recipe_and_a_one_cycle_that_fits_any_run(total_steps):
    """The recipe's SGD (Nesterov, weight decay 5e-4) and a one-cycle LR that peaks at `lr` after the warm-up
    fraction, then anneals below its start; a smoke run of 4-5 steps gets a 2-step warm-up (OneCycleLR alone divides
    by zero there), and stepping the schedule once per optimiser step for the whole run never raises."""
    opt, sched = make_optimizer([torch.nn.Parameter(torch.zeros(1))], total_steps=total_steps, lr=0.05,
                                warmup_fraction=0.25)
    group = opt.param_groups[0]
    assert isinstance(opt, torch.optim.SGD) and group["nesterov"] and group["weight_decay"] == 5e-4
    lrs = []
    for _ in range(total_steps):
        lrs.append(group["lr"])
        opt.step()
        sched.step()
    peak = max(round(0.25 * total_steps), 2) - 1  # the warm-up's last step
    assert lrs.index(max(lrs)) == peak and max(lrs) == pytest.approx(0.05)
    assert all(a < b for a, b in zip(lrs[:peak], lrs[1:peak + 1]))
    assert all(a > b for a, b in zip(lrs[peak:-1], lrs[peak + 1:])) and lrs[-1] < lrs[0]


def test_a_run_under_four_steps_keeps_the_lr_constant_and_says_so():
    """Fewer than 4 steps (fast_dev_run) cannot hold a one-cycle: no schedule, the LR stays at `lr`, and a warning
    says so."""
    with pytest.warns(UserWarning, match="only 3 optimizer steps"):
        opt, sched = make_optimizer([torch.nn.Parameter(torch.zeros(1))], total_steps=3, lr=0.05)
    assert sched is None and opt.param_groups[0]["lr"] == 0.05


def test_module_schedule_steps_per_batch(tiny_folder, tmp_path):
    """Inside the Trainer the one-cycle LR peaks at the module's lr and is stepped every batch."""
    seen = []

    class LrProbe(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batch_size=4)
    module = ImageClassifierModule("simple_cnn", num_classes=3, lr=0.1, warmup_fraction=0.5)
    quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=0, callbacks=[LrProbe()]).fit(module, datamodule=dm)
    assert len(seen) == 12  # 48 training images / batch 4, one LR per step
    assert len(set(seen)) == 12
    assert max(seen) == pytest.approx(0.1, rel=0.05)
    assert seen[0] == pytest.approx(0.1 / 25)


def test_constant_schedule_returns_no_scheduler():
    """schedule='constant' gives the optimiser alone, at the requested lr."""
    params = [torch.nn.Parameter(torch.zeros(1))]
    opt, sched = make_optimizer(params, total_steps=10, optimizer="adamw", lr=0.003, schedule="constant")
    assert sched is None
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["lr"] == 0.003


def test_predict_loop_returns_all_labels():
    """loops.predict returns one prediction and one true label per sample, in loader order."""
    torch.manual_seed(0)
    xs, ys = torch.randn(10, 3, 32, 32), torch.arange(10) % 3
    loader = [(xs[:4], ys[:4]), (xs[4:], ys[4:])]
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
    preds, labels = predict(model, loader)
    assert torch.equal(labels, ys) and preds.shape == (10,)
    assert torch.equal(preds, model(xs).argmax(dim=1))


def frozen_fit(tiny_folder, tmp_path, **trainer_kw):
    """One epoch of training at lr 0 (the weights never change, so the epoch's metrics can be counted by hand
    afterwards) in uneven batches (48 = 10+10+10+10+8); the module, the DataModule and the Trainer."""
    L.seed_everything(0, verbose=False)
    module = ImageClassifierModule("simple_cnn", num_classes=3, lr=0.0, weight_decay=0.0, schedule="constant")
    with torch.no_grad():  # a bias towards class 1 makes the accuracy non-trivial
        module.net.fc.bias.copy_(torch.tensor([0.0, 0.02, 0.0]))
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batch_size=10)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0, **trainer_kw)
    trainer.fit(module, datamodule=dm)
    return module, dm, trainer


def test_logged_metric_objects_are_computed_and_reset_by_the_trainer(tiny_folder, tmp_path):
    """The module logs its Metric objects: after a fit, callback_metrics hold the epoch's per-sample accuracy and
    loss (equal to a hand count over the uneven batches), the Trainer has reset the metrics, and no shadow dict
    is kept."""
    module, dm, trainer = frozen_fit(tiny_folder, tmp_path, logger=False, enable_checkpointing=False,
                                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    acc, loss, n = count_by_hand(module, dm.train_dataloader())
    assert 0 < acc < 1 and n == 48
    assert float(trainer.callback_metrics["train_acc"]) == pytest.approx(acc, abs=1e-6)
    assert float(trainer.callback_metrics["train_loss"]) == pytest.approx(loss, rel=1e-5)
    assert all(m.update_count == 0 for m in module.train_metrics.values())  # reset by the Trainer
    assert module.epoch_metrics == {}


def test_barebones_computes_the_epoch_metrics_by_hand(tiny_folder, tmp_path):
    """Under Trainer(barebones=True), which forbids self.log, the module still trains, and epoch_metrics holds the
    epoch's loss and accuracy (equal to a hand count), with the metrics reset for the next epoch."""
    module, dm, trainer = frozen_fit(tiny_folder, tmp_path, barebones=True)
    acc, loss, _ = count_by_hand(module, dm.train_dataloader())
    assert set(module.epoch_metrics) == {"train_loss", "train_acc"}
    assert float(module.epoch_metrics["train_acc"]) == pytest.approx(acc, abs=1e-6)
    assert float(module.epoch_metrics["train_loss"]) == pytest.approx(loss, rel=1e-5)
    assert all(m.update_count == 0 for m in module.train_metrics.values())
    assert trainer.global_step == 5


def fit_then_save(tiny_folder, tmp_path) -> Path:
    """A one-epoch one-cycle fit in batches of 8 (6 steps), saved as a checkpoint; its path."""
    L.seed_everything(0, verbose=False)
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batch_size=8)
    trainer = quiet_trainer(tmp_path, max_epochs=1, limit_val_batches=0)
    trainer.fit(ImageClassifierModule("simple_cnn", num_classes=3), datamodule=dm)
    trainer.save_checkpoint(tmp_path / "one.ckpt")
    return tmp_path / "one.ckpt"


def test_new_fit_from_loaded_weights_takes_any_length(tiny_folder, tmp_path):
    """The schedule-length check (test_repro: a resume of another length is refused) does not hang on hook order: a
    module rebuilt by load_from_checkpoint (which runs on_load_checkpoint) starts a new, longer fit with a fresh
    12-step schedule."""
    module = ImageClassifierModule.load_from_checkpoint(fit_then_save(tiny_folder, tmp_path))
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path), batch_size=8)
    trainer = quiet_trainer(tmp_path, max_epochs=2, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 12 and trainer.lr_scheduler_configs[0].scheduler.total_steps == 12


def test_settings_but_the_backbone_are_keyword_only():
    """ImageClassifierModule and CIFAR10DataModule take their many settings by keyword only."""
    with pytest.raises(TypeError):
        ImageClassifierModule("lenet", 3)
    with pytest.raises(TypeError):
        CIFAR10DataModule("folder")
    with pytest.raises(TypeError):
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], 10, "sgd")


def test_lenet_recipe_has_one_home_the_module_and_the_config_follow():
    """optim.LENET holds LeNet's recipe: ImageClassifierModule's and make_optimizer's defaults are its values, and
    configs/lenet.yaml spells out the same lr, weight decay, optimizer and batch size."""
    defaults = {name: p.default for name, p in inspect.signature(ImageClassifierModule).parameters.items()}
    opt_defaults = {name: p.default for name, p in inspect.signature(make_optimizer).parameters.items()}
    recipe = dataclasses.asdict(LENET)
    for name, value in recipe.items():
        if name != "batch_size":
            assert defaults[name] == value and opt_defaults[name] == value, name
    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "lenet.yaml").read_text())
    model = config["model"]
    assert (model["backbone"], model["optimizer"], model["lr"], model["weight_decay"]) == (
        "lenet", LENET.optimizer, LENET.lr, LENET.weight_decay)
    assert config["data"]["batch_size"] == LENET.batch_size
