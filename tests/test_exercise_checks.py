"""The exercises' checks without a clock: grading from injected costs (met, missed, noisy), and each lesson's
mechanism check on the starter (fails), the shortcuts a learner might try (fail) and the reference solution
(passes). Real timings: one run per exercise in tests/test_exercises.py with generous bars, and in `make course`."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from course_lib import exercises
from course_lib.data.data import crop_flip, to_float
from course_lib.exercises import Grading, forbidden, inference, solution, starter, training


# ---- grading, with injected costs ---------------------------------------------------------------------------
def test_grade_passes_when_the_median_ratio_meets_the_target(capsys):
    assert Grading().grade("Ex", [4.0, 4.0, 4.0], [1.0, 2.0, 1.0], target=3.0) is True  # medians 4 and 1
    out = capsys.readouterr().out
    assert "4.00x" in out and "target >= 3x" in out and "2.00-4.00x" in out and "passed" in out


def test_grade_misses_below_the_target(capsys):
    assert Grading().grade("Ex", [2.0, 2.0], [1.0, 1.0], target=3.0) is False
    out = capsys.readouterr().out
    assert "not yet" in out and "straddle" not in out
    assert Grading().grade("Ex", [4.0], [1.0], target=3.0) is True  # one round (a count): no per-round spread
    out = capsys.readouterr().out
    assert "measured once" in out and "rounds" not in out


def test_grade_on_noisy_rounds_lets_the_median_decide_and_says_so(capsys):
    """Rounds 1.5x, 3.5x, 3.2x: the median (3.2x of the medians) passes, and the verdict flags the spread."""
    assert Grading().grade("Ex", [1.5, 3.5, 3.2], [1.0, 1.0, 1.0], target=3.0) is True
    assert "straddle the target" in capsys.readouterr().out
    assert Grading().grade("Ex", [1.5, 2.0, 3.5], [1.0, 1.0, 1.0], target=3.0) is False  # median round 2.0x


def test_grade_rejects_bad_costs():
    with pytest.raises(ValueError, match="positive"):
        Grading().grade("Ex", [1.0], [0.0], target=2.0)
    with pytest.raises(ValueError, match="one baseline and one learner cost per round"):
        Grading().grade("Ex", [1.0, 2.0], [1.0], target=2.0)


def test_ratio_check_alternates_the_two_sides():
    order = []
    Grading().ratio_check("Ex", lambda: order.append("mine") or 1.0, lambda: order.append("base") or 2.0, 1.5,
                          repeats=2)
    assert order == ["base", "mine", "base", "mine"]


def test_grading_collects_grades_and_times_failing_code_only_when_asked(capsys):
    """A Grading keeps each grade's ratio and round spread; time_failing lets a failed mechanism through for that
    Grading only (the margins script times starters so), never for another."""
    grading = Grading()
    grading.grade("Ex", [4.0, 3.0, 5.0], [2.0, 1.0, 2.0], target=3.0)
    assert grading.mechanism("Ex", ["a problem"]) is False
    assert [(g.ratio, g.low, g.high, g.passed) for g in grading.grades] == [(2.0, 2.0, 3.0, False)]
    assert Grading(time_failing=True).mechanism("Ex", ["a problem"]) is True
    assert Grading().mechanism("Ex", ["a problem"]) is False
    assert "timed anyway" in capsys.readouterr().out


def test_forbidden_sees_calls_through_imported_names():
    """A function imported into a learner's namespace is still caught (the check watches the code object)."""
    x = torch.zeros(2, 3, 4, 4)
    with forbidden(crop_flip) as called:
        crop_flip(x, torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, dtype=torch.bool), 1)
    assert called == ["crop_flip"]
    with forbidden(crop_flip) as called:
        x.flip(3)
    assert called == []


def test_forbidden_blocks_nest_and_leave_no_hook_behind():
    """An inner block does not blind the outer one (lesson 03 watches decoders inside its pipeline watch), and the
    profile hook is gone after the outer block."""
    before = sys.getprofile()
    with forbidden(crop_flip) as outer:
        with forbidden(to_float) as inner:
            to_float(torch.zeros(1, 3, 2, 2, dtype=torch.uint8))
            crop_flip(torch.zeros(1, 3, 4, 4), torch.zeros(2, 1, dtype=torch.long), torch.zeros(1, dtype=torch.bool),
                      1)
    assert (outer, inner) == (["crop_flip"], ["to_float"])
    assert sys.getprofile() is before


# ---- lesson 01: batch a classifier, prediction first ------------------------------------------------------------
def fake_ceil(spread: float = 1.1):
    """Ceilings with a known spread (slowest / fastest block): the prediction's tolerance is 2x that."""
    from course_lib.measure import ceilings

    rows = {name: ceilings.Ceiling(name, kind, (value, value * spread)) for name, kind, value in
            (("matmul fp32", "compute", 1e11), ("memory", "memory", 3e10), ("per op", "overhead", 3e-6))}
    return ceilings.Ceilings("test machine", "cpu", "full", 2, torch.__version__, rows)


