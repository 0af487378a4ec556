"""FLOPs of a training step (Lightning's measure_flops on the meta device) against the GPU's dense peak per precision:
the peak table with its sources, the one decider of a peak (peak), and achieved TFLOP/s as a fraction of it."""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import measure_flops
from torch import nn

from ..base import hardware

# Dense peaks in TFLOP/s (no 2:4 sparsity) per precision, from the pages named beside each: figures that the vendor
# lists "with sparsity" are halved, as its footnotes say. A precision missing from a row has no sourced figure here.
# Patterns are matched against torch.cuda.get_device_name(); first match wins, so variants come before their family.
GPU_PEAKS = [  # (pattern, part, {precision: TFLOP/s}, source)
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", {"fp32": 51, "tf32": 378, "fp16": 756.5, "bf16": 756.5, "fp8": 1513},
     "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),  # NVIDIA's table; sparse figures halved
    (r"\bH100\b(?!.*\b(PCIe|NVL)\b)", "H100 SXM",
     {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979},
     "https://archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html"),
    (r"\bH200\b(?!.*\bNVL\b)", "H200 SXM", {"fp32": 66.91, "fp16": 989, "bf16": 989, "fp8": 1979},
     "https://itkb.uw.cz/2026/06/nvidia-h200-vs-b300-precisions-cores.html (dense); fp32: "
     "https://hmc-tech.com/gpu/nvidia-h100-vs-nvidia-h200-sxm-vs-nvidia-gb200"),
    (r"\bA100\b", "A100", {"fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312},
     "https://glennklockwood.com/garden/processors/A100 (from NVIDIA's A100 data sheet)"),
    (r"\bL4\b", "L4", {"fp32": 30.29, "tf32": 60, "fp16": 121, "bf16": 121, "fp8": 242.5},
     "https://grokipedia.com/page/NVIDIA_L4_vs_L40S (fp16 242, fp8 485 with sparsity), "
     "https://store.sourcecode.com/en-us/bg-bucket-compare/125/9820 (tf32 120 with sparsity), fp32: "
     "https://fpsbench.com/compare/gpu/nvidia-l4-vs-nvidia-tesla-m40"),
    (r"\bA10\b", "A10", {"fp32": 31.24},  # no sourced tensor-core figure yet
     "https://sysrqmts.com/ru/gpus/compare/nvidia-a10-pcie-vs-nvidia-quadro-rtx-4000"),
    (r"\bT4\b", "T4", {"fp32": 8.141, "fp16": 65.13},  # Turing: no bf16, no tf32
     "https://sysrqmts.com/en/gpus/nvidia/tesla/t4"),
]


def train_step_flops(net: nn.Module, batch_size: int, image_size: int = 32) -> int:
    """FLOPs of one training step (forward + backward) at this batch: Lightning's measure_flops on the meta device."""
    meta = copy.deepcopy(net).to("meta").train()  # pass an uncompiled net; meta tensors do no compute
    x = torch.zeros(batch_size, 3, image_size, image_size, device="meta")
    y = torch.zeros(batch_size, dtype=torch.long, device="meta")
    return measure_flops(meta, lambda: meta(x), lambda logits: F.cross_entropy(logits, y))


def gpu_peaks(name: str | None) -> tuple[str, dict, str] | None:
    """(part, {precision: dense TFLOP/s}, source) for a torch.cuda.get_device_name() string; None if not listed."""
    return next(((part, peaks, source) for pattern, part, peaks, source in GPU_PEAKS
                 if name and re.search(pattern, name)), None)


def peak(info: dict | None = None, precision: str = "bf16") -> tuple[float | None, str]:
    """The one decider of a GPU's peak: (TFLOP/s or None, where it comes from, or why there is none), in `precision`
    (fp32, tf32, fp16, bf16, fp8) for info's GPU (hardware.facts() unless given), from GPU_PEAKS only.

    Not from Lightning's get_available_flops (lightning 2.6), neither first nor as a fallback: its table mixes dense
    and with-sparsity figures (H200 bf16 2,000 TFLOP/s is the sparse one, H100 SXM's 989 the dense), its name
    matching gives an L40S the L4's row (any name containing "l4") and knows no "NVIDIA H200", it has no fp8, and it
    reads the live device (CUDA starts: ddp_notebook could no longer fork). Lesson 02 calls it only to explain why
    ThroughputMonitor, which divides by it, reports an MFU or not."""
    gpu = (info or hardware.facts()).get("gpu")
    found = gpu_peaks(gpu)
    if found and precision in found[1]:
        return found[1][precision], f"{found[1][precision]:g} TFLOP/s dense {precision} on the {found[0]} ({found[2]})"
    return None, (f"no {precision} peak known for {gpu or 'this CPU'} (flops.GPU_PEAKS lists "
                  f"{', '.join(part for _, part, _, _ in GPU_PEAKS)})")


def peak_tflops(info: dict | None = None, precision: str = "bf16") -> float | None:
    """peak()'s TFLOP/s: None on a CPU, an unknown GPU or a precision without a figure."""
    return peak(info, precision)[0]


def peak_text(info: dict | None = None, precision: str = "bf16") -> str:
    """peak()'s source line, or a clear 'no peak known' naming the GPU and the table."""
    return peak(info, precision)[1]


@dataclass(frozen=True)
class Achieved:
    """A rate achieved against the data sheet: TFLOP/s, the dense peak in the number format (None: none known, so
    no fraction is guessed), the fraction of it, and the peak in words (naming its source, or why there is none)."""
    tflops: float
    peak_tflops: float | None
    fraction_of_peak: float | None
    peak_text: str


def achieved(flops: float, seconds: float, info: dict | None = None, precision: str = "bf16") -> Achieved:
    """Achieved TFLOP/s for `flops` done in `seconds`, and its fraction of the dense peak in `precision` if known."""
    tflops, (top, text) = flops / seconds / 1e12, peak(info, precision)
    return Achieved(tflops, top, tflops / top if top else None, text)
