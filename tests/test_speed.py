"""bench harness and its timing, GPU-resident data module (lesson 03-05 foundations); precision: test_config_policy."""
import dataclasses
import itertools
import json
import random
import statistics
from types import SimpleNamespace

import pytest
import torch

from course_lib.base import results
from course_lib.base.errors import CourseError
from course_lib.base.records import BenchRow
from course_lib.benchmark import bench
from course_lib.data.data import CIFAR10DataModule
from course_lib.data.ondevice import OnDevice
from course_lib.measure import timing, verdict
from course_lib.parallel import scaling
from course_lib.training.modules import ImageClassifierModule


@pytest.fixture
def dm_kwargs(tiny_folder, session_data_root):
    return dict(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=8, seed=3)


def bench_row(name: str, images_per_s: float = 1.0, **kw) -> BenchRow:
    """A BenchRow with the given figures; the rest placeholders (a CPU row of 8 images per step)."""
    figures = dict(step_ms=1.0, peak_mem_mb=1.0, data_wait=0.0, warmup_s=0.0, steps=1, batch_size=8, device="cpu")
    return BenchRow(name, images_per_s, **{**figures, **kw})


class FakeClock:
    """A clock that advances exactly `tick` seconds per reading."""

    def __init__(self, tick: float):
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_bench_row_has_the_fields(dm_kwargs):
    """A bench row is a BenchRow named and with its precision, with sane values; one run is its own spread."""
    row = bench.bench(ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs), "base", steps=3, warmup=1)
    assert isinstance(row, BenchRow) and (row.name, row.precision, row.device) == ("base", "32-true", "cpu")
    assert row.images_per_s > 0 and row.step_ms > 0 and 0 <= row.data_wait < 1
    assert row.peak_mem_mb > 0 and row.batch_size == 8 and row.steps == 3
    assert row.images_per_s_min == row.images_per_s_max == row.images_per_s


def test_bench_arithmetic_on_a_fake_clock(dm_kwargs):
    """With a clock ticking 1 s per reading, a step spans one tick and images/s follows exactly."""
    row = bench.bench(ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs), "fake", steps=4,
                      warmup=1, clock=FakeClock(1.0))
    # each step reads the clock at start and end (1 s apart); consecutive step ends are 2 s apart
    assert row.step_ms == pytest.approx(1000.0)
    assert row.images_per_s == pytest.approx(8 / 2.0)
    assert row.data_wait == pytest.approx(0.5)


def test_scaling_measures_through_the_bench_harness(dm_kwargs):
    """scaling.measure (lesson 06) is bench.bench with DDPBenchCallback: one process gives a full row named for it."""
    row = scaling.measure(lambda: (ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs)), devices=1,
                          steps=3, warmup=1)
    assert isinstance(row, BenchRow) and row.name == "1 x cpu"
    assert row.processes == 1 and row.batch_size == 8 and row.steps == 3


def test_run_configs_reads_a_bench_config_or_a_lessons_dict_and_hands_make_it_as_given(monkeypatch):
    """A BenchConfig and a lesson's dict give the same bench() call; make gets each config unchanged; a dict without
    a name is a CourseError that asks for one."""
    benched, made = [], []
    monkeypatch.setattr(bench, "bench", lambda module, dm, name, **kw: benched.append((name, kw)) or
                        bench_row(name))
    typed = bench.BenchConfig("bf16", "bf16-mixed", {"devices": 1}, {"model": "lenet"})
    lesson = {"name": "bf16", "precision": "bf16-mixed", "trainer": {"devices": 1}, "model": "lenet"}
    bench.run_configs([typed, lesson], lambda cfg: made.append(cfg) or (None, None), steps=2, warmup=1)
    assert made == [typed, lesson] and benched[0] == benched[1]
    assert benched[0] == ("bf16", {"steps": 2, "warmup": 1, "precision": "bf16-mixed", "devices": 1})
    assert bench.BenchConfig.of(lesson) == typed and bench.BenchConfig.of({"name": "x"}).precision == "32-true"
    with pytest.raises(CourseError, match="name"):
        bench.run_configs([{"model": "lenet"}], lambda cfg: (None, None), steps=2)


