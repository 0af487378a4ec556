"""Lesson 06's model of a data-parallel step: what N processes pay beyond one, each part measured in spawned gloo
workers. A ring all-reduce sends 2(N-1)/N of the gradient bytes per process, at the measured bandwidth, plus a fixed
latency per call (per DDP bucket); and on shared cores each process's own step runs slower beside the others
(memory, cache and cores shared). The predicted scaling efficiency is one process's step over the modelled one."""
from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from .parallel import Job, toy_data, toy_model, train_steps

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket cap (bucket_cap_mb=25): one all-reduce call per bucket
SIZES = (4, 2**24)  # all-reduce sizes in bytes: one is all latency, 16 MiB mostly bytes (a lesson adds its own)
REPEATS = 7  # timed all-reduces per size, and rounds of the step alone and beside the others


def _cost_worker(rank: int, job: Job, sizes: tuple[int, ...], repeats: int) -> None:
    job.join(rank, max(1, (os.cpu_count() or 1) // job.world))
    try:
        found = {"allreduce_s": {}, "alone_s": [], "beside_s": [], "ddp_s": []}
        for nbytes in sizes:  # the median call per size, after one untimed call that sets up gloo's buffers
            buf, took = torch.zeros(max(1, nbytes // 4)), []
            for _ in range(repeats + 1):
                dist.barrier()  # every rank enters together: the time is the exchange, not a wait for a peer
                start = time.perf_counter()  # a host clock: gloo runs on the CPU, nothing to synchronize
                dist.all_reduce(buf)
                took.append(time.perf_counter() - start)
            found["allreduce_s"][nbytes] = statistics.median(took[1:])
        xs, ys = toy_data(job.steps, job.batch, job.model, job.seed)  # a whole batch per process, as DDP's rows
        train_steps(DDP(toy_model(job.model, job.seed)), xs[:2], ys[:2])  # untimed warm-up: allocations, buckets
        for mode in ("alone", "beside", "ddp") * repeats:  # rank 0 alone; every rank beside it; every rank in DDP
            dist.barrier()
            if rank == 0 or mode != "alone":
                net = toy_model(job.model, job.seed)
                net, start = DDP(net) if mode == "ddp" else net, time.perf_counter()
                train_steps(net, xs, ys)  # ddp: backward all-reduces in buckets, each step waits for the slower rank
                found[f"{mode}_s"].append((time.perf_counter() - start) / job.steps)
        if rank == 0:
            torch.save(found, job.out)
        job.leave()
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class Costs:
    """What measure() timed: the median all-reduce seconds per size in bytes, and rank 0's seconds per step alone,
    beside the other ranks and in DDP, one per round."""

    allreduce_s: dict  # bytes -> seconds
    alone_s: list
    beside_s: list
    ddp_s: list


def measure(world: int = 2, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS, model: str = "lenet",
            batch: int = 64, steps: int = 40) -> Costs:
    """In `world` spawned gloo workers: the median all-reduce seconds of each size in bytes ("allreduce_s": bytes
    -> s), and rank 0's seconds per training step of `model`: alone and with every rank stepping beside it, no
    communication ("alone_s", "beside_s"), and every rank stepping in DDP ("ddp_s": its all-reduces in backward, its
    hooks and bucket copies, each step waiting for the slower rank); one figure per round, the three alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(world=world, store=f"{tmp}/store", out=Path(tmp) / "rank0.pt", steps=steps, batch=batch,
                  model=model, seed=0)
        mp.start_processes(_cost_worker, nprocs=world, start_method="spawn", join=True, args=(job, sizes, repeats))
        return Costs(**torch.load(job.out, weights_only=True))


def link(allreduce_s: dict, world: int, nbytes: float | None = None) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s): the latency is the smallest all-reduce's time, or the faster time of the size
    nearest `nbytes` (the largest when None) where that one came out faster; the bandwidth is what that size got beyond
    the latency (the largest size's where it got nothing), 2(N-1)/N of its bytes per process (a ring). Like memory's,
    gloo's bandwidth depends on the message's size, so the model reads it at the gradients' own where it can."""
    small = min(allreduce_s)
    size = max(allreduce_s) if nbytes is None else min(allreduce_s, key=lambda b: abs(b - nbytes))
    latency = min(allreduce_s[small], allreduce_s[size])  # no message takes less than a call: a slow tiny one was noise
    if allreduce_s[size] <= latency:  # the nearest size measured no slower than a call: read bandwidth at the largest
        size = max(allreduce_s)
    return latency, ring_bytes(size, world) / max(allreduce_s[size] - latency, 1e-12)


def ring_bytes(grad_bytes: float, world: int) -> float:
    """Bytes each process sends (and receives) in a ring all-reduce of `grad_bytes`: 2(N-1)/N of them."""
    return 2 * (world - 1) / world * grad_bytes


@dataclass(frozen=True)
class Prediction:
    """The modelled DDP step: seconds per part (compute, sharing the cores, all-reduce latency and bytes, DDP hooks
    and waits), their sum, and the efficiency it predicts (one process's step over the sum)."""

    parts: dict
    step_s: float
    efficiency: float


def predict(step_s: float, grad_bytes: float, world: int, *, latency: float, bandwidth: float,
            beside_ratio: float = 1.0, ddp_extra: float = 0.0) -> Prediction:
    """One process's step `step_s` on N processes: its compute slowed by `beside_ratio` (the step beside the others
    over alone), plus one latency per DDP bucket and the ring's bytes at `bandwidth`, plus what DDP's measured step
    (plain loop) took beyond the step beside the others and those two (`ddp_extra`: its hooks and bucket copies, and
    each step's wait for the slower rank, whose steps vary). Seconds per part, the modelled step, and the efficiency
    it predicts (one process's step over it: weak scaling, the same batch per process)."""
    parts = {"compute": step_s, "sharing the cores": step_s * (beside_ratio - 1),
             "all-reduce latency": latency * max(1, math.ceil(grad_bytes / BUCKET_BYTES)),
             "all-reduce bytes": ring_bytes(grad_bytes, world) / bandwidth}
    parts["DDP hooks, waits"] = max(0.0, ddp_extra - parts["all-reduce latency"] - parts["all-reduce bytes"])
    step = sum(parts.values())
    return Prediction(parts, step, step_s / step)
