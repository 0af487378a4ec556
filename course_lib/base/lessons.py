"""The lesson as the unit: one frozen Lesson record per lesson (and per GPU script that sizes its runs like one), the
only place that says what a lesson is: its notebook, topic, sizes per device kind, CPU time budget and reference run,
its benchmark targets and its exercises' checks. config, the runner, gpu_check, the GPU estimator and the README's
lesson table read it; tests/test_lesson_spec.py fails where a notebook and its spec disagree. Imports nothing of the
course, so every module may read it."""
from __future__ import annotations

from dataclasses import dataclass, fields

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
    targets: tuple[Target, ...] = ()  # what a GPU run of its benchmark rows must reach (scripts/gpu_check.py)
    checks: tuple[str, ...] = ()  # its exercises' checks, names in course_lib.exercises, in the notebook's order
    figures: tuple[str, ...] = ()  # figures (results.record names) its committed run must keep: the GPU estimator's

    @property
    def number(self) -> str:
        """'04' for 04_mixed_precision."""
        return self.name[:2]

    def scale(self, size: str, kind: str) -> Scale | None:
        """Its scale at this size on this device kind, or None (the common size)."""
        return next((s for s in self.scales if (s.size, s.kind) == (size, kind)), None)


def _bench(steps_smoke: int, batch_smoke: int, steps_cpu: int, batch_cpu: int, steps_gpu: int, batch_gpu: int):
    """A GPU script's scales: smoke and full CPU runs are dry runs; the GPU's full size is the real one."""
    return (Scale("smoke", CPU, bench_steps=steps_smoke, batch_size=batch_smoke),
            Scale("smoke", GPU, bench_steps=steps_smoke, batch_size=batch_smoke),
            Scale("full", CPU, bench_steps=steps_cpu, batch_size=batch_cpu),
            Scale("full", GPU, bench_steps=steps_gpu, batch_size=batch_gpu))


#: lesson 02's epoch rows (each a median with its spread) and the Trainer's cost per step over the plain loop
TRAINER_ROWS = ("ImageClassifierModule", "LitLeNet", "LitLeNet, barebones")
TRAINER_ROWS_EPOCHS = tuple(f"{row} epoch" for row in ("plain loop", *TRAINER_ROWS))
TRAINER_ROWS_OVERHEAD = tuple(f"{row} overhead per step" for row in TRAINER_ROWS)

