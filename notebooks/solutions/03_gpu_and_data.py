"""Reference solution for lesson 03's exercise: the decoded uint8 cache (no JPEG decoding per step) with batch-wise
augmentation; on a GPU, the whole split and its augmentation on the device."""
import torch

from course_lib import runs

LESSON = "03_gpu_and_data"


def make_data(batch_size: int):
    """A DataModule that keeps the training step fed: the decoded cache in-process, or the whole split on the GPU."""
    if torch.cuda.is_available():  # augmentation on the device, no copies, no workers
        return runs.datamodule(LESSON, kind="device", batch_size=batch_size, augment=True)
    # on a CPU the step and any worker share the same cores; measured on 2 cores, workers made this slower
    return runs.datamodule(LESSON, batch_size=batch_size, augment=True, num_workers=0)