def test_speedups_are_ratios_to_the_baseline():
    """speedup = images/s over the baseline's images/s; an unknown baseline is an error."""
    rows = [bench_row("a", 100.0), bench_row("b", 250.0)]
    out = bench.add_speedups(rows, "a")
    assert [r.speedup for r in out] == [1.0, 2.5] and [r.baseline for r in out] == [True, False]
    with pytest.raises(ValueError, match="No row named"):
        bench.add_speedups(rows, "c")


def test_speedups_follow_the_verdicts_median_round_ratio():
    """With interleaved rounds the speedup is the median round ratio, as verdict.compare reads it, not the ratio of
    the two medians (1.0 in the second case, where the rounds put b behind a: 0.95)."""
    base = bench_row("a", 100.0, rounds=(100.0, 100.0, 60.0))
    other = bench_row("b", 100.0, rounds=(100.0, 90.0, 200.0))
    out = bench.add_speedups([base, other], "a")
    assert out[1].speedup == pytest.approx(1.0) and out[0].speedup == 1.0
    other = bench_row("b", 100.0, rounds=(90.0, 95.0, 300.0))  # medians 100 vs 100 -> 1.0; round ratios 0.9, 0.95, 5
    assert bench.add_speedups([base, other], "a")[1].speedup == pytest.approx(0.95)  # -> median 0.95
    table = bench.table(bench.add_speedups([base, other], "a"))  # 3 rounds: too few for the sign test to judge
    assert "| 1x (baseline) |" in table and "| 1.05x slower (not judged: too few rounds) |" in table


def test_speedup_column_says_what_the_verdict_says():
    """Six paired rounds: the column prints a direction only where verdict.compare calls one, and 'no difference'
    where it does not; a 1.5x gap in every round is called."""
    rounds = {"a": (100.0, 101.0, 99.0, 100.0, 102.0, 98.0), "b": (101.0, 99.0, 100.0, 103.0, 97.0, 100.0),
              "c": (150.0, 152.0, 148.0, 151.0, 153.0, 147.0)}
    out = bench.add_speedups([bench_row(n, statistics.median(r), rounds=r) for n, r in rounds.items()], "a")
    assert [r.called for r in out] == [0, 0, 1]
    cells = [bench._cell(bench.cells(r), "speedup") for r in out]
    assert cells[0] == "1x (baseline)" and cells[1].startswith("no difference") and cells[2] == "1.50x faster"
    assert verdict.direction(list(rounds["c"]), list(rounds["a"]), paired=True) == 1


def test_no_row_with_higher_median_images_per_s_is_labelled_slower():
    """Over 3,000 random sets of six rounds (drifting machines, outliers), a row whose median images/s (the table's
    figure) is higher than the baseline's never reads 'slower', nor a lower one 'faster'."""
    rng = random.Random(0)
    for _ in range(3000):
        drift = [rng.lognormvariate(0, 0.3) for _ in range(6)]  # the machine's speed in each round, shared
        base = [1000 * d * rng.lognormvariate(0, 0.05) for d in drift]
        gain = rng.choice([0.8, 0.95, 1.0, 1.05, 1.25])
        other = [1000 * gain * d * rng.lognormvariate(0, 0.2) for d in drift]
        rows = bench.add_speedups([bench.median_row([bench_row("a", v) for v in base]),
                                   bench.median_row([bench_row("b", v) for v in other])], "a")
        cell, higher = bench._cell(bench.cells(rows[1]), "speedup"), rows[1].images_per_s > rows[0].images_per_s
        assert not (higher and "slower" in cell) and not (not higher and "faster" in cell), (base, other, cell)


