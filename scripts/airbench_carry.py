"""airbench94 itself on the course's images, for scripts/gpu_capstone.py: carry the package to an offline machine,
write the data files its loader reads, run and time it as its own train() does, and read its printed results.

The package (airbench 0.1.8 by Keller Jordan, MIT licence, about 40 KB of Python) is copied out of its source
archive into <carry>/airbench/, imported from there on the GPU machine (load_carried): nothing is installed there.
Get the archive once, where there is a network:

    pip download airbench==0.1.8 --no-deps --no-binary :all: -d build/sdist
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import math
import os
import sys
import tarfile
from pathlib import Path

import torch

from course_lib.training import experiments

VERSION = "0.1.8"
COLUMNS = ("run", "epoch", "train_loss", "train_acc", "val_acc", "tta_val_acc", "total_time_seconds")


def carry_package(sdist: Path, carry: Path) -> Path:
    """Copy the airbench/ package folder out of its sdist into carry/airbench/ (plus CARRIED.txt: source, sha256)."""
    out = carry / "airbench"
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.split("/")[-2:-1] == ["airbench"]
                   and m.name.endswith(".py")]
        if not any(m.name.endswith("lib_airbench94.py") for m in members):
            raise SystemExit(f"{sdist} holds no airbench/lib_airbench94.py: pass the airbench {VERSION} sdist.")
        for m in members:
            (out / Path(m.name).name).write_bytes(tar.extractfile(m).read())
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (out / "CARRIED.txt").write_text(f"{sdist.name} sha256 {digest}\n")
    return out


def load_carried(name: str, path: Path, package: bool = False):
    """Import the carried file `path` as module `name` (a package's __init__.py with package=True: its submodules
    then import from its folder), ahead of any installed one, without touching sys.path."""
    locations = [str(path.parent.resolve())] if package else None
    spec = importlib.util.spec_from_file_location(name, path.resolve(), submodule_search_locations=locations)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered first: the package's own `from airbench import ...` finds it
    spec.loader.exec_module(module)
    return module


def import_airbench(carry: Path):
    """Import the carried package (carry/airbench) ahead of any installed one; a clear error if it is missing."""
    if not (carry / "airbench" / "lib_airbench94.py").exists():
        raise FileNotFoundError(f"No airbench package in {carry}/airbench: run `gpu_capstone.py --make-data ... "
                                f"--airbench-sdist airbench-{VERSION}.tar.gz` where the sdist is, and carry {carry}.")
    return load_carried("airbench", carry / "airbench" / "__init__.py", package=True)


def write_data(train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
               test_labels: torch.Tensor, classes: list[str], folder: Path) -> Path:
    """folder/cifar10/{train,test}.pt as airbench's CifarLoader reads them: {'images': uint8 (N, 32, 32, 3) in
    (H, W, C) order, as torchvision's CIFAR10.data, 'labels': int64 (N,), 'classes': list of names}."""
    root = folder / "cifar10"
    root.mkdir(parents=True, exist_ok=True)
    for name, images, labels in (("train", train_images, train_labels), ("test", test_images, test_labels)):
        torch.save({"images": images.cpu().permute(0, 2, 3, 1).contiguous(), "labels": labels.cpu().long(),
                    "classes": list(classes)}, root / f"{name}.pt")
    return root


def check_data(root: Path) -> dict:
    """Read the files back as CifarLoader does (torch.load, then images.half() / 255, permuted to (N, 3, H, W)) and
    check them; returns the image counts. A wrong layout fails here, on any machine, not on the GPU."""
    counts = {}
    for name in ("train", "test"):
        data = torch.load(root / f"{name}.pt", map_location="cpu", weights_only=True)  # plain tensors only
        images, labels = data["images"], data["labels"]
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
            raise ValueError(f"{root}/{name}.pt: images must be uint8 (N, 32, 32, 3), got {images.dtype} "
                             f"{tuple(images.shape)}")
        if labels.dtype != torch.int64 or labels.shape != (len(images),) or not 0 <= labels.min() <= labels.max() < 10:
            raise ValueError(f"{root}/{name}.pt: labels must be int64 (N,) in 0..9")
        if len(data["classes"]) != 10:
            raise ValueError(f"{root}/{name}.pt: 10 class names expected")
        x = (images[:8].half() / 255).permute(0, 3, 1, 2)  # CifarLoader's conversion
        assert x.shape == (len(x), 3, 32, 32)
        counts[name] = len(images)
    return counts


def eval_row(text: str, columns: tuple[str, ...], keep: tuple[str, str], program: str) -> dict:
    """The 'eval' row of a printed airbench table with `columns`: the `keep` columns as floats."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(columns) and cells[1] == "eval":
            row = dict(zip(columns, cells))
            return {name: float(row[name]) for name in keep}
    raise ValueError(f"No 'eval' row in {program}'s output:\n{text[-2000:]}")


def parse_table(text: str) -> dict:
    """The 'eval' row of airbench's printed table: {'tta_val_acc', 'total_time_seconds'} as floats."""
    return eval_row(text, COLUMNS, ("tta_val_acc", "total_time_seconds"), "airbench")


@contextlib.contextmanager
def inside(folder: Path):
    """cd into folder: train94 builds its test loader from the relative path 'cifar10'."""
    old = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


