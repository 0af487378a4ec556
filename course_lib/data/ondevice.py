"""Data that lives on the device: one batcher with a pluggable augmentation, and the DataModule's batching strategies
that serve it (OnDevice, and the speedrun's Speedrun)."""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.data import DistributedSampler

from .data import CIFAR10_MEAN, CIFAR10_STD, augment_batch, crop_flip, to_float
from .sampling import Batching, EpochSampler, epoch_generator

#: augment(x, idx, epoch): float (B, C, H, W) pixels in [0, 255], the images' dataset indices, the epoch -> batch
Augment = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


class RandomCropFlip:
    """Lessons 03-05's augmentation: a random crop of the zero-padded image and a random mirror, drawn on the device."""

    def __init__(self, pad: int = 4):
        self.pad = pad

    def __call__(self, x: torch.Tensor, idx: torch.Tensor, epoch: int) -> torch.Tensor:
        return augment_batch(x, self.pad)


class AlternatingFlipTranslate:
    """airbench's augmentation: a seeded shift of up to `translate` px (reflect padding) per image and epoch, and a
    mirror that alternates: a random half of the images in epoch 0, exactly the other half in epoch 1, and so on."""

    def __init__(self, n: int, seed: int = 0, translate: int = 2, flip: bool = True):
        self.n, self.seed, self.translate, self.flip = n, seed, translate, flip
        self._epoch, self._shifts, self._flips = None, None, None

    def flips(self, epoch: int) -> torch.Tensor:
        """(N,) bool, per image: mirrored this epoch? Epoch 0 a random half; each later epoch the complement."""
        base = torch.rand(self.n, generator=torch.Generator().manual_seed(self.seed)) < 0.5
        return base ^ bool(epoch % 2) if self.flip else torch.zeros_like(base)

    def shifts(self, epoch: int) -> torch.Tensor:
        """(2, N) int, per image: this epoch's row and column shift in 0..2 * translate (the crop's offset)."""
        g = epoch_generator(self.seed, epoch)  # CPU generator: same on any device
        return torch.randint(0, 2 * self.translate + 1, (2, self.n), generator=g)

    def __call__(self, x: torch.Tensor, idx: torch.Tensor, epoch: int) -> torch.Tensor:
        if self._epoch != epoch:  # one draw and one host-to-device copy per epoch, then gathers on the device
            self._shifts, self._flips = self.shifts(epoch).to(x.device), self.flips(epoch).to(x.device)
            self._epoch = epoch
        return crop_flip(x, self._shifts[:, idx], self._flips[idx], self.translate, mode="reflect")


class DeviceBatches:
    """Normalised float batches cut from uint8 images already on the device: no DataLoader, workers or copies.

    Under DDP each of `num_replicas` processes takes its own share, as DistributedSampler splits a DataLoader: the
    epoch's order (one seeded shuffle, the same on every rank), padded with its first indices to a multiple of the
    world size, then every num_replicas-th index from `rank`. Lightning shards only real DataLoaders, so an unsharded
    DeviceBatches refuses to run in a process group of several."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *, shuffle: bool = False,
                 seed: int = 0, augment: Augment | None = None, drop_last: bool = False,
                 mean: tuple | None = CIFAR10_MEAN, std: tuple | None = CIFAR10_STD, num_replicas: int = 1,
                 rank: int = 0):
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3 or len(images) != len(labels):
            raise ValueError(f"DeviceBatches needs uint8 images (N, 3, H, W) and N labels; got {images.dtype} "
                             f"{tuple(images.shape)} and {len(labels)} labels.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} must be in [0, num_replicas={num_replicas}).")
        self.num_replicas, self.rank = num_replicas, rank
        shard = -(-len(labels) // num_replicas)  # images per rank, padded as DistributedSampler pads (shard())
        if batch_size < 1 or (drop_last and batch_size > shard):
            raise ValueError(f"batch_size {batch_size} must be between 1 and the {shard} images of this rank's share "
                             f"({len(labels)} images over {num_replicas} process(es)): with drop_last an epoch needs "
                             f"at least one full batch.")
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.shuffle, self.augment, self.drop_last = shuffle, augment, drop_last
        self.sampler = EpochSampler(len(labels), seed)  # Lightning finds .sampler and calls set_epoch on it
        self.batch_sampler = None  # Lightning inspects it to tell whether evaluation data are shuffled
        # data.to_float's statistics, made on the device once: no host-to-device copy per batch; None: [0, 1] only
        self.mean = None if mean is None else torch.tensor(mean, dtype=torch.float32, device=images.device)
        self.std = None if mean is None else torch.tensor(std, dtype=torch.float32, device=images.device)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:  # drop_last: every step has the same shape (what compiled graphs want)
        n = -(-len(self.labels) // self.num_replicas)  # this rank's share
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def shard(self) -> torch.Tensor:
        """This rank's dataset indices for the current epoch, in order (all of them on one process): the epoch's
        order, split by torch's DistributedSampler (its padding and stride; shuffle=False, the order is shuffled)."""
        order = self.sampler.permutation() if self.shuffle else torch.arange(len(self.labels))
        share = DistributedSampler(range(len(order)), num_replicas=self.num_replicas, rank=self.rank, shuffle=False)
        return order[torch.tensor(list(share), dtype=torch.long)]

    def __iter__(self):
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if self.num_replicas == 1 and world > 1:
            raise RuntimeError(f"DeviceBatches was built for one process but runs in a process group of {world}: "
                               f"every rank would train on the same images. Build it with "
                               f"num_replicas=trainer.world_size, rank=trainer.global_rank (the course's device "
                               f"DataModules do), or use a DataLoader, which Lightning shards itself.")
        dev, epoch = self.images.device, self.sampler.epoch
        order = self.shard().to(dev)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]  # images and labels share the indices
            x = self.images[idx]  # (B, 3, H, W) uint8 pixels, gathered on the device
            x = self.augment(x.float(), idx, epoch) if self.augment else x
            yield to_float(x, self.mean, self.std), self.labels[idx]


