"""Lesson 06's data parallelism by hand: DDP and hand-written all-reduces in forked gloo processes, against one
process on the full batches, and whether forking is safe here (throughput on N devices: scaling.py)."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from .models import build_model


def toy_data(steps: int, batch: int, model: str = "toy", seed: int = 0):
    """Fixed random batches: (steps, batch, 32) or (steps, batch, 3, 32, 32) inputs, (steps, batch) labels."""
    g = torch.Generator().manual_seed(seed)
    shape, classes = ((32,), 4) if model == "toy" else ((3, 32, 32), 10)
    return torch.randn(steps, batch, *shape, generator=g), torch.randint(0, classes, (steps, batch), generator=g)


def toy_model(name: str = "toy", seed: int = 0) -> nn.Module:
    """A seeded MLP on 32 features ("toy") or a course backbone; every call with one seed gives the same weights."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)) if name == "toy" else build_model(name)


def train_steps(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor, lr: float = 0.1) -> nn.Module:
    """Plain SGD with momentum, one step per batch; the loss is the mean over the samples this process sees."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for x, y in zip(xs, ys):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()  # under DDP, backward also all-reduces the gradients
        opt.step()
    return model


def _ddp_worker(rank, world, store, steps, batch, model, seed, out, bucket_cap_mb):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # the processes share the cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        net = nn.parallel.DistributedDataParallel(toy_model(model, seed), bucket_cap_mb=bucket_cap_mb)
        xs, ys = toy_data(steps, batch, model, seed)
        part = slice(rank * batch // world, (rank + 1) * batch // world)  # this rank's share of every batch
        train_steps(net, xs[:, part], ys[:, part])
        if rank == 0:
            torch.save({"state": net.module.state_dict(), "ddp": net._get_ddp_logging_data()}, out)
    finally:
        dist.destroy_process_group()


def ddp_train(world: int = 2, steps: int = 5, batch: int = 16, model: str = "toy", seed: int = 0,
              start_method: str | None = None, bucket_cap_mb: float = 25) -> dict:
    """Train with `world` gloo processes, each on its slice of every batch; rank 0's weights and DDP statistics.

    The workers are forked (fast) unless this process holds a CUDA context; then they are spawned."""
    start_method = start_method or ("fork" if fork_status()[0] else "spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.pt"
        try:
            mp.start_processes(_ddp_worker, nprocs=world, start_method=start_method, join=True,
                               args=(world, f"{tmp}/store", steps, batch, model, seed, out, bucket_cap_mb))
        except mp.ProcessRaisedException as err:
            if "Autograd-and-Fork" not in str(err):
                raise
            raise RuntimeError("this process has started autograd's worker threads (training an exported graph, "
                               "as QAT does, starts them) and forked workers cannot use them: restart the kernel "
                               "and run DDP first, or pass start_method='spawn'.") from err
        return torch.load(out, weights_only=True)


def deep_mlp(depth: int = 24, width: int = 32, seed: int = 0) -> nn.Module:
    """A seeded MLP on 32 features with `depth` hidden layers: many small parameter tensors (2 per layer)."""
    torch.manual_seed(seed)
    layers = [m for i in range(depth) for m in (nn.Linear(32 if i == 0 else width, width), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def train_one(model: str, seed: int, steps: int, batch: int) -> nn.Module:
    """One process on the full batches of toy_data, for comparison with the multi-process runs."""
    xs, ys = toy_data(steps, batch, seed=seed)
    return train_steps(deep_mlp(seed=seed) if model == "deep" else toy_model(model, seed), xs, ys)


def average_per_tensor(model: nn.Module, world: int) -> None:
    """Average every gradient over the processes: one all-reduce per parameter tensor."""
    for p in model.parameters():
        dist.all_reduce(p.grad)  # sums over the ranks, in place
        p.grad /= world


def _allreduce_worker(rank, world, store, averages, steps, batch, model, seed, rounds, out):
    torch.set_num_threads(1)  # the processes share the cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        xs, ys = toy_data(steps, batch, seed=seed)
        part = slice(rank * batch // world, (rank + 1) * batch // world)  # this rank's share of every batch
        result = {"comm_s": {name: [] for name in averages}, "state": {}}
        for _ in range(rounds):  # the averaging functions alternate, so a slow spell hits each alike
            for name, average in averages.items():
                net = deep_mlp(seed=seed) if model == "deep" else toy_model(model, seed)
                opt, comm = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), 0.0
                for x, y in zip(xs[:, part], ys[:, part]):
                    opt.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(net(x), y).backward()
                    dist.barrier()  # both ranks start the averaging together: the time is communication
                    start = time.perf_counter()
                    average(net, world)
                    comm += time.perf_counter() - start
                    opt.step()
                result["comm_s"][name].append(comm)
                result["state"][name] = net.state_dict()
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def allreduce_train(averages: dict, world: int = 2, steps: int = 5, batch: int = 16, model: str = "toy",
                    seed: int = 0, rounds: int = 1) -> dict:
    """Train with `world` gloo processes, averaging gradients by hand with each function of `averages`
    (name -> fn(model, world)); rank 0's {"comm_s": name -> seconds per round, "state": name -> weights}.
    Workers fork as in ddp_train (a forked worker may use functions defined in a notebook)."""
    start_method = "fork" if fork_status()[0] else "spawn"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.pt"
        mp.start_processes(_allreduce_worker, nprocs=world, start_method=start_method, join=True,
                           args=(world, f"{tmp}/store", averages, steps, batch, model, seed, rounds, out))
        return torch.load(out, weights_only=True)


def fork_status() -> tuple[bool, str]:
    """Whether ddp_notebook may fork workers here: a forked process cannot use a CUDA context it inherits."""
    if torch.cuda.is_initialized():
        return False, ("CUDA is initialised in this process and forked workers cannot use an inherited CUDA context: "
                       "restart the kernel and start DDP before anything touches the GPU, or use the script path.")
    return True, "no CUDA context in this process yet: ddp_notebook can fork its workers"
