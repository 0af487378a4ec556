"""Lesson 08 on a GPU in one offline command: airbench94 itself, the course's Lightning recipe and its plain-PyTorch
twin on the same images and GPU, then lessons 03-05's benchmarks and lesson 06's one-device row.

    # here, with a network and the JPEG folder: the data pack (45 MiB) and the airbench package (40 KB)
    pip download airbench==0.1.8 --no-deps --no-binary :all: -d build/sdist
    python -m scripts.gpu_capstone --make-data build/carry/cifar10-train-jpeg.pt \\
        --airbench-sdist build/sdist/airbench-0.1.8.tar.gz
    # and airbench94_muon.py (a script, not in the package) at the commit airbench_carry.MUON_URL names
    curl -fLo build/sdist/airbench94_muon.py <airbench_carry.MUON_URL>
    python -m scripts.gpu_capstone --make-data build/carry/cifar10-train-jpeg.pt \\
        --airbench-sdist build/sdist/airbench-0.1.8.tar.gz --airbench-muon build/sdist/airbench94_muon.py
    # on the GPU machine, build/carry carried, nothing installed (torch, lightning, torchmetrics, torchvision there)
    python -m scripts.gpu_capstone --data build/carry/cifar10-train-jpeg.pt         # about 9 minutes (--budget)
    # anywhere without a GPU: the same code on a few hundred images; only airbench's CUDA-only training is left out
    python -m scripts.gpu_capstone --dry-run --data <JPEG folder or pack>

Order, most important first; the results file is rewritten after every run, so a timeout keeps what was done:
  (a) airbench94 from build/carry/airbench: one warm-up, then --seeds runs of train94, each timed by airbench with
      CUDA events (whitening, 9.9 epochs, TTA; data loading excluded) on the course's images, written as its
      train.pt/test.pt;
  (b) SpeedrunModule (bf16-mixed, channels_last, compile) through experiments.run_seed, same seeds and timing
      rules: trainer.fit (whitening + training) plus trainer.test (TTA), after an untimed warm-up (compilation);
  (c) the plain-PyTorch twin (experiments.compare_twin) per seed, same timing, after its own warm-up;
  (e) airbench94_muon.py from build/carry (sha256-checked): its CifarNet compiled as its __main__ does, a warm-up,
      then main() per seed, timed by its own CUDA events (batch 2000, 8 epochs, TTA); the dry run trains the port
      (scripts/ports/airbench_muon_port.py) on the CPU instead, airbench94_muon's loop being CUDA-only;
  (f) SpeedrunModule with speedrun.MUON (the course's Muon rung), as (b);
  (g) hiverge's record loop, as scripts/ports/hiverge_port.py ports it (cifar10_speedrun.py at 5cd49b1): fp16 weights,
      channels_last, batch 1536, 7.59 epochs, selective TTA, after an untimed warm-up; on the CPU in a dry run;
  (h) SpeedrunModule with speedrun.RECORD (the course's record rung), as (b);
  (d) while --budget lasts: scripts/gpu_check.py's lesson 03-05 configurations (target pairs first), then lesson
      06's one-device row (course_lib.parallel.scaling, as scripts/gpu_ddp_check.py measures it).
All parts use one split: 45,000 training / 5,000 test images carved with seed 0 from the 50,000 training JPEGs (no
validation). airbench's own benchmark trains on 50,000 and tests on the official 10,000, so its published figures
(94.01 %, 3.83 s on an A100) are not comparable to these; the ratios here are like for like.
Writes docs/results/<gpu>-capstone.md and docs/results/<gpu>.md (d); the dry run writes build/gpu_capstone-dryrun.md
and build/gpu_check-dryrun.md instead (docs/ holds GPU figures only).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from course_lib.base import config, hardware, results
from course_lib.data import sources
from course_lib.data.sources import ImageFolderSource, open_source
from course_lib.measure import timing, verdict
from course_lib.training import experiments, models, muon, runs, speedrun
from course_lib.training.twin import Twin
from scripts import airbench_carry, lesson_checks
from scripts.ports import airbench_muon_port, airbench_port, hiverge_port

ROOT = Path(__file__).resolve().parents[1]

ORDER = ("setup", "a", "b", "c", "summary", "e", "f", "muon", "g", "h", "record", "d")
def make_data(folder: Path, out: Path) -> None:
    """Pack a training folder's JPEG files, in CIFAR10DataModule's order, as a JPEG pack (sources.save_jpeg_pack)."""
    count = sources.save_jpeg_pack(folder, out)
    size = out.stat().st_size / 2**20
    print(f"wrote {count} JPEGs from {folder} to {out} ({size:.1f} MiB)")
    if size > 60:
        raise SystemExit(f"{out} is {size:.0f} MiB: too big to carry (64 MiB in all).")


def decode_pack(pack: Path, out: Path) -> Path:
    """Decode a JPEG pack once into the {'images', 'labels', 'classes'} tensor file CIFAR10DataModule reads."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(sources.load_tensor_file(pack), out)  # sources decodes a pack (decode_jpeg_pack)
    return out


