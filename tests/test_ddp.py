"""DDP on the CPU with gloo and 2 processes: same weights as one process, sharding, the torchrun CLI path,
rank-zero-only outputs, the device-count check, and no processes left behind after any test."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

from course_lib.base import hardware
from course_lib.data.sampling import EpochSampler
from course_lib.entry import cli
from course_lib.parallel import parallel, scaling

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_orphan_processes():
    """After each test here, in any order: every process it started has exited (within 10 s)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    deadline = time.monotonic() + 10
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and _running(p)
                 and not _resource_tracker(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, f"processes left behind: {[(p.pid, p.cmdline()) for p in alive]}"


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_matches_one_process_on_the_combined_batch(world):
    """k SGD steps of DDP, each rank on its slice of every batch, give the weights of one process on full batches."""
    steps, batch = 5, 16
    ddp = parallel.ddp_train(world=world, steps=steps, batch=batch, seed=0).state
    xs, ys = parallel.toy_data(steps, batch, seed=0)
    one = parallel.train_steps(parallel.toy_model(seed=0), xs, ys).state_dict()
    assert max_diff(ddp, one) < 1e-6
    # the comparison has teeth: training moved the weights, and one rank's slice alone gives other weights
    assert max_diff(one, parallel.toy_model(seed=0).state_dict()) > 1e-2
    part = parallel.train_steps(parallel.toy_model(seed=0), xs[:, : batch // world], ys[:, : batch // world])
    assert max_diff(part.state_dict(), one) > 1e-3


@pytest.fixture
def busy_cores():
    """Every core busy with another process for the test's length, as when other jobs share a 2-core machine."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for proc in spin:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("rounds", [1])
def test_workers_survive_busy_cores(busy_cores, rounds):
    """Lesson 06's spawned gloo workers, DDP and the hand-written all-reduce, repeated on cores that other processes
    keep busy: each run finishes with the one-process weights (a loaded machine is slower, never fatal). Each rank
    waits for the others before its teardown (parallel.Job.leave). The two jobs run at once, each on cores that the
    spinners and the other job's ranks keep busy: more load than one at a time, in a busy window about half as long
    (the spinners also slow whatever else runs on the machine)."""
    steps, batch = 3, 16
    xs, ys = parallel.toy_data(steps, batch, seed=0)
    one = parallel.train_steps(parallel.toy_model(seed=0), xs, ys).state_dict()
    for _ in range(rounds):
        with ThreadPoolExecutor(2) as pool:  # each start_processes call waits on its own two spawned ranks
            ddp = pool.submit(parallel.ddp_train, world=2, steps=steps, batch=batch, seed=0)
            hand = pool.submit(parallel.allreduce_train, {"plain": parallel.average_per_tensor}, world=2, steps=steps,
                               batch=batch)
            assert max_diff(ddp.result().state, one) < 1e-6
            assert max_diff(hand.result().state["plain"], one) < 1e-6


def test_course_sampler_under_ddp_gives_each_epoch_a_new_partition_and_repeats_it_on_restart():
    """Lightning wraps the DataModule's EpochSampler for DDP (DistributedSamplerWrapper, which forwards set_epoch):
    every rank draws the same (seed, epoch) order, so the ranks' shards partition the data; the next epoch brings a
    new partition; and a rank restarted at that epoch (a fresh sampler, as after a resume) gets the same shard."""
    n, world = 64, 2

    def shards(epoch: int) -> list[list[int]]:
        wrapped = [DistributedSamplerWrapper(EpochSampler(n, seed=0), num_replicas=world, rank=r, shuffle=False)
                   for r in range(world)]
        for sampler in wrapped:
            sampler.set_epoch(epoch)
        return [list(sampler) for sampler in wrapped]

    first, second = shards(0), shards(1)
    for epoch in (first, second):
        assert sorted(i for shard in epoch for i in shard) == list(range(n)) and len(epoch[0]) == n // world
    assert first[0] != second[0] and shards(1) == second


def test_more_gpus_than_present_fails_with_the_remedy(monkeypatch):
    """accelerator gpu with more devices than GPUs: the CLI stops before training and names what to do."""
    for have in (0, 1):
        monkeypatch.setattr(torch.cuda, "device_count", lambda have=have: have)
        with pytest.raises(ValueError, match=rf"devices=8 asks for 8 GPU\(s\).* has {have} visible") as err:
            cli.main(["fit", "--config", str(REPO / "configs/lenet.yaml"), "--trainer.accelerator", "gpu",
                      "--trainer.devices", "8", "--debug"])  # --debug: the error itself, not the CLI's exit
        assert "--trainer.accelerator cpu" in str(err.value) and "--trainer.num_nodes" in str(err.value)
    assert "--trainer.devices 1 " in str(err.value)  # with one GPU: use the one that exists
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ValueError, match="no CUDA GPU here: auto would quietly start 2 CPU processes"):
        hardware.check_devices("auto", 2)
    with pytest.warns(UserWarning, match="share the cores"):
        hardware.check_devices("cpu", (os.cpu_count() or 1) + 1)
    hardware.check_devices("cpu", 2)  # CPU processes up to the core count: fine
    hardware.check_devices("auto", 1)


def test_torchrun_cli_ddp_two_cpu_processes(tmp_path, tiny_folder):
    """`torchrun --nproc_per_node 2 -m course_lib fit ... --trainer.strategy ddp` on CPU: both ranks train, and only
    rank 0 writes logs, the saved config and checkpoints (in $COURSE_BUILD/runs/<run_name>)."""
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder),
           "COURSE_DATA_ROOT": str(tmp_path / "data"), "COURSE_BUILD": str(tmp_path / "build"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "course_lib", "fit", "--config", "configs/lenet.yaml", "--model.num_classes", "3",  # 3-class folder
           "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.strategy", "ddp"]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"exit {result.returncode}\n{log[-4000:]}"
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert "distributed_backend=gloo" in log
    # rank zero only: one log version, one saved config, one set of checkpoints
    run = tmp_path / "build" / "runs" / "lenet"
    assert [p.name for p in (run / "logs").iterdir()] == ["version_0"]
    assert "val_acc" in (run / "logs" / "version_0" / "metrics.csv").read_text()
    saved = [yaml.safe_load(p.read_text()) for p in run.rglob("config.yaml")]
    assert len(saved) == 1 and saved[0]["trainer"]["strategy"] == "ddp"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] >= 1


def test_script_path_lightning_launches_the_ranks(tmp_path, tiny_folder, monkeypatch):
    """`python -m course_lib.parallel.scaling --devices 2` (strategy ddp: Lightning re-runs the command for rank 1)
    trains on both ranks; rank 0 reports the throughput of both."""
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    row = scaling.measure_script(2, tmp_path / "row.json", timeout=180, accelerator="cpu", model="lenet", batch=8,
                                  warmup=1, steps=2)
    assert row.processes == 2 and row.batch_size == 16 and row.steps == 2 and row.images_per_s > 0


def test_the_script_path_counts_the_collectives_of_a_ddp_step(tmp_path, tiny_folder, monkeypatch):
    """`--collectives` profiles a short DDP fit: LeNet's gradients fill one DDP bucket, so one all-reduce a step;
    the loop's own calls are counted beside it, by kind, per step."""
    monkeypatch.setenv("COURSE_DATA", str(tiny_folder))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    counts = scaling.count_collectives(2, tmp_path / "calls.json", timeout=180, accelerator="cpu", model="lenet",
                                       batch=8, warmup=1, steps=2)
    assert counts["all_reduce"] == 1.0 and all(n > 0 for n in counts.values())


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _resource_tracker(p: psutil.Process) -> bool:
    """multiprocessing's resource tracker, which spawned workers start once; it exits with this process."""
    try:
        return "multiprocessing.resource_tracker" in " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return False


def _node(rank: int, port: int, tmp_path: Path, tiny_folder, log: Path, epochs: int) -> subprocess.Popen:
    """One 'node' of a 2-node torchrun job on localhost: one CPU process running the course CLI on gloo."""
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder), "OMP_NUM_THREADS": "1",
           "COURSE_DATA_ROOT": str(tmp_path / f"data{rank}"), "COURSE_BUILD": str(tmp_path / "build")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(rank),
           "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
           "-m", "course_lib", "fit", "--config", "configs/lenet.yaml", "--trainer.accelerator", "cpu",
           "--trainer.devices", "1", "--trainer.num_nodes", "2", "--trainer.strategy", "ddp",
           "--trainer.max_epochs", str(epochs), "--trainer.default_root_dir", str(tmp_path / "root"),
           "--model.num_classes", "3"]  # tiny_folder holds 3 of the 10 classes
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(p: subprocess.Popen) -> None:
    """SIGKILL a launch and every process under it (torchrun's workers run in sessions of their own)."""
    try:
        tree = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    p.wait(timeout=30)


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            _kill_tree(p)


def test_two_nodes_on_localhost_train_as_one_job(tmp_path, tiny_folder):
    """docs/multi_gpu.md's multi-node commands, emulated on one machine: two torchrun launches (--nnodes 2,
    --node_rank 0/1, one CPU process each) of the CLI with --trainer.num_nodes 2 form one gloo job, each node its
    own rank (and so its own DistributedSampler shard), and both stop cleanly."""
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    port = _free_port()
    nodes = [_node(r, port, tmp_path, tiny_folder, logs[r], epochs=1) for r in (0, 1)]
    try:
        codes = [p.wait(timeout=300) for p in nodes]
    finally:
        _stop(*nodes)
    text = [log.read_text() for log in logs]
    assert codes == [0, 0], f"exit codes {codes}\n{text[0][-3000:]}\n{text[1][-3000:]}"
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in text[0] and "GLOBAL_RANK: 1, MEMBER: 2/2" in text[1]
