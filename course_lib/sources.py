"""Where images come from: class folders of image files (listed, decoded, cached as uint8 tensors) and
torchvision's CIFAR-10 download; and writing tensors back out as an image folder."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from . import config
from .cache import cached_split, ensure_folder
from .errors import CourseError, MissingPathError, SetupError

IMAGE_EXTS = {".jpg", ".jpeg", ".png"}
IMAGE_SIZE = 32  # pixels; images of another size are resized on decode


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


def decode_image(path: Path) -> torch.Tensor:
    """One image file as a (3, 32, 32) uint8 tensor; names the file if it cannot be decoded."""
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (IMAGE_SIZE, IMAGE_SIZE):
                im = im.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
            arr = np.asarray(im)  # (H, W, C) uint8
    except Exception as err:  # PIL raises several types for corrupt or truncated files
        raise CourseError(f"Cannot decode image {path}: {err}. Delete or replace this file.") from err
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def load_image_folder(split_dir: str | Path, cache_dir: str | Path | None = None, load: bool = True) -> dict | None:
    """Decode a class-folder split once into {'images': (N,3,32,32) uint8, 'labels', 'classes'}, cached on disk.

    The cache is verified on load and keyed by the folder's contents (see course_lib.cache); a damaged or stale one is
    rebuilt with one line saying why. With load=False it only makes sure a current cache exists and returns None."""
    split_dir = Path(split_dir)
    files, labels, classes = list_image_folder(split_dir)

    def build() -> dict:
        images = torch.stack([decode_image(f) for f in files])
        return {"images": images, "labels": torch.tensor(labels, dtype=torch.long), "classes": classes}

    return cached_split(split_dir, files, Path(cache_dir or config.data_root() / "cache"), load, build)


def load_torchvision_cifar10(root: str | Path, train: bool, mirror_url: str | None = None) -> dict:
    """torchvision's CIFAR-10 (download with progress and md5 check on first use) as uint8 tensors."""
    from torchvision.datasets import CIFAR10

    ensure_folder(Path(root), "The download folder")  # a file there is not a slow host
    cls = type("CIFAR10Mirror", (CIFAR10,), {"url": mirror_url}) if mirror_url else CIFAR10
    try:
        ds = cls(root=str(root), train=train, download=True)
    except Exception as err:
        raise SetupError(
            f"Could not download CIFAR-10 into {root} ({type(err).__name__}: {err}). Remedies: retry later "
            f"(the official host is often slow); pass mirror_url=<url of cifar-10-python.tar.gz> (CLI: "
            f"--data.mirror_url); put an image folder in place and set COURSE_DATA=<folder> (layout "
            f"<folder>/train/<class>/*.jpg); or set COURSE_DATA_ROOT to a folder that already holds "
            f"cifar-10-batches-py/.") from err
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # (N, 32, 32, 3) -> (N, 3, 32, 32)
    return {"images": images, "labels": torch.tensor(ds.targets, dtype=torch.long), "classes": list(ds.classes)}


def save_image_folder(data: dict, split_dir: str | Path, quality: int = 95) -> Path:
    """Write {'images': (N,3,H,W) uint8, 'labels', 'classes'} as <split_dir>/<class>/<index>.jpg (an image folder)."""
    split_dir = Path(split_dir)
    for name in data["classes"]:
        (split_dir / name).mkdir(parents=True, exist_ok=True)
    for i, (img, label) in enumerate(zip(data["images"], data["labels"].tolist())):
        arr = img.permute(1, 2, 0).numpy()  # (H, W, C) uint8, as PIL expects
        Image.fromarray(arr).save(split_dir / data["classes"][label] / f"{i:05d}.jpg", quality=quality)
    return split_dir
