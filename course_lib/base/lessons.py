"""The lesson as the unit: one frozen Lesson record (base.spec) per lesson (and per GPU script that sizes its runs
like one), the only place that says what a lesson is: its notebook, topic, sizes per device kind, CPU time budget and
reference run, its benchmark targets, its exercises' checks and its notebook's sections with the work each runs
(base.workloads). config, the runner, gpu_check, the GPU estimator and the README's lesson table read it;
tests/test_lesson_spec.py fails where a notebook and its spec disagree. Imports nothing of the course but base.spec,
base.workloads and base.lesson_work, so every module may read it."""
from __future__ import annotations

from . import hardware
from . import lesson_work as work
from .lesson_work import TRAINER_ROWS_EPOCHS, TRAINER_ROWS_OVERHEAD
from .spec import CPU, CPU_EMULATED_BF16, GPU, GpuRow, Lesson, PrecisionConfig, Scale, Target, bench_scales
from .workloads import IMAGE_FLOATS, SPLIT_IMAGES, Compile, Copy, HostFlops, HostSeconds, Images, Matmul, Section, Steps

__all__ = ["CPU", "CPU_EMULATED_BF16", "GPU", "GpuRow", "Lesson", "Scale", "Target", "TRAINER_ROWS_EPOCHS",
           "TRAINER_ROWS_OVERHEAD", "LESSONS", "SCRIPTS", "BY_NAME", "get", "names"]


#: lesson 04's training configurations (its notebook's CONFIGS; gpu_check's 'ResNet-9 <name>' rows)
PRECISIONS = (PrecisionConfig("fp32"), PrecisionConfig("tf32", tf32=True),
              *(PrecisionConfig(f"{hardware.number_format(p)}-mixed", p) for p in hardware.PRECISIONS
                if p != hardware.BASELINE))  # fp16-mixed, bf16-mixed: hardware.py's names, in its order
RESNET = {"backbone": "resnet9"}  # gpu_check's ResNet-9 rows (lessons 04 and 05)
COMPILED = {**RESNET, "compile": True, "channels_last": True}  # lesson 05's compiled rows, in bf16 or fp16
BF16, FP16 = hardware.precision_name("bf16"), hardware.precision_name("16")

