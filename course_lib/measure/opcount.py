"""Counting the ops a call runs (roofline.count): each aten op's FLOPs (torch's FlopCounterMode and its formulas) and
the bytes of its tensor inputs and outputs (a gather: the rows it reads), seen by a dispatch mode; and, where asked,
each op's floor at its own sizes. Products, convolutions and pooling are replayed alone with the step's own arguments
(their speed depends on their shapes: LeNet's 6-channel convolutions run far below a 2048x2048 matmul's rate); every
other op gets its reference, a copy of the bytes it writes into a new or a reused buffer as the op does, which
measures the first touch of new pages at the op's size. A floor is the best sustained seconds of one call. Where a
step's own ops map new pages (glibc gives a trimmed heap's memory back and maps it again), their minor page faults
are counted per op over a few calls of the step: a measured fact the breakdown prints, not a cost in the bound."""
from __future__ import annotations

import dataclasses
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from ..base import config
from ..base.internals import TorchDispatchMode  # the hook that sees every aten op; torch names it only privately
from . import timing
from .ceilings import NOISY, RETRIES
from .opclasses import minor_faults

NO_TRAFFIC = ("empty", "detach", "lift_fresh", "alias", "_record_function")  # allocate, relabel or mark: no data
TRANSCENDENTAL_OPS = ("tanh", "exp", "log", "sigmoid", "erf")  # a fused kernel's costliest part where it has one
GATHERS = ("index", "index_select", "gather", "take", "embedding")  # read only the rows they gather from arg 0
POOLING = ("max_pool", "avg_pool", "adaptive_max_pool", "adaptive_avg_pool")  # kernel-bound, not bytes-bound
#: data-movement kernels that compute an address per element (gathers, pads, mirrors): far below a copy's bandwidth
#: at small images (a uint8 (256, 3, 36, 40) row gather: element by element), so timed alone at their shapes too
DATA_MOVEMENT = (*GATHERS, "constant_pad_nd", "reflection_pad", "replication_pad", "flip")
FLOOR_SECONDS = {"smoke": 0.02, "full": 0.1}  # timed seconds per distinct op and shape (a few blocks)
FLOOR_BLOCK_S = {"smoke": 0.005, "full": None}  # smoke: four short blocks (timing.time_calls' block_s); full: its own
REFERENCE_BYTES = 2**16  # smaller outputs' copies take about one op's fixed cost, which the model charges already
# passes over a step's ops (each keeps its fastest block of all of them) and a noisy timing's retries, by run size: a
# smoke run only checks the code, so one pass and no retries (make test's time, issue 45); full keeps both
FLOOR_PASSES = {"smoke": 1, "full": 2}
FLOOR_RETRIES = {"smoke": 0, "full": RETRIES}
# calls of the step whose page faults are counted (the mean per call is kept), after FAULT_WARMUP calls uncounted: the
# allocator's first calls after other work map more pages than its steady state does
FAULT_CALLS, FAULT_WARMUP = {"smoke": 1, "full": 16}, {"smoke": 0, "full": 2}
_floors: dict[tuple, float] = {}  # signature -> best seconds per call, kept for the process (a lesson's sweep)


@dataclass(frozen=True)
class Op:
    """One aten op as counted: its name, FLOPs and the bytes of its tensor inputs and outputs."""

    name: str
    flops: int
    bytes: int
    matmul: bool = False  # a matrix product or convolution (FlopCounterMode's formulas): runs at the matmul rate
    fresh: int = 0  # bytes of output the op allocates (not in place, no out=): new pages where they are large
    floor: float = 0.0  # seconds one call takes alone at these shapes (best sustained), where measured; 0: not
    faults: float = 0.0  # minor page faults (new pages) per call of the step, mean of FAULT_CALLS calls: counted, not
    # charged: their cost per page varied with the op on this course's CPU (no probe of it was a lower bound)


