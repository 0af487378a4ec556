"""Measured exercises whose lever is the hardware: activation memory (lesson 04), kernel fusion (05), fewer and
larger all-reduces (06) and int8 inference (07). Graded like exercise.py's: the learner's code and the baseline
measured alternately in the same run, passing at a target ratio (exercise.ratio_check)."""
from __future__ import annotations

import statistics
from typing import Callable

from .exercise import grade, ratio_check


def plain_train_step(net, x, y) -> None:
    """The starter of lesson 04's exercise: one forward and backward over the whole batch."""
    import torch.nn.functional as F

    F.cross_entropy(net(x), y).backward()


def check_04_activation_memory(train_step: Callable, batch_size: int | None = None, target: float = 2.0) -> bool:
    """Lesson 04: train_step(net, x, y) must hold >= `target`x fewer saved-for-backward bytes than a plain step on
    the same batch, with the same gradients (same effective batch); reports the time cost and, on CUDA, peak memory."""
    import copy
    import time

    import torch

    from . import bench, hardware, models

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    batch = batch_size or (256 if cuda else 32)
    torch.manual_seed(0)
    # (B, 3, 32, 32) -> (B, 10); eval mode: BatchNorm uses running statistics, so chunking the batch does not
    # change the gradients, and the check can compare them with the plain step's
    net = models.ResNet9(width=64 if cuda else 8).to(device).eval()
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    nets = {"baseline": net, "learner": copy.deepcopy(net)}
    steps = {"baseline": plain_train_step, "learner": train_step}
    seconds: dict[str, list[float]] = {"baseline": [], "learner": []}
    peak_mb: dict[str, float] = {}

    def cost(side: str) -> float:
        """Saved bytes of one step of this side; its time and CUDA peak memory are recorded on the way."""
        nets[side].zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        held = bench.saved_bytes_peak(lambda: steps[side](nets[side], x, y))
        if cuda:
            torch.cuda.synchronize()
            peak_mb[side] = torch.cuda.max_memory_allocated() / 2**20
        seconds[side].append(time.perf_counter() - start)
        return max(held, 1)

    passed = ratio_check("Exercise 1 (activation memory)", lambda: cost("learner"), lambda: cost("baseline"), target,
                         repeats=2, what="saved-for-backward bytes", hardware=hardware.label())
    grads = [(a.grad, b.grad) for a, b in zip(nets["baseline"].parameters(), nets["learner"].parameters())]
    if any(b is None for _, b in grads):
        print("  the learner's step left some parameters without a gradient: it must train the whole net")
        return False
    err = max(((b - a).norm() / a.norm().clamp_min(1e-12)).item() for a, b in grads)
    same = err <= 0.05  # fp32 accumulation or checkpointing: ~1e-6; bf16 autocast: ~1e-2
    t_base, t_mine = statistics.median(seconds["baseline"]), statistics.median(seconds["learner"])
    price = ", the price of the memory saved" if passed else ""
    print(f"  batch {batch}: gradients match the plain step's to {err:.1e} (relative, limit 0.05): "
          f"{'same effective batch' if same else 'NOT the same gradients'}; time per step {t_base * 1e3:.0f} ms -> "
          f"{t_mine * 1e3:.0f} ms ({t_mine / t_base:.2f}x{price})")
    if cuda:
        print(f"  CUDA peak memory (torch.cuda.max_memory_allocated): {peak_mb['baseline']:,.0f} MB -> "
              f"{peak_mb['learner']:,.0f} MB")
    else:
        print("  (no GPU: the bytes are what autograd saved for backward, counted by saved_tensors_hooks, "
              "not the process's whole memory)")
    return passed and same


CLIP = 4.0  # lesson 05's exercise clips the normalised values at 4 standard deviations


def eager_chain(x):
    """The starter of lesson 05's exercise: row normalisation, a clip decided on the host, scale and shift, tanh
    GELU; returns (y, the largest |z| before clipping as a float). Under torch.compile it breaks the graph twice."""
    import torch

    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    z = centred * torch.rsqrt(var + 1e-5)
    peak = z.abs().max().item()  # read back to the host: a sync, and a graph break
    if peak > CLIP:  # a Python branch on a tensor's value: Dynamo cannot trace past it either
        z = z.clamp(-CLIP, CLIP)
    z = z * 1.5 + 0.1  # scale and shift
    return 0.5 * z * (1.0 + torch.tanh(0.7978845608 * (z + 0.044715 * z * z * z))), peak  # tanh GELU


