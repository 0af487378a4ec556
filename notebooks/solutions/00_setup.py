"""Reference solution for lesson 00's exercise 3: an op's time from its work and this machine's ceilings. Each
ceiling alone allows a time (FLOPs at the matmul rate, bytes at the memory bandwidth, ops at the fixed cost per op);
the op takes at least the longest of the three, and that bound is the prediction."""


def predict_seconds(flops, bytes_moved, ops, ceil):
    """Seconds for work of `flops` FLOPs, `bytes_moved` bytes and `ops` ops on the ceilings `ceil`."""
    return max(flops / ceil.rate("fp32"), bytes_moved / ceil.bandwidth, ops * ceil.per_op)