@dataclass
class Counts:
    """The ops a call ran (views excluded: they move no data and launch no kernel) and FlopCounterMode's total."""

    ops: list[Op]
    matmul_flops: int  # FlopCounterMode's total: matrix products and convolutions only

    flops = property(lambda self: sum(o.flops for o in self.ops), doc="FLOPs, pointwise ops at one per element.")
    bytes = property(lambda self: sum(o.bytes for o in self.ops), doc="Bytes read and written, summed over ops.")
    n_ops = property(lambda self: len(self.ops), doc="Kernels run (ops that are not views).")
    intensity = property(lambda self: self.flops / max(self.bytes, 1), doc="FLOPs per byte moved.")


def kernel_bound(name: str, matmul: bool) -> bool:
    """Whether an op's time depends on its shapes beyond FLOPs and bytes: products, convolutions, pooling, and the
    data-movement kernels (DATA_MOVEMENT: lesson 03's and 08's batch augmentation)."""
    return matmul or name.lstrip("_").startswith(POOLING) or name.startswith(DATA_MOVEMENT)


def _describe(item) -> object:
    """A hashable description of an argument: a tensor by shape, strides, dtype and device; lists element-wise."""
    if isinstance(item, torch.Tensor):
        return tuple(item.shape), item.stride(), str(item.dtype), item.device.type
    if isinstance(item, (list, tuple)):
        return tuple(_describe(i) for i in item)
    return repr(item)


def floor(func, args: tuple, kwargs: dict, again: bool = False) -> float:
    """Best sustained seconds of one call of func(*args, **kwargs) alone (timing.time_calls' fastest block), kept per
    op and shapes in this process; `again`: time it once more and keep the faster. The arguments are the step's own
    (values do not change a kernel's time)."""
    key = (str(func), _describe(list(args)), _describe(sorted(kwargs.items())))
    if key not in _floors or again:
        _floors[key] = min(_floors.get(key, float("inf")), _best(lambda: func(*args, **kwargs)))
    return _floors[key]


def reference(written: int, read: int, fresh: bool, device: str = "cpu", again: bool = False) -> float:
    """Best sustained seconds of the least work that writes `written` bytes: a copy of them where the op reads at
    least as many (else a fill), into a new buffer each call where the op allocates its output (`fresh`), else into a
    reused one. The same bytes, sizes and allocation pattern as the op, so the first touch of new pages is measured at
    the op's own size (the allocator's choice depends on size and history), not guessed from a threshold. An
    elementwise op does at least this work, so it is that op's floor (`again`: time it once more, keep the faster)."""
    copy = read >= written
    key = ("reference", written, copy, fresh, device)
    if key not in _floors or again:
        src = torch.zeros(written, dtype=torch.uint8, device=device)
        dst = None if fresh else torch.empty_like(src)
        fn = (src.clone if fresh else lambda: dst.copy_(src)) if copy else \
            (lambda: torch.empty_like(src).fill_(1)) if fresh else lambda: dst.fill_(1)
        _floors[key] = min(_floors.get(key, float("inf")), _best(fn))
    return _floors[key]


class _FaultCounter(TorchDispatchMode):
    """Adds each op's minor page faults to `tally`, the ops numbered as _OpRecorder numbers them."""

    def __init__(self, tally: Counter):
        super().__init__()
        self.tally, self.index = tally, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = minor_faults()
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or func.__name__.split(".")[0].startswith(NO_TRAFFIC)):
            self.tally[self.index] += minor_faults() - before
            self.index += 1
        return out


def _passes() -> int:
    """Passes over a step's floors at this run size (FLOOR_PASSES)."""
    return FLOOR_PASSES[config.run_size().name]


def _best(fn: Callable[[], object]) -> float:
    """The fastest block's seconds per call of fn (timing.time_calls), re-timed while its blocks spread past NOISY."""
    size, tries = config.run_size().name, []
    seconds, retries = FLOOR_SECONDS[size], FLOOR_RETRIES[size]
    while len(tries) <= retries and (not tries or max(tries[-1]) > NOISY * min(tries[-1])):  # a busy machine's
        tries.append(timing.time_calls(fn, min_run_time=seconds, block_s=FLOOR_BLOCK_S[size]))  # blocks: again
    return min(min(t) for t in tries)