def check_05_fusion(fn: Callable, target: float = 1.3, measure: bool = True) -> bool:
    """Lesson 05: the check compiles fn itself with torch.compile(fullgraph=True); fn(x) -> (y, peak) must compile
    as one graph (no graph break, no host read-back) and match the eager starter (y within 1e-3, float(peak));
    compiled, it must take >= `target`x less time than the eager starter, timed after the compile."""
    import time

    import torch

    from . import hardware, timing
    from .exercise import mechanism

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = 4096 if device == "cuda" else 512
    torch.manual_seed(0)
    x = torch.randn(rows, 2048, device=device) * 2  # (rows, features) float32: some |z| exceed CLIP
    torch.compiler.reset()  # a clean slate: earlier compiles in this process do not count
    compiled = torch.compile(fn, fullgraph=True)  # fullgraph: a graph break is an error, not a silent split
    start = time.perf_counter()
    try:
        y, peak = compiled(x)
        timing.sync(device)
        error = None
    except Exception as err:  # Dynamo names the graph break; the learner needs its first line, not the trace
        error = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    problems = []
    if error is not None:
        problems.append(f"torch.compile(fullgraph=True) could not trace it as one graph ({error}): keep the values "
                        f"on the device (a 0-d tensor, not .item()) and replace the Python branch by tensor ops")
    else:
        print(f"Exercise 1: compiled as one graph; first call (compile) took {time.perf_counter() - start:.1f} s")
        ref, ref_peak = eager_chain(x)
        if not (torch.allclose(y, ref, atol=1e-3, rtol=1e-3) and abs(float(peak) - ref_peak) <= 1e-3 * ref_peak):
            problems.append("the results differ from the starter's: it must compute the same y and the same peak")
    ok = mechanism("Exercise 1", problems)
    if not (ok and measure):
        return ok
    def cost(f) -> float:
        """Seconds per call of f's fastest block of calls (a busy machine only ever adds time)."""
        return min(timing.time_calls(lambda: f(x)))

    fast = ratio_check("Exercise 1 (fusion)", lambda: cost(compiled), lambda: cost(eager_chain), target, repeats=3,
                       what="time", hardware=hardware.label())
    return bool(ok and fast)


def run_06(average_gradients: Callable, steps: int, rounds: int, world: int = 2, batch: int = 16) -> dict:
    """The per-tensor baseline and the learner's average_gradients (shipped by its source) on `world` spawned gloo
    processes training parallel.deep_mlp (parallel.allreduce_train, never a fork after a backward); rank 0's results."""
    from . import parallel

    try:
        learner = parallel.portable(average_gradients)
    except (OSError, TypeError) as err:
        raise ValueError("the check runs average_gradients in fresh processes from its source: define it with "
                         "`def` in a notebook cell or a file (not a lambda, not built at run time)") from err
    return parallel.allreduce_train({"baseline": parallel.average_per_tensor, "learner": learner}, world=world,
                                    steps=steps, batch=batch, model="deep", seed=0, rounds=rounds)


def check_06_allreduce(average_gradients: Callable, target: float = 3.0, world: int = 2,
                       measure: bool = True) -> bool:
    """Lesson 06: the learner's average_gradients(model, world) against one all-reduce per parameter tensor, on
    `world` spawned gloo processes training parallel.deep_mlp (50 small tensors). Mechanism (no clock): at most a
    quarter of the baseline's all-reduce calls per step, and weights equal to one process's on the full batches.
    Measurement: >= `target`x less all-reduce time, alternately in the same processes."""
    from . import config, parallel
    from .exercise import mechanism

    steps, rounds = max(4, config.run_size("06_ddp").bench_steps), 3 if measure else 1
    res = run_06(average_gradients, steps, rounds, world)
    one = parallel.train_one("deep", 0, steps, 16).state_dict()
    diff = max((res["state"]["learner"][k] - one[k]).abs().max().item() for k in one)
    base_calls, my_calls = res["calls_per_step"]["baseline"], res["calls_per_step"]["learner"]
    print(f"Exercise 3: all-reduce calls per step: yours {my_calls:g}, one per tensor {base_calls:g}; weights vs "
          f"one process on the full batches: max |difference| {diff:.1e}")
    problems = []
    if my_calls > base_calls / 4:
        problems.append(f"{my_calls:g} all-reduce calls per step: pack the gradients into one flat buffer (or a "
                        f"few buckets) and all-reduce that")
    if my_calls == 0:
        problems.append("no dist.all_reduce call: the gradients must be averaged over the processes")
    if not diff < 1e-6:
        problems.append("the weights differ from one process's on the full batches: the gradients are not "
                        "averaged correctly (sum over the processes, divide by world, copy back into each .grad)")
    ok = mechanism("Exercise 3", problems)
    if not (ok and measure):
        return ok
    fast = grade("Exercise 3", res["comm_s"]["baseline"], res["comm_s"]["learner"], target,
                 what="all-reduce time per run", hardware=f"{world} gloo CPU processes")
    return bool(ok and fast)


