"""Model compression for CPU inference: int8 quantization with torchao (PT2E static PTQ and QAT for CNNs, dynamic and
weight-only int8 for Linear layers through quantize_), L1 pruning with Lightning's ModelPruning, and the measurements
that judge them (size on disk, median latency, test accuracy).

Saved format: a quantized (or fp32) model is saved with `save_program`, which is `torch.export.save` of the exported
program (a .pt2 zip archive: graph, int8 weights, scales); `load_program` is `torch.export.load(path).module()`.
No pickled Python code runs on load.
"""
from __future__ import annotations

import copy
import math
import os
import statistics
import zlib
from pathlib import Path

import torch
from lightning.pytorch.callbacks import ModelPruning
from torch import nn
from torchao.quantization.pt2e import allow_exported_model_train_eval, move_exported_model_to_eval
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer,
    get_default_x86_inductor_quantization_config,
)

from ..base import hardware, internals
from ..measure import verdict
from ..measure.timing import duration, time_calls
from ..training.metrics import top1_accuracy

#: the batch dimension stays symbolic in every exported graph, so one program serves batch 1 and batch 64
BATCH = torch.export.Dim("batch", min=1, max=4096)
#: exporting with a batch of 1 would specialise the graph to 1; two images keep the dimension symbolic
EXAMPLE_BATCH = 2


def example_input(batch: int = EXAMPLE_BATCH, shape=(3, 32, 32)) -> torch.Tensor:
    """A random (batch, C, H, W) float input for tracing; the values do not matter, only shape and dtype."""
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0))


def export(model: nn.Module, example: torch.Tensor | None = None) -> torch.export.ExportedProgram:
    """torch.export of `model` as it is (train or eval mode), with a dynamic batch dimension, traced strictly (Dynamo).

    Strict: the quantizer finds convolutions and linears by the source each graph node records (source_fn_stack),
    which only strict tracing writes. Default (non-strict) tracing works from torch 2.14 on, whose source matcher
    falls back to the module stack; on torch 2.11 (Colab's) X86InductorQuantizer then annotates nothing and the
    "int8" model stays fp32. Strict tracing gives the same graph on both (tests/test_compress.py)."""
    example = example_input() if example is None else example
    return torch.export.export(model, (example,), dynamic_shapes=({0: BATCH},), strict=True)


def int8_reduce_range() -> bool:
    """The int8 backend's choice for this CPU: 7-bit activations (0..127) where it lacks one-instruction int8 dot
    products (hardware.cpu_int8_native), full-range uint8 where it has VNNI or AMX."""
    return not hardware.cpu_int8_native()


def int8_unit() -> str | None:
    """This CPU's fastest int8 dot-product unit, as detected (amx_int8, avx512_vnni, avx_vnni), or None."""
    return next((f for f in ("amx_int8", "avx512_vnni", "avx_vnni") if f in hardware.cpu_flags()), None)


def int8_speed_line(ratio: float, baseline: str) -> str:
    """One short line on the measured int8 latency `ratio` (baseline's time over int8's) and this CPU's int8 unit:
    what was measured, no guessed cause (the roof lines, int8_roof_lines, measure the arithmetic and the weights'
    share), so it holds on every CPU class: never 'barely wins' beside a win."""
    unit = f"{int8_unit()} here" if int8_unit() else "no VNNI/AMX here"  # what the detected CPU has
    near = abs(math.log(ratio)) < math.log(1 + verdict.MIN_EFFECT)  # a gap under 5 % either way
    return f"compiled int8: {verdict.factor(ratio)} than {baseline} ({unit}" + ("; within 5 %)" if near else ")")


def int8_roof_lines(flops: float, weights: int, int8_s: float, fp32_s: float, ceil) -> list[str]:
    """Lesson 07's compiled int8 and fp32 forward passes (`flops` multiply-add FLOPs, `weights` parameters) against
    this machine's ceilings (measure.ceilings): each format's share of its measured matmul rate, and the weight
    bytes each reads at the bandwidth their size gets. The int8 roof only where the CPU has an int8 unit and an
    int8 ceiling was measured (VNNI/AMX); elsewhere int8 has no roof of its own here, and the line says so."""
    fp32_roof = flops / ceil.rate("fp32")
    lines = [f"fp32: {flops / 1e9:,.3g} GFLOP in {fp32_s * 1e3:,.3g} ms, {100 * fp32_roof / fp32_s:.0f} % of the fp32 "
             f"roof ({ceil.rate('fp32') / 1e9:,.0f} GFLOP/s, lesson 00's {ceil.rate_row('fp32')})"]
    if hardware.cpu_int8_native() and "int8" in ceil.formats():
        int8_roof = flops / ceil.rate("int8")
        lines.append(f"int8: the same in {int8_s * 1e3:,.3g} ms, {100 * int8_roof / int8_s:.0f} % of the int8 roof "
                     f"({ceil.rate('int8') / 1e9:,.0f} GFLOP/s); the roofs allow {fp32_roof / int8_roof:.2f}x, "
                     f"measured {fp32_s / int8_s:.2f}x")
    else:
        lines.append(f"int8: the same in {int8_s * 1e3:,.3g} ms ({fp32_s / int8_s:.2f}x fp32's speed); no int8 roof "
                     "here: no VNNI/AMX, no int8 ceiling")
    moved = {fmt: weights * size / ceil.bandwidth_for(weights * size) for fmt, size in (("fp32", 4), ("int8", 1))}
    share = [verdict.number(100 * moved[fmt] / s, 2) for fmt, s in (("fp32", fp32_s), ("int8", int8_s))]  # not '0%'
    lines.append(f"weights: {weights * 4 / 1e6:,.3g} MB fp32, {weights / 1e6:,.3g} MB int8; reading them: "
                 f"{duration(moved['fp32'])} and {duration(moved['int8'])}, {share[0]} % and "
                 f"{share[1]} % of each measured time")
    return lines


