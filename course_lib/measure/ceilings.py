"""This machine's measured ceilings, each with its spread: the matmul rate in every number format the hardware runs
natively (through the kernel the lessons run: on a CPU, int8 through oneDNN's int8 linear kernel), and the op classes
a step runs (measure.opclasses): memory bandwidth past the last-level cache (DRAM) and inside it, elementwise ops
into a reused and into a fresh output (the first touch of new pages), tanh's rate, the fixed cost of one eager op and
of one compiled call and, on a GPU, host-to-device bandwidth. Each ceiling is an upper bound: the best sustained
figure, its fastest timed block (a block lasts tens of milliseconds or more, so it is a rate held, not a spike), not
the median, which a competing process drags down. At full size a noisy ceiling is re-measured; one that stays
noisy is not saved.
Saved once per machine under build/ceilings/ and re-measured when missing; measure.roofline places ops and steps
against them (bandwidth_for picks the cache's or DRAM's bandwidth by working set)."""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from ..base import config, hardware
from . import opclasses, timing, verdict
from .opclasses import LOOP_OPS, TINY_ELEMENTS, llc_bytes  # noqa: F401  (re-exported: roofline and tests)

MATMUL_N = {"cpu": 2048, "cuda": 8192}  # square side: enough multiply-adds to keep the matrix units busy
SMOKE_MATMUL_N = 512  # smoke size: checks the code in a fraction of a second, not a ceiling to quote
CONV = (64, 128, 16)  # batch, channels, side: a 3x3 convolution of ResNet-9 at the lessons' batch, channels_last
SECONDS = {"smoke": 0.1, "full": 1.0}  # timed seconds per ceiling (timing.time_calls' min_run_time)
NOISY = 1.5  # slowest / fastest block above this: the ceiling is flagged as noisy (a busy machine)
RETRIES = 2  # a noisy ceiling is measured again up to this many times; the steadiest measurement is kept
# smoke size checks the code, not a figure to quote: one measurement each, kept and saved even when noisy (a smoke
# file serves smoke runs only: SIZE_RANK), so make test's side-by-side notebooks measure once, not once per lesson
SIZE_RETRIES = {"smoke": 0, "full": RETRIES}
SCHEMA = 3  # the rows measured: a file saved before the op classes and the convolution (schemas 1-2) is measured again
SIZE_RANK = {"smoke": 0, "full": 1}  # a saved full-size measurement serves a smoke run, not the other way round
UNITS = {"compute": (1e9, "GFLOP/s"), "memory": (1e9, "GB/s"), "pointwise": (1e9, "G elements/s"),
         "overhead": (1e-6, "µs per op")}  # printed units


def unit_of(c: "Ceiling") -> tuple[float, str]:
    """(scale, printed unit) of a ceiling: a compiled call's fixed cost is per call, an eager op's per op."""
    scale, unit = UNITS.get(c.kind, UNITS["memory"])
    return scale, unit.replace("per op", "per call") if "call" in c.name else unit


@dataclass(frozen=True)
class Ceiling:
    """One measured ceiling: a rate per timed block (FLOP/s or bytes/s), or seconds per op for the fixed cost."""

    name: str  # "matmul fp32", "memory", "per op", "h2d pinned", ...
    kind: str  # "compute" (FLOP/s), "memory" and "transfer" (bytes/s), "overhead" (seconds per op)
    values: tuple[float, ...]  # one figure per timed block
    note: str = ""  # what was timed
    capacity: int = 0  # bytes: the largest working set the figure applies to (the cache's), 0 for any

    @property
    def median(self) -> float:
        """The median block's figure: shown beside the ceiling, as a measure of how steady the blocks were."""
        return statistics.median(self.values)

    @property
    def best(self) -> float:
        """The best sustained figure, the ceiling the model uses: the fastest block's rate, or for the fixed cost of
        an op its cheapest block's seconds per op. An upper bound on speed: where a later timing of the same op beats
        it, Ceilings.observe raises it to that block."""
        return min(self.values) if self.kind == "overhead" else max(self.values)

    def shown(self) -> tuple[float, str]:
        """(the best sustained figure in printed units, the unit): GFLOP/s, GB/s or µs per op."""
        scale, unit = unit_of(self)
        return self.best / scale, unit

    def text(self) -> str:
        """'matmul fp32: 97.3 GFLOP/s (best sustained: fastest of 6 blocks; median 95.2, blocks 90.1-97.3;
        2048x2048)', with a noisy flag."""
        scale, unit = unit_of(self)
        lo, hi = min(self.values) / scale, max(self.values) / scale
        flag = f"; NOISY, slowest/fastest block {spread_ratio(self):.1f}x > {NOISY:g}x" if noisy(self) else ""
        which = "cheapest" if self.kind == "overhead" else "fastest"
        return (f"{self.name}: {verdict.number(self.best / scale)} {unit} (best sustained: {which} of "
                f"{len(self.values)} blocks; median {verdict.number(self.median / scale)}, blocks "
                f"{verdict.number(lo)}-{verdict.number(hi)}; {self.note}{flag})")


