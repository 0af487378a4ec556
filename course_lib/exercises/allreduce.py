"""Lesson 06's measured exercise: fewer and larger all-reduces. The learner's average_gradients against one
all-reduce per parameter tensor, in spawned gloo processes (course_lib.parallel), graded as core.py grades."""
from __future__ import annotations

from typing import Callable

from .. import config, parallel
from .core import Grading

EX06_BATCH = 16  # per process, per step
EX06_MAX_CALL_SHARE = 1 / 4  # the learner's all-reduce calls per step, as a share of one-per-tensor's at most
EX06_MAX_WEIGHT_DIFF = 1e-6  # against one process on the full batches


def run_06(average_gradients: Callable, steps: int, rounds: int, *, world: int = 2, batch: int = EX06_BATCH) -> dict:
    """The per-tensor baseline and the learner's average_gradients (shipped by its source) on `world` spawned gloo
    processes training parallel.deep_mlp (parallel.allreduce_train, never a fork after a backward); rank 0's results."""
    try:
        learner = parallel.portable(average_gradients)
    except (OSError, TypeError) as err:
        raise ValueError("the check runs average_gradients in fresh processes from its source: define it with "
                         "`def` in a notebook cell or a file (not a lambda, not built at run time)") from err
    return parallel.allreduce_train({"baseline": parallel.average_per_tensor, "learner": learner}, world=world,
                                    steps=steps, batch=batch, model="deep", seed=0, rounds=rounds)


def check_06_allreduce(average_gradients: Callable, *, target: float = 3.0, world: int = 2, measure: bool = True,
                       grading: Grading | None = None) -> bool:
    """Lesson 06: the learner's average_gradients(model, world) against one all-reduce per parameter tensor, on
    `world` spawned gloo processes training parallel.deep_mlp (50 small tensors). Mechanism (no clock): at most a
    quarter of the baseline's all-reduce calls per step (parallel counts dist.all_reduce in its workers), and
    weights equal to one process's on the full batches. Measurement: >= `target`x less all-reduce time,
    alternately in the same processes (one run serves both: measure=False runs one round instead of three)."""
    grading = grading or Grading()
    steps, rounds = max(4, config.run_size("06_ddp").bench_steps), 3 if measure else 1
    res = run_06(average_gradients, steps, rounds, world=world)
    one = parallel.train_one("deep", 0, steps, EX06_BATCH).state_dict()
    diff = max((res["state"]["learner"][k] - one[k]).abs().max().item() for k in one)
    base_calls, my_calls = res["calls_per_step"]["baseline"], res["calls_per_step"]["learner"]
    print(f"Exercise 3: all-reduce calls per step: yours {my_calls:g}, one per tensor {base_calls:g}; weights vs "
          f"one process on the full batches: max |difference| {diff:.1e}")
    problems = []
    if my_calls > base_calls * EX06_MAX_CALL_SHARE:
        problems.append(f"{my_calls:g} all-reduce calls per step: pack the gradients into one flat buffer (or a "
                        f"few buckets) and all-reduce that")
    if my_calls == 0:
        problems.append("no dist.all_reduce call: the gradients must be averaged over the processes")
    if not diff < EX06_MAX_WEIGHT_DIFF:
        problems.append("the weights differ from one process's on the full batches: the gradients are not "
                        "averaged correctly (sum over the processes, divide by world, copy back into each .grad)")
    ok = grading.mechanism("Exercise 3", problems)
    if not (ok and measure):
        return ok
    fast = grading.grade("Exercise 3", res["comm_s"]["baseline"], res["comm_s"]["learner"], target,
                         what="all-reduce time per run", hardware=f"{world} gloo CPU processes")
    return bool(ok and fast)
