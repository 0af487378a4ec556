"""CIFAR-10 behind one DataModule (its images from the one source sources.open_source chooses), its normalisation
and the crop+flip augmentation."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import Dataset, random_split

from ..base import config, hardware, internals
from ..base.errors import CourseError, MissingPathError
from .sampling import Batching, Loader
from .sources import CIFAR10_CLASSES as CIFAR10_CLASSES  # re-exported: the lessons import it from here
from .sources import SPLITS, LoadedSplits, Source, list_image_folder, load_image_folder, open_source

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)  # per-channel statistics of the CIFAR-10 training images
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
def crop_flip(x: torch.Tensor, shifts: torch.Tensor, flips: torch.Tensor, pad: int,
              mode: str = "constant") -> torch.Tensor:
    """The one crop+flip kernel: crop each image of a (B, C, H, W) batch at offset shifts[:, i] of its padded copy
    (pad pixels each side, zeros or reflection), then mirror the images where flips[i]; any device."""
    b, c, h, w = x.shape
    if pad > 0:
        x = torch.nn.functional.pad(x, (pad,) * 4, mode=mode)  # (B, C, H + 2 pad, W + 2 pad)
        # two gathers (rows, then columns): 1.7x faster than one 4-D index, measured on 2 EPYC cores at batch 512
        rows = (shifts[0][:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
        x = x.gather(2, rows.expand(b, c, h, w + 2 * pad))  # (B, C, H, W + 2 pad)
        cols = (shifts[1][:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
        x = x.gather(3, cols.expand(b, c, h, w))  # (B, C, H, W)
    return torch.where(flips[:, None, None, None], x.flip(3), x)


def augment_batch(x: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Random crop with zero padding plus horizontal flip, drawn on the batch's device (lessons 03-05)."""
    shifts = torch.randint(0, 2 * pad + 1, (2, len(x)), device=x.device)  # each image's crop offset
    return crop_flip(x, shifts, torch.rand(len(x), device=x.device) < 0.5, pad)


def to_float(x: torch.Tensor, mean=CIFAR10_MEAN, std=CIFAR10_STD) -> torch.Tensor:
    """The course's one normalisation: pixels (B, C, H, W) in [0, 255], uint8 or float, to a new float32 tensor
    (x / 255 - mean) / std per channel. mean/std: per-channel sequences or (C,) tensors in [0, 1] units (tensors
    already on x's device cost no copy per call); None leaves [0, 1]. Not torchvision's v2.functional.to_dtype(scale=
    True) + normalize: it multiplies by 1/255 where this divides by 255 (up to 5e-7 apart, so the lessons' committed
    numbers would move), and it leaves a float input unscaled."""
    x = x.to(torch.float32, copy=True).div_(255)  # a copy: a float input stays the caller's
    if mean is None:
        return x
    m = torch.as_tensor(mean, dtype=torch.float32, device=x.device).reshape(-1, 1, 1)  # (C, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=x.device).reshape(-1, 1, 1)
    return x.sub_(m).div_(s)


class ImageTensorDataset(Dataset):
    """uint8 images in memory, normalised (and optionally augmented) a whole batch at a time."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                 augment: bool = False, index: torch.Tensor | None = None):
        self.images, self.labels, self.mean, self.std, self.augment = images, labels, mean, std, augment
        self.index = torch.arange(len(labels)) if index is None else index  # each image's position in its source

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        x, y = self.__getitems__([i])
        return x[0], y[0]

    def __getitems__(self, idx: list[int]):
        """A whole batch at once: the DataLoader calls this instead of __getitem__ per sample."""
        idx = torch.as_tensor(idx)
        x = self.images[idx]
        x = augment_batch(x.float()) if self.augment else x  # augmentation on float pixels, still in [0, 255]
        return to_float(x, self.mean, self.std), self.labels[idx]


def split_indices(n: int, fractions: list[float], seed: int) -> list[torch.Tensor]:
    """Seeded random split of range(n) into len(fractions)+1 parts; the last part takes the rest; fraction 0: empty.
    The part sizes are rounded here, not by random_split (it floors fractions and hands out the remainder)."""
    sizes = [int(round(f * n)) for f in fractions]
    if any(s == 0 and f != 0 for s, f in zip(sizes, fractions)) or min(fractions, default=0) < 0 or sum(sizes) >= n:
        raise CourseError(f"Cannot carve fractions {fractions} from {n} images: each part needs at least one "
                          f"(a fraction of exactly 0 asks for none).")
    parts = random_split(range(n), sizes + [n - sum(sizes)], generator=torch.Generator().manual_seed(seed))
    return [torch.tensor(part.indices, dtype=torch.long) for part in parts]


@dataclass(frozen=True)
class Split:
    """One split: images (N, 3, H, W) uint8, labels (N,), and each image's position in its source (its file name)."""

    images: torch.Tensor
    labels: torch.Tensor
    index: torch.Tensor

    @classmethod
    def whole(cls, data: dict) -> Split:
        """A source's loaded split ({'images', 'labels', ...}), every image in its order."""
        return cls(data["images"], data["labels"], torch.arange(len(data["labels"])))

    def take(self, i: torch.Tensor) -> Split:
        """The images at positions i, keeping where each came from."""
        return Split(self.images[i], self.labels[i], self.index[i])


