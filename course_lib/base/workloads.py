"""What a lesson's sections run, as typed frozen records: each lesson spec (base.lessons) lists its notebook's sections
with the work each does at a run size (which model, batch, steps, passes, products, copies, compiles), and the GPU
estimator (scripts/estimate_gpu_times.py) prices those records, with no lesson of its own. Imports nothing of the
course."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Union

from . import hardware

SPLIT_IMAGES = 50_000  # CIFAR-10's training JPEGs; lessons 01-07 carve 10 % validation and 10 % test from them
IMAGE_FLOATS = 3 * 32 * 32  # one CIFAR-10 image, (3, 32, 32)


@dataclass(frozen=True)
class Run:
    """A lesson's run as its sections see it: its size (config.RunSize's fields) on a machine with one GPU, what of
    that machine the notebook's choices depend on, and the lesson's committed CPU run (figures, wall times)."""
    size: str  # smoke | full
    repeats: int
    bench_steps: int
    epochs: int
    batch_size: int
    width: float
    train_subset: int | None
    eval_subset: int | None
    host_cores: int  # the GPU machine's CPU cores (lesson 03's worker rows)
    mixed: str  # the precision policy's 16-bit format on that GPU: "bf16" or "fp16"
    formats: frozenset[str]  # the formats the GPU has a dense peak for ("fp32", "tf32", "fp16", "bf16", ...)
    figure: Callable[[str, str], object]  # (lesson, name) -> a committed run's figure (.value, .low, .high)
    wall_s: Callable[[str], float]  # a lesson's committed full-size CPU wall time, by lesson name

    @property
    def full(self) -> bool:
        """True at full size."""
        return self.size == "full"

    @property
    def train(self) -> int:
        """Training images: the subset, else the 80 % left after 10 % validation and 10 % test."""
        return self.train_subset or int(SPLIT_IMAGES * 0.8)

    @property
    def evals(self) -> int:
        """Images in the validation (or test) split."""
        return self.eval_subset or int(SPLIT_IMAGES * 0.1)

    def channels(self, base: int = 64) -> int:
        """A width of `base` channels at the run's width factor."""
        return round(base * self.width)

    def epoch(self, batch: int, drop: bool = False) -> int:
        """Steps in one training epoch at `batch` (drop: the last partial batch dropped)."""
        return self.train // batch if drop else math.ceil(self.train / batch)

    def eval_steps(self, batch: int) -> int:
        """Steps in one pass over the evaluation split at `batch`."""
        return math.ceil(self.evals / batch)

    def native(self, fmt: str) -> bool:
        """Whether the GPU runs `fmt` natively (bf16 only where the precision policy picks it)."""
        return fmt in self.formats and (fmt != "bf16" or self.mixed == "bf16")


@dataclass(frozen=True)
class Steps:
    """`steps` steps of a net at `batch` images on the GPU (train: forward+backward, else forward). fmt, the number
    format its products run in: 'default' (PyTorch's: TF32 convolutions where the GPU has them), 'mixed' (the
    policy's format) or a format; loop: 'lightning' (the Trainer's per-step cost counts) or 'plain'; on_device: no
    host-to-device copy."""
    what: str
    net: str  # lenet | simple_cnn | resnet9 | airnet
    batch: int
    steps: int
    train: bool = True
    fmt: str = "default"
    loop: str = "lightning"
    width: float = 64  # resnet9's channels; airnet's widths as a fraction of models.WIDTHS; others have one width
    on_device: bool = False


@dataclass(frozen=True)
class Matmul:
    """`calls` n x n x n products in one format."""
    what: str
    n: int
    calls: int
    fmt: str = "fp32"


@dataclass(frozen=True)
class Copy:
    """Bytes copied over the host link."""
    what: str
    nbytes: float


@dataclass(frozen=True)
class Images:
    """`images` images through a net on the host CPU (train: forward+backward), counted in FLOPs."""
    net: str
    images: int
    width: float = 64  # as Steps.width
    train: bool = False


@dataclass(frozen=True)
class HostFlops:
    """CNN work that stays on the host CPU, priced from its FLOPs."""
    what: str
    passes: tuple[Images, ...]


@dataclass(frozen=True)
class HostSeconds:
    """Host-bound work priced from the committed CPU run's seconds (passes: its FLOPs, for the record)."""
    what: str
    lo: float
    hi: float
    passes: tuple[Images, ...] = ()


@dataclass(frozen=True)
class Launches:
    """Eager ops bound by their launch cost, not by their arithmetic."""
    what: str
    ops: int


@dataclass(frozen=True)
class Compile:
    """torch.compile's cold compiles, as seconds the committed CPU run took (fast and slow end)."""
    what: str
    lo: float
    hi: float


@dataclass(frozen=True)
class PrecisionConfig:
    """A precision configuration a lesson benchmarks (and scripts/gpu_check.py runs on a GPU as 'ResNet-9 <name>'):
    Lightning's precision name and whether TF32 is switched on."""
    name: str
    precision: str = hardware.BASELINE
    tf32: bool = False

    @property
    def format(self) -> str:
        """The number format its products run in: fp32, tf32, fp16 or bf16."""
        return "tf32" if self.tf32 else hardware.number_format(self.precision)


Work = Union[Steps, Matmul, Copy, HostFlops, HostSeconds, Launches, Compile]


def _nothing(run: Run) -> tuple[Work, ...]:
    """No work of its own (the section's note says where it is counted, or why not)."""
    return ()


@dataclass(frozen=True)
class Section:
    """One section of a lesson's notebook: its heading's text (without the '#'s, as the notebook spells it) and the
    work it runs at a run size; note: what is left out, or where its work is counted."""
    heading: str
    work: Callable[[Run], tuple[Work, ...]] = _nothing
    note: str = ""
