"""The benchmark's result row as a typed, frozen record (BenchRow): what a timed fit measured, what the harness adds
over repeats and against a baseline, and its JSON form (to_json, from_json), which results files hold."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BenchRow:
    """One benchmark configuration's timed steps: images/s (over every process) with its spread over repeats, the
    median step, peak memory (CUDA's allocator on a GPU, the process's resident memory elsewhere), the share of time
    spent waiting for data, the warm-up; then what the harness adds over repeated rounds and against a baseline."""

    name: str
    images_per_s: float
    step_ms: float  # the median timed step
    peak_mem_mb: float
    data_wait: float  # a fraction of the timed steps' wall time
    warmup_s: float  # from train start to the end of warm-up
    steps: int  # timed steps
    batch_size: int  # images per step, over every process
    device: str  # the device type: cpu, cuda
    precision: str = ""  # Lightning's precision name
    processes: int = 1
    images_per_s_min: float | None = None  # the slowest and fastest round's images/s (one run: images_per_s)
    images_per_s_max: float | None = None
    rounds: tuple[float, ...] = ()  # every round's images/s, in round order (pair them across rows)
    repeats: int = 1
    first_warmup_s: float | None = None  # the first round's warm-up: compilation from cold caches lands there
    speedup: float | None = None  # images/s relative to the baseline row (bench.add_speedups)
    called: int | None = None  # the verdict on it: +1 faster, -1 slower, 0 no difference, None too few rounds
    said: str | None = None  # the verdict's words where it calls no difference (verdict.NOISE or PRACTICAL)
    baseline: bool = False  # the row the speedups are relative to

    def to_json(self) -> dict:
        """The row as a JSON object (rounds as a list)."""
        return {**asdict(self), "rounds": list(self.rounds)}

    @classmethod
    def from_json(cls, data: dict) -> BenchRow:
        """A row from its JSON object (to_json's): a TypeError names a key this record does not have."""
        return cls(**{**data, "rounds": tuple(data.get("rounds", ()))})
