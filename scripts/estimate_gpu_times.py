"""Estimate each lesson's full-size wall time on a T4 and an H100 from its FLOPs, bytes and data-sheet peaks.

Not a measurement: it prices what each lesson's spec says its notebook's sections run (course_lib.base.lessons'
sections, as base.workloads records; this script holds no lesson of its own) at the GPU run size (FLOPs on the meta
device, bytes that cross the host link, eager kernels per step), divides by flops.GPU_PEAKS and the link's
bandwidth, and adds fixed costs read from the committed CPU run. Every assumption is a named constant below with its
reason.

    .venv/bin/python -m scripts.estimate_gpu_times            # print the per-lesson arithmetic
    .venv/bin/python -m scripts.estimate_gpu_times --write    # rewrite docs/results/gpu-estimates.md and the
                                                              # README's estimate table (its marked block)
"""
from __future__ import annotations

import argparse
import copy
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from course_lib.base import config, hardware, lessons, results, workloads
from course_lib.base.internals import TorchDispatchMode  # sees every aten op (a private torch name)
from course_lib.entry import runner  # the installed course: no sys.path
from course_lib.measure import flops
from course_lib.training import models

ROOT = Path(__file__).resolve().parents[1]

LESSONS = lessons.names()  # the lesson specs (course_lib.base.lessons): their sections say what each runs
IMAGE_FLOATS = workloads.IMAGE_FLOATS

# --- the two GPUs: names as torch.cuda.get_device_name() gives them, so flops.gpu_peaks finds their rows ---------
# host link: T4 is a PCIe 3.0 x16 card, the H100 SXM's host link is PCIe 5.0 x16 (NVIDIA's data sheets); x16
# bandwidth per direction: 15.7 GB/s (3.0) and 63.0 GB/s (5.0), https://hpc-notes.pages.dev/reference/pcie
GPUS = {
    "T4": dict(device_name="Tesla T4", bf16_native=False, link_gb_s=15.7, link="PCIe 3.0 x16",
               host_cores=2),  # Colab's T4 runtime: 2 vCPUs (assumed; decides lesson 03's worker rows)
    "H100": dict(device_name="NVIDIA H100 80GB HBM3", bf16_native=True, link_gb_s=63.0, link="PCIe 5.0 x16",
                 host_cores=16),  # a cloud H100 VM slice (assumed 16 cores, as this project's device machine)
}

# --- assumptions (not measurements): each is a range, low end -> the fast estimate, high end -> the slow one ------
UTILISATION = (0.40, 0.10)  # fraction of the dense peak a small CIFAR CNN's kernels reach (assumed)
LAUNCH_US = (5.0, 20.0)  # host cost of one eager aten op: dispatch + kernel launch, microseconds (assumed)
CUDA_INIT_S = (1.0, 5.0)  # CUDA context and cuDNN/cuBLAS handles, once per kernel (assumed)
START_LO_S = 3.0  # imports and data load at best (assumed); the slow end is lesson 00's committed CPU wall time
COMPILE_FACTOR = (1.0, 3.0)  # Inductor's GPU (Triton) compile / the CPU run's cold compile (assumed)
HOST_UTIL = (1.0, 0.25)  # host CNN work at this fraction of lesson 00's CPU fp32 matmul rate (assumed)
HOST_FACTOR = (1.0, 2.0)  # host-bound work on the GPU machine's CPU / on the committed run's CPU (assumed)


@dataclass
class Item:
    """One piece of a lesson: seconds (lower bound, fast estimate, slow estimate) on one GPU, and what it is."""

    what: str
    lower: float
    fast: float
    slow: float
    flops: float = 0.0
    h2d_bytes: float = 0.0


# --- reading the committed CPU run: docs/results/lesson-times.json (runner.LessonRun records, with their figures) ---
def committed_run(lesson: str) -> runner.LessonRun:
    """A lesson's committed full-size CPU run (runner.committed_runs: docs/results/lesson-times.json, which the
    README's lesson table shows)."""
    runs = runner.committed_runs()
    if lesson not in runs:
        raise ValueError(f"{runner.times_file()} has no run of {lesson}: run it with the runner's --inplace.")
    return runs[lesson]


