"""Reference solution for lesson 00's exercise 3: an op's time from its work and this machine's ceilings. Each
ceiling alone allows a time (FLOPs at the matmul rate, bytes at the rate of an add that writes a new output, ops at
the fixed cost per op); the op takes at least the longest of the three, and that bound is the prediction. Each of
the check's ops allocates its output, so the bytes go at the fresh-output rate (first touch of new pages included),
not at the DRAM copy bandwidth, which is only reached into a reused output."""


def predict_seconds(flops, bytes_moved, ops, ceil):
    """Seconds for work of `flops` FLOPs, `bytes_moved` bytes and `ops` ops on the ceilings `ceil`."""
    return max(flops / ceil.rate("fp32"), bytes_moved / ceil.elementwise(3, fresh=True), ops * ceil.per_op)
