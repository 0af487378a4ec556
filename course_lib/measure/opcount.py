"""Counting the ops a call runs (roofline.count): each aten op's FLOPs (torch's FlopCounterMode and its formulas) and
the bytes of its tensor inputs and outputs (a gather: the rows it reads), seen by a dispatch mode; and, where asked,
each op's floor at its own sizes. Products, convolutions and pooling are replayed alone with the step's own arguments
(their speed depends on their shapes: LeNet's 6-channel convolutions run far below a 2048x2048 matmul's rate); every
other op gets its reference, a copy of the bytes it writes, into new pages for the share of its output that the op
itself first touched in the counted call (page faults, counted per op), into a reused buffer for the rest: the first
touch is measured where the step paid it, not guessed from a size. A floor is the best sustained seconds of one call."""
from __future__ import annotations

import dataclasses
import mmap
import resource
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from ..base import config
from ..base.internals import TorchDispatchMode  # the hook that sees every aten op; torch names it only privately
from . import timing
from .ceilings import NOISY, RETRIES

NO_TRAFFIC = ("empty", "detach", "lift_fresh", "alias", "_record_function")  # allocate, relabel or mark: no data
TRANSCENDENTAL_OPS = ("tanh", "exp", "log", "sigmoid", "erf")  # a fused kernel's costliest part where it has one
GATHERS = ("index", "index_select", "gather", "take", "embedding")  # read only the rows they gather from arg 0
POOLING = ("max_pool", "avg_pool", "adaptive_max_pool", "adaptive_avg_pool")  # kernel-bound, not bytes-bound
#: data-movement kernels that compute an address per element (gathers, pads, mirrors): far below a copy's bandwidth
#: at small images (a uint8 (256, 3, 36, 40) row gather: element by element), so timed alone at their shapes too
DATA_MOVEMENT = (*GATHERS, "constant_pad_nd", "reflection_pad", "replication_pad", "flip")
FLOOR_SECONDS = {"smoke": 0.02, "full": 0.1}  # timed seconds per distinct op and shape (a few blocks)
REFERENCE_BYTES = 2**16  # smaller outputs' copies take about one op's fixed cost, which the model charges already
# passes over a step's ops (each keeps its fastest block of all of them) and a noisy timing's retries, by run size: a
# smoke run only checks the code, so one pass and no retries (make test's time, issue 45); full keeps both
FLOOR_PASSES = {"smoke": 1, "full": 2}
FLOOR_RETRIES = {"smoke": 0, "full": RETRIES}
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
    touched: int = 0  # bytes of new pages the op first touched in the counted call (its page faults x page size)


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


def reference(written: int, read: int, touched: int = 0, device: str = "cpu", again: bool = False) -> float:
    """Best sustained seconds of the least work that writes `written` bytes as the op did: a copy of them where the
    op reads at least as many (else a fill), `touched` of them into newly mapped pages (the op's own page faults in
    the step: a fresh output that the allocator handed new pages) and the rest into a reused buffer. Both parts are
    timed at the op's size (copy_rates), so the first touch costs what it cost here, not a threshold's guess. An
    elementwise op does at least this work, so it is that op's floor (`again`: time it once more, keep the faster)."""
    reused, new = copy_rates(written, read >= written, device, again)
    share = min(1.0, touched / written) if new is not None else 0.0
    return reused + share * max(0.0, new - reused)


