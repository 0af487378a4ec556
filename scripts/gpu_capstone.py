"""Lesson 08 on a GPU: the final speedrun recipe over several seeds, and Lightning against its plain twin, offline.

    python scripts/gpu_capstone.py --make-data build/carry/cifar10-train-jpeg.pt  # here: 50,000 JPEGs in 45 MiB
    python scripts/gpu_capstone.py --data build/carry/cifar10-train-jpeg.pt       # on the GPU machine

The pack holds the training folder's JPEG files as bytes (raw uint8 images would be 146 MiB); the GPU machine decodes
them once into build/capstone/cifar10-train-<bytes>.pt, a tensor cache that CIFAR10DataModule reads, so the split
(45,000 train / 5,000 test, seed 0, no validation) is exactly the notebook's full-size split from the JPEG folder. Recipe: bf16-mixed,
channels_last, torch.compile, cudnn.benchmark, 10 epochs of batch 1024, TTA. One untimed warm-up run compiles the
net; the seeds then reuse the compiled net with fresh weights, so their times exclude data loading and compilation.
Expected to take a few minutes on an H200 (not yet measured). Writes docs/results/<gpu>-capstone.md; without a GPU
it does a tiny dry run of the same code and writes build/gpu_capstone-dryrun.md instead.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: no install needed (GPU machine)

from course_lib import config, experiments, models, speedrun
from course_lib.data import list_image_folder
from course_lib.ondevice import SpeedrunDataModule


def make_data(out: Path) -> None:
    """Pack the training folder's JPEG files, in CIFAR10DataModule's order, as bytes plus offsets and labels."""
    folder = Path(config.data_source() or config.shared_data_folder()) / "train"
    files, labels, classes = list_image_folder(folder)  # sorted by class, then file name: the cache's order
    blobs = [f.read_bytes() for f in files]
    offsets = torch.tensor([0] + [len(b) for b in blobs]).cumsum(0)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"jpeg": torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8), "offsets": offsets,
                "labels": torch.tensor(labels), "classes": classes}, out)
    size = out.stat().st_size / 2**20
    print(f"wrote {len(files)} JPEGs from {folder} to {out} ({size:.1f} MiB)")
    if size > 60:
        raise SystemExit(f"{out} is {size:.0f} MiB: too big to carry (64 MiB in all).")


def decode_pack(pack: Path, out: Path) -> Path:
    """Decode a --make-data pack once into the {'images', 'labels', 'classes'} tensor cache CIFAR10DataModule reads."""
    if out.exists():
        return out
    from torchvision.io import ImageReadMode, decode_jpeg

    data = torch.load(pack, weights_only=True)
    off = data["offsets"].tolist()
    images = decode_jpeg([data["jpeg"][a:b] for a, b in zip(off[:-1], off[1:])], mode=ImageReadMode.RGB)
    if any(img.shape != (3, 32, 32) for img in images):
        raise ValueError(f"{pack} holds images that are not 32x32 RGB; pack a CIFAR-10 folder.")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"images": torch.stack(images), "labels": data["labels"], "classes": data["classes"]}, out)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="pack from --make-data, image folder or tensor cache (default: COURSE_DATA)")
    p.add_argument("--make-data", type=Path, help="write the JPEG pack here and exit")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=10)
    args = p.parse_args()
    if args.make_data:
        make_data(args.make_data)
        return 0
    t0 = time.perf_counter()
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)  # no per-run banner
    gpu = torch.cuda.is_available()
    source = args.data or config.data_source()
    if source and source.endswith(".pt") and "jpeg" in torch.load(source, weights_only=True, mmap=True):
        decoded = f"cifar10-train-{Path(source).stat().st_size}.pt"  # named by the pack's size: a new pack decodes anew
        source = str(decode_pack(Path(source), config.build_dir() / "capstone" / decoded))
    # without a GPU: a dry run of the same code on a few images and a narrow net, so the script is testable anywhere
    widths, batch, subset, eval_subset = ((models.WIDTHS, 1024, None, None) if gpu
                                          else (tuple(w // 8 for w in models.WIDTHS), 64, 256, 256))
    epochs, seeds = (args.epochs, args.seeds) if gpu else (2, 2)
    precision = config.choose_precision()  # the course's policy: bf16 where native
    torch.backends.cudnn.benchmark = gpu
    start = time.perf_counter()
    dm = SpeedrunDataModule(image_folder=source, batch_size=batch, subset=subset, eval_subset=eval_subset,
                            seed=0, device="cuda" if gpu else "cpu")
    dm.prepare_data()
    dm.setup("fit")
    data_s = time.perf_counter() - start
    module = speedrun.SpeedrunModule(widths, batch, channels_last=gpu, compile=gpu)
    runs = experiments.seed_runs(module, dm, list(range(seeds)), epochs, precision, warmup_seed=1000)
    twin = experiments.compare_twin(module, dm, runs[-1], epochs, precision)
    flops = experiments.flop_summary(widths, batch, len(dm.train_dataloader()), twin["lit_epoch_s"])
    accs, train_s = [r["acc"] for r in runs], [r["train_s"] for r in runs]
    lines = [f"Data: {args.data or source}; train {len(dm.train_set):,} / test {len(dm.test_set):,} images (seed-0 "
             f"split of the JPEG training folder); AirNet{widths}, batch {batch}, {epochs} epochs, {precision}, "
             f"channels_last and compile {gpu}, TTA level 2. Data loading ({data_s:.1f} s) and an untimed warm-up "
             f"run (compilation) are not in the times below. Whole script: {time.perf_counter() - t0:.0f} s.", "",
             "| seed | test accuracy | training (epochs) | trainer.fit call | test with TTA |", "|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {r['acc']:.2%} | {r['train_s']:.2f} s | {r['fit_s']:.2f} s | {r['test_s']:.2f} s |"
              for r in runs]
    lines += ["", f"- accuracy {experiments.spread([100 * a for a in accs], unit=' %')}; 94 % "
              f"{'reached' if statistics.mean(accs) >= 0.94 else 'not reached'}",
              f"- training time {experiments.spread(train_s, unit=' s')}; trainer.fit call "
              f"{experiments.spread([r['fit_s'] for r in runs], unit=' s')}",
              f"- Lightning / plain twin epoch time: {twin['ratio']:.3f}x (median of epochs {twin['steady_from']}+, "
              f"target <= 1.05x); largest loss difference over the first {twin['first']} steps "
              f"{twin['loss_diff_first']:.2e}; test accuracy with TTA, seed {runs[-1]['seed']}: Lightning "
              f"{twin['lit_acc']:.2%}, twin {twin['twin_acc']:.2%}",
              f"- {flops['text']}"]
    info = config.hardware()
    # without a GPU this is only a dry run: keep it out of docs/, whose figures are GPU figures
    out = (Path("docs/results") / f"{info['gpu'].replace(' ', '_')}-capstone.md" if gpu
           else config.build_dir() / "gpu_capstone-dryrun.md")
    experiments.write_report(out, f"Lesson 08 capstone on {config.hardware_label(info)}", lines, info)
    print(out.read_text() + f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
