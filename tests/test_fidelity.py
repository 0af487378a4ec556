"""The course's recipe is airbench94's: piece by piece against a port of airbench94 (scripts/ports/airbench_port.py),
and a whole training run on the same batches from the same initial weights. docs/results/fidelity-cpu.md compares the
two statistically, with augmentation and at a larger size."""
import math

import pytest
import torch

from course_lib.data.data import to_float
from course_lib.training import optim, speedrun
from course_lib.training.models import AirNet, init_whitening
from course_lib.training.speedrun import Recipe
from course_lib.training.twin import Twin
from scripts.ports import airbench_port as ab

SMALL = (8, 16, 16)


def course_state(port) -> dict:
    """The port's state dict (or any dict of its names) under AirNet's names: 0 -> whiten, 2/3/4 -> groups.0/1/2,
    7 -> head."""
    rename = {"0": "whiten", "2": "groups.0", "3": "groups.1", "4": "groups.2", "7": "head"}
    items = port.items() if isinstance(port, dict) else port.state_dict().items()
    return {rename[k.split(".", 1)[0]] + "." + k.split(".", 1)[1]: v for k, v in items}


def assert_same_state(net: AirNet, port: torch.nn.Module, skip=("whitened",), **tol) -> None:
    mine, theirs = net.state_dict(), course_state(port)
    assert set(mine) - set(skip) == set(theirs) - set(skip)
    for k in set(theirs) - set(skip):
        if tol:
            torch.testing.assert_close(mine[k], theirs[k], msg=k, **tol)
        else:
            assert torch.equal(mine[k], theirs[k]), k


def test_same_seed_same_initial_weights_and_layers():
    """AirNet draws its initial weights exactly as airbench's make_net94 (bias of the whitening conv zero, dirac
    filters, BatchNorm eps 1e-12 and momentum 0.4, scale 1 frozen), so one seed gives identical nets and logits."""
    torch.manual_seed(0)
    port = ab.make_net(SMALL)
    torch.manual_seed(0)
    net = AirNet(SMALL)
    assert_same_state(net, port, skip=("whitened", "whiten.weight"))  # whitening filters: set from data later
    for a, b in zip([m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)],
                    [m for m in port.modules() if isinstance(m, torch.nn.BatchNorm2d)]):
        assert (a.eps, a.momentum, a.weight.requires_grad) == (b.eps, b.momentum, b.weight.requires_grad) == (
            1e-12, 0.4, False)
    trained = {k for k, p in net.named_parameters() if p.requires_grad}
    assert trained == {k for k, p in course_state(dict(port.named_parameters())).items() if p.requires_grad}
    net.whiten.weight.data.copy_(port[0].weight)  # airbench's Conv also dirac-inits its first 3 filters here
    x = torch.randn(4, 3, 32, 32)
    for train in (True, False):
        net.train(train), port.train(train)
        torch.testing.assert_close(net(x), port(x), rtol=1e-5, atol=1e-6)


def test_whitening_filters_match_airbench(real):
    """Uncentred patch covariance, largest eigenvalue first, scaled, +/- pairs: the same filters as airbench's up to
    the sign eigh happens to give each pair (which swaps a filter with its negative); the bias is zero."""
    images, _ = real
    net, port = AirNet(SMALL), ab.make_net(SMALL)
    init_whitening(net, to_float(images))
    ab.init_whitening_conv(port[0], to_float(images))
    mine, theirs = net.whiten.weight.flatten(1), port[0].weight.flatten(1)
    sign = (mine[:12] * theirs[:12]).sum(1).sign()[:, None]
    # airbench decomposes in fp32, the course in fp64: the filters of the smallest eigenvalues differ by up to ~1 %
    torch.testing.assert_close(mine[:12], sign * theirs[:12], rtol=2e-2, atol=2e-3 * theirs.abs().max().item())
    torch.testing.assert_close(mine[12:], -mine[:12])
    assert torch.equal(net.whiten.bias, torch.zeros(24))


@pytest.mark.parametrize("total", [7, 100, 189, 426])
def test_schedule_is_airbench_triangle(total):
    """lr_factor is airbench's triangle(total, start=0.2, end=0.07, peak=0.23) at every step."""
    ours = torch.tensor([optim.lr_factor(s, total) for s in range(total + 1)])
    torch.testing.assert_close(ours, ab.triangle(total, 0.2, 0.07, 0.23), rtol=1e-6, atol=1e-6)


