"""Host syncs per training step, counted on the CPU, on both sides of every timed comparison of lessons 02-08 and
scripts/: both sides must do the same per-step work, with no host read of a tensor in the steady state.

Two counts per steady-state step (a run of 8 steps minus one of 4, over 4: what happens once per fit or per epoch
cancels; an uncounted run first fills the caches and lazy imports):
- reads: the implicit host reads of a tensor in Python (Tensor.__bool__, .item(), .tolist(), .cpu(), .numpy(),
  float(), int(), use as an index), from any caller: the course, Lightning, torchmetrics, torch.optim;
- aten: the ops that read a tensor's values on the host inside torch's C++, as torch.profiler sees them:
  aten::_local_scalar_dense (behind every scalar read, including the ones C++ makes itself) and the ops whose output
  shape depends on the values (nonzero, hence boolean-mask indexing, masked_select, unique, bincount, ...).
On a CPU these reads are free; on a GPU each one waits for the queued work, so they are counted anyway."""
import contextlib

import lightning as L
import pytest
import torch

from course_lib.base import hardware
from course_lib.benchmark import bench
from course_lib.data.ondevice import AlternatingFlipTranslate, DeviceBatches, RandomCropFlip
from course_lib.measure import timing
from course_lib.training import runs, speedrun
from course_lib.training.loops import train_plain
from course_lib.training.models import AirNet, LeNet, SimpleCNN
from course_lib.training.modules import ImageClassifierModule
from course_lib.training.speedrun import Recipe, SpeedrunModule
from course_lib.training.twin import Twin

SMALL = (8, 16, 16)
BATCH = 4  # images per step; 8 steps of 4 fit the tiny folder's 48 training images
STEPS = (4, 8)
READS = ("__bool__", "item", "tolist", "cpu", "numpy", "__float__", "__int__", "__index__")
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::masked_select",
                      "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
                      "aten::equal", "aten::repeat_interleave", "aten::bincount", "aten::histc"})
NONE = {"reads": 0, "aten": 0}
T4 = {"gpu": "Tesla T4", "compute_capability": "7.5", "bf16_native": False, "cpu_bf16_native": False}


@contextlib.contextmanager
def counted_syncs():
    """counts["reads"]: Python-level host reads of any tensor in the block; counts["aten"] (set on exit): C++ ops
    that read tensor values on the host."""
    counts = dict(NONE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KINETO_LOG_LEVEL", "6")  # the profiler's C++ log lines (no GPU found) stay out of the test output
        for name in READS:
            original = getattr(torch.Tensor, name)

            def counted(self, *args, _original=original, **kwargs):
                counts["reads"] += 1
                return _original(self, *args, **kwargs)
            mp.setattr(torch.Tensor, name, counted)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            yield counts
    counts["aten"] = sum(event.name in SYNC_OPS for event in prof.events())


def per_step(run) -> dict:
    """Host reads per step in the steady state of run(steps): (counts at 8 steps - counts at 4) / 4."""
    run(STEPS[0])  # uncounted: data caches, lazy imports and first-call initialisation
    totals = []
    for steps in STEPS:
        L.seed_everything(0, verbose=False)
        with counted_syncs() as counts:
            run(steps)
        totals.append(counts)
    return {key: (totals[1][key] - totals[0][key]) / (STEPS[1] - STEPS[0]) for key in NONE}


def test_the_counts_see_python_and_cpp_reads():
    """The instrument itself: a per-step loss.item() is one read and one aten read per step; boolean-mask indexing,
    which no Python method shows (its nonzero runs in C++), is seen by the aten count alone."""
    x = torch.randn(8)

    def item_per_step(steps):
        for _ in range(steps):
            x.sum().item()

    def mask_per_step(steps):
        for _ in range(steps):
            x[x > 0]

    assert per_step(item_per_step) == {"reads": 1, "aten": 1}
    assert per_step(mask_per_step) == {"reads": 0, "aten": 1}


def speedrun_batches(real, steps: int) -> DeviceBatches:
    """Lesson 08's batches (airbench's augmentation), `steps` per epoch."""
    n = steps * BATCH
    return DeviceBatches(real[0][:n], real[1][:n], BATCH, shuffle=True, seed=5, drop_last=True,
                         augment=AlternatingFlipTranslate(n, 5, 2))


def datamodule(folder, kind: str, images: int, **kwargs):
    """The lessons' DataModule of this kind ("loader" or "device") over `images` training images of the tiny folder."""
    return runs.datamodule(kind=kind, image_folder=str(folder), subset=images, batch_size=BATCH, seed=0, **kwargs)


def test_lesson_02_plain_loop_and_the_trainer_make_no_host_sync_per_step(tiny_folder):
    """Lesson 02's race: lesson 01's loop (train_plain, its loss and accuracy sums on the device) against
    ImageClassifierModule under the lesson's quiet Trainer (runs.TIMING, EpochTimer), on the same DataLoader."""
    def loader(steps):
        dm = datamodule(tiny_folder, "loader", steps * BATCH)
        dm.setup("fit")
        return dm.train_dataloader()

    def plain(steps):
        train_plain(LeNet(), loader(steps), 1, lr=0.05)

    def lightning(steps):
        L.Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[timing.EpochTimer()], **runs.TIMING).fit(
            ImageClassifierModule("lenet", lr=0.05), train_dataloaders=loader(steps))

    counted = {side: per_step(run) for side, run in (("plain loop", plain), ("ImageClassifierModule", lightning))}
    assert counted == {"plain loop": NONE, "ImageClassifierModule": NONE}, counted


