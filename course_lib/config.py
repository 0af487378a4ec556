"""The one run-size switch, where files go, what hardware this is, and where measured figures are recorded."""
from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

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
    "full": RunSize("full", train_subset=None, eval_subset=None, epochs=3, bench_steps=100, repeats=3),
}


# Lessons whose work does not fit the common size: (lesson, size, "cpu" or "gpu") -> what differs. On a CPU, full
# sizes are chosen so each lesson finishes in about 10 minutes on 2 cores; on a GPU, full is the real thing.
LESSON_SCALES = {
    ("04_mixed_precision", "smoke", "cpu"): dict(width=0.25),  # ResNet-9 at 16 channels
    ("04_mixed_precision", "full", "cpu"): dict(train_subset=10_000, width=0.25),  # 16 channels, 10,000 images
    ("07_quantization", "smoke", "cpu"): dict(width=0.25),  # ResNet-9 at 16 channels
    ("07_quantization", "smoke", "gpu"): dict(width=0.25),
    ("07_quantization", "full", "cpu"): dict(train_subset=4_096, eval_subset=2_000, width=0.25),  # 16 channels
    ("08_capstone", "smoke", "cpu"): dict(train_subset=256, eval_subset=256, epochs=2, width=1 / 8, batch_size=64),
    ("08_capstone", "smoke", "gpu"): dict(train_subset=256, eval_subset=256, epochs=2, width=1 / 8, batch_size=64),
    ("08_capstone", "full", "cpu"): dict(train_subset=5_000, epochs=10, width=1 / 4, batch_size=256),
    ("08_capstone", "full", "gpu"): dict(epochs=10, batch_size=1024),  # airbench94's schedule on all the data
    # the GPU scripts' benchmark rows (lessons 03-05 and 06); on a CPU, or at smoke size, they are dry runs
    ("gpu_check", "smoke", "cpu"): dict(bench_steps=2, batch_size=32),
    ("gpu_check", "smoke", "gpu"): dict(bench_steps=2, batch_size=32),
    ("gpu_check", "full", "cpu"): dict(bench_steps=10, batch_size=64),
    ("gpu_check", "full", "gpu"): dict(bench_steps=50, batch_size=512),
    ("gpu_ddp_check", "smoke", "cpu"): dict(bench_steps=2, batch_size=32),
    ("gpu_ddp_check", "smoke", "gpu"): dict(bench_steps=2, batch_size=32),
    ("gpu_ddp_check", "full", "cpu"): dict(bench_steps=10, batch_size=64),
    ("gpu_ddp_check", "full", "gpu"): dict(bench_steps=50, batch_size=256),  # per process
}


def run_size(lesson: str | None = None, gpu: bool | None = None, size: str | None = None) -> RunSize:
    """The run size from the switch (env COURSE_SIZE, default full), the only place it is read; for a lesson, with
    that lesson's scale on this kind of device (gpu: None asks the hardware) from LESSON_SCALES. size names a size
    instead of the switch (a script's --dry-run asks for "smoke")."""
    name = (size or os.environ.get(SIZE_ENV, "full")).strip().lower()
    if name not in SIZES:
        raise ValueError(f"{SIZE_ENV}={name!r} is not a run size; set {SIZE_ENV} to one of {sorted(SIZES)}.")
    if lesson is None:
        return SIZES[name]
    gpu = torch.cuda.device_count() > 0 if gpu is None else gpu  # NVML: no CUDA context, ddp_notebook can fork
    return replace(SIZES[name], **LESSON_SCALES.get((lesson, name, "gpu" if gpu else "cpu"), {}))


def repo_root() -> Path | None:
    """The source checkout this package lives in, or None when installed elsewhere (e.g. on Colab)."""
    root = Path(__file__).resolve().parents[1]
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
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "cifar10-jpeg"


