"""The private torch and Lightning APIs the course needs, each in one named helper with the reason no public API fits.

Nothing else in course_lib/ or scripts/ reaches into a private name (tests/test_internals.py scans for it), so a torch
or Lightning release that moves one breaks here, in one place, and tests/test_internals.py says which helper."""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

# The documented hook that sees every aten op a call runs, backward's included ("Extending PyTorch": torch dispatch
# modes); its only home is a private module. torch.overrides.TorchFunctionMode is public but sees torch functions
# before they decompose into aten ops (and none of autograd's), and the public FlopCounterMode counts matmul FLOPs only.
# Subclass it: roofline's op recorder and scripts/estimate_gpu_times.py's kernel count do.
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401  (re-exported: the one import of it)


def inductor_freezing() -> contextlib.AbstractContextManager:
    """A context in which torch.compile freezes parameters into constants (Inductor's `freezing` flag, set globally).

    Dynamo reads the flag while it traces (parameters become constants), so torch.compile(options={"freezing": True}),
    which reaches Inductor only, is not enough: the int8 weight prepack then fails. TORCHINDUCTOR_FREEZING=1 is read
    once, when torch._inductor.config is imported, so it cannot be switched for one model."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


def ddp_logging_data(net: torch.nn.parallel.DistributedDataParallel) -> dict:
    """DDP's own statistics of its run so far: bucket sizes ("rebuilt_bucket_sizes", bytes, comma-separated) and mean
    backward, all-reduce and overlap times ("avg_backward_*", ns), among others.

    Only DDP's C++ logger records the overlap of the all-reduce with backward, and torch exposes it only through
    this method (which DDP's own docstring for static_graph points to); a public comm hook sees buckets, not times."""
    return net._get_ddp_logging_data()


def epoch_batch_progress(trainer):
    """The current epoch's training-batch counters: `.ready` (batches fetched) and `.completed` (batches finished),
    restored from the checkpoint when a run resumes mid-epoch.

    Lightning passes batch_idx to the batch hooks only, after the training loader was built; a loader that resumes
    mid-epoch, or a callback that reports it at train start, needs the fit loop's progress, which has no public name
    (trainer.global_step counts optimizer steps, which gradient accumulation and manual optimisation decouple)."""
    return trainer.fit_loop.epoch_loop.batch_progress.current


def profiled_fetch_and_step_s(profiler) -> tuple[float, float]:
    """Seconds a fit's lightning SimpleProfiler recorded fetching training batches and running training steps, each
    summed over the run (lesson 03 compares the two).

    The profiler names the fetch after the loop class that records it, a private one
    ("[_TrainingEpochLoop].train_dataloader_next"), and its public output is the text report alone; the course's own
    measurement of the same wait is timing.BenchCallback's wait_s, which lesson 03 uses from its ladder on."""
    spent = {name: sum(times) for name, times in profiler.recorded_durations.items()}
    return spent["[_TrainingEpochLoop].train_dataloader_next"], spent["run_training_batch"]


def onednn_int8_matmul(x: torch.Tensor, w: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A call computing x @ w.T (x uint8 (m, k), w int8 (n, k); int32 sums, fp32 out) through oneDNN's int8 linear
    kernel: the kernel Inductor emits for lesson 07's compiled PT2E int8 Linear layers, on a CPU.

    The kernel is registered under torch.ops.onednn, a namespace torch documents nowhere, and its signature follows
    Inductor's lowering from release to release; the public routes fit worse: torchao's safe_int_mm falls back to an
    int32 torch.matmul on a CPU (no VNNI instruction runs), and compiling a quantized Linear costs tens of seconds."""
    packed = torch.ops.onednn.qlinear_prepack(w, list(x.shape))
    w_scales, w_zero_points = torch.ones(w.shape[0]), torch.zeros(w.shape[0], dtype=torch.int64)
    return lambda: torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, w_scales, w_zero_points, None, 1.0, 0,
                                                      torch.float32, "none", [None], "")