def copy_rates(written: int, copy: bool, device: str = "cpu", again: bool = False) -> tuple[float, float | None]:
    """Best seconds per call of a copy (or fill) of `written` bytes into a reused buffer and, on a CPU, into pages
    mapped anew each call (an anonymous mmap: every page a first touch, as a fresh output the allocator maps)."""
    key = ("reference", written, copy, device)
    if key not in _floors or again:
        src = torch.zeros(written, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        reused = _best((lambda: dst.copy_(src)) if copy else lambda: dst.fill_(1))
        new = _best(lambda: _into_new_pages(src, copy)) if device == "cpu" else None
        old = _floors.get(key, (float("inf"), None))
        _floors[key] = (min(old[0], reused), new if old[1] is None or new is None else min(old[1], new))
    return _floors[key]


def _into_new_pages(src: torch.Tensor, copy: bool) -> None:
    """Copy (or fill) src's bytes into pages mapped for this call only: each page's first touch is paid here."""
    pages = mmap.mmap(-1, src.numel(), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as malloc maps (not shared)
    dst = torch.frombuffer(pages, dtype=torch.uint8)
    dst.copy_(src) if copy else dst.fill_(1)
    del dst  # the mapping closes only once no tensor views it
    pages.close()


def _faults() -> int:
    """Page faults this process has taken so far (minor: pages first touched), all threads."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _passes() -> int:
    """Passes over a step's floors at this run size (FLOOR_PASSES)."""
    return FLOOR_PASSES[config.run_size().name]


def _best(fn: Callable[[], object]) -> float:
    """The fastest block's seconds per call of fn (timing.time_calls), re-timed while its blocks spread past NOISY."""
    size, tries = config.run_size().name, []
    seconds, retries = FLOOR_SECONDS[size], FLOOR_RETRIES[size]
    while len(tries) <= retries and (not tries or max(tries[-1]) > NOISY * min(tries[-1])):  # a busy machine's
        tries.append(timing.time_calls(fn, min_run_time=seconds))  # blocks: again
    return min(min(t) for t in tries)


class _OpRecorder(TorchDispatchMode):
    """Records every aten op: FLOPs from FlopCounterMode's formulas (pointwise ops one per output element) and bytes
    of its tensor inputs and outputs (an `out=` tensor counted once, as written); keeps kernel-bound ops' calls for
    their floors when `floors`."""

    def __init__(self, floors: bool = False):
        super().__init__()
        self.ops: list[Op] = []
        self.calls: dict[int, Callable] = {}  # index in ops -> its floor's timer (again: time it once more; the Op)
        self.floors = floors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        faults = _faults() if self.floors else 0
        out = func(*args, **kwargs)
        faults = _faults() - faults if self.floors else 0  # pages this op touched first (its new output's)
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
        touched = min(fresh, faults * mmap.PAGESIZE) if outs and outs[0].device.type == "cpu" else 0
        if self.floors and real and kernel_bound(name, matmul) and fresh:  # the op itself, alone at its shapes
            self.calls[len(self.ops)] = lambda again, op, c=(func, args, kwargs): floor(*c, again=again)
        elif self.floors and real and written >= REFERENCE_BYTES and not kernel_bound(name, matmul):  # its copy
            self.calls[len(self.ops)] = lambda again, op, w=(written, read, outs[0].device.type): \
                reference(w[0], w[1], op.touched, w[2], again=again)
        self.ops.append(Op(name, int(flops), read + written, matmul, fresh, touched=touched))
        return out


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
    bytes (reference: new pages for what the op first touched in this call), timed after the call, outside the
    counters. A copy in a loop alone reuses its freed buffer, while the step's fresh outputs may get new pages (lesson
    05's eager GELU: several of its 8 MiB outputs, each call), which cost more than their bytes."""
    with FlopCounterMode(display=False) as flop_counter, _OpRecorder(floors) as recorder:
        fn(*args, **kwargs)
    ops = recorder.ops
    if recorder.calls:  # new pages move with the heap's state: the fewest an op took in this and two more calls
        ops = _fewest_touched(ops, fn, args, kwargs)
    with torch.no_grad():
        for again in range(_passes()):  # passes apart in time: a burst from another process spoils only one
            for i, timer in recorder.calls.items():
                ops[i] = dataclasses.replace(ops[i], floor=timer(bool(again), ops[i]))
    return Counts(ops, flop_counter.get_total_flops())


class _Touches(TorchDispatchMode):
    """Each counted op's page faults in one more call (the ops _OpRecorder keeps, in the same order)."""

    def __init__(self):
        super().__init__()
        self.faults: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = _faults()
        out = func(*args, **(kwargs or {}))
        if not (func.is_view or func.__name__.split(".")[0].startswith(NO_TRAFFIC)):
            self.faults.append(_faults() - before)
        return out


def _fewest_touched(ops: list[Op], fn: Callable, args: tuple, kwargs: dict, calls: int = 2) -> list[Op]:
    """ops with each op's touched bytes the fewest over its counted call and `calls` more (whether a fresh output
    gets new pages depends on the heap's state, which the counters' own allocations shift): a lower bound."""
    for _ in range(calls):
        with _Touches() as seen:
            fn(*args, **kwargs)
        if len(seen.faults) == len(ops):  # the same ops in the same order
            ops = [dataclasses.replace(o, touched=min(o.touched, f * mmap.PAGESIZE)) for o, f in zip(ops, seen.faults)]
    return ops


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