def pct(values) -> list[float]:
    return [100 * v for v in values]


def figure(label: str, values: list[float], fmt: str = "{:.3f}", unit: str = " s") -> str:
    """One report line: '- label: mean ± std (min–max, n runs)'."""
    return f"- {label}: {verdict.spread(values, fmt, unit)}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows], ""]


def guarded(report: results.Report, key: str, head: list[str], fn):
    """Run one part; a failure goes into its section (traceback tail) and the next part still runs."""
    try:
        return fn()
    except Exception:  # noqa: BLE001  a GPU-only failure must not cost the other parts' figures
        report.set(key, head + ["", f"FAILED:\n```\n{traceback.format_exc()[-2500:]}\n```"])
        print(traceback.format_exc(), file=sys.stderr)
        return []


def part_a(args, dm, report, deadline, dry) -> list[dict]:
    root = airbench_carry.write_data(dm.train_set.images, dm.train_set.labels, dm.test_set.images,
                                     dm.test_set.labels, dm.classes, config.build_dir() / "capstone" / "airbench")
    counts = airbench_carry.check_data(root)
    head = ["## (a) airbench94 itself", "",
            f"airbench {airbench_carry.VERSION} (`train94`, its hyperparameters: batch 1024, 9.9 epochs, fp16 "
            f"weights with fp32 BatchNorm, TTA level 2) on {root}/train.pt and test.pt: the course's "
            f"{counts['train']:,} training and {counts['test']:,} test images, in CifarLoader's format. Time: "
            f"airbench's own CUDA-event total (whitening + training + TTA), printed by train94."]
    if dry:
        report.set("a", head + ["", "- dry run: not run (airbench's make_net94 and timing are CUDA-only); its data "
                                "files were written and read back as its CifarLoader reads them"])
        return []
    airbench = airbench_carry.import_airbench(args.carry)

    def show(trials):
        report.set("a", head + table(["seed", "test accuracy (TTA)", "printed by train94", "time"], [
            [str(r["seed"]), f"{r['acc']:.2%}", f"{r['printed_acc']:.4f}", f"{r['time_s']:.3f} s"] for r in trials]) + [
            figure("accuracy", pct(r["acc"] for r in trials), "{:.2f}", " %"),
            figure("time", [r["time_s"] for r in trials])])

    report.set("a", head + ["", "(running)"])
    return airbench_carry.run(airbench, config.build_dir() / "capstone" / "airbench", args.seeds_list, deadline,
                              on_run=show)


def part_b(module, dm, report, *, seeds, epochs, precision, deadline, head, key="b") -> list[experiments.SeedRun]:
    def show(trials):
        recipe = module.recipe
        last = trials[-1].epoch_s
        flops = experiments.flop_summary(widths=recipe.widths, batch_size=recipe.batch_size,
                                         steps=len(dm.train_dataloader()), epoch_s=statistics.median(last[1:] or last))
        report.set(key, head + table(
            ["seed", "test accuracy (TTA)", "trainer.fit (whitening + training)", "trainer.test (TTA)", "total",
             "training epochs only"],
            [[str(r.seed), f"{r.acc:.2%}"] + [f"{s:.3f} s" for s in (r.fit_s, r.test_s, r.total_s, r.train_s)]
             for r in trials]) + [
            figure("accuracy", pct(r.acc for r in trials), "{:.2f}", " %"),
            figure("time (fit + test)", [r.total_s for r in trials]),
            figure("trainer.fit", [r.fit_s for r in trials]), figure("trainer.test", [r.test_s for r in trials]),
            f"- {flops.text} (median epoch after the first, last run)"])

    # warm-up seed 1000: compilation, cuDNN autotuning
    trials = experiments.seed_runs(module, dm, seeds=seeds, epochs=epochs, precision=precision, warmup_seed=1000,
                                   deadline=deadline, on_run=show)
    if len(trials) < len(seeds):
        report.set(key, report.sections.get(key, head) + [f"- time budget spent after {len(trials)} runs"])
    return trials


