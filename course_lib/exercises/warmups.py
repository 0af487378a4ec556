"""The warm-up exercises' answers: each check computes the expected value here, from the lesson's objects, so the
notebook's check call never shows it. An answer of None means not attempted yet (nothing is computed)."""
from __future__ import annotations

import math
import statistics

import torch
from torch.utils.data import DataLoader, DistributedSampler

from ..measure import timing
from ..training import runs


def check(name: str, answer, expected, rel_tol: float = 0.05) -> bool | None:
    """Warm-up: compare a learner's answer with the expected value; None means not attempted yet (no error). An answer
    is right or wrong (equal, or within rel_tol): not a measured figure against a target, which verdict.against
    decides."""
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


def _ask(name: str, answer, expected, rel_tol: float):
    """check, computing `expected()` only for an attempted answer (some answers are measurements)."""
    return check(name, None, None) if answer is None else check(name, answer, expected(), rel_tol=rel_tol)


def steps_per_epoch(name: str, answer, dm):
    """Optimiser steps in one training epoch of a DataModule (the last batch may be partial)."""
    return _ask(name, answer, lambda: len(dm.train_dataloader()), 0)


def steps_at_batch(name: str, answer, dm, batch: int):
    """Optimiser steps in one epoch of dm's training set at another `batch`, the last partial batch dropped."""
    return _ask(name, answer, lambda: len(DataLoader(dm.train_set, batch_size=batch, drop_last=True)), 0)


def matmul_seconds(name: str, answer, device: str, n: int = 4096):
    """Seconds of one fp32 n x n matmul on `device`, measured now (median over timing.time_calls' blocks); within
    50 %."""
    def measure():
        a = torch.randn(n, n, device=device)
        return statistics.median(timing.time_calls(lambda: a @ a, min_run_time=0.5))
    return _ask(name, answer, measure, 0.5)


def most_confused(name: str, answer, cm, classes: list[str], true_class: str = "cat"):
    """The class most often predicted for images of `true_class`, apart from itself, from a confusion matrix."""
    def expected():
        row = cm[classes.index(true_class)].clone()  # (classes,) predictions for that true class
        row[classes.index(true_class)] = -1  # leave out the correct answer
        return classes[int(row.argmax())]
    return _ask(name, answer, expected, 0)


def optimizer_steps(name: str, answer, trainer):
    """Optimiser steps a Trainer has taken."""
    return _ask(name, answer, lambda: trainer.global_step, 0)


def best_checkpoint_accuracy(name: str, answer, trainer, ckpt, dm):
    """Test accuracy of the best checkpoint, computed now with trainer.test; within 1 %."""
    return _ask(name, answer, lambda: trainer.test(ckpt_path=ckpt.best_model_path, datamodule=dm,
                                                   verbose=False)[0]["test_acc"], 0.01)


def scaled_lr(name: str, answer, *, batch: int, base_lr: float, base_batch: int):
    """The linear scaling rule: the learning rate grows with the batch."""
    return _ask(name, answer, lambda: base_lr * batch / base_batch, 0.01)


def fp16_loss_scale(name: str, answer, gradient: float = 1e-10):
    """The smallest power-of-two loss scale that lifts `gradient` to fp16's smallest normal number or above."""
    smallest = torch.finfo(torch.float16).smallest_normal
    return _ask(name, answer, lambda: 2.0 ** math.ceil(math.log2(smallest / gradient)), 1e-6)


def bf16_values_in_octave(name: str, answer):
    """How many bf16 numbers lie in [1, 2): one per mantissa pattern."""
    return _ask(name, answer, lambda: round(1 / torch.finfo(torch.bfloat16).eps), 0)


def images_per_optimizer_step(name: str, answer, *, devices: int, per_device: int, accumulate: int):
    """Images one optimiser step averages over, asked of a Trainer built (not started) on CPU processes."""
    def expected():
        planned = runs.trainer(None, accelerator="cpu", devices=devices, strategy="ddp_notebook",
                               accumulate_grad_batches=accumulate, logger=False)
        return planned.world_size * planned.accumulate_grad_batches * per_device
    return _ask(name, answer, expected, 0)


def distributed_steps(name: str, answer, *, n: int, replicas: int, batch: int, seed: int):
    """Optimiser steps per epoch for rank 0 of `replicas` processes over n samples, as DistributedSampler pads it."""
    def expected():
        rank0 = DistributedSampler(range(n), num_replicas=replicas, rank=0, shuffle=True, seed=seed)
        return len(DataLoader(range(n), batch_size=batch, sampler=rank0))
    return _ask(name, answer, expected, 0)


def images_per_second(name: str, answer, *, batch: int, ms_per_call: float):
    """Images per second from one call's latency at a batch size; within 5 %."""
    return _ask(name, answer, lambda: batch / (ms_per_call / 1e3), 0.05)
