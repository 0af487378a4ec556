"""The performance model: an op's or a step's FLOPs and bytes (counted by measure.opcount), arithmetic intensity,
and, against this machine's measured ceilings (measure.ceilings) and, for products, convolutions and pooling, their
floors at the step's own shapes (opcount.floor), the bound each op hits (compute, memory or the fixed cost per op)
with the time that bound predicts; the roofline plot and a per-layer table."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

import torch

from . import ceilings, timing, verdict
from .opcount import Counts, Op, count, fused, kernel_bound  # noqa: F401  (re-exported: the lessons' names)

KINDS = ("compute", "memory", "overhead")
# ops held to lesson 00's measured tanh rate: tanh itself only (tanh_backward is a multiply-add). Other transcendental
# kernels (ATen's vectorised erf GELU and its backward) ran faster than tanh's rate, so that rate bounds none of them;
# without a ceiling of their own they are held to their bytes, like any elementwise op
TRANSCENDENTAL = re.compile(r"^tanh_?$")
FRESH_BYTES = 32 * 2**20  # glibc always maps blocks past 32 MiB anew; smaller ones reuse freed heap memory


@dataclass(frozen=True)
class Bound:
    """The time each ceiling alone allows for some work, and the one that binds (the largest)."""

    seconds: dict  # {"compute": s, "memory": s, "overhead": s}

    kind = property(lambda self: max(self.seconds, key=self.seconds.get), doc="compute, memory or overhead.")
    predicted = property(lambda self: max(self.seconds.values()), doc="Seconds the binding ceiling allows.")


def bound(flops: float, moved: float, ops: int, *, rate: float, bandwidth: float, per_op: float) -> Bound:
    """The roofline with a fixed cost: FLOPs at `rate`, bytes at `bandwidth`, ops at `per_op` seconds each."""
    return Bound({"compute": flops / rate, "memory": moved / bandwidth, "overhead": ops * per_op})


def _row(ceil: ceilings.Ceilings, name: str) -> float | None:
    """The best figure of the ceiling `name` where lesson 00 measured it, else None."""
    return ceil.rows[name].best if name in ceil.rows else None


def op_class(op: Op) -> str:
    """An op's class: "matmul" (products, convolutions), "transcendental" (tanh, exp, ...) or "elementwise"."""
    return "matmul" if op.matmul else "transcendental" if TRANSCENDENTAL.match(op.name.lstrip("_")) else \
        "elementwise"


def bandwidth(ceil: ceilings.Ceilings, moved: float) -> float:
    """Bytes/s for an op moving `moved` bytes: the cache's bandwidth where they fit in it (lesson 00), else DRAM's."""
    return ceil.bandwidth_for(moved)


def first_touch(ceil: ceilings.Ceilings, op: Op) -> float:
    """Seconds the op's fresh output costs beyond a reused one (lesson 00's fresh and reused adds apart), for an op
    without a floor and outputs of FRESH_BYTES or more (always newly mapped pages). An op with a floor has it measured
    at its own size and allocation pattern (opcount.reference): nothing is added on a threshold's guess."""
    return ceil.first_touch * op.fresh if not op.floor and op.fresh >= FRESH_BYTES and "add fresh" in ceil.rows \
        else 0.0


def per_op(ceil: ceilings.Ceilings, op: Op | None = None) -> float:
    """The fixed cost each op pays: a fused kernel one compiled call's, where measured; else one eager op's."""
    return (_row(ceil, "per call compiled") if op is not None and op.name == "fused" else None) or ceil.per_op


def op_bound(op: Op, ceil: ceilings.Ceilings, fmt: str = "fp32", rate: float | None = None) -> Bound:
    """One op against the ceilings of its class (op_class): products and convolutions at the matmul rate of `fmt`
    (or `rate`, a measured rate where the format is emulated), bytes at the bandwidth its size allows, transcendental
    elements at their measured rate; a kernel-bound op no faster than its floor at its shapes (op.floor, where
    counted), as compute (products) or memory (pooling, elementwise: opcount.reference); the fixed cost per op
    (per_op) beside them."""
    tr = _row(ceil, "tanh") if op_class(op) == "transcendental" else None  # elements/s
    fixed = per_op(ceil, op)
    compute = (op.flops if op.matmul else 0) / (rate or ceil.rate(fmt)) + (op.flops / tr if tr else 0.0)
    memory = op.bytes / bandwidth(ceil, op.bytes) + first_touch(ceil, op)
    kernel = max(0.0, op.floor - fixed)  # the op alone at its shapes, less the fixed cost charged beside it
    return Bound({"compute": max(compute, kernel) if op.matmul else compute,
                  "memory": memory if op.matmul else max(memory, kernel), "overhead": fixed})


