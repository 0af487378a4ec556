"""The hardware matrix: every decision the course makes by hardware, run under every emulated class
(hardware.CLASSES, through the hardware_class fixture), against its expected answer in one table, EXPECTED.

A row's answers are the course's policy, written once here: a change of policy changes this table, and a decision
that reads the hardware around the seam (CPU flags or CUDA's capability on its own) shows up as a class whose answer
does not follow the class."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from course_lib.base import config, hardware, machines
from course_lib.base.errors import CourseError
from course_lib.compression import compress
from course_lib.exercises import inference
from course_lib.measure import ceilings, flops
from course_lib.training import muon
from scripts import gpu_check

CLASSES = list(hardware.CLASSES)
FP32, BF16 = torch.float32, torch.bfloat16
ALL_GPU_FORMATS = ["fp32", "tf32", "bf16", "fp16", "int8"]


def device() -> str:
    """The device a decision is asked for: the GPU on a GPU class, else the CPU."""
    return "cuda" if hardware.has_gpu() else "cpu"


def outcome(call) -> str:
    """A decision that may refuse: its answer, or 'refused' where it raises the course's clear error."""
    try:
        return call()
    except CourseError:
        return "refused"


#: decision -> what it asks of the course, called under the emulated class
DECISIONS = {
    "default precision": lambda: hardware.choose_precision(),
    "explicit bf16-mixed": lambda: outcome(lambda: hardware.choose_precision("bf16-mixed")),
    "explicit 16-mixed": lambda: outcome(lambda: hardware.choose_precision("16-mixed")),
    "Newton-Schulz dtype": lambda: muon.iteration_dtype(device()),
    "int8 7-bit activations": compress.int8_reduce_range,
    "int8 exercise target": inference.int8_target,
    "ceilings' formats": lambda: ceilings.formats(device()),
    "lesson 04 full training images": lambda: config.run_size("04_mixed_precision", size="full").train_subset,
    "lesson 08 full batch": lambda: config.run_size("08_capstone", size="full").batch_size,
    "gpu_check compiles in fp16": lambda: any(c["precision"] == "16-mixed" and c["model"].get("compile")
                                              for c in gpu_check.configs()),
    "GPU peak in the trained format": lambda: (flops.peak_tflops(precision=hardware.number_format(
        hardware.choose_precision())) is not None) if hardware.has_gpu() else None,
}

NATIVE, EMULATED = inference.INT8_TARGET["native"], inference.INT8_TARGET["emulated"]
CPU_FULL_04 = config.LESSON_SCALES[("04_mixed_precision", "full", "cpu")]["train_subset"]
CPU_EMULATED_04 = config.LESSON_SCALES[("04_mixed_precision", "full", config.CPU_EMULATED_BF16)]["train_subset"]
CPU_08 = config.LESSON_SCALES[("08_capstone", "full", "cpu")]["batch_size"]
GPU_08 = config.LESSON_SCALES[("08_capstone", "full", "gpu")]["batch_size"]

