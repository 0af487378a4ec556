"""The course's epoch metrics as torchmetrics objects: top-1 accuracy and the per-sample mean loss, both accumulated on
the metric's device without a host sync per update."""
from __future__ import annotations

from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy


def top1_accuracy(num_classes: int = 10) -> MulticlassAccuracy:
    """The course's one accuracy metric: top-1 over all samples (micro), accumulated on the metric's device."""
    return MulticlassAccuracy(num_classes, average="micro", validate_args=False)


def mean_loss() -> MeanMetric:
    """A running mean that never reads a value back to the host (nan_strategy="disable": no NaN check per update);
    update it with one value per sample, e.g. loss.expand(len(y)), for the per-sample mean over uneven batches."""
    return MeanMetric(nan_strategy="disable")
