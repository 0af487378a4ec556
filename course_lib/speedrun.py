"""Lesson 08's speedrun: on-device batches, the airbench-style recipe as a LightningModule, and a plain-PyTorch twin."""
from __future__ import annotations

import inspect
import time
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from . import config
from .data import CIFAR10_MEAN, CIFAR10_STD, DeviceCIFAR10DataModule, EpochSampler
from .loops import sync
from .models import WIDTHS, AirNet, init_whitening
from .optim import Lookahead, lookahead_decay, make_speedrun_optimizer

# the speedrun trains without validation; Lightning would warn about the unused validation_step on every fit
warnings.filterwarnings("ignore", message=".*defined a `validation_step` but have no `val_dataloader`.*")


def translate_flip(x: torch.Tensor, shifts: torch.Tensor, flips: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift each image by shifts[:, i] - pad pixels (reflect padding), then mirror those with flips[i]."""
    b, c, h, w = x.shape
    if pad > 0:
        x = F.pad(x, (pad,) * 4, mode="reflect")  # (B, C, H + 2 pad, W + 2 pad)
        rows = (shifts[0][:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
        cols = (shifts[1][:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
        x = x[torch.arange(b, device=x.device)[:, None, None, None], torch.arange(c, device=x.device)[:, None, None],
              rows, cols]  # crop: (B, C, H, W)
    return torch.where(flips[:, None, None, None], x.flip(3), x)


class SpeedrunBatches:
    """Normalised float batches cut from uint8 images already on the device; training batches augmented there."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, train: bool = True,
                 seed: int = 0, translate: int = 2, flip: bool = True):
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3 or len(images) != len(labels):
            raise ValueError(f"SpeedrunBatches needs uint8 images (N, 3, H, W) and N labels; got {images.dtype} "
                             f"{tuple(images.shape)} and {len(labels)} labels.")
        if batch_size < 1 or (train and batch_size > len(labels)):
            raise ValueError(f"batch_size {batch_size} must be between 1 and the {len(labels)} images: training "
                             f"drops the last partial batch, so an epoch needs at least one full batch.")
        self.images, self.labels, self.batch_size, self.train = images, labels, batch_size, train
        self.translate, self.flip = translate if train else 0, flip and train
        self.sampler = EpochSampler(len(labels), seed)  # Lightning finds .sampler and calls set_epoch on it
        self.batch_sampler = None  # Lightning inspects it to tell whether evaluation data are shuffled
        self.mean = torch.tensor(CIFAR10_MEAN, device=images.device)[:, None, None] * 255  # once: no copy per batch
        self.std = torch.tensor(CIFAR10_STD, device=images.device)[:, None, None] * 255

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:  # training drops the last partial batch: every step has the same shape (compile)
        return len(self.labels) // self.batch_size if self.train else -(-len(self.labels) // self.batch_size)

    def flips(self, epoch: int) -> torch.Tensor:
        """(N,) bool, per image: mirrored this epoch? Epoch 0 a random half; each later epoch the complement."""
        base = torch.rand(len(self.labels), generator=torch.Generator().manual_seed(self.sampler.seed)) < 0.5
        return base ^ bool(epoch % 2) if self.flip else torch.zeros_like(base)

    def __iter__(self):
        n, bs, dev = len(self.labels), self.batch_size, self.images.device
        if not self.train:
            for i in range(0, n, bs):
                yield (self.images[i:i + bs].float() - self.mean) / self.std, self.labels[i:i + bs]
            return
        g = torch.Generator().manual_seed(self.sampler.seed * 100_003 + self.sampler.epoch)  # CPU: same on any device
        order = torch.randperm(n, generator=g)
        shifts = torch.randint(0, 2 * self.translate + 1, (2, n), generator=g).to(dev, non_blocking=True)
        flips = self.flips(self.sampler.epoch)[order].to(dev, non_blocking=True)  # per image, in batch order
        order = order.to(dev, non_blocking=True)
        for i in range(len(self)):
            part = slice(i * bs, (i + 1) * bs)
            idx = order[part]  # images and labels are gathered with the same indices: they stay aligned
            x = (self.images[idx].float() - self.mean) / self.std  # (B, 3, H, W) float32
            yield translate_flip(x, shifts[:, part], flips[part], self.translate), self.labels[idx]


