"""Exercises: warm-ups that compare an answer with what the lesson computed, and speed or memory exercises graded
by measurement, where the learner's code and the baseline are measured alternately in the same run on the same
hardware, and the check passes when the learner reaches a target ratio.

A lesson's speed exercise is two cells: one that starts with `# EXERCISE <n>` holding the starter code the learner
edits, and one that starts with `# CHECK <n>` that sets `passed` from a check function below. Reference solutions
live in notebooks/solutions/NN_topic.py; tests/test_exercises.py runs every check with the starter (it must fail)
and with the solution (it must pass)."""
from __future__ import annotations

import math
import statistics
from typing import Callable


def check(name: str, answer, expected, rel_tol: float = 0.05) -> bool | None:
    """Warm-up: compare a learner's answer with the expected value; None means not attempted yet (no error)."""
    if answer is None:
        print(f"{name}: not attempted yet. Replace the None above with your answer and re-run.")
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        ok = math.isclose(float(answer), float(expected), rel_tol=rel_tol)
    else:
        ok = answer == expected
    if not ok:
        raise AssertionError(f"{name}: {answer!r} is not right yet (hint: it should be close to what the lesson "
                             f"measured or computed). Try again.")
    print(f"{name}: correct.")
    return True


def ratio_check(name: str, learner: Callable[[], float], baseline: Callable[[], float], target: float,
                repeats: int = 3, what: str = "time", hardware: str | None = None) -> bool:
    """Measure baseline() and learner() alternately `repeats` times; each returns a cost (seconds, bytes, ...;
    lower is better). Passes when median(baseline) / median(learner) reaches `target`; prints the verdict with the
    spread of the per-round ratios, and never raises for a miss (a notebook cell keeps running)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")
    base, mine = [], []
    for _ in range(repeats):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(float(baseline()))
        mine.append(float(learner()))
    if min(mine) <= 0:
        raise ValueError(f"{name}: the learner's {what} must be positive, got {mine}.")
    ratio = statistics.median(base) / statistics.median(mine)
    rounds = sorted(b / m for b, m in zip(base, mine))
    passed = ratio >= target
    where = f" on {hardware}" if hardware else ""
    print(f"{name}: {ratio:.2f}x less {what} than the baseline{where} (target >= {target:g}x; per round "
          f"{rounds[0]:.2f}-{rounds[-1]:.2f}x, {repeats} rounds): {'passed' if passed else 'not yet'}")
    return passed


def check_06_allreduce(average_gradients, target: float = 3.0, world: int = 2) -> bool:
    """Lesson 06: the learner's average_gradients(model, world) against one all-reduce per parameter tensor, on
    `world` gloo processes training parallel.deep_mlp (50 small tensors); its weights must equal one process's."""
    from . import config, parallel

    steps, rounds = max(4, config.run_size("06_ddp").bench_steps), 3
    res = parallel.allreduce_train({"baseline": parallel.average_per_tensor, "learner": average_gradients},
                                   world=world, steps=steps, batch=16, model="deep", rounds=rounds)
    one = parallel.train_one("deep", 0, steps, 16).state_dict()
    diff = max((res["state"]["learner"][k] - one[k]).abs().max().item() for k in one)
    same = diff < 1e-6
    print(f"Exercise 06: weights vs one process on the full batches: max |difference| {diff:.1e} "
          f"({'equal' if same else 'NOT equal: the gradients are not averaged correctly'})")
    base, mine = iter(res["comm_s"]["baseline"]), iter(res["comm_s"]["learner"])
    fast = ratio_check("Exercise 06", lambda: next(mine), lambda: next(base), target, rounds,
                       what="all-reduce time per run", hardware=f"{world} gloo CPU processes")
    return bool(fast and same)


