"""Reference solution for lesson 05's exercise: the chain rewritten so that torch.compile traces it as one graph
and fuses it: the peak stays a 0-d tensor on the device, and the clip is a tensor op instead of a Python branch."""
import torch

CLIP = 4.0


def activation(x):
    """Normalise each row, clip at CLIP, scale and shift, tanh-GELU; also the largest |z| before clipping."""
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    z = centred * torch.rsqrt(var + 1e-5)
    peak = z.abs().amax()  # a 0-d tensor: no read-back, so no sync and no graph break
    z = z.clamp(-CLIP, CLIP)  # unconditional: where no |z| exceeds CLIP it changes nothing, so no branch is needed
    z = z * 1.5 + 0.1
    return 0.5 * z * (1.0 + torch.tanh(0.7978845608 * (z + 0.044715 * z * z * z))), peak


def predict_speedup(ceil, x):
    """Predicted eager time over compiled time, from the ceilings: every eager op reads and writes full-size tensors
    (roofline.count); the fused graph (roofline.fused) reads x once per reduction, since each must finish before its
    result is used (the mean, the variance, the peak), once more to write y, each against its bound."""
    from course_lib.measure import roofline
    from course_lib.exercises.compute import eager_chain

    eager = roofline.count(eager_chain, x)
    y, _ = activation(x)
    fused = roofline.fused(eager, [x] * 4, [y])  # three reductions' passes over x, then the pass that writes y
    return roofline.step_model(eager, ceil).predicted / roofline.step_model(fused, ceil).predicted