class SpeedrunDataModule(DeviceCIFAR10DataModule):
    """CIFAR10DataModule's seeded splits as uint8 tensors on the device (once), served as SpeedrunBatches.

    `seed` fixes the split; `shuffle_seed` (default: seed) the batch order and augmentation, so runs with several
    seeds can share one test set. A speedrun does not validate, so by default no validation images are carved:
    all 50,000 training images train (45,000 when the test split is carved from them too)."""

    def __init__(self, *args, batch_size: int = 1024, eval_batch_size: int = 1000, translate: int = 2,
                 flip: bool = True, shuffle_seed: int | None = None, val_fraction: float = 0.0, **kwargs):
        super().__init__(*args, batch_size=batch_size, val_fraction=val_fraction, **kwargs)
        self.eval_batch_size, self.translate, self.flip = eval_batch_size, translate, flip
        self.shuffle_seed = self.hparams.seed if shuffle_seed is None else shuffle_seed

    def setup(self, stage: str | None = None) -> None:
        if getattr(self, "train_set", None) is None or self.hparams.test_folder:  # splits never change: carve once
            super().setup(stage)

    def train_dataloader(self) -> SpeedrunBatches:
        ds = self.train_set
        return SpeedrunBatches(ds.images, ds.labels, self.hparams.batch_size, True, self.shuffle_seed,
                               self.translate, self.flip)

    def val_dataloader(self) -> SpeedrunBatches:
        return SpeedrunBatches(self.val_set.images, self.val_set.labels, self.eval_batch_size, train=False)

    def test_dataloader(self) -> SpeedrunBatches:
        return SpeedrunBatches(self.test_set.images, self.test_set.labels, self.eval_batch_size, train=False)


@torch.no_grad()
def tta_logits(model: nn.Module, x: torch.Tensor, level: int = 2) -> torch.Tensor:
    """Logits averaged over views: level 0 the image, 1 + its mirror, 2 + both shifted 1 px down-right and up-left."""
    logits = model(x)  # (B, classes)
    if level == 0:
        return logits
    logits = 0.5 * (logits + model(x.flip(3)))
    if level == 1:
        return logits
    down = F.pad(x, (1, 0, 1, 0), mode="reflect")[..., :-1, :-1]  # content moves 1 px right and down
    up = F.pad(x, (0, 1, 0, 1), mode="reflect")[..., 1:, 1:]
    shifted = model(torch.cat([down, up, down.flip(3), up.flip(3)])).view(4, len(x), -1).mean(0)
    return 0.5 * logits + 0.5 * shifted


@torch.no_grad()
def evaluate_tta(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, level: int = 2,
                 batch_size: int = 1000, bf16: bool = False) -> float:
    """Accuracy of model on uint8 images (N, 3, H, W) with test-time augmentation; one host sync at the end."""
    if level not in (0, 1, 2):
        raise ValueError(f"TTA level must be 0 (none), 1 (mirror) or 2 (mirror + shifts), got {level}.")
    was_training, correct = model.training, torch.zeros((), device=images.device)
    model.eval()
    with torch.autocast(images.device.type, dtype=torch.bfloat16, enabled=bf16):
        for x, y in SpeedrunBatches(images, labels, batch_size, train=False):
            correct += (tta_logits(model, x, level).argmax(1) == y).sum()
    model.train(was_training)
    return correct.item() / len(labels)


