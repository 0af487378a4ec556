"""Reference solution for lesson 03's exercise: the decoded uint8 cache (no JPEG decoding per step), batch-wise
augmentation, and worker processes that keep batches ready (pinned on a GPU); on a GPU, data on the device."""
import torch

from course_lib import runs

LESSON = "03_gpu_and_data"


def make_data(batch_size: int):
    """A DataModule that keeps the training step fed: decoded cache + workers, or the whole split on the GPU."""
    if torch.cuda.is_available():  # augmentation on the device, no copies, no workers
        return runs.datamodule(LESSON, kind="device", batch_size=batch_size, augment=True)
    return runs.datamodule(LESSON, batch_size=batch_size, augment=True, num_workers=2, persistent_workers=True)