def summarise(name: str, kind: str, work: float, seconds: list[float], note: str = "", capacity: int = 0) -> Ceiling:
    """A Ceiling from seconds per call (one per timed block) of a call doing `work` FLOPs, bytes or ops: rates for
    compute, memory and transfer, seconds per op for overhead. No clock here: tests inject the seconds."""
    if not seconds or min(seconds) <= 0 or work <= 0:
        raise ValueError(f"{name}: need positive work and seconds per block, got work {work}, seconds {seconds}.")
    values = [s / work for s in seconds] if kind == "overhead" else [work / s for s in seconds]
    return Ceiling(name, kind, tuple(values), note, capacity)


def spread_ratio(c: Ceiling) -> float:
    """Slowest block over fastest: 1.0 for a perfectly steady ceiling."""
    return max(c.values) / min(c.values)


def noisy(c: Ceiling) -> bool:
    """Whether the blocks differ by more than NOISY (one slow block from another process is enough)."""
    return len(c.values) > 1 and spread_ratio(c) > NOISY


@dataclass
class Ceilings:
    """All of one machine's ceilings on one device, with the hardware, size and settings they came from."""

    hardware: str
    device: str
    size: str
    threads: int
    torch: str
    rows: dict[str, Ceiling] = field(default_factory=dict)

    def rate(self, fmt: str = "fp32") -> float:
        """Measured FLOP/s of products in `fmt` (fp32, tf32, bf16, fp16, int8): the faster of the square matmul and,
        where measured, ResNet-9's convolution (oneDNN's can beat the BLAS); a clear error for a format not measured."""
        if f"matmul {fmt}" not in self.rows:
            have = [k.split()[1] for k in self.rows if k.startswith("matmul ")]
            raise KeyError(f"No {fmt} matmul ceiling on {self.hardware} ({self.device}): it is not native here. "
                           f"Measured formats: {have}. Use one of them.")
        return self.rows[self.rate_row(fmt)].best

    def rate_row(self, fmt: str = "fp32") -> str:
        """The ceiling rate(fmt) takes: "matmul <fmt>" or, where it measured faster, "conv <fmt>"."""
        return max((n for n in (f"matmul {fmt}", f"conv {fmt}") if n in self.rows), key=lambda n: self.rows[n].best)

    bandwidth = property(lambda self: self.rows["memory"].best, doc="Best sustained DRAM bandwidth, bytes/s.")
    per_op = property(lambda self: self.rows["per op"].best, doc="Lowest measured fixed cost of one op, seconds.")
    per_call_compiled = property(lambda self: self.rows["per call compiled"].best,
                                 doc="Lowest measured fixed cost of one call of a compiled graph, seconds.")
    tanh_rate = property(lambda self: self.rows["tanh"].best, doc="Best sustained tanh rate, elements/s.")

    def bandwidth_for(self, working_set: float) -> float:
        """Bytes/s for an op or step whose working set (bytes read and written) is `working_set`: the cache's
        bandwidth where it fits in the last-level cache ("memory cache", capacity = that cache), DRAM's past it."""
        fits = [c for c in self.rows.values() if c.kind == "memory" and 0 < working_set <= c.capacity]
        return min(fits, key=lambda c: c.capacity).best if fits else self.bandwidth

    def elementwise(self, streams: int = 3, fresh: bool = False) -> float:
        """Bytes/s of a DRAM-sized elementwise op with 2 (copy) or 3 (add) streams, into a reused output or a
        freshly allocated one (whose new pages are touched first)."""
        return self.rows[{(2, False): "memory", (3, False): "add reused", (2, True): "copy fresh",
                          (3, True): "add fresh"}[streams, fresh]].best

    @property
    def first_touch(self) -> float:
        """Seconds per byte a fresh output costs beyond a reused one: the add's two best sustained rates apart."""
        return max(0.0, 3 * (1 / self.elementwise(3, True) - 1 / self.elementwise(3, False)))

    def observe(self, name: str, values: list[float]) -> bool:
        """Another timing's blocks (same units) of the op that ceiling `name` measures: where its best beats the
        ceiling's, that block joins the ceiling's (a ceiling is the best rate seen of its op) and True is returned;
        ceilings.save again to keep it."""
        c = self.rows[name]
        grown = replace(c, values=(*c.values, replace(c, values=tuple(values)).best))  # best: Ceiling.best's rule
        if grown.best != c.best:
            self.rows[name] = grown
        return self.rows[name] is not c

    def noisy(self) -> list[str]:
        """The names of the ceilings still flagged noisy."""
        return [name for name, c in self.rows.items() if noisy(c)]

    def formats(self) -> list[str]:
        """The matmul formats measured here, in the order measured."""
        return [k.split()[1] for k in self.rows if k.startswith("matmul ")]

    def table(self) -> list[dict]:
        """One row per ceiling for bench.show_rows: its best sustained figure, the median and range of its blocks
        (3 significant figures) and what was timed, a noisy one flagged."""
        def row(c: Ceiling) -> dict:
            scale, unit = unit_of(c)
            lo, hi = (verdict.number(v / scale) for v in (min(c.values), max(c.values)))
            return {"ceiling": c.name, "best sustained": f"{verdict.number(c.best / scale)} {unit}",
                    "median (blocks: range)": f"{verdict.number(c.median / scale)} ({len(c.values)}: {lo}-{hi})"
                    + (" NOISY" if noisy(c) else ""), "what was timed": c.note.removeprefix("; ")}
        return [row(c) for c in self.rows.values()]

    def lines(self) -> list[str]:
        """One line per ceiling, with its spread, under a line naming hardware, device and size."""
        head = f"ceilings of {self.hardware} on {self.device} ({self.size} size, {self.threads} threads):"
        return [head, *(f"  {c.text()}" for c in self.rows.values())]


