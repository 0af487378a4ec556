"""Where images come from: the one decision of a source's format (open_source: torchvision's CIFAR-10 download, a
folder of <split>/<class>/*.jpg files decoded once into a uint8 cache, or a .pt file: decoded tensors or a JPEG pack),
each source with ensure_cached(split) for prepare_data and load(split) for setup; and writing tensors back out as an
image folder or a JPEG pack (save_jpeg_pack, the compact file carried to a GPU machine)."""
from __future__ import annotations

import io
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..base import config
from .cache import cached_split, ensure_cached_split, ensure_folder
from ..base.errors import CourseError, MissingPathError, SetupError

IMAGE_EXTS = {".jpg", ".jpeg", ".png"}
IMAGE_SIZE = 32  # pixels; images of another size are resized on decode
SPLITS = ("train", "val", "test")
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def list_image_folder(split_dir: str | Path) -> tuple[list[Path], list[int], list[str]]:
    """Files, labels and class names of a <split_dir>/<class>/*.jpg|png folder; clear errors for bad layouts."""
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise MissingPathError(f"Image folder {split_dir} does not exist. Check the path, or unset COURSE_DATA "
                               f"to download CIFAR-10 instead.")
    loose = sorted(p.name for p in split_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTS)
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if loose or not classes:
        raise CourseError(f"Wrong layout in {split_dir}: expected one sub-folder per class holding the images "
                          f"(<root>/<split>/<class>/*.jpg), found {len(classes)} class folders and "
                          f"{len(loose)} loose images (e.g. {loose[:3]}). Move the images into class folders.")
    files, labels = [], []
    for label, name in enumerate(classes):
        imgs = sorted(p for p in (split_dir / name).iterdir() if p.suffix.lower() in IMAGE_EXTS)
        if not imgs:
            raise CourseError(f"Class folder {split_dir / name} holds no .jpg/.jpeg/.png images. "
                              f"Add images or remove the folder.")
        files += imgs
        labels += [label] * len(imgs)
    return files, labels, classes


def decode_image(path: Path | io.BytesIO) -> torch.Tensor:
    """One image file (or its bytes) as a (3, 32, 32) uint8 tensor; names the file if it cannot be decoded."""
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (IMAGE_SIZE, IMAGE_SIZE):
                im = im.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
            arr = np.asarray(im)  # (H, W, C) uint8
    except Exception as err:  # PIL raises several types for corrupt or truncated files
        raise CourseError(f"Cannot decode image {path}: {err}. Delete or replace this file.") from err
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def _decoder(files: list[Path], labels: list[int], classes: list[str]):
    """build() for the cache: decode the listed files into {'images': (N,3,32,32) uint8, 'labels', 'classes'}."""
    return lambda: {"images": torch.stack([decode_image(f) for f in files]),
                    "labels": torch.tensor(labels, dtype=torch.long), "classes": classes}


def load_image_folder(split_dir: str | Path, cache_dir: str | Path | None = None) -> dict:
    """A class-folder split as {'images': (N,3,32,32) uint8, 'labels', 'classes'}, from its verified on-disk cache
    (keyed by the folder's contents, see course_lib.data.cache), decoding and writing it first where needed."""
    split_dir = Path(split_dir)
    listing = list_image_folder(split_dir)
    return cached_split(split_dir, listing[0], Path(cache_dir or config.data_root() / "cache"), _decoder(*listing))


def cache_image_folder(split_dir: str | Path, cache_dir: str | Path | None = None) -> None:
    """Make sure a current cache of a class-folder split exists (decoding it where none does); reads nothing."""
    split_dir = Path(split_dir)
    listing = list_image_folder(split_dir)
    ensure_cached_split(split_dir, listing[0], Path(cache_dir or config.data_root() / "cache"), _decoder(*listing))