def x86_quantizer(is_qat: bool = False, reduce_range: bool | None = None) -> X86InductorQuantizer:
    """Static int8 recipe for x86 CPUs: per-channel symmetric int8 weights, per-tensor uint8 activations.

    reduce_range (default: True on a CPU without VNNI) keeps activations in 0..127. Without VNNI, oneDNN's int8
    kernels add pairs of u8 x s8 products in 16 bits (vpmaddubsw), which saturate with full-range activations: the
    compiled model then loses accuracy that the eager reference graph does not show. Max-pools stay in fp32.
    torchao 0.18's Inductor weight-prepack pass stops with an AssertionError (in `qconv`, postop_name) on a
    quantized max-pool that feeds a residual add, as in ResNet9; unquantized max-pools avoid it at the cost of one
    dequantize/quantize pair around each pool."""
    reduce_range = int8_reduce_range() if reduce_range is None else reduce_range
    config = get_default_x86_inductor_quantization_config(is_qat=is_qat, reduce_range=reduce_range)
    quantizer = X86InductorQuantizer().set_global(config)
    return quantizer.set_module_type_qconfig(nn.MaxPool2d, None)


def drop_unused_attributes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Delete parameters and buffers the graph no longer reads (convert_pt2e leaves the fp32 weights behind)."""
    read = {n.target for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}
    for name in [n for n, _ in gm.named_parameters()] + [n for n, _ in gm.named_buffers()]:
        if not any(name == r or name.startswith(r + ".") or r.startswith(name + ".") for r in read):
            owner, _, leaf = name.rpartition(".")
            module = gm.get_submodule(owner) if owner else gm
            delattr(module, leaf)
    gm.delete_all_unused_submodules()
    return gm


def int8_or_raise(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """gm, once it holds int8 weights: a quantizer that matched no layer leaves an fp32 graph, never used silently."""
    if not any(t.dtype == torch.int8 for t in gm.state_dict().values()):
        raise RuntimeError("The quantizer matched no convolution or linear layer, so the graph stayed fp32. Export "
                           "with compress.export (strict tracing, which torch < 2.14 needs for PT2E) and pair torch "
                           f"with torchao (torchao 0.18 needs torch >= 2.11; here torch {torch.__version__}).")
    return gm


@torch.no_grad()
def quantize_ptq(model: nn.Module, calibration, example: torch.Tensor | None = None,
                 reduce_range: bool | None = None) -> torch.fx.GraphModule:
    """Post-training static int8: export, insert observers, run the calibration batches (B, C, H, W), convert.

    Returns a GraphModule with int8 weights and quantize/dequantize ops; run eagerly it computes in fp32 (a slow
    reference); `compile_for_cpu` lowers it to oneDNN int8 kernels."""
    exported = export(copy.deepcopy(model).eval(), example).module()
    prepared = prepare_pt2e(exported, x86_quantizer(reduce_range=reduce_range))
    for x in calibration:  # observers record each activation's range
        prepared(x)
    return int8_or_raise(drop_unused_attributes(convert_pt2e(prepared)))


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of `model` in which each BatchNorm2d that directly follows a Conv2d in an nn.Sequential is folded into
    that conv's weight and bias (running statistics; the BatchNorm becomes Identity). Same outputs in eval mode."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    model = copy.deepcopy(model).eval()
    for seq in [m for m in model.modules() if isinstance(m, nn.Sequential)]:
        for i in range(len(seq) - 1):  # by position: a layer listed twice is folded where it sits
            conv, bn = seq[i], seq[i + 1]
            if isinstance(conv, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                seq[i], seq[i + 1] = fuse_conv_bn_eval(conv, bn), nn.Identity()
    return model


def prepare_qat(model: nn.Module, example: torch.Tensor | None = None, fold_bn: bool = True) -> torch.fx.GraphModule:
    """QAT: export in train mode and insert fake-quantize ops (int8 rounding forward, straight-through backward).

    fold_bn=True folds BatchNorm into the convs first: fine for fine-tuning a trained network, and it spares
    convert_pt2e its conv-BN folding, which traces 96 pattern variants (20-30 s on 2 CPU cores, any model size).
    The result can be the backbone of ImageClassifierModule: its .train()/.eval() switch the graph's BatchNorm and
    dropout ops (an exported graph has no modes of its own)."""
    base = fold_batchnorm(model) if fold_bn else copy.deepcopy(model)
    exported = export(base.train(), example).module()
    return allow_exported_model_train_eval(prepare_qat_pt2e(exported, x86_quantizer(is_qat=True)))


def convert_qat(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A QAT-trained graph to the same int8 form quantize_ptq gives."""
    prepared = copy.deepcopy(prepared)
    move_exported_model_to_eval(prepared)
    return int8_or_raise(drop_unused_attributes(convert_pt2e(prepared)))


