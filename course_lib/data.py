"""CIFAR-10 behind one DataModule (from torchvision's download or any image folder, see sources), its normalisation
and the crop+flip augmentation."""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from . import config, internals
from .errors import CourseError, MissingPathError
from .sampling import EpochSampler, ResumableLoader
from .sources import list_image_folder, load_image_folder, load_torchvision_cifar10

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
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
    already on x's device cost no copy per call); None leaves [0, 1]."""
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


def _batch_as_is(batch):
    """Collate for ImageTensorDataset: __getitems__ already returns (x, y) batches."""
    return batch


def split_indices(n: int, fractions: list[float], seed: int) -> list[torch.Tensor]:
    """Seeded random split of range(n) into len(fractions)+1 parts; the last part takes the rest; fraction 0: empty."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sizes = [int(round(f * n)) for f in fractions]
    if any(s == 0 and f != 0 for s, f in zip(sizes, fractions)) or min(fractions, default=0) < 0 or sum(sizes) >= n:
        raise CourseError(f"Cannot carve fractions {fractions} from {n} images: each part needs at least one "
                          f"(a fraction of exactly 0 asks for none).")
    return list(torch.split(perm, sizes + [n - sum(sizes)]))


def load_tensor_file(path: str | Path) -> dict:
    """A .pt file of {'images', 'labels', 'classes'} tensors; anything else is one error naming the file and remedy."""
    remedy = (f"{path} (COURSE_DATA or --data.image_folder) must be a tensor file of images, labels and classes, "
              f"such as scripts/gpu_check.py --make-subset writes; or point COURSE_DATA at an image folder")
    try:
        data = torch.load(path, weights_only=True)
    except Exception as err:  # unpickling refused, truncated, not a torch file: torch's text suggests unsafe loads
        raise CourseError(f"{remedy}; it cannot be read as one ({type(err).__name__}).") from None
    if not isinstance(data, dict) or not {"images", "labels", "classes"} <= set(data):
        keys = sorted(map(str, data))[:5] if isinstance(data, dict) else ""
        raise CourseError(f"{remedy}; it holds a {type(data).__name__} {keys}.")
    return data


_LOADED: dict[tuple, dict] = {}  # decoded splits, so that benchmarks building many DataModules read the disk once


class CIFAR10DataModule(L.LightningDataModule):
    """CIFAR-10 (torchvision download), any <root>/<split>/<class>/*.jpg folder, or a saved .pt cache; seeded splits."""

    def __init__(self, *, image_folder: str | None = None, data_dir: str | None = None, test_folder: str | None = None,
                 mirror_url: str | None = None, batch_size: int = 64, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False, augment: bool = False,
                 normalize: bool = True, mean: tuple = CIFAR10_MEAN, std: tuple = CIFAR10_STD,
                 subset: int | None = None, eval_subset: int | None = None, val_fraction: float = 0.1,
                 test_fraction: float = 0.1, seed: int = 0):
        super().__init__()
        self.save_hyperparameters()
        self.data_dir = Path(data_dir) if data_dir else config.data_root()
        self.classes: list[str] = []
        self._resumed_rng_state: torch.Tensor | None = None  # from a checkpoint, for the next training loader
        self._test_source: tuple[Path | None, str] = (None, "test")  # the test images' folder (None: no files), split

    def _load(self, split: str, load: bool = True) -> dict | None:
        """One split's tensors from the chosen source (once per process), or None if the source has no such split."""
        key = (self.hparams.image_folder, str(self.data_dir), split)
        if key in _LOADED:  # decoded in this process already: prepare_data has nothing to check again
            return _LOADED[key] if load else None
        data = self._read(split, load)
        if data is not None:  # torchvision's reader loads even when only asked to prepare: keep what it read
            _LOADED[key] = data  # read-only afterwards: datasets index into it, never write
        return data if load else None

    def _read(self, split: str, load: bool) -> dict | None:
        hp = self.hparams
        if hp.image_folder is None:
            return None if split == "val" else load_torchvision_cifar10(self.data_dir, split == "train",
                                                                        hp.mirror_url)
        if str(hp.image_folder).endswith(".pt"):  # a saved tensor cache (e.g. a subset carried to a GPU machine)
            return load_tensor_file(hp.image_folder) if split == "train" and load else None
        if split != "train" and not (Path(hp.image_folder) / split).is_dir():
            return None
        return load_image_folder(Path(hp.image_folder) / split, self.data_dir / "cache", load=load)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        x, y = batch  # our batches are always (images, labels): skip Lightning's generic collection walk
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def prepare_data(self) -> None:
        """Download (torchvision) or decode into the cache (image folder), once, on one process."""
        if self.hparams.test_folder:
            load_image_folder(self._test_folder(), self.data_dir / "cache", load=False)
        for split in ("train", "test", "val"):
            self._load(split, load=False)

    def setup(self, stage: str | None = None) -> None:
        """Load the tensors and carve validation/test splits from training with a seeded generator."""
        hp = self.hparams
        model_classes = self._model_classes()
        if hp.test_folder and stage in ("test", "predict"):  # grading on foreign images needs no training data
            self.classes = model_classes or (CIFAR10_CLASSES if hp.image_folder is None
                                             else list_image_folder(Path(hp.image_folder) / "train")[2])
            self.test_set = self._dataset(self._foreign_test(hp.test_folder), hp.eval_subset)
            self._test_source = (self._test_folder(), "test_folder")
            return
        train = self._load("train")
        self.classes = train["classes"]
        if model_classes and stage != "fit" and list(model_classes) != list(self.classes):
            raise CourseError(f"The model was trained on classes {model_classes} but the data in "
                              f"{hp.image_folder or 'torchvision CIFAR-10'} have {self.classes}, so its labels would "
                              f"be wrong. Point COURSE_DATA (--data.image_folder) at data with the model's classes, "
                              f"or grade a folder of class-named images with --data.test_folder.")
        val, test = self._by_name(self._load("val"), "val"), self._by_name(self._load("test"), "test")
        source = Path(hp.image_folder) if hp.image_folder and not str(hp.image_folder).endswith(".pt") else None
        self._test_source = (source and source / ("test" if test is not None else "train"),  # names for predict
                             "test" if test is not None else "train")
        carve = ([hp.val_fraction] if val is None else []) + ([hp.test_fraction] if test is None else [])
        parts = split_indices(len(train["labels"]), carve, hp.seed) if carve else [torch.arange(len(train["labels"]))]
        take = lambda d, i: {"images": d["images"][i], "labels": d["labels"][i], "index": i}  # noqa: E731
        val = val if val is not None else take(train, parts.pop(0))
        test = test if test is not None else take(train, parts.pop(0))
        train = take(train, parts.pop(0))
        if hp.test_folder:
            test, self._test_source = self._foreign_test(hp.test_folder), (self._test_folder(), "test_folder")
        self.train_set = self._dataset(train, hp.subset, augment=hp.augment)
        self.val_set = self._dataset(val, hp.eval_subset)
        self.test_set = self._dataset(test, hp.eval_subset)

    def _by_name(self, d: dict | None, split: str) -> dict | None:
        """A val/test split read from its own folder, labelled through the training classes by name (it may lack some:
        its indices would shift); a class that train/ lacks is refused."""
        if d is None or list(d["classes"]) == list(self.classes):
            return d
        unknown = sorted(set(d["classes"]) - set(self.classes))
        if unknown:
            raise CourseError(f"{Path(self.hparams.image_folder) / split} has classes {unknown} that its train/ "
                              f"lacks ({self.classes}). Give both splits the same class folders.")
        remap = torch.tensor([self.classes.index(c) for c in d["classes"]])
        return {**d, "labels": remap[d["labels"]], "classes": list(self.classes)}

    def test_names(self) -> list[str]:
        """Where each test image comes from, in the test set's order: its file, or <split>[i] without files."""
        folder, split = self._test_source
        files = list_image_folder(folder)[0] if folder else None
        return [str(files[i]) if files else f"{split}[{i}]" for i in self.test_set.index.tolist()]

    def _test_folder(self) -> Path:
        """The --data.test_folder path, checked: a missing one is named as the test folder, with its remedy."""
        folder = Path(self.hparams.test_folder)
        if not folder.is_dir():
            raise MissingPathError(f"Test folder {folder} (test_folder=, CLI --data.test_folder) does not exist. "
                                   f"Pass a folder of <class>/*.jpg|png images whose class names the model knows.")
        return folder

    def _model_classes(self) -> list[str] | None:
        """The class names the trainer's model records (from its checkpoint), or None; checked against its head."""
        hp = getattr(getattr(self.trainer, "lightning_module", None), "hparams", {}) if self.trainer else {}
        classes, heads = hp.get("classes"), hp.get("num_classes")
        if classes and heads is not None and len(classes) != heads:
            raise CourseError(f"The model records {len(classes)} classes ({', '.join(classes)}) but its head has "
                              f"{heads} outputs: the checkpoint is inconsistent. Retrain it, or pass the "
                              f"{heads} class names with --model.classes.")
        return list(classes) if classes else None

    def _foreign_test(self, folder: str) -> dict:
        """A <folder>/<class>/*.jpg test set whose class names are mapped onto the model's classes (self.classes)."""
        data = load_image_folder(self._test_folder(), self.data_dir / "cache")
        unknown = sorted(set(data["classes"]) - set(self.classes))
        if unknown:
            raise CourseError(f"Test folder {folder} has classes {unknown} that the model was not trained on; "
                              f"rename them to some of {self.classes}.")
        remap = torch.tensor([self.classes.index(c) for c in data["classes"]])
        return {"images": data["images"], "labels": remap[data["labels"]]}

    def _dataset(self, d: dict, subset: int | None, augment: bool = False) -> ImageTensorDataset:
        """Wrap a split, keeping a seeded random subset of it for small runs."""
        images, labels, index = d["images"], d["labels"], d.get("index", torch.arange(len(d["labels"])))
        if subset is not None and subset < len(labels):
            keep = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams.seed))[:subset]
            images, labels, index = images[keep], labels[keep], index[keep]
        mean, std = (self.hparams.mean, self.hparams.std) if self.hparams.normalize else (None, None)
        return ImageTensorDataset(images, labels, mean, std, augment, index=index)

    def _loader(self, ds: ImageTensorDataset, train: bool) -> DataLoader:
        hp = self.hparams
        kwargs = dict(batch_size=hp.batch_size, num_workers=hp.num_workers, pin_memory=hp.pin_memory,
                      collate_fn=_batch_as_is, persistent_workers=hp.persistent_workers and hp.num_workers > 0)
        if not train:
            return DataLoader(ds, **kwargs)
        rng_state, self._resumed_rng_state = self._resumed_rng_state, None
        return ResumableLoader(ds, sampler=EpochSampler(len(ds), hp.seed), position=self._batches_done,
                               rng_state=rng_state, **kwargs)

    def state_dict(self) -> dict:
        """Saved in every checkpoint: the CPU random state, which a resumed run restores at its next batch."""
        return {"rng_state": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        self._resumed_rng_state = state.get("rng_state")

    def _batches_done(self) -> int:
        """Training batches of the current epoch done so far (restored from the checkpoint when a run resumes)."""
        return internals.epoch_batch_progress(self.trainer).ready if self.trainer else 0

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False)
