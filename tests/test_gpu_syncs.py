"""Host syncs per training step, counted on the CPU: every implicit device-to-host read (Tensor.__bool__, .item(),
.tolist(), .cpu(), float(), int()) that would stall a GPU's queue. Both sides of the capstone's Lightning-vs-twin
comparison must do the same per-step work with none in the steady state."""
import lightning as L
import pytest
import torch

from course_lib import bench, speedrun
from course_lib.data import load_image_folder
from course_lib.models import AirNet
from course_lib.ondevice import AlternatingFlipTranslate, DeviceBatches
from course_lib.speedrun import Recipe, SpeedrunModule

SMALL = (8, 16, 16)
READS = ("__bool__", "item", "tolist", "cpu", "__float__", "__int__")


@pytest.fixture(scope="module")
def real(tiny_folder, session_data_root):
    data = load_image_folder(tiny_folder / "train", session_data_root / "cache")
    return data["images"], data["labels"]


@pytest.fixture
def count_reads(monkeypatch):
    """counts["total"] grows by one per host read of a tensor, from any caller."""
    counts = {"total": 0}
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["total"] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


def reads_per_extra_step(run, real, counts) -> float:
    """Host reads per step in the steady state: the difference between one epoch of 6 steps and one of 3, per step
    (what happens once per fit or per epoch cancels)."""
    totals = []
    for n in (24, 48):  # 3 and 6 steps of batch 8
        images, labels = real[0][:n], real[1][:n]
        batches = DeviceBatches(images, labels, 8, shuffle=True, seed=5, drop_last=True,
                                augment=AlternatingFlipTranslate(n, 5, 2))
        L.seed_everything(0, verbose=False)
        before = counts["total"]
        run(images, batches)
        totals.append(counts["total"] - before)
    return (totals[1] - totals[0]) / 3


def test_lightning_and_the_twin_make_no_host_sync_per_step(real, count_reads):
    """The module under the timing Trainer with BenchCallback (lessons 03-08's timed fits) and train_twin (the
    capstone's other side): 0 host reads per step on each, hence equal."""
    recipe = Recipe(widths=SMALL, batch_size=8, whiten_bias_epochs=1)

    def lightning(images, batches):
        module = SpeedrunModule(**vars(recipe), whiten_images=images)
        speedrun.make_trainer(1, "32-true", callbacks=[bench.BenchCallback(1, 2)]).fit(module,
                                                                                     train_dataloaders=batches)

    def twin(images, batches):
        speedrun.train_twin(AirNet(SMALL), batches, 1, recipe, "32-true")

    per_step = {side: reads_per_extra_step(run, real, count_reads) for side, run in
                (("lightning", lightning), ("twin", twin))}
    assert per_step == {"lightning": 0, "twin": 0}, per_step
