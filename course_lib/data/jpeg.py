"""The classic input pipeline that lesson 03 starts from: CIFAR-10 as JPEG files, opened and decoded by PIL and
augmented one image at a time by torchvision.transforms.v2 inside a DataLoader, as most tutorials build it."""
from __future__ import annotations

import copy
import functools
import shutil
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Subset
from torchvision import datasets
from torchvision.transforms import v2

from ..base import config
from .data import CIFAR10_MEAN, CIFAR10_STD
from .sources import ImageFolderSource, TensorFileSource, open_source, save_image_folder


@functools.lru_cache(maxsize=4)
def file_list(folder: str) -> datasets.ImageFolder:
    """<folder>/train's ImageFolder (no transform), listed once per process and folder: lesson 03's ladder builds a
    DataModule per rung, and scanning 50,000 file names each time would be timed as part of every rung. A folder
    whose files change within the process is not listed again (file_list.cache_clear())."""
    return datasets.ImageFolder(f"{folder}/train")


def jpeg_folder(source: str | None, data_root: str | Path | None = None, mirror_url: str | None = None) -> Path:
    """The training JPEGs as <folder>/train/<class>/*.jpg: `source`, config.data_source()'s answer (not resolved
    again here), where it names a folder; where it is None (the download), a folder written once under the data root
    from the same torchvision download the DataModule reads (a half-written one is rebuilt)."""
    chosen = open_source(source, data_dir=Path(data_root or config.data_root()), mirror_url=mirror_url)
    if isinstance(chosen, TensorFileSource):
        raise FileNotFoundError(f"{source} is a file: the JPEG pipeline reads image files, laid out as "
                                f"<folder>/train/<class>/*.jpg. Point {config.DATA_ENV} at such a folder, or set "
                                f"it to 'torchvision' to download CIFAR-10.")
    if isinstance(chosen, ImageFolderSource):
        return chosen.root
    folder = chosen.root / "cifar10-jpeg"
    done = folder / "train" / ".complete"  # written last
    if not done.exists():
        try:
            train = chosen.load("train")
        except RuntimeError as err:
            raise RuntimeError(
                f"No CIFAR-10 JPEG folder here: {config.DATA_ENV} is unset and {config.shared_data_folder()} "
                f"absent (or {config.DATA_ENV}=torchvision), and downloading CIFAR-10 into {folder.parent} failed "
                f"({err.__cause__ or err}). Remedies: set {config.DATA_ENV}=<folder> to a folder laid out as "
                f"<folder>/train/<class>/*.jpg, or connect to the internet once so CIFAR-10 can be downloaded "
                f"(170 MB, checksum verified).") from err
        shutil.rmtree(folder / "train", ignore_errors=True)
        print(f"Writing the {len(train['labels'])} training images as JPEG class folders in {folder} ...")
        save_image_folder(train, folder / "train")
        done.touch()
    return folder


def per_image_transform() -> v2.Compose:
    """Random crop (4 px zero padding), mirror, float in [0, 1], normalise: one call per image."""
    return v2.Compose([v2.RandomCrop(32, padding=4), v2.RandomHorizontalFlip(), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(CIFAR10_MEAN, CIFAR10_STD)])


class JpegDataModule(L.LightningDataModule):
    """Training batches from JPEG files: per step, batch_size files opened, decoded and augmented one by one.

    image_folder: <folder>/train/<class>/*.jpg; None: the course's data source (config.data_source()), resolved once
    here; where that is torchvision's download, prepare_data writes the JPEG folder from it once."""

    def __init__(self, batch_size: int = 64, num_workers: int = 0, pin_memory: bool = False,
                 persistent_workers: bool = False, subset: int | None = None, seed: int = 0, *,
                 image_folder: str | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.source = config.data_source(image_folder)  # a missing folder fails here, naming the remedy

    def prepare_data(self) -> None:
        jpeg_folder(self.source)  # downloads and writes the folder once where there is none

    def setup(self, stage: str | None = None) -> None:
        full = file_list(str(jpeg_folder(self.source)))
        files = copy.copy(full)  # the same file list (no second scan of the folder), this module's transform
        files.transform = per_image_transform()
        keep = torch.randperm(len(full), generator=torch.Generator().manual_seed(self.hparams.seed))
        self.train_set = Subset(files, keep[:self.hparams.subset or len(full)].tolist())

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        return DataLoader(self.train_set, batch_size=hp.batch_size, shuffle=True, num_workers=hp.num_workers,
                          pin_memory=hp.pin_memory, persistent_workers=hp.persistent_workers and hp.num_workers > 0)