def test_median_row_keeps_the_median_run_and_the_rounds_spread():
    """Three rounds of one configuration: the median run's fields, the fastest and slowest images/s as the spread
    (not the median run's own single figure), and the images/s in round order for paired verdicts."""
    done = [bench_row("a", v, step_ms=1e3 / v) for v in (300.0, 100.0, 200.0)]
    median = bench.median_row(done)
    assert median.images_per_s == 200.0 and median.step_ms == 5.0
    assert (median.images_per_s_min, median.images_per_s_max) == (100.0, 300.0)
    assert median.rounds == (300.0, 100.0, 200.0) and median.repeats == 3


def test_a_bench_row_round_trips_through_json_and_a_results_file(tmp_path, monkeypatch):
    """BenchRow.to_json is plain JSON (rounds a list) and from_json gives the same row back, through save_rows's file
    too; a key the record lacks is an error, not a silent loss."""
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path))
    rows = bench.add_speedups([bench.median_row([bench_row("a", v) for v in (3.0, 1.0, 2.0)]),
                               bench.median_row([bench_row("b", v) for v in (6.0, 2.0, 4.0)])], "a")
    assert [BenchRow.from_json(json.loads(json.dumps(r.to_json()))) for r in rows] == rows
    assert isinstance(rows[0].to_json()["rounds"], list)
    assert results.load_rows(results.save_rows(rows, "99_test")) == rows
    with pytest.raises(TypeError, match="colour"):
        BenchRow.from_json({**rows[0].to_json(), "colour": "red"})


def test_too_few_steps_is_a_clear_error(dm_kwargs):
    """Asking for more steps than the data gives fails with a remedy, not a wrong number."""
    with pytest.raises(ValueError, match="too small"):
        bench.bench(ImageClassifierModule("simple_cnn"), CIFAR10DataModule(**dm_kwargs, subset=16), "x",
                    steps=5, warmup=1, max_epochs=1)


def test_device_batches_match_the_dataloader(dm_kwargs):
    """With augmentation off, the GPU-resident module yields the same batches as the DataLoader module."""
    cpu, dev = CIFAR10DataModule(**dm_kwargs), CIFAR10DataModule(**dm_kwargs, batching=OnDevice("cpu"))
    cpu.setup("fit"), dev.setup("fit")
    for loader_a, loader_b in ((cpu.train_dataloader(), dev.train_dataloader()),
                               (cpu.val_dataloader(), dev.val_dataloader())):
        assert len(loader_a) == len(loader_b)
        for (xa, ya), (xb, yb) in itertools.zip_longest(loader_a, loader_b):
            assert torch.equal(ya, yb) and torch.allclose(xa, xb)


def test_device_batches_follow_the_epoch(dm_kwargs):
    """Shuffling depends on the epoch Lightning sets, as for the DataLoader module."""
    dev = CIFAR10DataModule(**dm_kwargs, batching=OnDevice("cpu"))
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


def run_callback_window(warmup: int, steps: int, cb: timing.BenchCallback | None = None, device: str = "cuda",
                        world: int = 1) -> timing.BenchCallback:
    """Drive BenchCallback's hooks as Lightning does, for `warmup + steps` steps of 8 images per process."""
    cb = cb or timing.BenchCallback(warmup, steps)
    trainer = SimpleNamespace(global_step=0, world_size=world)
    module = SimpleNamespace(device=torch.device(device, 0) if device == "cuda" else torch.device(device))
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
    cb = timing.EpochTimer()
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