class _OpRecorder(TorchDispatchMode):
    """Records every aten op: FLOPs from FlopCounterMode's formulas (pointwise ops one per output element) and bytes
    of its tensor inputs and outputs (an `out=` tensor counted once, as written); keeps kernel-bound ops' calls for
    their floors when `floors`."""

    def __init__(self, floors: bool = False):
        super().__init__()
        self.ops: list[Op] = []
        self.calls: dict[int, Callable] = {}  # index in ops -> its floor's timer (again=True: time it once more)
        self.floors = floors
        self.chain: list[tuple] = []  # (index, bytes written, a copy?, fresh?, kernel-bound?) of each large output
        self.died: dict[int, int] = {}  # index in ops -> ops recorded when the step freed that op's output

    def _freed(self, index: int) -> None:
        self.died[index] = len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        if func.is_view or name.startswith(NO_TRAFFIC):
            return out
        ins = _tensors([*args, *(v for k, v in kwargs.items() if k != "out")])
        outs = _tensors([out])
        read = sum(t.numel() * t.element_size() for t in ins)
        if name in GATHERS and isinstance(args[0], torch.Tensor):  # a gather reads the rows it writes, not its source
            read += min(0, sum(t.numel() * t.element_size() for t in outs) - args[0].numel() * args[0].element_size())
        packet = func.overloadpacket  # the op family FlopCounterMode keys its formulas by
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        else:
            flops = sum(t.numel() for t in outs) if torch.Tag.pointwise in func.tags else 0
        fresh = 0 if name.endswith("_") or "out" in kwargs else sum(t.numel() * t.element_size() for t in outs)
        matmul = packet in flop_registry
        written = sum(t.numel() * t.element_size() for t in outs)
        real = all(t.device.type != "meta" for t in ins + outs)
        if self.floors and real and kernel_bound(name, matmul) and fresh:  # the op itself, alone at its shapes
            self.calls[len(self.ops)] = lambda again, c=(func, args, kwargs): floor(*c, again=again)
        elif self.floors and real and written >= REFERENCE_BYTES and not kernel_bound(name, matmul):  # its copy
            self.calls[len(self.ops)] = lambda again, w=(written, read, bool(fresh), outs[0].device.type): \
                reference(*w, again=again)
        if self.floors and real and written >= REFERENCE_BYTES and outs[0].device.type == "cpu":
            self.chain.append((len(self.ops), written, read >= written, bool(fresh), kernel_bound(name, matmul)))
            if fresh:
                weakref.finalize(outs[0], self._freed, len(self.ops))
        self.ops.append(Op(name, int(flops), read + written, matmul, fresh))
        return out


def replay(chain: list[tuple], died: dict[int, int]) -> dict[int, float]:
    """Each elementwise op's reference copy into a new output replayed in the step's order, every large output
    allocated and freed when the step allocated and freed its own (a kernel-bound op's as a copy, untimed), each copy
    reading the latest output: the allocator meets the step's sizes and lifetimes, so new pages cost what they cost
    in the step. Best seconds per op index over rounds (at least 3, FLOOR_SECONDS in all)."""
    if not chain:
        return {}
    src = torch.zeros(max(c[1] for c in chain), dtype=torch.uint8)
    best, spent, rounds = {}, 0.0, 0
    while rounds < 3 or spent < FLOOR_SECONDS[config.run_size().name]:
        live, last, start_round = {}, src, time.perf_counter()
        for i, w, copy, fresh, kernel in chain:
            if not fresh:
                continue  # in place: the loop's reference copy (reference) stands; its data are hot in the step
            for j in [j for j in live if died.get(j, i + 1) <= i]:
                del live[j]  # the step had freed it by now
            start = time.perf_counter()  # read the latest output, hot in the cache as the op's input in the step
            out = (last if last.numel() >= w else src)[:w].clone() if copy else torch.empty(w, dtype=torch.uint8)
            if not copy:
                out.fill_(1)
            took = time.perf_counter() - start
            live[i] = last = out
            if not kernel:
                best[i] = min(best.get(i, float("inf")), took)
        del live
        spent, rounds = spent + time.perf_counter() - start_round, rounds + 1
    return best


