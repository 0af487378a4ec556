"""Batch order that survives a restart: a sampler shuffled by (seed, epoch), a DataLoader that resumes mid-epoch, and
the DataLoader batching strategy (Loader) that serves a DataModule's splits with them."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler

EPOCH_STRIDE = 100_003  # a prime above any epoch count: (seed, epoch) pairs never share a generator seed


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The CPU generator of one (seed, epoch): the batch order and the augmentation draw from it, on any device."""
    return torch.Generator().manual_seed(seed * EPOCH_STRIDE + epoch)


class EpochSampler(Sampler[int]):
    """Shuffles with a generator seeded by (seed, epoch), so a resumed run sees the same order as an unbroken one."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:  # Lightning calls this at the start of every epoch
        self.epoch = epoch

    def permutation(self) -> torch.Tensor:
        """This epoch's order as an (n,) int64 CPU tensor."""
        return torch.randperm(self.n, generator=epoch_generator(self.seed, self.epoch))

    def __iter__(self):
        return iter(self.permutation().tolist())

    def __len__(self) -> int:
        return self.n


class ResumableLoader(DataLoader):
    """A DataLoader that resumes mid-epoch: built after a checkpoint was restored (rng_state given), its first pass
    skips the batches the restored loop had done, position(), and restores the CPU random state of that moment
    (augmentation draws from it), so the run sees the batches an unbroken one would. Later passes start afresh."""

    def __init__(self, *args, position=None, rng_state: torch.Tensor | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.position, self.rng_state = position, rng_state

    # Lightning looks for these two to know that a loader resumes mid-epoch (else it warns that results may
    # differ); the position comes from the loop's own restored progress, so there is nothing more to save
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def __iter__(self):
        rng_state, self.rng_state = self.rng_state, None
        batches = super().__iter__()
        if rng_state is not None:  # the first pass after a restore
            for _ in range(self.position() if self.position else 0):
                next(batches)
            torch.set_rng_state(rng_state)
        yield from batches


def _batch_as_is(batch):
    """Collate for data.ImageTensorDataset: its __getitems__ already returns (x, y) batches."""
    return batch


class Batching:
    """How a DataModule serves its splits (its `batching`): place(dm) once the splits are carved, then loader(dm,
    split dataset, train) for each stage's batches. Loader here, ondevice.OnDevice and ondevice.Speedrun."""

    def place(self, dm) -> None:
        """Put the DataModule's splits where the batches are cut (nothing to do by default)."""

    def loader(self, dm, ds, train: bool):
        raise NotImplementedError


class Loader(Batching):
    """The DataLoader batching strategy: a seeded EpochSampler whose loader resumes mid-epoch for training, batches
    normalised on the CPU in `num_workers` worker processes, pinned where they are copied to a GPU (pin_memory)."""

    def __init__(self, num_workers: int = 0, pin_memory: bool = False, persistent_workers: bool = False):
        self.num_workers, self.pin_memory, self.persistent_workers = num_workers, pin_memory, persistent_workers

    def loader(self, dm, ds, train: bool) -> DataLoader:
        """One split's batches; training batches in the (seed, epoch) order, resumable mid-epoch."""
        kwargs = dict(batch_size=dm.hparams.batch_size, num_workers=self.num_workers, collate_fn=_batch_as_is,
                      pin_memory=self.pin_memory and dm.device().type != "cpu",
                      persistent_workers=self.persistent_workers and self.num_workers > 0)
        if not train:
            return DataLoader(ds, **kwargs)
        rng_state, dm.resumed_rng_state = dm.resumed_rng_state, None
        return ResumableLoader(ds, sampler=EpochSampler(len(ds), dm.hparams.seed), position=dm.batches_done,
                               rng_state=rng_state, **kwargs)
