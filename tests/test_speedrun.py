"""Lesson 08's speedrun: AirNet, whitening, on-device augmentation, schedule, TTA, FLOPs, Lightning against the twin."""
import dataclasses

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI

from course_lib.data.data import CIFAR10_MEAN, CIFAR10_STD, CIFAR10DataModule, to_float
from course_lib.data.ondevice import AlternatingFlipTranslate, DeviceBatches, Speedrun
from course_lib.measure import timing
from course_lib.training import experiments, optim, speedrun
from course_lib.training.models import WIDTHS, AirNet, count_parameters
from course_lib.training.speedrun import Recipe, SpeedrunModule
from course_lib.training.twin import Twin

SMALL = (8, 16, 16)  # a narrow AirNet: the same code path, a fraction of the compute


def train_batches(images, labels, batch_size, seed=0, translate=2):
    """Speedrun training batches: shuffled, airbench's augmentation, full batches only."""
    return DeviceBatches(images, labels, batch_size, shuffle=True, seed=seed, drop_last=True,
                         augment=AlternatingFlipTranslate(len(labels), seed, translate))


def unnormalise(x: torch.Tensor) -> torch.Tensor:
    """Batches back to 0-255 pixel values."""
    mean, std = (torch.tensor(v).view(3, 1, 1) * 255 for v in (CIFAR10_MEAN, CIFAR10_STD))  # to_float's statistics
    return x * std + mean


