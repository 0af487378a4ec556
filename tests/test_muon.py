"""course_lib.training.muon and the Muon rung: the Newton-Schulz band, the optimiser's step against hand-written and
airbench94_muon references, torch.optim.Muon's iteration, and speedrun.MUON against airbench94_muon's values."""
import copy
import dataclasses

import pytest
import torch
from torch import nn

from course_lib.base import hardware
from course_lib.data.data import to_float
from course_lib.data.ondevice import DeviceBatches
from course_lib.training import muon, optim, speedrun
from course_lib.training.twin import Twin
from scripts.ports import airbench_muon_port as port

SHAPES = [(16, 216), (32, 288), (64, 32), (48, 48 * 9)]  # flattened conv banks (out, in x 9), a tall matrix


def singular_values(x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(x.double())


def quintic(s: torch.Tensor, steps: int = muon.NS_STEPS) -> torch.Tensor:
    a, b, c = muon.NS_COEFFICIENTS
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


def test_band_is_the_quintics_image_of_its_domain():
    """NS_BAND holds the 3-step map of every s in [NS_BAND_FROM, 1], and its ends are reached (no slack hidden)."""
    out = quintic(torch.linspace(muon.NS_BAND_FROM, 1, 100_001, dtype=torch.float64))
    lo, hi = muon.NS_BAND
    assert lo <= out.min().item() < lo + 0.005 and hi - 0.01 < out.max().item() <= hi


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-3), (torch.bfloat16, 0.06)])
@pytest.mark.parametrize("shape", SHAPES)
def test_newton_schulz_puts_singular_values_in_the_band(shape, dtype, tol):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    s_in = singular_values(g) / g.norm().double()
    assert s_in.min() >= muon.NS_BAND_FROM  # inside the band's domain, so the promise applies
    s_out = singular_values(muon.newton_schulz(g, dtype=dtype))
    lo, hi = muon.NS_BAND
    assert lo - tol <= s_out.min() and s_out.max() <= hi + tol
    if dtype == torch.float32:  # each singular value moves along the scalar map; the singular vectors stay
        expected = quintic(s_in).sort(descending=True).values  # the map is not monotonic: re-sorted
        torch.testing.assert_close(s_out, expected, rtol=1e-4, atol=1e-4)
        u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
        rebuilt = u @ torch.diag(quintic(s_in)) @ vh
        torch.testing.assert_close(muon.newton_schulz(g).double(), rebuilt, rtol=1e-4, atol=1e-4)


def test_newton_schulz_refuses_a_filter_bank():
    with pytest.raises(ValueError, match="flatten"):
        muon.newton_schulz(torch.randn(4, 3, 3, 3))


def test_iteration_dtype_is_described():
    assert "native bf16 on this hardware" in muon.describe(torch.bfloat16)
    assert "no native bf16" in muon.describe(torch.float32)


class Small(nn.Module):
    """Two conv banks, a BatchNorm and a head: the kinds of tensor the speedrun trains."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, bias=False), nn.Conv2d(8, 16, 3, bias=False)
        self.norm, self.head = nn.BatchNorm2d(16), nn.Linear(16, 10, bias=False)

    def forward(self, x):
        x = self.norm(self.conv2(torch.relu(self.conv1(x))))
        return self.head(x.amax((2, 3)))


def batches(n: int = 3):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, 10, 10, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(n)]


def test_step_equals_a_hand_written_reference():
    """Filters: momentum, Nesterov, weights to norm sqrt(out), minus lr x the 3-step quintic of the flattened update;
    the rest: torch.optim.SGD's Nesterov step with weight decay."""
    torch.manual_seed(0)
    net = Small()
    ref = copy.deepcopy(net)
    filters = [net.conv1.weight, net.conv2.weight]
    opt = muon.Muon([dict(params=filters), dict(params=[net.norm.weight, net.norm.bias, net.head.weight], lr=0.1,
                     momentum=0.85, weight_decay=0.01, orthogonalize=False)], lr=0.2, momentum=0.6,
                    dtype=torch.float32)
    ref_filters = [ref.conv1.weight, ref.conv2.weight]
    sgd = torch.optim.SGD([ref.norm.weight, ref.norm.bias, ref.head.weight], lr=0.1, momentum=0.85, nesterov=True,
                          weight_decay=0.01)
    bufs = [torch.zeros_like(p) for p in ref_filters]
    for x, y in batches():
        for model in (net, ref):
            model.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sgd.step()
        with torch.no_grad():
            for p, buf in zip(ref_filters, bufs):
                buf.mul_(0.6).add_(p.grad)
                update = p.grad + 0.6 * buf
                p.mul_(len(p) ** 0.5 / p.norm())
                flat = update.reshape(len(p), -1)
                x_ = flat / (flat.norm() + 1e-7)
                for _ in range(3):
                    gram = x_ @ x_.T
                    x_ = 3.4445 * x_ + (-4.7750 * gram + 2.0315 * gram @ gram) @ x_
                p.sub_(0.2 * x_.reshape(p.shape))
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_orthogonalised_groups_refuse_vectors_and_decay():
    net = Small()
    with pytest.raises(ValueError, match="orthogonalize=False"):
        muon.Muon([net.norm.bias])
    with pytest.raises(ValueError, match="orthogonalize=False"):
        muon.Muon([net.conv1.weight], weight_decay=0.1)


