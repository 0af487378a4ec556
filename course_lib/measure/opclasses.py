"""The op classes a training step runs, each as one timed call that measure.ceilings turns into a ceiling: memory
copies with a working set past the last-level cache (DRAM) and inside it (the cache's own bandwidth), elementwise ops
with 2 and 3 streams into a reused output and into a freshly allocated one (the first touch of new pages is a cost of
its own), a transcendental function (tanh), the fixed cost of one eager op and of one call of a compiled graph, and on
a GPU host-to-device copies. Each probe names the work one call does, so a ceiling is work over seconds."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..base import internals

try:
    import resource  # Unix: the process's page-fault counters
except ImportError:  # Windows: no counter, so no page faults are charged
    resource = None

LLC_MULTIPLE = 4  # the DRAM copy moves this many times the last-level cache, so the cache cannot hold it
COPY_BYTES = (64 * 2**20, 1024 * 2**20)  # floor and cap of the DRAM copy's buffer, whatever the cache reports
CACHE_SHARE = 2  # the cache copy's working set (source + destination) is the last-level cache over this
CACHE_PROBE_MAX = 16 * 2**20  # ... and at most this: a VM may report its host's whole cache (480 MiB seen), which
#   the guest cannot hold; a smaller working set moves at least as fast, so the figure still bounds every working set
#   up to the reported cache
ELEMENTWISE = 2**24  # floats per operand of the elementwise probes (64 MiB each): DRAM-sized, as lesson 00's add
TRANSCENDENTAL = 2**18  # floats tanh reads (1 MiB): cache-resident, so the function's arithmetic, not DRAM, binds
TINY_ELEMENTS = 16  # the per-op loop's tensor: its data costs nothing next to the op's fixed cost
LOOP_OPS = 100  # tiny ops per timed call, so one call is long enough to time
H2D_BYTES = 64 * 2**20  # one host-to-device transfer: past the fixed cost of a copy, short enough for smoke size


@dataclass(frozen=True)
class Probe:
    """One op class's timed call: `work` FLOPs, bytes, elements or ops per call of `fn`, the ceiling's kind and
    `capacity`, the largest working set (bytes) the figure applies to (0: any size)."""

    name: str
    kind: str  # "memory" and "transfer" (bytes/s), "pointwise" (elements/s), "overhead" (seconds per op)
    work: float
    fn: Callable[[], object]
    note: str
    capacity: int = 0
    warm: bool = False  # call fn once before timing it (a compiled graph compiles on its first call)


def llc_bytes(device: str) -> int:
    """The last-level cache in bytes: a GPU's L2, or the CPU's highest cache level from Linux sysfs (0 if unknown)."""
    if device != "cpu":
        return torch.cuda.get_device_properties(0).L2_cache_size
    caches = Path("/sys/devices/system/cpu/cpu0/cache")
    found = [(int((d / "level").read_text()), (d / "size").read_text().strip())
             for d in caches.glob("index*") if (d / "level").exists()] if caches.is_dir() else []
    if not found:
        return 0  # macOS, Windows: no cache probe; the DRAM copy's floor, COPY_BYTES[0], passes most laptops' caches
    size = max(found)[1]
    return int(size[:-1]) * {"K": 2**10, "M": 2**20}[size[-1]] if size[-1] in "KM" else int(size)


def _copy(name: str, floats: int, device: str, note: str, capacity: int = 0) -> Probe:
    """A copy of `floats` floats into a reused buffer: 2 streams (read + write), no allocation."""
    src = torch.ones(floats, device=device)
    dst = torch.empty_like(src)
    return Probe(name, "memory", 2 * src.nbytes, lambda: dst.copy_(src),
                 f"copy of {src.nbytes / 2**20:,.4g} MiB, read + write{note}", capacity)


def memory(device: str) -> list[Probe]:
    """The bandwidth a working set gets: past the last-level cache (DRAM, the row named "memory") and, where the
    cache size is known, one that fits in it (half the cache, at most CACHE_PROBE_MAX: the row "memory cache", for
    working sets up to the cache)."""
    llc = llc_bytes(device)
    probes = [_copy("memory", max(COPY_BYTES[0], min(COPY_BYTES[1], LLC_MULTIPLE * llc)) // 4, device, "")]
    if llc:
        held = min(llc // CACHE_SHARE, CACHE_PROBE_MAX)  # bytes: source + destination
        probes.append(_copy("memory cache", held // 8, device,
                            f"; working set {held / 2**20:,.4g} MiB, inside the reported cache", llc))
    return probes


def elementwise(device: str) -> list[Probe]:
    """Elementwise ops on DRAM-sized operands: an add into a reused output (3 streams), an add into a fresh one and a
    clone (3 and 2 streams, each call allocating its output: a CPU maps and first touches new pages each time)."""
    x, y = torch.ones(ELEMENTWISE, device=device), torch.ones(ELEMENTWISE, device=device)
    out = torch.empty_like(x)
    mib = f"{x.nbytes / 2**20:,.0f} MiB"
    return [Probe("add reused", "memory", 3 * x.nbytes, lambda: torch.add(x, y, out=out),
                  f"add of two {mib} operands into a reused output, 3 streams"),
            Probe("add fresh", "memory", 3 * x.nbytes, lambda: x + y,
                  f"add of two {mib} operands into a new output, 3 streams"),
            Probe("copy fresh", "memory", 2 * x.nbytes, lambda: x.clone(),
                  f"clone of {mib} into a new output, 2 streams")]


def transcendental(device: str) -> Probe:
    """tanh of a cache-resident buffer into a reused one: elements per second of the function's own arithmetic."""
    x = torch.randn(TRANSCENDENTAL, device=device)
    out = torch.empty_like(x)
    return Probe("tanh", "pointwise", x.numel(), lambda: torch.tanh(x, out=out),
                 f"tanh of {x.numel():,} floats ({x.nbytes / 2**20:,.4g} MiB), reused output")


