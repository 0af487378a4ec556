"""The one run-size switch, where files go, and the one data-source resolver; banner() prints all three with the
hardware (course_lib.base.hardware) at the top of every lesson."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from . import hardware, lessons
from .errors import CourseError, MissingPathError
from .files import atomic_file

#: The course repository (a placeholder until it is published: change it here, then wherever the tests point).
#: Every lesson's install cell and the README's Colab links must use this exact URL (tested).
REPO_URL = "https://github.com/fast-dl-course/lightning-speed-course"

SIZE_ENV = "COURSE_SIZE"  # smoke | full
DATA_ENV = "COURSE_DATA"  # unset/"torchvision" = download CIFAR-10, else an image folder <root>/<split>/<class>/*.jpg
DATA_ROOT_ENV = "COURSE_DATA_ROOT"  # where downloads and caches go (default: the repo's data/)
BUILD_ENV = "COURSE_BUILD"  # where executed notebooks, results and summaries go (default: the repo's build/)


@dataclass(frozen=True)
class RunSize:
    """Everything that differs between a CI smoke run and the real course."""

    name: str
    train_subset: int | None  # training images used; None = all of the training split
    eval_subset: int | None  # validation/test images used; None = all
    epochs: int  # epochs for the lesson's main training run
    bench_steps: int  # timed steps per throughput measurement, after warm-up
    repeats: int  # repeated measurements per figure (median reported)
    width: float = 1.0  # fraction of the lesson's full network width (channels)
    batch_size: int | None = None  # images per step where the size decides it; None: the lesson's own choice


SIZES = {
    # smoke: every lesson in about a minute on 2 CPU cores; numbers are for checking the code, not for reading
    "smoke": RunSize("smoke", train_subset=2048, eval_subset=1024, epochs=1, bench_steps=6, repeats=1),
    # full: the real course; test accuracy on the whole held-out split
    # 6 interleaved rounds: the fewest whose sign test can call a difference at 5 % (course_lib.measure.significance)
    "full": RunSize("full", train_subset=None, eval_subset=None, epochs=3, bench_steps=100, repeats=6),
}


CPU_EMULATED_BF16 = lessons.CPU_EMULATED_BF16  # the device kind of a CPU without native bf16 instructions

# Lessons whose work does not fit the common size, from their specs (course_lib.base.lessons): (lesson, size, device
# kind) -> the RunSize fields that differ.
LESSON_SCALES = {(unit.name, s.size, s.kind): s.changes() for unit in lessons.LESSONS + lessons.SCRIPTS
                 for s in unit.scales}

#: make course's time on any CPU class: each lesson's full size on a CPU is fitted to its share, LESSON_BUDGET_S
COURSE_BUDGET_S = 70 * 60
#: the seconds each lesson's full run may take on a CPU (each lesson's spec: budget_s)
LESSON_BUDGET_S = {lesson.name: lesson.budget_s for lesson in lessons.LESSONS if lesson.budget_s}
#: the fp32 matmul GFLOP/s of lesson 00's fastest block on the two reference CPUs, by 'native bf16?'
REFERENCE_GFLOPS = {True: 203.0, False: 94.0}
#: what the budget rule scales from: (reference GFLOP/s, wall s per lesson: each lesson spec's reference_s)
REFERENCE_RUNS = {native: (gflops, {lesson.name: lesson.reference_s[0 if native else 1] for lesson in lessons.LESSONS
                                    if lesson.reference_s})
                  for native, gflops in REFERENCE_GFLOPS.items()}
TRAIN_IMAGES = 40_000  # a full run's training images: the 50,000 less 10 % validation and 10 % test (data.py)


@dataclass(frozen=True)
class Budget:
    """A lesson's full size fitted to this machine: its budget, its predicted time at the listed size (the reference
    run's, scaled by the reference's fp32 matmul rate over this machine's), and the fraction of the work kept."""
    lesson: str
    budget_s: float
    predicted_s: float | None  # None: no ceilings saved yet, so nothing to predict from
    gflops: float | None  # this machine's fp32 matmul rate (lesson 00's ceilings)
    fraction: float  # of the training images and timed steps kept: 1 where the prediction fits the budget

    def line(self) -> str:
        """One line for the lesson's configuration cell."""
        head = f"time budget {self.budget_s:.0f} s"
        if self.predicted_s is None:
            return (f"{head}; no full-size ceilings of this CPU saved yet (lesson 00 measures them), "
                    "so it runs the listed full size")
        keep = ("it runs the listed full size" if self.fraction >= 1
                else f"it keeps {100 * self.fraction:.0f} % of its images and timed steps")
        return (f"{head}; predicted {self.predicted_s:.0f} s at the listed size from lesson 00's fp32 matmul rate "
                f"here,\n  {self.gflops:.0f} GFLOP/s, so {keep}")