def cpu_wall_s(lesson: str) -> float:
    """A lesson's committed full-size CPU wall time in seconds."""
    return committed_run(lesson).seconds


@functools.lru_cache(maxsize=None)
def committed() -> dict:
    """The committed CPU run's figures that price every lesson's work (the sections' own figures they read through
    workloads.Run.figure), each a typed record (no text is parsed), each named in its lesson's spec."""
    lightning = [committed_run("02_lightning").figure(name).value for name in lessons.TRAINER_ROWS_OVERHEAD]
    return {
        "host_gflops": committed_run("00_setup").figure("fp32 matmul").value,
        # Trainer loop cost per step over a plain loop; a row below the plain loop's (a noisy round) counts as none
        "lightning_ms": (max(0.0, min(lightning)), max(lightning)),
    }


def figure_lines() -> list[str]:
    """A line per figure the lesson specs name (lessons.Lesson.figures): its committed value and spread."""
    lines = []
    for spec in lessons.LESSONS:
        for f in map(committed_run(spec.name).figure, spec.figures):
            spread = f" ({f.low:,.4g}-{f.high:,.4g})" if f.low is not None and f.high is not None else ""
            lines.append(f"  - {spec.name}, {f.name}: {f.value:,.4g}{spread} {f.unit}".rstrip())
    return lines


def uncounted_lines() -> list[str]:
    """A line per notebook section whose spec says the estimate leaves it out (a note starting 'not counted')."""
    return [f"- {spec.name}, \"{s.heading}\": {s.note}" for spec in lessons.LESSONS for s in spec.sections
            if s.note.startswith("not counted")]