def quantize_linear_int8(model: nn.Module, mode: str = "dynamic") -> nn.Module:
    """int8 Linear layers through torchao.quantization.quantize_ (convolutions stay fp32), on a copy.

    mode "dynamic": int8 weights, activations quantized per row at run time, int8 matrix products;
    mode "weight_only": int8 weights dequantized on the fly, fp32 products (saves memory, not arithmetic)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

    configs = {"dynamic": Int8DynamicActivationInt8WeightConfig, "weight_only": Int8WeightOnlyConfig}
    if mode not in configs:
        raise ValueError(f"mode must be one of {sorted(configs)}, got {mode!r}.")
    model = copy.deepcopy(model).eval()
    quantize_(model, configs[mode](), filter_fn=lambda m, fqn: isinstance(m, nn.Linear))
    return model


def compile_for_cpu(model: nn.Module, *examples: torch.Tensor):
    """torch.compile for CPU inference with Inductor's freezing on (weights become constants, which lets the x86
    passes pre-pack int8 weights and fuse quantize ops into oneDNN int8 kernels). Compiles once per example shape
    here; later shapes recompile, also with freezing."""
    compiled = torch.compile(model)

    @torch.no_grad()
    def run(x: torch.Tensor) -> torch.Tensor:
        # the global patch, not torch.compile(options={"freezing": True}): Dynamo also reads the flag while tracing
        # (parameters become constants); options= reach Inductor only, and the int8 prepack then fails
        with internals.inductor_freezing():
            return compiled(x)

    for x in examples or (example_input(),):
        run(x)
    return run


def prunable(module: nn.Module) -> list[tuple[nn.Module, str]]:
    """(layer, "weight") for every conv and linear layer: what L1 pruning removes weights from."""
    return [(m, "weight") for m in module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def sparsity(module: nn.Module) -> float:
    """Fraction of exactly-zero weights over all conv and linear layers (pruning masks applied)."""
    weights = [getattr(m, name).detach() for m, name in prunable(module)]
    return sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)


class PruneAtStart(ModelPruning):
    """Lightning's ModelPruning: L1 unstructured, ranked over all conv and linear weights together, applied once at
    the start of training; training then fine-tunes the survivors, and the end makes the zeros permanent."""

    def __init__(self, amount: float, **kwargs):
        super().__init__("l1_unstructured", amount=amount, parameter_names=["weight"], apply_pruning=False,
                         use_global_unstructured=True, make_pruning_permanent=True, **kwargs)
        self.target = amount

    def filter_parameters_to_prune(self, parameters_to_prune=()):
        """Conv and linear weights only (Lightning's hook for this): BatchNorm's weights would count by default."""
        return [(m, name) for m, name in parameters_to_prune if isinstance(m, (nn.Conv2d, nn.Linear))]

    def on_train_start(self, trainer, pl_module) -> None:
        self.apply_pruning(self.target)


def save_program(model: nn.Module, path: str | Path, example: torch.Tensor | None = None) -> Path:
    """Save `model` (eval mode) as a torch.export program (.pt2: graph + weights, no pickled code)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(model, nn.Module) and not isinstance(model, torch.fx.GraphModule):
        model = copy.deepcopy(model).eval()
    torch.export.save(export(model, example), path)
    return path


def load_program(path: str | Path) -> nn.Module:
    """Reload a save_program file as a callable module."""
    return torch.export.load(str(path)).module()


def size_mb(path: str | Path) -> float:
    """File size in MB (10^6 bytes)."""
    return os.path.getsize(path) / 1e6


def zipped_mb(path: str | Path) -> float:
    """Size in MB after zlib compression: where the zeros of a pruned model turn into saved bytes."""
    return len(zlib.compress(Path(path).read_bytes(), 6)) / 1e6


@torch.no_grad()
def latency_ms(model, batch: int, *, min_run_time: float = 0.2, shape=(3, 32, 32), device: str = "cpu") -> float:
    """Median ms of one forward pass on a random (batch, *shape) input on `device`, over time_calls' blocks (its
    Timer warms up first and times blocks of calls for about min_run_time seconds)."""
    x = example_input(batch, shape).to(device)
    return 1e3 * statistics.median(time_calls(lambda: model(x), min_run_time=min_run_time))


@torch.no_grad()
def accuracy(model, loader) -> float:
    """Top-1 accuracy over a loader of (images, labels) batches, on the CPU."""
    acc = top1_accuracy()
    for x, y in loader:
        acc.update(model(x), y)
    return acc.compute().item()

