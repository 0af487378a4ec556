"""The lesson specs' longer section workloads (base.lessons' `sections`), one function per notebook section whose
work does not fit a line: what it runs at a run size, as base.workloads' records. Imports nothing of the course but
base.workloads."""
from __future__ import annotations

import math

from .workloads import (
    SPLIT_IMAGES,
    Compile,
    HostFlops,
    HostSeconds,
    Images,
    Launches,
    Matmul,
    PrecisionConfig,
    Run,
    Steps,
)

#: lesson 02's epoch rows (each a median with its spread) and the Trainer's cost per step over the plain loop
TRAINER_ROWS = ("ImageClassifierModule", "LitLeNet", "LitLeNet, barebones")
TRAINER_ROWS_EPOCHS = tuple(f"{row} epoch" for row in ("plain loop", *TRAINER_ROWS))
TRAINER_ROWS_OVERHEAD = tuple(f"{row} overhead per step" for row in TRAINER_ROWS)


def lightning_cost(r: Run) -> tuple:
    """02 section 5 trains on accelerator="cpu" whatever the machine has: rounds of 4 one-epoch runs, priced from the
    committed run's epoch times (min and max of a round, scaled to this run's training images)."""
    epochs = [r.figure("02_lightning", name) for name in TRAINER_ROWS_EPOCHS]
    lo, hi, rounds = sum(e.low for e in epochs), sum(e.high for e in epochs), max(3, r.repeats)
    return (HostSeconds(f"section 5: {rounds} rounds x 4 one-epoch runs on the CPU (committed epoch times)",
                        rounds * lo * r.train / 40_000, rounds * hi * r.train / 40_000),)


def data_rungs(r: Run) -> tuple:
    """03 section 3: the JPEG pipeline profiled (21 batches), its three JPEG rungs decoded on the host, then every
    rung: 3 JPEG ones, one per worker count the host has cores for, and the GPU-resident one."""
    bs, steps = 128, r.repeats * (2 + r.bench_steps)
    jpeg, images = r.figure("03_gpu_and_data", "JPEG + PIL + v2, num_workers=0 images/s"), 21 * bs + 3 * steps * bs
    workers = len([n for n in (0, 1, 2, 4, 8) if n <= r.host_cores])
    return (HostSeconds("section 3: JPEG decode + PIL augmentation on the host (committed images/s)",
                        images / jpeg.high, images / jpeg.low),  # the fastest and the slowest committed round
            Steps(f"section 3: SimpleCNN batch 128, {3 + workers + 1} rungs x {steps} steps", "simple_cnn", bs,
                  (3 + workers + 1) * steps))


def tf32_products(r: Run) -> tuple:
    """04 section 3: 8192^3 products per format ("high" is TF32 where the GPU has it, else fp32)."""
    tf32 = "tf32" if "tf32" in r.formats else "fp32"
    formats = [("fp32", "fp32"), ('"high"', tf32), ("fp16", "fp16")] + ([("bf16", "bf16")] if r.native("bf16") else [])
    return tuple(Matmul(f"section 3: 8192^3 products, warm-up + 20, {name} (at the {f} peak)", 8192, 21, fmt=f)
                 for name, f in formats)


def precision_rows(r: Run, configs: tuple[PrecisionConfig, ...]) -> tuple:
    """04 section 4: each of its configurations the GPU runs natively: timed steps, a training run and a test pass."""
    width, bs, steps = r.channels(), 512, r.repeats * (5 + r.bench_steps)
    return tuple(work for name, f in ((c.name, c.format) for c in configs) if r.native(f) for work in (
        Steps(f"section 4: ResNet-9 w{width} batch {bs}, {name}, {steps} steps", "resnet9", bs, steps, fmt=f,
              width=width, on_device=True),
        Steps(f"section 4: train {r.epochs} epochs, {name}", "resnet9", bs, r.epochs * r.epoch(bs), fmt=f,
              width=width),
        Steps(f"section 4: test, {name}", "resnet9", bs, r.eval_steps(bs), train=False, fmt=f, width=width)))


def gelu_and_compiles(r: Run) -> tuple:
    """05 section 1: gelu_tanh's eager chain (about 8 elementwise ops, launch-bound) and the lesson's cold compiles:
    GELU, the CNN with default and reduce-overhead; later rounds recompile from a warm cache."""
    rounds, cold_cnn = max(3, r.repeats), r.figure("05_compile_and_tuning", "compile time, simple_cnn training step")
    cold = r.figure("05_compile_and_tuning", "compile time, GELU function").value + 2 * cold_cnn.value
    return (Launches(f"GELU chain: {rounds} rounds x {r.bench_steps} calls, eager ops launch-bound",
                     rounds * r.bench_steps * 8),
            Compile("compiles: GELU + CNN x 2, cold (the CPU run's cold compiles x COMPILE_FACTOR); later rounds "
                    "recompile from a warm cache (slow end: 2 more cold ones)", cold, cold + 2 * cold_cnn.value))


def int8_rows(r: Run) -> tuple:
    """07 on the host (compress runs on the CPU): latency rows at batch 1 and 64, accuracy passes, calibration, the
    pruning curve; the int8 and fp32 compile_for_cpu."""
    width, prune, (resnet, lenet, calls) = r.channels(), 4 if r.full else 2, (7, 5, 2 + r.bench_steps)
    compile_s = r.figure("07_quantization", "ResNet9 int8 compile time").value
    return (HostFlops(f"host: {resnet} ResNet-9 + {lenet} LeNet rows (latency b1/b64 x {calls}, test accuracy), "
                      "calibration, pruning curve",
                      (Images("resnet9", resnet * calls * 65 + (resnet + 5 + prune) * r.evals + 512, width),
                       Images("lenet", lenet * calls * 65 + (lenet + 1) * r.evals))),
            HostSeconds("host: int8 and fp32 compile_for_cpu (the CPU run's int8 compile, twice)", 2 * compile_s,
                        2 * compile_s))


def airbench(r: Run) -> dict:
    """08's counts: batch, seeds, steps per run at batch 64 and at its batch (08 carves only a test split)."""
    train, seeds = r.train_subset or SPLIT_IMAGES - int(SPLIT_IMAGES * 0.1), 5 if r.full else 2
    return dict(bs=r.batch_size, train=train, seeds=seeds, runs=1 + seeds + 2, rungs=seeds + 1 + 4,
                steps64=r.epochs * math.ceil(train / 64), steps=r.epochs * (train // r.batch_size))


def mixed_runs(r: Run, what: str, count: str, about: str = "") -> Steps:
    """08's full runs of AirNet in the precision policy's format, on the device: airbench's `count` of them."""
    a = airbench(r)
    return Steps(f"{what}: {a[count]} x {about}{r.epochs} epochs, {r.mixed}", "airnet", a["bs"], a[count] * a["steps"],
                 fmt="mixed", width=r.width, on_device=True)


def capstone_tests(r: Run) -> tuple:
    """08's test passes: 4 plain; TTA level 2 is 6 views for every run; selective TTA about 2.5."""
    a = airbench(r)
    tests = 4 + 6 * (a["runs"] + 1 + a["rungs"]) + 3
    return (Steps(f"tests: {tests} passes over the test split", "airnet", a["bs"], tests * r.eval_steps(a["bs"]),
                  train=False, fmt="mixed", width=r.width, on_device=True),)