def carve_splits(train: Split, val: Split | None, test: Split | None, *, val_fraction: float, test_fraction: float,
                 seed: int) -> tuple[Split, Split, Split]:
    """The one carving of (train, val, test): val and test from their own folders where the source has them, else
    seeded random parts of train (split_indices); the rest trains. Pure: the same arguments give the same splits."""
    carve = ([val_fraction] if val is None else []) + ([test_fraction] if test is None else [])
    parts = split_indices(len(train.labels), carve, seed) if carve else [torch.arange(len(train.labels))]
    val = val if val is not None else train.take(parts.pop(0))
    test = test if test is not None else train.take(parts.pop(0))
    return train.take(parts.pop(0)), val, test


def take_subset(split: Split, subset: int | None, seed: int) -> Split:
    """A seeded random `subset` of a split's images (all of them where subset is None or not smaller)."""
    if subset is None or subset >= len(split.labels):
        return split
    return split.take(torch.randperm(len(split.labels), generator=torch.Generator().manual_seed(seed))[:subset])


def relabel(data: dict, classes: list[str], refusal: Callable[[list[str]], str]) -> dict:
    """A loaded split labelled through `classes` by name (the class remapping, written once; it may lack some); a
    class that `classes` lacks is a CourseError with the message refusal(those classes)."""
    if list(data["classes"]) == list(classes):
        return data
    unknown = sorted(set(data["classes"]) - set(classes))
    if unknown:
        raise CourseError(refusal(unknown))
    remap = torch.tensor([list(classes).index(c) for c in data["classes"]])
    return {**data, "labels": remap[data["labels"]], "classes": list(classes)}


