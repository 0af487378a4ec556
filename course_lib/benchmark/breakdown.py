"""Where a step's time goes: the step run under torch.profiler (CPU activities, shapes recorded), its time grouped by
the aten ops the performance model counts (measure.roofline), each op's measured time beside its bound from the
ceilings of its class and its efficiency, and the rest named: the autograd engine, the optimiser's Python, the
loader, aten's wrappers and views, and Python between ops. Reconciled with the step time measured outside the
profiler (course_lib.measure.timing), whose difference is the profiler's own overhead; one printed sentence names the
largest gap between measured and modelled time and its cause."""
from __future__ import annotations

import builtins
import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from torch.profiler import ProfilerActivity, profile

from ..base import config
from ..measure import ceilings, roofline, timing
from . import bench

# named overhead: a profiler event whose name starts with one of these, and what ran inside it that the model does
# not count, goes to that row (searched innermost first: an op the model counts inside it stays the op's)
OVERHEAD = (("loader", "enumerate(DataLoader)"), ("optimiser (Python)", "Optimizer."),
            ("autograd engine", "autograd::engine"), ("aten wrappers and views", "aten::"))
PYTHON = "Python between ops"  # the step's time outside every recorded event: the interpreter, unrecorded work
CAUSES = {  # why a row takes longer than the model allows, as the sentence says it
    "compute": "the step runs it slower than it ran alone",
    "alone": "the step runs it slower than its fastest call",  # its floor (alone or in the step) set its bound
    "memory": "its bytes moved at {rate}, the bound assumes {assumed}",  # measured, not a guessed cause
    "overhead": "its fixed cost per call is above the per-op cost",
    "loader": "each batch is fetched and collated in Python",
    "optimiser (Python)": "the optimiser loops over the parameters in Python",
    "autograd engine": "backward's bookkeeping per op, not in the per-op cost",
    "aten wrappers and views": "wrapper ops and views, counted as free",
    PYTHON: "not inside any recorded op (Python or unrecorded work)"}
# seconds of profiled steps: enough steps that one slow step does not decide a row; a smoke run checks the code, so
# a short step (LeNet at batch 4: hundreds of steps, each event of them processed in Python) profiles fewer there
MIN_PROFILED_S = {"smoke": 0.05, "full": 0.3}
SENTENCE_CHARS = 120


@dataclass
class Breakdown:
    """One step's time, op by op (seconds per step) against the model, reconciled with the step timed outside."""

    ops: dict[str, dict]  # aten op -> {"calls", "measured", "bound", "kind"} per step
    overhead: dict[str, float]  # named overhead -> seconds per step (profiled)
    measured: list[float]  # seconds per step outside the profiler, one per timed block or run
    profiled: float  # seconds per step under the profiler
    predicted: float  # the step model's seconds (roofline.step_model: the ops' bounds summed)
    hardware: str
    counts: roofline.Counts | None = None  # the step's ops as the model counts them
    fmt: str = "fp32"
    rate: float | None = None  # the products' measured rate where `fmt` is emulated (roofline.explain)
    steps: int = 0  # steps profiled
    rows: list[dict] = field(default_factory=list)  # every row, largest measured first (rows())

    step = property(lambda self: statistics.median(self.measured), doc="The step measured outside the profiler.")
    overhead_s = property(lambda self: self.profiled - self.step, doc="The profiler's own cost per step.")
    recorded = property(lambda self: 1 - self.overhead.get(PYTHON, 0.0) / self.profiled,
                        doc="Share of the profiled step inside events the profiler recorded (ops, named overhead).")


def _chain(event) -> list[str]:
    """The names of `event` and of every event around it, innermost first; [] for None."""
    chain = []
    while event is not None:
        chain.append(event.name)
        event = event.cpu_parent
    return chain


def _outer_op(chain: list[str], counted: set[str]) -> str | None:
    """The outermost op of `chain` that the model counts (its name without "aten::"), or None."""
    ops = [n[6:] for n in chain if n.startswith("aten::") and n[6:] in counted]
    return ops[-1] if ops else None


def _category(event, counted: set[str]) -> str:
    """The row an event's own time goes to: the outermost op the model counts around it (or itself), else the
    innermost named overhead around it."""
    chain = _chain(event)
    return _outer_op(chain, counted) or next(  # outermost: what ran inside an op is that op's time
        (row for name in chain for row, prefix in OVERHEAD if name.startswith(prefix)), PYTHON)


