"""Reference solution for lesson 05's exercise: torch.compile fuses the elementwise chain into one kernel."""
import torch


def activation(x):
    """Normalise each row, scale and shift, then tanh-GELU: ten elementwise ops in eager mode."""
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    z = centred * torch.rsqrt(var + 1e-5)
    z = z * 1.5 + 0.1
    return 0.5 * z * (1.0 + torch.tanh(0.7978845608 * (z + 0.044715 * z * z * z)))


fused_activation = torch.compile(activation)  # compiles on the first call; the check times later calls
