"""Reference solution for lesson 04's exercise: checkpointed segments (torch.utils.checkpoint.checkpoint_sequential),
two of them, so autograd keeps only the segments' inputs and recomputes each segment's forward in backward; and the
time it costs predicted first from the ceilings: one more forward pass, (forward + backward + forward) / (forward +
backward), each from roofline.step_model."""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

from course_lib.measure import roofline
from course_lib.training import models

SEGMENTS = 2  # fewer, longer segments than section 5's one per block: fewer inputs kept


def train_step(net, x, y) -> None:
    """Forward through SEGMENTS checkpointed segments of the ResNet-9's layers, then backward."""
    F.cross_entropy(checkpoint_sequential(net.net, SEGMENTS, x, use_reentrant=False), y).backward()


def predict_time_ratio(ceil) -> float:
    """Predicted time of this step over the plain step's: the model's forward time added once more."""
    net = models.ResNet9(width=8).train()
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    forward = roofline.step_model(roofline.count(lambda: net(x)), ceil).predicted
    step = roofline.step_model(roofline.count(lambda: F.cross_entropy(net(x), y).backward()), ceil).predicted
    return (step + forward) / step