def check_07_inference(serve, target: float = 1.5, min_agreement: float = 0.9) -> bool:
    """Lesson 07: serve(model, calibration) -> a callable on (64, 3, 32, 32) batches, against eager fp32 at batch 64;
    the served model must predict fp32's top-1 class on >= min_agreement of a held-out batch."""
    import statistics

    import torch

    from . import compress, config
    from .models import ResNet9
    from .timing import time_calls

    size = config.run_size("07_quantization")
    torch.manual_seed(0)
    net = ResNet9(width=max(8, round(64 * size.width))).eval()
    g = torch.Generator().manual_seed(1)
    calibration = [torch.randn(64, 3, 32, 32, generator=g) for _ in range(2)]
    held_out = torch.randn(64, 3, 32, 32, generator=g)  # not among the calibration batches
    fast = serve(net, calibration)
    with torch.no_grad():
        agree = (fast(held_out).argmax(1) == net(held_out).argmax(1)).float().mean().item()
    print(f"Exercise 07: the served model agrees with fp32 on {agree:.0%} of a held-out batch "
          f"(needs >= {min_agreement:.0%}); int8 dot-product unit: {'VNNI' if compress.has_vnni() else 'none (AVX2)'}")
    calls = max(5, size.bench_steps)

    def cost(fn):
        with torch.no_grad():
            return statistics.median(time_calls(lambda: fn(held_out), calls, warmup=2))

    passed = ratio_check("Exercise 07", lambda: cost(fast), lambda: cost(net), target, 3,
                         what="latency at batch 64", hardware=config.hardware_label())
    return bool(passed and agree >= min_agreement)


# --- lessons 04 and 05: memory for speed, fusion ---------------------------------------------------------

def plain_train_step(net, x, y) -> None:
    """The starter of lesson 04's exercise: one forward and backward over the whole batch."""
    import torch.nn.functional as F

    F.cross_entropy(net(x), y).backward()


def check_04_activation_memory(train_step: Callable, batch_size: int | None = None, target: float = 2.0) -> bool:
    """Lesson 04: train_step(net, x, y) must hold >= `target`x fewer saved-for-backward bytes than a plain step on
    the same batch, with the same gradients (same effective batch); reports the time cost and, on CUDA, peak memory."""
    import copy
    import time

    import torch

    from . import bench, config, models

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    batch = batch_size or (256 if cuda else 32)
    torch.manual_seed(0)
    # (B, 3, 32, 32) -> (B, 10); eval mode: BatchNorm uses running statistics, so chunking the batch does not
    # change the gradients, and the check can compare them with the plain step's
    net = models.ResNet9(width=64 if cuda else 8).to(device).eval()
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    nets = {"baseline": net, "learner": copy.deepcopy(net)}
    steps = {"baseline": plain_train_step, "learner": train_step}
    seconds: dict[str, list[float]] = {"baseline": [], "learner": []}
    peak_mb: dict[str, float] = {}

    def cost(side: str) -> float:
        """Saved bytes of one step of this side; its time and CUDA peak memory are recorded on the way."""
        nets[side].zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        held = bench.saved_bytes_peak(lambda: steps[side](nets[side], x, y))
        if cuda:
            torch.cuda.synchronize()
            peak_mb[side] = torch.cuda.max_memory_allocated() / 2**20
        seconds[side].append(time.perf_counter() - start)
        return max(held, 1)

    passed = ratio_check("Exercise (activation memory)", lambda: cost("learner"), lambda: cost("baseline"), target,
                         repeats=2, what="saved-for-backward bytes", hardware=config.hardware_label())
    grads = [(a.grad, b.grad) for a, b in zip(nets["baseline"].parameters(), nets["learner"].parameters())]
    if any(b is None for _, b in grads):
        print("  the learner's step left some parameters without a gradient: it must train the whole net")
        return False
    err = max(((b - a).norm() / a.norm().clamp_min(1e-12)).item() for a, b in grads)
    same = err <= 0.05  # fp32 accumulation or checkpointing: ~1e-6; bf16 autocast: ~1e-2
    t_base, t_mine = statistics.median(seconds["baseline"]), statistics.median(seconds["learner"])
    print(f"  batch {batch}: gradients match the plain step's to {err:.1e} (relative, limit 0.05): "
          f"{'same effective batch' if same else 'NOT the same gradients'}; time per step {t_base * 1e3:.0f} ms -> "
          f"{t_mine * 1e3:.0f} ms ({t_mine / t_base:.2f}x, the price of the memory saved)")
    if cuda:
        print(f"  CUDA peak memory (torch.cuda.max_memory_allocated): {peak_mb['baseline']:,.0f} MB -> "
              f"{peak_mb['learner']:,.0f} MB")
    else:
        print("  (no GPU: the bytes are what autograd saved for backward, counted by saved_tensors_hooks, "
              "not the process's whole memory)")
    return passed and same


