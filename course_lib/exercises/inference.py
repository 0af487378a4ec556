"""Lesson 07's measured exercise: the learner's own int8 program (torchao PT2E), compiled by the check, against the
trained fp32 model compiled the same way: agreement on held-out images, then latency at batch 64. Graded as core.py
grades."""
from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.nn.functional as F

from ..base import hardware
from ..compression import compress
from ..measure import ceilings
from ..measure.timing import time_calls
from ..training import runs
from ..training.models import ResNet9
from .core import Grading, forbidden, grade_prediction, prediction_tolerance

#: lesson 07's bar over compiled fp32: where the CPU has one-instruction int8 dot products (VNNI, AMX) int8 must win
#: clearly; without them (AVX2 only) the int8 kernels emulate the dot products, so the bar asks only for a gain
INT8_TARGET = {"native": 1.25, "emulated": 1.1}
#: the ceilings a prediction of int8's speed-up rests on: each format's products, the bytes, the fixed cost per op
EX07_CEILINGS = ("matmul fp32", "conv fp32", "matmul int8", "memory", "per op")
EX07_BATCH = 64  # images per call: the lesson's latency batch
#: course_lib's finished versions, which the exercise asks the learner to write instead
FINISHED_QUANTIZERS = (compress.quantize_ptq, compress.prepare_qat, compress.convert_qat,
                       compress.quantize_linear_int8)


def inputs_07(steps: int = 48, seed: int = 0):
    """(trained ResNet-9 width 8, 4 calibration batches, held-out test loader) of real images for check_07_inference
    outside the lesson (its tests and scripts/exercise_margins.py): 16 batches of 64 seen three times (48 steps),
    enough to leave the logits uneven, so that agreement measures the int8 program and not ties."""
    dm = runs.datamodule("07_quantization", batch_size=EX07_BATCH, seed=seed)
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
    if not isinstance(program, torch.fx.GraphModule):
        return 0, 0
    int8 = sum(t.dtype == torch.int8 for t in program.state_dict().values())
    qdq = sum(n.op == "call_function" and "quantize" in str(n.target) for n in program.graph.nodes)
    return int8, qdq


def int8_layers(program, model) -> tuple[int, int, int]:
    """(convolutions of `model` whose weights are int8 in `program`, its convolutions, its Linear layers whose
    weights are int8 there), matched by weight shape; (0, convolutions, 0) for anything but a converted graph."""
    held = [tuple(t.shape) for t in program.state_dict().values() if t.dtype == torch.int8] \
        if isinstance(program, torch.fx.GraphModule) else []
    of = lambda kind: [tuple(m.weight.shape) for m in model.modules() if isinstance(m, kind)]  # noqa: E731
    convs, linears = of(torch.nn.Conv2d), of(torch.nn.Linear)
    return sum(s in held for s in convs), len(convs), sum(s in held for s in linears)


def mechanism_07(quantize: Callable, model, calibration: list, *, grading: Grading):
    """No clock: quantize(model, calibration) calls none of course_lib's finished versions and returns a converted
    graph with quantize/dequantize ops, every convolution's weights int8 and the classifier's Linear kept in fp32
    (the variant: section 3's steps, pasted, quantize the Linear too); (the mechanism's verdict, the program)."""
    with forbidden(*FINISHED_QUANTIZERS) as library:
        program = quantize(model, calibration)
    int8, qdq = int8_graph_report(program)
    convs_int8, convs, linears_int8 = int8_layers(program, model)
    problems = [f"it calls course_lib's finished version ({', '.join(sorted(set(library)))})\nwrite the PT2E "
                f"steps yourself"] if library else []
    if not (int8 and qdq):
        problems.append(f"the returned program has {int8} int8 tensors and {qdq} quantize/dequantize ops\nreturn "
                        f"the converted graph (export, prepare_pt2e, calibrate, convert_pt2e), not a compiled or "
                        f"fp32 model")
    elif convs_int8 < convs or linears_int8:
        problems.append(f"{convs_int8} of {convs} convolutions and {linears_int8} Linear layer(s) hold int8 weights\n"
                        f"quantize every convolution and keep the classifier's Linear in fp32 (a quantizer setting)")
    ok = grading.mechanism("Exercise 2", problems)
    if ok:
        print(f"Exercise 2: {int8} int8 tensors and {qdq} quantize/dequantize ops in your graph\n  int8 dot-product "
              f"unit: {'VNNI/AMX' if hardware.cpu_int8_native() else 'none (AVX2)'}")
    return ok, program


