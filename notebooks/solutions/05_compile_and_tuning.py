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