# On a CPU, full sizes aim at about 10 minutes a lesson on 2 cores (a slow CPU takes longer: docs/results/
# cpu-2core.md); on a GPU, full is the real thing. budget_s: the native-bf16 reference run's times x 1.5, 1,745 s in
# all (config.COURSE_BUDGET_S keeps the rest for fixed costs). reference_s: make course at full size on two 2-core
# AMD EPYCs, one per answer to 'native bf16?' (config.REFERENCE_GFLOPS; docs/results/cpu-2core.md names the runs).
LESSONS = (
    Lesson("00_setup", "your hardware, where data goes, run size, Colab", budget_s=40, reference_s=(26, 33),
           checks=("check_00_prediction",), figures=("fp32 matmul",)),
    Lesson("01_pytorch_baseline", "the classic CIFAR-10 CNN in plain PyTorch: its bugs fixed, measured",
           budget_s=105, reference_s=(70, 194), checks=("check_01_batching",)),
    Lesson("02_lightning", "the same model as LightningModule + DataModule + Trainer, torchmetrics, checkpoints, "
           "overhead measured (barebones, ThroughputMonitor)", budget_s=140, reference_s=(94, 282),
           checks=("check_02_trainer",), figures=(*TRAINER_ROWS_EPOCHS, *TRAINER_ROWS_OVERHEAD)),
    Lesson("03_gpu_and_data", "device placement, host-to-device copies, pinned memory; the JPEG pipeline profiled "
           "and fixed rung by rung; workers, GPU-resident data, batch size", budget_s=285, reference_s=(191, 506),
           scales=(Scale("full", CPU, bench_steps=50),),  # 6 rounds of 50 steps: 3 rounds of 100's time
           targets=(Target("small CNN, GPU-resident data", "small CNN, DataLoader 8 workers", 1.5),),
           checks=("check_03_data_wait",), figures=("JPEG + PIL + v2, num_workers=0 images/s",)),
    Lesson("04_mixed_precision", "number formats, fp16 + GradScaler, bf16, TF32", budget_s=145, reference_s=(97, 517),
           scales=(Scale("smoke", CPU, width=0.25),  # ResNet-9 at 16 channels
                   # smoke checks the code: emulated bf16 gets an eighth of the images and half the timed steps
                   Scale("smoke", CPU_EMULATED_BF16, train_subset=256, eval_subset=128, width=0.25, bench_steps=3),
                   Scale("full", CPU, train_subset=10_000, width=0.25, bench_steps=50),  # 16 channels
                   # emulated bf16 steps take about 12x fp32's on an AVX2 CPU: 04's bf16 rows get a fifth of the steps
                   Scale("full", CPU_EMULATED_BF16, train_subset=2_000, width=0.25, bench_steps=10)),
           targets=(Target("ResNet-9 bf16-mixed", "ResNet-9 fp32", 2.0),),
           checks=("check_04_activation_memory",)),
    Lesson("05_compile_and_tuning", "torch.compile as fusion, channels_last, cudnn.benchmark, host syncs, CUDA "
           "graphs, profilers, the Tuner", budget_s=100, reference_s=(67, 176),
           targets=(Target("ResNet-9 bf16 + compile + channels_last", "ResNet-9 bf16-mixed", 1.3),),
           checks=("check_05_fusion",),
           figures=("compile time, GELU function", "compile time, simple_cnn training step")),
    Lesson("06_ddp", "data vs model parallel, DDP mechanics, ddp_notebook, torchrun and multi-node "
           "([commands](docs/multi_gpu.md))", budget_s=310, reference_s=(206, 273), checks=("check_06_allreduce",)),
    Lesson("07_quantization", "PT2E int8 via torchao, QAT, pruning", budget_s=150, reference_s=(99, 227),
           scales=(Scale("smoke", CPU, width=0.25), Scale("smoke", GPU, width=0.25),  # ResNet-9 at 16 channels
                   Scale("full", CPU, train_subset=4_096, eval_subset=2_000, width=0.25)),
           checks=("check_07_inference",), figures=("ResNet9 int8 compile time",)),
    Lesson("08_capstone", "CIFAR-10 to 94 % as fast as possible: airbench-style AirNet, on-device augmentation, a "
           "measured ladder of tricks, seeds, FLOPs and fraction of peak, Lightning beside a plain-PyTorch twin",
           status="ready (GPU figures not yet measured)", budget_s=470, reference_s=(314, 1118),
           scales=(Scale("smoke", CPU, train_subset=256, eval_subset=256, epochs=2, width=1 / 8, batch_size=64),
                   Scale("smoke", GPU, train_subset=256, eval_subset=256, epochs=2, width=1 / 8, batch_size=64),
                   Scale("full", CPU, train_subset=5_000, eval_subset=2_000, epochs=10, width=1 / 4, batch_size=256),
                   Scale("full", GPU, epochs=10, batch_size=1024)),  # airbench94's schedule on all the data
           checks=("check_08_batch_augment",)),
)
# the GPU scripts' benchmark rows (lessons 03-05 and 06); on a CPU, or at smoke size, they are dry runs
SCRIPTS = (
    Lesson("gpu_check", notebook=False, scales=_bench(2, 32, 10, 64, 50, 512)),
    Lesson("gpu_ddp_check", notebook=False, scales=_bench(2, 32, 10, 64, 50, 256)),  # GPU batch: per process
)
BY_NAME = {unit.name: unit for unit in LESSONS + SCRIPTS}


def get(name: str) -> Lesson:
    """The spec named `name` (a lesson's NN_topic, or a GPU script's name); a KeyError lists the names."""
    if name not in BY_NAME:
        raise KeyError(f"No lesson spec {name!r} in course_lib/base/lessons.py; specs: {sorted(BY_NAME)}")
    return BY_NAME[name]


def names() -> tuple[str, ...]:
    """The lessons' names (NN_topic), in course order."""
    return tuple(lesson.name for lesson in LESSONS)
