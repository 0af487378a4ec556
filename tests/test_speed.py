"""bench harness and its timing, GPU-resident data module (lesson 03-05 foundations); precision: test_config_policy."""
import itertools
from types import SimpleNamespace

import pytest
import torch

from course_lib import bench, config, timing
from course_lib.data import CIFAR10DataModule
from course_lib.modules import ImageClassifierModule
from course_lib.ondevice import DeviceCIFAR10DataModule


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


class FakeEvent:
    """torch.cuda.Event stand-in: record() stamps the next tick of a shared 1 ms clock; elapsed_time in ms."""

    ticks = 0

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None) -> None:
        FakeEvent.ticks += 1
        self.t = float(FakeEvent.ticks)

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.t - self.t


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA timing calls replaced by stubs; returns the list that collects each synchronize call."""
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    FakeEvent.ticks = 0
    return syncs


def run_callback_window(warmup: int, steps: int) -> bench.BenchCallback:
    """Drive BenchCallback's hooks as Lightning does, for `warmup + steps` steps of 8 images on a 'cuda' module."""
    cb = bench.BenchCallback(warmup, steps)
    trainer, module = SimpleNamespace(global_step=0), SimpleNamespace(device=torch.device("cuda", 0))
    batch = (torch.zeros(8, 3, 2, 2), torch.zeros(8, dtype=torch.long))
    cb.on_train_start(trainer, module)
    for i in range(warmup + steps):
        cb.on_train_batch_start(trainer, module, batch, i)
        trainer.global_step += 1
        cb.on_train_batch_end(trainer, module, None, batch, i)
    return cb


@pytest.mark.parametrize("steps", [3, 30])
def test_gpu_bench_syncs_once_per_window_not_per_step(fake_cuda, steps):
    """On CUDA the callback records events per step and synchronizes once, when its figures are first read."""
    cb = run_callback_window(warmup=2, steps=steps)
    assert fake_cuda == []  # nothing waited for the GPU during training
    assert len(cb.step_s) == steps and len(cb.wait_s) == steps
    images_per_s, warmup_s = cb.throughput.compute()["device/samples_per_sec"], cb.warmup_s
    assert len(fake_cuda) == 1  # one synchronize for the window, whatever its length
    # each event is 1 ms after the previous one: steps and gaps span 1 ms, warm-up 4 ms, step ends 2 ms apart
    assert cb.step_s == pytest.approx([1e-3] * steps) and cb.wait_s == pytest.approx([1e-3] * steps)
    assert warmup_s == pytest.approx(4e-3) and images_per_s == pytest.approx(8 / 2e-3)
    assert len(fake_cuda) == 1  # reading again does not sync again


@pytest.mark.parametrize("epochs", [3, 30])
def test_epoch_timer_syncs_once_per_fit_and_leaves_validation_out(fake_cuda, epochs):
    """EpochTimer marks events at the epoch and validation edges; reading seconds synchronizes once."""
    cb = bench.EpochTimer()
    trainer = SimpleNamespace(state=SimpleNamespace(fn="fit"), sanity_checking=False)
    module = SimpleNamespace(device=torch.device("cuda", 0))
    cb.on_train_start(trainer, module)
    for _ in range(epochs):  # marks 1 ms apart: epoch start, validation start, validation end, epoch end
        cb.on_train_epoch_start(trainer, module)
        cb.on_validation_start(trainer, module)
        cb.on_validation_end(trainer, module)
        cb.on_train_epoch_end(trainer, module)
    assert fake_cuda == []
    assert cb.seconds == pytest.approx([2e-3] * epochs)  # 3 ms epoch minus 1 ms of validation
    assert len(fake_cuda) == 1


@pytest.mark.parametrize("repeats", [3, 30])
def test_time_calls_syncs_once_on_gpu(fake_cuda, repeats):
    """timing.time_calls (behind compress.latency_ms) times repeats with events and one synchronize."""
    calls = []
    seconds = timing.time_calls(lambda: calls.append(1), repeats, warmup=2, device="cuda")
    assert len(calls) == repeats + 2 and seconds == pytest.approx([1e-3] * repeats)
    assert len(fake_cuda) == 1


def test_time_calls_on_cpu_reads_the_clock():
    """On the CPU each call spans consecutive clock readings; no CUDA call is made."""
    assert timing.time_calls(lambda: None, 4, warmup=1, clock=FakeClock(0.5)) == [0.5] * 4


def test_latency_ms_runs_warmup_plus_repeats_forward_passes():
    """compress.latency_ms goes through time_calls: warm-up + repeats passes on a (batch, 3, 32, 32) input."""
    from course_lib import compress

    shapes = []
    model = lambda x: shapes.append(tuple(x.shape))  # noqa: E731
    assert compress.latency_ms(model, 4, warmup=2, repeats=5) >= 0
    assert shapes == [(4, 3, 32, 32)] * 7


def test_device_data_module_trains_validates_and_tests(dm_kwargs):
    """The GPU-resident module works in a full Lightning fit (with validation) and test, on any device."""
    import lightning as L

    dm = DeviceCIFAR10DataModule(**dm_kwargs)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(ImageClassifierModule("simple_cnn", num_classes=3), datamodule=dm)  # tiny_folder: 3 classes
    assert "val_acc" in trainer.callback_metrics
    acc = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]["test_acc"]
    module = trainer.lightning_module.eval()
    with torch.no_grad():
        hits = [(module(x).argmax(1) == y).sum().item() for x, y in dm.test_dataloader()]
    assert acc == pytest.approx(sum(hits) / len(dm.test_set.labels))  # the logged accuracy is a hand count