def part_c(module, dm, report, *, trials, epochs, precision, deadline, head) -> list[experiments.TwinComparison]:
    torch.manual_seed(1000)  # warm-up twin: compiles its graphs, so the timed runs exclude compilation
    twin = Twin(models.AirNet(module.recipe.widths), module.recipe)  # compiled once
    twin.fit(dm.train_dataloader(), epochs, precision)
    speedrun.evaluate_tta(twin.forward, dm.test_set.images, dm.test_set.labels, batch_size=dm.batching.eval_batch_size,
                          precision=precision)
    def show(twins):
        report.set("c", head + table(
            ["seed", "twin accuracy (TTA)", "Lightning accuracy", "twin total", "Lightning total",
             "Lightning / twin epoch (median, epochs 1+)", "largest loss difference, first 10 steps"],
            [[str(t.seed), f"{t.twin_acc:.2%}", f"{t.lit_acc:.2%}", f"{t.twin_total_s:.3f} s",
              f"{r.total_s:.3f} s", f"{t.ratio:.3f}x", f"{t.loss_diff_first:.2e}"]
             for t, r in zip(twins, trials)]) + [
            figure("accuracy", pct(t.twin_acc for t in twins), "{:.2f}", " %"),
            figure("time (whitening + training + TTA)", [t.twin_total_s for t in twins]),
            figure("Lightning / twin epoch time (target <= 1.05x)", [t.ratio for t in twins], unit="x")])

    twins = experiments.seed_loop(
        lambda run: experiments.compare_twin(module, dm, run, epochs=epochs, precision=precision, twin=twin), trials,
        deadline=deadline, on_run=show)
    if len(twins) < len(trials):
        report.set("c", report.sections.get("c", head) + [f"- time budget spent after {len(twins)} runs"])
    return twins


def part_e(args, dm, report, *, deadline, dry, widths, batch, epochs) -> list[dict]:
    """airbench94_muon itself on (a)'s data files; in a dry run its port, on the CPU, at the dry run's size."""
    head = ["## (e) airbench94_muon itself", "",
            f"{airbench_carry.MUON_FILE} at commit {airbench_carry.MUON_COMMIT[:7]} ({airbench_carry.MUON_URL}): "
            f"batch 2000, 8 epochs, Muon on the conv filters (Newton-Schulz in bf16), fp16 weights with fp32 "
            f"BatchNorm, TTA level 2, compiled ({args.muon_compile}); on (a)'s train.pt and test.pt. Time: its own "
            f"CUDA-event total (whitening + training + TTA), printed by main()."]

    def show(trials):
        report.set("e", head + table(["seed", "test accuracy (TTA)", "time"], [
            [str(r["seed"]), f"{r['acc']:.2%}", f"{r['time_s']:.3f} s"] for r in trials]) + [
            figure("accuracy", pct(r["acc"] for r in trials), "{:.2f}", " %"),
            figure("time", [r["time_s"] for r in trials])])

    if not dry:
        ab = airbench_carry.import_muon(args.carry)
        report.set("e", head + ["", "(running)"])
        return airbench_carry.run_muon(ab, config.build_dir() / "capstone" / "airbench", args.seeds_list, deadline,
                                       on_run=show, compile_mode=args.muon_compile)
    head[-1] = (f"Dry run: airbench94_muon's loop is CUDA-only, so its port (scripts/ports/airbench_muon_port.py) "
                f"trains instead, on the CPU: widths {widths}, batch {batch}, {epochs} epochs, fp32, "
                f"{muon.describe(muon.iteration_dtype('cpu'))}. Time: whitening + training + TTA.")
    trials = []
    for seed in args.seeds_list:
        torch.manual_seed(seed)
        train = airbench_port.Loader(dm.train_set.images, dm.train_set.labels, batch, train=True,
                                     aug=airbench_muon_port.HYP["aug"])
        test = airbench_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False)
        out = airbench_muon_port.train(train, test, epochs, widths, ns_dtype=muon.iteration_dtype("cpu"))
        trials.append({"seed": seed, "acc": out["acc"], "time_s": out["time_s"], "steps": out["steps"]})
        show(trials)
    return trials