def test_iteration_is_torch_optim_muons_on_a_matrix():
    """On a 2-D parameter, without the weight normalisation, in bf16 as torch.optim.Muon always iterates, the same
    steps to bf16's rounding (it fuses the products with addmm): its dampened momentum is ours x (1 - momentum),
    which the iteration's normalisation removes."""
    torch.manual_seed(0)
    a = nn.Parameter(torch.randn(16, 40))
    b, start = nn.Parameter(a.detach().clone()), a.detach().clone()
    ours = muon.Muon([a], lr=0.05, momentum=0.5, normalize=False, dtype=torch.bfloat16)
    theirs = torch.optim.Muon([b], lr=0.05, momentum=0.5, nesterov=True, weight_decay=0.0,
                              ns_steps=muon.NS_STEPS)  # 16 <= 40: no LR change
    for i in range(4):
        grad = torch.randn(16, 40, generator=torch.Generator().manual_seed(i))
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
    moved = (a.detach() - start).abs().mean()
    assert (a - b).abs().mean() < 0.03 * moved  # bf16 keeps 8 bits: ~1 % per element after the products


def test_recipe_fields_are_airbench94_muons():
    """speedrun.MUON against the port's copy of airbench94_muon's main(): summed-loss LRs per example x 1024 are the
    course's mean-loss LRs per batch of 1024."""
    r, hyp = speedrun.MUON, port.HYP
    assert (r.optimizer, r.schedule, r.head, r.lookahead_every) == ("muon", "linear", "width", 0)
    assert r.lr == pytest.approx(hyp["head_lr"] * 1024)
    assert r.lr * r.bias_scale == pytest.approx(hyp["bias_lr"] * 1024)
    assert r.weight_decay == pytest.approx(hyp["wd_per_image"] * 1024)
    assert (r.batch_size, r.epochs, r.momentum, r.filter_lr, r.filter_momentum, r.label_smoothing,
            r.whiten_bias_epochs, r.tta_level, r.widths) == (
        hyp["batch_size"], hyp["epochs"], hyp["sgd_momentum"], hyp["muon_lr"], hyp["muon_momentum"],
        hyp["label_smoothing"], hyp["whiten_bias_epochs"], hyp["tta_level"], hyp["widths"])
    assert (muon.NS_STEPS, muon.NS_COEFFICIENTS) == (hyp["ns_steps"], hyp["ns_coefficients"])
    with pytest.raises(ValueError, match="airbench94_muon"):
        dataclasses.replace(speedrun.MUON, schedule="triangle")


#: how close 6 steps of the course's optimiser and the port's stay, by the iteration's dtype: fp32 rounding only; bf16
#: rounds each Newton-Schulz product to 8 bits of mantissa, and the two sides sum the loss differently (mean vs sum)
STEP_TOLERANCE = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-3)}