def measure(step: Callable[[], object], ceil: ceilings.Ceilings, *, fmt: str = "fp32", rate: float | None = None,
            measured: list[float] | None = None, steps: int | None = None,
            counts: roofline.Counts | None = None) -> Breakdown:
    """Break `step` down: count its ops once warm (roofline.count, unless `counts` gives the lesson's own count with
    floors, so one call has one prediction), time it outside the profiler (timing.time_calls, unless `measured` gives
    seconds per step), then profile `steps` steps (enough for MIN_PROFILED_S by default). A kernel-bound op's floor
    is the faster of it alone and in those steps (seen_in_step); bd.counts holds the floors the model used."""
    step()  # warm: the optimiser's state exists, the first-call allocations are done
    counts = counts or roofline.count(step, floors=True)  # products, convolutions, pooling: floors at these shapes
    size = config.run_size().name
    measured = measured or timing.time_calls(step, min_run_time=0.2 if size == "smoke" else 1.0)
    steps = steps or max(3, round(MIN_PROFILED_S[size] / statistics.median(measured)))
    watch = timing.Stopwatch(ceil.device)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, watch:
        for _ in range(steps):
            step()
    counts = seen_in_step(counts, prof.events(), steps)
    model = defaultdict(lambda: {"calls": 0, "bound": 0.0, "bytes": 0, "alone": 0.0, "work": defaultdict(float),
                                 "faults": 0.0})
    for op in counts.ops:
        b, row = roofline.op_bound(op, ceil, fmt, rate), model[op.name]
        kind = "compute" if b.seconds["compute"] >= b.seconds["memory"] else "memory"
        work = max(b.seconds["compute"], b.seconds["memory"])
        row["calls"] += 1
        row["bound"] += work + b.seconds["overhead"]
        row["bytes"] += op.bytes
        row["class"] = roofline.op_class(op)
        row["faults"] += op.faults  # new pages the step mapped in this op: counted, not in the bound
        row["alone"] += work if op.floor and work == max(0.0, op.floor - b.seconds["overhead"]) else 0.0  # floor's
        row["work"][kind] += work
        row["work"]["overhead"] += b.seconds["overhead"]
    spent = defaultdict(float)  # row -> self seconds over all profiled steps
    for event in prof.events():
        spent[_category(event, set(model))] += event.self_cpu_time_total / 1e6
    profiled = watch.seconds / steps
    ops = {name: {"calls": row["calls"], "measured": spent.pop(name, 0.0) / steps, "bound": row["bound"],
                  "kind": max(row["work"], key=row["work"].get), "bytes": row["bytes"], "class": row["class"],
                  "work": row["bound"] - row["work"]["overhead"],  # the bound less the fixed cost per op
                  "faults": row["faults"],  # page faults a step (opcount: counted, not charged)
                  "alone": row["alone"] >= 0.5 * (row["bound"] - row["work"]["overhead"])}  # floors set most of it
           for name, row in model.items()}
    overhead = {name: s / steps for name, s in spent.items() if name != PYTHON}
    overhead[PYTHON] = max(0.0, profiled - sum(r["measured"] for r in ops.values()) - sum(overhead.values()))
    predicted = roofline.step_model(counts, ceil, fmt, rate).predicted
    return rows(Breakdown(ops, overhead, list(measured), profiled, predicted, ceil.hardware, counts, fmt, rate, steps))


def seen_in_step(counts: roofline.Counts, events, steps: int) -> roofline.Counts:
    """counts with each kernel-bound op's floor (the op itself timed alone at its shapes) lowered to its fastest call
    in the profiled steps where that was faster: both are times the op took at these shapes, alone or in the step
    (where its inputs may be hot in the cache), so the faster is its floor. Calls are matched by order within a step;
    an op whose calls do not number `steps` times its count is left as it was."""
    floored = {o.name for o in counts.ops if o.floor and roofline.kernel_bound(o.name, o.matmul)}
    counted, seen = {o.name for o in counts.ops}, defaultdict(list)  # name -> each outermost call's seconds, in order
    for e in sorted(events, key=lambda e: e.time_range.start):
        name = e.name[6:] if e.name.startswith("aten::") else ""
        if name in floored and _outer_op(_chain(e.cpu_parent), counted) is None:  # outermost: its inside is its time
            seen[name].append(e.cpu_time_total / 1e6)
    ops = list(counts.ops)  # the caller's counts themselves come back where no floor moved
    for name in floored:
        where = [i for i, o in enumerate(ops) if o.name == name]
        if len(seen[name]) != steps * len(where):
            continue
        for k, i in enumerate(where):
            fastest = min(seen[name][s * len(where) + k] for s in range(steps))
            if ops[i].floor and fastest < ops[i].floor:
                ops[i] = dataclasses.replace(ops[i], floor=fastest)
    return counts if ops == counts.ops else roofline.Counts(ops, counts.matmul_flops)


def rows(bd: Breakdown) -> Breakdown:
    """Fill bd.rows: ops and named overhead, each with its measured and modelled seconds per step, largest first."""
    found = [{"name": n, **r, "gap": r["measured"] - r["bound"]} for n, r in bd.ops.items()]
    found += [{"name": n, "calls": None, "measured": s, "bound": 0.0, "kind": "not modelled", "gap": s}
              for n, s in bd.overhead.items() if s > 0]
    bd.rows = sorted(found, key=lambda r: -r["measured"])
    return bd


