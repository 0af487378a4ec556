"""bench harness, GPU-resident data module and precision helper (lesson 03-05 foundations)."""
import itertools

import pytest
import torch

from course_lib import bench, config
from course_lib.data import CIFAR10DataModule, DeviceCIFAR10DataModule
from course_lib.modules import ImageClassifierModule


@pytest.fixture
def dm_kwargs(tiny_folder, session_data_root):
    return dict(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=8, seed=3)


class FakeClock:
    """A clock that advances exactly `tick` seconds per reading."""

    def __init__(self, tick: float):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_bench_row_has_the_fields(dm_kwargs):
    """A bench row carries every documented field, with sane values."""
    row = bench.bench(ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs), "base", steps=3, warmup=1)
    assert set(bench.FIELDS) <= set(row)
    assert row["images_per_s"] > 0 and row["step_ms"] > 0 and 0 <= row["data_wait"] < 1
    assert row["peak_mem_mb"] > 0 and row["batch_size"] == 8 and row["steps"] == 3


def test_bench_arithmetic_on_a_fake_clock(dm_kwargs):
    """With a clock ticking 1 s per reading, a step spans one tick and images/s follows exactly."""
    row = bench.bench(ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs), "fake", steps=4,
                      warmup=1, clock=FakeClock(1.0))
    # each step reads the clock at start and end (1 s apart); consecutive step ends are 2 s apart
    assert row["step_ms"] == pytest.approx(1000.0)
    assert row["images_per_s"] == pytest.approx(8 / 2.0)
    assert row["data_wait"] == pytest.approx(0.5)


def test_speedups_are_ratios_to_the_baseline():
    """speedup = images/s over the baseline's images/s; an unknown baseline is an error."""
    rows = [{"name": "a", "images_per_s": 100.0}, {"name": "b", "images_per_s": 250.0}]
    out = bench.add_speedups(rows, "a")
    assert [r["speedup"] for r in out] == [1.0, 2.5]
    with pytest.raises(ValueError, match="No row named"):
        bench.add_speedups(rows, "c")


def test_results_round_trip(tmp_path, monkeypatch):
    """save_results writes rows with hardware and versions; load_results reads the same rows back."""
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path))
    rows = [{"name": "x", "images_per_s": 123.5, "step_ms": 4.0, "batch_size": 8, "precision": "32-true"}]
    path = bench.save_results(rows, "99_test", tmp_path / "r.json")
    data = bench.load_results(path)
    assert data["rows"] == rows and data["lesson"] == "99_test"
    assert data["hardware"]["torch"] == torch.__version__
    assert config.load_results("99_test")[0]["value"] == 123.5


def test_too_few_steps_is_a_clear_error(dm_kwargs):
    """Asking for more steps than the data gives fails with a remedy, not a wrong number."""
    with pytest.raises(ValueError, match="too small"):
        bench.bench(ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs, subset=16), "x",
                    steps=5, warmup=1, max_epochs=1)


def test_device_batches_match_the_dataloader(dm_kwargs):
    """With augmentation off, the GPU-resident module yields the same batches as the DataLoader module."""
    cpu, dev = CIFAR10DataModule(**dm_kwargs), DeviceCIFAR10DataModule(**dm_kwargs, device="cpu")
    cpu.setup("fit"), dev.setup("fit")
    for loader_a, loader_b in ((cpu.train_dataloader(), dev.train_dataloader()),
                               (cpu.val_dataloader(), dev.val_dataloader())):
        assert len(loader_a) == len(loader_b)
        for (xa, ya), (xb, yb) in itertools.zip_longest(loader_a, loader_b):
            assert torch.equal(ya, yb) and torch.allclose(xa, xb)


def test_device_batches_follow_the_epoch(dm_kwargs):
    """Shuffling depends on the epoch Lightning sets, as for the DataLoader module."""
    dev = DeviceCIFAR10DataModule(**dm_kwargs, device="cpu")
    dev.setup("fit")
    loader = dev.train_dataloader()
    first = torch.cat([y for _, y in loader])
    loader.sampler.set_epoch(1)
    second = torch.cat([y for _, y in loader])
    assert not torch.equal(first, second) and torch.equal(first.sort().values, second.sort().values)


GPU_OLD = {"gpu": "Tesla T4", "compute_capability": "7.5", "bf16_native": False}
GPU_NEW = {"gpu": "NVIDIA H100", "compute_capability": "9.0", "bf16_native": True}
CPU = {"gpu": None}


@pytest.mark.parametrize("info, expected", [(GPU_NEW, "bf16-mixed"), (GPU_OLD, "16-mixed"), (CPU, "bf16-mixed")])
def test_precision_default_follows_hardware(info, expected):
    """bf16 where native, fp16 on older GPUs, bf16 on CPU."""
    assert config.choose_precision(None, info) == expected


def test_precision_errors_name_the_remedy():
    """Requests the hardware lacks, or unknown names, fail with the alternative named."""
    with pytest.raises(ValueError, match="16-mixed"):
        config.choose_precision("bf16-mixed", GPU_OLD)
    with pytest.raises(ValueError, match="bf16-mixed"):
        config.choose_precision("16-mixed", CPU)
    with pytest.raises(ValueError, match="Unknown precision"):
        config.choose_precision("fp8", GPU_NEW)
    assert config.choose_precision("32-true", CPU) == "32-true"


def test_device_data_module_trains_validates_and_tests(dm_kwargs):
    """The GPU-resident module works in a full Lightning fit (with validation) and test, on any device."""
    import lightning as L

    dm = DeviceCIFAR10DataModule(**dm_kwargs)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(ImageClassifierModule("simple_cnn"), datamodule=dm)
    assert "val_acc" in trainer.callback_metrics
    assert 0 <= trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]["test_acc"] <= 1