def inputs_07(steps: int = 48, seed: int = 0):
    """(trained ResNet-9 width 8, 4 calibration batches, held-out test loader) of real images for check_07_inference
    outside the lesson (its tests and scripts/exercise_margins.py): 16 batches of 64 seen three times (48 steps),
    enough to leave the logits uneven, so that agreement measures the int8 program and not ties."""
    import torch
    import torch.nn.functional as F

    from . import runs
    from .models import ResNet9

    dm = runs.datamodule("07_quantization", batch_size=64, seed=seed)
    dm.prepare_data()
    dm.setup("fit")
    torch.manual_seed(seed)
    net = ResNet9(width=8)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    batches = list(dm.train_dataloader())[:16]  # (64, 3, 32, 32) images and (64,) labels each
    for x, y in (batches * 3)[:steps]:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval(), [x for x, _ in batches[:4]], dm.test_dataloader()


def int8_graph_report(program) -> tuple[int, int]:
    """(int8 tensors held, quantize/dequantize calls) of a converted torch.fx graph; (0, 0) for anything else."""
    import torch

    if not isinstance(program, torch.fx.GraphModule):
        return 0, 0
    int8 = sum(t.dtype == torch.int8 for t in program.state_dict().values())
    qdq = sum(n.op == "call_function" and "quantize" in str(n.target) for n in program.graph.nodes)
    return int8, qdq


#: lesson 07's bar over compiled fp32: where the CPU has one-instruction int8 dot products (VNNI, AMX) int8 must win
#: clearly; without them (AVX2 only) the int8 kernels emulate the dot products, so the bar asks only for a gain
INT8_TARGET = {"native": 1.25, "emulated": 1.1}


def check_07_inference(quantize: Callable, model, calibration: list, held_out, target: float | None = None,
                       min_agreement: float = 0.9, batches: int = 8, measure: bool = True) -> bool:
    """Lesson 07: quantize(model, calibration) must return the learner's own int8 program (a converted graph with
    int8 weights and quantize/dequantize ops, not course_lib's quantize_ptq); compiled by the check
    (compress.compile_for_cpu), it must predict the trained fp32 model's class on >= min_agreement of up to
    `batches` held-out batches of real images and answer batch 64 >= `target`x faster than the fp32 model compiled
    the same way (None: INT8_TARGET for this CPU), so that compiling alone gains nothing."""
    import torch

    from . import compress, hardware
    from .exercise import forbidden, mechanism
    from .timing import time_calls

    model = model.cpu().eval()
    with forbidden(compress.quantize_ptq, compress.prepare_qat, compress.convert_qat,
                   compress.quantize_linear_int8) as library:
        program = quantize(model, calibration)
    int8, qdq = int8_graph_report(program)
    problems = [f"it calls course_lib's finished version ({', '.join(sorted(set(library)))}): write the PT2E "
                f"steps yourself"] if library else []
    if not (int8 and qdq):
        problems.append(f"the returned program has {int8} int8 tensors and {qdq} quantize/dequantize ops: return "
                        f"the converted graph (export, prepare_pt2e, calibrate, convert_pt2e), not a compiled or "
                        f"fp32 model")
    if not mechanism("Exercise 2", problems):
        return False
    print(f"Exercise 2: {int8} int8 tensors and {qdq} quantize/dequantize ops in your graph; int8 dot-product "
          f"unit: {'VNNI/AMX' if hardware.cpu_int8_native() else 'none (AVX2)'}")
    x64 = next(iter(held_out))[0][:64]  # (64, 3, 32, 32) real held-out images
    served = compress.compile_for_cpu(program, x64)  # Inductor with freezing: the int8 kernels
    same = seen = 0
    with torch.no_grad():
        for i, (x, _) in enumerate(held_out):
            if i == batches:
                break
            same += (served(x).argmax(1) == model(x).argmax(1)).sum().item()
            seen += len(x)
    agree = same / seen
    print(f"Exercise 2: your int8 model predicts the trained fp32 model's class on {agree:.1%} of {seen} held-out "
          f"images (needs >= {min_agreement:.0%})")
    if not measure:
        return agree >= min_agreement
    def cost(fn):
        """Median seconds per call of fn on the batch of 64, over timing.time_calls' blocks."""
        with torch.no_grad():
            return statistics.median(time_calls(lambda: fn(x64)))

    baseline = compress.compile_for_cpu(model, x64)  # fp32 through the same compiler: only int8 can make a gap
    if target is None:
        target = INT8_TARGET["native" if hardware.cpu_int8_native() else "emulated"]
    fast = ratio_check("Exercise 2", lambda: cost(served), lambda: cost(baseline), target, 3,
                       what="latency at batch 64 against compiled fp32", hardware=hardware.label())
    return bool(fast and agree >= min_agreement)