def _torchvision_cifar10(root: Path, train: bool, mirror_url: str | None):
    """torchvision's CIFAR10 dataset (downloaded with progress and md5 check on first use), errors with remedies."""
    from torchvision.datasets import CIFAR10

    ensure_folder(Path(root), "The download folder")  # a file there is not a slow host
    cls = type("CIFAR10Mirror", (CIFAR10,), {"url": mirror_url}) if mirror_url else CIFAR10
    try:
        return cls(root=str(root), train=train, download=True)
    except Exception as err:
        raise SetupError(
            f"Could not download CIFAR-10 into {root} ({type(err).__name__}: {err}). Remedies: retry later "
            f"(the official host is often slow); pass mirror_url=<url of cifar-10-python.tar.gz> (CLI: "
            f"--data.mirror_url); put an image folder in place and set COURSE_DATA=<folder> (layout "
            f"<folder>/train/<class>/*.jpg); or set COURSE_DATA_ROOT to a folder that already holds "
            f"cifar-10-batches-py/.") from err


def load_torchvision_cifar10(root: str | Path, train: bool, mirror_url: str | None = None) -> dict:
    """torchvision's CIFAR-10 (downloaded on first use) as uint8 tensors."""
    ds = _torchvision_cifar10(Path(root), train, mirror_url)
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # (N, 32, 32, 3) -> (N, 3, 32, 32)
    return {"images": images, "labels": torch.tensor(ds.targets, dtype=torch.long), "classes": list(ds.classes)}


JPEG_PACK_KEYS = {"jpeg", "offsets", "labels", "classes"}  # a JPEG pack: the files' bytes end to end, (N + 1) offsets


def save_jpeg_pack(split_dir: str | Path, out: str | Path) -> int:
    """Pack a <split_dir>/<class>/*.jpg folder's files, in the cache's order (sorted by class, then name), as one .pt
    file of their bytes plus offsets, labels and classes (a compact file to carry); returns the images packed."""
    files, labels, classes = list_image_folder(split_dir)
    blobs = [f.read_bytes() for f in files]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save({"jpeg": torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8),
                "offsets": torch.tensor([0] + [len(b) for b in blobs]).cumsum(0), "labels": torch.tensor(labels),
                "classes": classes}, out)
    return len(files)


def is_jpeg_pack(path: str | Path) -> bool:
    """Whether a .pt file is a JPEG pack (save_jpeg_pack) rather than decoded tensors."""
    data = torch.load(path, weights_only=True, mmap=True)
    return isinstance(data, dict) and JPEG_PACK_KEYS <= set(data)


def decode_jpeg_pack(data: dict) -> dict:
    """A JPEG pack's images decoded by the one decoder (decode_image, as a folder's files) into {'images':
    (N, 3, 32, 32) uint8, 'labels', 'classes'}."""
    off, raw = data["offsets"].tolist(), data["jpeg"].numpy()
    images = [decode_image(io.BytesIO(raw[a:b].tobytes())) for a, b in zip(off[:-1], off[1:])]
    return {"images": torch.stack(images), "labels": data["labels"], "classes": list(data["classes"])}


def load_tensor_file(path: str | Path) -> dict:
    """A .pt file of {'images', 'labels', 'classes'} tensors, or a JPEG pack (decoded); anything else is one error
    naming the file and remedy."""
    remedy = (f"{path} (COURSE_DATA or --data.image_folder) must be a tensor file of images, labels and classes, "
              f"such as python -m scripts.gpu_check --make-subset writes (or a JPEG pack, as python -m "
              f"scripts.gpu_capstone --make-data writes); or point COURSE_DATA at an image folder")
    try:
        data = torch.load(path, weights_only=True)
    except Exception as err:  # unpickling refused, truncated, not a torch file: torch's text suggests unsafe loads
        raise CourseError(f"{remedy}; it cannot be read as one ({type(err).__name__}).") from None
    if isinstance(data, dict) and JPEG_PACK_KEYS <= set(data):
        return decode_jpeg_pack(data)
    if not isinstance(data, dict) or not {"images", "labels", "classes"} <= set(data):
        keys = sorted(map(str, data))[:5] if isinstance(data, dict) else ""
        raise CourseError(f"{remedy}; it holds a {type(data).__name__} {keys}.")
    return data