def test_airnet_shape_and_parameter_count():
    """(B, 3, 32, 32) -> (B, 10); about 2M trainable parameters (1,971,352), the whitening filters not among them."""
    net = AirNet()
    assert net(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert count_parameters(net) == 1_971_352
    assert sum(p.numel() for p in net.parameters()) - count_parameters(net) == 24 * 3 * 2 * 2 + 2 * (64 + 256 + 256)


def test_whitening_is_deterministic_decorrelates_and_stays_frozen(real):
    """Same images -> same filters; outputs are decorrelated (uncentred second moments, as airbench94), largest
    eigenvalue first; the bias is zero; an optimiser step leaves the filters unchanged."""
    images, labels = real
    a, b = AirNet(SMALL), AirNet(SMALL)
    speedrun.whiten_from(a, images)
    speedrun.whiten_from(b, images.clone())
    assert torch.equal(a.whiten.weight, b.whiten.weight) and bool(a.whitened)
    assert not a.whiten.weight.requires_grad and torch.equal(a.whiten.bias, torch.zeros(24))
    with torch.no_grad():  # second moments of the first 12 outputs: diagonal (whitened patches), not centred
        out = a.whiten(next(iter(DeviceBatches(images, labels, 60)))[0])[:, :12].permute(1, 0, 2, 3).reshape(12, -1)
        moments = out @ out.T / out.shape[1]
    off = moments - torch.diag(moments.diagonal())
    assert off.abs().max() < 1e-3 * moments.diagonal().max() and moments.diagonal().max() <= 1.01
    assert moments.diagonal()[0] > 0.95 and moments.diagonal()[-1] < 0.5  # 5e-4 damps the smallest eigenvalues
    frozen = a.whiten.weight.clone()
    opt, _ = speedrun.recipe_optimizer(a, Recipe(SMALL, batch_size=60), 10)
    torch.nn.functional.cross_entropy(a(torch.randn(4, 3, 32, 32)), labels[:4]).backward()
    opt.step()
    assert torch.equal(a.whiten.weight, frozen)


def test_augmentation_keeps_labels_aligned():
    """Each image is a flat grey whose level encodes its label: after shuffling, shifts and flips it still does."""
    labels = torch.arange(100) % 10
    images = (labels * 25).to(torch.uint8)[:, None, None, None].expand(100, 3, 32, 32).contiguous()
    batches = train_batches(images, labels, 32, seed=3)
    seen = 0
    for epoch in range(2):
        batches.set_epoch(epoch)
        for x, y in batches:
            assert x.shape == (32, 3, 32, 32) and x.dtype == torch.float32
            assert torch.allclose(unnormalise(x).mean(dim=(1, 2, 3)), (y * 25).float(), atol=1e-3)
            seen += len(y)
    assert seen == 2 * 3 * 32  # drop_last: 3 full batches per epoch


def test_alternating_flip_complements_the_previous_epoch():
    """Epoch 0 mirrors a random half; epoch 1 mirrors exactly the others (read back from the pixels)."""
    n = 200
    images = torch.zeros(n, 3, 32, 32, dtype=torch.uint8)
    images[:, :, :, 16:] = 255  # bright right half: mirrored images have a bright left half
    images[:, 1] = torch.arange(n, dtype=torch.uint8)[:, None, None]  # channel 1 carries the image's index
    batches = train_batches(images, torch.zeros(n, dtype=torch.long), 50, seed=1, translate=0)
    flipped = []
    for epoch in range(2):
        batches.set_epoch(epoch)
        mirrored = torch.zeros(n, dtype=torch.bool)
        for x, _ in batches:
            px = unnormalise(x).round()
            mirrored[px[:, 1, 0, 0].long()] = px[:, 0, 0, 0] > 128
        flipped.append(mirrored)
    assert 60 < flipped[0].sum() < 140
    assert torch.equal(flipped[1], ~flipped[0])


@pytest.mark.parametrize("extras", [dict(lookahead_every=2),
                                    dict(lookahead_every=0, label_smoothing=0.0, bias_scale=1.0)], ids=["on", "off"])
def test_lightning_module_and_plain_twin_follow_the_same_loss_curve(real, extras):
    """Same seed, batches, optimiser, schedule and lookahead: per-step losses agree, with airbench's extras and
    without them (fidelity_cpu.py --extras off); a changed LR does not. Both whiten from the batches' images."""
    images, labels = real[0][:24], real[1][:24]
    batches = lambda: train_batches(images, labels, 8, seed=5)  # noqa: E731  3 steps per epoch
    recipe = Recipe(widths=SMALL, batch_size=8, whiten_bias_epochs=1, **extras)  # the freeze happens in both
    L.seed_everything(0, verbose=False)
    module = SpeedrunModule(recipe)
    assert module.recipe is recipe and not bool(module.net.whitened)
    speedrun.make_trainer(2, "32-true").fit(module, train_dataloaders=batches())
    lit = torch.stack(module.step_losses)
    L.seed_everything(0, verbose=False)
    twin = Twin(AirNet(SMALL), recipe).fit(batches(), 2, "32-true")
    assert len(lit) == len(twin.losses) == 6 and lit.std() > 1e-4  # the losses move: a real comparison
    assert (twin.recipe, twin.precision, twin.loss_scale, len(twin.epoch_s)) == (recipe, "32-true", None, 2)
    torch.testing.assert_close(twin.losses, lit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(twin.net.state_dict(), module.net.state_dict(), rtol=1e-5, atol=1e-6)
    L.seed_everything(0, verbose=False)
    other = Twin(AirNet(SMALL), dataclasses.replace(recipe, lr=3.0)).fit(batches(), 1, "32-true")
    assert (other.losses[1:] - lit[1:3]).abs().max() > 1e-3  # the comparison notices a different recipe


def test_fractional_epochs_stop_lightning_and_the_twin_at_the_same_step(real):
    """airbench's 9.9 epochs: ceil(epochs x steps per epoch) steps. The Trainer (max_steps) and the twin stop at the
    same step with the LR schedule at its end, the partial last epoch still logs, and the losses agree."""
    images, labels = real[0][:24], real[1][:24]
    batches = lambda: train_batches(images, labels, 8, seed=5)  # noqa: E731  3 steps per epoch
    recipe = Recipe(widths=SMALL, batch_size=8, lookahead_every=2)
    L.seed_everything(0, verbose=False)
    module = SpeedrunModule(recipe)
    trainer = speedrun.make_trainer(1.5, "32-true", steps_per_epoch=3)
    trainer.fit(module, train_dataloaders=batches())
    assert trainer.global_step == len(module.step_losses) == speedrun.total_steps(1.5, 3) == 5
    assert "train_loss" in trainer.callback_metrics  # the cut-short epoch ended normally
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(recipe.lr * 8 / 1024 * 0.07)
    L.seed_everything(0, verbose=False)
    twin = Twin(AirNet(SMALL), recipe).fit(batches(), 1.5, "32-true")
    torch.testing.assert_close(twin.losses, torch.stack(module.step_losses), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(twin.net.state_dict(), module.net.state_dict(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        speedrun.make_trainer(1.5)
    with pytest.raises(ValueError, match="epochs > 0"):
        speedrun.total_steps(0, 3)


def test_tta_levels_and_accuracy_against_a_hand_count(real):
    """Level 0 is the plain logits; 1 averages the mirror; every level keeps (B, classes); evaluate_tta's accuracy
    equals a hand count over the same batches; a bad level is an error."""
    images, labels = real
    net = AirNet(SMALL).eval()
    speedrun.whiten_from(net, images)
    x = next(iter(DeviceBatches(images, labels, 8)))[0]
    with torch.no_grad():
        plain, mirrored = net(x), net(x.flip(3))
    assert torch.equal(speedrun.tta_logits(net, x, 0), plain)
    torch.testing.assert_close(speedrun.tta_logits(net, x, 1), 0.5 * (plain + mirrored))
    assert speedrun.tta_logits(net, x, 2).shape == (8, 10)
    with torch.no_grad():
        hand = sum((net(xb).argmax(1) == yb).sum().item() for xb, yb in DeviceBatches(images, labels, 25))
    # float32 metric: within 1e-6 of the exact fraction (one image here is 1/60)
    acc = speedrun.evaluate_tta(net, images, labels, level=0, batch_size=25, precision="32-true")
    assert acc == pytest.approx(hand / len(labels), abs=1e-6)
    with pytest.raises(ValueError, match="TTA level"):
        speedrun.evaluate_tta(net, images, labels, level=3)


def test_schedule_warms_up_then_decays_and_biases_get_the_higher_lr():
    """0.2 -> 1 over the first 23 % of steps, then down to 0.07; LR and decay scale with batch; BN bias LR x64."""
    total = 100
    f = [optim.lr_factor(s, total) for s in range(total + 1)]
    assert f[0] == pytest.approx(0.2) and f[23] == pytest.approx(1.0) and f[total] == pytest.approx(0.07)
    assert all(a < b for a, b in zip(f[:23], f[1:24])) and all(a > b for a, b in zip(f[23:-1], f[24:]))
    net = AirNet(SMALL)
    opt, sched = optim.make_speedrun_optimizer(net, total_steps=total, batch_size=512, lr=1.5, momentum=0.85,
                                               weight_decay=2e-3, bias_scale=64, warmup=0.23)
    weights, biases = opt.param_groups
    assert weights["lr"] == pytest.approx(0.75 * 0.2) and biases["lr"] == pytest.approx(64 * 0.75 * 0.2)
    assert weights["lr"] * weights["weight_decay"] == pytest.approx(0.2 * 1e-3)  # same decay per step in both
    assert biases["lr"] * biases["weight_decay"] == pytest.approx(0.2 * 1e-3)
    norm_biases = [g.norm1.bias for g in net.groups] + [g.norm2.bias for g in net.groups]
    assert {id(p) for p in biases["params"]} == {id(p) for p in norm_biases}  # the six BatchNorm biases only
    assert any(p is net.whiten.bias for p in weights["params"])  # the whitening bias trains at the normal LR


def test_whitening_bias_trains_for_its_epochs_then_freezes_and_a_new_fit_trains_it_again(real):
    """whiten_bias_epochs=1: the bias moves in epoch 0, not in epoch 1; the next fit puts it back in the optimiser."""
    images, labels = real
    snaps = []

    class Snap(L.Callback):
        def on_train_epoch_start(self, trainer, module):
            snaps.append(module.net.whiten.bias.detach().clone())

    L.seed_everything(0, verbose=False)
    module = SpeedrunModule(Recipe(widths=SMALL, batch_size=20, lookahead_every=0, whiten_bias_epochs=1))
    for _ in range(2):  # second fit: same module, as lesson 08's seed loop reuses it
        speedrun.make_trainer(2, "32-true", callbacks=[Snap()]).fit(module,
                                                                   train_dataloaders=train_batches(images, labels, 20))
        snaps.append(module.net.whiten.bias.detach().clone())
    # snaps per fit: start of epoch 0, start of epoch 1, end of training
    assert not torch.equal(snaps[0], snaps[1]) and torch.equal(snaps[1], snaps[2])
    assert not torch.equal(snaps[3], snaps[4]) and torch.equal(snaps[4], snaps[5])
    with pytest.raises(ValueError, match="whiten_bias_epochs"):
        SpeedrunModule(Recipe(whiten_bias_epochs=-1))


def test_flop_summary_counts_an_epoch_and_compares_with_the_policys_precision():
    """An airbench94-sized epoch (48 steps of 1024) is about 35 TFLOP (counted by torch's FLOP counter); the peak it
    is compared with is the one of the precision the policy trains in: fp16 on a T4 (which lists no bf16 peak), bf16
    on an A100; on a CPU (fp32 without native bf16) none, said in words."""
    full = experiments.flop_summary(widths=WIDTHS, batch_size=1024, steps=50_000 // 1024, epoch_s=1.0,
                                    info={"gpu": None})
    assert 30 < full.tflop_per_epoch < 40 and full.tflops == pytest.approx(full.tflop_per_epoch)
    assert full.fraction_of_peak is None and "no fp32 peak known for this CPU" in full.text  # it trains fp32
    # in human units: the count and the rate in the unit that reads best, the time as a duration, no e-notation
    assert full.text.startswith(f"{timing.flop_rate(full.tflop_per_epoch * 1e12)[:-2]} per epoch in 1.00 s: "
                                   f"{timing.flop_rate(full.tflops * 1e12)}, ")
    slow = experiments.flop_summary(widths=SMALL, batch_size=64, steps=10, epoch_s=0.0123, info={"gpu": None})
    assert " GFLOP per epoch in 12.3 ms: " in slow.text and "GFLOP/s, " in slow.text and "e-" not in slow.text
    t4 = {"gpu": "Tesla T4", "bf16_native": False, "compute_capability": "7.5"}
    a100 = {"gpu": "NVIDIA A100-SXM4-80GB", "bf16_native": True, "compute_capability": "8.0"}
    for info, precision in ((t4, "fp16"), (a100, "bf16")):
        got = experiments.flop_summary(widths=SMALL, batch_size=64, steps=10, epoch_s=0.5, info=info)
        assert got.peak_tflops is not None, info  # a listed peak, in the precision the policy picks
        assert got.fraction_of_peak == pytest.approx(got.tflops / got.peak_tflops)
        assert f"dense {precision}" in got.text and f"{100 * got.fraction_of_peak:.1f} %" in got.text
        assert got.tflops == pytest.approx(got.tflop_per_epoch / 0.5)


def test_recipe_is_the_one_source_checkpoints_reload_it_and_lightningcli_sets_its_fields(real, tmp_path):
    """SpeedrunModule's one hyperparameter is its Recipe: a checkpoint reloads it (torch.load weights_only=True) with
    the trained, whitened net; LightningCLI sets its fields from YAML and flags, and its checkpoint reloads them
    too; a bad value is an error."""
    images, labels = real
    recipe = Recipe(widths=SMALL, batch_size=20, lr=0.7, lookahead_every=0, tta_level=1)
    module = SpeedrunModule(recipe)
    trainer = speedrun.make_trainer(1, "32-true")
    trainer.fit(module, train_dataloaders=train_batches(images, labels, 20))
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    saved = torch.load(tmp_path / "run.ckpt", weights_only=True)["hyper_parameters"]
    assert saved == {"recipe": recipe}
    loaded = SpeedrunModule.load_from_checkpoint(tmp_path / "run.ckpt", weights_only=True)
    assert loaded.recipe == recipe and bool(loaded.net.whitened)
    torch.testing.assert_close(loaded.net.state_dict(), module.net.state_dict(), rtol=0, atol=0)
    settings = {"widths": list(SMALL), "batch_size": 20, "lr": 0.3}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"model": {"recipe": settings}}))
    cli = LightningCLI(SpeedrunModule, run=False, save_config_callback=None, seed_everything_default=0, args=[
        "--config", str(tmp_path / "recipe.yaml"), "--model.recipe.tta_level", "0", "--trainer.max_epochs", "1",
        "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path)])
    from_cli = Recipe(widths=SMALL, batch_size=20, lr=0.3, tta_level=0)
    assert cli.model.recipe == from_cli
    cli.trainer.fit(cli.model, train_dataloaders=train_batches(images, labels, 20))
    cli.trainer.save_checkpoint(tmp_path / "cli.ckpt")
    assert SpeedrunModule.load_from_checkpoint(tmp_path / "cli.ckpt", weights_only=True).recipe == from_cli
    with pytest.raises((ValueError, SystemExit)):
        LightningCLI(SpeedrunModule, run=False, save_config_callback=None, seed_everything_default=0,
                     args=["--model.recipe.tta_level", "5", "--trainer.logger", "false"])


def test_twin_compiles_once_and_every_fit_uses_that_handle(real, monkeypatch):
    """Recipe(compile=True): the twin calls torch.compile once, when built, and two fits both step through that
    compiled handle (no recompilation per fit); the eager net shares its weights. torch.compile is replaced by a
    counting stand-in, so no compiler runs here."""
    images, labels = real
    compiled, calls = [], []

    class Handle(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.inner = net

        def forward(self, x):
            calls.append(len(x))
            return self.inner(x)

    monkeypatch.setattr(speedrun.torch, "compile", lambda net: compiled.append(net) or Handle(net))
    twin = Twin(AirNet(SMALL), Recipe(widths=SMALL, batch_size=20, compile=True))
    for _ in range(2):
        twin.fit(train_batches(images, labels, 20), 1, "32-true")
    assert compiled == [twin.net] and calls == [20] * 6  # 3 steps per fit, all through the handle
    plain = Twin(AirNet(SMALL), Recipe(widths=SMALL, batch_size=20))
    assert plain.forward is plain.net and len(compiled) == 1


def test_bad_inputs_give_clear_errors(real):
    """Float images, a batch larger than the data, batches without images to whiten from, a batch size the LR was
    not scaled for, a twin whose recipe disagrees with its batches, missing precision, bad widths or recipe values."""
    images, labels = real
    with pytest.raises(ValueError, match="uint8"):
        DeviceBatches(images.float(), labels, 8)
    with pytest.raises(ValueError, match="full batch"):
        DeviceBatches(images, labels, 100, drop_last=True)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(to_float(images), labels), batch_size=16)
    with pytest.raises(ValueError, match="no .images: train on DeviceBatches"):  # a plain DataLoader
        speedrun.make_trainer(1, "32-true").fit(SpeedrunModule(Recipe(SMALL, batch_size=16)),
                                                train_dataloaders=loader)
    with pytest.raises(ValueError, match="batch_size=16"):
        speedrun.make_trainer(1, "32-true").fit(SpeedrunModule(Recipe(SMALL)),
                                                train_dataloaders=train_batches(images, labels, 16))
    with pytest.raises(ValueError, match="batch_size=16"):
        Twin(AirNet(SMALL), Recipe(SMALL)).fit(train_batches(images, labels, 16), 1, "32-true")
    with pytest.raises(ValueError, match="16-mixed"):
        Twin(AirNet(SMALL), Recipe(SMALL, 16)).fit(train_batches(images, labels, 16), 1, "16-mixed")
    with pytest.raises(ValueError, match="widths"):
        AirNet((64, 256))
    with pytest.raises(ValueError, match="label_smoothing"):
        Recipe(label_smoothing=1.0)


def test_datamodule_carves_splits_once_and_serves_device_batches(tiny_folder, session_data_root):
    """The speedrun batching serves the DataModule's seeded splits, minus validation; shuffle_seed changes the order;
    a module fitted on it whitens from its training images (the data's), not from an argument."""
    kw = dict(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=16, seed=0, val_fraction=0.0)
    a = CIFAR10DataModule(**kw, batching=Speedrun("cpu"))
    b = CIFAR10DataModule(**kw, batching=Speedrun("cpu", shuffle_seed=7))
    a.setup("fit"), b.setup("fit")
    assert len(a.val_set) == 0 and len(a.test_set) == 6 and len(a.train_set) == 54  # no validation: 60 - 6 test
    assert torch.equal(a.test_set.labels, b.test_set.labels)
    train = a.train_dataloader()
    assert len(train) == 3 and a.train_set.images.dtype == torch.uint8
    first_a, first_b = next(iter(train))[1], next(iter(b.train_dataloader()))[1]
    assert not torch.equal(first_a, first_b)
    a.setup("test")  # a second setup keeps the tensors already placed
    assert a.train_dataloader().images is train.images
    assert len(train) == len(a.train_set) // 16  # full batches only
    module, reference = SpeedrunModule(Recipe(SMALL, batch_size=16, lookahead_every=0)), AirNet(SMALL)
    speedrun.make_trainer(1, "32-true").fit(module, datamodule=a)
    speedrun.whiten_from(reference, a.train_set.images)
    assert bool(module.net.whitened) and torch.equal(module.net.whiten.weight, reference.whiten.weight)
