"""The benchmark harness: a timed fit gives one result row (a BenchRow: images/s with its spread over repeats, step
time, memory after warm-up) for each BenchConfig, speedups over a baseline, autograd's saved bytes, and the rows'
table and chart."""
from __future__ import annotations

import builtins
import statistics
import time
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Callable

import lightning as L
import torch

from ..base import config, hardware, results
from ..base.errors import CourseError
from ..base.records import BenchRow
from ..measure import timing, verdict
from ..measure.timing import BenchCallback
from ..training import runs


def bench(module: L.LightningModule, datamodule: L.LightningDataModule, name: str, *, steps: int, warmup: int = 5,
          precision: str = hardware.BASELINE, accelerator: str = "auto", clock: Callable[[], float] = time.perf_counter,
          callback: BenchCallback | None = None, **trainer_kwargs) -> BenchRow | None:
    """Train `warmup + steps` steps and return the timed steps' result row (one run: its spread is its own figure).

    `callback` replaces the default BenchCallback(warmup, steps, clock) (scaling.DDPBenchCallback for several
    processes); trainer_kwargs (devices, strategy, ...) go to the Trainer. None where the callback has no row (a
    DDP rank other than 0)."""
    cb = callback or BenchCallback(warmup, steps, clock)
    trainer = runs.trainer(None, precision, timing=True, **{"max_epochs": None, "max_steps": warmup + steps,
                                                             "accelerator": accelerator, "callbacks": [cb],
                                                             **trainer_kwargs})
    trainer.fit(module, datamodule=datamodule)
    row = cb.summary(module.device)  # unnamed; a DDP callback's is rank 0's, read back (None on other ranks)
    return row and replace(row, name=name, precision=precision)


@dataclass(frozen=True)
class BenchConfig:
    """One configuration of a benchmark table, what run_configs reads of it: the row's name, precision and Trainer
    settings; `build` holds what the caller's make(config) reads to build the module and data (its own keys)."""
    name: str
    precision: str = hardware.BASELINE
    trainer: dict = field(default_factory=dict)  # more Trainer arguments: devices, strategy, ...
    build: dict = field(default_factory=dict)  # e.g. model and data settings, for make

    @classmethod
    def of(cls, cfg: BenchConfig | dict) -> BenchConfig:
        """cfg itself, or a lesson's dict read as one: "name", optional "precision" and "trainer", the rest build."""
        if isinstance(cfg, cls):
            return cfg
        if "name" not in cfg:
            raise CourseError(f"A benchmark configuration needs a 'name' (its row's label); got keys {sorted(cfg)}.")
        build = {k: v for k, v in cfg.items() if k not in ("name", "precision", "trainer")}
        return cls(cfg["name"], cfg.get("precision", hardware.BASELINE), cfg.get("trainer", {}), build)


def run_configs(configs: list[BenchConfig | dict], make: Callable[[BenchConfig | dict], tuple], steps: int,
                warmup: int = 5, repeats: int = 1) -> list[BenchRow]:
    """Bench each config (`make(cfg)` -> module, datamodule; make gets the config as given, a BenchConfig or a
    lesson's dict, see BenchConfig.of) in `repeats` interleaved rounds (every config once
    per round, so a drift of the machine hits all alike); keep the run with the median images/s and add the
    fastest and slowest repeat's (images_per_s_min, images_per_s_max: the spread), every round's images/s in
    round order (rounds: pair them across rows for verdict.compare(paired=True)) and the first round's warm-up
    (first_warmup_s: compilation from cold caches lands there)."""
    runs_of, read = [[] for _ in configs], [BenchConfig.of(cfg) for cfg in configs]
    for _ in range(repeats):
        for cfg, known, done in zip(configs, read, runs_of):
            module, dm = make(cfg)
            done.append(bench(module, dm, known.name, steps=steps, warmup=warmup, precision=known.precision,
                              **known.trainer))
    return [replace(median_row(done), first_warmup_s=done[0].warmup_s) for done in runs_of]