@pytest.mark.parametrize("cls", ["cpu-avx2", "cpu-avx512-bf16"])  # the policy's two answers: fp32 and bf16
def test_muon_recipe_optimizer_steps_as_airbench94_muon(hardware_class, cls):
    """make_muon_speedrun_optimizer on the mean loss against airbench94_muon's two optimisers (its SGD groups and
    the port's Muon) on the summed loss, on one AirNet, 6 steps with the whitening bias frozen after 3: the port
    iterates in the dtype the course's policy chose under each emulated class, checked at that dtype's tolerance
    (bf16 runs on any CPU, emulated where the CPU lacks it)."""
    hardware_class(cls)
    dtype = muon.iteration_dtype("cpu")
    assert dtype == (torch.bfloat16 if hardware.cpu_bf16_native() else torch.float32)
    recipe = dataclasses.replace(speedrun.MUON, widths=(8, 16, 16), batch_size=16)
    torch.manual_seed(0)
    net = speedrun.recipe_net(recipe)
    ref = copy.deepcopy(net)
    total, bias_steps = 6, 3
    opt, sched = speedrun.recipe_optimizer(net, recipe, total, steps_per_epoch=1)
    hyp, wd = port.HYP, port.HYP["wd_per_image"] * 16
    norm_biases = [p for n, p in ref.named_parameters() if "norm" in n and p.requires_grad]
    sgd = torch.optim.SGD([dict(params=[ref.whiten.bias], lr=hyp["bias_lr"], weight_decay=wd / hyp["bias_lr"]),
                           dict(params=norm_biases, lr=hyp["bias_lr"], weight_decay=wd / hyp["bias_lr"]),
                           dict(params=[ref.head.weight], lr=hyp["head_lr"], weight_decay=wd / hyp["head_lr"])],
                          momentum=hyp["sgd_momentum"], nesterov=True)
    filters = [p for p in ref.parameters() if p.ndim == 4 and p.requires_grad]
    ab_muon = port.Muon(filters, lr=hyp["muon_lr"], momentum=hyp["muon_momentum"], nesterov=True, dtype=dtype)
    g = torch.Generator().manual_seed(1)
    for step in range(total):
        x, y = torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        for model in (net, ref):
            model.whiten.bias.requires_grad_(step < bias_steps)
            model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x), y, label_smoothing=0.2).backward()
        nn.functional.cross_entropy(ref(x), y, label_smoothing=0.2, reduction="sum").backward()
        sgd.param_groups[0]["lr"] = hyp["bias_lr"] * (1 - step / bias_steps)
        for group in [*sgd.param_groups[1:], *ab_muon.param_groups]:
            group["lr"] = group.setdefault("initial_lr", group["lr"]) * (1 - step / total)
        opt.step()
        sched.step()
        sgd.step()
        ab_muon.step()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, **STEP_TOLERANCE[dtype], msg=name)


def test_module_and_twin_train_the_muon_recipe_alike(tiny_folder, session_data_root):
    """SpeedrunModule (Lightning) and the twin with speedrun.MUON on real images: the same losses step for step."""
    from course_lib.data.data import CIFAR10DataModule
    from course_lib.data.ondevice import Speedrun
    from course_lib.training import experiments

    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=16, seed=0,
                           val_fraction=0.0, batching=Speedrun("cpu"))
    dm.setup("fit")
    module = speedrun.SpeedrunModule(dataclasses.replace(speedrun.MUON, widths=(8, 16, 16), batch_size=16))
    run = experiments.run_seed(module, dm, seed=0, epochs=2, precision="32-true")
    twin = experiments.compare_twin(module, dm, run, epochs=2, precision="32-true")
    assert run.steps == 6 and twin.loss_diff_all < 1e-4


def test_muon_whitening_bias_starts_as_airbench94_muons():
    """airbench94_muon's whitening layer is a plain nn.Conv2d: reset() draws its bias as PyTorch does, U(+-1/sqrt(12))
    for 3 x 2 x 2 inputs, and init_whiten sets the filters only, so training starts from that draw (airbench94's Conv
    zeroes it). speedrun.MUON draws it so, after every other weight (which stay as the zero-bias recipe's for a seed),
    and the whitening keeps it; the course before issue 46 started this recipe at zero."""
    recipe = dataclasses.replace(speedrun.MUON, widths=(8, 16, 16), batch_size=20)
    assert speedrun.Recipe().whiten_bias == "zero" and recipe.whiten_bias == "uniform"
    bound = 1 / 12 ** 0.5
    torch.manual_seed(0)
    theirs = port.make_model((8, 16, 16))
    theirs.reset()
    theirs.init_whiten(torch.randn(4, 3, 32, 32))
    torch.manual_seed(0)
    ours = speedrun.recipe_net(recipe)
    torch.manual_seed(0)
    zero = speedrun.recipe_net(dataclasses.replace(recipe, whiten_bias="zero"))
    for bias in (theirs.whiten.bias, ours.whiten.bias):
        assert bias.abs().max() <= bound and bias.abs().max() > bound / 2 and bias.std() > bound / 4
    drawn = ours.whiten.bias.detach().clone()
    speedrun.whiten_from(ours, torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), recipe)
    assert torch.equal(ours.whiten.bias, drawn) and bool(ours.whitened)
    for (name, a), b in zip(zero.state_dict().items(), ours.state_dict().values()):
        if name not in ("whiten.bias", "whiten.weight", "whitened"):
            assert torch.equal(a, b), name
    assert not zero.whiten.bias.any()
    with pytest.raises(ValueError, match="whiten_bias"):
        dataclasses.replace(recipe, whiten_bias="random")


