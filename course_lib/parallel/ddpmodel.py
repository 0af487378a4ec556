"""Lesson 06's model of a data-parallel step, built only from what is measured apart from the DDP step it predicts: one
process's step (the per-rank batch, the per-rank threads), sharing the cores (a plain step beside the other ranks, each
step started together as in DDP, against alone), and a ring all-reduce of the gradients' buckets: 2(N-1)/N of the bytes
per process at the measured gloo bandwidth plus one measured latency per call (per DDP bucket), each call timed as a
step meets it (right after a backward) and averaged, the training loop's own collectives (counted apart: Lightning's
loop broadcasts a flag from rank 0 every step), each at its kind's measured latency, and the wait for the slower rank
(the expected slowest of N plain steps in lockstep). The predicted scaling efficiency is one process's step over the
modelled one; what the measured step adds beyond it is left unexplained, and a hand-written loop in the same workers
names where it goes (waiting for the other rank, or a slower all-reduce inside the step)."""
from __future__ import annotations

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
BROADCAST_BYTES = 8  # one int64, as the flag Lightning's loop broadcasts from rank 0 at every step
SIZES = (4, 2**24)  # all-reduce sizes in bytes: one is all latency, 16 MiB mostly bytes (a lesson adds its own)
REPEATS = 7  # rounds of each loop
CALLS = 42  # timed all-reduces per size, spread over the rounds: slow calls come in spells (a step pays the mean)


def _broadcast(tensor: torch.Tensor) -> None:
    """Rank 0's `tensor` to every rank."""
    dist.broadcast(tensor, src=0)


def _collective_times(net, xs, ys, sizes: tuple[int, ...], calls: int, out: dict, collective=dist.all_reduce) -> dict:
    """`out` (bytes -> [s]) with `calls` more `collective`s (all-reduces unless given) of each size, timed as a step
    meets them: right after this rank's backward, the ranks entering together (a barrier); two untimed calls first set
    up gloo's buffers (once)."""
    for nbytes in sizes:
        buf, took, warm = torch.zeros(max(1, nbytes // 4)), [], 0 if nbytes in out else 2
        for i in range(calls + warm):
            net.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(xs[i % len(xs)]), ys[i % len(ys)]).backward()
            dist.barrier()  # every rank enters together: the time is the exchange, not a wait for a peer
            start = time.perf_counter()  # a host clock: gloo runs on the CPU, nothing to synchronize
            collective(buf)
            took.append(time.perf_counter() - start)
        out[nbytes] = out.get(nbytes, []) + took[warm:]
    return out


def _lockstep_steps(net, xs, ys) -> list[float]:
    """train_steps with each step's seconds, every rank starting each step together (a barrier, untimed): the ranks
    compute at the same moments, as in DDP, and exchange nothing; the plain loop's own step-to-step spread."""
    opt, took = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), []
    for x, y in zip(xs, ys):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        took.append(time.perf_counter() - start)
    return took


def _hand_steps(net, xs, ys, found: dict) -> None:
    """The plain loop with the gradients all-reduced by hand as one flat buffer after backward, a barrier first: the
    barrier's time is the wait for the other rank to arrive, the all-reduce's is the exchange inside a step."""
    opt, wait, exchange, begin = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), 0.0, 0.0, time.perf_counter()
    for x, y in zip(xs, ys):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        flat = torch.cat([p.grad.reshape(-1) for p in net.parameters()])  # DDP's one bucket, by hand
        start = time.perf_counter()
        dist.barrier()
        mid = time.perf_counter()
        dist.all_reduce(flat)
        wait, exchange = wait + mid - start, exchange + time.perf_counter() - mid
        for p, part in zip(net.parameters(), flat.div_(dist.get_world_size()).split(
                [p.numel() for p in net.parameters()])):
            p.grad.copy_(part.view_as(p))  # the mean back into each .grad
        opt.step()
    found["wait_s"].append(wait / len(xs))
    found["in_step_s"].append(exchange / len(xs))
    found["hand_s"].append((time.perf_counter() - begin) / len(xs))