def formats(device: str, info: dict | None = None) -> list[str]:
    """The matmul formats this device runs natively: fp32 always; on a CPU bf16 with AVX512_BF16/AMX and int8 with
    VNNI/AMX; on a GPU TF32 and bf16 from compute capability 8.0, fp16 from 7.0, int8 (tensor cores) from 8.0."""
    if device == "cpu":
        return ["fp32", *(["bf16"] if hardware.cpu_bf16_native() else []),
                *(["int8"] if hardware.cpu_int8_native() else [])]
    cc = hardware.compute_capability(info)
    return ["fp32", *(["tf32", "bf16"] if cc >= (8, 0) else []), *(["fp16"] if cc >= (7, 0) else []),
            *(["int8"] if cc >= (8, 0) else [])]


def matmul_side(device: str, size: str) -> int:
    """The square side the matmul ceiling is timed at on `device` ("cpu" or "cuda") at run size `size`."""
    return SMOKE_MATMUL_N if size == "smoke" else MATMUL_N["cpu" if device == "cpu" else "cuda"]


def measure(device: str = "cpu", *, size: str | None = None,
            time_fn: Callable[..., list[float]] = timing.time_calls) -> Ceilings:
    """Measure every ceiling of `device` at run size `size` (the switch's by default), each measured again (up to
    RETRIES times, at full size only: SIZE_RETRIES) while its blocks spread wider than NOISY, keeping the steadiest
    measurement; one still noisy stays flagged. time_fn(fn, min_run_time=s) returns seconds per call per block:
    timing.time_calls (CUDA-synchronized on a GPU), or injected in tests."""
    size = size or config.run_size().name
    seconds = SECONDS[size]
    n = matmul_side(device, size)
    found = Ceilings(hardware.label(), device, size, torch.get_num_threads(), torch.__version__)

    def add(name: str, kind: str, work: float, fn: Callable[[], object], note: str, capacity: int = 0) -> None:
        tries = [summarise(name, kind, work, time_fn(fn, min_run_time=seconds), note, capacity)]
        while noisy(tries[-1]) and len(tries) <= SIZE_RETRIES[size]:
            tries.append(summarise(name, kind, work, time_fn(fn, min_run_time=seconds), note, capacity))
        found.rows[name] = min(tries, key=spread_ratio)

    for fmt in formats(device):
        if device != "cpu":
            hardware.set_tf32(fmt == "tf32")  # fp32 is full fp32 unless the row is TF32's
        add(f"matmul {fmt}", "compute", 2 * n**3, opclasses.matmul(fmt, n, device), f"{n}x{n}")
    if device != "cpu":
        hardware.set_tf32(None)  # back to PyTorch's defaults
    b, c, side = CONV if size == "full" else (8, *CONV[1:])
    x = torch.randn(b, c, side, side, device=device).to(memory_format=torch.channels_last)
    w = torch.randn(c, c, 3, 3, device=device).to(memory_format=torch.channels_last)
    for fmt in ("fp32", *(["bf16"] if "bf16" in formats(device) else [])):  # bf16's convolutions beat its matmul
        xf, wf = (t.to(torch.bfloat16) if fmt == "bf16" else t for t in (x, w))
        add(f"conv {fmt}", "compute", 2 * b * side * side * c * c * 9,
            lambda xf=xf, wf=wf: torch.nn.functional.conv2d(xf, wf, padding=1),
            f"3x3 conv, {c} channels, {side}x{side}, batch {b}, channels_last")
    for p in opclasses.probes(device):
        if p.warm:
            p.fn()  # a compiled graph compiles now, not inside the timer's choice of block size
        add(p.name, p.kind, p.work, p.fn, p.note, p.capacity)
    return found


