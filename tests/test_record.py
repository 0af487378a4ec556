"""The record rung (issue 46, part 2): hiverge's changes in course_lib against the same pieces of
scripts/ports/hiverge_port.py: the batched Newton-Schulz, the vectorised Muon with periodic rescaling and decay, the
jitter, the SiLU groups and selective TTA. No training: each piece on small tensors."""
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from course_lib.training import muon, speedrun, tta
from scripts.ports import hiverge_port as port

SHAPES = [(8, 24, 3, 3), (16, 8, 3, 3), (16, 16, 3, 3)]  # conv banks of a small AirNet, different sizes


def test_batched_newton_schulz_equals_one_matrix_at_a_time():
    """Zero padding stays zero: each bank's corner of the batched result is newton_schulz of that bank alone."""
    torch.manual_seed(0)
    mats = [torch.randn(s[0], s[1] * 9) for s in SHAPES] + [torch.randn(40, 12)]  # a tall one too
    stacked = muon.newton_schulz_batched(muon.pad_stack(mats))
    for m, out in zip(mats, stacked):
        torch.testing.assert_close(out[:m.size(0), :m.size(1)], muon.newton_schulz(m), atol=1e-5, rtol=1e-4)
        assert not out[m.size(0):].any() and not out[:, m.size(1):].any()


def test_normalize_due_is_hivergees_schedule():
    """Every 2 + int(15 x progress) steps since the last rescale, as cifar10_speedrun.py's Muon.step counts."""
    total, last, ours, theirs = 100, 0, [], []
    for step in range(1, total + 1):
        if muon.normalize_due(step, last, total, (2, 15.0)):
            ours.append(step)
            last = step
    last = 0
    for step in range(1, total + 1):
        if step - last >= 2 + int(15 * step / total):
            theirs.append(step)
            last = step
    assert ours == theirs and ours[:3] == [2, 4, 6] and all(muon.normalize_due(s, s - 1, 10, (1, 0)) for s in (1, 9))


def _banks(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for s in SHAPES]


def _step_together(opt_a, opt_b, a: list, b: list, *, steps: int, seed: int) -> None:
    """Step two optimisers over twin parameter lists with the same seeded random gradients."""
    for step in range(steps):
        g = torch.Generator().manual_seed(seed + step)
        for pa, pb in zip(a, b):
            pa.grad = torch.randn(pa.shape, generator=g)
            pb.grad = pa.grad.clone()
        opt_a.step(), opt_b.step()


@pytest.mark.parametrize("every", [(1, 0.0), (2, 15.0)])
def test_batched_muon_equals_the_loop(every):
    """batched=True changes the ops, not the update: the loop over banks and the padded stack agree step for step."""
    a, b = _banks(), _banks()
    kw = dict(lr=0.2, momentum=0.6, dtype=torch.float32, normalize_every=every, total_steps=6, filter_decay=1e-3)
    _step_together(muon.Muon(a, **kw), muon.Muon(b, batched=True, **kw), a, b, steps=6, seed=100)
    for pa, pb in zip(a, b):
        torch.testing.assert_close(pa, pb, atol=1e-5, rtol=1e-4)


def test_batched_muon_steps_as_hiverges():
    """speedrun.RECORD's filter group (coefficients, batched, rescale schedule, decay) against the port's Muon."""
    ours, theirs = _banks(1), _banks(1)
    r = speedrun.RECORD
    opt = muon.Muon(ours, lr=r.filter_lr, momentum=r.filter_momentum, dtype=torch.float32,
                    coefficients=r.ns_coefficients, batched=True, normalize_every=r.normalize_every, total_steps=8,
                    filter_decay=r.filter_decay * 100 / 1024)
    ref = port.Muon(theirs, lr=r.filter_lr, momentum=r.filter_momentum, total_train_steps=8,
                    weight_decay=port.HYP["wd_per_image"] * 100)
    _step_together(opt, ref, ours, theirs, steps=8, seed=200)
    for po, pt in zip(ours, theirs):
        torch.testing.assert_close(po, pt, atol=2e-5, rtol=1e-4)


def test_record_recipe_is_hiverges_and_builds_silu_groups():
    r, h = speedrun.RECORD, port.HYP
    assert (r.batch_size, r.epochs, r.label_smoothing, r.filter_lr, r.filter_momentum, r.momentum) == (
        h["batch_size"], h["epochs"], h["label_smoothing"], h["muon_lr"], h["muon_momentum"], h["sgd_momentum"])
    assert r.lr * r.bias_scale / 1024 == pytest.approx(h["bias_lr"]) and r.lr / 1024 == pytest.approx(h["head_lr"])
    assert r.ns_coefficients == h["ns_coefficients"] and r.whiten_images == h["whiten_images"]
    assert r.tta_select == h["tta_fraction"] and r.jitter == (h["brightness"], h["contrast"])
    net = speedrun.recipe_net(dataclasses.replace(r, widths=(8, 16, 16)))
    assert all(g.act is F.silu for g in net.groups) and net.groups[0].norm1.momentum == pytest.approx(0.4434)
    assert speedrun.recipe_net(speedrun.MUON).groups[0].act is F.gelu


def test_jitter_draws_within_its_ranges_and_only_when_asked():
    torch.manual_seed(0)
    x, y = torch.zeros(512, 3, 4, 4), torch.zeros(512)
    assert speedrun.jittered((x, y), speedrun.MUON)[0] is x  # no jitter: the same batch
    out = speedrun.jittered((x + 1, y), speedrun.RECORD)[0]  # (1 + b) (1 + c) per image
    b, c = speedrun.RECORD.jitter
    per_image = out[:, 0, 0, 0]
    assert (out == per_image[:, None, None, None]).all()
    assert (1 - b) * (1 - c) <= per_image.min() and per_image.max() <= (1 + b) * (1 + c)
    assert per_image.std() > 0.05


def test_selective_tta_is_plain_for_the_confident_and_six_views_for_the_rest():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10)).eval()
    x = torch.randn(20, 3, 8, 8)
    plain = net(x)
    assert torch.equal(tta.selective_tta_logits(net, x, 0.0), plain)
    out = tta.selective_tta_logits(net, x, 0.25)
    conf = plain.softmax(1).amax(1)
    picked = set(conf.argsort()[:5].tolist())
    changed = {i for i in range(20) if not torch.equal(out[i], plain[i])}
    assert changed == picked
    padded = F.pad(x, (1,) * 4, "reflect")  # the port's six views
    base = torch.cat([x, padded[:, :, 0:8, 0:8], padded[:, :, 2:10, 2:10]])
    six = net(torch.cat([base, base.flip(-1)])).view(6, 20, -1).mean(0)
    torch.testing.assert_close(tta.selective_tta_logits(net, x, 1.0), six)


def test_record_module_keeps_its_recipe_through_a_copy():
    module = speedrun.SpeedrunModule(dataclasses.replace(speedrun.RECORD, widths=(8, 16, 16)))
    assert copy.deepcopy(module).recipe == module.recipe