#: the one table: class -> decision -> expected answer
EXPECTED = {
    "cpu-avx2": {"default precision": "32-true", "explicit bf16-mixed": "bf16-mixed", "explicit 16-mixed": "refused",
                 "Newton-Schulz dtype": FP32, "int8 7-bit activations": True, "int8 exercise target": EMULATED,
                 "ceilings' formats": ["fp32"], "lesson 04 full training images": CPU_EMULATED_04,
                 "lesson 08 full batch": CPU_08, "gpu_check compiles in fp16": False,
                 "GPU peak in the trained format": None},
    "cpu-avx512": {"default precision": "32-true", "explicit bf16-mixed": "bf16-mixed",
                   "explicit 16-mixed": "refused", "Newton-Schulz dtype": FP32, "int8 7-bit activations": False,
                   "int8 exercise target": NATIVE, "ceilings' formats": ["fp32", "int8"],
                   "lesson 04 full training images": CPU_EMULATED_04, "lesson 08 full batch": CPU_08,
                   "gpu_check compiles in fp16": False, "GPU peak in the trained format": None},
    "cpu-avx512-bf16": {"default precision": "bf16-mixed", "explicit bf16-mixed": "bf16-mixed",
                        "explicit 16-mixed": "refused", "Newton-Schulz dtype": BF16, "int8 7-bit activations": False,
                        "int8 exercise target": NATIVE, "ceilings' formats": ["fp32", "bf16", "int8"],
                        "lesson 04 full training images": CPU_FULL_04, "lesson 08 full batch": CPU_08,
                        "gpu_check compiles in fp16": False, "GPU peak in the trained format": None},
    "cpu-amx": {"default precision": "bf16-mixed", "explicit bf16-mixed": "bf16-mixed", "explicit 16-mixed": "refused",
                "Newton-Schulz dtype": BF16, "int8 7-bit activations": False, "int8 exercise target": NATIVE,
                "ceilings' formats": ["fp32", "bf16", "int8"], "lesson 04 full training images": CPU_FULL_04,
                "lesson 08 full batch": CPU_08, "gpu_check compiles in fp16": False,
                "GPU peak in the trained format": None},
    "gpu-t4": {"default precision": "16-mixed", "explicit bf16-mixed": "refused", "explicit 16-mixed": "16-mixed",
               "Newton-Schulz dtype": FP32, "int8 7-bit activations": False, "int8 exercise target": NATIVE,
               "ceilings' formats": ["fp32", "fp16"], "lesson 04 full training images": None,
               "lesson 08 full batch": GPU_08, "gpu_check compiles in fp16": True,
               "GPU peak in the trained format": True},
    **{name: {"default precision": "bf16-mixed", "explicit bf16-mixed": "bf16-mixed",
              "explicit 16-mixed": "16-mixed", "Newton-Schulz dtype": BF16, "int8 7-bit activations": False,
              "int8 exercise target": NATIVE, "ceilings' formats": ALL_GPU_FORMATS,
              "lesson 04 full training images": None, "lesson 08 full batch": GPU_08,
              "gpu_check compiles in fp16": False, "GPU peak in the trained format": True}
       for name in ("gpu-a100", "gpu-l4", "gpu-h100")},
}


def test_the_table_covers_every_class_and_every_decision():
    assert sorted(EXPECTED) == sorted(hardware.CLASSES)
    assert all(sorted(row) == sorted(DECISIONS) for row in EXPECTED.values())


@pytest.mark.parametrize("decision", list(DECISIONS))
@pytest.mark.parametrize("cls", CLASSES)
def test_decision_under_every_class(hardware_class, cls, decision):
    hardware_class(cls)
    assert DECISIONS[decision]() == EXPECTED[cls][decision]


@pytest.mark.parametrize("cls", CLASSES)
def test_facts_and_label_say_the_class_is_emulated(hardware_class, cls):
    """What facts() reports is the class's, and every printed label says the hardware is emulated (no figure measured
    under a class can pass for that class's own)."""
    spec = hardware_class(cls)
    info = hardware.facts()
    assert info["cpu_bf16_native"] is bool(spec.flags & set(hardware.CPU_BF16_FLAGS))
    assert info["cpu_int8_native"] is bool(spec.flags & set(hardware.CPU_INT8_FLAGS))
    assert info["cpu_class"] == (cls if spec.gpu is None else "cpu-avx512")  # a GPU class's host: AVX-512
    assert info["gpu"] == (spec.gpu or {}).get("gpu")
    assert hardware.has_gpu() is (spec.gpu is not None)
    assert f"emulating {cls}" in hardware.label()


def test_an_unknown_class_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(hardware.HARDWARE_ENV, "cpu-z80")
    with pytest.raises(CourseError, match="cpu-avx2"):
        hardware.cpu_flags()


def test_this_machines_own_class_is_runnable_and_ci_also_runs_another():
    """own_class() is among the classes this CPU executes natively; other_class() answers 'native bf16?' the other way,
    so make test's second pass (the Makefile's HARDWARE_TESTS) covers the policy this machine does not pick."""
    flags = hardware.own_cpu_flags()
    own, other = machines.own_class(flags), machines.other_class(flags)
    assert own in machines.runnable_classes(flags)
    assert machines.native_bf16(hardware.CLASSES[own].flags) is not machines.native_bf16(hardware.CLASSES[other].flags)