# On a CPU, full sizes aim at about 10 minutes a lesson on 2 cores (a slow CPU takes longer: docs/results/
# cpu-2core.md); on a GPU, full is the real thing. budget_s: the native-bf16 reference run's times x 1.5, rounded up
# to 5 s, 3,555 s in all (config.COURSE_BUDGET_S keeps the rest for fixed costs). reference_s: make course at full
# size on two 2-core AMD EPYCs, one per answer to 'native bf16?' (config.REFERENCE_GFLOPS; docs/results/cpu-2core.md
# names the runs): native, the committed run of 2026-12-05 (docs/results/lesson-times.json); emulated, an earlier
# run, before the per-op breakdowns (config.lesson_budget also scales the native run's times for that class).
LESSONS = (
    Lesson("00_setup", "your hardware, where data goes, run size, Colab", budget_s=55, reference_s=(36, 33),
           checks=("check_00_prediction",), figures=("fp32 matmul",),
           sections=(Section("4. This machine's ceilings: compute, memory, fixed cost", lambda r: (
                         Matmul("section 4: 2048^3 fp32 products, warm-up + max(5, repeats)", 2048,
                                1 + max(5, r.repeats)),)),
                     Section("Exercises", lambda r: (
                         Matmul("exercise 2: 4096^3 fp32 products, warm-up + 3", 4096, 4),)))),
    Lesson("01_pytorch_baseline", "the classic CIFAR-10 CNN in plain PyTorch: its bugs fixed, measured",
           budget_s=435, reference_s=(288, 194), checks=("check_01_batching",),
           sections=(Section("3. The training loop, and what batch size 4 costs", lambda r: tuple(  # SWEEP + batch 64
                         Steps(f"section 3: LeNet batch {bs}, {r.repeats} x {r.bench_steps + 3} steps", "lenet", bs,
                               r.repeats * (r.bench_steps + 3), loop="plain")
                         for bs in (4, 16, 64, 256) if bs * (r.bench_steps + 3) <= r.train)),  # those fitting a pass
                     Section("Training for real", lambda r: (Steps(
                         f"section 3: LeNet batch 64, {r.epochs} epochs", "lenet", 64, r.epochs * r.epoch(64),
                         loop="plain"),)),
                     Section("4. Evaluation", lambda r: (Steps("section 3: test predictions, twice", "lenet", 256,
                                                               2 * r.eval_steps(256), train=False, loop="plain"),),
                             note="and section 5's"),
                     Section("5. The blog posts' own setup, measured", lambda r: (
                         Steps(f"section 3, training for real: the articles' loop, batch 4, {min(2, r.epochs)} epochs",
                               "lenet", 4, min(2, r.epochs) * r.epoch(4), loop="plain"),)))),
    Lesson("02_lightning", "the same model as LightningModule + DataModule + Trainer, torchmetrics, checkpoints, "
           "overhead measured (barebones, ThroughputMonitor)", budget_s=305, reference_s=(202, 282),
           checks=("check_02_trainer",), figures=(*TRAINER_ROWS_EPOCHS, *TRAINER_ROWS_OVERHEAD),
           sections=(Section("3. Train, log, test", lambda r: (
                         Steps(f"section 3: LeNet in the Trainer, {r.epochs} epochs", "lenet", 64,
                               r.epochs * r.epoch(64)),
                         Steps("section 3: validation each epoch and the test", "lenet", 64,
                               (r.epochs + 1) * r.eval_steps(64), train=False),
                         Steps("section 3: predictions by hand", "lenet", 64, r.eval_steps(64), train=False,
                               loop="plain"))),
                     Section("5. What does Lightning cost?", work.lightning_cost))),
    Lesson("03_gpu_and_data", "device placement, host-to-device copies, pinned memory; the JPEG pipeline profiled "
           "and fixed rung by rung; workers, GPU-resident data, batch size", budget_s=365, reference_s=(243, 506),
           scales=(Scale("full", CPU, bench_steps=50),),  # 6 rounds of 50 steps: 3 rounds of 100's time
           gpu_rows=(GpuRow("small CNN, DataLoader 8 workers", {"backbone": "simple_cnn"}, data={
                         "num_workers": 8, "pin_memory": True, "persistent_workers": True, "augment": True}),
                     GpuRow("small CNN, GPU-resident data", {"backbone": "simple_cnn"}, True, {"augment": True})),
           targets=(Target("small CNN, GPU-resident data", "small CNN, DataLoader 8 workers", 1.5),),
           checks=("check_03_data_wait",), figures=("JPEG + PIL + v2, num_workers=0 images/s",),
           sections=(Section("2. What a host-to-device copy costs", lambda r: (Copy(
                         "section 2: the dataset tensor, pageable and pinned, 2 x (1 + 5) copies",
                         12 * SPLIT_IMAGES * IMAGE_FLOATS),)),  # the split as uint8
                     Section("`non_blocking=True`: what it overlaps", lambda r: (Matmul(
                         "section 2, non_blocking: 4096^3 fp32 products, 5 variants x 5 rounds x 21 passes", 4096,
                         5 * 5 * 21),)),
                     Section("3. `DataLoader` workers and the input-bound regime", work.data_rungs),
                     Section("5. Batch size: throughput, memory, and the learning rate", lambda r: tuple(
                         Steps(f"section 5: ResNet-9 w64 batch {b}, {n} steps", "resnet9", b, n, on_device=True)
                         for b in (32, 128, 512, 1024, 2048) for n in [r.repeats * (2 + r.bench_steps)])))),
    Lesson("04_mixed_precision", "number formats, fp16 + GradScaler, bf16, TF32", budget_s=540, reference_s=(359, 517),
           scales=(Scale("smoke", CPU, width=0.25),  # ResNet-9 at 16 channels
                   # smoke checks the code: emulated bf16 gets an eighth of the images and half the timed steps
                   Scale("smoke", CPU_EMULATED_BF16, train_subset=256, eval_subset=128, width=0.25, bench_steps=3),
                   Scale("full", CPU, train_subset=10_000, width=0.25, bench_steps=50),  # 16 channels
                   # emulated bf16 steps take about 12x fp32's on an AVX2 CPU: 04's bf16 rows get a fifth of the steps
                   Scale("full", CPU_EMULATED_BF16, train_subset=2_000, width=0.25, bench_steps=10)),
           configs=PRECISIONS, targets=(Target("ResNet-9 bf16-mixed", "ResNet-9 fp32", 2.0),),
           gpu_rows=tuple(GpuRow(f"ResNet-9 {c.name}", RESNET, True, precision=c.precision, tf32=c.tf32)
                          for c in PRECISIONS),  # its notebook's configurations
           checks=("check_04_activation_memory",),
           sections=(Section("3. TF32: fp32 code, tensor-core speed", work.tf32_products),
                     Section("4. Training: fp32 vs TF32 vs 16-mixed vs bf16-mixed",
                             lambda r: work.precision_rows(r, PRECISIONS)),
                     Section("5. Memory for speed: accumulation and activation checkpointing", lambda r: (Steps(
                         "memory section: 3 step variants x 4 calls + 8 accumulated batches", "resnet9", 512,
                         3 * 4 + 8, loop="plain"),)))),  # MEM_WIDTH: 64 on a GPU
    Lesson("05_compile_and_tuning", "torch.compile as fusion, channels_last, cudnn.benchmark, host syncs, CUDA "
           "graphs, profilers, the Tuner", budget_s=185, reference_s=(122, 176),
           targets=(Target("ResNet-9 bf16 + compile + channels_last", "ResNet-9 bf16-mixed", 1.3),),
           # a GPU without bf16 (a T4, compute capability 7.5) skips the bf16 rows; the compile then runs in the fp16
           # the policy picks there, so the check shows whether torch.compile works on it (or its error)
           gpu_rows=(GpuRow("ResNet-9 bf16 + compile + channels_last", COMPILED, True, precision=BF16),
                     GpuRow("ResNet-9 16-mixed + compile + channels_last", COMPILED, True, precision=FP16,
                            policy=FP16, alone=True)),
           checks=("check_05_fusion",),
           figures=("compile time, GELU function", "compile time, simple_cnn training step"),
           sections=(Section("1. `torch.compile` as kernel fusion", work.gelu_and_compiles),
                     Section("The same on a whole model, in Lightning", lambda r: (Steps(
                         f"bench: eager, compile, channels_last, reduce-overhead: 4 x {r.repeats} x "
                         f"{3 + r.bench_steps} steps", "simple_cnn", 64, 4 * r.repeats * (3 + r.bench_steps),
                         on_device=True),), note="with section 2's layout rows and section 5's reduce-overhead row"),
                     Section("2. Memory layout and cuDNN autotuning",
                             note="not counted: one eager step's breakdown (its rows run in section 1's bench)"),
                     Section("3. `zero_grad(set_to_none=True)` versus filling with zeros",
                             note="not counted: an MLP's hand-timed steps, 2 + 2 x REPEATS x STEPS (no MLP priced)"),
                     Section("4. The cost of one `.item()` per step", lambda r: (
                         Steps(f"section 4: SimpleCNN, loss kept or read each step: 2 + 2 x {max(3, r.repeats)} x "
                               f"{r.bench_steps} steps", "simple_cnn", 64, 2 + 2 * max(3, r.repeats) * r.bench_steps,
                               loop="plain", on_device=True),  # compare(): a warm-up, then REPEATS rounds of both
                         Steps(f"section 4: SimpleCNN, loss read every 50 steps or each step: 2 + 2 x "
                               f"{max(3, r.repeats)} x {r.bench_steps} steps", "simple_cnn", 64,
                               2 + 2 * max(3, r.repeats) * r.bench_steps, loop="plain", on_device=True),
                         Steps(f"section 4: .item() counted in Trainer runs of {r.bench_steps // 2} and "
                               f"{r.bench_steps} steps", "simple_cnn", 64, r.bench_steps // 2 + r.bench_steps,
                               on_device=True))),
                     Section('5. CUDA graphs: `torch.compile(mode="reduce-overhead")`',
                             note="counted in section 1's bench item"),
                     Section("6. Profiling: where a step's time goes", lambda r: (Steps(
                         f"profiler ({r.bench_steps} steps) and lr_find ({100 if r.full else 30} steps)", "simple_cnn",
                         64, r.bench_steps + (100 if r.full else 30)),), note="with section 7's lr_find"),
                     Section("7. Lightning's Tuner: a learning rate and a batch size to start from", lambda r: tuple(
                         Steps(f"scale_batch_size trial, batch {b}", "simple_cnn", b, 3)  # 7 trials, 3 steps each
                         for b in (64 * 2**k for k in range(7)))))),
    Lesson("06_ddp", "data vs model parallel, DDP mechanics, ddp_notebook, torchrun and multi-node "
           "([commands](docs/multi_gpu.md))", budget_s=365, reference_s=(242, 273), checks=("check_06_allreduce",),
           sections=(Section("2. How DDP works", lambda r: (HostSeconds(
                         "CPU DDP (gloo) cells: the committed CPU run; the multi-GPU cells need 2 GPUs and are skipped",
                         r.wall_s("06_ddp") - r.wall_s("00_setup"), r.wall_s("06_ddp") - r.wall_s("00_setup"),
                         (Images("lenet", r.epochs * r.train, train=True),)),),  # the ddp_notebook fit's LeNet
                             note="sections 2-4: the committed run less the start the estimator counts"),
                     Section("3. DDP in Lightning, in a notebook", note="counted in section 2's item"),
                     Section("4. Scaling, measured", note="counted in section 2's item"))),
    Lesson("07_quantization", "PT2E int8 via torchao, QAT, pruning", budget_s=205, reference_s=(134, 227),
           scales=(Scale("smoke", CPU, width=0.25), Scale("smoke", GPU, width=0.25),  # ResNet-9 at 16 channels
                   Scale("full", CPU, train_subset=4_096, eval_subset=2_000, width=0.25)),
           checks=("check_07_inference",), figures=("ResNet9 int8 compile time",),
           sections=(Section("1. Why int8 helps, and when it does not",
                             note="not counted: two 512^3 products on the host, timed for a fixed time"),
                     Section("2. The fp32 baselines", lambda r: (
                         Steps(f"section 2: ResNet-9 w{r.channels()}, {r.epochs} epochs", "resnet9", 64,
                               r.epochs * r.epoch(64), width=r.channels()),
                         Steps(f"section 2: LeNet, {r.epochs} epochs", "lenet", 64, r.epochs * r.epoch(64)))),
                     Section("Latency: the eager reference graph, then compiled", work.int8_rows),
                     Section("5. Quantization-aware training (QAT)", lambda r: (HostFlops(
                         "host: QAT, a quarter epoch on the CPU",
                         (Images("resnet9", int(0.25 * r.epoch(64)) * 64, r.channels(), train=True),)),)),
                     Section("6. Pruning with `ModelPruning`", lambda r: (Steps(
                         f"pruning: {4 if r.full else 2} x 1/8-epoch fine-tunes (ResNet-9) + 1 (LeNet)", "resnet9",
                         64, (4 if r.full else 2) * r.epoch(64) // 8, width=r.channels()),)),
                     Section("7. Quantization on GPUs",
                             note="not counted: the weight-only and fp8 demo on a small MLP"))),
    Lesson("08_capstone", "CIFAR-10 to 94 % as fast as possible: airbench-style AirNet, on-device augmentation, a "
           "measured ladder of tricks, seeds, FLOPs and fraction of peak, Lightning beside a plain-PyTorch twin",
           status="ready (GPU figures not yet measured)", budget_s=1100, reference_s=(731, 1118),
           scales=(Scale("smoke", CPU, train_subset=256, eval_subset=256, epochs=2, width=1 / 8, batch_size=64),
                   Scale("smoke", GPU, train_subset=256, eval_subset=256, epochs=2, width=1 / 8, batch_size=64),
                   Scale("full", CPU, train_subset=5_000, eval_subset=2_000, epochs=10, width=1 / 4, batch_size=256),
                   Scale("full", GPU, epochs=10, batch_size=1024)),  # airbench94's schedule on all the data
           checks=("check_08_batch_augment",),
           sections=(Section("2. Step 0: lesson 02's baseline", lambda r: (Steps(
                         f"rung 0: LeNet batch 64, {r.epochs} epochs", "lenet", 64, work.airbench(r)["steps64"]),)),
                     Section("3. Step 1: AirNet, and its whitening layer", lambda r: (Steps(
                         f"rung 1: AirNet batch 64, {r.epochs} epochs, fp32", "airnet", 64, work.airbench(r)["steps64"],
                         width=r.width),)),
                     Section("4. Step 2: batches that never leave the device", lambda r: (
                         Steps(f"rungs 2-3: AirNet batch {r.batch_size}, {r.epochs} epochs, fp32", "airnet",
                               r.batch_size, 2 * work.airbench(r)["steps"], width=r.width, on_device=True),
                         Copy("the split to the device as uint8, twice (loader rungs move float batches, counted "
                              "above)", 2 * work.airbench(r)["train"] * IMAGE_FLOATS)), note="with section 5's rung 3"),
                     Section("6. Step 4: test-time augmentation", work.capstone_tests,
                             note="every test pass of the lesson"),
                     Section("7. Step 5: the precision policy, channels_last, compile", lambda r: (Compile(
                         "compile of AirNet, once (the CPU run's SimpleCNN cold compile x COMPILE_FACTOR, assumed)",
                         *[r.figure("05_compile_and_tuning", "compile time, simple_cnn training step").value] * 2),)),
                     Section("8. The final recipe over several seeds, and its plain-PyTorch twin", lambda r: (
                         work.mixed_runs(r, f"rung 5, {work.airbench(r)['seeds']} seeds, twin, barebones", "runs"),)),
                     Section("9. How close to the hardware's peak?",
                             note="not counted: a step's FLOP count and its breakdown against the ceilings"),
                     Section("10. Step 6: Muon on the conv filters", lambda r: (  # seeds + a warm-up; 4 changes
                         work.mixed_runs(r, "rungs 6-7 (Muon, the record's changes)", "rungs", "about "),),
                             note="with section 11's runs"),
                     Section("11. Step 7: the record's changes", note="counted in section 10's item"))),
)
# the GPU scripts' benchmark rows (lessons 03-05 and 06); on a CPU, or at smoke size, they are dry runs
SCRIPTS = (
    Lesson("gpu_check", notebook=False, scales=bench_scales(2, 32, 10, 64, 50, 512)),
    Lesson("gpu_ddp_check", notebook=False, scales=bench_scales(2, 32, 10, 64, 50, 256)),  # GPU batch: per process
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