def test_stopwatch_synchronizes_at_both_ends_and_sums_its_regions(fake_cuda):
    """A hand-timed region on CUDA waits for the device before its first clock reading and before its last, so queued
    work counts; regions of one watch add up; elapsed() reads a running region; a CPU watch never synchronizes."""
    watch = timing.Stopwatch("cuda", clock=FakeClock(1.0))  # each reading 1 s after the last
    with watch:
        assert len(fake_cuda) == 1
    with watch:
        pass
    assert len(fake_cuda) == 4 and watch.seconds == pytest.approx(2.0)
    assert watch.start().elapsed() == pytest.approx(1.0) and watch.stop() == pytest.approx(2.0)
    assert watch.seconds == pytest.approx(4.0) and len(fake_cuda) == 7
    with pytest.raises(RuntimeError, match="start"):
        watch.elapsed()
    with timing.Stopwatch("cpu", clock=FakeClock(1.0)) as cpu:
        pass
    assert cpu.seconds == pytest.approx(1.0) and len(fake_cuda) == 7


def test_bench_rows_count_every_process():
    """With `world` processes in lock-step, the row's images/s and batch are rank 0's times world (known clock)."""
    rows = {world: run_callback_window(1, 4, timing.BenchCallback(1, 4, FakeClock(1.0)), "cpu", world).summary(
        torch.device("cpu")) for world in (1, 2)}
    assert rows[1].images_per_s == pytest.approx(8 / 2.0) and rows[2].images_per_s == pytest.approx(8.0)
    assert (rows[1].batch_size, rows[2].batch_size, rows[2].processes) == (8, 16, 2)


def test_ddp_bench_callback_row_comes_from_rank_0(tmp_path):
    """DDPBenchCallback: only rank 0 writes the row; summary reads it back (None where none was written)."""
    out, cpu = tmp_path / "row.json", SimpleNamespace(device=torch.device("cpu"))
    cb = run_callback_window(1, 4, scaling.DDPBenchCallback(1, 4, out), "cpu", world=2)
    cb.on_train_end(SimpleNamespace(is_global_zero=False), cpu)
    assert cb.summary(torch.device("cpu")) is None
    cb.on_train_end(SimpleNamespace(is_global_zero=True), cpu)
    assert cb.summary(torch.device("cpu")).processes == 2 and out.exists()


class WorkClock:
    """A clock that only fn's calls advance, `per_call` seconds each: what a Timer reads is fn's time alone."""

    def __init__(self, per_call: float):
        self.t, self.per_call, self.calls = 0.0, per_call, 0

    def work(self) -> None:
        self.t += self.per_call
        self.calls += 1

    def __call__(self) -> float:
        return self.t


class NoisyClock(WorkClock):
    """A WorkClock whose calls alternate between `per_call` and ten times that: a spread that never narrows."""

    def work(self) -> None:
        self.t += self.per_call * (10 if self.calls % 2 else 1)
        self.calls += 1


def test_time_calls_stops_on_its_budget_when_the_spread_stays_wide():
    """A busy machine's spread may never narrow: time_calls still stops once the budget and four blocks are done
    (Timer's default would wait for the spread until its 10 s cap), and returns every block's figure, spread and all."""
    clock = NoisyClock(0.01)
    seconds = timing.time_calls(clock.work, min_run_time=0.5, clock=clock)
    assert len(seconds) >= 4 and max(seconds) / min(seconds) > 5  # per-call figures, the wide spread kept
    assert clock.t < 2 * 0.5 + 1.0  # the budget, one block past it and the warm-up: far below the 10 s cap


@pytest.mark.parametrize("per_call", [0.3, 1e-3])
def test_time_calls_reads_at_least_four_blocks_in_a_short_budget(per_call):
    """A budget shorter than one block still yields four blocks, so a figure has a spread; 0.3 s calls in a 0.1 s
    budget are four blocks of one call."""
    clock = WorkClock(per_call)
    seconds = timing.time_calls(clock.work, min_run_time=0.1, clock=clock)
    assert len(seconds) >= 4 and seconds == pytest.approx([per_call] * len(seconds))