# --- counting: FLOPs on the meta device, eager ops with a dispatch mode ------------------------------------------
class _OpCount(TorchDispatchMode):
    """Counts aten ops (each is at least one kernel launch in eager mode)."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


NETS = {"lenet": lambda w: models.LeNet(), "simple_cnn": lambda w: models.SimpleCNN(),  # w: workloads.Steps.width
        "resnet9": lambda w: models.ResNet9(width=w),
        "airnet": lambda w: models.AirNet(tuple(round(c * w) for c in models.WIDTHS))}


@functools.lru_cache(maxsize=None)
def per_image(net: str, width, train: bool) -> tuple[float, int]:
    """(FLOPs per image, eager ops per step) of one step: forward+backward when train, forward alone otherwise."""
    batch = 2  # FLOPs grow linearly with the batch; 2 keeps BatchNorm's training statistics defined
    if train:
        total = flops.train_step_flops(NETS[net](width), batch)
    meta = copy.deepcopy(NETS[net](width)).to("meta").train(train)
    x = torch.zeros(batch, 3, 32, 32, device="meta")
    y = torch.zeros(batch, dtype=torch.long, device="meta")
    with _OpCount() as ops:
        if train:
            F.cross_entropy(meta(x), y).backward()
        else:
            with torch.no_grad(), FlopCounterMode(display=False) as counter:
                meta(x)
            total = counter.get_total_flops()
    return total / batch, ops.n


class Estimator:
    """Seconds for each kind of work on one GPU, from its peaks, link and the assumptions above."""

    def __init__(self, gpu: str):
        spec = GPUS[gpu]
        self.gpu, self.spec = gpu, spec
        part, self.peaks, self.source = flops.gpu_peaks(spec["device_name"])
        self.part = part
        info = {"gpu": spec["device_name"], "bf16_native": spec["bf16_native"]}
        self.mixed = hardware.number_format(hardware.choose_precision(info=info))
        self.c = committed()

    def peak(self, precision: str) -> float:
        """Dense FLOP/s for 'fp32', 'tf32', 'fp16', 'bf16', 'mixed' (the precision policy's format on this GPU) or
        'default' (PyTorch's defaults for a CNN: TF32 convolutions where the GPU has TF32, else fp32)."""
        key = {"mixed": self.mixed, "default": "tf32" if "tf32" in self.peaks else "fp32"}.get(precision, precision)
        return self.peaks[key] * 1e12

    def steps(self, what, net, batch, steps, train=True, precision="default", loop="lightning", width=64,
              on_device=False) -> Item:
        """`steps` steps of a net at `batch` images: compute-bound or launch-bound, whichever is slower, plus the
        Trainer's per-step cost and the batch's host-to-device copy (none when the data already lives there)."""
        flop_img, ops = per_image(net, width if net in ("resnet9", "airnet") else None, train)
        flops, nbytes = flop_img * batch * steps, (0 if on_device else batch * IMAGE_FLOATS * 4 * steps)
        peak, link = self.peak(precision), self.spec["link_gb_s"] * 1e9
        loop_ms = self.c["lightning_ms"] if loop == "lightning" else (0.0, 0.0)
        est = [steps * max(flop_img * batch / (peak * u), ops * us * 1e-6) + steps * ms * 1e-3
               for u, us, ms in zip(UTILISATION, LAUNCH_US, loop_ms)]
        return Item(what, flops / peak + nbytes / link, est[0] + nbytes / link, est[1] + nbytes / link, flops, nbytes)

    def matmul(self, what, n, calls, precision="fp32") -> Item:
        """`calls` n x n x n products (2 n^3 FLOPs each); large products reach near peak, so UTILISATION's fast
        end is replaced by 100 % of peak (still bounded by the slow end's assumption)."""
        flops, peak = 2 * n**3 * calls, self.peak(precision)
        return Item(what, flops / peak, flops / peak, flops / (peak * UTILISATION[1]), flops)

    def copy(self, what, nbytes) -> Item:
        """Bytes over the host link at its data-sheet bandwidth (a pageable copy reaches less: the slow end
        allows half)."""
        link = self.spec["link_gb_s"] * 1e9
        return Item(what, nbytes / link, nbytes / link, 2 * nbytes / link, 0.0, nbytes)

    def host_flops(self, what, flops) -> Item:
        """CNN work that stays on the host CPU, at lesson 00's committed CPU matmul rate times HOST_UTIL."""
        rate = self.c["host_gflops"] * 1e9
        return Item(what, 0.0, flops / (rate * HOST_UTIL[0]), flops / (rate * HOST_UTIL[1]), flops)

    def host_s(self, what, lo, hi, flops=0.0) -> Item:
        """Seconds of host-bound work read from the committed CPU run, times HOST_FACTOR (flops: for the record)."""
        return Item(what, 0.0, lo * HOST_FACTOR[0], hi * HOST_FACTOR[1], flops)

    def fixed(self, what, lo, hi) -> Item:
        """A fixed cost that does not scale with FLOPs."""
        return Item(what, 0.0, lo, hi)


def host_forward(net, images, width=64) -> float:
    """FLOPs of a forward pass over `images` images."""
    return per_image(net, width if net in ("resnet9", "airnet") else None, False)[0] * images


def host_train(net, images, width=64) -> float:
    """FLOPs of training steps over `images` images."""
    return per_image(net, width if net in ("resnet9", "airnet") else None, True)[0] * images


# --- the lessons: each spec's sections (base.lessons, base.workloads), priced on one GPU ----------------------------
def run_of(lesson: str, e: Estimator, size: str = "full") -> workloads.Run:
    """A lesson's run as its spec's sections see it: its size on a machine with one GPU (config.run_size), what of
    that GPU the notebook's choices depend on, and the committed CPU runs."""
    s = config.run_size(lesson, gpu=True, size=size)
    return workloads.Run(size=size, repeats=s.repeats, bench_steps=s.bench_steps, epochs=s.epochs,
                         batch_size=s.batch_size, width=s.width, train_subset=s.train_subset,
                         eval_subset=s.eval_subset, host_cores=e.spec["host_cores"], mixed=e.mixed,
                         formats=frozenset(e.peaks), figure=lambda name, fig: committed_run(name).figure(fig),
                         wall_s=cpu_wall_s)


def passes_flops(passes: tuple[workloads.Images, ...]) -> float:
    """FLOPs of images through nets on the host (forward, or forward+backward where a pass trains)."""
    return sum((host_train if p.train else host_forward)(p.net, p.images, p.width) for p in passes)


def price(w: workloads.Work, e: Estimator) -> Item:
    """One record of a section's work as an Item on this GPU."""
    if isinstance(w, workloads.Steps):
        return e.steps(w.what, w.net, w.batch, w.steps, train=w.train, precision=w.fmt, loop=w.loop,
                       width=w.width, on_device=w.on_device)
    if isinstance(w, workloads.Matmul):
        return e.matmul(w.what, w.n, w.calls, precision=w.fmt)
    if isinstance(w, workloads.Copy):
        return e.copy(w.what, w.nbytes)
    if isinstance(w, workloads.HostFlops):
        return e.host_flops(w.what, passes_flops(w.passes))
    if isinstance(w, workloads.HostSeconds):
        return e.host_s(w.what, w.lo, w.hi, passes_flops(w.passes))
    if isinstance(w, workloads.Launches):  # eager ops at the launch cost each, nothing else
        return e.fixed(w.what, w.ops * LAUNCH_US[0] * 1e-6, w.ops * LAUNCH_US[1] * 1e-6)
    if isinstance(w, workloads.Compile):
        return e.fixed(w.what, w.lo * COMPILE_FACTOR[0], w.hi * COMPILE_FACTOR[1])
    raise TypeError(f"No price for {type(w).__name__}: base.workloads' records are {workloads.Work}.")


def lesson_items(lesson: str, e: Estimator, size: str = "full") -> list[Item]:
    """What one lesson does on a machine with one GPU, at a run size, as Items: the start, then what each section
    of its spec runs, in the notebook's order."""
    run = run_of(lesson, e, size)
    items = [e.fixed("start: imports, data load (slow end: lesson 00's whole CPU run)", START_LO_S,
                     cpu_wall_s("00_setup")),
             e.fixed("CUDA context and library handles", *CUDA_INIT_S)]
    return items + [price(w, e) for section in lessons.get(lesson).sections for w in section.work(run)]


def totals(items: list[Item]) -> dict:
    """Sums of an item list: lower bound, fast and slow estimate (s), FLOPs, host-to-device bytes."""
    return {k: sum(getattr(i, k) for i in items) for k in ("lower", "fast", "slow", "flops", "h2d_bytes")}


def _end(seconds: float, up: bool) -> tuple[int, str]:
    """One end of a range: 5 s steps below a minute and a half, whole minutes above (rounded outwards)."""
    step, unit = (5, "s") if seconds < 90 else (60, "min")
    n = (math.ceil if up else math.floor)(seconds / step)
    return max(n, 1) * (step if unit == "s" else 1), unit


def span(lo: float, hi: float) -> str:
    """A range as the README shows it, e.g. "5-15 s", "55 s-2 min", "4-18 min"."""
    (a, ua), (b, ub) = _end(lo, False), _end(hi, True)
    return f"{a}-{b} {ub}" if ua == ub else f"{a} {ua}-{b} {ub}"


def estimates(size: str = "full") -> dict:
    """{lesson: {gpu: (totals, items)}} for every lesson on both GPUs."""
    est = {g: Estimator(g) for g in GPUS}
    out = {}
    for lesson in LESSONS:
        out[lesson] = {}
        for g, e in est.items():
            items = lesson_items(lesson, e, size)
            out[lesson][g] = (totals(items), items)
    return out


def readme_cells(result: dict | None = None) -> dict:
    """{lesson: (T4 cell, H100 cell)} as the README's estimate table shows them."""
    result = result or estimates()
    return {lesson: tuple(span(result[lesson][g][0]["fast"], result[lesson][g][0]["slow"]) for g in GPUS)
            for lesson in LESSONS}


README_BLOCK = "gpu-estimates"  # the README's marked block (results.block_markers) that readme_table fills


def readme_table(cells: dict) -> list[str]:
    """The README's estimate table, the one generator of its lines: per lesson, the T4 and H100 ranges."""
    return results.markdown_table(["lesson", *(f"{g} (estimate)" for g in GPUS)],
                                  [[lesson, *cells[lesson]] for lesson in LESSONS])


def report(result: dict) -> str:
    """The markdown of docs/results/gpu-estimates.md: inputs, formula, assumptions, per-lesson arithmetic."""
    e = {g: Estimator(g) for g in GPUS}
    c = committed()
    lines = [
        "# Estimated lesson times on a T4 and an H100 (estimates, not measurements)",
        "",
        "No GPU has run the lessons yet. Until a GPU run replaces them, these are **estimates** from counting, made by",
        "`scripts/estimate_gpu_times.py` on the CPU in seconds:",
        "",
        "    .venv/bin/python -m scripts.estimate_gpu_times --write",
        "",
        "## Method",
        "",
        "For each lesson at full size on a machine with one GPU (`config.run_size(lesson, gpu=True)`, so",
        "`LESSON_SCALES`' GPU rows), the lesson's spec (`base/lessons.py`, `sections`) lists what each section of",
        "the notebook runs: which model, batch, steps, repeats and precision, and which parts stay on the host CPU",
        "(`base/workloads.py`'s records); the script prices each record. For each training or evaluation phase:",
        "",
        "- FLOPs per image: `flops.train_step_flops` (forward + backward, measure_flops on the meta device) or a",
        "  forward pass under FlopCounterMode; eager aten ops per step counted with a TorchDispatchMode on meta.",
        "- step time = max(FLOPs per step / (peak x utilisation), ops per step x launch cost) + the Trainer's",
        "  per-step cost (Lightning phases only) + batch bytes / host-link bandwidth (loader phases only).",
        "- lower bound = FLOPs / peak + bytes / link: 100 % of the data-sheet peak, no launch or loop cost.",
        "- the estimate's fast end uses the optimistic end of every assumption, its slow end the pessimistic one.",
        "",
        "\"section N\" below is the notebook's heading \"## N.\" (cell numbers shift when a lesson changes). The",
        "script reads its fixed costs from the committed runs' figures (`docs/results/lesson-times.json`, which",
        "`make lessons` writes; each lesson's spec in `base/lessons.py` names the figures), so rerun it with",
        "`--write` after `make lessons`; `tests/test_gpu_estimates.py` fails when the README's estimate table",
        "differs from its output.",
        "",
        "Peaks (dense, `flops.GPU_PEAKS`), each at the course's precision policy (`hardware.choose_precision`):",
        "",
    ]
    for g, est in e.items():
        lines.append(f"- {g}: {est.part}, fp32 {est.peaks['fp32']:g} TFLOP/s"
                     + (f", tf32 {est.peaks['tf32']:g}" if "tf32" in est.peaks else "")
                     + f", mixed precision = {est.mixed} {est.peaks[est.mixed]:g} TFLOP/s ({est.source}); host link "
                     f"{est.spec['link']}, {est.spec['link_gb_s']:g} GB/s per direction "
                     f"(https://hpc-notes.pages.dev/reference/pcie).")
    lines += [
        "",
        "## Assumptions (not measured)",
        "",
        f"- Utilisation of the dense peak by these small CIFAR-10 CNNs: {UTILISATION[1]:.0%}-{UTILISATION[0]:.0%}. "
        "Large matmuls (lessons 00, 03, 04) are allowed up to 100 %.",
        f"- Host cost per eager op (dispatch + kernel launch): {LAUNCH_US[0]:g}-{LAUNCH_US[1]:g} us. Small models "
        "at small batches (LeNet, batch 4-64) are bound by this, not by FLOPs.",
        f"- CUDA context and library handles: {CUDA_INIT_S[0]:g}-{CUDA_INIT_S[1]:g} s per lesson.",
        f"- Start-up (imports, data load): {START_LO_S:g} s to lesson 00's whole CPU wall time "
        f"({cpu_wall_s('00_setup'):g} s, its committed run), an upper bound.",
        f"- torch.compile on the GPU (Triton): {COMPILE_FACTOR[0]:g}-{COMPILE_FACTOR[1]:g}x the CPU run's cold "
        "compile of the same function.",
        f"- Host-bound work (JPEG decode, CPU-only cells) on the GPU machine's CPU: {HOST_FACTOR[0]:g}-"
        f"{HOST_FACTOR[1]:g}x its committed CPU time; CNN work on the host at {HOST_UTIL[1]:.0%}-{HOST_UTIL[0]:.0%} "
        "of lesson 00's CPU matmul rate.",
        f"- Host cores: T4 machine {GPUS['T4']['host_cores']} (Colab), H100 machine {GPUS['H100']['host_cores']}; "
        "they decide lesson 03's worker rows. The H100 column uses the same host rates as the T4's (a faster host "
        "shortens lessons 02, 03, 06 and 07 there).",
        "- Not counted: optimizer kernels (foreach: a handful per step), the DataLoader's per-batch host work",
        "  beyond the launch cost, the exercises' checks, plots, cuDNN's algorithm search, torchmetrics' updates",
        "  beyond the Trainer's measured per-step cost, and these sections, as their specs say:",
        *uncounted_lines(),
        "",
        "## Fixed costs read off the committed CPU run",
        "",
        f"- Lightning's per-step cost over a plain loop: {c['lightning_ms'][0]:+.2f} to {c['lightning_ms'][1]:+.2f} "
        "ms (lesson 02, section 5's rows).",
        f"- Host fp32 matmul: {c['host_gflops']:,.0f} GFLOP/s (lesson 00).",
        "- The committed wall times (the README's lesson table) and the figures the lesson specs name, each a",
        "  median (with the slowest and fastest run where it has several) at full size on the committed CPU:",
        *figure_lines(),
        "",
        "## Per lesson",
        "",
    ]
    rows = []
    for lesson, by in result.items():
        t, h = by["T4"][0], by["H100"][0]
        rows.append([lesson, *(cell for e in (t, h) for cell in (f"{e['lower']:.1f} s", f"{span(e['fast'], e['slow'])} "
                                                                  f"({e['fast']:.0f}-{e['slow']:.0f} s)")),
                     f"{t['flops'] / 1e12:.3g}", f"{t['h2d_bytes'] / 1e9:.3g}"])
    lines += results.markdown_table(["lesson", "T4 lower bound", "T4 estimate", "H100 lower bound", "H100 estimate",
                                     "T4 run: training+eval TFLOP (GPU and host)", "host-to-device GB"], rows)
    lines += ["", "The lower bound counts only GPU FLOPs and link bytes, so lessons dominated by host work or",
              "fixed costs sit far above it.", ""]
    for lesson, by in result.items():
        lines += [f"### {lesson}", ""]
        for g, (_, items) in by.items():  # one table per GPU: their items differ (formats a GPU lacks are skipped)
            lines += results.markdown_table(
                [f"{g}: item", "lower bound", "estimate (fast-slow)", "TFLOP"],
                [[it.what, f"{it.lower:.2f} s", f"{it.fast:.1f}-{it.slow:.1f} s", f"{it.flops / 1e12:.3g}"]
                 for it in items])
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Print the estimate (default) or write the doc and the README columns (--write)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/results/gpu-estimates.md and README.md")
    parser.add_argument("--size", default="full", choices=sorted(config.SIZES))
    args = parser.parse_args()
    result = estimates(args.size)
    text = report(result)
    if args.write:
        results.write_text(ROOT / "docs" / "results" / "gpu-estimates.md", text + "\n")
        results.replace_block(ROOT / "README.md", README_BLOCK, readme_table(readme_cells(result)))
    print(text)


if __name__ == "__main__":
    main()