class OnDevice(Batching):
    """The on-device batching strategy: the DataModule's uint8 splits copied to the accelerator once (50,000 images
    are 150 MB), batches cut, normalised and (augment=True) crop+flipped there by DeviceBatches; `device` None: the
    Trainer's, else the GPU if there is one, else the CPU."""

    def __init__(self, device: str | None = None):
        self.device = device

    def place(self, dm) -> None:
        dev = torch.device(self.device) if self.device else dm.device()
        for name in ("train_set", "val_set", "test_set"):
            ds = getattr(dm, name, None)
            if ds is not None:  # one copy, then every epoch reads device memory
                ds.images, ds.labels = ds.images.to(dev), ds.labels.to(dev)

    def batches(self, dm, ds, train: bool, batch_size: int, augment: Augment | None = None, drop_last: bool = False,
                seed: int | None = None) -> DeviceBatches:
        """One split as DeviceBatches with the DataModule's normalisation, this rank's share under DDP."""
        mean, std = dm.normalisation()
        world, rank = (dm.trainer.world_size, dm.trainer.global_rank) if dm.trainer else (1, 0)
        return DeviceBatches(ds.images, ds.labels, batch_size, shuffle=train, augment=augment, drop_last=drop_last,
                             seed=dm.hparams.seed if seed is None else seed, mean=mean, std=std, num_replicas=world,
                             rank=rank)

    def loader(self, dm, ds, train: bool) -> DeviceBatches:
        augment = RandomCropFlip() if train and dm.hparams.augment else None
        return self.batches(dm, ds, train, dm.hparams.batch_size, augment)


class Speedrun(OnDevice):
    """Lesson 08's batching: the splits on the device, trained with airbench's augmentation (AlternatingFlipTranslate)
    in full batches of the DataModule's batch_size; evaluated in batches of eval_batch_size. `shuffle_seed` (None:
    the DataModule's seed, which fixes the split) sets the batch order and augmentation, so runs with several seeds
    share one test set. A speedrun does not validate: runs.datamodule(kind="speedrun") carves no validation images."""

    def __init__(self, device: str | None = None, eval_batch_size: int = 1000, translate: int = 2, flip: bool = True,
                 shuffle_seed: int | None = None):
        super().__init__(device)
        self.eval_batch_size, self.translate, self.flip = eval_batch_size, translate, flip
        self.shuffle_seed = shuffle_seed

    def loader(self, dm, ds, train: bool) -> DeviceBatches:
        if not train:
            return self.batches(dm, ds, False, self.eval_batch_size)
        seed = dm.hparams.seed if self.shuffle_seed is None else self.shuffle_seed
        augment = AlternatingFlipTranslate(len(ds), seed, self.translate, self.flip)
        return self.batches(dm, ds, True, dm.hparams.batch_size, augment, drop_last=True, seed=seed)