@pytest.mark.parametrize("per_call", [0.3, 1e-5])
def test_time_calls_with_block_s_reads_four_short_blocks(per_call):
    """block_s (a smoke run's op floors): one warm-up call sizes the blocks to about block_s each, four of them in a
    budget below four blocks, so the whole timing costs about five blocks, not the Timer's up to ten-times-longer
    ones; a call slower than block_s is a block of one call."""
    clock = WorkClock(per_call)
    seconds = timing.time_calls(clock.work, min_run_time=0.002, block_s=0.005, clock=clock)
    assert len(seconds) == 4 and seconds == pytest.approx([per_call] * 4)
    assert clock.calls == 1 + 4 * max(1, round(0.005 / per_call))


def test_time_calls_keeps_the_thread_count():
    """fn runs on this process's threads, not on torch.utils.benchmark.Timer's default of one."""
    before, seen = torch.get_num_threads(), []
    torch.set_num_threads(2)
    try:
        timing.time_calls(lambda: seen.append(torch.get_num_threads()), min_run_time=0.01)
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {2}


def test_latency_ms_is_milliseconds_of_one_forward_pass():
    """compress.latency_ms times forward passes on a (batch, 3, 32, 32) input; a 2 ms pass reads >= 2 ms."""
    import time

    from course_lib.compression import compress

    shapes = []

    def model(x):
        shapes.append(tuple(x.shape))
        time.sleep(2e-3)

    assert compress.latency_ms(model, 4, min_run_time=0.02) >= 2.0
    assert len(shapes) >= 2 and set(shapes) == {(4, 3, 32, 32)}


def test_device_data_module_trains_validates_and_tests(dm_kwargs):
    """The GPU-resident module works in a full Lightning fit (with validation) and test, on any device."""
    import lightning as L

    dm = CIFAR10DataModule(**dm_kwargs, batching=OnDevice())
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(ImageClassifierModule("simple_cnn", num_classes=3), datamodule=dm)  # tiny_folder: 3 classes
    assert "val_acc" in trainer.callback_metrics
    acc = trainer.test(trainer.lightning_module, datamodule=dm, verbose=False)[0]["test_acc"]
    module = trainer.lightning_module.eval()
    with torch.no_grad():
        hits = [(module(x).argmax(1) == y).sum().item() for x, y in dm.test_dataloader()]
    assert acc == pytest.approx(sum(hits) / len(dm.test_set.labels))  # the logged accuracy is a hand count


def test_show_renders_a_table_in_ipython_and_prints_it_elsewhere(monkeypatch, capsys):
    """bench.show hands IPython's display a Table whose text/markdown and text/plain are the same markdown (Jupyter,
    Colab and the website render it as a table); without IPython it prints that markdown."""
    rows = [{"name": "a", "images_per_s": 100.0}, {"name": "b", "images_per_s": 250.0}]
    shown = []
    monkeypatch.setattr(bench.builtins, "display", shown.append, raising=False)
    bench.show(rows, ["name", "images_per_s"])
    (table,) = shown
    assert isinstance(table, bench.Table) and table._repr_markdown_() == repr(table) == bench.table(rows, ["name",
                                                                                                      "images_per_s"])
    assert table.startswith("| name | images_per_s |")
    monkeypatch.delattr(bench.builtins, "display")
    bench.show(rows, ["name", "images_per_s"])
    assert capsys.readouterr().out.startswith("| name | images_per_s |")


def test_rows_table_renders_any_rows_as_a_table(monkeypatch, capsys):
    """bench.rows_table turns any list of dicts into a Table (columns from the first row or named, floats as plain
    numbers, pipes escaped, a note under it); show_rows displays it where IPython runs and prints it elsewhere; more
    than MAX_COLUMNS columns is an error."""
    rows = [{"setting": "lr", "before": 1.5, "after": 686.1}, {"setting": "a|b", "before": 7770.0, "after": 1e-7}]
    table = bench.rows_table(rows, note="Hardware: here")
    assert isinstance(table, bench.Table) and table._repr_markdown_() == str(table)
    assert table.splitlines()[:4] == ["| setting | before | after |", "|---|---|---|", "| lr | 1.50 | 686 |",
                                      "| a\\|b | 7,770 | 1e-07 |"]
    assert table.endswith("\n\nHardware: here")
    assert bench.rows_table(rows, ["after"]).splitlines()[0] == "| after |"
    assert bench.rows_table([{"a": 1}], ["a", "b"]).splitlines()[2] == "| 1 |  |"  # a missing key: an empty cell
    with pytest.raises(ValueError, match="columns"):
        bench.rows_table([dict.fromkeys("abcdefg", 1)])
    shown = []
    monkeypatch.setattr(bench.builtins, "display", shown.append, raising=False)
    bench.show_rows(rows)
    assert shown == [bench.rows_table(rows)]
    monkeypatch.delattr(bench.builtins, "display")
    bench.show_rows(rows)
    assert capsys.readouterr().out.startswith("| setting | before | after |")