def test_epochs_and_hyperparameters_are_airbench94s():
    """9.9 epochs -> ceil(steps x 9.9) steps; LR 1.5 and decay 1.996e-3 per mean loss are airbench's 11.5 and 0.0153
    divided by Nesterov's gain at momentum 0.85; label smoothing, bias scale, warm-up and TTA as airbench."""
    r, hyp = Recipe(), ab.HYP["opt"]
    assert speedrun.total_steps(speedrun.EPOCHS, 48) == math.ceil(48 * 9.9) == 476
    assert speedrun.total_steps(speedrun.EPOCHS, 43) == 426
    gain = 1 + 1 / (1 - hyp["momentum"])
    assert r.lr == pytest.approx(hyp["lr"] / gain) and r.weight_decay == pytest.approx(hyp["weight_decay"] / gain)
    assert (r.momentum, r.label_smoothing, r.bias_scale, r.whiten_bias_epochs, r.batch_size, r.tta_level) == (
        hyp["momentum"], hyp["label_smoothing"], hyp["bias_scaler"], hyp["whiten_bias_epochs"], hyp["batch_size"],
        ab.HYP["net"]["tta_level"])
    assert speedrun.EPOCHS == hyp["train_epochs"] and r.widths == ab.HYP["net"]["widths"]


def test_lookahead_matches_airbench_over_the_state_dict():
    """Lookahead pulls every float entry of the state dict (BatchNorm statistics included) as airbench's does."""
    torch.manual_seed(0)
    a, b = AirNet(SMALL), AirNet(SMALL)
    b.load_state_dict(a.state_dict())
    mine, theirs = optim.Lookahead(a), ab.LookaheadState(b)
    for decay in (0.0, 0.3, 0.9, 1.0):
        for net in (a, b):
            torch.manual_seed(1)
            net.train()(torch.randn(8, 3, 32, 32)).sum().backward()  # moves the BN running statistics
            with torch.no_grad():
                for p in net.parameters():
                    p.add_(torch.randn_like(p) * 0.01)
        mine.update(decay)
        theirs.update(b, decay)
        for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            torch.testing.assert_close(x, y, msg=k)
    assert not torch.equal(a.groups[0].norm1.running_mean, torch.zeros(16))


def test_tta_matches_airbench_weights(real):
    """Level 2 TTA: 1/2 plain-and-mirror, 1/4 each 1-px reflect-padded shift with its mirror, as airbench's infer."""
    images, _ = real
    net = AirNet(SMALL).eval()
    init_whitening(net, to_float(images))
    theirs = ab.infer(net, ab.Loader(images[:16], None, 16, train=False), tta_level=2)
    torch.testing.assert_close(speedrun.tta_logits(net, to_float(images[:16]), 2), theirs, rtol=1e-5, atol=1e-5)


class Replay(ab.Loader):
    """Recorded batches, epoch after epoch, for the port; the same list serves the course's twin."""

    def __init__(self, images, labels, batches):
        super().__init__(images, labels, len(batches[0][0][1]))
        self.recorded = batches

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.recorded[epoch])


class TwinReplay:
    """The same batches in DeviceBatches' shape for Twin.fit."""

    def __init__(self, images, batches):
        self.images, self.recorded, self.epoch = images, batches, 0
        self.batch_size = len(batches[0][0][1])

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return len(self.recorded[0])

    def __iter__(self):
        return iter(self.recorded[self.epoch])


