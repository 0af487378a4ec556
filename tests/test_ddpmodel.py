"""Lesson 06's model of a data-parallel step (parallel.ddpmodel) from injected measurements: the ring's bytes, the
link fitted from two all-reduce sizes, DDP's buckets, the predicted efficiency, its breakdown against a
measured one and the printed reason. No clock, no processes."""
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


def test_buckets_close_at_the_cap_in_backwards_order_and_never_split_a_tensor():
    assert ddpmodel.buckets([100, 200, 300]) == [600]  # LeNet-like: all under 25 MiB, one bucket
    mib = 2**20
    # ResNet-9-like: a small first layer, then tensors of 9 MiB; backward's order is the reverse
    assert ddpmodel.buckets([mib / 100, 9 * mib, 9 * mib, 9 * mib], 25 * mib) == [27 * mib, mib / 100]
    assert ddpmodel.buckets([40 * mib], 25 * mib) == [40 * mib]  # one tensor above the cap: its own bucket
    assert ddpmodel.buckets([1, 2, 3], cap=3) == [3, 3]  # closed once it holds the cap or more


def test_prediction_uses_only_independent_parts():
    """Compute, sharing, one latency per bucket and the ring's bytes; nothing read from a DDP step."""
    m = ddpmodel.predict(0.010, [100_000, 150_000], 2, latency=1e-4, bandwidth=1e9, sharing=1.3)
    assert m.parts["sharing the cores"] == pytest.approx(0.003)
    assert m.parts["all-reduce latency"] == pytest.approx(1e-4) and m.buckets == 1  # 250 kB: one bucket
    assert m.parts["all-reduce bytes"] == pytest.approx(250_000 / 1e9)  # 2(N-1)/N = 1 of the bytes on 2
    assert m.step_s == pytest.approx(0.010 + 0.003 + 1e-4 + 2.5e-4)
    assert m.efficiency == pytest.approx(0.010 / m.step_s)
    assert set(m.parts) == {"compute", "sharing the cores", "all-reduce latency", "all-reduce bytes",
                            "the loop's collectives", "the slower rank"}
    assert m.parts["the slower rank"] == 0 and m.parts["the loop's collectives"] == 0  # none given: none modelled
    big = ddpmodel.predict(0.010, [20 * 2**20] * 3, 4, latency=1e-4, bandwidth=1e9)
    assert big.buckets == 2 and big.parts["all-reduce latency"] == pytest.approx(2e-4)  # 40 + 20 MiB
    assert big.parts["all-reduce bytes"] == pytest.approx(1.5 * 60 * 2**20 / 1e9)  # 2(N-1)/N = 1.5 on 4
    assert big.parts["sharing the cores"] == 0 and big.efficiency < 1


def test_the_wait_for_the_slower_rank_is_the_expected_slowest_step_less_the_mean():
    """Two ranks whose steps take 10 or 14 ms, equally often: the slower of two is 14 ms in 3 pairs of 4, so the
    expected slowest is 13 ms against a mean of 12: a lockstep loop waits 1 ms a step. Equal steps wait for nothing."""
    assert ddpmodel.slower_rank([0.010, 0.014] * 5, 2) == pytest.approx(0.001)
    assert ddpmodel.slower_rank([0.010] * 8, 2) == pytest.approx(0) and ddpmodel.slower_rank([], 2) == 0
    assert ddpmodel.slower_rank([0.010, 0.014] * 5, 4) == pytest.approx(0.014 - 0.012 - 0.004 / 16)  # 1 - (1/2)^4
    m = ddpmodel.predict(0.010, [250_000], 2, latency=1e-4, bandwidth=1e9, wait=0.001)
    assert m.parts["the slower rank"] == pytest.approx(0.001) and m.step_s == pytest.approx(0.01135)
    parts = ddpmodel.breakdown(m, measured_efficiency=0.5)  # a 20 ms measured step
    assert parts["the slower rank"] == pytest.approx(0.001) and parts["unexplained"] == pytest.approx(0.020 - 0.01135)