def lesson_budget(lesson: str, gflops: float | None, native_bf16: bool) -> Budget:
    """The budget rule: predicted = the reference run's seconds x its GFLOP/s / this machine's; the fraction kept is
    budget / predicted, at most 1 (the repeats a verdict needs are never cut: fit_to_budget)."""
    budget = LESSON_BUDGET_S[lesson]
    if not gflops:
        return Budget(lesson, budget, None, None, 1.0)
    # a CPU that emulates bf16 takes at least the native run's time at its fp32 rate (only bf16 work differs), so
    # it takes the larger: its own class's run may predate work the lessons added since
    predicted = max(REFERENCE_RUNS[native][1][lesson] * REFERENCE_RUNS[native][0] / gflops
                    for native in {native_bf16, True})
    return Budget(lesson, budget, predicted, gflops, min(1.0, budget / predicted))


def fit_to_budget(size: RunSize, fraction: float, floor: RunSize) -> RunSize:
    """A full size with `fraction` of its training images and timed steps, never below `floor` (the lesson's smoke
    size); repeats, epochs and the evaluation images stay (the verdicts' rounds, accuracy on the whole held-out
    split)."""
    if fraction >= 1:
        return size
    listed = size.train_subset or TRAIN_IMAGES
    images = min(listed, max(floor.train_subset or listed, round(fraction * listed)))
    steps = min(size.bench_steps, max(floor.bench_steps, round(fraction * size.bench_steps)))
    return replace(size, train_subset=images, bench_steps=steps)


def cpu_gflops() -> float | None:
    """This machine's fp32 matmul rate in GFLOP/s from lesson 00's full-size ceilings (ceilings.save), measured with
    this thread count and torch; None before (a smoke run's or another setting's figure would mis-size the run)."""
    try:
        saved = json.loads(ceilings_file("cpu").read_text())
        rate = max(saved["rows"]["matmul fp32"]["values"]) / 1e9  # the ceiling's figure: its fastest block
    except (OSError, KeyError, ValueError):
        return None
    same = (saved.get("size"), saved.get("threads"), saved.get("torch")) == ("full", torch.get_num_threads(),
                                                                             torch.__version__)
    return rate if same else None


def budget(lesson: str) -> Budget | None:
    """This lesson's budget on this machine: None on a GPU (full is the real thing) or for a lesson without one."""
    if lesson not in LESSON_BUDGET_S or hardware.has_gpu():
        return None
    return lesson_budget(lesson, cpu_gflops(), hardware.cpu_bf16_native())


def file_name(text: str) -> str:
    """`text` (a GPU's name, say) as a file name: runs of anything but letters, digits, '.', '-', '_' become '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip())


def ceilings_file(device: str) -> Path:
    """Where this machine's ceilings on `device` are saved: build/ceilings/<hardware>-<device>.json."""
    return build_dir() / "ceilings" / f"{file_name(hardware.label())}-{device}.json"


def run_size(lesson: str | None = None, gpu: bool | None = None, size: str | None = None, fit: bool = True) -> RunSize:
    """The run size from the switch (env COURSE_SIZE, default full), the only place it is read; for a lesson, with
    that lesson's scale on this kind of device (gpu: None asks the hardware; a CPU without native bf16 takes a
    CPU_EMULATED_BF16 row where the lesson has one) from LESSON_SCALES. size names a size
    instead of the switch (a script's --dry-run asks for "smoke"). A CPU's full size is fitted to the lesson's time
    budget (budget, fit_to_budget); fit=False gives the size as listed."""
    name = (size or os.environ.get(SIZE_ENV, "full")).strip().lower()
    if name not in SIZES:
        raise CourseError(f"{SIZE_ENV}={name!r} is not a run size; set {SIZE_ENV} to one of {sorted(SIZES)}.")
    if lesson is None:
        return SIZES[name]
    gpu = hardware.has_gpu() if gpu is None else gpu
    kind = "gpu" if gpu else "cpu"
    if kind == "cpu" and (lesson, name, CPU_EMULATED_BF16) in LESSON_SCALES and not hardware.cpu_bf16_native():
        kind = CPU_EMULATED_BF16  # this CPU has no bf16 instructions: the lesson's scale for emulated bf16
    listed = replace(SIZES[name], **LESSON_SCALES.get((lesson, name, kind), {}))
    fitted = budget(lesson) if fit and name == "full" and not gpu else None
    return fit_to_budget(listed, fitted.fraction, run_size(lesson, gpu, "smoke")) if fitted else listed