@pytest.mark.parametrize("cls", hardware.CPU_CLASSES)
def test_each_cpu_class_is_its_own_class(cls):
    """Each class's flags map back to it, and it runs its own instruction sets (so own_class is not stuck on one)."""
    flags = hardware.CLASSES[cls].flags
    assert machines.own_class(flags) == cls and cls in machines.runnable_classes(flags)


FULL_LESSONS = sorted(config.LESSON_BUDGET_S)


def test_the_budgets_fit_make_course():
    """The lessons' budgets sum to less than make course's, leaving room for the fixed costs the rule does not scale,
    and every lesson of the course has one (a new lesson without a budget fails here)."""
    assert sum(config.LESSON_BUDGET_S.values()) <= 0.9 * config.COURSE_BUDGET_S
    assert FULL_LESSONS == sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "notebooks").glob("0*.ipynb"))


@pytest.mark.parametrize("cls", hardware.CPU_CLASSES)
@pytest.mark.parametrize("speed", [0.25, 1.0, 3.0])  # this CPU's fp32 rate over the reference run's
def test_full_size_fits_the_budget_under_every_cpu_class(monkeypatch, hardware_class, cls, speed):
    """On every CPU class and speed, each lesson's full size is predicted within its budget (or is already at the
    smoke size's floor), never grows past the listed size, and keeps the repeats and epochs its verdicts need."""
    hardware_class(cls)
    native = hardware.cpu_bf16_native()
    ref_gflops, ref_s = config.REFERENCE_RUNS[native]
    monkeypatch.setattr(config, "cpu_gflops", lambda: ref_gflops * speed)
    for lesson in FULL_LESSONS:
        fitted, listed = config.budget(lesson), config.run_size(lesson, size="full", fit=False)
        size = config.run_size(lesson, size="full")
        native_s = config.REFERENCE_RUNS[True][1][lesson] * config.REFERENCE_RUNS[True][0] / (ref_gflops * speed)
        assert fitted.predicted_s == pytest.approx(max(ref_s[lesson] / speed, native_s))  # emulated: at least native
        floor = config.run_size(lesson, size="smoke")  # the lesson's smoke size: the least a full run keeps
        images = [s.train_subset or config.TRAIN_IMAGES for s in (size, listed, floor)]
        steps = [size.bench_steps, listed.bench_steps, floor.bench_steps]
        for now, full, least in (images, steps):
            assert min(full, least) <= now <= full, lesson
            assert now <= max(least, round(fitted.fraction * full)) + 1, lesson  # shrunk as the rule says
        share = max(images[0] / images[1], steps[0] / steps[1])  # of the listed work, by the larger knob
        assert fitted.predicted_s * share <= 1.05 * fitted.budget_s or images[0] == images[2] or steps[0] == steps[2]
        assert (size.repeats, size.epochs, size.eval_subset) == (listed.repeats, listed.epochs, listed.eval_subset)
        assert (size == listed) is (fitted.fraction == 1.0)
        assert f"time budget {fitted.budget_s} s" in fitted.line() and "GFLOP/s" in fitted.line()


@pytest.mark.parametrize("cls", hardware.GPU_CLASSES)
def test_a_gpu_runs_the_listed_full_size(monkeypatch, hardware_class, cls):
    hardware_class(cls)
    monkeypatch.setattr(config, "cpu_gflops", lambda: 1.0)  # a very slow CPU: it must not matter on a GPU
    assert all(config.budget(lesson) is None for lesson in FULL_LESSONS)
    assert config.run_size("08_capstone", size="full") == config.run_size("08_capstone", gpu=True, size="full")


def test_without_saved_ceilings_the_listed_size_and_says_so(monkeypatch, hardware_class):
    hardware_class("cpu-avx2")
    monkeypatch.setattr(config, "cpu_gflops", lambda: None)
    fitted = config.budget("03_gpu_and_data")
    assert fitted.fraction == 1 and "no full-size ceilings" in fitted.line()
    assert config.run_size("03_gpu_and_data", size="full") == config.run_size("03_gpu_and_data", size="full",
                                                                              fit=False)


