"""Reference solution of lesson 01's exercise: classify in batches, so each op's fixed cost is shared among many
images, and predict the speed-up first, from the ceilings: the model's time per image one at a time over its time
per image in a batch (roofline.step_model: each op at the ceiling of its class, plus the fixed cost per op), with each
layer's Python call counted as one more op's fixed cost (section 3's breakdown: Python between ops)."""
import torch

from course_lib.measure import roofline
from course_lib.training.models import LeNet

BATCH = 256  # images per forward: enough that the fixed cost per op is a small share of each image's time


def classify(net, images):
    """Labels (N,) for images (N, 3, 32, 32), BATCH images per forward."""
    with torch.no_grad():
        return torch.cat([net(chunk).argmax(dim=1) for chunk in images.split(BATCH)])


def predict_speedup(ceil):
    """Predicted seconds per image at batch 1 over seconds per image at batch BATCH, from the ceilings alone."""
    net = LeNet().eval()

    def per_image(batch: int) -> float:
        with torch.no_grad():
            counts = roofline.count(net, torch.zeros(batch, 3, 32, 32))
        calls = len([m for m in net.modules() if not list(m.children())])  # leaf layers: one Python call each
        return (roofline.step_model(counts, ceil).predicted + calls * ceil.per_op) / batch
    return per_image(1) / per_image(BATCH)