@pytest.mark.parametrize("smoothing, bias_lr", [(0.2, 64.0), (0.0, 1.0)], ids=["airbench", "extras-off"])
def test_training_matches_airbench_step_for_step(real, smoothing, bias_lr):
    """Same batches, same initial weights and whitening: the course's twin (mean loss, LR 1.5 per 1024, decay as the
    shrink per step, BN biases at 64x, whitening bias trained from zero then frozen, a fractional last epoch) and
    the port (summed loss, airbench's decoupled LR and decay) give the same loss at every step and the same net;
    also with label smoothing and the BN-bias LR switched off, as fidelity_cpu.py's --extras off runs them."""
    images, labels = real[0][:48], real[1][:48]
    g = torch.Generator().manual_seed(0)
    x = to_float(images)
    batches = [[(x[i], labels[i]) for i in torch.randperm(48, generator=g).split(12)] for _ in range(3)]
    epochs, common = 2.5, dict(whiten_bias_epochs=1)  # 10 steps, the bias frozen after epoch 0
    torch.manual_seed(0)
    port = ab.train(Replay(images, labels, batches), ab.Loader(images, labels, 48, train=False), epochs, SMALL,
                    lookahead=False, label_smoothing=smoothing, bias_scaler=bias_lr, **common)
    torch.manual_seed(0)
    net = AirNet(SMALL)
    filters = ab.make_net(SMALL)[0]
    ab.init_whitening_conv(filters, to_float(images))  # airbench's filters (its signs), so the nets start equal
    net.whiten.weight.data.copy_(filters.weight)
    net.whitened.fill_(True)
    recipe = Recipe(SMALL, batch_size=12, lookahead_every=0, label_smoothing=smoothing, bias_scale=bias_lr, **common)
    twin = Twin(net, recipe).fit(TwinReplay(images, batches), epochs, "32-true")
    assert len(twin.losses) == len(port["losses"]) == 10 and port["losses"].std() > 1e-3
    torch.testing.assert_close(twin.losses, port["losses"], rtol=1e-4, atol=1e-5)
    assert_same_state(net, port["model"], rtol=1e-4, atol=1e-5)


def test_fidelity_report_groups_by_precision_and_pairs_own_against_fp32(tmp_path):
    """fidelity_cpu.py --report: rows of the two precisions are separate configurations, each side's own precision
    is compared with its fp32 rows, and fp32 settings keep the key-less form of the older runs."""
    import argparse
    import json

    from scripts import fidelity_cpu as fc
    base = dict(subset=100, test_subset=None, widths=[8, 16, 16], batch=32, epochs=1.0)
    args = argparse.Namespace(**base, precision="fp32")
    assert fc.settings(args) == base and fc.settings(argparse.Namespace(**base, precision="own"))["precision"] == "own"
    assert fc.PRECISIONS["own"][:2] == ("bf16-mixed", torch.float16)  # the course's policy; airbench's weights
    rows = [{"impl": impl, "extras": "on", "seed": seed, "acc": acc, "acc_no_tta": acc, "time_s": 1.0,
             "final_loss": 1.0, "settings": {**base, **({"precision": "own"} if own else {})}, "commit": "x",
             "command": "c"}
            for impl in ("course", "port") for own in (False, True) for seed, acc in ((0, 0.5), (1, 0.6 + own / 10))]
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = fc.report(runs, tmp_path / "out.md").read_text()
    own_label = fc.PRECISIONS["own"][2]
    assert text.count(f"epochs, {own_label} |") == 2 and text.count("epochs, fp32 |") == 2
    assert f"{own_label}, course, extras on, own precision - fp32: with TTA +5.00 pt" in text
    assert f"{own_label}, extras on, course - port: with TTA +0.00 pt" in text


def test_run_seeds_writes_one_row_per_seed(tmp_path, capsys):
    """fidelity_cpu.run_seeds, shared by both fidelity scripts: one JSON row per seed with the run's result, the
    settings and the extra fields, and one printed line per seed."""
    import argparse
    import json
    from types import SimpleNamespace

    from scripts import fidelity_cpu as fc
    args = argparse.Namespace(seeds=[0, 1], runs=tmp_path / "runs.jsonl", impl="port")
    dm = SimpleNamespace(train_set=range(10), test_set=range(4))
    fc.run_seeds(dm, args, lambda d, a, seed: {"acc": 0.5 + seed / 10, "acc_no_tta": 0.4, "time_s": 1.0},
                 {"epochs": 1}, label="port extras on", extras="on")
    rows = [json.loads(line) for line in args.runs.read_text().splitlines()]
    got = [(r["seed"], r["acc"], r["extras"], r["impl"]) for r in rows]
    assert got == [(0, 0.5, "on", "port"), (1, 0.6, "on", "port")]
    assert rows[0]["settings"] == {"epochs": 1} and (rows[0]["train_images"], rows[0]["test_images"]) == (10, 4)
    assert capsys.readouterr().out.count("port extras on seed") == 2