def test_measures_reads_recorded_figures_in_human_units():
    """bench.measures: a recorded figure's name with its note, and its value as a whole number or a plain number with
    its unit: '1 op or fused C++ kernel', never '1 ops'; '8 ops'; '9.65 s'; a share as the lesson recorded it."""
    saved = [{"name": "kernels", "value": 1.0, "unit": "ops or fused C++ kernels", "note": ""},
             {"name": "eager ops", "value": 8.0, "unit": "ops", "note": "GELU"},
             {"name": "compile time", "value": 9.6543, "unit": "s", "note": "cold cache"},
             {"name": "accuracy", "value": 59.37, "unit": "%", "note": ""},
             {"name": "images", "value": 50000.0, "unit": "", "note": ""}]
    assert bench.measures(saved) == [
        {"measure": "kernels", "value": "1 op or fused C++ kernel"},
        {"measure": "eager ops (GELU)", "value": "8 ops"},
        {"measure": "compile time (cold cache)", "value": "9.65 s"},
        {"measure": "accuracy", "value": "59.4 %"},
        {"measure": "images", "value": "50,000"}]


def test_default_columns_show_memory_only_for_gpu_rows():
    """bench.table's default columns: peak_mem_mb where the rows ran on a GPU (on a CPU it is the process's resident
    memory), and data_wait only where a lesson names it."""
    row = bench_row("a", 100.0, step_ms=5.0, peak_mem_mb=900.0, data_wait=0.1)
    cpu = bench.table([row]).splitlines()[0]
    gpu = bench.table([dataclasses.replace(row, device="cuda:0")]).splitlines()[0]
    assert "peak_mem_mb" not in cpu and "peak_mem_mb" in gpu and "data_wait" not in cpu + gpu
    assert "data_wait" in bench.table([row], ["name", "data_wait"])


def test_a_not_called_speedup_cell_uses_the_verdicts_words_and_warm_up_reads_as_a_duration():
    """A sure gap under 5 % reads 'no practical difference' in the table, as on the verdict line; 'no difference'
    stays for a gap the rule could not be sure of; warmup_s prints as a duration under 'warm-up'."""
    base = (100.0, 101.0, 99.0, 100.0, 102.0, 98.0)
    rounds = {"a": (base, 0.0247), "b": (tuple(r * 1.02 for r in base), 0.123),
              "c": ((101.0, 99.0, 100.0, 103.0, 97.0, 100.0), 1.5)}  # name: rounds, warm-up seconds
    rows = bench.add_speedups([bench_row(n, statistics.median(r), rounds=r, warmup_s=w) for n, (r, w) in
                               rounds.items()], "a")
    assert [bench._cell(bench.cells(r), "speedup") for r in rows[1:]] == [verdict.PRACTICAL, verdict.NOISE]
    assert verdict.PRACTICAL in verdict.compare(list(rounds["b"][0]), list(base), "b", "a", paired=True)
    assert [bench._cell(bench.cells(r), "warmup_s") for r in rows] == ["24.7 ms", "123 ms", "1.50 s"]
    assert "| warm-up |" in bench.table(rows, ["name", "warmup_s", "speedup"])
