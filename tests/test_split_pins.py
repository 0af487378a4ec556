"""The splits a seed gives are pinned: the indices below were printed by the stacked DataModules (CIFAR10DataModule,
SpeedrunDataModule) before the data layer was composed as one DataModule with batching strategies (issue 45,
item 3), so a refactor cannot move them."""
from __future__ import annotations

import pytest
import torch

from course_lib.data.data import Split, carve_splits


def weighted(index: torch.Tensor) -> int:
    """An order-sensitive fingerprint of an index tensor: sum of index[i] * (i + 1)."""
    return int((index * torch.arange(1, len(index) + 1)).sum())


@pytest.mark.parametrize("n, val, test, seed, pins", [
    (50000, 0.1, 0.1, 0, [(40000, [39035, 39296, 40033, 2827, 414], 20025337998161),
                          (5000, [36044, 49165, 37807, 11341, 6091], 307822866789),
                          (5000, [26331, 42223, 4319, 39099, 17698], 314863838216)]),
    (50000, 0.0, 0.1, 0, [(45000, [26331, 42223, 4319, 39099, 17698], 25338529131377), (0, [], 0),
                          (5000, [36044, 49165, 37807, 11341, 6091], 307822866789)]),
    (50000, 0.1, 0.1, 3, [(40000, [33596, 47062, 32910, 784, 16166], 19951224973184),
                          (5000, [8986, 17124, 43401, 20135, 26324], 316357807969),
                          (5000, [49466, 23016, 31944, 26045, 40504], 314784645981)]),
    (60, 0.1, 0.1, 0, [(48, [9, 35, 34, 26, 32], 34992), (6, [44, 49, 19, 3, 47], 458),
                       (6, [31, 43, 25, 48, 11], 757)]),
])
def test_carve_splits_gives_the_pinned_indices(n, val, test, seed, pins):
    """CIFAR-10's 50,000 training images carved as the lessons (val 0.1, test 0.1) and the speedrun (val 0) carve."""
    whole = Split(torch.empty(n, 0), torch.zeros(n, dtype=torch.long), torch.arange(n))
    parts = carve_splits(whole, None, None, val_fraction=val, test_fraction=test, seed=seed)
    assert [(len(p.index), p.index[:5].tolist(), weighted(p.index)) for p in parts] == pins


SUBSET_PINS = [
    ("loader", dict(subset=10, eval_subset=3, seed=0),
     [[17, 27, 52, 29, 45, 7, 24, 42, 18, 10], [19, 2, 3], [25, 53, 48]]),
    ("loader", dict(seed=2),
     [[59, 7, 13, 53, 14, 46, 4, 11, 40, 27, 3, 9, 43, 18, 6, 39, 21, 44, 35, 52, 26, 47, 0, 55, 16, 28, 15, 56, 34,
       38, 31, 58, 1, 2, 19, 22, 37, 25, 32, 36, 54, 41, 5, 24, 51, 57, 8, 23],
      [48, 33, 17, 45, 50, 29], [42, 12, 20, 30, 10, 49]]),
    ("speedrun", dict(seed=0, subset=20),
     [[7, 30, 48, 40, 1, 59, 24, 28, 56, 12, 36, 35, 21, 46, 13, 57, 25, 43, 39, 37], [], [44, 49, 19, 3, 47, 2]]),
]


@pytest.mark.parametrize("kind, kw, pins", SUBSET_PINS)
def test_datamodule_splits_and_subsets_are_the_pinned_images(tiny_folder, tmp_path, kind, kw, pins):
    """The DataModule's train/val/test images (their places in the folder), subsets included, for a seed."""
    from course_lib.training import runs

    sizes = {"subset": None, "eval_subset": None}  # not the run size's subsets: only those the pins name
    dm = runs.datamodule(kind=kind, image_folder=str(tiny_folder), data_dir=str(tmp_path / "data"), **{**sizes, **kw})
    dm.prepare_data()
    dm.setup("fit")
    assert [getattr(dm, name).index.tolist() for name in ("train_set", "val_set", "test_set")] == pins