class SpeedrunModule(L.LightningModule):
    """The airbench-style recipe: label smoothing, Nesterov SGD with warm-up/decay, bias LR, lookahead, TTA."""

    def __init__(self, widths: tuple[int, int, int] = WIDTHS, label_smoothing: float = 0.2, lr: float = 1.5,
                 momentum: float = 0.85, weight_decay: float = 2e-3, bias_scale: float = 64.0, warmup: float = 0.23,
                 lookahead_every: int = 5, tta_level: int = 2, whiten_bias_epochs: int = 3,
                 channels_last: bool = False, compile: bool = False):
        super().__init__()
        # lr 1.5 and decay 2e-3 per step at batch 1024 are airbench94's settings rewritten for a mean (not summed) loss
        self.save_hyperparameters()
        if not 0 <= label_smoothing < 1 or min(lookahead_every, whiten_bias_epochs) < 0 or tta_level not in (0, 1, 2):
            raise ValueError(f"Need 0 <= label_smoothing < 1, lookahead_every >= 0 (0 = off), whiten_bias_epochs >= 0 "
                             f"and tta_level in (0, 1, 2); got {label_smoothing}, {lookahead_every}, "
                             f"{whiten_bias_epochs}, {tta_level}.")
        self.net = AirNet(tuple(widths))
        if channels_last:  # (B, H, W, C) in memory: what tensor-core convolutions read fastest
            self.net = self.net.to(memory_format=torch.channels_last)
        if compile:  # in place: checkpoint keys stay those of the eager net
            self.net.compile()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        self.sums, self.step_losses, self.lookahead = {}, [], None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 32, 32) -> (B, classes)
        if self.hparams.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        """Loss of one batch (test: with TTA); loss and accuracy sums stay on the device until the epoch ends."""
        x, y = batch
        logits = tta_logits(self, x, self.hparams.tta_level) if stage == "test" else self(x)
        loss = self.criterion(logits, y)
        accumulate(self.sums, stage, loss, logits, y)
        if stage == "train":
            self.step_losses.append(loss.detach())  # a device scalar: no sync; read after training
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def configure_optimizers(self):
        hp, total = self.hparams, int(self.trainer.estimated_stepping_batches)  # also loads the train loader
        batch_size = _batches(self.trainer).batch_size
        self.net.whiten.bias.requires_grad_(True)  # a new fit trains it again, though the last one froze it
        opt, sched = make_speedrun_optimizer(self.net, total, batch_size, hp.lr, hp.momentum, hp.weight_decay,
                                             hp.bias_scale, hp.warmup)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        return batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)  # no generic walk

    def on_train_start(self) -> None:
        if not bool(self.net.whitened):  # one host read, before the first step
            init_whitening(self.net, _batches(self.trainer).images)
        self.lookahead = Lookahead(self.net) if self.hparams.lookahead_every else None
        self.step_losses, self.total_steps = [], int(self.trainer.estimated_stepping_batches)

    def on_train_epoch_start(self) -> None:
        train_bias = self.current_epoch < self.hparams.whiten_bias_epochs  # then frozen: a settled input shift
        self.net.whiten.bias.requires_grad_(train_bias)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step, every = self.trainer.global_step, self.hparams.lookahead_every  # global_step counts this step
        if self.lookahead is not None and step % every == 0:
            self.lookahead.update(lookahead_decay(step, self.total_steps))

    def on_train_end(self) -> None:
        if self.lookahead is not None:
            self.lookahead.update(1.0)  # the result is the slow weights

    def on_train_epoch_end(self) -> None:
        self.log_dict(epoch_metrics(self.sums, "train"))  # the epoch's one host sync

    def on_validation_epoch_end(self) -> None:
        self.log_dict(epoch_metrics(self.sums, "val"))

    def on_test_epoch_end(self) -> None:
        self.log_dict(epoch_metrics(self.sums, "test"))


def fresh_weights(module: SpeedrunModule, seed: int) -> None:
    """Load the initial weights of an AirNet built under `seed` into the module's net, in place (compiled stays so)."""
    L.seed_everything(seed, verbose=False)
    module.net.load_state_dict(AirNet(module.hparams.widths).state_dict())  # copies into the existing tensors