def run(airbench, folder: Path, seeds: list[int], deadline: float | None = None, on_run=None,
        log=print) -> list[dict]:
    """airbench94 as its own main runs it: one CifarLoader over train.pt (batch 1024, flip + translate 2, alternating
    flip), train94 per run (whitening, 9.9 epochs, TTA; timed by airbench with CUDA events, data loading excluded),
    after one untimed warm-up run. Each run: airbench's printed TTA accuracy and time, and the accuracy recounted
    from the returned net (airbench.evaluate, level 2). Stops before a run that would start after `deadline`
    (time.monotonic()); on_run(runs so far) after each run."""
    from airbench import lib_airbench94

    hyp = lib_airbench94.hyp
    with inside(folder):
        loader = airbench.CifarLoader("cifar10", train=True, batch_size=hyp["opt"]["batch_size"], aug=hyp["aug"],
                                      altflip=True)
        test = airbench.CifarLoader("cifar10", train=False, batch_size=2000)

        def one(seed: int | None) -> dict:  # seed None: the warm-up (cuDNN autotuning), not reported
            torch.manual_seed(1000 if seed is None else seed)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                model = airbench.train94(loader, run=0 if seed is None else 1 + seeds.index(seed), verbose=True)
            log(out.getvalue().rstrip())
            printed = parse_table(out.getvalue())
            return {"seed": seed, "acc": airbench.evaluate(model, test, tta_level=hyp["net"]["tta_level"]),
                    "printed_acc": printed["tta_val_acc"], "time_s": printed["total_time_seconds"],
                    "steps": math.ceil(len(loader) * hyp["opt"]["train_epochs"])}

        trials = experiments.seed_loop(one, seeds, warmup=lambda: one(None), deadline=deadline, on_run=on_run)
    if len(trials) < len(seeds):
        log(f"airbench: time budget spent after {len(trials)} runs")
    return trials


# ---- airbench94_muon: a script, not in the package; carried as one file, checked by its sha256 ----

MUON_FILE = "airbench94_muon.py"
MUON_COMMIT = "f1c599c4af24aca803e3e65a6a7e52a502e09d0e"
MUON_URL = f"https://raw.githubusercontent.com/KellerJordan/cifar10-airbench/{MUON_COMMIT}/{MUON_FILE}"
MUON_SHA256 = "704e29251a5207d8aed8a35adf13f772ff386b90a712aaddc2a28854385b536e"  # of the file at MUON_COMMIT
MUON_COLUMNS = ("run", "epoch", "train_acc", "val_acc", "tta_val_acc", "time_seconds")


def carry_muon(source: Path, carry: Path) -> Path:
    """Copy airbench94_muon.py (downloaded from MUON_URL) into carry/, after checking it is that file."""
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest != MUON_SHA256:
        raise SystemExit(f"{source} is not airbench94_muon.py at commit {MUON_COMMIT[:7]} (sha256 {digest}): "
                         f"download it again, curl -fLo {MUON_FILE} {MUON_URL}")
    out = carry / MUON_FILE
    carry.mkdir(parents=True, exist_ok=True)
    out.write_bytes(source.read_bytes())
    return out


def import_muon(carry: Path):
    """Import the carried airbench94_muon.py (its module-level code only reads sys.argv[0]; main() is not run)."""
    path = carry / MUON_FILE
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != MUON_SHA256:
        raise FileNotFoundError(f"No {MUON_FILE} of commit {MUON_COMMIT[:7]} in {carry}: download it ({MUON_URL}) "
                                f"and run `gpu_capstone.py --make-data ... --airbench-muon {MUON_FILE}`, then carry "
                                f"{carry}.")
    return load_carried("airbench94_muon", path)


def parse_muon_table(text: str) -> dict:
    """The 'eval' row of airbench94_muon's printed table: {'tta_val_acc', 'time_seconds'} as floats."""
    return eval_row(text, MUON_COLUMNS, ("tta_val_acc", "time_seconds"), "airbench94_muon")


def run_muon(ab, folder: Path, seeds: list[int], deadline: float | None = None, on_run=None, log=print,
             compile_mode: str = "max-autotune") -> list[dict]:
    """airbench94_muon as its __main__ runs it: one CifarNet on CUDA, channels_last, compiled (compile_mode), one
    warm-up main('warmup') on random labels (compilation), then main(run) per seed (batch 2000, 8 epochs, TTA; timed by
    airbench with CUDA events, whitening + training + TTA, its per-epoch evaluation and data loading excluded).
    Each run: the TTA accuracy main returns and the printed time. Stops before a run that would start after
    `deadline`; on_run(runs so far) after each run."""
    model = ab.CifarNet().cuda().to(memory_format=torch.channels_last)
    model.compile(mode=compile_mode)
    with inside(folder):
        steps = math.ceil(8 * (len(torch.load(Path("cifar10") / "train.pt", weights_only=True)["labels"]) // 2000))

        def one(seed: int | None) -> dict:  # seed None: the warm-up main('warmup'), compilation, not reported
            torch.manual_seed(1000 if seed is None else seed)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                acc = ab.main("warmup" if seed is None else 1 + seeds.index(seed), model)
            log(out.getvalue().rstrip())
            return {"seed": seed, "acc": acc, "time_s": parse_muon_table(out.getvalue())["time_seconds"],
                    "steps": steps}

        trials = experiments.seed_loop(one, seeds, warmup=lambda: one(None), deadline=deadline, on_run=on_run)
    if len(trials) < len(seeds):
        log(f"airbench94_muon: time budget spent after {len(trials)} runs")
    return trials