def part_g(dm, report, *, seeds, deadline, gpu, widths, batch, epochs) -> list[dict]:
    """hiverge's record loop (its port) on the course's images: fp16 + channels_last on a GPU, fp32 on a CPU."""
    dtype, device = (torch.float16, "cuda") if gpu else (torch.float32, "cpu")
    head = ["## (g) hiverge's record (its port)", "",
            f"scripts/ports/hiverge_port.py (cifar10_speedrun.py at 5cd49b1, github.com/hiverge/cifar10-speedrun): "
            f"widths {widths}, batch {batch}, {epochs} epochs, {str(dtype).removeprefix('torch.')} weights"
            f"{', channels_last' if gpu else ''}, Newton-Schulz in the same dtype, selective TTA on the least "
            f"confident quarter; not compiled. Time: whitening + training + TTA, after one untimed warm-up run."]
    timer, trials = timing.DeviceTimer(device), []

    def one(seed):
        torch.manual_seed(seed)
        train = hiverge_port.Loader(dm.train_set.images, dm.train_set.labels, batch, train=True, dtype=dtype)
        test = hiverge_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False, dtype=dtype)
        return hiverge_port.train(train, test, epochs, widths, ns_dtype=dtype, timer=timer, dtype=dtype,
                                  channels_last=gpu)

    if gpu:
        one(1000)  # warm-up: cuDNN autotuning, allocator
    for seed in seeds:
        if time.monotonic() > deadline:
            head.append(f"- time budget spent after {len(trials)} runs")
            break
        out = one(seed)
        trials.append({"seed": seed, "acc": out["acc"], "time_s": out["time_s"], "steps": out["steps"]})
        report.set("g", head + table(["seed", "test accuracy (selective TTA)", "time"], [
            [str(r["seed"]), f"{r['acc']:.2%}", f"{r['time_s']:.3f} s"] for r in trials]) + [
            figure("accuracy", pct(r["acc"] for r in trials), "{:.2f}", " %"),
            figure("time", [r["time_s"] for r in trials])])
    return trials


def muon_summary(report, e, f, key="muon", names=("the course (f)", "airbench94_muon (e)"), rung="Muon") -> None:
    """A course rung (f, h) against its original (e, g): time and accuracy by the course's rule."""
    lines = [f"## {rung[0].upper() + rung[1:]} comparison", ""]
    if e and f:
        times = [r.total_s for r in f], [r["time_s"] for r in e]
        accs = pct(r.acc for r in f), pct(r["acc"] for r in e)
        took = verdict.compare(*times, *names, higher_is_better=False)
        acc = verdict.difference(*accs, *names, unit=" pt")
        lines += [f"- time: {took}", f"  - {took.detail}", f"- accuracy: {acc}", f"  - {acc.detail}"]
    if f:
        reached = "reached" if statistics.mean(pct(r.acc for r in f)) >= 94 else "not reached"
        lines.append(f"- 94 % on the held-out images: {reached} by the course's {rung} rung")
    report.set(key, lines)


