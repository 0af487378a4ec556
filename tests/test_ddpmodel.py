"""Lesson 06's model of a data-parallel step (parallel.ddpmodel) from injected measurements: the ring's bytes, the
link fitted from two all-reduce sizes, and the predicted efficiency. No clock, no processes."""
import pytest

from course_lib.parallel import ddpmodel


def test_ring_bytes_and_the_link_from_two_sizes():
    assert ddpmodel.ring_bytes(1000, 2) == pytest.approx(1000) and ddpmodel.ring_bytes(1000, 4) == pytest.approx(1500)
    # 50 us for 4 bytes; 16 MiB in 50 us + 16 MiB / 2 GB/s on 2 processes (the ring sends 16 MiB per process)
    times = {4: 5e-5, 2**24: 5e-5 + 2**24 / 2e9}
    latency, bandwidth = ddpmodel.link(times, 2)
    assert latency == pytest.approx(5e-5) and bandwidth == pytest.approx(2e9)
    times[250_000] = 5e-5 + 250_000 / 1e8  # a mid-sized all-reduce at 0.1 GB/s: the size nearest the gradients
    assert ddpmodel.link(times, 2, nbytes=248_000)[1] == pytest.approx(1e8)
    assert ddpmodel.link(times, 2)[1] == pytest.approx(2e9)  # no size named: the largest


def test_a_tiny_all_reduce_slower_than_the_gradients_one_is_not_the_latency():
    """A noisy 4-byte call (slower than the gradients' all-reduce) neither sets the latency nor makes the bandwidth
    infinite: the latency is the faster of the two, and the bandwidth is read at the largest size."""
    times = {4: 3e-3, 250_000: 2e-4, 2**24: 2e-4 + 2**24 / 2e9}
    latency, bandwidth = ddpmodel.link(times, 2, nbytes=248_000)
    assert latency == pytest.approx(2e-4) and bandwidth == pytest.approx(2e9)


def test_prediction_adds_sharing_latency_and_bytes():
    m = ddpmodel.predict(0.010, 250_000, 2, latency=1e-4, bandwidth=1e9, beside_ratio=1.3)
    assert m.parts["sharing the cores"] == pytest.approx(0.003)
    assert m.parts["all-reduce latency"] == pytest.approx(1e-4)  # one bucket: 250 kB under DDP's 25 MiB cap
    assert m.parts["all-reduce bytes"] == pytest.approx(250_000 / 1e9)
    assert m.step_s == pytest.approx(0.010 + 0.003 + 1e-4 + 2.5e-4)
    assert m.efficiency == pytest.approx(0.010 / m.step_s)
    big = ddpmodel.predict(0.010, 60 * 2**20, 2, latency=1e-4, bandwidth=1e9)
    assert big.parts["all-reduce latency"] == pytest.approx(3e-4)  # 60 MiB: three 25 MiB buckets
    assert big.parts["sharing the cores"] == 0 and big.efficiency < 1


def test_ddps_measured_step_beyond_the_all_reduce_is_its_own_part():
    """What DDP's step took beyond the step beside the others, less the modelled all-reduce, is the hooks, the
    bucket copies and the wait for the slower rank; an all-reduce that cost more than DDP's whole extra adds nothing."""
    m = ddpmodel.predict(0.010, 250_000, 2, latency=1e-4, bandwidth=1e9, ddp_extra=0.003)
    assert m.parts["DDP hooks, waits"] == pytest.approx(0.003 - 1e-4 - 2.5e-4)
    assert m.step_s == pytest.approx(0.013) and m.efficiency == pytest.approx(0.010 / 0.013)
    assert ddpmodel.predict(0.010, 250_000, 2, latency=1e-4, bandwidth=1e9, ddp_extra=1e-4).parts[
        "DDP hooks, waits"] == 0
