"""Lesson 06's data parallelism by hand: DDP and hand-written all-reduces in spawned gloo processes, against one
process on the full batches, and whether forking is safe here (throughput on N devices: scaling.py).

The fork rule: on a machine with a visible GPU, a process's first backward starts autograd's device threads, and a
child forked after that fails in its own backward. So the workers here are spawned (importable, from this module),
and a fork is made only while `fork_status()` finds neither a CUDA context nor autograd's device threads."""
from __future__ import annotations

import importlib
import inspect
import multiprocessing
import os
import pickle
import tempfile
import textwrap
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ..base import internals
from ..training.models import build_model


def toy_data(steps: int, batch: int, model: str = "toy", seed: int = 0):
    """Fixed random batches: (steps, batch, 32) inputs for the MLPs ("toy", "deep") or (steps, batch, 3, 32, 32)
    for a course backbone; (steps, batch) labels."""
    g = torch.Generator().manual_seed(seed)
    shape, classes = ((32,), 4) if model in ("toy", "deep") else ((3, 32, 32), 10)
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


@dataclass(frozen=True)
class Job:
    """What each spawned gloo worker trains: `world` processes meeting at the file `store`, toy_data(steps, batch,
    model, seed) split across them, rank 0's result saved to `out`."""

    world: int
    store: str
    out: Path
    steps: int
    batch: int
    model: str
    seed: int

    def join(self, rank: int, threads: int) -> None:
        """Join the gloo process group as `rank`, on `threads` threads (the processes share the cores)."""
        torch.set_num_threads(threads)
        dist.init_process_group("gloo", init_method=f"file://{self.store}", rank=rank, world_size=self.world)

    @staticmethod
    def leave() -> None:
        """Wait for every rank before tearing the group down: a rank that closes its gloo connections while a peer
        still reads them (rank 0 saving its result, on a busy machine) can abort that peer from gloo's own thread
        ("terminate called without an active exception")."""
        dist.barrier()

    def share(self, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of every batch: (steps, batch / world, ...) inputs and labels."""
        xs, ys = toy_data(self.steps, self.batch, self.model, self.seed)
        part = slice(rank * self.batch // self.world, (rank + 1) * self.batch // self.world)
        return xs[:, part], ys[:, part]


def _ddp_worker(rank: int, job: Job, bucket_cap_mb: float) -> None:
    job.join(rank, max(1, (os.cpu_count() or 1) // job.world))
    try:
        net = nn.parallel.DistributedDataParallel(toy_model(job.model, job.seed), bucket_cap_mb=bucket_cap_mb)
        train_steps(net, *job.share(rank))
        if rank == 0:
            torch.save({"state": net.module.state_dict(), "ddp": internals.ddp_logging_data(net)}, job.out)
        job.leave()
    finally:
        dist.destroy_process_group()


@dataclass(frozen=True)
class DDPRun:
    """Rank 0's weights after a DDP run (name -> tensor) and DDP's own statistics (its logging data: name -> value)."""

    state: dict
    ddp: dict


def ddp_train(world: int = 2, steps: int = 5, batch: int = 16, model: str = "toy", seed: int = 0,
              bucket_cap_mb: float = 25) -> DDPRun:
    """Train with `world` gloo processes, each on its slice of every batch; rank 0's weights and DDP statistics.

    The workers are spawned (fresh interpreters running this module's _ddp_worker): safe whatever ran before here,
    a backward on a GPU machine included."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(world=world, store=f"{tmp}/store", out=Path(tmp) / "rank0.pt", steps=steps, batch=batch,
                  model=model, seed=seed)
        mp.start_processes(_ddp_worker, nprocs=world, start_method="spawn", join=True, args=(job, bucket_cap_mb))
        return DDPRun(**torch.load(job.out, weights_only=True))


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


class _Source:
    """A function shipped by its source to a spawned worker (one defined in a notebook cannot be imported there)."""

    def __init__(self, fn):
        self.name, self.source = fn.__name__, textwrap.dedent(inspect.getsource(fn))
        codes, names = [fn.__code__], set()
        while codes:  # the global names of fn and of the functions and comprehensions nested in it
            code = codes.pop()
            names |= set(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        self.modules = {n: v.__name__ for n in names if isinstance(v := fn.__globals__.get(n), types.ModuleType)}

    def load(self):
        """The function, rebuilt in this process with the modules it uses bound to their names."""
        namespace = {n: importlib.import_module(m) for n, m in self.modules.items()}
        exec(compile(self.source, f"<{self.name}, shipped to a worker>", "exec"), namespace)  # noqa: S102
        return namespace[self.name]


def portable(fn):
    """fn itself if a spawned worker can import it (course_lib's), else its source (a notebook's or a test's)."""
    return fn if fn.__module__.split(".")[0] == __name__.split(".")[0] else _Source(fn)


def _allreduce_worker(rank: int, job: Job, averages: dict, rounds: int) -> None:
    averages = {name: f.load() if isinstance(f, _Source) else f for name, f in averages.items()}
    job.join(rank, 1)
    calls, real = [0], dist.all_reduce

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    dist.all_reduce = counted  # this spawned process only: it exits after training
    try:
        model, seed, world = job.model, job.seed, job.world
        result = {"comm_s": {name: [] for name in averages}, "calls_per_step": {}, "state": {}}
        for _ in range(rounds):  # the averaging functions alternate, so a slow spell hits each alike
            for name, average in averages.items():
                net = deep_mlp(seed=seed) if model == "deep" else toy_model(model, seed)
                opt, comm, calls[0] = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), 0.0, 0
                for x, y in zip(*job.share(rank)):
                    opt.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(net(x), y).backward()
                    dist.barrier()  # both ranks start the averaging together: the time is communication
                    # a host clock, not timing.Stopwatch: gloo runs on the CPU (nothing to synchronize), and timing
                    # imports Lightning, seconds more per spawned worker that otherwise imports torch alone
                    start = time.perf_counter()
                    average(net, world)
                    comm += time.perf_counter() - start
                    opt.step()
                result["comm_s"][name].append(comm)
                result["calls_per_step"][name] = calls[0] / job.steps
                result["state"][name] = net.state_dict()
        if rank == 0:
            torch.save(result, job.out)
        job.leave()
    finally:
        dist.all_reduce = real
        dist.destroy_process_group()


@dataclass(frozen=True)
class AllReduceRun:
    """Rank 0's results per averaging function's name: seconds per round, all-reduce calls per step, final weights."""

    comm_s: dict  # name -> [seconds per round]
    calls_per_step: dict  # name -> dist.all_reduce calls per step
    state: dict  # name -> weights


def allreduce_train(averages: dict, world: int = 2, steps: int = 5, batch: int = 16, model: str = "toy",
                    seed: int = 0, rounds: int = 1) -> AllReduceRun:
    """Train with `world` gloo processes, averaging gradients by hand with each function of `averages`
    (name -> fn(model, world)); rank 0's AllReduceRun (seconds per round, all-reduce calls per step, weights).
    Workers are spawned as in ddp_train; a function defined in a notebook travels as its source (`portable`), so it
    may use modules (torch, dist, nn) but no other notebook globals."""
    with tempfile.TemporaryDirectory() as tmp:
        job = Job(world=world, store=f"{tmp}/store", out=Path(tmp) / "rank0.pt", steps=steps, batch=batch,
                  model=model, seed=seed)
        shipped = {name: portable(fn) for name, fn in averages.items()}
        mp.start_processes(_allreduce_worker, nprocs=world, start_method="spawn", join=True,
                           args=(job, shipped, rounds))
        return AllReduceRun(**torch.load(job.out, weights_only=True))


def autograd_device_threads() -> list[str]:
    """Names of autograd's device threads in this process (pt_autograd_<device>, Linux's /proc); [] if none or unknown.

    torch's engine starts one per visible GPU at the process's first backward (Engine::start_device_threads), even
    when every tensor is on the CPU; a child forked after that raises "Unable to handle autograd's threading in
    combination with fork-based multiprocessing" in its own backward."""
    names = []
    for comm in Path("/proc/self/task").glob("*/comm"):
        try:
            name = comm.read_text().strip()
        except OSError:  # the thread ended while we looked
            continue
        names += [name] if name.startswith("pt_autograd_") else []
    return sorted(names)


def fork_status() -> tuple[bool, str]:
    """Whether this process may fork workers that train (ddp_notebook, in_child): no CUDA context, and no autograd
    device threads, which a backward starts on a machine with a visible GPU."""
    if torch.cuda.is_initialized():
        return False, ("CUDA is initialised in this process and forked workers cannot use an inherited CUDA context: "
                       "restart the kernel and start DDP before anything touches the GPU, or use the script path.")
    if threads := autograd_device_threads():
        return False, (f"a backward already ran in this process and started autograd's device threads "
                       f"({', '.join(threads)}), which a forked worker cannot use: restart the kernel and fork before "
                       "any backward (run the lesson's cells in order), or use the script path.")
    return True, "no CUDA context and no autograd device threads in this process yet: ddp_notebook can fork its workers"


def in_child(fn, *args, **kwargs):
    """fn(*args, **kwargs) in a forked child on one thread, its (picklable) result returned: this process runs no
    backward, so its later forks (ddp_notebook) stay safe on a GPU machine. fn may be defined in a notebook.

    One thread, as DataLoader workers: a forked child that asks for several OpenMP threads waits forever on the
    parent's thread pool, which the fork did not copy (GNU OpenMP). For multi-threaded work use a fresh process."""
    ok, why = fork_status()
    if not ok:
        raise RuntimeError(f"in_child cannot fork here: {why}")
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def run():
        torch.set_num_threads(1)
        try:  # plain pickle bytes: tensors travel by value, not by shared memory the child would take with it
            send.send_bytes(pickle.dumps((True, fn(*args, **kwargs))))
        except BaseException:  # noqa: BLE001  (the parent raises it, with the child's traceback)
            send.send_bytes(pickle.dumps((False, traceback.format_exc())))

    child = ctx.Process(target=run, daemon=True)
    child.start()
    send.close()
    try:
        ok, value = pickle.loads(recv.recv_bytes())
    except EOFError:
        ok, value = False, "the child exited before it sent a result"
    child.join()
    if not ok:
        name = getattr(fn, "__name__", fn)
        raise RuntimeError(f"{name} failed in the forked child (exit {child.exitcode}):\n{value}")
    return value
