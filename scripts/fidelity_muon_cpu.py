"""Is the course's Muon rung airbench94_muon? The course's SpeedrunModule with speedrun.MUON (Lightning) against a
port of airbench94_muon's own loop (scripts/ports/airbench_muon_port.py) on the same images, epochs, batch and seeds,
on a CPU, at a reduced size, in fp32 (the Newton-Schulz iteration too: muon.iteration_dtype on this CPU, and the port
told the same).

    python -m scripts.fidelity_muon_cpu --impl course --seeds 0 1 2 3    # one configuration per call
    python -m scripts.fidelity_muon_cpu --impl course --whiten-bias zero # the course before issue 46's fix
    python -m scripts.fidelity_muon_cpu --impl port --seeds 0 1 2 3
    python -m scripts.fidelity_muon_cpu --impl record --seeds 0 1 2 3      # speedrun.RECORD against hiverge's
    python -m scripts.fidelity_muon_cpu --impl record-port --seeds 0 1 2 3 # loop (scripts/ports/hiverge_port.py)
    python -m scripts.fidelity_muon_cpu --report                         # docs/results/fidelity-muon-cpu.md

Every run appends one JSON line to build/fidelity/muon-runs.jsonl; --report compares the two implementations with
the course's rule (verdict.difference: a gap in mean accuracy is named only outside Student's t band of the runs).
Data: the course's seed-0 split of the JPEG folder (COURSE_DATA), a seeded subset of its training part, graded on
its held-out test images (the same ones for both). See scripts/fidelity_cpu.py for airbench94's check.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from course_lib.base import config, results
from course_lib.measure import verdict
from course_lib.measure.timing import DeviceTimer
from course_lib.training import experiments, muon, speedrun
from scripts.fidelity_cpu import datamodule, run_seeds
from scripts.ports import airbench_muon_port, airbench_port, hiverge_port

ROOT = Path(__file__).resolve().parents[1]


def run_course(dm, args, seed: int) -> dict:
    recipe = course_recipe(args)
    module = speedrun.SpeedrunModule(recipe)
    run = experiments.run_seed(module, dm, seed=seed, epochs=args.epochs, precision="32-true")
    plain = speedrun.evaluate_tta(module.net, dm.test_set.images, dm.test_set.labels, level=0, precision="32-true")
    return {"acc": run.acc, "acc_no_tta": plain, "time_s": run.total_s, "steps": run.steps,
            "final_loss": run.losses[-5:].mean().item()}


def course_recipe(args) -> speedrun.Recipe:
    """speedrun.MUON (or RECORD) at the check's widths and batch; --whiten-bias zero: the course before issue 46's
    fix."""
    extra = {"whiten_bias": args.whiten_bias} if args.whiten_bias else {}
    extra |= {"whiten_order": args.whiten_order} if args.whiten_order else {}
    base = speedrun.RECORD if args.impl == "record" else speedrun.MUON
    return dataclasses.replace(base, widths=tuple(args.widths), batch_size=args.batch, **extra)


def run_record_port(dm, args, seed: int) -> dict:
    torch.manual_seed(seed)  # hiverge draws everything from the global generator
    train = hiverge_port.Loader(dm.train_set.images, dm.train_set.labels, args.batch, train=True)
    test = hiverge_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False)
    out = hiverge_port.train(train, test, args.epochs, tuple(args.widths), ns_dtype=muon.iteration_dtype("cpu"),
                             timer=DeviceTimer("cpu"))
    return {"acc": out["acc"], "acc_no_tta": out["acc_no_tta"], "time_s": out["time_s"], "steps": out["steps"],
            "final_loss": out["losses"][-5:].mean().item()}


def run_port(dm, args, seed: int) -> dict:
    torch.manual_seed(seed)  # the port draws everything from the global generator, as airbench does
    train = airbench_port.Loader(dm.train_set.images, dm.train_set.labels, args.batch, train=True,
                                 aug=airbench_muon_port.HYP["aug"], altflip=True)
    test = airbench_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False)
    out = airbench_muon_port.train(train, test, args.epochs, tuple(args.widths), ns_dtype=muon.iteration_dtype("cpu"),
                                   timer=DeviceTimer("cpu"))
    return {"acc": out["acc"], "acc_no_tta": out["acc_no_tta"], "time_s": out["time_s"], "steps": out["steps"],
            "final_loss": out["losses"][-5:].mean().item()}


def report(path: Path, out: Path, note: str = "", stages: Path | None = None) -> Path:
    """One row per (settings, implementation); the course - port gaps judged by verdict.direction."""
    rows = results.read_rows(path)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((json.dumps(r["settings"], sort_keys=True), r["impl"]), []).append(r)
    pct = lambda v: [100 * x for x in v]  # noqa: E731
    lines = ["Each row: one implementation on the same images, epochs, batch and seeds; accuracy on the same held-out "
             "images. mean ± std (min–max, runs).", "",
             "| settings | implementation | seeds | accuracy with TTA | without TTA | seconds per run (whitening + "
             "training + TTA) | last-5-step loss | hardware | commands |", "|---|---|---|---|---|---|---|---|---|"]
    for (s, impl), rs in sorted(groups.items()):
        st = json.loads(s)
        label = (f"{st.get('recipe', 'muon')}: {st['subset']:,} train / {rs[0]['test_images']:,} test images, "
                 f"widths {tuple(st['widths'])}, batch {st['batch']}, {st['epochs']} epochs, fp32 (iteration "
                 f"{st['ns_dtype']})")
        lines.append(f"| {label} | {impl} | {', '.join(str(r['seed']) for r in rs)} | "
                     f"{verdict.spread(pct([r['acc'] for r in rs]), unit=' %')} | "
                     f"{verdict.spread(pct([r['acc_no_tta'] for r in rs]), unit=' %')} | "
                     f"{verdict.spread([r['time_s'] for r in rs], '{:.1f}', ' s')} | "
                     f"{sum(r['final_loss'] for r in rs) / len(rs):.3f} | {rs[0]['hardware']} | "
                     f"{'<br>'.join(sorted({'`' + r['command'] + '`' for r in rs}))} |")
    lines += ["", "The course against the port, accuracy on the same held-out images (verdict.difference, the course's "
              "rule):", ""]
    for (s, impl), rs in sorted(groups.items()):
        port = groups.get((s, "record-port" if impl == "record" else "port"))
        if not (impl.startswith("course") or impl == "record") or not port:
            continue
        st = json.loads(s)
        tag = (f"{st.get('recipe', 'muon')}, {st['subset']:,} images, widths {tuple(st['widths'])}, {st['epochs']} "
               f"epochs, iteration {st['ns_dtype']}, {impl}")
        for label, k in (("with TTA", "acc"), ("without TTA", "acc_no_tta")):
            a, b = pct(r[k] for r in rs), pct(r[k] for r in port)
            lines.append(f"- {tag}, {label}: {verdict.difference(a, b, 'the course', 'the port', unit=' pt')}")
    lines += ["", "Per seed, accuracy with TTA / without (%), for every setting run by more than one implementation:"]
    for s in sorted({s for s, _ in groups}):
        impls = sorted(i for t, i in groups if t == s)
        if len(impls) < 2:
            continue
        st = json.loads(s)
        seeds = sorted({r["seed"] for i in impls for r in groups[(s, i)]})
        lines += ["", f"{st.get('recipe', 'muon')}: {st['subset']:,} training images, widths {tuple(st['widths'])}, "
                      f"batch {st['batch']}, {st['epochs']} epochs, iteration {st['ns_dtype']}:", "",
                  "| seed | " + " | ".join(impls) + " |", "|---" * (1 + len(impls)) + "|"]
        for seed in seeds:
            cells = []
            for i in impls:
                got = [r for r in groups[(s, i)] if r["seed"] == seed]
                cells.append(f"{100 * got[0]['acc']:.1f} / {100 * got[0]['acc_no_tta']:.1f}" if got else "")
            lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    lines += ["", f"Runs from {path} (commits {', '.join(sorted({r['commit'] for r in rows}))}), one at a time."]
    lines += ["", note] if note else []
    if stages:  # scripts/fidelity_muon_stages.py's printout, as it was run
        lines += ["", "## Stage by stage", "", stages.read_text().strip()]
    return results.write_report(out, "Muon and record rungs' fidelity: the course against ports of airbench94_muon and "
                                     "hiverge's record, on a CPU",
                                lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=("course", "port", "record", "record-port"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--data", help="JPEG folder (default: the course's data source, config.data_source)")
    p.add_argument("--subset", type=int, default=5000, help="training images (seeded subset of the 45,000)")
    p.add_argument("--test-subset", type=int, default=None, help="test images (default: all 5,000)")
    p.add_argument("--widths", type=int, nargs=3, default=(16, 32, 32))
    p.add_argument("--batch", type=int, default=250)
    p.add_argument("--epochs", type=float, help="default: the recipe's (MUON's 8, RECORD's 7.59)")
    p.add_argument("--whiten-bias", choices=("zero", "uniform"), help="the course's whitening bias start (default: "
                   "speedrun.MUON's, airbench94_muon's uniform draw; zero: the course before issue 46's fix)")
    p.add_argument("--whiten-order", choices=("largest", "smallest"), help="the course's whitening filter order "
                   "(default: speedrun.MUON's, airbench94_muon's smallest eigenvalue first; largest: before the fix)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--runs", type=Path, default=config.build_dir() / "fidelity" / "muon-runs.jsonl")
    p.add_argument("--report", action="store_true", help="write --out from --runs and exit")
    p.add_argument("--note", default="", help="with --report: a paragraph on how the runs were made")
    p.add_argument("--note-file", type=Path, help="with --report: the same, read from a file (kept out of Command)")
    p.add_argument("--stages", type=Path, help="with --report: a saved printout of fidelity_muon_stages.py to add")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "fidelity-muon-cpu.md")
    args = p.parse_args()
    if args.report:
        note = args.note_file.read_text().strip() if args.note_file else args.note
        print(report(args.runs, args.out, note, args.stages).read_text())
        return 0
    if args.impl is None:
        p.error("--impl is required (or --report)")
    if args.threads:
        torch.set_num_threads(args.threads)
    record = args.impl.startswith("record")
    args.epochs = args.epochs or (speedrun.RECORD if record else speedrun.MUON).epochs
    dm = datamodule(args)
    ns_dtype = str(muon.iteration_dtype("cpu")).removeprefix("torch.")
    settings = {"subset": args.subset, "widths": list(args.widths), "batch": args.batch, "epochs": args.epochs,
                "ns_dtype": ns_dtype, **({"recipe": "record"} if record else {})}
    recipe = course_recipe(args)  # rows before issue 46's filter-order fix: 'course (whiten bias ...)' alone
    impl = (f"course (whiten bias {recipe.whiten_bias}, filters {recipe.whiten_order} first)" if args.impl == "course"
            else args.impl)
    run = {"course": run_course, "port": run_port, "record": run_course, "record-port": run_record_port}[args.impl]
    run_seeds(dm, args, run, settings, label=impl, impl=impl, threads=torch.get_num_threads())
    return 0


if __name__ == "__main__":
    sys.exit(main())