def timed(seconds: dict):
    """An injected timer: the seconds of one call, by which classifier ran (the starter is the baseline)."""
    def timer(fn):
        with forbidden(training.one_at_a_time) as called:
            fn()
        return seconds["starter" if called else "yours"]
    return timer


def test_01_starter_pastes_and_the_old_shortcut_fail_the_mechanism():
    """The starter, a paste of the lesson's evaluation (loops.predict), and the old answer (a bigger batch and a
    higher learning rate in a training loop) fail without a clock."""
    from torch.utils.data import DataLoader

    from course_lib.training.loops import predict

    def pasted_predict(net, images):  # section 4's cell: predict(model, test_loader, DEVICE)
        return predict(net, DataLoader(list(zip(images, images[:, 0, 0, 0])), batch_size=256))[0]

    def old_shortcut(net, images):  # the old exercise's answer: batch 32, lr 0.05 (it trains, labels nothing)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for chunk in images.split(32):
            opt.zero_grad()
            net(chunk).sum().backward()
            opt.step()

    def wrong_labels(net, images):
        return torch.zeros(len(images), dtype=torch.long)

    for fn in (starter("01", 1)["classify"], pasted_predict, old_shortcut, wrong_labels):
        assert exercises.check_01_batching(fn, measure=False) is False, fn.__name__


def test_01_solution_passes_and_a_missing_or_wild_prediction_fails_with_injected_times(capsys):
    sol = solution("01")
    assert exercises.check_01_batching(sol["classify"], measure=False) is True
    ceil = fake_ceil()
    predicted = sol["predict_speedup"](ceil)
    assert predicted > 1
    times = timed({"starter": predicted * 1e-3, "yours": 1e-3})  # measured exactly as predicted
    assert exercises.check_01_batching(sol["classify"], sol["predict_speedup"], ceil=ceil, timer=times,
                                       target=1.0) is True
    assert "2.20x" in capsys.readouterr().out  # the tolerance: 2x times the ceilings' 1.1 spread
    assert exercises.check_01_batching(sol["classify"], None, ceil=ceil, timer=times, target=1.0) is False
    wild = timed({"starter": 10 * predicted * 1e-3, "yours": 1e-3})  # 10x more than predicted
    assert exercises.check_01_batching(sol["classify"], sol["predict_speedup"], ceil=ceil, timer=wild,
                                       target=1.0) is False
    slow = timed({"starter": 1e-3, "yours": 1e-3})  # no faster: the measured gain misses the target
    assert exercises.check_01_batching(sol["classify"], lambda c: 1.0, ceil=ceil, timer=slow) is False


def test_prediction_grading_tolerates_the_ceilings_spread():
    from course_lib.exercises import core

    assert core.prediction_tolerance(fake_ceil(1.5)) == pytest.approx(3.0)
    assert core.grade_prediction("x", 4.0, 7.9, 2.0) is True and core.grade_prediction("x", 4.0, 8.1, 2.0) is False
    assert core.grade_prediction("x", True, 1.0, 2.0) is False and core.grade_prediction("x", -1, 1.0, 2.0) is False


def test_05_starter_and_the_two_edits_without_a_prediction_fail_the_solution_passes():
    """The starter breaks the graph; the two edits alone (the solution's activation, no prediction) and a wild
    prediction fail once timed (injected times); the solution's prediction, measured as predicted, passes."""
    from course_lib.exercises import compute

    sol, ceil = solution("05"), fake_ceil()
    assert exercises.check_05_fusion(starter("05", 1)["activation"], measure=False) is False
    x = compute.inputs_05()
    predicted = sol["predict_speedup"](ceil, x)
    as_predicted = (lambda f: predicted if f is compute.eager_chain else 1.0)  # noqa: E731  (seconds per call)
    assert exercises.check_05_fusion(sol["activation"], None, ceil=ceil, timer=as_predicted) is False
    assert exercises.check_05_fusion(sol["activation"], lambda c, x: 50 * predicted, ceil=ceil,
                                     timer=as_predicted) is False
    assert exercises.check_05_fusion(sol["activation"], sol["predict_speedup"], ceil=ceil, timer=as_predicted)


# ---- lesson 02: keep the debugging setup's purpose, drop its cost --------------------------------------------
@pytest.fixture(scope="module")
def trainer_data():
    """Lesson 02's device batches, set up once for the module."""
    return training.inputs_02()