def class_folder_split(folder: Path, classes: list[str], cache_dir: Path) -> tuple[Split, list[str]]:
    """A <folder>/<class>/*.jpg|png folder (decoded once into cache_dir) as a Split labelled through `classes` by name,
    and its files in the split's order: held-out images from elsewhere (the CLI's --test_folder). A missing folder,
    or a class that `classes` lacks, is refused with its remedy."""
    if not folder.is_dir():
        raise MissingPathError(f"Test folder {folder} (CLI --test_folder) does not exist. Pass a folder of "
                               f"<class>/*.jpg|png images whose class names the model knows.")
    data = relabel(load_image_folder(folder, cache_dir), classes, lambda unknown: f"Test folder {folder} has classes "
                   f"{unknown} that the model was not trained on; rename them to some of {list(classes)}.")
    return Split.whole(data), [str(f) for f in list_image_folder(folder)[0]]


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 (torchvision download), any <root>/<split>/<class>/*.jpg folder, or a saved .pt tensor file, chosen
    once here (sources.open_source); seeded splits (carve_splits). Normalised with CIFAR-10's statistics
    (normalize=False: [0, 1]). `batching` serves the splits: Loader() (default, a DataLoader), ondevice.OnDevice()
    (the splits on the accelerator) or ondevice.Speedrun() (lesson 08's). The splits it reads are its own (`loaded`).
    `classes`: the class names in label order, a trained model's (the CLI passes a checkpoint's): the data are
    labelled through them by name; None: the source's own. It never reads the model. hold_out() replaces the test
    split with images from elsewhere (the CLI's --test_folder); no path to them is kept here."""

    def __init__(self, *, image_folder: str | None = None, data_dir: str | None = None, mirror_url: str | None = None,
                 batch_size: int = 64, augment: bool = False, normalize: bool = True, subset: int | None = None,
                 eval_subset: int | None = None, val_fraction: float = 0.1,
                 test_fraction: float = 0.1, seed: int = 0, batching: Batching | None = None,
                 classes: list[str] | None = None):
        super().__init__()
        # classes: the model's hyperparameter (linked from .classes), so not this one's too (Lightning merges the two)
        self.save_hyperparameters(ignore=["batching", "classes"])
        self.batching = batching if batching is not None else Loader()
        self.data_dir = Path(data_dir) if data_dir else config.data_root()
        self.source: Source = open_source(image_folder, data_dir=self.data_dir, mirror_url=mirror_url)
        self._classes: list[str] | None = list(classes) if classes else None
        self.loaded = LoadedSplits()  # the splits it read, its own (runs.datamodule(loaded=...) shares one)
        self.resumed_rng_state: torch.Tensor | None = None  # from a checkpoint, for the next training loader
        self._test_source: tuple[Path | list[str] | None, str] = (None, "test")  # the test images' folder or files
        self._held_out: tuple[Split, list[str] | None] | None = None  # hold_out()'s images and their files

    @property
    def classes(self) -> list[str]:
        """The class names in label order: those given, else the source's own (listed, not decoded). The CLI links
        them to the model's `classes` (LightningCLI link_arguments), so that every checkpoint records them."""
        if self._classes is None:
            self._classes = self.source.classes()
        return self._classes

    def normalisation(self) -> tuple:
        """(mean, std) for data.to_float: CIFAR-10's per-channel statistics, or (None, None) for pixels in [0, 1]."""
        return (CIFAR10_MEAN, CIFAR10_STD) if self.hparams.normalize else (None, None)

    def device(self) -> torch.device:
        """Where the batches go: the Trainer's device, or without a Trainer the GPU if there is one, else the CPU."""
        if self.trainer:
            return self.trainer.strategy.root_device
        return torch.device("cuda" if hardware.gpu_count() else "cpu")

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        x, y = batch  # our batches are always (images, labels): skip Lightning's generic collection walk
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def prepare_data(self) -> None:
        """Download (torchvision) or decode into the on-disk cache (image folder), on one process; sets no state. A
        split this DataModule has loaded already was read from that cache, so it is not listed and checked again."""
        for split in SPLITS:
            if not self.loaded.holds(self.source, split):
                self.source.ensure_cached(split)

    def _load(self, split: str) -> dict | None:
        """source.load(split), once per `loaded` (a second setup, e.g. test after fit, reads nothing)."""
        return self.loaded.load(self.source, split)

    def setup(self, stage: str | None = None) -> None:
        """Load the tensors and carve validation/test splits from training with a seeded generator (once: the
        splits never change), then let the batching strategy place them."""
        hp = self.hparams
        if self._held_out is not None and stage in ("test", "predict"):  # held-out images need no training data
            split, files = self._held_out
            self.test_set, self._test_source = self._dataset(split, hp.eval_subset), (files, "held_out")
            return self.batching.place(self)
        if getattr(self, "train_set", None) is not None:
            return
        train = self._load("train")
        self._check_classes(train["classes"])
        val, test = (self._own_split(split) for split in ("val", "test"))
        test_split = "test" if test is not None else "train"
        self._test_source = (self.source.folder(test_split), test_split)  # the files predict names, if any
        train, val, test = carve_splits(Split.whole(train), val, test, val_fraction=hp.val_fraction,
                                        test_fraction=hp.test_fraction, seed=hp.seed)
        self.train_set = self._dataset(train, hp.subset, augment=hp.augment)
        self.val_set = self._dataset(val, hp.eval_subset)
        self.test_set = self._dataset(test, hp.eval_subset)
        self.batching.place(self)

    def _check_classes(self, found: list[str]) -> None:
        """Refuse data whose classes are not the given ones (a trained model's): its labels would be wrong."""
        if list(found) != list(self.classes):
            raise CourseError(f"The model was trained on classes {self.classes} but the data in "
                              f"{self.hparams.image_folder or 'torchvision CIFAR-10'} have {list(found)}, so its "
                              f"labels would be wrong. Point COURSE_DATA (--data.image_folder) at data with the "
                              f"model's classes, grade a folder of class-named images with --test_folder, or "
                              f"train a new model on these data.")

    def _own_split(self, split: str) -> Split | None:
        """A val/test split read from the source's own folder (None where it has none), labelled through the training
        classes by name."""
        data = self._load(split)
        if data is None:
            return None
        return Split.whole(relabel(data, self.classes, lambda unknown: f"{Path(self.hparams.image_folder) / split} "
                                   f"has classes {unknown} that its train/ lacks ({self.classes}). Give both splits "
                                   f"the same class folders."))

    def test_names(self) -> list[str]:
        """Where each test image comes from, in the test set's order: its file, or <split>[i] without files."""
        where, split = self._test_source
        files = list_image_folder(where)[0] if isinstance(where, Path) else where
        return [str(files[i]) if files else f"{split}[{i}]" for i in self.test_set.index.tolist()]

    def hold_out(self, split: Split, files: list[str] | None = None) -> None:
        """Test and predict on `split` (labelled in self.classes: class_folder_split's) instead of the carved test
        split; `files`: each image's file, in the split's order (predict names them). Set before the Trainer runs."""
        self._held_out = (split, files)

    def _dataset(self, split: Split, subset: int | None, augment: bool = False) -> ImageTensorDataset:
        """Wrap a split, keeping a seeded random subset of it for small runs."""
        split = take_subset(split, subset, self.hparams.seed)
        return ImageTensorDataset(split.images, split.labels, *self.normalisation(), augment, index=split.index)

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the CPU random state, which a resumed run restores at its next batch."""
        return {"rng_state": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self.resumed_rng_state = state.get("rng_state")

    def batches_done(self) -> int:
        """Training batches of the current epoch done so far (restored from the checkpoint when a run resumes)."""
        return internals.epoch_batch_progress(self.trainer).ready if self.trainer else 0

    def train_dataloader(self):
        return self.batching.loader(self, self.train_set, train=True)

    def val_dataloader(self):
        return self.batching.loader(self, self.val_set, train=False)

    def test_dataloader(self):
        return self.batching.loader(self, self.test_set, train=False)

    def predict_dataloader(self):
        return self.batching.loader(self, self.test_set, train=False)
