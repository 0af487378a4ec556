"""Lesson 06's measured exercise: fewer and larger all-reduces. The learner's average_gradients against one
all-reduce per parameter tensor, in spawned gloo processes (course_lib.parallel.parallel), graded as core.py grades."""
from __future__ import annotations

from typing import Callable

from ..base import config
from ..parallel import ddpmodel, parallel
from .core import MODEL_FACTOR, Grading, grade_prediction

EX06_BATCH = 16  # per process, per step
EX06_MAX_CALL_SHARE = 1 / 4  # the learner's all-reduce calls per step, as a share of one-per-tensor's at most
EX06_MAX_WEIGHT_DIFF = 1e-6  # against one process on the full batches


def run_06(average_gradients: Callable, steps: int, rounds: int, *, world: int = 2,
           batch: int = EX06_BATCH) -> parallel.AllReduceRun:
    """The per-tensor baseline and the learner's average_gradients (shipped by its source) on `world` spawned gloo
    processes training parallel.deep_mlp (parallel.allreduce_train, never a fork after a backward); rank 0's results."""
    try:
        learner = parallel.portable(average_gradients)
    except (OSError, TypeError) as err:
        raise ValueError("the check runs average_gradients in fresh processes from its source: define it with "
                         "`def` in a notebook cell or a file (not a lambda, not built at run time)") from err
    return parallel.allreduce_train({"baseline": parallel.average_per_tensor, "learner": learner}, world=world,
                                    steps=steps, batch=batch, model="deep", seed=0, rounds=rounds)


def prediction_06(predict_speedup: Callable | None, link: tuple[float, float], world: int, base: list[float],
                  mine: list[float]) -> bool:
    """The learner's predict_speedup(latency, bandwidth, model, world) (the per-tensor all-reduce time over theirs,
    written first from the lesson's measured link) against the measured ratio of medians: within MODEL_FACTOR times
    the widest spread (slowest / fastest round) of the two sides' rounds (no clock: tests inject the rounds)."""
    predicted = predict_speedup(*link, parallel.deep_mlp(), world) if predict_speedup else None
    spread = max(max(r) / min(r) for r in (base, mine))
    measured = sorted(base)[len(base) // 2] / sorted(mine)[len(mine) // 2]
    return grade_prediction("Exercise 3", predicted, measured, MODEL_FACTOR * spread)


def check_06_allreduce(average_gradients: Callable, predict_speedup: Callable | None = None, *,
                       link: tuple[float, float] | None = None, target: float = 3.0, world: int = 2,
                       measure: bool = True, grading: Grading | None = None) -> bool:
    """Lesson 06: the learner's average_gradients(model, world) against one all-reduce per parameter tensor, on
    `world` spawned gloo processes training parallel.deep_mlp (50 small tensors). Mechanism (no clock): at most a
    quarter of the baseline's all-reduce calls per step (parallel counts dist.all_reduce in its workers), and
    weights equal to one process's on the full batches. Measurement: >= `target`x less all-reduce time,
    alternately in the same processes (one run serves both: measure=False runs one round instead of three); then
    predict_speedup against it (prediction_06), from `link` = (latency s, bandwidth bytes/s), the lesson's measured
    gloo link (measured here when None)."""
    grading = grading or Grading()
    steps, rounds = max(4, config.run_size("06_ddp").bench_steps), 3 if measure else 1
    res = run_06(average_gradients, steps, rounds, world=world)
    one = parallel.train_one("deep", 0, steps, EX06_BATCH).state_dict()
    diff = max((res.state["learner"][k] - one[k]).abs().max().item() for k in one)
    base_calls, my_calls = res.calls_per_step["baseline"], res.calls_per_step["learner"]
    print(f"Exercise 3: all-reduce calls per step: yours {my_calls:g}, one per tensor {base_calls:g}\n"
          f"  weights against one process on the full batches: max |difference| {diff:.1e}")
    problems = []
    if my_calls > base_calls * EX06_MAX_CALL_SHARE:
        problems.append(f"{my_calls:g} all-reduce calls per step\npack the gradients into one flat buffer (or a "
                        f"few buckets) and all-reduce that")
    if my_calls == 0:
        problems.append("no dist.all_reduce call: the gradients must be averaged over the processes")
    if not diff < EX06_MAX_WEIGHT_DIFF:
        problems.append("the weights differ from one process's on the full batches\nthe gradients are not "
                        "averaged correctly (sum over the processes, divide by world, copy back into each .grad)")
    ok = grading.mechanism("Exercise 3", problems)
    if not (ok and measure):
        return ok
    base, mine = res.comm_s["baseline"], res.comm_s["learner"]
    fast = grading.grade("Exercise 3", base, mine, target, what="all-reduce time per run",
                         hardware=f"{world} gloo CPU processes")
    if link is None:  # the lesson's measurement: a 4-byte all-reduce (latency) and one of the gradients' size
        nbytes = 4 * sum(p.numel() for p in parallel.deep_mlp().parameters())
        link = ddpmodel.link(ddpmodel.measure(world, sizes=(4, nbytes)).allreduce_s, world, nbytes)
    return bool(ok and fast and prediction_06(predict_speedup, link, world, base, mine))