BENCH_CONFIGS = [  # lesson 03's data rows, 04's precision rows, 05's layout row, as scripts/gpu_check.py runs them
    {"name": "cached DataLoader, augmented", "kind": "loader", "data": {"augment": True}},
    {"name": "data on the device, augmented", "kind": "device", "data": {"augment": True}},
    {"name": "bf16-mixed", "kind": "device", "precision": "bf16-mixed"},
    {"name": "channels_last", "kind": "device", "model": {"channels_last": True}},
]


@pytest.mark.parametrize("cfg", BENCH_CONFIGS, ids=[c["name"] for c in BENCH_CONFIGS])
def test_bench_configurations_make_no_host_sync_per_step(tiny_folder, cfg):
    """bench.run_configs / bench.bench (BenchCallback under the timing Trainer) on each kind of configuration the
    lessons compare: 0 host reads per step, so every row of a table pays the same (nothing)."""
    warmup = 1

    def make(cfg, steps):
        module = ImageClassifierModule(SimpleCNN(), lr=0.05, **cfg.get("model", {}))
        return module, datamodule(tiny_folder, cfg["kind"], (warmup + steps) * BATCH, **cfg.get("data", {}))

    def run(steps):
        bench.run_configs([cfg], lambda c: make(c, steps), steps=steps, warmup=warmup)

    assert per_step(run) == NONE


@pytest.mark.parametrize("augment", ["none", "crop+flip", "airbench"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_device_batches_read_nothing_on_the_host_per_batch(real, augment, replicas):
    """DeviceBatches (lessons 03-05's and 08's loader, both sides of the capstone), with each augmentation and as one
    rank's DDP share: one host-to-device copy of the epoch's order per epoch, then no host read per batch."""
    batch = 3  # 8 steps of 3 on each of 2 ranks: 48 of the tiny folder's 60 images

    def run(steps):
        n = steps * batch * replicas
        images, labels = real[0][:n], real[1][:n]
        aug = {"none": None, "crop+flip": RandomCropFlip(), "airbench": AlternatingFlipTranslate(n, 5, 2)}[augment]
        batches = DeviceBatches(images, labels, batch, shuffle=True, seed=5, drop_last=True, augment=aug,
                                num_replicas=replicas, rank=replicas - 1)
        assert sum(1 for _ in batches) == steps

    assert per_step(run) == NONE


def test_lightning_and_the_twin_make_no_host_sync_per_step(real):
    """Lesson 08: the module under the timing Trainer with BenchCallback (lessons 03-08's timed fits) and
    Twin (the capstone's other side): 0 host reads per step on each, hence equal."""
    recipe = Recipe(widths=SMALL, batch_size=BATCH, whiten_bias_epochs=1)

    def lightning(steps):
        batches = speedrun_batches(real, steps)
        module = SpeedrunModule(recipe)
        speedrun.make_trainer(1, "32-true", callbacks=[timing.BenchCallback(1, 2)]).fit(module,
                                                                                     train_dataloaders=batches)

    def twin(steps):
        Twin(AirNet(SMALL), recipe).fit(speedrun_batches(real, steps), 1, "32-true")

    counted = {side: per_step(run) for side, run in (("lightning", lightning), ("twin", twin))}
    assert counted == {"lightning": NONE, "twin": NONE}, counted


def test_fp16_pays_one_loss_scaler_read_per_step_on_both_sides(real, monkeypatch):
    """On a T4 (emulated: the policy picks 16-mixed), the module under Lightning's fp16 plugin and the twin with its
    GradScaler make the same per-step read, exactly one: GradScaler.step reads found_inf to decide whether to step.
    It is fp16's own cost (loss scaling), so it sits on both sides of the capstone comparison and on lesson 04's
    16-mixed row, which it is part of."""
    monkeypatch.setattr(hardware, "facts", lambda: T4)
    recipe = Recipe(widths=SMALL, batch_size=BATCH, whiten_bias_epochs=1)

    def lightning(steps):
        batches = speedrun_batches(real, steps)
        module = SpeedrunModule(recipe)
        speedrun.make_trainer(1, "16-mixed").fit(module, train_dataloaders=batches)

    def twin(steps):
        Twin(AirNet(SMALL), recipe).fit(speedrun_batches(real, steps), 1, "16-mixed")

    counted = {side: per_step(run) for side, run in (("lightning", lightning), ("twin", twin))}
    assert counted == {"lightning": {"reads": 1, "aten": 1}, "twin": {"reads": 1, "aten": 1}}, counted