def agreement(served: Callable, model, held_out, batches: int) -> tuple[float, int]:
    """(share of images where served's class is the model's, images seen) over up to `batches` held-out batches."""
    same = seen = 0
    with torch.no_grad():
        for i, (x, _) in enumerate(held_out):
            if i == batches:
                break
            same += (served(x).argmax(1) == model(x).argmax(1)).sum().item()
            seen += len(x)
    return same / seen, seen


def int8_target() -> float:
    """Exercise 2's latency target on this CPU: INT8_TARGET's native row with VNNI or AMX, else its emulated row."""
    return INT8_TARGET["native" if hardware.cpu_int8_native() else "emulated"]


def prediction_07(predict_speedup: Callable | None, ceil, model, x64, measured: float) -> bool:
    """The learner's predict_speedup(ceil, model, x) (fp32's latency over int8's, written first from the ceilings)
    against the measured ratio, within core.prediction_tolerance over EX07_CEILINGS (no clock: tests inject it)."""
    predicted = predict_speedup(ceil, model, x64) if predict_speedup else None
    return grade_prediction("Exercise 2", predicted, measured, prediction_tolerance(ceil, EX07_CEILINGS))


def check_07_inference(quantize: Callable, model, calibration: list, held_out, predict_speedup: Callable | None = None,
                       *, ceil=None, target: float | None = None, min_agreement: float = 0.9, batches: int = 8,
                       measure: bool = True, grading: Grading | None = None) -> bool:
    """Lesson 07: quantize(model, calibration) must return the learner's own int8 program (mechanism_07); compiled
    by the check (compress.compile_for_cpu), it must predict the trained fp32 model's class on >= min_agreement of
    up to `batches` held-out batches of real images and answer batch 64 >= `target`x faster than the fp32 model
    compiled the same way (None: INT8_TARGET for this CPU), so that compiling alone gains nothing; and
    predict_speedup(ceil, model, x64), written first, must land within the tolerance of that speed-up
    (prediction_07; `ceil`: lesson 00's ceilings, loaded when None)."""
    grading = grading or Grading()
    model = model.cpu().eval()
    ok, program = mechanism_07(quantize, model, calibration, grading=grading)
    if not ok:
        return False
    x64 = next(iter(held_out))[0][:EX07_BATCH]  # (64, 3, 32, 32) real held-out images
    served = compress.compile_for_cpu(program, x64)  # Inductor with freezing: the int8 kernels
    agree, seen = agreement(served, model, held_out, batches)
    print(f"Exercise 2: your int8 model agrees with the fp32 model on {100 * agree:.1f} % of {seen:,} held-out "
          f"images (needs >= {100 * min_agreement:.0f} %)")
    if not measure:
        return agree >= min_agreement

    def cost(fn):
        """Median seconds per call of fn on the batch of 64, over timing.time_calls' blocks."""
        with torch.no_grad():
            return statistics.median(time_calls(lambda: fn(x64)))

    baseline = compress.compile_for_cpu(model, x64)  # fp32 through the same compiler: only int8 can make a gap
    if target is None:
        target = int8_target()
    fast = grading.ratio_check("Exercise 2", lambda: cost(served), lambda: cost(baseline), target, repeats=3,
                               what="latency at batch 64 against compiled fp32", hardware=hardware.label())
    ceil = ceil or ceilings.load("cpu", verbose=False)
    told = prediction_07(predict_speedup, ceil, model, x64, grading.grades[-1].ratio)
    return bool(fast and agree >= min_agreement and told)