def median_row(done: list[BenchRow]) -> BenchRow:
    """One configuration's runs (in round order) as one row: the median run's other fields, the median of the rounds'
    images/s (what the verdicts compare: with an even count, the mean of the middle two), the fastest and slowest
    run's images/s as its spread, every round's images/s in round order (rounds) and their count."""
    ranked = sorted(done, key=lambda r: r.images_per_s)
    rounds = tuple(r.images_per_s for r in done)
    return replace(ranked[len(ranked) // 2], images_per_s=statistics.median(rounds),
                   images_per_s_min=ranked[0].images_per_s, images_per_s_max=ranked[-1].images_per_s, rounds=rounds,
                   repeats=len(done))


def add_speedups(rows: list[BenchRow], baseline: str) -> list[BenchRow]:
    """Add `speedup`, images/s relative to the row named `baseline` as the verdicts compute it (the median round ratio
    where both rows hold interleaved rounds of one length, verdict.interval; else the medians' ratio), `called`, the
    verdict's decision on it (verdict.direction over paired rounds: +1 faster, -1 slower, 0 no difference, None too
    few rounds to judge), `said`, the verdict's words where it calls none (verdict.NOISE or verdict.PRACTICAL), and a
    `baseline` flag, true on that row."""
    base = next((r for r in rows if r.name == baseline), None)
    if base is None:
        raise ValueError(f"No row named {baseline!r}; rows are {[r.name for r in rows]}.")
    b = list(base.rounds)

    def speedup(row: BenchRow) -> float:
        a = list(row.rounds)
        return verdict.interval(a, b, paired=True).mid if a and b and len(a) == len(b) else \
            row.images_per_s / base.images_per_s

    def called(row: BenchRow) -> int | None:
        a = list(row.rounds)
        return verdict.direction(a, b, paired=True) if a and b and len(a) == len(b) else None

    def said(row: BenchRow) -> str:  # verdict.compare's own words: 'no practical difference' is a sure gap under 5 %
        return verdict.compare(list(row.rounds), b, "", "", paired=True).outcome

    out = [replace(r, speedup=speedup(r), called=called(r), baseline=r is base) for r in rows]
    return [replace(r, said=said(r)) if r.called == 0 else r for r in out]


def saved_bytes_peak(step: Callable[[], object]) -> int:
    """Peak bytes of tensors autograd holds for backward while step() runs (saved_tensors_hooks; counted per save)."""
    live, peak = [0], [0]

    class _Held:
        """One saved tensor; its bytes leave the count when autograd frees it."""
        __slots__ = ("t", "n")

        def __init__(self, t):
            self.t, self.n = t, t.numel() * t.element_size()
            live[0] += self.n
            peak[0] = max(peak[0], live[0])

        def __del__(self):
            live[0] -= self.n

    with torch.autograd.graph.saved_tensors_hooks(_Held, lambda held: held.t):
        step()
    return peak[0]


MAX_COLUMNS = 6  # a table a reader takes in at a glance; more fields go under it or into a second table
#: default columns (+ speedup where present); peak_mem_mb only for rows measured on a GPU (on a CPU it is the process's
#: resident memory, which says little about one configuration), data_wait where a lesson asks for it (03 teaches it)
SHOWN = ["name", "images_per_s", "step_ms", "peak_mem_mb"]
HEADS = {"step_ms": "step (ms)", "warmup_s": "warm-up"}  # printed names; data_wait and peak_mem_mb keep the names
# the lessons define
SHARED = ["steps", "batch_size", "precision", "device", "repeats"]  # settings named once under the table when equal


def _cell(row: dict, col: str) -> str:
    """One table cell: floats as plain numbers, images/s with its slowest-fastest range when the row has one,
    data_wait and test_acc as percentages, warmup_s as a duration."""
    fmt = lambda v: verdict.number(v) if isinstance(v, float) else str(v)  # noqa: E731  (7,770, not 7.77e+03)
    if col == "warmup_s" and isinstance(row.get(col), float):  # seconds, in the unit that reads best: '24.7 ms'
        return timing.duration(row[col])
    if col == "data_wait" and isinstance(row.get(col), float):  # a share of the time, as the lessons write it
        return f"{100 * row[col]:.0f} %"
    if col == "test_acc" and isinstance(row.get(col), float) and 0 <= row[col] <= 1:  # a fraction, shown as the
        return f"{100 * row[col]:.1f} %"  # verdicts beside it give accuracies: in %
    if col == "images_per_s" and "images_per_s_min" in row:
        return f"{fmt(row[col])} ({fmt(row['images_per_s_min'])}–{fmt(row['images_per_s_max'])})"
    if col == "speedup":  # the verdict's word: '1.77x slower' (k >= 1) only where it calls a difference
        if row.get("baseline"):
            return "1x (baseline)"
        if row.get("called") == 0:  # the verdict line's words; its median ratio is on that line (1.07x slower)
            return row.get("said", verdict.NOISE)
        return verdict.factor(row[col]) + (" (not judged: too few rounds)" if row.get("called") is None else "")
    return fmt(row.get(col, ""))


def cells(row: BenchRow | dict) -> dict:
    """A row's fields by name, for a table: a BenchRow's set ones (None: not measured), or a lesson's own dict."""
    return {k: v for k, v in asdict(row).items() if v is not None} if is_dataclass(row) else row


def table(rows: list[BenchRow | dict], fields: list[str] | None = None) -> str:
    """A markdown table of result rows, BenchRows or a lesson's own dicts (at most MAX_COLUMNS fields, default SHOWN),
    images/s with its range, and under it the settings every row shares, the hardware and the size."""
    rows = [cells(r) for r in rows]
    on_gpu = any(str(r.get("device", "")).startswith("cuda") for r in rows)
    cols = list(fields) if fields else [c for c in SHOWN + ["speedup"] if c in rows[0]
                                         and (c != "peak_mem_mb" or on_gpu)]
    cols = [c for c in cols if c not in ("images_per_s_min", "images_per_s_max")]  # shown in images_per_s's cell
    if len(cols) > MAX_COLUMNS:
        raise ValueError(f"bench.table: {len(cols)} columns {cols}; pass at most {MAX_COLUMNS} fields "
                         "and print the rest as a second table")
    head = [c if c != "images_per_s" or "images_per_s_min" not in rows[0] else "images_per_s (range)" for c in cols]
    head = [HEADS.get(h, h) for h in head]  # plain words for the columns a reader meets most
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r, c) for c in cols) + " |" for r in rows]
    shared = [f"{k} {rows[0][k]}" for k in SHARED if k not in cols and k in rows[0]
              and all(r.get(k) == rows[0][k] for r in rows)]
    every = f"Every row: {', '.join(shared)}.\n" if shared else ""  # its own line: 120 chars at most
    return "\n".join(lines) + f"\n\n{every}Hardware: {hardware.label()}; size {config.run_size().name}"


