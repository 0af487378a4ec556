"""The GPU machine's fork rule (a child forked after a backward fails in its own backward), emulated on the CPU by
tests/gpu_fork_rule for every process of the test run: the emulation has teeth, fork_status sees it, and the course's
multi-process paths work after a backward."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist
from conftest import FORK_RULE, REPO

from course_lib.parallel import parallel

PROBE = textwrap.dedent("""
    import multiprocessing, torch
    from course_lib.parallel import parallel

    def child_backward(queue):
        try:
            torch.ones(2, requires_grad=True).sum().backward()
            queue.put("ok")
        except RuntimeError as err:
            queue.put(str(err))

    def fork_and_backward():
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=child_backward, args=(queue,))
        child.start()
        child.join()
        return queue.get(timeout=5)

    print("before:", parallel.fork_status()[0], fork_and_backward())
    print("in_child:", parallel.in_child(lambda: torch.ones(2, requires_grad=True).sum().backward() or "trained"))
    print("still:", parallel.fork_status()[0])  # the child's backward left this process clean
    torch.ones(2, requires_grad=True).sum().backward()
    ok, why = parallel.fork_status()
    print("after:", ok, parallel.autograd_device_threads(), fork_and_backward())
    print("why:", why)
    try:
        parallel.in_child(lambda: None)
    except RuntimeError as err:
        print("in_child refused:", "a backward already ran" in str(err))
""")


def test_emulated_rule_fails_a_fork_after_a_backward_and_fork_status_sees_it():
    """In a fresh process with the emulation: forks before any backward train; after one, fork_status says no, names
    autograd's device thread and the remedy, in_child refuses, and a forked child's backward raises torch's error."""
    env = {"PYTHONPATH": str(FORK_RULE), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in res.stdout.splitlines())
    assert lines["before"] == "True ok" and lines["in_child"] == "trained" and lines["still"] == "True"
    assert lines["after"].startswith("False ['pt_autograd_0'")  # and one more per further GPU on a GPU machine
    assert "Unable to handle autograd's threading in combination with fork-based multiprocessing" in lines["after"]
    assert "restart the kernel" in lines["why"] and lines["in_child refused"] == "True"


def test_without_the_emulation_fork_status_reads_the_real_autograd_threads():
    """The real state of this machine, emulation off: after a backward, torch has started pt_autograd_ device threads
    where it sees a GPU and none on a CPU-only machine, and fork_status says no exactly when they exist."""
    probe = ("import json, torch; from course_lib.parallel import parallel; "
             "torch.ones(2, requires_grad=True).sum().backward(); "
             "print(json.dumps([torch.cuda.device_count(), parallel.autograd_device_threads(), "
             "parallel.fork_status()[0]]))")
    res = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={"PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    gpus, threads, fork_ok = json.loads(res.stdout.splitlines()[-1])
    assert bool(threads) == (gpus > 0) and fork_ok == (not threads), (gpus, threads, fork_ok)


def average_flat(model, world):
    """A test-module function (not importable by a spawned worker as such): one all-reduce of all gradients."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offsets = torch.tensor([g.numel() for g in grads]).cumsum(0).tolist()
    for g, start, end in zip(grads, [0, *offsets[:-1]], offsets):
        g.copy_(flat[start:end].view_as(g))


def test_ddp_and_hand_written_allreduce_work_after_a_backward_in_this_process():
    """After a backward here (autograd's device threads on a GPU machine, emulated), ddp_train and allreduce_train
    (with a function defined outside course_lib, shipped by its source) still train: their workers are spawned."""
    torch.ones(2, requires_grad=True).sum().backward()
    assert not parallel.fork_status()[0]
    steps, batch = 3, 16
    xs, ys = parallel.toy_data(steps, batch, seed=0)
    one = parallel.train_steps(parallel.toy_model(seed=0), xs, ys).state_dict()
    ddp = parallel.ddp_train(world=2, steps=steps, batch=batch, seed=0).state
    res = parallel.allreduce_train({"flat": average_flat, "per tensor": parallel.average_per_tensor}, world=2,
                                   steps=steps, batch=batch)
    for state in (ddp, res.state["flat"], res.state["per tensor"]):
        assert max((state[k] - one[k]).abs().max().item() for k in one) < 1e-6
    assert len(res.comm_s["flat"]) == 1 and res.comm_s["flat"][0] > 0