def per_op(device: str) -> list[Probe]:
    """The fixed cost of one op: a loop of tiny eager adds, and a loop of calls of a compiled one-add graph (compiled
    by a first call before timing, so the figure is a cached graph's guards and launch, not the compilation)."""
    tiny = torch.zeros(TINY_ELEMENTS, device=device)

    def eager() -> None:
        y = tiny
        for _ in range(LOOP_OPS):
            y = y + 1.0  # one kernel and one allocation each: the cost every op pays, whatever its size
    graph = torch.compile(lambda t: t + 1.0)

    def compiled() -> None:
        for _ in range(LOOP_OPS):
            graph(tiny)
    return [Probe("per op", "overhead", LOOP_OPS, eager, f"{LOOP_OPS} adds of {TINY_ELEMENTS} floats"),
            Probe("per call compiled", "overhead", LOOP_OPS, compiled,
                  f"{LOOP_OPS} calls of a compiled add of {TINY_ELEMENTS} floats", warm=True)]


def minor_faults() -> int:
    """Minor page faults this process has taken so far (each the first touch of a newly mapped page); 0 unknown."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource else 0


def host_to_device(device: str) -> list[Probe]:
    """Host-to-device copies from pinned and pageable host memory (a GPU only)."""
    on_device = torch.empty(H2D_BYTES // 4, device=device)
    hosts = {kind: torch.ones(H2D_BYTES // 4, pin_memory=kind == "pinned") for kind in ("pinned", "pageable")}
    return [Probe(f"h2d {kind}", "transfer", H2D_BYTES, lambda h=host: on_device.copy_(h, non_blocking=True),
                  f"{H2D_BYTES // 2**20} MiB host to device") for kind, host in hosts.items()]


def probes(device: str) -> list[Probe]:
    """Every op class's probe on `device`, in the order lesson 00 prints them (matmuls are ceilings' own)."""
    return [*memory(device), *elementwise(device), transcendental(device), *per_op(device),
            *(host_to_device(device) if device != "cpu" else [])]


def matmul(fmt: str, n: int, device: str) -> Callable[[], object]:
    """A call doing one n x n product in `fmt` (2n^3 FLOPs), through the kernel the lessons run: int8 on a CPU through
    oneDNN's int8 linear kernel, which lesson 07's compiled int8 model runs (torchao's safe_int_mm falls back to an
    int32 torch.matmul there: no VNNI instruction would run); int8 on a GPU through torchao's int matmul (cuBLAS)."""
    if fmt == "int8" and device == "cpu":
        x = torch.randint(0, 256, (n, n), dtype=torch.uint8)
        return internals.onednn_int8_matmul(x, torch.randint(-128, 128, (n, n), dtype=torch.int8))
    if fmt == "int8":
        from torchao.kernel.intmm import safe_int_mm

        a, b = (torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device) for _ in range(2))
        return lambda: safe_int_mm(a, b)
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return lambda: a @ b
