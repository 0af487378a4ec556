"""Is the course's recipe airbench94? The course's SpeedrunModule (Lightning) against a port of airbench94's own
training loop (scripts/ports/airbench_port.py) on the same images, epochs, batch and seeds, on a CPU, at a reduced size.

    python -m scripts.fidelity_cpu --impl course --seeds 0 1 2     # one configuration per call, runs one at a time
    python -m scripts.fidelity_cpu --impl port --seeds 0 1 2
    python -m scripts.fidelity_cpu --impl course --extras off --seeds 0 1 2   # no label smoothing, bias LR x1,
    python -m scripts.fidelity_cpu --impl port --extras off --seeds 0 1 2     # no lookahead (both); or one of
    python -m scripts.fidelity_cpu --impl course --extras no-lookahead        # them: no-smoothing, no-bias-lr
    python -m scripts.fidelity_cpu --impl port --precision own     # each side's own low precision (point 16)
    python -m scripts.fidelity_cpu --report                        # docs/results/fidelity-cpu.md from the runs

Every run appends one JSON line to build/fidelity/runs.jsonl (accuracy with and without TTA, seconds, settings,
commit); --report groups them by configuration. Data: the course's seed-0 split of the JPEG folder (COURSE_DATA),
a seeded subset of its training part and of its 5,000 test images; fp32 (or, with --precision own, the course in
bf16-mixed and the port in airbench's fp16 weights with fp32 BatchNorm, which a CPU without fp16 units emulates
slowly); 9.9 epochs; LR and decay per batch as airbench scales them (per example).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from course_lib.base import config, hardware, results
from course_lib.data.data import CIFAR10DataModule
from course_lib.measure import verdict
from course_lib.measure.timing import DeviceTimer
from course_lib.training import experiments, runs, speedrun
from scripts.ports import airbench_port

ROOT = Path(__file__).resolve().parents[1]

#: --extras: which of airbench's training extras to switch off, as (course, port) keyword arguments
EXTRAS = {"on": ({}, {}),
          "off": (dict(label_smoothing=0.0, bias_scale=1.0, lookahead_every=0),
                  dict(label_smoothing=0.0, bias_scaler=1.0, lookahead=False)),
          "no-smoothing": (dict(label_smoothing=0.0), dict(label_smoothing=0.0)),
          "no-bias-lr": (dict(bias_scale=1.0), dict(bias_scaler=1.0)),
          "no-lookahead": (dict(lookahead_every=0), dict(lookahead=False))}


#: --precision: fp32 on both sides, or each side's own low precision, as (course Trainer precision, port dtype)
PRECISIONS = {"fp32": ("32-true", torch.float32, "fp32"),
              "own": ("bf16-mixed", torch.float16, "course bf16-mixed, port fp16 weights with fp32 BatchNorm")}

#: airbench94 (0.1.8) against the course, point by point, and what was done; tests/test_fidelity.py checks each
DEVIATIONS = [  # (point, airbench94, the course before, resolution)
    ("GELU after the whitening conv", "yes", "**missing**: the +/- filter pairs fed conv group 1 as one linear map",
     "removed: AirNet.forward applies it"),
    ("BatchNorm eps", "1e-12", "1e-5 (PyTorch's default)", "removed: 1e-12"),
    ("BatchNorm momentum, scale", "0.6 in airbench's convention (PyTorch 0.4); scale frozen at 1", "0.4; frozen",
     "already equal"),
    ("whitening statistics", "uncentred second moments of the 2x2 patches, fp32, largest eigenvalue first",
     "centred covariance, fp64, ascending",
     "removed: uncentred, largest first; fp64 and a deterministic sign per pair kept (filters "
     "within 1 % of airbench's fp32 ones; a sign only swaps a filter with its negative)"),
    ("whitening bias", "zero, trained (base LR, decay) 3 epochs, then frozen",
     "set to -W mean (centred outputs), PyTorch's random bias before",
     "removed: zero at construction and after init_whitening"),
    ("length", "9.9 epochs: ceil(9.9 x steps per epoch) steps", "10 epochs",
     "removed: speedrun.EPOCHS = 9.9 (Trainer max_steps, twin stops at the same step)"),
    ("LR peak", "step int(0.23 x total)", "round(0.23 x total)", "removed"),
    ("weight decay", "0.0153 / (1 + 1/(1 - 0.85)) = 1.996e-3 per step at batch 1024", "2e-3", "removed (0.2 %)"),
    ("loss, LR", "summed loss, LR 11.5 / (1024 x 7.67) per example", "mean loss, LR 1.5 per batch of 1024",
     "equal: the same update, step for step (test); mean kept (Lightning's and lessons 01-07's " "form)"),
    ("label smoothing, momentum, BN-bias LR", "0.2, Nesterov 0.85, x64 with the same decay per step", "same",
     "already equal"),
    ("lookahead", "every 5 steps, keep 0.95^5 (step/total)^3, all float state-dict entries (BN statistics "
     "too), final copy", "same",
     "equal (test); kept: airbench snapshots before whitening, so its first update mixes 0.95^5 "
     "(5/426)^3 = 1e-6 of the random pre-whitening filters into the frozen layer (fp16 rounds it" " away)"),
    ("alternating flip", "epoch 0 a random half (pre-flip), odd epochs everything flipped again",
     "epoch 0 a random half, each later epoch the complement", "equal"),
    ("translate", "+/-2 px per axis, reflect padding, new per epoch; crop then flip", "same, flip after crop",
     "equal in distribution"),
    ("TTA", "1/2 mirror pair, 1/4 each 1-px shifted mirror pair (reflect)", "same", "equal (test, 1e-5)"),
    ("net, init", "whiten, 3 groups (conv, pool, BN, GELU, conv, BN, GELU), max pool, linear x 1/9; kaiming +"
     " dirac", "same", "equal: one seed gives the same weights (test)"),
    ("precision", "fp16 weights and activations, fp32 BatchNorm, no master copy", "bf16-mixed autocast, fp32 weights",
     "kept: the course's precision policy (lesson 04: bf16 needs no loss scaling, and updates stay fp32); "
     "the same accuracy on this CPU with --precision own (Findings); its time on a GPU is gpu_capstone.py's "
     "(b) against (a)"),
    ("speed settings", "channels_last, no compile", "channels_last + compile on a GPU", "speed only"),
]


def datamodule(args) -> CIFAR10DataModule:
    dm = runs.datamodule(kind="speedrun", image_folder=config.data_source(args.data), batch_size=args.batch,
                         subset=args.subset, eval_subset=args.test_subset, seed=0, device="cpu")
    dm.prepare_data()
    dm.setup("fit")
    return dm


def run_course(dm, args, seed: int) -> dict:
    extras = EXTRAS[args.extras][0]
    module = speedrun.SpeedrunModule(speedrun.Recipe(widths=tuple(args.widths), batch_size=args.batch, **extras))
    run = experiments.run_seed(module, dm, seed=seed, epochs=args.epochs, precision=PRECISIONS[args.precision][0])
    plain = speedrun.evaluate_tta(module.net, dm.test_set.images, dm.test_set.labels, level=0,
                                   precision="32-true")  # fp32 whatever the run trained in, as before
    return {"acc": run.acc, "acc_no_tta": plain, "time_s": run.total_s, "steps": run.steps,
            "final_loss": run.losses[-5:].mean().item()}


def run_port(dm, args, seed: int) -> dict:
    torch.manual_seed(seed)  # the port draws everything from the global generator, as airbench does
    dtype = PRECISIONS[args.precision][1]
    train = airbench_port.Loader(dm.train_set.images, dm.train_set.labels, args.batch, train=True,
                                 aug=airbench_port.HYP["aug"], altflip=True, dtype=dtype)
    test = airbench_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False, dtype=dtype)
    extras = EXTRAS[args.extras][1]
    out = airbench_port.train(train, test, args.epochs, tuple(args.widths), dtype=dtype, timer=DeviceTimer("cpu"),
                              **extras)
    return {"acc": out["acc"], "acc_no_tta": out["acc_no_tta"], "time_s": out["time_s"], "steps": out["steps"],
            "final_loss": out["losses"][-5:].mean().item()}


def commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "course_lib", "scripts"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return res.stdout.strip() + ("+uncommitted" if dirty else "")


def settings(args) -> dict:
    got = {"subset": args.subset, "test_subset": args.test_subset, "widths": list(args.widths), "batch": args.batch,
           "epochs": args.epochs}
    return got if args.precision == "fp32" else {**got, "precision": args.precision}  # older runs have no key


def precision_label(settings: dict) -> str:
    """How a row's two sides computed."""
    return PRECISIONS[settings.get("precision", "fp32")][2]