@dataclass(frozen=True)
class ImageFolderSource:
    """<root>/train/<class>/*.jpg (val/ and test/ beside it optional), decoded once into cache_dir's uint8 cache."""

    root: Path
    cache_dir: Path

    def folder(self, split: str) -> Path | None:
        """The split's folder of files, or None where this source has no such split (train/ always: checked later)."""
        return self.root / split if split == "train" or (self.root / split).is_dir() else None

    def classes(self) -> list[str]:
        return list_image_folder(self.root / "train")[2]

    def ensure_cached(self, split: str) -> None:
        if self.folder(split):
            cache_image_folder(self.folder(split), self.cache_dir)

    def load(self, split: str) -> dict | None:
        return load_image_folder(self.folder(split), self.cache_dir) if self.folder(split) else None


@dataclass(frozen=True)
class TensorFileSource:
    """A .pt file of {'images', 'labels', 'classes'} training images (e.g. a subset carried to a GPU machine)."""

    path: Path

    def folder(self, split: str) -> None:
        return None  # no image files behind it

    def classes(self) -> list[str]:
        return list(load_tensor_file(self.path)["classes"])

    def ensure_cached(self, split: str) -> None:
        return None  # the file is its own cache

    def load(self, split: str) -> dict | None:
        return load_tensor_file(self.path) if split == "train" else None


@dataclass(frozen=True)
class TorchvisionSource:
    """torchvision's CIFAR-10 download (train and test, no val) into root, from its official host or mirror_url."""

    root: Path
    mirror_url: str | None = None

    def folder(self, split: str) -> None:
        return None  # the download holds arrays, not image files

    def classes(self) -> list[str]:
        return list(CIFAR10_CLASSES)

    def ensure_cached(self, split: str) -> None:
        if split != "val":
            _torchvision_cifar10(self.root, split == "train", self.mirror_url)  # downloads once, checks the md5

    def load(self, split: str) -> dict | None:
        return None if split == "val" else load_torchvision_cifar10(self.root, split == "train", self.mirror_url)


Source = ImageFolderSource | TensorFileSource | TorchvisionSource


def open_source(path: str | Path | None, *, data_dir: str | Path, mirror_url: str | None = None) -> Source:
    """The one decision of a data source's format: None (or 'torchvision') is the download into data_dir, a file is a
    tensor file, anything else an image folder (a missing one is reported, with its remedy, when it is read)."""
    if path is None or str(path).strip() in ("", "torchvision"):
        return TorchvisionSource(Path(data_dir), mirror_url)
    path = Path(path).expanduser()
    return TensorFileSource(path) if path.is_file() else ImageFolderSource(path, Path(data_dir) / "cache")


class LoadedSplits:
    """Splits read from their sources, keyed by (source, split), the most recent `size` kept: a cache object that a
    caller passes to the DataModules sharing a source (runs.datamodule(loaded=...)), so that a benchmark building many
    reads the disk cache once. Owned by its caller, never process-wide: a new one reads afresh. Loaded splits are
    read-only: datasets index into them."""

    def __init__(self, size: int = 8):
        self.size, self._splits = size, OrderedDict()

    def holds(self, source: Source, split: str) -> bool:
        return (source, split) in self._splits

    def load(self, source: Source, split: str) -> dict | None:
        """source.load(split), from memory when this object loaded it already."""
        key = (source, split)
        if key not in self._splits:
            self._splits[key] = source.load(split)
            if len(self._splits) > self.size:
                self._splits.popitem(last=False)
        self._splits.move_to_end(key)
        return self._splits[key]


def save_image_folder(data: dict, split_dir: str | Path, quality: int = 95) -> Path:
    """Write {'images': (N,3,H,W) uint8, 'labels', 'classes'} as <split_dir>/<class>/<index>.jpg (an image folder)."""
    split_dir = Path(split_dir)
    for name in data["classes"]:
        (split_dir / name).mkdir(parents=True, exist_ok=True)
    for i, (img, label) in enumerate(zip(data["images"], data["labels"].tolist())):
        arr = img.permute(1, 2, 0).numpy()  # (H, W, C) uint8, as PIL expects
        Image.fromarray(arr).save(split_dir / data["classes"][label] / f"{i:05d}.jpg", quality=quality)
    return split_dir
