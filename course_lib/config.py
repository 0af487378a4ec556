"""The one run-size switch, where files go, what hardware this is, and where measured figures are recorded."""
from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
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


SIZES = {
    # smoke: every lesson in about a minute on 2 CPU cores; numbers are for checking the code, not for reading
    "smoke": RunSize("smoke", train_subset=2048, eval_subset=1024, epochs=1, bench_steps=6, repeats=1),
    # full: the real course; test accuracy on the whole held-out split
    "full": RunSize("full", train_subset=None, eval_subset=None, epochs=3, bench_steps=100, repeats=3),
}


def run_size() -> RunSize:
    """Read the run-size switch (env COURSE_SIZE, default full); the only place it is read."""
    name = os.environ.get(SIZE_ENV, "full").strip().lower()
    if name not in SIZES:
        raise ValueError(f"{SIZE_ENV}={name!r} is not a run size; set {SIZE_ENV} to one of {sorted(SIZES)}.")
    return SIZES[name]


def _repo_root() -> Path | None:
    """The source checkout this package lives in, or None when installed elsewhere (e.g. on Colab)."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").exists() else None


def data_root() -> Path:
    """Folder for downloads and caches: $COURSE_DATA_ROOT, else the repo's data/, else ./data."""
    if os.environ.get(DATA_ROOT_ENV):
        return Path(os.environ[DATA_ROOT_ENV]).expanduser()
    root = _repo_root()
    return root / "data" if root else Path("data")


def build_dir() -> Path:
    """Folder for executed notebooks, results and summaries: $COURSE_BUILD, else the repo's build/."""
    if os.environ.get(BUILD_ENV):
        return Path(os.environ[BUILD_ENV]).expanduser()
    root = _repo_root()
    return root / "build" if root else Path("build")


def data_source() -> str | None:
    """The image folder named by $COURSE_DATA, or None for torchvision's CIFAR-10 download."""
    src = os.environ.get(DATA_ENV, "").strip()
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


def banner(lesson: str) -> dict:
    """Print the run size and hardware this lesson's outputs come from; the first output of every lesson."""
    size, info = run_size(), hardware()
    print(f"{lesson} | run size: {size.name} | hardware: {hardware_label(info)}")
    print(f"torch {info['torch']}, torchvision {info['torchvision']}, lightning {info['lightning']}, "
          f"python {info['python']} | data: {data_source() or 'torchvision CIFAR-10'}")
    return {"lesson": lesson, "size": size.name, **info}


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


__all__ = ["REPO_URL", "RunSize", "SIZES", "run_size", "data_root", "build_dir", "data_source", "hardware",
           "CPU_BF16_FLAGS", "bf16_flags_in_cpuinfo", "cpu_bf16_native", "hardware_label", "PRECISIONS",
           "choose_precision", "banner", "record", "load_results"]