def test_muon_whitening_filters_sit_where_airbench94_muons_do():
    """airbench94_muon's init_whiten keeps torch.linalg.eigh's order, smallest eigenvalue first (airbench94 and
    hiverge's SVD put the largest first). It matters: the first group's dirac start passes on only its first
    widths[0] of the 24 whitening channels, so at widths (16, ...) it decides which directions reach the net with both
    signs. Issue 46: speedrun.MUON put the largest first until the gap was looked for. Each filter position holds the
    port's filter (up to the pair's sign, which eigh leaves to LAPACK); hiverge's record keeps the largest first."""
    from scripts.ports import hiverge_port
    torch.manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    images[:, 1] = images[:, 0] // 2 + images[:, 1] // 2  # correlated channels: distinct eigenvalues, a clear order
    normed = to_float(images)  # the ports' normalisation (the same constants)

    def cosines(recipe, theirs):
        ours = speedrun.recipe_net(dataclasses.replace(recipe, widths=(16, 32, 32)))
        speedrun.whiten_from(ours, images, recipe)
        a, b = (w.reshape(24, -1).double() for w in (ours.whiten.weight, theirs.whiten.weight))
        return ((a * b).sum(1) / a.norm(dim=1) / b.norm(dim=1)).abs()  # (24,): 1 where the same filter sits

    theirs = port.make_model((16, 32, 32))
    theirs.init_whiten(normed)
    assert speedrun.MUON.whiten_order == "smallest" and cosines(speedrun.MUON, theirs).min() > 0.9999
    assert cosines(dataclasses.replace(speedrun.MUON, whiten_order="largest"), theirs).min() < 0.5
    record = hiverge_port.CifarNet((16, 32, 32))
    record.init_whiten(normed)  # 64 images: RECORD reads its first 960, so all of them
    assert speedrun.RECORD.whiten_order == "largest" and cosines(speedrun.RECORD, record).min() > 0.9999
    with pytest.raises(ValueError, match="whiten_order"):
        dataclasses.replace(speedrun.MUON, whiten_order="random")


def test_module_and_twin_start_from_the_drawn_whitening_bias(tiny_folder, session_data_root):
    """Through experiments.run_seed (Lightning) and the twin, the Muon rung's whitening keeps the seed's drawn bias:
    with whiten_bias_epochs=0 it never trains, so it ends as fresh_weights drew it (zero before issue 46's fix)."""
    import lightning as L

    from course_lib.data.data import CIFAR10DataModule
    from course_lib.data.ondevice import Speedrun
    from course_lib.training import experiments

    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=20, seed=0,
                           val_fraction=0.0, batching=Speedrun("cpu"))
    dm.setup("fit")
    recipe = dataclasses.replace(speedrun.MUON, widths=(8, 16, 16), batch_size=20, whiten_bias_epochs=0)
    L.seed_everything(3, verbose=False)
    drawn = speedrun.recipe_net(recipe).whiten.bias.detach()
    module = speedrun.SpeedrunModule(recipe)
    run = experiments.run_seed(module, dm, seed=3, epochs=1, precision="32-true")
    assert run.steps == len(dm.train_dataloader()) and drawn.abs().max() > 0.1
    torch.testing.assert_close(module.net.whiten.bias.detach(), drawn, rtol=0, atol=0)
    twin = experiments.compare_twin(module, dm, run, epochs=1, precision="32-true")
    torch.testing.assert_close(twin.twin.net.whiten.bias.detach(), drawn, rtol=0, atol=0)


