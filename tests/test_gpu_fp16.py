"""A T4 (compute capability 7.5, no bf16): the policy picks 16-mixed, and lesson 08's Lightning module and its plain
twin both train in fp16 with a GradScaler. Emulated on the CPU, whose autocast supports float16."""
import lightning as L
import torch

from course_lib.base import hardware
from course_lib.data.ondevice import AlternatingFlipTranslate, DeviceBatches
from course_lib.training import speedrun
from course_lib.training.models import AirNet
from course_lib.training.speedrun import Recipe, SpeedrunModule
from course_lib.training.twin import Twin

SMALL = (8, 16, 16)
T4 = {"gpu": "Tesla T4", "compute_capability": "7.5", "bf16_native": False, "cpu_bf16_native": False}


def batches(images, labels):
    return DeviceBatches(images, labels, 8, shuffle=True, seed=5, drop_last=True,
                         augment=AlternatingFlipTranslate(len(labels), 5, 2))


def test_t4_policy_trains_module_and_twin_in_fp16_with_a_grad_scaler(real, monkeypatch):
    """On a T4 the policy's choice is 16-mixed; the module (Lightning's fp16 plugin, not its silent bf16 swap on a
    CPU) and the twin (GradScaler) then train in fp16 and follow the same loss curve, which is not fp32's."""
    images, labels = real[0][:24], real[1][:24]
    recipe = Recipe(widths=SMALL, batch_size=8, whiten_bias_epochs=1)
    L.seed_everything(0, verbose=False)
    fp32 = Twin(AirNet(SMALL), recipe).fit(batches(images, labels), 2, "32-true").losses
    monkeypatch.setattr(hardware, "facts", lambda: T4)
    assert hardware.choose_precision() == "16-mixed"
    L.seed_everything(0, verbose=False)
    module = SpeedrunModule(recipe)
    trainer = speedrun.make_trainer(2, None)
    trainer.fit(module, train_dataloaders=batches(images, labels))
    assert trainer.precision == "16-mixed" and trainer.precision_plugin.scaler is not None
    lit = torch.stack(module.step_losses).float()
    L.seed_everything(0, verbose=False)
    twin = Twin(AirNet(SMALL), recipe).fit(batches(images, labels), 2)
    assert twin.precision == "16-mixed" and twin.loss_scale > 0
    assert len(lit) == len(twin.losses) == 6 and torch.isfinite(twin.losses).all()
    torch.testing.assert_close(twin.losses, lit, rtol=1e-3, atol=1e-3)
    assert (twin.losses - fp32).abs().max() > 1e-5  # fp16 autocast really ran: fp32's curve differs
    acc = speedrun.evaluate_tta(twin.net, images, labels, batch_size=8, precision="16-mixed")
    assert 0 <= acc <= 1