def data_source() -> str | None:
    """The image folder named by $COURSE_DATA; unset, the shared folder where it exists; None (or COURSE_DATA set to
    'torchvision') for torchvision's CIFAR-10 download. The banner of every lesson prints which one it is."""
    src = os.environ.get(DATA_ENV, "").strip()
    if src == "" and (shared_data_folder() / "train").is_dir():
        return str(shared_data_folder())
    return None if src in ("", "torchvision") else src


def hardware() -> dict:
    """What this machine is: CPU, GPU, native bf16, and library versions."""
    import lightning
    import torchvision

    info = {
        "cpu": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_bf16_native": cpu_bf16_native(),
        "gpu": None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "lightning": lightning.__version__,
    }
    if torch.cuda.device_count() > 0:  # asks NVML: does not initialise CUDA, so ddp_notebook can still fork
        info.update(_gpu_info())
    return info


def child_env() -> dict:
    """os.environ with this course_lib's folder on PYTHONPATH: child processes import it even when not installed."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [str(Path(__file__).resolve().parents[1]), *inherited]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(parts)}


@functools.lru_cache(maxsize=1)
def _gpu_info() -> dict:
    """GPU facts; read in a child process unless CUDA is already initialised here (forked DDP needs it untouched)."""
    if torch.cuda.is_initialized():
        return _gpu_info_here()
    code = "import json, course_lib.config as c; print(json.dumps(c._gpu_info_here()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=child_env()).stdout
    return json.loads(out.strip().splitlines()[-1])


def _gpu_info_here() -> dict:
    """GPU facts from this process (initialises CUDA)."""
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_count": torch.cuda.device_count(),
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "compute_capability": f"{props.major}.{props.minor}",
            "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False), "cuda": torch.version.cuda}


def _cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, or platform's guess elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: x86 instruction sets that compute bf16 natively (AVX-512 bf16 dot products, AMX bf16 tiles); without one, CPU
#: autocast converts bf16 to fp32 around every product and bf16-mixed runs slower than fp32
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def bf16_flags_in_cpuinfo(text: str) -> bool:
    """Whether /proc/cpuinfo text lists a native bf16 instruction set on its first `flags` line."""
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return bool(set(line.partition(":")[2].split()) & set(CPU_BF16_FLAGS))


@functools.lru_cache(maxsize=1)
def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 natively: torch.cpu.get_capabilities() where torch has it, else /proc/cpuinfo."""
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        return any(bool(caps().get(flag, False)) for flag in CPU_BF16_FLAGS)
    try:
        return bf16_flags_in_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:  # no /proc (macOS, Windows): assume emulated bf16, the safe default
        return False


def hardware_label(info: dict | None = None) -> str:
    """A one-line name for the hardware, used under every published figure."""
    info = info or hardware()
    if info.get("gpu"):
        return f"{info['gpu_count']}x {info['gpu']} (CUDA {info['cuda']})"
    return f"CPU {info['cpu']} ({info['cpu_cores']} cores)"


PRECISIONS = ("32-true", "16-mixed", "bf16-mixed")


def choose_precision(requested: str | None = None, info: dict | None = None) -> str:
    """Lightning precision for this hardware: bf16-mixed where bf16 is native, else 16-mixed on a GPU, 32-true on a CPU.

    Native bf16: a GPU of compute capability 8.0 or newer (info["bf16_native"]), or a CPU with AVX512_BF16 or AMX
    (info["cpu_bf16_native"]; a missing fact counts as not native). An explicit request the hardware lacks raises a
    ValueError that names the alternative; nothing falls back silently. An explicit bf16-mixed on a CPU without
    native bf16 is honoured: it runs (emulated, usually slower than fp32), which is what lesson 04 measures."""
    info = info or hardware()
    gpu = info.get("gpu")
    native_bf16 = info.get("bf16_native", False) if gpu else info.get("cpu_bf16_native", False)
    if requested is None:
        return "bf16-mixed" if native_bf16 else "16-mixed" if gpu else "32-true"
    if requested not in PRECISIONS:
        raise ValueError(f"Unknown precision {requested!r}; choose one of {PRECISIONS}.")
    if requested == "bf16-mixed" and gpu and not native_bf16:
        raise ValueError(f"{gpu} (compute capability {info.get('compute_capability')}) has no native bf16: it needs "
                         f"compute capability 8.0 or newer. Use precision='16-mixed' (fp16 with loss scaling).")
    if requested == "16-mixed" and not gpu:
        raise ValueError("precision='16-mixed' (fp16 with a GradScaler) is a GPU technique and there is no CUDA GPU "
                         "here. Use '32-true', or 'bf16-mixed' on a CPU with AVX512_BF16 or AMX, or run on a GPU.")
    return requested


