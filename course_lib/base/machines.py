"""The classes of machine the course meets (a CPU's instruction sets, a GPU's facts) and the one seam that emulates
one: COURSE_HARDWARE. Imports nothing from course_lib but errors."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .errors import CourseError

#: The one seam for the hardware: set COURSE_HARDWARE to a class's name and every decision the course makes by
#: hardware (precision, compile, the int8 backend, the Newton-Schulz dtype, run sizes, ceilings' formats, lesson text)
#: answers as on that class; the tests' `hardware_class` fixture sets it. A CPU class replaces the CPU's instruction
#: sets; a GPU class adds that GPU's facts to what facts() reports (for the decisions only: nothing can run on an
#: emulated GPU). The code still runs on this machine's own CPU, so bf16 on a class that claims it, here without
#: it, is emulated and slower, never wrong.
HARDWARE_ENV = "COURSE_HARDWARE"


@dataclass(frozen=True)
class HardwareClass:
    """One class of machine the course meets: its CPU's instruction sets, and the GPU facts _gpu_info() reports."""
    name: str
    example: str  # a machine of this class, for messages and tables
    flags: frozenset[str]
    gpu: dict | None = None


_AVX2 = frozenset({"avx2", "fma3"})  # torch.cpu.get_capabilities() spelling
_AVX512 = _AVX2 | {"avx512_f", "avx512_bw", "avx512_vl", "avx512_vnni"}
_AVX512_BF16 = _AVX512 | {"avx512_bf16"}
_AMX = _AVX512_BF16 | {"amx_tile", "amx_int8", "amx_bf16"}


def _gpu(name: str, cc: str, memory_gib: float) -> dict:
    """The facts _gpu_info() reports for one GPU of this model."""
    return {"gpu": name, "gpu_count": 1, "gpu_memory_gib": memory_gib, "compute_capability": cc,
            "bf16_native": tuple(map(int, cc.split("."))) >= (8, 0), "cuda": "12.8"}


#: every class a test can emulate; a GPU class's host CPU is the AVX-512 class (its CPU decides nothing on a GPU)
CLASSES = {c.name: c for c in [
    HardwareClass("cpu-avx2", "AMD EPYC 7B12 (Zen 2)", _AVX2),
    HardwareClass("cpu-avx512", "Intel Xeon Gold 6248 (Cascade Lake: VNNI, no bf16)", _AVX512),
    HardwareClass("cpu-avx512-bf16", "AMD EPYC 9B14 (Zen 4: AVX512_BF16, VNNI, no AMX)", _AVX512_BF16),
    HardwareClass("cpu-amx", "Intel Xeon Platinum 8480+ (Sapphire Rapids: AMX)", _AMX),
    HardwareClass("gpu-t4", "Tesla T4", _AVX512, _gpu("Tesla T4", "7.5", 14.6)),
    HardwareClass("gpu-a100", "NVIDIA A100-SXM4-40GB", _AVX512, _gpu("NVIDIA A100-SXM4-40GB", "8.0", 39.4)),
    HardwareClass("gpu-l4", "NVIDIA L4", _AVX512, _gpu("NVIDIA L4", "8.9", 22.0)),
    HardwareClass("gpu-h100", "NVIDIA H100 80GB HBM3", _AVX512, _gpu("NVIDIA H100 80GB HBM3", "9.0", 79.1)),
]}
CPU_CLASSES = tuple(n for n, c in CLASSES.items() if c.gpu is None)
GPU_CLASSES = tuple(n for n, c in CLASSES.items() if c.gpu is not None)


def emulated() -> HardwareClass | None:
    """The class COURSE_HARDWARE names (None when unset); an unknown name is an error listing the classes."""
    name = os.environ.get(HARDWARE_ENV, "").strip()
    if not name:
        return None
    if name not in CLASSES:
        raise CourseError(f"{HARDWARE_ENV}={name!r} is not a hardware class; use one of {sorted(CLASSES)}, or unset it "
                          f"to use this machine's own.")
    return CLASSES[name]


#: CPU instruction sets that compute bf16 natively (x86 AVX-512 bf16 dot products, AMX bf16 tiles, Arm's bf16
#: extension); without one, CPU autocast converts bf16 to fp32 around every product and bf16-mixed runs slower
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def native_bf16(flags: frozenset[str]) -> bool:
    """Whether these instruction sets compute bf16 natively (one of CPU_BF16_FLAGS)."""
    return bool(flags & set(CPU_BF16_FLAGS))


def own_class(flags: frozenset[str]) -> str:
    """The CPU class a CPU with these instruction sets (hardware.own_cpu_flags()) falls in."""
    if "amx_bf16" in flags:
        return "cpu-amx"
    if native_bf16(flags):
        return "cpu-avx512-bf16"
    return "cpu-avx512" if "avx512_f" in flags else "cpu-avx2"


def runnable_classes(flags: frozenset[str]) -> tuple[str, ...]:
    """The CPU classes whose instruction sets a CPU with these flags has: an emulated run of one executes natively, as
    on that class (a class claiming more, bf16 say, still runs, but emulated and slower)."""
    return tuple(n for n in CPU_CLASSES if CLASSES[n].flags <= flags)


def other_class(flags: frozenset[str]) -> str:
    """The cheapest CPU class with the other answer to 'native bf16?' than a CPU with these flags: what make test runs
    the hardware-dependent tests under besides the machine's own (AVX2 where bf16 is native, else AVX512_BF16,
    emulated and slower)."""
    return "cpu-avx2" if native_bf16(flags) else "cpu-avx512-bf16"


def cpu_name(model: str) -> str:
    """A CPU model name as a label shows it: trademarks, 'CPU', 'Processor' and the clock left out ('Intel(R) Xeon(R)
    CPU @ 2.20GHz' -> 'Intel Xeon'), so every figure's hardware line stays short; the name itself where nothing is
    left."""
    short = re.sub(r"\((?:R|TM|tm)\)|\bCPU\b|\bProcessor\b|@\s*[\d.]+\s*GHz", " ", model)
    return " ".join(short.split()) or model.strip()