def test_cpu_gflops_reads_only_a_full_size_figure_of_this_setting(monkeypatch, tmp_path):
    """lesson 00's saved fp32 rate sizes the runs only where it was measured at full size, with this thread count and
    torch: a smoke run's figure (the tests' own, at one thread) would shrink the course for nothing."""
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path))
    assert config.cpu_gflops() is None
    target = config.ceilings_file("cpu")
    target.parent.mkdir(parents=True)
    saved = {"size": "full", "threads": torch.get_num_threads(), "torch": torch.__version__,
             "rows": {"matmul fp32": {"values": [1e11, 2e11, 3e11]}}}
    target.write_text(json.dumps(saved))
    assert config.cpu_gflops() == pytest.approx(300.0)  # the fastest block, as ceilings.Ceiling.best
    target.write_text(json.dumps({**saved, "size": "smoke"}))
    assert config.cpu_gflops() is None


WORDS = {"faster": lambda r: r > 1, "slower": lambda r: r < 1}


@pytest.mark.parametrize("cls", hardware.CPU_CLASSES)
@pytest.mark.parametrize("ratio", [0.6, 0.98, 1.02, 1.3, 1.87, 4.0])
def test_printed_int8_sentence_holds_on_every_class(hardware_class, cls, ratio):
    """Lesson 07's hardware-dependent sentence, rendered under every CPU class for measured ratios on both sides of
    1: its direction is the measurement's, the unit it names is the class's, and a win is never 'barely' one."""
    spec = hardware_class(cls)
    line = compress.int8_speed_line(ratio, "compiled fp32")
    said = [word for word in WORDS if f"x {word} than" in line]
    assert len(said) == 1 and WORDS[said[0]](ratio) or ratio == 1, line
    unit = next((f for f in ("amx_int8", "avx512_vnni", "avx_vnni") if f in spec.flags), None)  # its fastest
    assert (f"({unit} here" if unit else "(no VNNI/AMX here") in line, line
    assert "barely" not in line and len(line) <= 120
    assert "weight bytes" not in line and "cost more than" not in line  # measured, no guessed cause
    assert ("within 5 %" in line) is (1 / 1.05 < ratio < 1.05)


@pytest.mark.parametrize("cls", CLASSES)
def test_printed_newton_schulz_sentence_holds_on_every_class(hardware_class, cls):
    """The capstone's Newton-Schulz line names the dtype the policy chose and a reason true on the class."""
    hardware_class(cls)
    dtype = muon.iteration_dtype(device())
    line = muon.describe(dtype)
    native = hardware.facts()["bf16_native"] if hardware.has_gpu() else hardware.cpu_bf16_native()
    assert ("bfloat16" in line) is native and ("no native bf16" in line) is (not native)


@pytest.mark.parametrize("cls", hardware.CPU_CLASSES)
def test_printed_int8_roof_lines_hold_on_every_class(hardware_class, cls):
    """Lesson 07's roof lines: an int8 roof only where the class has an int8 unit and an int8 ceiling exists, never
    a share above 100 % for times no faster than the roofs, and short lines."""
    spec = hardware_class(cls)
    rows = {"matmul fp32": ceilings.Ceiling("matmul fp32", "compute", (1e11,)),
            "memory": ceilings.Ceiling("memory", "memory", (1e10,))}
    if spec.flags & set(hardware.CPU_INT8_FLAGS):
        rows["matmul int8"] = ceilings.Ceiling("matmul int8", "compute", (4e11,))
    ceil = ceilings.Ceilings("test", "cpu", "full", 1, torch.__version__, rows)
    lines = compress.int8_roof_lines(1e9, 400_000, int8_s=5e-3, fp32_s=2e-2, ceil=ceil)
    native = bool(spec.flags & set(hardware.CPU_INT8_FLAGS))
    assert ("of the int8 roof" in lines[1]) is native and ("no int8 roof here" in lines[1]) is (not native)
    assert all(len(line) <= 120 for line in lines), lines
    assert "50 % of the fp32 roof" in lines[0] and (not native or "50 % of the int8 roof" in lines[1])
