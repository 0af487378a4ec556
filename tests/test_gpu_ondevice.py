"""On-device batches under DDP: each rank trains on its own share of the epoch order, disjoint and covering, as
DistributedSampler splits a DataLoader (Lightning shards only real DataLoaders), and an unsharded DeviceBatches
refuses a process group."""
from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from course_lib.data.data import CIFAR10DataModule
from course_lib.data.ondevice import DeviceBatches, OnDevice
from course_lib.training.modules import ImageClassifierModule


def fingerprint(x: torch.Tensor) -> list[float]:
    """One number per image of a (B, 3, H, W) batch: real photos differ in it."""
    weights = torch.arange(x[0].numel(), dtype=torch.double).sin()  # a pixel-position-dependent weighting
    return (x.double().flatten(1) * weights).sum(1).round(decimals=3).tolist()


@pytest.mark.parametrize(("n", "world", "shuffle"), [(10, 3, False), (12, 2, True), (256, 2, True)])
def test_shards_split_the_epoch_order_disjoint_and_covering(n, world, shuffle):
    """Each rank's batches serve its share of the epoch's order (every world-th index from its rank, the order padded
    with its first indices to a multiple of the world size); together the shares cover the data, disjoint up to that
    padding, and a new epoch gives a new order."""
    images, labels = torch.zeros(n, 3, 2, 2, dtype=torch.uint8), torch.arange(n)
    shares, orders = [], set()
    for rank in range(world):
        b = DeviceBatches(images, labels, 4, shuffle=shuffle, seed=3, num_replicas=world, rank=rank)
        b.set_epoch(1)
        order = (b.sampler.permutation() if shuffle else torch.arange(n)).tolist()
        padded = order + order[:-n % world]
        share = [y for _, y in b]
        assert torch.cat(share).tolist() == padded[rank::world] and len(b) == len(share)
        shares.append(padded[rank::world])
        b.set_epoch(2)
        orders.add(tuple(b.sampler.permutation().tolist()) if shuffle else ())
    flat = [i for s in shares for i in s]
    assert set(flat) == set(range(n)) and len(flat) - len(set(flat)) == -n % world
    assert len(orders) == 1  # every rank draws the same order for an epoch
    if shuffle:
        assert list(next(iter(orders))) != order  # and epoch 2's differs from epoch 1's


class RecordingModule(ImageClassifierModule):
    """Writes the fingerprints of every training image this rank saw to <out>/rank<r>.json at the end."""

    def __init__(self, out: str):
        super().__init__("lenet")
        self.out, self.seen = out, []

    def training_step(self, batch, batch_idx):
        self.seen += fingerprint(batch[0])
        return super().training_step(batch, batch_idx)

    def on_train_end(self):
        Path(self.out, f"rank{self.global_rank}.json").write_text(json.dumps(self.seen))


def test_two_ddp_processes_train_on_disjoint_covering_shares(tmp_path, tiny_folder, monkeypatch):
    """Lightning DDP on 2 CPU processes (gloo) with the on-device batching (OnDevice): the ranks' training images are
    disjoint and together all of the training split, one epoch each."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    dm_kwargs = dict(image_folder=str(tiny_folder), batch_size=8, val_fraction=0.2, test_fraction=0.0, seed=0,
                     batching=OnDevice("cpu"))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(RecordingModule(str(tmp_path)), datamodule=CIFAR10DataModule(**dm_kwargs))
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    dm = CIFAR10DataModule(**dm_kwargs)
    dm.prepare_data()
    dm.setup("fit")
    everything = fingerprint(next(iter(DeviceBatches(dm.train_set.images, dm.train_set.labels, 10_000)))[0])
    assert len(set(everything)) == len(everything) == 48  # 80 % of the 60 images; the fingerprints tell them apart
    assert len(seen[0]) == len(seen[1]) == 24 and not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == sorted(everything)


def _unsharded_worker(rank, store):
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    torch.distributed.barrier()  # both ranks joined: neither raises while the other still connects (a busy machine)
    try:
        next(iter(DeviceBatches(torch.zeros(4, 3, 2, 2, dtype=torch.uint8), torch.arange(4), 2)))
    finally:
        torch.distributed.destroy_process_group()


def test_unsharded_batches_refuse_a_process_group(tmp_path):
    """A DeviceBatches built for one process, iterated in a 2-process group, stops with the remedy named."""
    with pytest.raises(Exception, match="every rank would train on the same images.*num_replicas=trainer.world_size"):
        torch.multiprocessing.start_processes(_unsharded_worker, args=(str(tmp_path / "store"),), nprocs=2,
                                              start_method="spawn")
