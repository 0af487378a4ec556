"""The hardware matrix: every decision the course makes by hardware, run under every emulated class
(hardware.CLASSES, through the hardware_class fixture), against its expected answer in one table, EXPECTED.

A row's answers are the course's policy, written once here: a change of policy changes this table, and a decision
that reads the hardware around the seam (CPU flags or CUDA's capability on its own) shows up as a class whose answer
does not follow the class."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from course_lib import ceilings, compress, config, flops, hardware, machines, muon
from course_lib.errors import CourseError
from course_lib.exercises import inference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_check  # noqa: E402

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
                                              for c in gpu_check.configs(64) if "precision" in c),
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
