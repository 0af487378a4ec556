"""Reference solution for lesson 03's exercise: decode the JPEG files once, in setup, into one uint8 tensor, then
cut each batch from it and augment it as a batch (on the GPU where there is one: no copies, no workers); and the
seconds each batch takes predicted first, from the ceilings: the ops that cut and augment one batch counted on a
stand-in uint8 tensor (roofline.count: the gather of B images, the pad, the crops' gathers, the mirror, the uint8 to
float conversion) and summed against the ceilings (roofline.step_model: bytes at the bandwidth their size allows, no
faster than each op's floor, plus the fixed cost per op; floors=True times the gathers, the pad and the mirror alone
at their shapes, which compute an address per element). No JPEG is decoded then, so nothing else is left to model."""
import lightning as L
import torch

from course_lib.base import hardware
from course_lib.data import jpeg
from course_lib.data.data import augment_batch, to_float
from course_lib.data.sources import decode_image
from course_lib.measure import roofline


class DecodedOnce(L.LightningDataModule):
    """The first `subset` JPEG files decoded once into (N, 3, 32, 32) uint8; batches by indexing, augmented whole."""

    def __init__(self, batch_size: int, subset: int):
        super().__init__()
        self.batch_size, self.subset, self.images = batch_size, subset, None

    def setup(self, stage=None):
        if self.images is not None:  # fit calls setup again: keep what the first call decoded
            return
        files = jpeg.JpegDataModule(self.batch_size, subset=self.subset)
        files.setup()  # the same seeded file list the JPEG pipeline reads
        samples = [files.train_set.dataset.samples[i] for i in files.train_set.indices]  # (path, label) pairs
        device = "cuda" if hardware.gpu_count() else "cpu"
        self.images = torch.stack([decode_image(path) for path, _ in samples]).to(device)  # decoded once
        self.labels = torch.tensor([label for _, label in samples], device=device)

    def train_dataloader(self):
        return Batches(self.images, self.labels, self.batch_size)


class Batches:
    """One epoch of batches cut from the uint8 tensors in a fresh random order, augmented a batch at a time."""

    def __init__(self, images, labels, batch_size: int):
        self.images, self.labels, self.batch_size = images, labels, batch_size

    def __len__(self):
        return len(self.labels) // self.batch_size  # full batches only: every step has the same shape

    def __iter__(self):
        order = torch.randperm(len(self.labels), device=self.labels.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield to_float(augment_batch(self.images[idx])), self.labels[idx]  # (B, 3, 32, 32) float, (B,)


def make_data(batch_size: int, subset: int):
    """A DataModule that keeps the training step fed: the JPEG subset decoded once, batched by indexing."""
    return DecodedOnce(batch_size, subset)


def predict_batch_seconds(ceil, batch_size: int) -> float:
    """Predicted seconds to deliver one batch of `batch_size` from the decoded tensor, from the ceilings alone."""
    device = "cuda" if hardware.gpu_count() else "cpu"
    images = torch.zeros(4 * batch_size, 3, 32, 32, dtype=torch.uint8, device=device)  # stand-in decoded images
    batches = iter(Batches(images, torch.zeros(4 * batch_size, dtype=torch.long, device=device), batch_size))
    next(batches)  # the epoch's permutation, drawn once per epoch: not a batch's work
    return roofline.step_model(roofline.count(lambda: next(batches), floors=True), ceil).predicted