def test_lightning_trains_as_airbench94_muons_loop_from_one_start(hardware_class, tiny_folder, session_data_root):
    """The course's fit (experiments.run_seed) and the port's training loop, given the course's whitened start and its
    batches (scripts/fidelity_muon_stages.py's stage 4), take the same steps at the same LRs with the same losses, over
    4 epochs: the epoch boundaries, the whitening bias's decay and its freeze after epoch 3 (fp32 iteration; at this
    size rounding has not yet grown, as it does over longer runs: the stage check's nudged row)."""
    from course_lib.data.data import CIFAR10DataModule
    from course_lib.data.ondevice import Speedrun
    from course_lib.training import experiments
    from scripts import fidelity_muon_stages as stages
    from scripts.ports import airbench_port

    hardware_class("cpu-avx2")
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(session_data_root), batch_size=20, seed=0,
                           val_fraction=0.0, batching=Speedrun("cpu"))
    dm.setup("fit")
    recipe = dataclasses.replace(speedrun.MUON, widths=(8, 16, 16), batch_size=20)
    module = stages.course_net(recipe, 1)
    start = copy.deepcopy(module.net)
    speedrun.whiten_from(start, dm.train_set.images, recipe)
    state = {stages.port_name(k): v for k, v in start.state_dict().items() if k != "whitened"}
    run = experiments.run_seed(module, dm, seed=1, epochs=4, precision="32-true")
    dm.batching.shuffle_seed = 1
    test = airbench_port.Loader(dm.test_set.images, dm.test_set.labels, 2000, train=False)
    out = port.train(stages.CourseBatches(dm.train_dataloader()), test, 4, recipe.widths, ns_dtype=torch.float32,
                     init=lambda m: m.load_state_dict(state))
    assert run.steps == out["steps"] == 4 * len(dm.train_dataloader()) > 3 * len(dm.train_dataloader())
    torch.testing.assert_close(run.losses, out["losses"], rtol=0, atol=1e-4)


def test_twin_trains_the_muon_recipe():
    """The plain twin runs MUON's optimiser and schedule end to end on a few images; the loss falls."""
    recipe = dataclasses.replace(speedrun.MUON, widths=(8, 16, 16), batch_size=32)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    labels = (images.float().mean((1, 2, 3)) > images.float().mean()).long()  # a learnable rule: bright or dark
    out = Twin(speedrun.recipe_net(recipe), recipe).fit(DeviceBatches(images, labels, 32, shuffle=True), 6)
    assert len(out.losses) == 12 and torch.isfinite(out.losses).all()
    assert out.losses[-2:].mean() < out.losses[:2].mean()
    assert optim.linear_decay(12, 12) == 0 and optim.linear_decay(0, 12) == 1


#: airbench94_muon.py's own table (print_training_details), as its main() prints one run
MUON_OUTPUT = """\
|  run     |  epoch  |  train_acc  |  val_acc  |  tta_val_acc  |  time_seconds  |
|       0  |      0  |     0.4200  |   0.5100  |               |        0.4000  |
|          |      7  |     0.9100  |   0.9350  |               |        2.3000  |
|          |   eval  |     0.9100  |   0.9350  |       0.9402  |        2.5900  |
"""


def test_airbench94_muon_is_carried_checked_and_read(tmp_path):
    """The GPU script's path to airbench94_muon.py: a wrong file is refused with the download command, a missing one
    names the remedy, and its printed 'eval' row is read."""
    from scripts import airbench_carry

    wrong = tmp_path / "airbench94_muon.py"
    wrong.write_text("print('not it')\n")
    with pytest.raises(SystemExit, match=airbench_carry.MUON_URL):
        airbench_carry.carry_muon(wrong, tmp_path / "carry")
    with pytest.raises(FileNotFoundError, match="--airbench-muon"):
        airbench_carry.import_muon(tmp_path / "carry")
    assert airbench_carry.parse_muon_table(MUON_OUTPUT) == {"tta_val_acc": 0.9402, "time_seconds": 2.59}
    with pytest.raises(ValueError, match="No 'eval' row"):
        airbench_carry.parse_muon_table(MUON_OUTPUT.replace("eval", "   7"))