def repo_root() -> Path | None:
    """The source checkout this package lives in, or None when installed elsewhere (e.g. on Colab)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() else None


def data_root() -> Path:
    """Folder for downloads and caches: $COURSE_DATA_ROOT, else the repo's data/, else ./data."""
    if os.environ.get(DATA_ROOT_ENV):
        return Path(os.environ[DATA_ROOT_ENV]).expanduser()
    root = repo_root()
    return root / "data" if root else Path("data")


def build_dir() -> Path:
    """Folder for executed notebooks, results and summaries: $COURSE_BUILD, else the repo's build/."""
    if os.environ.get(BUILD_ENV):
        return Path(os.environ[BUILD_ENV]).expanduser()
    root = repo_root()
    return root / "build" if root else Path("build")


def shared_data_folder() -> Path:
    """Where an instructor's or CI machine keeps CIFAR-10 as JPEG class folders: ../shared/data/cifar10-jpeg."""
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar10-jpeg"


def unwritable(folder: Path, err: OSError, variable: str = BUILD_ENV) -> CourseError:
    """The one message for an OS error on the course's own output or cache folders: the folder, the reason, and the
    variable that moves it (COURSE_BUILD for runs, COURSE_DATA_ROOT for downloads and caches)."""
    return CourseError(f"Cannot write to {folder} ({err.strerror or err}). Make it writable, or set {variable} to a "
                       f"folder you can write to.")


def write_atomically(path: Path, text: str) -> None:
    """Write a text file whole (files.atomic_file); OS errors name the folder."""
    try:
        with atomic_file(path) as f:
            f.write(text)
    except OSError as err:
        raise unwritable(path.parent, err) from None


def data_source(given: str | Path | None = None, *, need_files: bool = False) -> str | None:
    """The one data-source resolver: `given` (a script's --data), else $COURSE_DATA, else the shared folder where it
    exists; None (or 'torchvision' given or set) means torchvision's CIFAR-10 download. A named source that does
    not exist, or a folder without train/, raises FileNotFoundError naming the remedy, as does need_files=True (a
    script that reads the files itself) where the answer would be the download. Every lesson's banner prints it."""
    given = "" if given is None else str(given).strip()
    named = given or os.environ.get(DATA_ENV, "").strip()
    if named == "" and (shared_data_folder() / "train").is_dir():
        return str(shared_data_folder())
    if named in ("", "torchvision"):
        if need_files:
            raise MissingPathError(
                f"No CIFAR-10 files here: {DATA_ENV} is {'unset' if named == '' else named!r} and "
                f"{shared_data_folder()} is absent. Pass --data <folder>, or set {DATA_ENV}=<folder>, to a folder "
                f"laid out as <folder>/train/<class>/*.jpg (or a tensor file this script wrote).")
        return None
    path = Path(named).expanduser()
    if not path.exists() or (path.is_dir() and not (path / "train").is_dir()):
        what = "does not exist" if not path.exists() else "has no train/<class>/*.jpg folder"
        named_by = "given as the data source" if given else f"named by {DATA_ENV}"
        raise MissingPathError(f"{named}, {named_by}, {what}. Point it (--data, image_folder or {DATA_ENV}) at a "
                               f"folder laid out as <folder>/train/<class>/*.jpg (or a .pt tensor file), or set "
                               f"{DATA_ENV}=torchvision to download CIFAR-10.")
    return str(path)


def child_env() -> dict:
    """os.environ with this course_lib's folder on PYTHONPATH: child processes import it even when not installed."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [str(Path(__file__).resolve().parents[2]), *inherited]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


def banner(lesson: str) -> dict:
    """Print the run size and hardware this lesson's outputs come from; the first output of every lesson. Stops with
    the fix where an NVIDIA driver is loaded but torch cannot use its GPU (hardware.check_cuda)."""
    hardware.check_cuda()
    size, info = run_size(), hardware.facts()
    print(f"{lesson} | run size: {size.name} | hardware: {hardware.label(info)}")
    fitted = budget(lesson) if size.name == "full" else None
    if fitted:
        print(fitted.line())
    print(f"torch {info['torch']}, torchvision {info['torchvision']}, lightning {info['lightning']}, "
          f"python {info['python']} | data: {_shown(data_source()) or 'torchvision CIFAR-10'}")
    return {"lesson": lesson, "size": size.name, **info}


def _shown(path: str | None) -> str | None:
    """A data path as outputs show it: relative to the checkout where it is near it, so no machine's layout leaks."""
    root = repo_root()
    if path is None or root is None or not Path(path).is_absolute():
        return path
    rel = os.path.relpath(path, root)
    return rel if rel.count("..") <= 1 else path
