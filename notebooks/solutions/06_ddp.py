"""Reference solution, lesson 06 exercise 1: one all-reduce over all gradients flattened into one buffer."""
import torch
import torch.distributed as dist


def average_gradients(model, world):
    """Average every gradient over the processes with one all-reduce of a flat buffer, as a DDP bucket does."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (total parameters,): one message instead of one per tensor
    dist.all_reduce(flat)
    flat /= world
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))  # back into each .grad, which the optimizer reads