def path(device: str) -> Path:
    """Where this machine's ceilings on `device` are saved: build/ceilings/<hardware>-<device>.json."""
    return config.ceilings_file(device)


class NoisyCeilings(RuntimeError):
    """Ceilings that stayed noisy after RETRIES re-measurements: save refuses them."""


def save(found: Ceilings) -> Path:
    """Write the ceilings to path(device), with the time they were measured; NoisyCeilings, saying why, when one is
    still noisy at full size (every later lesson would read a figure from a busy machine; a smoke file serves only
    smoke runs, whose figures are not for reading)."""
    if found.noisy() and found.size != "smoke":
        raise NoisyCeilings(
            f"Not saving the ceilings of {found.hardware} ({found.device}): {', '.join(found.noisy())} stayed NOISY\n"
            f"(slowest/fastest block above {NOISY:g}x) over {RETRIES + 1} measurements, so another process was "
            "probably\ncompeting for the cores. Stop it (or wait for it to finish) and measure again.")
    target = path(found.device)
    target.parent.mkdir(parents=True, exist_ok=True)
    # atomic: a lesson loading the ceilings in another process (make test runs notebooks side by side) never reads
    # half a file
    config.write_atomically(target, json.dumps({**asdict(found), "schema": SCHEMA,
                                                "time": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
    return target


def load(device: str = "cpu", *, remeasure: bool = False, verbose: bool = True) -> Ceilings:
    """This machine's saved ceilings on `device`; measured now (and saved) when missing, measured at a smaller
    size or with other threads or another torch than now, or when `remeasure`. Says which, in one line."""
    size, target = config.run_size().name, path(device)
    saved = json.loads(target.read_text()) if target.exists() and not remeasure else None
    why = ("asked to re-measure" if remeasure else "none saved yet" if saved is None else
           "saved at smoke size" if SIZE_RANK[saved["size"]] < SIZE_RANK[size] else
           "saved with another thread count" if saved["threads"] != torch.get_num_threads() else
           "saved under another torch" if saved["torch"] != torch.__version__ else
           "saved before the op classes were measured" if saved.get("schema") != SCHEMA else None)
    if why is None:
        rows = {k: Ceiling(**{**v, "values": tuple(v["values"])}) for k, v in saved["rows"].items()}
        if verbose:
            print(f"ceilings ({device}): lesson 00's run of {saved['time'][:16]} on {saved['hardware']}")
        return Ceilings(saved["hardware"], saved["device"], saved["size"], saved["threads"], saved["torch"], rows)
    if verbose:
        print(f"measuring this machine's ceilings on {device} ({why}; a few seconds)...")
    found = measure(device)
    try:
        save(found)
    except NoisyCeilings as refused:  # this run still gets the figures, flagged NOISY in found.lines()
        if verbose:
            print(f"{refused} Using this run's figures, unsaved.")
    return found