FINDINGS = "<!-- findings: written by hand; kept when --report rewrites the file -->"


def report(path: Path, out: Path) -> Path:
    """Group the runs by configuration; one table row per (settings, implementation, extras). Text after the
    FINDINGS marker in an existing `out` is kept."""
    rows = results.read_rows(path)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((json.dumps(r["settings"], sort_keys=True), r["impl"], r["extras"]), []).append(r)
    groups = dict(sorted(groups.items(), key=lambda g: (json.loads(g[0][0])["subset"], g[0][1] != "course",
                                                         g[0][1], g[0][2] != "on", g[0][2])))
    kept = out.read_text().split(FINDINGS, 1)[1] if out.exists() and FINDINGS in out.read_text() else ""
    kept = kept.split("\nVersions and hardware facts:", 1)[0].strip()  # write_report adds a fresh one
    pct = lambda v: [100 * x for x in v]  # noqa: E731
    lines = ["## airbench94 against the course", "", "| # | point | airbench94 | the course before | resolution |",
             "|---|---|---|---|---|", *[f"| {i} | " + " | ".join(row) + " |" for i, row in enumerate(DEVIATIONS, 1)],
             "", "## Training runs", "",
             "Each row: one implementation on the same images, epochs, batch and seeds; test accuracy over "
             "the same held-out images. mean ± std (min–max, runs).", "",
             "| settings | implementation | extras | seeds | accuracy with TTA | without TTA | seconds per run "
             "(whitening + training + TTA) | last-5-step loss | commands |", "|---|---|---|---|---|---|---|---|---|"]
    for (s, impl, extras), rs in groups.items():
        st = json.loads(s)
        label = (f"{st['subset']:,} train / {st['test_subset'] or 'all'} test images, AirNet{tuple(st['widths'])}, "
                 f"batch {st['batch']}, {st['epochs']} epochs, {precision_label(st)}")
        seeds = ", ".join(str(r["seed"]) for r in rs)
        cmds = sorted({r["command"] for r in rs})
        lines.append(f"| {label} | {impl} | {extras} | {seeds} | "
                     f"{verdict.spread(pct([r['acc'] for r in rs]), unit=' %')} | "
                     f"{verdict.spread(pct([r['acc_no_tta'] for r in rs]), unit=' %')} | "
                     f"{verdict.spread([r['time_s'] for r in rs], '{:.1f}', ' s')} | "
                     f"{statistics.mean(r['final_loss'] for r in rs):.3f} | {'<br>'.join(f'`{c}`' for c in cmds)} |")

    def diff(first: list[dict], second: list[dict]) -> str:
        """mean(first) - mean(second) ± standard error, with and without TTA."""
        d = verdict.mean_diff
        return "; ".join(f"{label} {d(pct(r[k] for r in second), pct(r[k] for r in first), unit=' pt')}"
                         for label, k in (("with TTA", "acc"), ("without TTA", "acc_no_tta")))

    pairs = []
    for (s, impl, extras), rs in groups.items():
        st = json.loads(s)
        tag = f"{st['subset']:,} images, {st['epochs']} epochs, {precision_label(st)}"
        if impl == "course" and (s, "port", extras) in groups:
            pairs.append(f"- {tag}, extras {extras}, course - port: {diff(rs, groups[(s, 'port', extras)])}")
        if extras != "on" and (s, impl, "on") in groups:
            pairs.append(f"- {tag}, {impl}, extras on - {extras}: {diff(groups[(s, impl, 'on')], rs)}")
        fp32 = json.dumps({k: v for k, v in st.items() if k != "precision"}, sort_keys=True)
        if st.get("precision", "fp32") != "fp32" and (fp32, impl, extras) in groups:
            pairs.append(f"- {tag}, {impl}, extras {extras}, own precision - fp32: "
                         f"{diff(rs, groups[(fp32, impl, extras)])}")
    lines += ["", "Differences (mean of the first minus the second ± standard error):", "", *pairs]
    commits = sorted({r["commit"] for r in rows})
    lines += ["", f"Runs from {path} (commits {', '.join(commits)}), one at a time on this machine.", "",
              FINDINGS, "", kept]
    return results.write_report(out, "Recipe fidelity: the course against a port of airbench94, on a CPU",
                                    lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=("course", "port"))
    p.add_argument("--extras", choices=sorted(EXTRAS), default="on",
                   help="off: no label smoothing, BN-bias LR x1, no lookahead (TTA is reported both ways)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--data", help="JPEG folder (default: the course's data source, config.data_source)")
    p.add_argument("--subset", type=int, default=5000, help="training images (seeded subset of the 45,000)")
    p.add_argument("--test-subset", type=int, default=None, help="test images (default: all 5,000)")
    p.add_argument("--widths", type=int, nargs=3, default=(16, 32, 32))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32",
                   help="own: the course in bf16-mixed, the port in airbench's fp16 weights (fp32 BatchNorm)")
    p.add_argument("--epochs", type=float, default=speedrun.EPOCHS)
    p.add_argument("--runs", type=Path, default=config.build_dir() / "fidelity" / "runs.jsonl")
    p.add_argument("--report", action="store_true", help="write docs/results/fidelity-cpu.md from --runs and exit")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "fidelity-cpu.md")
    args = p.parse_args()
    if args.report:
        print(report(args.runs, args.out).read_text())
        return 0
    if args.impl is None:
        p.error("--impl is required (or --report)")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    dm = datamodule(args)
    run_seeds(dm, args, run_course if args.impl == "course" else run_port, settings(args),
              label=f"{args.impl} extras {args.extras}", extras=args.extras)
    return 0


def run_seeds(dm, args, run, settings: dict, *, label: str, **fields) -> None:
    """Train run(dm, args, seed) for each of args.seeds and append one JSON row per seed to args.runs (with
    `fields`, the settings, the data sizes, the commit, the command and the hardware), printing each result."""
    command = results.command_line()
    for seed in args.seeds:
        start = time.perf_counter()
        got = run(dm, args, seed)
        row = {"impl": args.impl, **fields, "seed": seed, **got, "wall_s": time.perf_counter() - start,
               "settings": settings, "train_images": len(dm.train_set), "test_images": len(dm.test_set),
               "commit": commit(), "command": command, "hardware": hardware.label()}
        results.append_row(args.runs, row)
        print(f"{label} seed {seed}: {got['acc']:.2%} with TTA, {got['acc_no_tta']:.2%} without, "
              f"{got['time_s']:.1f} s ({row['wall_s']:.1f} s wall)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
