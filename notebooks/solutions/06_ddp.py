"""Reference solution, lesson 06 exercise 3: one all-reduce over all gradients flattened into one buffer, and its
speed-up predicted from the measured gloo link (latency per call, bandwidth)."""
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


def predict_speedup(latency, bandwidth, model, world):
    """One all-reduce per tensor over one for all, from the measured link: every call pays the latency once, and
    both send the same bytes (2(N-1)/N of the gradients per process, a ring) at the bandwidth."""
    grads = [p for p in model.parameters()]
    ring = 2 * (world - 1) / world * 4 * sum(p.numel() for p in grads)  # bytes each process sends, fp32
    return (len(grads) * latency + ring / bandwidth) / (latency + ring / bandwidth)