def test_02_starter_and_shortcuts_fail(trainer_data):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    settings = starter("02", 3)["trainer_settings"]
    assert exercises.check_02_trainer(settings, data=trainer_data, measure=False) is False  # anomaly detection still on
    assert exercises.check_02_trainer(lambda: dict(barebones=True), data=trainer_data, measure=False) is False
    no_logs = lambda: dict(logger=False, enable_checkpointing=False)  # noqa: E731
    assert exercises.check_02_trainer(no_logs, data=trainer_data, measure=False) is False

    def no_guard(tmp=Path(__import__("tempfile").mkdtemp())):
        return dict(logger=CSVLogger(tmp), callbacks=[ModelCheckpoint(dirpath=tmp / "ckpt")])
    assert exercises.check_02_trainer(no_guard, data=trainer_data, measure=False) is False  # a NaN run goes on


def test_02_solution_passes_the_mechanism(trainer_data):
    assert exercises.check_02_trainer(solution("02")["trainer_settings"], data=trainer_data, measure=False) is True


# ---- lesson 03: a pipeline built by the learner ---------------------------------------------------------------
def test_03_starter_and_library_pipeline_fail(monkeypatch):
    from course_lib.base import config
    from course_lib.training import runs

    monkeypatch.delenv(config.DATA_ROOT_ENV)  # the library decodes the 50k folder: into the cache the notebooks use

    assert exercises.check_03_data_wait(starter("03", 1)["make_data"], measure=False) is False
    library = lambda b, s: runs.datamodule("03_gpu_and_data", batch_size=b)  # noqa: E731
    assert exercises.check_03_data_wait(library, measure=False) is False


def test_03_workers_fail_and_the_solution_passes_the_mechanism(capsys):
    """More workers (the one-token edit `num_workers=2`) move the same decoding onto other processes: the mechanism
    refuses them; decoding once in setup passes."""
    from course_lib.data import jpeg

    workers = lambda b, s: jpeg.JpegDataModule(b, subset=s, num_workers=2)  # noqa: E731
    assert exercises.check_03_data_wait(workers, measure=False) is False
    assert "DataLoader workers decoded" in capsys.readouterr().out
    assert exercises.check_03_data_wait(solution("03")["make_data"], measure=False) is True


# ---- lesson 07: the learner's own int8 program -----------------------------------------------------------------
def _07_inputs():
    from course_lib.training.models import ResNet9

    torch.manual_seed(0)
    net = ResNet9(width=8).eval()
    g = torch.Generator().manual_seed(1)
    return net, [torch.randn(16, 3, 32, 32, generator=g)], [(torch.randn(64, 3, 32, 32, generator=g), None)]


def test_07_starter_and_shortcuts_fail():
    from course_lib.compression import compress

    net, calib, held = _07_inputs()
    for quantize in (starter("07", 2)["quantize"], lambda m, c: compress.quantize_ptq(m, c),
                     lambda m, c: compress.export(m).module(), lambda m, c: compress.quantize_linear_int8(m)):
        assert exercises.check_07_inference(quantize, net, calib, held, measure=False) is False


def test_06_prediction_graded_against_injected_rounds(capsys):
    """No processes, no clock: the solution's latency-and-bytes model of one flat all-reduce against one per tensor
    passes against rounds near it (2 gloo processes on the EPYC: 196 us per call, 0.99 GB/s) and within the rounds'
    spread; the starter's None, a bytes-only model (no gain) and the tensor count alone with no bytes fail."""
    from course_lib.exercises import allreduce

    link, mine = (196e-6, 0.99e9), solution("06")["predict_speedup"]
    from course_lib.parallel import parallel
    predicted = mine(*link, parallel.deep_mlp(), 2)
    assert 20 < predicted < 50  # 50 calls' latency against one, the same ~100 kB at the bandwidth
    base, fast = [0.0110, 0.0100, 0.0120], [0.00055, 0.0005, 0.0006]  # measured ratio 20x, rounds 1.2x apart
    assert allreduce.prediction_06(mine, link, 2, base, fast) is True
    assert allreduce.prediction_06(starter("06", 3)["predict_speedup"], link, 2, base, fast) is False
    assert "write your predicted speed-up" in capsys.readouterr().out
    assert allreduce.prediction_06(None, link, 2, base, fast) is False
    assert allreduce.prediction_06(lambda lat, bw, m, w: 1.0, link, 2, base, fast) is False  # bytes alone: no gain
    assert allreduce.prediction_06(lambda lat, bw, m, w: 200.0, link, 2, base, fast) is False  # wild