class Table(str):
    """A markdown table that Jupyter, Colab and the website render as a table (text/markdown), and whose plain-text
    form (text/plain, print) is the same markdown."""

    def _repr_markdown_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return str(self)


def show(rows: list[BenchRow | dict], fields: list[str] | None = None) -> None:
    """table(rows, fields) shown as a rendered table where IPython runs (it puts `display` in builtins), else
    printed as markdown text."""
    (getattr(builtins, "display", None) or print)(Table(table(rows, fields)))


def rows_table(rows: list[dict], columns: list[str] | None = None, note: str = "") -> Table:
    """Any rows (dicts, one per table row) as a Table: one column per key of the first row, or `columns`; floats as
    plain numbers (verdict.number), a missing key as an empty cell, '|' in a cell escaped; `note` (the hardware and
    size, say) under the table."""
    cols = list(columns or (rows[0] if rows else []))
    if not cols or len(cols) > MAX_COLUMNS:
        raise ValueError(f"bench.rows_table: {len(cols)} columns {cols}; a table needs 1 to {MAX_COLUMNS}")

    cell = lambda v: verdict.number(v) if isinstance(v, float) else v  # noqa: E731  (7,770, not 7770.0)
    lines = results.markdown_table(cols, [[cell(r.get(c, "")) for c in cols] for r in rows])
    return Table("\n".join(lines) + (f"\n\n{note}" if note else ""))


def show_rows(rows: list[dict], columns: list[str] | None = None, note: str = "") -> None:
    """rows_table(rows, columns, note) shown as a rendered table where IPython runs, else printed as markdown text."""
    (getattr(builtins, "display", None) or print)(rows_table(rows, columns, note))


SINGULAR = {"ops": "op", "runs": "run", "steps": "step", "images": "image", "calls": "call", "processes": "process",
            "kernels": "kernel"}


def measures(saved: list[dict]) -> list[dict]:
    """results.load rows (name, value, unit, note) as rows_table rows: 'measure' (the name, its note in brackets) and
    'value': a whole number as one (8, 1,024), any other as verdict.number, then its unit ('1 op', not '1 ops')."""
    def value(r: dict) -> str:
        v, unit = float(r["value"]), str(r.get("unit", ""))
        if v == 1:  # '1 op or fused C++ kernel', not '1 ops or fused C++ kernels'
            unit = " ".join(SINGULAR.get(w, w) for w in unit.split())
        return f"{int(v):,}" if v.is_integer() and abs(v) < 1e15 else verdict.number(v), unit


    return [{"measure": r["name"] + (f" ({r['note']})" if r.get("note") else ""),
             "value": results.with_unit(*value(r))} for r in saved]


def plot_speedups(rows: list[BenchRow], title: str):
    """Horizontal bar chart of each row's speedup over the baseline (1.0 marked)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 + 0.45 * len(rows)))
    colors = ["tab:gray" if r.called == 0 else "tab:blue" for r in rows]  # grey: the verdict calls no difference
    ax.barh([r.name for r in rows][::-1], [r.speedup for r in rows][::-1], color=colors[::-1])
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("speedup over baseline (images/s ratio; grey: no difference by the verdict's rule)")
    ax.set_title(f"{title}\n{hardware.label()}, size {config.run_size().name}", fontsize=9)
    fig.tight_layout()
    return fig