def eager_chain(x):
    """The starter of lesson 05's exercise: a hand-written normalise-and-activate, ten elementwise ops, each a pass."""
    import torch

    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    z = centred * torch.rsqrt(var + 1e-5)
    z = z * 1.5 + 0.1  # scale and shift
    return 0.5 * z * (1.0 + torch.tanh(0.7978845608 * (z + 0.044715 * z * z * z)))  # tanh GELU


def check_05_fusion(fn: Callable, target: float = 2.0) -> bool:
    """Lesson 05: fn(x) must equal eager_chain(x) and take >= `target`x less time, timed after a warm-up call (the
    compile time, printed separately, is excluded)."""
    import time

    import torch

    from . import config, timing

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = 4096 if device == "cuda" else 512
    torch.manual_seed(0)
    x = torch.randn(rows, 2048, device=device)  # (rows, features) float32: 4 MB on a CPU, 32 MB on a GPU
    start = time.perf_counter()
    out = fn(x)  # warm-up: torch.compile compiles on this first call
    timing.sync(device)
    print(f"Exercise (fusion): first call (compile, if any) took {time.perf_counter() - start:.2f} s")
    if not torch.allclose(out, eager_chain(x), atol=1e-3, rtol=1e-3):
        print("  fn(x) does not match the eager chain's result: it must compute the same function")
        return False
    repeats = 20 if device == "cuda" else 10

    def cost(f) -> float:
        """Seconds of f's fastest call of `repeats` (a busy machine only ever adds time)."""
        return min(timing.time_calls(lambda: f(x), repeats, warmup=1, device=device))

    return ratio_check("Exercise (fusion)", lambda: cost(fn), lambda: cost(eager_chain), target, repeats=3,
                       what="time", hardware=config.hardware_label())


# --- lesson 01: the loop ---------------------------------------------------------------------------------
_01_DM: dict = {}


def _01_data():
    """Lesson 01's training data, decoded once per process."""
    if "dm" not in _01_DM:
        from . import runs
        dm = runs.datamodule("01_pytorch_baseline", seed=0)
        dm.prepare_data()
        dm.setup("fit")
        _01_DM["dm"] = dm
    return _01_DM["dm"]


def _01_measure(batch_size: int, lr: float, momentum: float, images: int, seed: int = 0) -> tuple[float, float]:
    """Seconds per image and mean training loss (second half of the images) of lesson 01's LeNet on the first
    `images` training images, in order."""
    import time

    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from .models import LeNet

    torch.manual_seed(seed)
    net, sums, counts = LeNet(), [], []
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    loader = DataLoader(_01_data().train_set, batch_size=batch_size, shuffle=False, collate_fn=lambda b: b)
    start = time.perf_counter()
    for x, y in loader:
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sums.append(loss.detach() * len(y))
        counts.append(len(y))
        if sum(counts) >= images:
            break
    seconds = time.perf_counter() - start
    half = len(sums) // 2  # where each setup got to: the loss over the second half of its steps
    return seconds / sum(counts), float(torch.stack(sums[half:]).sum()) / sum(counts[half:])


def check_01_loop_speed(batch_size: int, lr: float, momentum: float = 0.9, target: float = 3.0) -> bool:
    """Lesson 01: the learner's loop settings against the seed's (batch 4, lr 0.001): >= `target`x the images/s on
    the same images, and a training loss over the second half of them no worse than the seed's."""
    from . import config

    images = 512 if config.run_size("01_pytorch_baseline").name == "smoke" else 2048
    _01_measure(batch_size, lr, momentum, 64)  # warm-up: decoding and first-call costs land here
    losses: dict = {}

    def cost(bs, rate, mom, key):
        seconds, loss = _01_measure(bs, rate, mom, images)
        losses.setdefault(key, []).append(loss)
        return seconds

    fast = ratio_check("Exercise 1 (loop speed)", lambda: cost(batch_size, lr, momentum, "you"),
                       lambda: cost(4, 0.001, 0.9, "seed"), target, repeats=3, what="time per image",
                       hardware=config.hardware_label())
    mine, seed = statistics.median(losses["you"]), statistics.median(losses["seed"])
    good = mine <= seed + 0.01
    print(f"Exercise 1 (loss bar): your training loss {mine:.3f} over the second half of {images} images, the "
          f"seed's {seed:.3f} (bar: at most the seed's + 0.01): {'passed' if good else 'not yet'}")
    return bool(fast and good)


