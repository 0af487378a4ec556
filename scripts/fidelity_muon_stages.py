"""The course's Muon rung against the port of airbench94_muon, seed by seed and stage by stage (issue 46): what each
side draws for a seed and what it trains from it, at a small size on a CPU, one thread.

    python -m scripts.fidelity_muon_stages --seeds 0 1 --subset 1000 --epochs 4

For each seed, on the same images (fidelity_muon_cpu.py's data):
  1. initial weights: each tensor's mean and std, the course's speedrun.fresh_weights against the port's
     make_model + reset under torch.manual_seed(seed);
  2. whitening: both filter banks from the same first 5,000 training images, each course filter matched to its
     nearest port filter (|cosine|, norm ratio): a permutation and signs, or not;
  3. the first two epochs' augmentation: share mirrored, epoch 1 the complement of epoch 0, the shift histogram;
  4. one start, two loops: the port's training loop fed the course's whitened initial weights and the course's
     batches (its order and augmentation) against experiments.run_seed (Lightning): steps, LR per step, loss per
     epoch, largest per-step loss gap, accuracy with and without TTA; beside it the port against itself from the
     same start nudged by 1e-7 (the head weights), the size rounding alone reaches. Losses equal until rounding
     takes over mean the loops are equal, so a gap between independent runs comes from what each side draws
     (stages 1-3), not from how it trains. Run it with COURSE_HARDWARE=cpu-avx2 for an fp32 iteration on both sides
     (bf16 rounds each product to 8 bits, and the gaps grow from there).
Prints markdown; nothing is written.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path

import torch

from course_lib.data.data import to_float
from course_lib.training import experiments, muon, speedrun
from scripts.fidelity_cpu import datamodule
from scripts.ports import airbench_muon_port as port
from scripts.ports import airbench_port

ROOT = Path(__file__).resolve().parents[1]


def port_name(name: str) -> str:
    """AirNet's state-dict key as CifarNet's: groups.i. -> layers.(i+1)."""
    if name.startswith("groups."):
        i, rest = name.split(".", 2)[1:]
        return f"layers.{int(i) + 1}.{rest}"
    return name


def course_net(recipe, seed: int):
    module = speedrun.SpeedrunModule(recipe)
    speedrun.fresh_weights(module, seed)
    return module


def port_net(widths, seed: int):
    torch.manual_seed(seed)  # as fidelity_muon_cpu.run_port, then train(): make_model, reset
    model = port.make_model(widths)
    model.reset()
    return model


def stage_init(recipe, widths, seed: int) -> list[str]:
    ours = course_net(recipe, seed).net.state_dict()
    theirs = port_net(widths, seed).state_dict()
    lines = [f"| {seed} | tensor | course mean | port mean | course std | port std |", "|---|---|---|---|---|---|"]
    for name, t in ours.items():
        if not t.is_floating_point() or "running" in name or name == "whiten.weight":
            continue
        u = theirs[port_name(name)]
        if t.std() == u.std() == 0 and t.mean() == u.mean():  # BatchNorm's constant scale 1 and bias 0 on both
            continue
        lines.append(f"| | {name} | {t.mean():.4f} | {u.mean():.4f} | {t.std():.4f} | {u.std():.4f} |")
    return lines


def stage_whitening(recipe, widths, dm) -> str:
    net = course_net(recipe, 0).net
    speedrun.whiten_from(net, dm.train_set.images, recipe)
    model = port_net(widths, 0)
    loader = airbench_port.Loader(dm.train_set.images, dm.train_set.labels, 100, train=True)
    model.init_whiten(loader.normalize(loader.images[:5000]))
    a = net.whiten.weight.reshape(24, -1).double()
    b = model.whiten.weight.reshape(24, -1).double()
    cos = (a / a.norm(dim=1, keepdim=True)) @ (b / b.norm(dim=1, keepdim=True)).T  # (24, 24)
    best = cos.max(1)  # both banks hold +/- pairs: every filter has a same-sign twin on the other side
    match = best.indices
    ratio = a.norm(dim=1) / b[match].norm(dim=1)
    return (f"whitening from the same {min(5000, len(dm.train_set)):,} images: each course filter's nearest port "
            f"filter has cosine {best.values.min():.6f} to {best.values.max():.6f}, norm ratio "
            f"{ratio.min():.5f} to {ratio.max():.5f}; a permutation of the port's: "
            f"{sorted(match.tolist()) == list(range(24))} (at the same position: "
            f"{(match == torch.arange(24)).sum().item()} of 24)")


def recover(out: torch.Tensor, padded: torch.Tensor, r: int) -> torch.Tensor:
    """Per image: the (dy, dx) crop of `padded` that reproduces `out` (-1 where none does)."""
    size = out.shape[-1]
    found = torch.full((len(out),), -1)
    for k, (sy, sx) in enumerate((sy, sx) for sy in range(2 * r + 1) for sx in range(2 * r + 1)):
        same = (padded[:, :, sy:sy + size, sx:sx + size] - out).abs().amax((1, 2, 3)) < 1e-6
        found[same & (found < 0)] = k
    return found


def stage_augmentation(dm, seed: int, batch: int, widths) -> list[str]:
    """Share mirrored per epoch, epoch 1 the complement, shift histogram: the course's AlternatingFlipTranslate draw
    and the port's Loader (recovered from its batches against its pre-padded images)."""
    n, r = len(dm.train_set), 2
    dm.batching.shuffle_seed = seed
    batches = dm.train_dataloader()
    aug = batches.augment
    course = []
    for epoch in (0, 1):
        shifts = aug.shifts(epoch)  # this epoch's table, as the batches draw it
        course.append((aug.flips(epoch), shifts[0] * (2 * r + 1) + shifts[1]))
    port_net(widths, seed)  # the global generator's draws before the loader's, as in train()
    loader = airbench_port.Loader(dm.train_set.images, dm.train_set.labels, batch, train=True,
                                  aug=port.HYP["aug"], altflip=True)
    theirs, real = [], torch.randperm

    def seen(*a, **k):  # the loader's epoch order, drawn as it draws it
        orders.append(real(*a, **k))
        return orders[-1]

    for _ in (0, 1):
        orders = []
        torch.randperm = seen
        try:
            got = torch.cat([x for x, _ in loader])
        finally:
            torch.randperm = real
        idx = orders[0][:len(got)]
        norm = loader.proc["norm"][idx]
        padded = torch.nn.functional.pad(norm, (r,) * 4, "reflect")
        plain, mirrored = recover(got, padded, r), recover(got, padded.flip(-1), r)
        flips = torch.zeros(n, dtype=torch.bool)
        shifts = torch.full((n,), -1)
        flips[idx] = (plain < 0) & (mirrored >= 0)
        shifts[idx] = torch.where(plain >= 0, plain, mirrored)  # the crop's offset in the mirrored image's frame
        theirs.append((flips, shifts, idx))
    lines = ["| side | epoch | mirrored | complement of epoch 0 | shift counts (dy, dx) in -2..2, row-major | "
             "recovered |", "|---|---|---|---|---|---|"]
    for side, rows in (("course", course), ("port", theirs)):
        for epoch, row in enumerate(rows):
            flips, shifts = row[0], row[1]
            seen = row[2] if len(row) > 2 else torch.arange(n)
            comp = (flips[seen] == ~rows[0][0][seen]).float().mean().item() if epoch else float("nan")
            hist = torch.bincount(shifts[seen].clamp_min(0), minlength=25).tolist()
            lines.append(f"| {side} | {epoch} | {flips[seen].float().mean():.3f} | {comp:.3f} | "
                         f"{' '.join(map(str, hist))} | {(shifts[seen] >= 0).float().mean():.3f} |")
    return lines