@dataclass(frozen=True)
class StepModel:
    """A step's predicted seconds (its ops' bounds summed), the share of them each bound holds, and the largest."""

    predicted: float  # seconds
    share: dict  # {"compute": fraction, "memory": fraction, "overhead": fraction}
    kind: str  # compute, memory or overhead: the largest share
    floor: float = 0.0  # fraction of `predicted` that ops' floors set (each op timed alone at its shapes)


def step_model(counts: Counts, ceil: ceilings.Ceilings, fmt: str = "fp32", rate: float | None = None) -> StepModel:
    """Each op against the ceilings of its class, one after another: an op's work takes the longer of its compute and
    its memory time, plus the fixed cost per op; predicted seconds are their sum, with the share of it spent bound by
    compute, memory and the per-op cost (overhead); `kind` is the largest share; `floor` the share that ops' floors
    set (opcount.floor: the op timed alone at its shapes)."""
    share, floor = dict.fromkeys(KINDS, 0.0), 0.0
    for op in counts.ops:
        b = op_bound(op, ceil, fmt, rate)
        work = max(b.seconds["compute"], b.seconds["memory"])
        share["compute" if b.seconds["compute"] >= b.seconds["memory"] else "memory"] += work
        share["overhead"] += b.seconds["overhead"]
        floor += work if op.floor and work == max(0.0, op.floor - b.seconds["overhead"]) else 0.0  # the floor set it
    total = sum(share.values())
    return StepModel(total, {k: v / total for k, v in share.items()} if total else share, max(share, key=share.get),
                     floor / total if total else 0.0)


def ops(n: int) -> str:
    """'1 op', '50 ops'."""
    return f"{n:,} op{'s' * (n != 1)}"


def explain(name: str, counts: Counts, ceil: ceilings.Ceilings, measured: list[float], fmt: str = "fp32",
            rate: float | None = None) -> str:
    """A printed verdict, one fact a line (each <= verdict.LONGEST): what the step does; the bound it hits against
    which ceilings (where its ops' floors set most of the prediction, those floors); the predicted time by bound; the
    time that predicts against the measured time with its spread. `rate`: the products' measured FLOP/s where `fmt`
    has no native ceiling (emulated), on a line of its own."""
    m = step_model(counts, ceil, fmt, rate)
    med = statistics.median(measured)
    shares = ", ".join(f"{100 * m.share[k]:.0f} % {k}" for k in KINDS)
    spread = (f"{timing.duration(min(measured))}-{timing.duration(max(measured))}, {len(measured)} runs"
              if len(measured) > 1 else "a single run, no spread")
    emulated = [f"  {fmt} is emulated: products at the measured {timing.flop_rate(rate)}"] if rate else []
    return "\n".join([
        f"{name}: {verdict.number(counts.flops / 1e9)} GFLOP, {verdict.number(counts.bytes / 2**20)} MiB moved, "
        f"{ops(counts.n_ops)}, {verdict.number(counts.intensity)} FLOP/byte",
        f"  bound by its ops' floors (each op timed alone at its shapes): {100 * m.floor:.0f} % of the predicted time"
        if m.floor > 0.5 else f"  {m.kind}-bound against {ceil.hardware}'s {fmt} ceilings", *emulated,
        f"  predicted time by bound: {shares}",
        f"  the model predicts {timing.duration(m.predicted)}, measured {timing.duration(med)} (median; {spread}): "
        f"{verdict.number(med / m.predicted)}x the prediction"])


@dataclass(frozen=True)
class CeilingFraction:
    """Products' achieved FLOP/s against this machine's measured ceiling: the rate, its fraction, the ceiling's name."""

    flops_per_s: float
    fraction_of_ceiling: float
    ceiling: str  # e.g. "bf16 convolution ceiling"


def achieved(counts: Counts, seconds: float, ceil: ceilings.Ceilings, fmt: str = "fp32") -> CeilingFraction:
    """Achieved FLOP/s of the matrix products and convolutions in `counts` (FlopCounterMode's total, as MFU counts)
    done in `seconds`, its fraction of the measured products' ceiling in `fmt` (Ceilings.rate) and that ceiling's
    name ("bf16 convolution ceiling": the faster of the square matmul and the models' convolution, which rate takes)."""
    rate, row = counts.matmul_flops / seconds, ceil.rows[ceil.rate_row(fmt)]
    kind = "convolution" if row.name.startswith("conv") else "matmul"
    return CeilingFraction(rate, rate / ceil.rate(fmt), f"{fmt} {kind} ceiling")


@dataclass(frozen=True)
class Layer:
    """One leaf layer's forward: FLOPs, bytes, the bound it hits, predicted and measured (median) seconds."""

    layer: str  # its name in net.named_modules()
    type: str  # its class name
    flops: float
    bytes: float
    kind: str  # compute, memory or overhead
    predicted: float
    measured: float