def set_tf32(on: bool | None) -> None:
    """TF32 for fp32 matrix products and convolutions (GPUs of compute capability >= 8.0), through one API only:
    the per-backend fp32_precision settings where this torch has them (2.9+; mixing them with the legacy
    allow_tf32 / set_float32_matmul_precision raises), else the legacy pair. None: PyTorch's defaults (full-fp32
    matrix products, TF32 convolutions)."""
    matmul, conv = ("ieee", "tf32") if on is None else ("tf32", "tf32") if on else ("ieee", "ieee")
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = matmul, conv
    else:
        torch.set_float32_matmul_precision("high" if matmul == "tf32" else "highest")
        torch.backends.cudnn.allow_tf32 = conv == "tf32"


def check_devices(accelerator, devices) -> None:
    """Fail early, naming the remedy, when a launch asks for more GPUs than this machine has."""
    if not isinstance(accelerator, str) or not str(devices).isdigit():
        return  # "auto", -1, lists and Accelerator objects: Lightning resolves and checks those itself
    want, have, acc = int(devices), torch.cuda.device_count(), accelerator.lower()
    if (acc in ("gpu", "cuda") or (acc == "auto" and have)) and want > have:
        use_here = (f"Pass --trainer.devices {have} to use the GPUs here" if have else
                    "Check that the GPU driver works (nvidia-smi) and CUDA_VISIBLE_DEVICES is not empty")
        raise ValueError(f"devices={want} asks for {want} GPU(s) per node, but this machine has {have} visible CUDA "
                         f"GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                         f"{use_here}; or spread the run over machines with --trainer.num_nodes and one launch per "
                         f"node (torchrun or SLURM); or pass --trainer.accelerator cpu for CPU processes (gloo).")
    if acc == "auto" and not have and want > 1:
        raise ValueError(f"devices={want} with accelerator=auto, but there is no CUDA GPU here: auto would quietly "
                         f"start {want} CPU processes. Pass --trainer.accelerator cpu if that is what you want.")
    if acc == "cpu" and want > (os.cpu_count() or 1):
        warnings.warn(f"devices={want} CPU processes on {os.cpu_count()} cores: they share the cores, so each runs "
                      f"slower. Fine for testing the DDP code path, not for speed.", stacklevel=2)


def banner(lesson: str) -> dict:
    """Print the run size and hardware this lesson's outputs come from; the first output of every lesson."""
    size, info = run_size(), hardware()
    print(f"{lesson} | run size: {size.name} | hardware: {hardware_label(info)}")
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


def record(lesson: str, name: str, value: float, unit: str = "", note: str = "") -> None:
    """Append one measured figure, with size and hardware, to build/results/<lesson>.json."""
    path = build_dir() / "results" / f"{lesson}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if r["name"] != name]  # re-running a cell replaces its figure
    rows.append({"name": name, "value": float(value), "unit": unit, "note": note, "size": run_size().name,
                 "hardware": hardware_label(), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    path.write_text(json.dumps(rows, indent=1))


def load_results(lesson: str) -> list[dict]:
    """The figures recorded for a lesson, or [] if it has not run."""
    path = build_dir() / "results" / f"{lesson}.json"
    return json.loads(path.read_text()) if path.exists() else []