class CourseBatches:
    """The course's DeviceBatches as the port's Loader: train() sets .epoch, iterates, whitens from .images."""

    def __init__(self, batches):
        self.batches, self.epoch, self.batch_size = batches, 0, batches.batch_size
        self.images = batches.images.float() / 255
        self.normalize = lambda x: to_float(x * 255)

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        self.batches.set_epoch(self.epoch)
        self.epoch += 1
        return iter(self.batches)


def stage_one_start(recipe, dm, seed: int, epochs: int) -> list[str]:
    """Lightning's run against the port's loop from the course's start and batches."""
    module = course_net(recipe, seed)
    start = copy.deepcopy(module.net)
    speedrun.whiten_from(start, dm.train_set.images, recipe)
    state = {port_name(k): v for k, v in start.state_dict().items() if k != "whitened"}
    lrs = []
    orig_step = muon.Muon.step

    def spy(self, closure=None):  # the LR of each group, every step
        lrs.append([g["lr"] for g in self.param_groups])
        return orig_step(self, closure)

    muon.Muon.step = spy
    try:
        run = experiments.run_seed(module, dm, seed=seed, epochs=epochs, precision="32-true")
    finally:
        muon.Muon.step = orig_step
    plain = speedrun.evaluate_tta(module.net, dm.test_set.images, dm.test_set.labels, level=0, precision="32-true")
    dm.batching.shuffle_seed = seed
    train = CourseBatches(dm.train_dataloader())
    test = airbench_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False)
    plrs = []
    orig_sgd = torch.optim.SGD.step

    def spy_sgd(self, *a, **k):
        plrs.append([g["lr"] for g in self.param_groups])
        return orig_sgd(self, *a, **k)

    torch.optim.SGD.step = spy_sgd
    try:
        out = port.train(train, test, epochs, recipe.widths, ns_dtype=muon.iteration_dtype("cpu"),
                         init=lambda m: m.load_state_dict(state))
    finally:
        torch.optim.SGD.step = orig_sgd

    def nudged(m):  # the same start with the head weights x (1 + 1e-7): how fast rounding-sized gaps grow
        m.load_state_dict(state)
        with torch.no_grad():
            m.head.weight.mul_(1 + 1e-7)

    graded = port.make_model(recipe.widths)  # the course's trained net, graded by the port's evaluate
    graded.load_state_dict({port_name(k): v for k, v in module.net.state_dict().items() if k != "whitened"})
    by_port = [airbench_port.evaluate(graded, test, tta_level=level) for level in (2, 0)]
    dm.batching.shuffle_seed = seed
    again = port.train(CourseBatches(dm.train_dataloader()), test, epochs, recipe.widths,
                       ns_dtype=muon.iteration_dtype("cpu"), init=nudged)
    per = len(train)
    ce, pe = run.losses.split(per), out["losses"].split(per)
    diff = (run.losses - out["losses"]).abs() if len(run.losses) == len(out["losses"]) else torch.tensor([float("nan")])
    floor = (again["losses"] - out["losses"]).abs()
    # LR per step: course groups (filters, head, BN biases, whitening bias) x batch / summed-loss scale; port (whitening
    # bias, BN biases, head) from its SGD, its Muon's filter LR by the same linear decay as the head's
    scale = recipe.batch_size
    course_lr = torch.tensor([[g[1] / scale, g[2] / scale, g[3] / scale] for g in lrs])
    port_lr = torch.tensor([[g[2], g[1], g[0] if i < len(plrs) else 0] for i, g in enumerate(plrs)])
    m = min(len(course_lr), len(port_lr))
    bias_steps = recipe.whiten_bias_epochs * per
    lr_gap = (course_lr[:m, :2] - port_lr[:m, :2]).abs().max().item()
    wb_gap = (course_lr[:min(m, bias_steps), 2] - port_lr[:min(m, bias_steps), 2]).abs().max().item()
    return [f"| {seed} | {run.steps} / {out['steps']} | {lr_gap:.1e} / {wb_gap:.1e} | "
            f"{' '.join(f'{a.mean():.4f}' for a in ce)} | {' '.join(f'{b.mean():.4f}' for b in pe)} | "
            f"{diff[:per].max():.1e} / {diff.max():.1e} | "
            f"{floor[:per].max():.1e} / {floor.max():.1e} | "
            f"{100 * run.acc:.2f} / {100 * out['acc']:.2f} / {100 * again['acc']:.2f} | "
            f"{100 * plain:.2f} / {100 * out['acc_no_tta']:.2f} / {100 * again['acc_no_tta']:.2f} | "
            f"{100 * by_port[0]:.2f} / {100 * by_port[1]:.2f} |"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--data", help="JPEG folder (default: the course's data source)")
    p.add_argument("--subset", type=int, default=1000)
    p.add_argument("--test-subset", type=int, default=1000)
    p.add_argument("--widths", type=int, nargs=3, default=(16, 32, 32))
    p.add_argument("--batch", type=int, default=125)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--stages", default="1234", help="which stages to run, e.g. 4")
    args = p.parse_args()
    torch.set_num_threads(1)
    dm = datamodule(args)
    recipe = dataclasses.replace(speedrun.MUON, widths=tuple(args.widths), batch_size=args.batch)
    print(f"{len(dm.train_set):,} training / {len(dm.test_set):,} test images, widths {tuple(args.widths)}, batch "
          f"{args.batch}, {args.epochs} epochs, fp32, Newton-Schulz in {muon.iteration_dtype('cpu')}\n")
    if "1" in args.stages:
        print("## 1. Initial weights (per seed: the course's fresh_weights, the port's make_model + reset)\n")
        for seed in args.seeds:
            print("\n".join(stage_init(recipe, tuple(args.widths), seed)), "\n")
    if "2" in args.stages:
        print("## 2. Whitening\n\n" + stage_whitening(recipe, tuple(args.widths), dm) + "\n")
    if "3" in args.stages:
        print("## 3. Augmentation, epochs 0 and 1\n")
        for seed in args.seeds:
            print(f"seed {seed}:\n\n" + "\n".join(stage_augmentation(dm, seed, args.batch, tuple(args.widths))) + "\n")
    if "4" in args.stages:
        print("## 4. One start, two loops: Lightning (course) / the port's loop on the course's weights and batches\n")
        print("| seed | steps | largest LR gap: head and BN biases / whitening bias (its steps) | course loss per "
              "epoch | port loss per epoch | largest per-step loss gap: epoch 0 / all | the port against itself with "
              "the head x (1 + 1e-7): epoch 0 / all | TTA accuracy %: course / port / port nudged | without TTA % "
              "| the course's net graded by the port's evaluate: TTA / without % |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for seed in args.seeds:
            print("\n".join(stage_one_start(recipe, dm, seed, args.epochs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
