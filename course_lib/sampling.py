"""Batch order that survives a restart: a sampler shuffled by (seed, epoch), and a DataLoader that resumes mid-epoch."""
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