def table(bd: Breakdown, top: int = 5) -> str:
    """The `top` rows by measured time as a markdown table (ms per step, share of the profiled step, the model's
    bound and efficiency), and under it the reconciliation with the step timed outside the profiler."""
    lines = ["| op or overhead | calls | measured (share) | bound (class) | efficiency |", "|---|---|---|---|---|"]
    for r in bd.rows[:top]:
        eff = f"{100 * r['bound'] / r['measured']:.0f} %" if r["bound"] and r["measured"] else "–"
        bound = f"{timing.duration(r['bound'])} ({r['kind']})" if r["calls"] else "not in the model"
        lines.append(f"| {r['name']} | {r['calls'] or '–'} | {timing.duration(r['measured'])} "
                     f"({100 * r['measured'] / bd.profiled:.0f} %) | {bound} | {eff} |")
    return "\n".join(lines) + "\n\n" + reconcile(bd) + f"\n\nHardware: {bd.hardware}; size {config.run_size().name}"


def reconcile(bd: Breakdown) -> str:
    """The profiled step against the step timed outside the profiler, as a markdown list of one fact a line: the
    step outside it, the profiler's own overhead, the shares recorded in the ops the model counts, in named overhead
    and between recorded events, and the model's prediction."""
    named = sum(r["measured"] for r in bd.ops.values()) / bd.profiled
    lo, hi = (timing.duration(f(bd.measured)) for f in (min, max))
    spread = f"{timing.span(lo, hi)}, {len(bd.measured)} runs" if len(bd.measured) > 1 else "one run"
    own = ("the same: no profiler overhead measured" if timing.duration(bd.profiled) == timing.duration(bd.step)
           else f"so the profiler's own overhead is {timing.duration(bd.overhead_s)} "
           f"({100 * bd.overhead_s / bd.step:.0f} %)"
           if bd.overhead_s >= 0 else f"{timing.duration(-bd.overhead_s)} under the median timed outside it: "
           "no profiler overhead measured")
    return "\n".join([
        f"- Per step: {timing.duration(bd.step)} timed outside the profiler (median; {spread})",
        f"- under the profiler: {timing.duration(bd.profiled)} ({bd.steps} steps), {own}",
        f"- {100 * named:.0f} % of the profiled step ran in the {len(bd.ops)} kinds of op the model counts",
        f"- {100 * (bd.recorded - named):.0f} % in named overhead the profiler recorded, "
        f"{100 * (1 - bd.recorded):.0f} % between recorded events ({PYTHON})",
        f"- the model predicts {timing.duration(bd.predicted)}"])


def sentence(bd: Breakdown) -> str:
    """One sentence, one line where it fits (<= SENTENCE_CHARS): the row with the largest gap between measured and
    modelled time, its efficiency and why; where that does not fit, without the efficiency; where neither fits, the
    cause goes on an indented second line (never dropped, never a cut word)."""
    r = max(bd.rows, key=lambda r: r["gap"])
    alone = r.get("alone") and roofline.kernel_bound(r["name"], r.get("class") == "matmul")  # the op itself, timed
    why = CAUSES.get(r["name"]) or CAUSES["alone" if alone else r["kind"]]  # (an elementwise floor is a copy: rates)
    if r["kind"] == "memory" and r.get("bytes") and r["measured"] and r.get("work"):  # rates: measured, assumed
        why = why.format(rate=_rate(r["bytes"] / r["measured"]), assumed=_rate(r["bytes"] / r["work"]))
        faults = round(r.get("faults", 0))  # new pages the op touched: counted, not charged
        why += f"; {faults:,} page faults a step, not in the model" if faults else ""
    elif "{" in why:  # a memory row without its bytes (an injected Breakdown): its time against the bound only
        why = "it takes longer than its bytes allow"
    named = f"{r['name']} ({r['class']})" if r.get("class") else r["name"]  # the op class the gap is in
    head = f"Largest gap: {named}, {timing.duration(r['gap'])} a step over the model"
    eff = f", at {100 * r['bound'] / r['measured']:.0f} % of its bound" if r["calls"] and r["measured"] else ""
    fits = [line for line in (f"{head}{eff}: {why}", f"{head}: {why}") if len(line) <= SENTENCE_CHARS]
    return fits[0] if fits else f"{head}{eff}:\n  {why}"


def _rate(bytes_per_s: float) -> str:
    """Bytes/s as '27.4 GB/s' (3 significant figures)."""
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def show(bd: Breakdown, top: int = 5) -> None:
    """The top rows as a rendered table (bench.Table), then the sentence."""
    (getattr(builtins, "display", None) or print)(bench.Table(table(bd, top)))
    print(sentence(bd))


def explain(bd: Breakdown, name: str, ceil: ceilings.Ceilings) -> str:
    """roofline.explain's line for the step broken down: its counts, against the step timed outside the profiler."""
    return roofline.explain(name, bd.counts, ceil, bd.measured, bd.fmt, bd.rate)


def report(step: Callable[[], object], ceil: ceilings.Ceilings, name: str, **kwargs) -> Breakdown:
    """measure(step, ceil, **kwargs), printed: the model's line (explain), its top 5 rows and the sentence."""
    bd = measure(step, ceil, **kwargs)
    print(explain(bd, name, ceil))
    show(bd)
    return bd
