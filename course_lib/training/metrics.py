"""The course's epoch metrics as torchmetrics objects: top-1 accuracy and the per-sample mean loss, both accumulated on
the metric's device without a host sync per update."""
from __future__ import annotations

from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy


def top1_accuracy(num_classes: int = 10) -> MulticlassAccuracy:
    """The course's one accuracy metric: top-1 over all samples (micro), accumulated on the metric's device."""
    return MulticlassAccuracy(num_classes, average="micro", validate_args=False)


def mean_loss() -> MeanMetric:
    """A running mean that never reads a value back to the host (nan_strategy="disable": no NaN check per update);
    update it with one value per sample, e.g. loss.expand(len(y)), for the per-sample mean over uneven batches."""
    return MeanMetric(nan_strategy="disable")


def epoch_metrics(num_classes: int = 10) -> MetricCollection:
    """A training system's pair, "acc" (top1_accuracy) and "loss" (mean_loss); clone(prefix="val_") names a stage's.

    Updated member by member (they take different inputs), so no compute groups to discover."""
    return MetricCollection({"acc": top1_accuracy(num_classes), "loss": mean_loss()}, compute_groups=False)