def test_prediction_07_graded_against_an_injected_speed_up(capsys):
    """No clock, no compile: the solution's prediction from the roofs (products at each format's rate) passes against
    a measured speed-up 1.4x below it (the committed EPYC run: roofs 3.50x, measured 2.48x); the starter's None, the
    fp32-only roof (no gain) and a prediction without the Linear's fp32 share far off do not."""
    from course_lib.measure import ceilings
    from course_lib.training.models import ResNet9

    ceil = fake_ceil(1.1)
    ceil.rows["matmul int8"] = ceilings.Ceiling("matmul int8", "compute", (4e11, 4.4e11))
    net, x = ResNet9(width=8).eval(), torch.randn(64, 3, 32, 32)
    mine = solution("07")["predict_speedup"]
    roofs = mine(ceil, net, x)
    assert 3.5 < roofs < 4.0  # the convolutions at 4x the rate, the small Linear at 1x
    assert inference.prediction_07(mine, ceil, net, x, measured=roofs / 1.4) is True
    assert inference.prediction_07(starter("07", 2)["predict_speedup"], ceil, net, x, measured=2.5) is False
    assert "write your predicted speed-up" in capsys.readouterr().out
    assert inference.prediction_07(None, ceil, net, x, measured=2.5) is False
    assert inference.prediction_07(lambda c, m, x: 1.0, ceil, net, x, measured=roofs / 1.4) is False  # fp32's roof
    assert inference.prediction_07(lambda c, m, x: 40.0, ceil, net, x, measured=roofs / 1.4) is False  # wild


def pasted_cell_16(model, calibration):
    """Lesson 07's cell 16 pasted: the PT2E steps with the lesson's quantizer, which quantize the Linear too."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from course_lib.compression import compress

    prepared = prepare_pt2e(compress.export(model).module(), compress.x86_quantizer())
    with torch.no_grad():
        for x in calibration:
            prepared(x)
    return compress.drop_unused_attributes(convert_pt2e(prepared))


def test_07_pasting_the_lessons_ptq_cell_fails_and_the_solution_keeps_the_linear_in_fp32(capsys):
    net, calib, held = _07_inputs()
    assert inference.int8_layers(pasted_cell_16(net, calib), net) == (8, 8, 1)
    assert exercises.check_07_inference(pasted_cell_16, net, calib, held, measure=False) is False
    assert "keep the classifier's Linear in fp32" in capsys.readouterr().out
    program = solution("07")["quantize"](net, calib)
    int8, qdq = inference.int8_graph_report(program)
    assert inference.int8_layers(program, net) == (8, 8, 0) and int8 == 8 and qdq > 0  # 8 convolutions, fp32 Linear
    ok, _ = inference.mechanism_07(solution("07")["quantize"], net, calib, grading=Grading())
    assert ok


# ---- lesson 08: one batch operation, not the library's kernel ------------------------------------------------
def test_08_starter_and_shortcuts_fail():
    from course_lib.data import data

    assert exercises.check_08_batch_augment(starter("08", 2)["augment"], measure=False) is False  # one image at a time
    kernel = lambda x, s, f, p: data.crop_flip(data.to_float(x), s, f, p, mode="reflect")  # noqa: E731
    assert exercises.check_08_batch_augment(kernel, measure=False) is False
    no_flip = lambda x, s, f, p: data.to_float(x)  # noqa: E731  (fast, wrong)
    assert exercises.check_08_batch_augment(no_flip, measure=False) is False
    assert exercises.check_08_batch_augment(pasted_cell_30, measure=False) is False  # the lesson's my_batches


def pasted_cell_30(x, shifts, flips, pad=2):
    """Lesson 08's cell 30 (my_batches) pasted as augment: a batch pad and mirror, but each window cut per image."""
    import torch.nn.functional as F

    from course_lib.data import data

    mean, std = (torch.tensor(v).view(-1, 1, 1) * 255 for v in (data.CIFAR10_MEAN, data.CIFAR10_STD))
    z = F.pad(x.float(), (pad,) * 4, mode="reflect")  # (B, 3, 36, 36)
    z = torch.stack([img[:, a:a + 32, b:b + 32] for img, a, b in zip(z, shifts[0].tolist(), shifts[1].tolist())])
    z = torch.where(flips[:, None, None, None], z.flip(3), z)
    return (z - mean) / std


def test_08_solution_passes_the_mechanism():
    assert exercises.check_08_batch_augment(solution("08")["augment"], measure=False) is True


def test_warm_up_08_asks_for_steps_at_a_batch_the_lesson_does_not_print(capsys):
    """Lesson 08's warm-up 1 at twice the run's batch (cell 32 prints the steps at the run's own batch)."""
    from types import SimpleNamespace

    from course_lib.exercises import warmups

    dm = SimpleNamespace(train_set=torch.utils.data.TensorDataset(torch.zeros(1000, 1)))
    assert warmups.steps_at_batch("Exercise 1", 1, dm, batch=512) is True  # 1000 // 512, the partial batch dropped
    with pytest.raises(AssertionError):
        warmups.steps_at_batch("Exercise 1", 4, dm, batch=256)  # 1000 // 256 = 3 full batches
    assert warmups.steps_at_batch("Exercise 1", None, dm, batch=512) is None