# ---- lesson 03: a data pipeline that keeps the device busy ----------------------------------------------------
_JPEG_FOLDERS: dict = {}  # image folder -> torchvision ImageFolder: the 50,000 file names are listed once


def jpeg_datamodule(batch_size: int = 64, num_workers: int = 0, pin_memory: bool = False,
                    persistent_workers: bool = False, subset: int | None = None, seed: int = 0):
    """Lesson 03's classic pipeline: JPEG files, PIL decode and torchvision v2 augmentation per image, DataLoader."""
    import lightning as L
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    from . import config
    from .data import CIFAR10_MEAN, CIFAR10_STD
    folder = config.data_source()
    if folder is None or folder.endswith(".pt"):
        raise ValueError("The JPEG pipeline needs an image folder (<root>/train/<class>/*.jpg): set COURSE_DATA or "
                         "write one with course_lib.data.save_image_folder (lesson 00).")
    aug = v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ToImage(),
                      v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    if folder not in _JPEG_FOLDERS:
        _JPEG_FOLDERS[folder] = datasets.ImageFolder(f"{folder}/train")
    full = _JPEG_FOLDERS[folder]
    images = datasets.ImageFolder.__new__(datasets.ImageFolder)  # same file list, this module's transform
    images.__dict__.update(full.__dict__, transform=aug)
    keep = torch.randperm(len(full), generator=torch.Generator().manual_seed(seed))[:subset or len(full)]
    train = torch.utils.data.Subset(images, keep.tolist())
    dm = L.LightningDataModule()
    dm.train_dataloader = lambda: torch.utils.data.DataLoader(  # per image: open, decode, crop, flip, normalise
        train, batch_size=batch_size, shuffle=True, num_workers=num_workers, pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0)
    return dm


def check_03_data_wait(make_data: Callable, target: float = 2.0, max_wait: float | None = None,
                       batch_size: int = 256) -> bool:
    """Lesson 03: make_data(batch_size) -> a DataModule; passes when its images/s is >= target x the JPEG
    pipeline's (num_workers=0) and its data-wait fraction is under max_wait, measured alternately in this run.
    max_wait None: 10 % on a GPU; 35 % on a CPU, where the "device" is the host and its batch work runs between
    the steps whatever the pipeline (workers on a 2-core machine compete with the step for the same cores)."""
    import torch

    from . import bench, config
    from .models import SimpleCNN
    from .modules import ImageClassifierModule
    size = config.run_size("03_gpu_and_data")
    steps, rounds = max(10, min(size.bench_steps, 30)), 3  # a JPEG round takes about a second even on 2 cores
    max_wait = max_wait if max_wait is not None else 0.10 if torch.cuda.is_available() else 0.35

    def run(dm) -> dict:
        # a small CNN: cheap enough that the data decide, costly enough that Lightning's own work between
        # steps does not count as most of the wait
        return bench.bench(ImageClassifierModule(SimpleCNN()), dm, "check", steps=steps, warmup=2)

    base, mine = [], []
    for _ in range(rounds):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(run(jpeg_datamodule(batch_size, subset=batch_size * (steps + 3))))
        mine.append(run(make_data(batch_size)))
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    ratio, wait = med(mine, "images_per_s") / med(base, "images_per_s"), med(mine, "data_wait")
    passed = ratio >= target and wait < max_wait
    print(f"Exercise 1: {ratio:.2f}x the JPEG pipeline's images/s (target >= {target:g}x), data wait {wait:.0%} "
          f"(target < {max_wait:.0%}; the JPEG pipeline's {med(base, 'data_wait'):.0%}) on "
          f"{config.hardware_label()}, median of {rounds} alternating rounds of {steps} steps: "
          f"{'passed' if passed else 'not yet'}")
    return passed