def _batches(trainer: L.Trainer) -> SpeedrunBatches:
    """The training batches; SpeedrunModule needs their batch size (LR scaling) and images (whitening)."""
    if not isinstance(trainer.train_dataloader, SpeedrunBatches):
        raise TypeError(f"SpeedrunModule trains on SpeedrunBatches (e.g. from SpeedrunDataModule), not "
                        f"{type(trainer.train_dataloader).__name__}: it scales the LR by their batch size and "
                        f"sets its whitening layer from their images.")
    return trainer.train_dataloader


def accumulate(sums: dict, stage: str, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
    """Add a batch's summed loss, correct count and size to sums[stage] on the device: no host sync."""
    batch = torch.stack([loss.detach().float() * len(y), (logits.detach().argmax(1) == y).sum().float()])
    sums[stage] = sums[stage] + batch if stage in sums else batch
    sums[f"{stage}_n"] = sums.get(f"{stage}_n", 0) + len(y)


def epoch_metrics(sums: dict, stage: str) -> dict:
    """Mean loss and accuracy of the epoch (still tensors), and reset the sums."""
    total, n = sums.pop(stage), sums.pop(f"{stage}_n")
    return {f"{stage}_loss": total[0] / n, f"{stage}_acc": total[1] / n}


def make_trainer(epochs: int, precision: str = "32-true", **kwargs) -> L.Trainer:
    """A Trainer for timing: no validation, logger, checkpoints or progress bar; precision via choose_precision."""
    opts = dict(max_epochs=epochs, accelerator="auto", devices=1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0)
    return L.Trainer(precision=config.choose_precision(precision), **{**opts, **kwargs})


def train_twin(net: AirNet, batches: SpeedrunBatches, epochs: int, precision: str = "32-true", **hparams) -> dict:
    """Plain-PyTorch twin of SpeedrunModule: same optimiser, schedule, lookahead and accumulation, no Lightning.

    Returns per-step losses (tensor), per-epoch seconds (synced, like EpochTimer) and the trained net."""
    hp = {k: p.default for k, p in inspect.signature(SpeedrunModule.__init__).parameters.items() if k != "self"}
    unknown = set(hparams) - set(hp)
    if unknown:
        raise ValueError(f"train_twin got unknown hyperparameters {sorted(unknown)}; choose from {sorted(hp)}.")
    hp.update(hparams)
    precision = config.choose_precision(precision)  # clear error if this hardware lacks it
    if precision == "16-mixed":
        raise ValueError("train_twin supports '32-true' and 'bf16-mixed'; fp16 would also need a GradScaler.")
    bf16 = precision == "bf16-mixed"
    device = batches.images.device
    net.to(device).train()
    if hp["channels_last"]:
        net = net.to(memory_format=torch.channels_last)
    if not bool(net.whitened):
        init_whitening(net, batches.images)
    if hp["compile"]:
        net.compile()
    total = epochs * len(batches)
    net.whiten.bias.requires_grad_(True)  # in the optimiser even if an earlier run froze it
    opt, sched = make_speedrun_optimizer(net, total, batches.batch_size, hp["lr"], hp["momentum"],
                                         hp["weight_decay"], hp["bias_scale"], hp["warmup"])
    criterion = nn.CrossEntropyLoss(label_smoothing=hp["label_smoothing"])
    lookahead = Lookahead(net) if hp["lookahead_every"] else None
    losses, epoch_s, sums, step = [], [], {}, 0
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        net.whiten.bias.requires_grad_(epoch < hp["whiten_bias_epochs"])
        sync(device)
        start = time.perf_counter()
        for x, y in batches:
            x = x.contiguous(memory_format=torch.channels_last) if hp["channels_last"] else x
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = net(x)
                loss = criterion(logits, y)
            accumulate(sums, "train", loss, logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            losses.append(loss.detach())
            if lookahead is not None and step % hp["lookahead_every"] == 0:
                lookahead.update(lookahead_decay(step, total))
        epoch_metrics(sums, "train")  # read once per epoch, as the module logs it
        sync(device)
        epoch_s.append(time.perf_counter() - start)
    if lookahead is not None:
        lookahead.update(1.0)
    return {"losses": torch.stack(losses).float().cpu(), "epoch_s": epoch_s, "net": net}
