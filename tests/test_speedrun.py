"""Lesson 08's speedrun: AirNet, whitening, on-device augmentation, schedule, TTA, FLOPs, Lightning against the twin."""
import lightning as L
import pytest
import torch

from course_lib import bench, optim, speedrun
from course_lib.data import load_image_folder
from course_lib.models import AirNet, count_parameters, init_whitening
from course_lib.ondevice import AlternatingFlipTranslate, DeviceBatches, SpeedrunDataModule
from course_lib.speedrun import Recipe, SpeedrunModule

SMALL = (8, 16, 16)  # a narrow AirNet: the same code path, a fraction of the compute


@pytest.fixture(scope="module")
def real(tiny_folder, session_data_root):
    """60 real CIFAR-10 images (3 classes) as uint8 (N, 3, 32, 32) and labels."""
    data = load_image_folder(tiny_folder / "train", session_data_root / "cache")
    return data["images"], data["labels"]


def train_batches(images, labels, batch_size, seed=0, translate=2):
    """Speedrun training batches: shuffled, airbench's augmentation, full batches only."""
    return DeviceBatches(images, labels, batch_size, shuffle=True, seed=seed, drop_last=True,
                         augment=AlternatingFlipTranslate(len(labels), seed, translate))


def unnormalise(x: torch.Tensor) -> torch.Tensor:
    """Batches back to 0-255 pixel values."""
    b = DeviceBatches(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), torch.zeros(1, dtype=torch.long), 1)
    return x * b.std + b.mean


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
    init_whitening(a, images)
    init_whitening(b, images.clone())
    assert torch.equal(a.whiten.weight, b.whiten.weight) and bool(a.whitened)
    assert not a.whiten.weight.requires_grad and torch.equal(a.whiten.bias, torch.zeros(24))
    with torch.no_grad():  # second moments of the first 12 outputs: diagonal (whitened patches), not centred
        out = a.whiten(next(iter(DeviceBatches(images, labels, 60)))[0])[:, :12].permute(1, 0, 2, 3).reshape(12, -1)
        moments = out @ out.T / out.shape[1]
    off = moments - torch.diag(moments.diagonal())
    assert off.abs().max() < 1e-3 * moments.diagonal().max() and moments.diagonal().max() <= 1.01
    assert moments.diagonal()[0] > 0.95 and moments.diagonal()[-1] < 0.5  # 5e-4 damps the smallest eigenvalues
    frozen = a.whiten.weight.clone()
    opt, _ = optim.make_speedrun_optimizer(a, 10, 60, 1.5, 0.85, 2e-3, 64, 0.23)
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
    without them (fidelity_cpu.py --extras off); a changed LR does not."""
    images, labels = real[0][:24], real[1][:24]
    batches = lambda: train_batches(images, labels, 8, seed=5)  # noqa: E731  3 steps per epoch
    recipe = Recipe(widths=SMALL, batch_size=8, whiten_bias_epochs=1, **extras)  # the freeze happens in both
    L.seed_everything(0, verbose=False)
    module = SpeedrunModule(**vars(recipe), whiten_images=images)
    assert module.recipe == recipe
    speedrun.make_trainer(2, "32-true").fit(module, train_dataloaders=batches())
    lit = torch.stack(module.step_losses)
    L.seed_everything(0, verbose=False)
    twin = speedrun.train_twin(AirNet(SMALL), batches(), 2, recipe, "32-true")
    assert len(lit) == len(twin["losses"]) == 6 and lit.std() > 1e-4  # the losses move: a real comparison
    torch.testing.assert_close(twin["losses"], lit, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(twin["net"].state_dict(), module.net.state_dict(), rtol=1e-5, atol=1e-6)
    L.seed_everything(0, verbose=False)
    other = speedrun.train_twin(AirNet(SMALL), batches(), 1, Recipe(**{**vars(recipe), "lr": 3.0}), "32-true")
    assert (other["losses"][1:] - lit[1:3]).abs().max() > 1e-3  # the comparison notices a different recipe


def test_fractional_epochs_stop_lightning_and_the_twin_at_the_same_step(real):
    """airbench's 9.9 epochs: ceil(epochs x steps per epoch) steps. The Trainer (max_steps) and the twin stop at the
    same step with the LR schedule at its end, the partial last epoch still logs, and the losses agree."""
    images, labels = real[0][:24], real[1][:24]
    batches = lambda: train_batches(images, labels, 8, seed=5)  # noqa: E731  3 steps per epoch
    recipe = Recipe(widths=SMALL, batch_size=8, lookahead_every=2)
    L.seed_everything(0, verbose=False)
    module = SpeedrunModule(**vars(recipe), whiten_images=images)
    trainer = speedrun.make_trainer(1.5, "32-true", steps_per_epoch=3)
    trainer.fit(module, train_dataloaders=batches())
    assert trainer.global_step == len(module.step_losses) == speedrun.total_steps(1.5, 3) == 5
    assert "train_loss" in trainer.callback_metrics  # the cut-short epoch ended normally
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(recipe.lr * 8 / 1024 * 0.07)
    L.seed_everything(0, verbose=False)
    twin = speedrun.train_twin(AirNet(SMALL), batches(), 1.5, recipe, "32-true")
    torch.testing.assert_close(twin["losses"], torch.stack(module.step_losses), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(twin["net"].state_dict(), module.net.state_dict(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        speedrun.make_trainer(1.5)
    with pytest.raises(ValueError, match="epochs > 0"):
        speedrun.total_steps(0, 3)


def test_tta_levels_and_accuracy_against_a_hand_count(real):
    """Level 0 is the plain logits; 1 averages the mirror; every level keeps (B, classes); evaluate_tta's accuracy
    equals a hand count over the same batches; a bad level is an error."""
    images, labels = real
    net = AirNet(SMALL).eval()
    init_whitening(net, images)
    x = next(iter(DeviceBatches(images, labels, 8)))[0]
    with torch.no_grad():
        plain, mirrored = net(x), net(x.flip(3))
    assert torch.equal(speedrun.tta_logits(net, x, 0), plain)
    torch.testing.assert_close(speedrun.tta_logits(net, x, 1), 0.5 * (plain + mirrored))
    assert speedrun.tta_logits(net, x, 2).shape == (8, 10)
    with torch.no_grad():
        hand = sum((net(xb).argmax(1) == yb).sum().item() for xb, yb in DeviceBatches(images, labels, 25))
    # float32 metric: within 1e-6 of the exact fraction (one image here is 1/60)
    acc = speedrun.evaluate_tta(net, images, labels, level=0, batch_size=25)
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
    opt, sched = optim.make_speedrun_optimizer(net, total, 512, 1.5, 0.85, 2e-3, 64, 0.23)
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
    module = SpeedrunModule(widths=SMALL, batch_size=20, lookahead_every=0, whiten_bias_epochs=1,
                            whiten_images=images)
    for _ in range(2):  # second fit: same module, as lesson 08's seed loop reuses it
        speedrun.make_trainer(2, "32-true", callbacks=[Snap()]).fit(module,
                                                                   train_dataloaders=train_batches(images, labels, 20))
        snaps.append(module.net.whiten.bias.detach().clone())
    # snaps per fit: start of epoch 0, start of epoch 1, end of training
    assert not torch.equal(snaps[0], snaps[1]) and torch.equal(snaps[1], snaps[2])
    assert not torch.equal(snaps[3], snaps[4]) and torch.equal(snaps[4], snaps[5])
    with pytest.raises(ValueError, match="whiten_bias_epochs"):
        SpeedrunModule(whiten_bias_epochs=-1)


def test_flops_and_fraction_of_peak():
    """An airbench94-sized epoch (48 steps of 1024) is about 35 TFLOP; peaks come from the table, none on a CPU."""
    per_epoch = bench.train_step_flops(AirNet(), 1024) * (50_000 // 1024)
    assert 30e12 < per_epoch < 40e12
    assert bench.peak_tflops({"gpu": "NVIDIA H200"}) == 989 and bench.peak_tflops({"gpu": None}) is None
    assert bench.peak_tflops({"gpu": "NVIDIA H100 PCIe"}) == 756.5
    got = bench.achieved(1e12, 0.5, {"gpu": "NVIDIA A100-SXM4-80GB"})
    assert got["tflops"] == pytest.approx(2.0) and got["fraction_of_peak"] == pytest.approx(2 / 312)


def test_bad_inputs_give_clear_errors(real):
    """Float images, a batch larger than the data, no whitening images, a batch size the LR was not scaled for,
    a twin whose recipe disagrees with its batches, missing precision, bad widths or recipe values."""
    images, labels = real
    with pytest.raises(ValueError, match="uint8"):
        DeviceBatches(images.float(), labels, 8)
    with pytest.raises(ValueError, match="full batch"):
        DeviceBatches(images, labels, 100, drop_last=True)
    with pytest.raises(ValueError, match="whiten_images"):
        speedrun.make_trainer(1, "32-true").fit(SpeedrunModule(widths=SMALL, batch_size=16),
                                                train_dataloaders=train_batches(images, labels, 16))
    with pytest.raises(ValueError, match="batch_size=16"):
        speedrun.make_trainer(1, "32-true").fit(SpeedrunModule(widths=SMALL, whiten_images=images),
                                                train_dataloaders=train_batches(images, labels, 16))
    with pytest.raises(ValueError, match="batch_size=16"):
        speedrun.train_twin(AirNet(SMALL), train_batches(images, labels, 16), 1, Recipe(SMALL), "32-true")
    with pytest.raises(ValueError, match="16-mixed"):
        speedrun.train_twin(AirNet(SMALL), train_batches(images, labels, 16), 1, Recipe(SMALL, 16), "16-mixed")
    with pytest.raises(ValueError, match="widths"):
        AirNet((64, 256))
    with pytest.raises(ValueError, match="label_smoothing"):
        Recipe(label_smoothing=1.0)


def test_datamodule_carves_splits_once_and_serves_device_batches(tiny_folder, session_data_root):
    """SpeedrunDataModule reuses CIFAR10DataModule's seeded splits, minus validation; shuffle_seed changes the order."""
    kw = dict(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=16, seed=0, device="cpu")
    a, b = SpeedrunDataModule(**kw), SpeedrunDataModule(**kw, shuffle_seed=7)
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
