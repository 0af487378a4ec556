"""The types of a lesson spec (base.lessons holds the specs): a Lesson, its Scales per size and device kind, its GPU
benchmark rows and Targets; what its sections run is base.workloads'. Imports nothing of the course but hardware
and workloads."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from . import hardware
from .workloads import PrecisionConfig, Section

CPU, GPU = "cpu", "gpu"
#: the device kind of a CPU without native bf16 instructions (hardware.CPU_BF16_FLAGS), for lessons that time bf16
CPU_EMULATED_BF16 = "cpu without native bf16"


@dataclass(frozen=True)
class Scale:
    """How a lesson's run size differs from the common one (config.SIZES) at one size on one device kind: RunSize's
    fields, None where the common size stands."""
    size: str  # smoke | full
    kind: str  # CPU, GPU or CPU_EMULATED_BF16
    train_subset: int | None = None
    eval_subset: int | None = None
    epochs: int | None = None
    bench_steps: int | None = None
    width: float | None = None
    batch_size: int | None = None

    def changes(self) -> dict:
        """The RunSize fields this scale sets, for dataclasses.replace."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name not in ("size", "kind") and getattr(self, f.name) is not None}


@dataclass(frozen=True)
class GpuRow:
    """A benchmark row scripts/gpu_check.py runs on a GPU for a lesson: ImageClassifierModule's arguments (model), the
    data on the device or in a DataLoader with its settings (data), the precision and TF32. policy: the row runs only
    where the precision policy picks that precision (hardware.choose_precision()); alone: benched by itself, a failure
    reported, not raised."""
    name: str
    model: dict = field(default_factory=dict)
    device_data: bool = False
    data: dict = field(default_factory=dict)
    precision: str = hardware.BASELINE
    tf32: bool = False
    policy: str | None = None
    alone: bool = False


@dataclass(frozen=True)
class Target:
    """A speed-up a GPU run must reach: config's throughput over baseline's, both rows of scripts/gpu_check.py."""
    config: str
    baseline: str
    speedup: float


@dataclass(frozen=True)
class Lesson:
    """One lesson (notebook=True: notebooks/<name>.ipynb) or one GPU script that sizes its runs like a lesson."""
    name: str  # NN_topic for a lesson: its notebook's stem; the script's module name otherwise
    topic: str = ""  # the README lesson table's topic cell
    status: str = "ready"  # the README lesson table's status cell
    notebook: bool = True
    budget_s: int | None = None  # seconds its full run may take on a CPU (config.lesson_budget)
    reference_s: tuple[int, int] | None = None  # make course's wall s on the reference CPUs: (native bf16, emulated)
    scales: tuple[Scale, ...] = ()
    configs: tuple[PrecisionConfig, ...] = ()  # what its notebook benchmarks (its gpu_rows run them on a GPU)
    gpu_rows: tuple[GpuRow, ...] = ()  # what scripts/gpu_check.py runs for it on a GPU, in this order
    targets: tuple[Target, ...] = ()  # what a GPU run of its gpu_rows must reach (scripts/gpu_check.py)
    checks: tuple[str, ...] = ()  # its exercises' checks, names in course_lib.exercises, in the notebook's order
    figures: tuple[str, ...] = ()  # figures (results.record names) its committed run must keep: the GPU estimator's
    sections: tuple[Section, ...] = ()  # its notebook's sections, in order, with the work each runs (the estimator's)

    @property
    def number(self) -> str:
        """'04' for 04_mixed_precision."""
        return self.name[:2]

    def scale(self, size: str, kind: str) -> Scale | None:
        """Its scale at this size on this device kind, or None (the common size)."""
        return next((s for s in self.scales if (s.size, s.kind) == (size, kind)), None)


def bench_scales(steps_smoke: int, batch_smoke: int, steps_cpu: int, batch_cpu: int, steps_gpu: int, batch_gpu: int):
    """A GPU script's scales: smoke and full CPU runs are dry runs; the GPU's full size is the real one."""
    return (Scale("smoke", CPU, bench_steps=steps_smoke, batch_size=batch_smoke),
            Scale("smoke", GPU, bench_steps=steps_smoke, batch_size=batch_smoke),
            Scale("full", CPU, bench_steps=steps_cpu, batch_size=batch_cpu),
            Scale("full", GPU, bench_steps=steps_gpu, batch_size=batch_gpu))