def _tensors(items: list) -> list[torch.Tensor]:
    """The tensors among `items`, looking inside lists and tuples (an op's arguments and results)."""
    found = []
    for item in items:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            found += _tensors(list(item))
    return found


def count(fn: Callable, *args, floors: bool = False, **kwargs) -> Counts:
    """Run fn(*args, **kwargs) once (any device, meta too) and count its ops, FLOPs and bytes; with `floors`, each
    product's, convolution's and pooling op's floor at its shapes (floor) and every other op's reference copy of its
    bytes (reference), timed after the call, outside the counters. An elementwise op's floor is the faster of its
    reference copy alone and in the step's order: the slower of the two held lesson 05's eager GELU ops above their
    roof (the allocator's state after the replay is not the step's), so only the faster is a lower bound. With
    `floors`, the step's own page faults are counted per op over FAULT_CALLS calls of it first (their mean)."""
    size = config.run_size().name
    tally, calls = Counter(), FAULT_CALLS[size] if floors else 0
    for i in range(FAULT_WARMUP[size] + calls if floors else 0):  # before the recorder, which keeps tensors alive
        with _FaultCounter(tally if i >= FAULT_WARMUP[size] else Counter()):
            fn(*args, **kwargs)
    with FlopCounterMode(display=False) as flop_counter, _OpRecorder(floors) as recorder:
        fn(*args, **kwargs)
    ops = recorder.ops
    for i, faults in tally.items():
        if i < len(ops) and faults:
            ops[i] = dataclasses.replace(ops[i], faults=faults / calls)
    with torch.no_grad():
        for again in range(_passes()):  # passes apart in time: a burst from another process spoils only one
            for i, timer in recorder.calls.items():
                ops[i] = dataclasses.replace(ops[i], floor=timer(bool(again)))
            for i, seconds in replay(recorder.chain, recorder.died).items():  # the same copies in the step's order:
                ops[i] = dataclasses.replace(ops[i], floor=min(ops[i].floor, seconds))  # the faster is the floor
    return Counts(ops, flop_counter.get_total_flops())


def fused(counts: Counts, inputs: list[torch.Tensor], outputs: list[torch.Tensor], floors: bool = False) -> Counts:
    """The same FLOPs as one fused kernel: it reads `inputs` and writes `outputs` once, intermediates stay on chip;
    with `floors`, no faster than its costliest part compiled alone on the first output's shape into new outputs
    (compiled_reference: its transcendental function where it has one, else a scaled copy), timed in _passes()."""
    read, written = (sum(t.numel() * t.element_size() for t in ts) for ts in (inputs, outputs))
    part = next((o.name for o in counts.ops if o.name in TRANSCENDENTAL_OPS), "mul")
    least = min(compiled_reference(part, outputs[0], again=bool(again))
                for again in range(_passes())) if floors and outputs else 0.0
    return Counts([Op("fused", counts.flops, read + written, fresh=written, floor=least)], counts.matmul_flops)


def compiled_reference(name: str, like: torch.Tensor, again: bool = False) -> float:
    """Best sustained seconds of torch.<name> (tanh, exp, ...; "mul": x * 2) compiled alone on a tensor shaped like
    `like`, each call a new output: what a fused kernel that runs it on those elements and writes them costs at least
    (Inductor's own vectorised function, the same bytes, the same allocation pattern)."""
    key = ("compiled", name, tuple(like.shape), str(like.dtype), like.device.type)
    if key not in _floors or again:
        x = torch.randn(like.shape, dtype=like.dtype, device=like.device)
        fn = torch.compile(getattr(torch, name) if name != "mul" else lambda t: t * 2.0)
        fn(x)  # compiled here, before the timer picks its block size
        _floors[key] = min(_floors.get(key, float("inf")), _best(lambda: fn(x)))
    return _floors[key]