def test_the_loops_own_collectives_are_the_calls_past_ddps_buckets_at_their_kinds_latency():
    """Lightning's loop broadcasts a flag each step besides DDP's one bucket all-reduce: the broadcast is charged at the
    broadcast's latency, DDP's all-reduce not again; an all-reduce past the buckets, or an unmeasured kind, at the
    all-reduce's latency."""
    counts = {"all_reduce": 1.0, "broadcast": 1.0}  # LeNet in Lightning's DDP: one bucket, the loop's flag
    assert ddpmodel.loop_seconds(counts, 1, {"broadcast": 3e-4}, default=1e-4) == pytest.approx(3e-4)
    assert ddpmodel.loop_seconds({"all_reduce": 3.0}, 1, {}, default=1e-4) == pytest.approx(2e-4)  # two past the one
    assert ddpmodel.loop_seconds({"all_gather": 0.5}, 2, {}, default=1e-4) == pytest.approx(5e-5)  # every other step
    assert ddpmodel.loop_seconds({"all_reduce": 1.0}, 2, {}, default=1e-4) == 0  # fewer than the buckets: none extra
    m = ddpmodel.predict(0.010, [250_000], 2, latency=1e-4, bandwidth=1e9, loop_s=3e-4)
    assert m.parts["the loop's collectives"] == pytest.approx(3e-4) and m.step_s == pytest.approx(0.01065)
    parts = ddpmodel.breakdown(m, measured_efficiency=0.5)  # a 20 ms measured step
    assert parts["the loop's collectives"] == pytest.approx(3e-4)
    assert parts["unexplained"] == pytest.approx(0.020 - 0.01065) and sum(parts.values()) == pytest.approx(0.020)


def test_breakdown_leaves_what_the_model_lacks_unexplained():
    m = ddpmodel.predict(0.010, [250_000], 2, latency=1e-4, bandwidth=1e9)  # 10.35 ms modelled
    parts = ddpmodel.breakdown(m, measured_efficiency=0.5)  # a 20 ms measured step
    assert parts["compute"] == pytest.approx(0.010) and parts["all-reduce"] == pytest.approx(3.5e-4)
    assert parts["unexplained"] == pytest.approx(0.020 - 0.01035)
    assert sum(parts.values()) == pytest.approx(0.020)
    assert ddpmodel.breakdown(m, measured_efficiency=1.0)["unexplained"] < 0  # the model slower than measured


def test_reason_names_the_larger_measured_cost_or_how_little_they_cover():
    wait = ddpmodel.reason(wait_s=2e-3, in_step_s=8e-4, alone_s=7e-4, latency=1e-4, unexplained_s=3e-3)
    assert wait.startswith("each rank waited 1.90 ms") and len(wait) <= 116
    slow = ddpmodel.reason(wait_s=2e-4, in_step_s=3e-3, alone_s=7e-4, latency=1e-4, unexplained_s=3e-3)
    assert slow.startswith("the all-reduce took 3.00 ms in a step, 0.70 ms timed apart") and len(slow) <= 116
    # a barrier faster than the measured latency is no negative wait; 0.19 ms covers little of 3.72 ms
    lost = ddpmodel.reason(wait_s=1e-3, in_step_s=2.09e-3, alone_s=1.9e-3, latency=1.9e-3, unexplained_s=3.72e-3)
    assert lost.startswith("not located") and "wait" not in lost  # a part under 0.01 ms is left out
    assert "a slower all-reduce (0.19 ms) covers 0.19 of 3.72 ms" in lost
    both = ddpmodel.reason(wait_s=4e-4, in_step_s=2.09e-3, alone_s=1.9e-3, latency=1e-4, unexplained_s=3.72e-3)
    assert "rank (0.30 ms) and a slower all-reduce (0.19 ms) cover 0.49 of 3.72 ms" in both and len(both) <= 116
    assert len(lost) <= 116
    over = ddpmodel.reason(wait_s=4e-4, in_step_s=2e-3, alone_s=1.9e-3, latency=1e-4, unexplained_s=-5e-4)
    assert over == "nothing to locate: the modelled step is 0.50 ms longer than the measured one"  # no wait named
    none_left = ddpmodel.reason(wait_s=4e-4, in_step_s=2e-3, alone_s=1.9e-3, latency=1e-4, unexplained_s=0.0)
    assert none_left == "nothing left inside the step to locate"  # not "-0.00 ms longer"