def summary(report, a, b, c) -> None:
    ratio, diff = verdict.mean_ratio, verdict.mean_diff
    b_acc, b_time = pct(r.acc for r in b), [r.total_s for r in b]
    a_acc, a_time = pct(r["acc"] for r in a), [r["time_s"] for r in a]
    c_acc, c_time = pct(t.twin_acc for t in c), [t.twin_total_s for t in c]
    lines = ["## Comparison", "", "Ratios of mean times to a tested net and differences of mean accuracy:", ""]
    if a and b:
        lines += [f"- time, Lightning recipe (b) / airbench94 (a): {ratio(a_time, b_time)}",
                  f"- accuracy, (b) - (a): {diff(a_acc, b_acc, unit=' pt')}"]
    if c:
        lines += [f"- time, Lightning (b) / plain twin (c): {ratio(c_time, b_time[:len(c)])}",
                  f"- accuracy, (b) - (c): {diff(c_acc, b_acc[:len(c)], unit=' pt')}"]
    if a and c:
        lines.append(f"- time, plain twin (c) / airbench94 (a): {ratio(a_time, c_time)}")
    if b:
        reached = "reached" if statistics.mean(b_acc) >= 94 else "not reached"
        lines.append(f"- 94 % on the held-out images: {reached} by the course's recipe "
                     f"(mean {statistics.mean(b_acc):.2f} %)")
    report.set("summary", lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="pack from --make-data, JPEG folder (<folder>/train/<class>/*.jpg) or tensor cache "
                                  "(default: COURSE_DATA)")
    p.add_argument("--make-data", type=Path, help="write the JPEG pack here (and the airbench package) and exit")
    p.add_argument("--airbench-sdist", type=Path, help="with --make-data: airbench's sdist, unpacked into --carry")
    p.add_argument("--airbench-muon", type=Path, help="with --make-data: airbench94_muon.py (MUON_URL), into --carry")
    p.add_argument("--muon-compile", default="max-autotune", help="airbench94_muon's torch.compile mode (its own)")
    p.add_argument("--carry", type=Path, default=ROOT / "build" / "carry", help="folder holding airbench/ (carried)")
    p.add_argument("--seeds", type=int, default=5, help="timed runs per part")
    p.add_argument("--epochs", type=float, default=speedrun.EPOCHS)
    p.add_argument("--budget", type=float, default=540, help="seconds for the whole script; (d) uses what is left")
    p.add_argument("--dry-run", action="store_true",
                   help="smoke sizes (default without a GPU or at COURSE_SIZE=smoke)")
    args = p.parse_args()
    if args.make_data:
        make_data(Path(config.data_source(args.data, need_files=True)) / "train", args.make_data)
        if args.airbench_sdist:
            print(f"airbench package in {airbench_carry.carry_package(args.airbench_sdist, args.carry)}")
        if args.airbench_muon:
            print(f"airbench94_muon in {airbench_carry.carry_muon(args.airbench_muon, args.carry)}")
        return 0
    t0 = time.monotonic()
    deadline = t0 + args.budget
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # no per-run banner
    gpu = hardware.gpu_count() > 0
    dry = args.dry_run or not gpu or config.run_size().name == "smoke"
    source = Path(config.data_source(args.data, need_files=True))
    if isinstance(open_source(source, data_dir=config.data_root()), ImageFolderSource):  # pack it, as --make-data
        # does, then use the pack
        pack = config.build_dir() / "capstone" / "pack.pt"
        make_data(source / "train", pack)
        source = pack
    if sources.is_jpeg_pack(source):
        decoded = f"cifar10-train-{source.stat().st_size}.pt"  # named by the pack's size: a new pack decodes anew
        source = decode_pack(source, config.build_dir() / "capstone" / decoded)
    size = config.run_size("08_capstone", gpu=not dry, size="smoke" if dry else None)  # lesson 08's scale
    widths = tuple(round(w * size.width) for w in models.WIDTHS)
    batch, subset, eval_subset = size.batch_size, size.train_subset, size.eval_subset
    # the dry run trains a fractional number of epochs, as airbench94's 9.9 does, so that path runs too
    epochs, args.seeds_list = (size.epochs - 0.5, [0, 1]) if dry else (args.epochs, list(range(args.seeds)))
    precision = hardware.choose_precision()  # the course's policy: bf16 where native
    torch.backends.cudnn.benchmark = gpu
    with timing.Stopwatch("cuda" if gpu else "cpu") as load:  # until the split is on the device
        dm = runs.datamodule(kind="speedrun", image_folder=str(source), batch_size=batch, subset=subset,
                             eval_subset=eval_subset, seed=0, device="cuda" if gpu else "cpu")
        dm.prepare_data()
        dm.setup("fit")
    info = hardware.facts()
    out = results.report_path("gpu_capstone", None if dry else info["gpu"], suffix="-capstone")
    report = results.Report(out, f"Lesson 08 capstone on {hardware.label(info)}{' (dry run)' if dry else ''}",
                            order=ORDER, info=info)
    steps = speedrun.total_steps(epochs, len(dm.train_dataloader()))
    report.set("setup", [
        f"Data: {args.data or source}; train {len(dm.train_set):,} / test {len(dm.test_set):,} images: the seed-0 "
        f"split of the 50,000 training JPEGs (no validation), the same images for (a), (b) and (c); airbench's own "
        f"benchmark uses 50,000 + the official 10,000 test images. AirNet{widths}, batch {batch}, {epochs} epochs "
        f"({steps} steps), TTA level 2; course: {precision}, channels_last and compile {gpu and not dry}. "
        f"Data loading ({load.seconds:.1f} s) and warm-up runs are not in the times. {len(args.seeds_list)} timed runs "
        f"per part, seeds {args.seeds_list}; budget {args.budget:.0f} s.", ""])
    a = guarded(report, "a", ["## (a) airbench94 itself"], lambda: part_a(args, dm, report, deadline, dry))
    module = speedrun.SpeedrunModule(speedrun.Recipe(widths=widths, batch_size=batch, channels_last=gpu and not dry,
                                                     compile=gpu and not dry))
    b_head = ["## (b) the course's SpeedrunModule (Lightning)", "",
              "Timed by experiments.run_seed on CUDA events: trainer.fit (whitening + training) + trainer.test (TTA)."]
    b = guarded(report, "b", b_head, lambda: part_b(module, dm, report, seeds=args.seeds_list, epochs=epochs,
                                                    precision=precision, deadline=deadline, head=b_head))
    c_head = ["## (c) the plain-PyTorch twin", "",
              "twin.Twin.fit per seed of (b), same batches and initial weights (experiments.compare_twin), "
              "timed the same way: whitening + training, then TTA."]
    c = guarded(report, "c", c_head, lambda: part_c(module, dm, report, trials=b, epochs=epochs,
                                                    precision=precision, deadline=deadline, head=c_head))
    guarded(report, "summary", ["## Comparison"], lambda: summary(report, a, b, c))
    # the Muon rung, after airbench94's: airbench94_muon's batch and epochs on a GPU, the dry run's size otherwise
    m_batch, m_epochs = (batch, epochs) if dry else (speedrun.MUON.batch_size, speedrun.MUON.epochs)
    e = guarded(report, "e", ["## (e) airbench94_muon itself"], lambda: part_e(
        args, dm, report, deadline=deadline, dry=dry, widths=widths, batch=m_batch, epochs=m_epochs))

    def course_rung(key: str, base: speedrun.Recipe, name: str, batch_size: int, rung_epochs: float, note: str = ""):
        """One course rung timed as (b): base's recipe at this run's widths and batch, compiled on a GPU only."""
        recipe = dataclasses.replace(base, widths=widths, batch_size=batch_size, channels_last=gpu and not dry,
                                     compile=gpu and not dry)
        head = [f"## ({key}) the course's {name} rung (SpeedrunModule with speedrun.{name.upper()})", "",
                f"Timed as (b). {muon.describe(muon.iteration_dtype('cuda' if gpu else 'cpu'))}{note}."]
        return guarded(report, key, head, lambda: part_b(speedrun.SpeedrunModule(recipe), dm, report,
                                                         seeds=args.seeds_list, epochs=rung_epochs,
                                                         precision=precision, deadline=deadline, head=head, key=key))

    f = course_rung("f", speedrun.MUON, "Muon", m_batch, m_epochs)
    guarded(report, "muon", ["## Muon comparison"], lambda: muon_summary(report, e, f))
    # the record rung: hiverge's batch and epochs on a GPU, the dry run's size otherwise
    r_batch, r_epochs = (batch, epochs) if dry else (speedrun.RECORD.batch_size, speedrun.RECORD.epochs)
    g = guarded(report, "g", ["## (g) hiverge's record (its port)"], lambda: part_g(
        dm, report, seeds=args.seeds_list, deadline=deadline, gpu=gpu and not dry, widths=widths, batch=r_batch,
        epochs=r_epochs))
    h = course_rung("h", speedrun.RECORD, "record", r_batch, r_epochs, "; selective TTA")
    guarded(report, "record", ["## Record comparison"], lambda: muon_summary(
        report, g, h, key="record", names=("the course (h)", "hiverge's port (g)"), rung="record"))
    d_head = ["## (d) lessons 03-05 and 06's one-device row", ""]
    guarded(report, "d", d_head, lambda: lesson_checks.run(
        source, float("inf") if dry else deadline, dry, info, lambda lines: report.set("d", d_head + lines)))
    report.sections["setup"][0] += f" Whole script: {time.monotonic() - t0:.0f} s."
    report.set("setup", report.sections["setup"])
    print(out.read_text() + f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