def _cost_worker(rank: int, job: Job, sizes: tuple[int, ...], repeats: int, calls: int) -> None:
    job.join(rank, max(1, (os.cpu_count() or 1) // job.world))
    try:
        found = {"alone_s": [], "lockstep_s": [], "ddp_s": [], "wait_s": [], "in_step_s": [], "hand_s": []}
        xs, ys = toy_data(job.steps, job.batch, job.model, job.seed)  # a whole batch per process, as DDP's rows
        found["allreduce_calls"], found["broadcast_calls"], net = {}, {}, toy_model(job.model, job.seed)
        mine = []  # this rank's plain steps in lockstep with the others, one by one
        train_steps(DDP(toy_model(job.model, job.seed)), xs[:2], ys[:2])  # untimed warm-up: allocations, buckets
        for mode in ("allreduce", "alone", "lockstep", "ddp", "hand") * repeats:  # alone: rank 0 only; the rest: all
            dist.barrier()
            if mode == "allreduce":  # a share of the calls each round: a spell of slow calls weighs as long as it lasts
                _collective_times(net, xs, ys, sizes, -(-calls // repeats), found["allreduce_calls"])
                _collective_times(net, xs, ys, (BROADCAST_BYTES,), -(-calls // repeats), found["broadcast_calls"],
                                 _broadcast)
            elif mode == "hand":
                _hand_steps(toy_model(job.model, job.seed), xs, ys, found)
            elif mode == "lockstep":
                mine += _lockstep_steps(toy_model(job.model, job.seed), xs, ys)
                found["lockstep_s"].append(statistics.fmean(mine[-job.steps:]))
            elif rank == 0 or mode != "alone":
                net = toy_model(job.model, job.seed)
                net, start = DDP(net) if mode == "ddp" else net, time.perf_counter()
                train_steps(net, xs, ys)  # ddp: backward all-reduces in buckets, each step waits for the slower rank
                found[f"{mode}_s"].append((time.perf_counter() - start) / job.steps)
        found["allreduce_s"] = {b: statistics.fmean(t) for b, t in found["allreduce_calls"].items()}
        found["broadcast_calls"] = found["broadcast_calls"][BROADCAST_BYTES]
        found["lockstep_steps"] = [None] * job.world
        dist.all_gather_object(found["lockstep_steps"], mine)  # every rank's steps, for the wait for the slowest
        if rank == 0:
            torch.save(found, job.out)
        job.leave()
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class Costs:
    """What measure() timed: every all-reduce's seconds per size in bytes, and their mean; every broadcast's seconds
    (BROADCAST_BYTES from rank 0); rank 0's seconds per step alone, in lockstep with the other ranks (each step
    started together, no exchange) and in DDP, one per round; and per round, the hand-written loop's mean wait for the
    other rank and its all-reduce inside the step, seconds per step; every rank's lockstep steps, one by one."""

    allreduce_s: dict  # bytes -> mean seconds
    allreduce_calls: dict  # bytes -> seconds of each call
    broadcast_calls: list  # seconds of each broadcast of BROADCAST_BYTES
    alone_s: list
    lockstep_s: list
    ddp_s: list
    wait_s: list
    in_step_s: list
    lockstep_steps: list  # per rank: seconds of each step in lockstep
    hand_s: list  # the hand-written loop's seconds per step, one per round

    @property
    def broadcast_s(self) -> float:
        """The broadcasts' mean seconds (a step pays the mean, slow spells included)."""
        return statistics.fmean(self.broadcast_calls)


def measure(world: int = 2, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS, model: str = "lenet",
            batch: int = 64, steps: int = 40, calls: int = CALLS) -> Costs:
    """In `world` spawned gloo workers: `calls` all-reduces of each size in bytes and `calls` broadcasts of
    BROADCAST_BYTES (a share in every round), each after a backward of `model` ("allreduce_calls": bytes -> [s],
    "allreduce_s": their mean, "broadcast_calls": [s]), every rank's plain steps in lockstep ("lockstep_steps"), and
    rank 0's seconds per training step of `model`: alone and with every rank starting each step with it, no
    communication ("alone_s", "lockstep_s"), every rank stepping in DDP ("ddp_s"), and a hand-written loop's wait for
    the other rank and all-reduce per step ("wait_s", "in_step_s"); one figure per round, the loops alternating."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(world=world, store=f"{tmp}/store", out=Path(tmp) / "rank0.pt", steps=steps, batch=batch,
                  model=model, seed=0)
        mp.start_processes(_cost_worker, nprocs=world, start_method="spawn", join=True,
                           args=(job, sizes, repeats, calls))
        return Costs(**torch.load(job.out, weights_only=True))


def link(allreduce_s: dict, world: int, nbytes: float | None = None) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) from all-reduce seconds per size (measure's means): the latency is the smallest
    all-reduce's time, or the faster time of the size nearest `nbytes` (the largest when None) where that one came out
    faster; the bandwidth is what that size got beyond the latency (the largest size's where it got nothing), 2(N-1)/N
    of its bytes per process (a ring). Like memory's, gloo's bandwidth depends on the message's size, so the model reads
    it at the gradients' own where it can."""
    small = min(allreduce_s)
    size = max(allreduce_s) if nbytes is None else min(allreduce_s, key=lambda b: abs(b - nbytes))
    latency = min(allreduce_s[small], allreduce_s[size])  # no message takes less than a call: a slow tiny one was noise
    if allreduce_s[size] <= latency:  # the nearest size measured no slower than a call: read bandwidth at the largest
        size = max(allreduce_s)
    return latency, ring_bytes(size, world) / max(allreduce_s[size] - latency, 1e-12)


def ring_bytes(grad_bytes: float, world: int) -> float:
    """Bytes each process sends (and receives) in a ring all-reduce of `grad_bytes`: 2(N-1)/N of them."""
    return 2 * (world - 1) / world * grad_bytes


def slower_rank(step_s: list[float], world: int) -> float:
    """Seconds a step in lockstep waits for the slowest of `world` ranks: the expected largest of `world` steps drawn
    from `step_s` (plain steps in lockstep, every rank's) less their mean. Each step of a synchronous loop ends
    at the slowest rank's; a rank whose step came out faster waits."""
    xs, n = sorted(step_s), len(step_s)
    if n == 0:
        return 0.0
    top = sum(x * ((k / n) ** world - ((k - 1) / n) ** world) for k, x in enumerate(xs, 1))
    return max(0.0, top - statistics.fmean(xs))


def buckets(tensor_bytes: list[float], cap: float = BUCKET_BYTES) -> list[float]:
    """DDP's gradient buckets in bytes: the parameter tensors in reverse order (backward's), a bucket closed once it
    holds `cap` bytes or more; a tensor is never split, so one above the cap ends a bucket of its own size or more."""
    out, size = [], 0.0
    for nbytes in reversed(tensor_bytes):
        size += nbytes
        if size >= cap:
            out, size = out + [size], 0.0
    return out + [size] if size else out


def loop_seconds(counts: dict, bucket_calls: int, latency: dict, default: float) -> float:
    """Seconds a step spends in collectives beyond DDP's `bucket_calls` all-reduces, the training loop's own: every
    call of `counts` (kind -> calls per step, as scaling.count_collectives gives them) past those all-reduces, each at
    its kind's measured `latency` (kind -> s), or `default` (the all-reduce's) for a kind not measured."""
    extra = {kind: n - (bucket_calls if kind == "all_reduce" else 0) for kind, n in counts.items()}
    return sum(max(0.0, n) * latency.get(kind, default) for kind, n in extra.items())


@dataclass(frozen=True)
class Prediction:
    """The modelled DDP step: seconds per part (compute, sharing the cores, all-reduce latency and bytes, the loop's
    collectives, the slower rank), their sum, the efficiency it predicts (one process's step over the sum), and how many
    buckets (all-reduce calls) it has."""

    parts: dict
    step_s: float
    efficiency: float
    buckets: int


def predict(step_s: float, tensor_bytes: list[float], world: int, *, latency: float, bandwidth: float,
            sharing: float = 1.0, wait: float = 0.0, loop_s: float = 0.0, cap: float = BUCKET_BYTES) -> Prediction:
    """One process's step `step_s` (per-rank batch and threads) on `world` processes: slowed by `sharing` (the plain
    step in lockstep with the others over alone), plus one `latency` per DDP bucket of the parameter tensors
    `tensor_bytes`, the ring's bytes at `bandwidth`, `loop_s` of the training loop's own collectives (loop_seconds) and
    `wait` for the slower rank (slower_rank). No overlap with backward is credited: the last bucket (the first layers'
    gradients) is ready only when backward ends, and earlier ones are charged in full (an upper bound on the
    all-reduce's part; with one bucket, exact). No term is read from a DDP step."""
    calls = buckets(tensor_bytes, cap)
    parts = {"compute": step_s, "sharing the cores": step_s * (sharing - 1),
             "all-reduce latency": latency * len(calls),
             "all-reduce bytes": ring_bytes(sum(tensor_bytes), world) / bandwidth, "the loop's collectives": loop_s,
             "the slower rank": wait}
    step = sum(parts.values())
    return Prediction(parts, step, step_s / step, len(calls))


def breakdown(model: Prediction, measured_efficiency: float) -> dict:
    """Seconds per part of the measured DDP step (one process's step over the measured efficiency): compute (with
    sharing), the modelled all-reduce, the loop's collectives, the wait for the slower rank, and what none explains
    (negative where the model is slower)."""
    measured = model.parts["compute"] / measured_efficiency
    compute = model.parts["compute"] + model.parts["sharing the cores"]
    allreduce = model.parts["all-reduce latency"] + model.parts["all-reduce bytes"]
    wait, loop = model.parts.get("the slower rank", 0.0), model.parts.get("the loop's collectives", 0.0)
    return {"compute": compute, "all-reduce": allreduce, "the loop's collectives": loop, "the slower rank": wait,
            "unexplained": measured - compute - allreduce - loop - wait}


def reason(wait_s: float, in_step_s: float, alone_s: float, latency: float, unexplained_s: float) -> str:
    """One line on the measured step's unexplained seconds, from the hand-written loop: each rank's wait for the other
    (its barrier beyond one call's latency) and the all-reduce's time inside a step beyond alone; the larger is named
    where the two cover half of it or more, else how little they cover."""
    wait, slower = max(0.0, wait_s - latency), max(0.0, in_step_s - alone_s)
    if abs(unexplained_s) < 1e-5:  # under 0.01 ms: nothing left to locate
        return "nothing left inside the step to locate"
    if unexplained_s <= 0:  # nothing left to locate: the model's step is the longer one
        return f"nothing to locate: the modelled step is {1e3 * -unexplained_s:.2f} ms longer than the measured one"
    if wait + slower < unexplained_s / 2:  # a part under 0.01 ms says nothing: left out
        found = [f"{name} ({1e3 * s:.2f} ms)" for name, s in (("the wait for the other rank", wait),
                                                            ("a slower all-reduce", slower)) if s >= 1e-5]
        return (f"not located: by hand, {' and '.join(found) or 'no wait and no slower all-reduce'} "
                f"cover{'s' * (len(found) == 1)} {1e3 * (wait + slower):.2f} of {1e3 * unexplained_s:.2f} ms")
    if wait >= slower:
        return (f"each rank waited {1e3 * wait:.2f} ms a step for the other at the all-reduce "
                f"(by hand; all-reduce {1e3 * in_step_s:.2f} ms, timed apart {1e3 * alone_s:.2f} ms)")
    return (f"the all-reduce took {1e3 * in_step_s:.2f} ms in a step, {1e3 * alone_s:.2f} ms timed apart "
            f"(by hand; the wait for the other rank {1e3 * wait:.2f} ms)")