def layers(net: torch.nn.Module, x: torch.Tensor, ceil: ceilings.Ceilings, fmt: str = "fp32",
           min_run_time: float = 0.05) -> list[Layer]:
    """Per leaf layer of `net` on input x (forward only): FLOPs, bytes, bound, predicted and measured seconds
    (timing.time_calls, CUDA-synchronized on a GPU), in forward order."""
    inputs: dict[str, torch.Tensor] = {}
    leaves = [(n, m) for n, m in net.named_modules() if not list(m.children())]
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: inputs.setdefault(n, args[0])) for n, m in leaves]
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    rows = []
    with torch.no_grad():
        for name, mod in leaves:
            if name not in inputs:
                continue
            c = count(mod, inputs[name], floors=True)  # convolutions at their own shapes' floor
            if not c.ops:
                continue
            m = step_model(c, ceil, fmt)
            times = timing.time_calls(lambda mod=mod, inp=inputs[name]: mod(inp), min_run_time=min_run_time)
            rows.append(Layer(name, type(mod).__name__, c.flops, c.bytes, m.kind, m.predicted,
                              statistics.median(times)))
    return rows


def layer_lines(rows: list[Layer]) -> list[str]:
    """The per-layer table as printed lines, six columns: each layer's measured time with its share of the total."""
    total = sum(r.measured for r in rows)
    out = [f"{'layer (type)':<34}{'MFLOP':>9}{'MiB':>8}{'bound':>10}{'pred. ms':>10}{'measured ms':>19}"]
    out += [f"{(r.layer + ' (' + r.type + ')')[:33]:<34}{r.flops / 1e6:>9.1f}{r.bytes / 2**20:>8.2f}"
            f"{r.kind:>10}{r.predicted * 1e3:>10.3f}{r.measured * 1e3:>11.3f} ({100 * r.measured / total:>3.0f} %)"
            for r in rows]
    return out


OVER = 3.0  # a layer type measured at this many times its bound or more gets a line on how its time scales


def over_bound(rows: list[Layer], factor: float = OVER) -> list[str]:
    """Two lines per layer type whose every layer runs at `factor` times its bound or more: its times against its
    bytes, and what that says. A time that barely grows with the bytes (less than their square root) is a fixed cost
    per call the model, bytes over bandwidth plus one op's cost, does not have; else a rate below its bandwidth."""
    out = []
    for kind in dict.fromkeys(r.type for r in rows):
        mine = [r for r in rows if r.type == kind]
        if min(r.measured / r.predicted for r in mine) < factor:
            continue
        small, big = min(mine, key=lambda r: r.bytes), max(mine, key=lambda r: r.bytes)
        ratios = sorted(r.measured / r.predicted for r in mine)
        times = sorted(r.measured for r in mine)
        out.append(f"{kind}: {len(mine)} layer{'s' * (len(mine) > 1)} at "
                   f"{timing.span(verdict.number(ratios[0]), verdict.number(ratios[-1]))}x their bound, "
                   f"{timing.span(timing.duration(times[0]), timing.duration(times[-1]))} for "
                   f"{timing.span(f'{small.bytes / 2**20:.2f}', f'{big.bytes / 2**20:.2f}')} MiB")
        grown, more = big.measured / small.measured, big.bytes / max(small.bytes, 1)
        if more > 1 and grown < more ** 0.5:
            out.append(f"  {verdict.number(grown)}x the time for {verdict.number(more)}x the bytes: a fixed cost of up "
                       f"to {timing.duration(small.measured)} a call, which the model lacks")
        else:
            out.append(f"  {verdict.number(grown)}x the time for {verdict.number(more)}x the bytes: the bytes move "
                       f"below the bandwidth the model assumes")
    return out


def plot(ceil: ceilings.Ceilings, points: list[tuple[str, float, float, float]], ax=None,
         roofs: list[tuple[str, float, float]] | None = None):
    """Log-log roofline in GFLOP/s against FLOP/byte: each roof (label, FLOP/s, bytes/s) as min(rate, bandwidth x
    intensity), by default one per format (its fastest product, the DRAM copy), and each point (label, FLOPs, bytes,
    seconds) at its intensity and achieved rate, in black (the roofs take the colour cycle)."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    xs = [f / b for _, f, b, _ in points if b > 0]
    lo, hi = min([0.01, *xs]) / 2, max([1000, *xs]) * 2
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    roofs = roofs or [(f"roof: {fmt} products, DRAM copy", ceil.rate(fmt), ceil.bandwidth) for fmt in ceil.formats()]
    for label, rate, bandwidth in roofs:
        ax.plot(grid, [min(rate, bandwidth * x) / 1e9 for x in grid], label=label)
    for label, f, b, s in points:
        ax.scatter([f / max(b, 1)], [f / s / 1e9], color="black", zorder=3)
        ax.annotate(label, (f / max(b, 1), f / s / 1e9), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte moved)",
           ylabel="GFLOP/s", title=f"roofline of {ceil.hardware} ({ceil.device}, measured ceilings)")
    ax.legend(fontsize=8)
    return ax
