"""What this machine is (CPU, its instruction sets, GPU, library versions) and the policies that follow from it:
precision, TF32, and how many devices a launch may ask for. Imports only errors and machines from course_lib."""
from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from . import machines
from .errors import CourseError
from .machines import CLASSES, CPU_CLASSES, GPU_CLASSES, HARDWARE_ENV, HardwareClass, cpu_name, emulated  # noqa: F401

CPUINFO = Path("/proc/cpuinfo")
CPU_BF16_FLAGS = machines.CPU_BF16_FLAGS  # native bf16 (its home: machines, which decides the classes by it)
#: one-instruction int8 dot products (AVX-512 VNNI, AVX-VNNI, AMX int8): without them oneDNN's int8 kernels add
#: pairs of products in 16 bits, which saturate with full-range activations
CPU_INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: the instruction sets that decide this course's CPU speed, as lessons 04 and 07 list them (torch's spelling)
CPU_FLAGS = ("avx2", "avx512_f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def cpuinfo_flags(text: str) -> frozenset[str]:
    """The flags on the first `flags` (x86) or `Features` (Arm) line of /proc/cpuinfo text, in torch's spelling."""
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    # Linux writes avx512f, avx512bw, ...; torch.cpu.get_capabilities() writes avx512_f, avx512_bw, ...
    return frozenset(f"avx512_{f[6:]}" if f.startswith("avx512") and f[6:7] != "_" else f
                     for f in line.partition(":")[2].split())


def cpu_flags() -> frozenset[str]:
    """The one CPU-capability reader: the instruction sets of the emulated class where COURSE_HARDWARE names one,
    else of this CPU (own_cpu_flags)."""
    cls = emulated()
    return cls.flags if cls else own_cpu_flags()


@functools.lru_cache(maxsize=1)
def own_cpu_flags() -> frozenset[str]:
    """The instruction sets this CPU has, whatever COURSE_HARDWARE says: torch.cpu.get_capabilities() where torch has
    it, else /proc/cpuinfo; empty where neither exists (the safe answer: nothing native)."""
    caps = getattr(torch.cpu, "get_capabilities", None)
    if caps is not None:
        return frozenset(name for name, value in caps().items() if value is True)
    try:
        return cpuinfo_flags(CPUINFO.read_text())
    except OSError:  # no /proc (macOS, Windows) and an older torch
        return frozenset()


def cpu_bf16_native() -> bool:
    """Whether this CPU computes bf16 natively (one of CPU_BF16_FLAGS)."""
    return machines.native_bf16(cpu_flags())


def cpu_int8_native() -> bool:
    """Whether this CPU has one-instruction int8 dot products (one of CPU_INT8_FLAGS)."""
    return bool(cpu_flags() & set(CPU_INT8_FLAGS))


def gpu_count() -> int:
    """The one answer to 'is there a GPU?': how many CUDA GPUs this process can see (0 on a CPU-only machine or build).

    torch.cuda.device_count() asks NVML, which opens no CUDA context; torch.cuda.is_available() calls
    cudaGetDeviceCount, which initialises the CUDA driver (cuInit) in this process, after which ddp_notebook's forked
    workers cannot use the GPU (torch's "poisoned fork"). check_cuda, which must know whether CUDA works, asks
    is_available in a child process."""
    return torch.cuda.device_count()


def has_gpu() -> bool:
    """Whether the course decides as on a GPU machine: the emulated class's answer, else whether a GPU is visible."""
    cls = emulated()
    return bool(cls.gpu) if cls else gpu_count() > 0


def facts() -> dict:
    """What this machine is: CPU, GPU, native bf16, and library versions."""
    import lightning
    import torchvision

    cls = emulated()
    found = {
        "cpu": _cpu_name() + (f" emulating {cls.name}" if cls else ""),
        "cpu_class": machines.own_class(cpu_flags()),  # the row of lesson 00's table: cpu-avx2 ... cpu-amx
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_bf16_native": cpu_bf16_native(),
        "cpu_int8_native": cpu_int8_native(),
        "gpu": None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "lightning": lightning.__version__,
    }
    if cls and cls.gpu:
        found.update(cls.gpu)
    elif gpu_count() > 0 and not cls:
        found.update(_gpu_info())
    return found


def compute_capability(info: dict | None = None) -> tuple[int, int] | None:
    """The GPU's compute capability as (major, minor) from facts() (or `info`); None without a GPU."""
    cc = (info or facts()).get("compute_capability")
    return tuple(int(p) for p in cc.split(".")) if cc else None


def label(info: dict | None = None) -> str:
    """A one-line name for the hardware (facts() unless given), used under every published figure."""
    info = info or facts()
    if info.get("gpu"):
        shown = f"{info['gpu_count']}x {info['gpu']} (CUDA {info['cuda']})"
        host = info.get("cpu") or ""  # facts() names an emulated class there: "<cpu> emulating gpu-t4"
        return shown + (f" emulated on {host}" if " emulating " in host else "")
    return f"CPU {info['cpu']} ({info['cpu_cores']} cores)"


@functools.lru_cache(maxsize=1)
def _gpu_info() -> dict:
    """GPU facts; read in a child process unless CUDA is already initialised here (forked DDP needs it untouched)."""
    if torch.cuda.is_initialized():
        return _gpu_info_here()
    package_parent = str(Path(__file__).resolve().parents[2])  # the child imports this course_lib, installed or not
    code = (f"import json, sys; sys.path.insert(0, {package_parent!r}); import course_lib.base.hardware as h; "
            f"print(json.dumps(h._gpu_info_here()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _gpu_info_here() -> dict:
    """GPU facts from this process (initialises CUDA)."""
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_count": gpu_count(),
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "compute_capability": f"{props.major}.{props.minor}",
            "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False), "cuda": torch.version.cuda}


def _cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (cpu_name's short form), or platform's guess elsewhere."""
    try:
        for line in CPUINFO.read_text().splitlines():
            if line.startswith("model name"):
                return cpu_name(line.split(":", 1)[1])
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: Lightning's precisions the course trains in: name -> (its short name, autocast's dtype or None, the number format
#: whose peak it reaches, as flops' tables name it). The one home of precision names.
PRECISION_FORMATS = {
    "32-true": ("32", None, "fp32"),
    "16-mixed": ("16", torch.float16, "fp16"),
    "bf16-mixed": ("bf16", torch.bfloat16, "bf16"),
}
PRECISIONS = tuple(PRECISION_FORMATS)
BASELINE = PRECISIONS[0]  # a benchmark row's precision where it names none: fp32, what the rows compare against


def precision_name(given) -> str:
    """Lightning's full name of a precision given by its full or short name ("bf16" -> "bf16-mixed"); else as given."""
    text = str(given)
    return next((name for name, (short, _, _) in PRECISION_FORMATS.items() if text == short), text)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype autocast computes in under a Lightning precision; None for 32-true (no autocast)."""
    return PRECISION_FORMATS[precision_name(precision)][1]


def number_format(precision: str) -> str:
    """The number format ("fp32", "fp16", "bf16") a Lightning precision's matrix products run in."""
    return PRECISION_FORMATS[precision_name(precision)][2]


def choose_precision(requested: str | None = None, info: dict | None = None, accelerator: str | None = None) -> str:
    """The one decision of the training precision, called by every entry point (runs.trainer, the CLI, the speedrun's
    Trainer and twin, the FLOP summary) with one default: None is the policy, bf16-mixed where bf16 is native (a GPU
    of compute capability 8.0+, info["bf16_native"], or a CPU with one of CPU_BF16_FLAGS, info["cpu_bf16_native"]),
    else 16-mixed on a GPU, 32-true on a CPU. Short names ("bf16") are accepted; accelerator "cpu" applies a CPU's
    rules on a GPU machine. A request the hardware lacks raises, naming the alternative (no silent fallback); an
    explicit bf16-mixed on a CPU without native bf16 runs emulated, which is what lesson 04 measures."""
    info = info or facts()
    if str(accelerator).lower() == "cpu":
        info = {**info, "gpu": None}
    gpu, requested = info.get("gpu"), None if requested is None else precision_name(requested)
    native_bf16 = info.get("bf16_native", False) if gpu else info.get("cpu_bf16_native", False)
    if requested is None:
        return "bf16-mixed" if native_bf16 else "16-mixed" if gpu else "32-true"
    if requested not in PRECISIONS:
        raise CourseError(f"Unknown precision {requested!r}; choose one of {PRECISIONS}.")
    if requested == "bf16-mixed" and gpu and not native_bf16:
        raise CourseError(f"{gpu} (compute capability {info.get('compute_capability')}) has no native bf16: it needs "
                          f"compute capability 8.0 or newer. Use precision='16-mixed' (fp16 with loss scaling).")
    if requested == "16-mixed" and not gpu:
        raise CourseError("precision='16-mixed' (fp16 with a GradScaler) is a GPU technique and there is no CUDA GPU "
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


#: the oldest Linux NVIDIA driver each CUDA major release runs on (CUDA's minor-version compatibility), from NVIDIA's
#: CUDA compatibility guide, https://docs.nvidia.com/deploy/cuda-compatibility/ (table "CUDA Toolkit and Minimum
#: Required Driver Version")
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present wherever the NVIDIA kernel driver is loaded (Linux)


def nvidia_driver(text: str | None = None) -> str | None:
    """The loaded NVIDIA driver's version ('550.54.15') from /proc/driver/nvidia/version text; None without one."""
    if text is None:
        try:
            text = NVIDIA_DRIVER.read_text()
        except OSError:
            return None
    found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", text)
    return found[1] if found else "unknown"


def cuda_problem(driver: str | None, built_for: str | None, usable: bool, visible: str | None = None) -> str | None:
    """Why torch cannot use the NVIDIA GPU whose driver is loaded, naming the fix; None where CUDA works, no driver is
    loaded, or CUDA_VISIBLE_DEVICES (`visible`) hides every GPU on purpose. built_for: torch.version.cuda."""
    if driver is None or usable or (visible is not None and visible.strip() in ("", "-1")):
        return None
    ours = f"torch {torch.__version__}"
    on_cpu = "so torch sees no GPU and the lessons would run on the CPU, many times slower"
    cpu_anyway = "To run on the CPU on purpose, set CUDA_VISIBLE_DEVICES='' before importing course_lib."
    if built_for is None:
        return (f"An NVIDIA driver ({driver}) is loaded, but {ours} is a CPU-only build, {on_cpu}. Fix: install a "
                f"CUDA build of torch that your driver supports (see nvidia-smi's 'CUDA Version'). {cpu_anyway}")
    need, numbers = MIN_DRIVER.get(int(built_for.split(".")[0])), lambda v: tuple(map(int, v.split(".")))
    if need and re.fullmatch(r"[0-9.]+", driver) and numbers(driver) < numbers(need):
        return (f"{ours} is built for CUDA {built_for}, which needs NVIDIA driver {need} or "
                f"newer; this machine's driver is {driver}, {on_cpu}. Fix: keep a torch built for your driver's CUDA. "
                f"On Colab: Runtime > Disconnect and delete runtime, then run the lesson again (the install cell "
                f"keeps Colab's own torch; a torch installed by hand replaced it). Elsewhere: install torch from "
                f"PyTorch's index for your CUDA (https://pytorch.org/get-started/locally/), or update the driver. "
                f"{cpu_anyway}")
    return (f"An NVIDIA driver ({driver}) is loaded and {ours} is built for CUDA {built_for}, yet "
            f"torch.cuda.is_available() is False, {on_cpu}. Fix: check that nvidia-smi lists a GPU and that "
            f"CUDA_VISIBLE_DEVICES ({visible}) names one; on Colab, pick a GPU runtime (Runtime > Change runtime "
            f"type). "
            f"{cpu_anyway}")


def check_cuda() -> None:
    """Raise a RuntimeError naming the fix where an NVIDIA driver is loaded but torch cannot use the GPU (never a silent
    fall back to the CPU). Asks CUDA in a child process unless it is initialised here, so forked DDP stays possible."""
    driver, visible = nvidia_driver(), os.environ.get("CUDA_VISIBLE_DEVICES")
    if driver is None or (visible is not None and visible.strip() in ("", "-1")):
        return
    if torch.cuda.is_initialized():
        usable = torch.cuda.is_available()
    else:
        code = "import torch; print(torch.cuda.is_available())"
        usable = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "True"
    problem = cuda_problem(driver, torch.version.cuda, usable, visible)
    if problem:
        raise RuntimeError(problem)


def check_devices(accelerator, devices) -> None:
    """Fail early, naming the remedy, when a launch asks for more GPUs than this machine has."""
    if not isinstance(accelerator, str) or not str(devices).isdigit():
        return  # "auto", -1, lists and Accelerator objects: Lightning resolves and checks those itself
    want, have, acc = int(devices), gpu_count(), accelerator.lower()
    if (acc in ("gpu", "cuda") or (acc == "auto" and have)) and want > have:
        use_here = (f"Pass --trainer.devices {have} to use the GPUs here" if have else
                    "Check that the GPU driver works (nvidia-smi) and CUDA_VISIBLE_DEVICES is not empty")
        raise CourseError(f"devices={want} asks for {want} GPU(s) per node, but this machine has {have} visible CUDA "
                          f"GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                          f"{use_here}; or spread the run over machines with --trainer.num_nodes and one launch per "
                          f"node (torchrun or SLURM); or pass --trainer.accelerator cpu for CPU processes (gloo).")
    if acc == "auto" and not have and want > 1:
        raise CourseError(f"devices={want} with accelerator=auto, but there is no CUDA GPU here: auto would quietly "
                          f"start {want} CPU processes. Pass --trainer.accelerator cpu if that is what you want.")
    if acc == "cpu" and want > (os.cpu_count() or 1):
        warnings.warn(f"devices={want} CPU processes on {os.cpu_count()} cores: they share the cores, so each runs "
                      f"slower. Fine for testing the DDP code path, not for speed.", stacklevel=2)
