"""The performance model without a clock: FLOP and byte counts against hand-derived ones, the bound classifier on
injected ceilings, the ceilings' summaries and noise flag from injected timings, saving and re-measuring, and lesson
00's prediction exercise (starter and shortcut fail, the solution passes) on injected measurements."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from course_lib.base import config
from course_lib.exercises import exercise_cells, notebooks_folder, solution, starter
from course_lib.exercises import predict as ex00
from course_lib.measure import ceilings, roofline

F32 = 4  # bytes per fp32 element


def fake_ceilings(rate=1e11, bandwidth=1e10, per_op=1e-5, size="full") -> ceilings.Ceilings:
    """Ceilings with one block each (no clock): rate FLOP/s, bandwidth bytes/s, per_op seconds."""
    rows = {"matmul fp32": ceilings.Ceiling("matmul fp32", "compute", (rate,)),
            "memory": ceilings.Ceiling("memory", "memory", (bandwidth,)),
            "per op": ceilings.Ceiling("per op", "overhead", (per_op,))}
    return ceilings.Ceilings("test machine", "cpu", size, torch.get_num_threads(), torch.__version__, rows)


# ---- counting -------------------------------------------------------------------------------------------------
def test_matmul_counts_2mnk_flops_and_its_three_matrices():
    m, k, n = 64, 32, 16
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = roofline.count(lambda: a @ b)
    assert c.flops == c.matmul_flops == 2 * m * k * n
    assert c.bytes == (m * k + k * n + m * n) * F32 and c.n_ops == 1


def test_convolution_counts_flops_per_output_and_reads_input_weight_bias():
    batch, cin, cout, hw, kk = 2, 3, 4, 8, 3
    conv, x = torch.nn.Conv2d(cin, cout, kk, padding=1), torch.randn(batch, cin, hw, hw)
    c = roofline.count(conv, x)
    assert c.flops == c.matmul_flops == 2 * batch * cout * hw * hw * cin * kk * kk
    assert c.bytes == (x.numel() + cout * cin * kk * kk + cout + batch * cout * hw * hw) * F32


def test_elementwise_op_is_one_flop_per_element_and_reads_and_writes_each_once():
    x, y = torch.randn(1000), torch.randn(1000)
    c = roofline.count(lambda: x + y)
    assert (c.flops, c.bytes, c.n_ops, c.matmul_flops) == (1000, 3 * 1000 * F32, 1, 0)
    out = torch.empty(1000)
    assert roofline.count(lambda: torch.add(x, y, out=out)).bytes == 3 * 1000 * F32  # out= counted once


def test_a_gather_reads_the_rows_it_gathers_not_its_whole_source():
    images, idx = torch.zeros(1000, 3, 8, 8, dtype=torch.uint8), torch.randint(0, 1000, (16,))
    rows = 16 * 3 * 8 * 8  # bytes of the batch gathered (uint8)
    for gather in (lambda: images[idx], lambda: images.index_select(0, idx)):  # a loader's batch from a uint8 set
        assert roofline.count(gather).bytes == 2 * rows + idx.nbytes  # rows read, rows written, the indices


def test_fused_chain_moves_only_its_input_and_output():
    x = torch.randn(4096)
    eager = roofline.count(lambda: F.gelu(x * 2 + 1))  # three ops, each reads and writes 4096 floats
    assert (eager.n_ops, eager.flops, eager.bytes) == (3, 3 * 4096, 3 * 2 * 4096 * F32)
    one = roofline.fused(eager, [x], [F.gelu(x * 2 + 1)])
    assert (one.n_ops, one.flops, one.bytes) == (1, eager.flops, 2 * 4096 * F32)


def test_views_move_nothing_and_a_training_step_counts_backward():
    x = torch.randn(8, 32)
    assert roofline.count(lambda: x.t().unsqueeze(0)[0]).n_ops == 0
    net = torch.nn.Linear(32, 10)
    c = roofline.count(lambda: F.cross_entropy(net(x), torch.zeros(8, dtype=torch.long)).backward())
    assert c.matmul_flops == 2 * 2 * 8 * 32 * 10  # forward and the weight's gradient (x needs none)
    assert sum(o.flops for o in c.ops if o.name in ("addmm", "mm")) == c.matmul_flops


# ---- the bound -------------------------------------------------------------------------------------------------
def test_bound_picks_the_ceiling_that_takes_longest():
    kw = dict(rate=1e11, bandwidth=1e10, per_op=1e-5)
    assert roofline.bound(1e10, 1e6, 1, **kw).kind == "compute"  # 0.1 s compute vs 0.1 ms memory
    assert roofline.bound(1e6, 1e9, 1, **kw).kind == "memory"  # 0.1 s of traffic
    assert roofline.bound(1e3, 1e3, 1000, **kw).kind == "overhead"  # 10 ms of fixed costs
    b = roofline.bound(1e10, 1e9, 1, **kw)
    assert b.predicted == pytest.approx(0.1) and set(b.seconds) == set(roofline.KINDS)


def test_step_model_sums_each_ops_bound_and_shares_it_by_kind():
    ceil = fake_ceilings()
    counts = roofline.Counts([roofline.Op("mm", int(1e10), int(1e6), True), roofline.Op("add", 10, int(1e8)),
                              *[roofline.Op("tiny", 1, 4)] * 100], 0)
    m = roofline.step_model(counts, ceil)  # each op's work bound plus the fixed cost of every op
    assert m.predicted == pytest.approx(0.1 + 0.01 + 102 * 1e-5 + 100 * 4 / 1e10)
    assert m.kind == "compute" and m.share["memory"] == pytest.approx((0.01 + 400 / 1e10) / m.predicted)
    line = roofline.explain("step", counts, ceil, [0.2, 0.22, 0.25])
    assert "compute-bound" in line and "measured 220 ms" in line and "test machine" in line
    floored = roofline.Counts([roofline.Op("fused", 10, int(1e3), fresh=int(1e3), floor=0.5)], 0)  # alone: 0.5 s
    m = roofline.step_model(floored, ceil)  # its floor, not its bytes, set its bound: the line names the floor
    assert m.kind == "memory" and m.floor == pytest.approx((0.5 - 1e-5) / m.predicted)
    assert "bound by its ops' floors" in roofline.explain("fused", floored, ceil, [0.6])
    assert roofline.step_model(counts, ceil).floor == 0
    counts.matmul_flops = int(1e10)  # the mm's: pointwise FLOPs do not count towards the matmul ceiling
    assert roofline.achieved(counts, 0.2, ceil).fraction_of_ceiling == pytest.approx(1e10 / 0.2 / 1e11)


def test_a_format_not_measured_is_a_clear_error():
    with pytest.raises(KeyError, match="not native here"):
        fake_ceilings().rate("bf16")


# ---- ceilings from injected timings ----------------------------------------------------------------------------
def test_summaries_turn_block_times_into_best_sustained_rates_with_a_spread_and_flag_noise():
    c = ceilings.summarise("matmul fp32", "compute", 2e9, [0.02, 0.021, 0.019, 0.02])
    assert c.median == pytest.approx(1e11) and len(c.values) == 4 and not ceilings.noisy(c)
    assert c.best == pytest.approx(2e9 / 0.019) and c.shown()[0] == pytest.approx(2e9 / 0.019 / 1e9)  # fastest
    assert "best sustained: fastest of 4 blocks" in c.text() and "NOISY" not in c.text()
    slow = ceilings.summarise("per op", "overhead", 100, [1e-3, 2e-3, 3e-3, 2e-3])
    assert slow.best == pytest.approx(1e-5) and slow.median == pytest.approx(2e-5)  # the cheapest block
    assert ceilings.noisy(slow) and "NOISY" in slow.text() and "cheapest of 4" in slow.text()
    with pytest.raises(ValueError, match="positive"):
        ceilings.summarise("memory", "memory", 1e9, [])


def test_measure_times_every_ceiling_through_the_injected_timer():
    calls = []

    def fake_time(fn, min_run_time):  # runs each call once, reports fixed seconds: no clock
        fn()
        calls.append(min_run_time)
        return [0.01, 0.011, 0.012, 0.01, 0.0105]  # fastest 0.01

    found = ceilings.measure("cpu", size="smoke", time_fn=fake_time)
    assert found.formats()[0] == "fp32" and {"memory", "per op"} <= set(found.rows)
    assert found.rows["matmul fp32"].best == pytest.approx(2 * ceilings.SMOKE_MATMUL_N**3 / 0.01)
    assert found.per_op == pytest.approx(0.01 / ceilings.LOOP_OPS)
    assert all(t == ceilings.SECONDS["smoke"] for t in calls) and len(calls) == len(found.rows)


def test_a_noisy_ceiling_is_remeasured_and_one_that_stays_noisy_is_not_saved(tmp_path, monkeypatch):
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path))
    steady, busy = [0.01, 0.011, 0.0105, 0.01], [0.01, 0.03, 0.01, 0.01]  # spreads 1.1x and 3x

    seen = []

    def settles(fn, min_run_time):  # noisy on each ceiling's first measurement, steady on the second
        seen.append(fn)
        return steady if seen.count(fn) > 1 else busy

    found = ceilings.measure("cpu", size="full", time_fn=settles)
    assert not found.noisy()
    assert found.rows["matmul fp32"].best == pytest.approx(2 * ceilings.MATMUL_N["cpu"]**3 / 0.01)
    assert ceilings.save(found).exists()
    calls = []
    stays = ceilings.measure("cpu", size="full", time_fn=lambda fn, min_run_time: calls.append(fn) or busy)
    assert len(calls) == (ceilings.RETRIES + 1) * len(stays.rows)  # every ceiling retried, then kept flagged
    assert set(stays.noisy()) == set(stays.rows) and all("NOISY" in line for line in stays.lines()[1:])
    with pytest.raises(ceilings.NoisyCeilings, match="competing for the cores"):
        ceilings.save(stays)
    saved = json.loads(ceilings.path("cpu").read_text())["rows"]["memory"]["values"]
    assert saved == list(found.rows["memory"].values)  # the steady save stands


def test_load_returns_noisy_figures_unsaved_and_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path))
    monkeypatch.setenv(config.SIZE_ENV, "full")
    busy = fake_ceilings()
    busy.rows["memory"] = ceilings.summarise("memory", "memory", 1e9, [0.1, 0.3, 0.1, 0.1])
    monkeypatch.setattr(ceilings, "measure", lambda device: busy)
    assert ceilings.load("cpu").bandwidth == pytest.approx(1e10)  # this run's best block, flagged
    assert not ceilings.path("cpu").exists() and "Not saving" in capsys.readouterr().out


def test_saved_ceilings_are_reused_and_remeasured_when_stale(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path))
    monkeypatch.setenv(config.SIZE_ENV, "full")
    measured = []
    monkeypatch.setattr(ceilings, "measure", lambda device: measured.append(device) or fake_ceilings())
    ceilings.load("cpu")  # none saved: measures and saves
    assert measured == ["cpu"] and ceilings.path("cpu").exists()
    again = ceilings.load("cpu")  # saved: read back
    assert measured == ["cpu"] and again.rate() == pytest.approx(1e11)
    saved = json.loads(ceilings.path("cpu").read_text())
    ceilings.path("cpu").write_text(json.dumps({**saved, "size": "smoke"}))
    ceilings.load("cpu")  # a smoke measurement does not serve a full run
    assert measured == ["cpu", "cpu"] and "saved at smoke size" in capsys.readouterr().out


# ---- lesson 00's prediction exercise ---------------------------------------------------------------------------
def prediction_ceilings(spread: float = 1.0):
    """fake_ceilings with the fresh-output add at a quarter of the DRAM copy bandwidth (as measured on the EPYCs) and
    the products' blocks `spread` apart (slowest / fastest)."""
    ceil = fake_ceilings()
    ceil.rows["matmul fp32"] = ceilings.Ceiling("matmul fp32", "compute", (1e11, 1e11 / spread))
    ceil.rows["add fresh"] = ceilings.Ceiling("add fresh", "memory", (ceil.bandwidth / 4,))
    ceil.rows["add reused"] = ceilings.Ceiling("add reused", "memory", (ceil.bandwidth * 1.1,))
    return ceil


def roofline_times(ceil) -> dict:
    """Measured seconds for three ops, each reaching 60 % of its roof (the add's: the fresh-output add) (no clock)."""
    ops = {"matmul": (2e9, 1.2e7, 1), "add": (1.6e7, 1.9e8, 1), "tiny loop": (800, 6400, 50)}
    return {op: (f, b, n, roofline.bound(f, b, n, rate=ceil.rate(), bandwidth=ceil.elementwise(3, fresh=True),
                                         per_op=ceil.per_op).predicted / 0.6) for op, (f, b, n) in ops.items()}


def graded(predict, ceil=None) -> bool:
    ceil = ceil or prediction_ceilings()
    return ex00.grade_00({op: (predict(f, b, n, ceil), t)
                                      for op, (f, b, n, t) in roofline_times(ceil).items()},
                                     ex00.factor_00(ceil))


def test_prediction_exercise_starter_and_shortcuts_fail_and_the_solution_passes(capsys):
    assert graded(starter("00", 3)["predict_seconds"]) is False
    assert "not a positive number" in capsys.readouterr().out
    assert graded(lambda flops, moved, ops, ceil: flops / ceil.rate()) is False  # compute alone: the usual shortcut
    assert graded(lambda flops, moved, ops, ceil: moved / ceil.bandwidth) is False  # memory alone
    # the old hint: DRAM's copy bandwidth for an add into a new output, 4x too fast here, on the steadiest ceilings
    dram = lambda flops, moved, ops, ceil: max(flops / ceil.rate(), moved / ceil.bandwidth, ops * ceil.per_op)  # noqa
    assert graded(dram) is False and graded(dram, prediction_ceilings(spread=1.5)) is False
    # lesson 00's roofline cell pasted: the add's roof at the rate of an add into a reused output
    cell_24 = lambda flops, moved, ops, ceil: roofline.bound(  # noqa: E731
        flops, moved, ops, rate=ceil.rate(), bandwidth=ceil.elementwise(3), per_op=ceil.per_op).predicted
    assert graded(cell_24) is False
    assert graded(solution("00_setup")["predict_seconds"]) is True
    assert graded(solution("00_setup")["predict_seconds"], prediction_ceilings(spread=1.5)) is True


def test_prediction_tolerance_follows_the_ceilings_spread():
    """2x (the model's own target) on steady ceilings, times the widest spread of those the prediction rests on."""
    assert ex00.factor_00(prediction_ceilings()) == pytest.approx(2.0)
    assert ex00.factor_00(prediction_ceilings(spread=1.4)) == pytest.approx(2.8)


def test_prediction_grading_bounds_the_factor_both_ways():
    assert ex00.grade_00({"op": (1.0, 2.9)}, 3.0) is True
    assert ex00.grade_00({"op": (1.0, 3.1)}, 3.0) is False
    assert ex00.grade_00({"op": (3.1, 1.0)}, 3.0) is False
    assert ex00.grade_00({"op": (math.nan, 1.0)}, 3.0) is False


def test_lesson_00_carries_the_exercise_and_a_check_that_measures():
    cells = exercise_cells(next(notebooks_folder().glob("00_*.ipynb")))["3"]
    assert "check_00_prediction" in cells["CHECK"] and "solutions" not in cells["CHECK"]


def test_layers_lists_each_leaf_layer_with_its_bound_and_the_plot_draws_one_roof_per_format():
    """Timed, but nothing asserted about the times: only that every leaf layer gets a row and the table prints."""
    import matplotlib

    matplotlib.use("Agg")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 8 * 8, 10))
    rows = roofline.layers(net, torch.randn(4, 3, 8, 8), fake_ceilings(), min_run_time=0.001)
    assert [r.type for r in rows] == ["Conv2d", "ReLU", "Linear"]  # Flatten is a view: no op, no row
    assert all(r.kind in roofline.KINDS and r.measured > 0 for r in rows)
    assert len(roofline.layer_lines(rows)) == 1 + len(rows)
    ax = roofline.plot(fake_ceilings(), [("op", 1e6, 1e6, 1e-3)])
    assert len(ax.lines) == 1 and ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_legend_handles_labels()[1] == ["roof: fp32 products, DRAM copy"]
    ax = roofline.plot(fake_ceilings(), [("op", 1e6, 1e6, 1e-3)], roofs=[("a", 1e12, 1e10), ("b", 2e12, 1e10)])
    assert [line.get_label() for line in ax.lines] == ["a", "b"] and ax.get_ylabel() == "GFLOP/s"
    assert max(ax.lines[1].get_ydata()) == pytest.approx(2e3)  # 2e12 FLOP/s drawn in GFLOP/s
    assert ax.collections[0].get_offsets()[0][1] == pytest.approx(1.0)  # 1e6 FLOPs in 1 ms: 1 GFLOP/s


def test_kernel_bound_ops_get_their_floor_at_their_shapes():
    """floors=True replays products, convolutions and pooling alone at the step's shapes (their floor) and times
    every other op's reference copy of its bytes; the floor binds where it exceeds the class's bound, less the per-op
    cost."""
    x, w = torch.randn(32, 3, 64, 64), torch.randn(4, 3, 3, 3, requires_grad=True)  # outputs past REFERENCE_BYTES
    c = roofline.count(lambda: F.max_pool2d(F.conv2d(x, w).relu(), 2).sum().backward(), floors=True)
    floored = {o.name for o in c.ops if o.floor > 0}
    assert {"convolution", "convolution_backward", "max_pool2d_with_indices"} <= floored
    assert "relu" in floored and "sum" not in floored  # relu: the reference copy of its bytes; sum writes 4 bytes
    assert roofline.count(lambda: F.conv2d(x, w)).ops[0].floor == 0  # not asked: the class's ceiling alone
    ceil = ceilings.Ceilings("test machine", "cpu", "smoke", 1, "t", {
        "matmul fp32": ceilings.summarise("matmul fp32", "compute", 1e12, [1.0]),
        "memory": ceilings.summarise("memory", "memory", 1e10, [1.0]),
        "per op": ceilings.summarise("per op", "overhead", 1, [1e-6])})
    conv = roofline.Op("convolution", 10**6, 10**3, True, fresh=10**3, floor=1e-3)  # 1 µs at the rate, 1 ms alone
    pool = roofline.Op("max_pool2d_with_indices", 0, 10**3, fresh=10**3, floor=1e-3)
    assert roofline.op_bound(conv, ceil).seconds["compute"] == pytest.approx(1e-3 - 1e-6)
    assert roofline.op_bound(pool, ceil).seconds["memory"] == pytest.approx(1e-3 - 1e-6)


def test_only_tanh_is_held_to_the_tanh_rate():
    """Lesson 00 measures tanh's rate, which bounds tanh alone: GELU's kernels (and tanh's backward, a multiply-add)
    are elementwise, held to their bytes."""
    ops = [roofline.Op(name=n, flops=1, bytes=8) for n in ("tanh", "tanh_", "gelu", "gelu_backward", "tanh_backward")]
    assert [roofline.op_class(o) for o in ops] == ["transcendental"] * 2 + ["elementwise"] * 3


def test_an_elementwise_floor_is_a_copy_of_its_bytes_with_its_allocation_and_a_fused_one_its_compiled_part(
        monkeypatch):
    """reference times the least work that writes an op's bytes (a copy, or a fill where it reads fewer), into a new
    buffer where the op allocates one; a floored op pays no first-touch guess beside it; a fused kernel's floor is
    its costliest part compiled alone (tanh where it runs one)."""
    from course_lib.measure import opcount

    calls = []
    monkeypatch.setattr(opcount, "_best", lambda fn: calls.append(fn) or 1e-3)
    assert opcount.reference(4096, 8192, True) == 1e-3 and opcount.reference(4096, 8192, True) == 1e-3
    assert len(calls) == 1 and calls[0]().numel() == 4096  # kept per size and pattern; a fresh clone of 4096 bytes
    opcount.reference(4096, 0, False)  # reads nothing: a fill into a reused buffer
    assert len(calls) == 2
    big = roofline.Op("mul", 1, 3 * 2**26, fresh=2**26)
    ceil = ceilings.Ceilings("test machine", "cpu", "smoke", 1, "t", {
        "add fresh": ceilings.summarise("add fresh", "memory", 3e9, [1.0]),
        "add reused": ceilings.summarise("add reused", "memory", 3e9, [0.25])})
    assert roofline.first_touch(ceil, big) > 0 and roofline.first_touch(ceil, replace(big, floor=1e-3)) == 0
    parts = []
    monkeypatch.setattr(opcount, "compiled_reference", lambda name, like, again: parts.append(name) or 2e-3)
    x = torch.randn(64)
    fused = roofline.fused(roofline.count(lambda: torch.tanh(x * 2) + 1), [x], [x], floors=True)
    assert fused.ops[0].floor == 2e-3 and set(parts) == {"tanh"}


def test_the_steps_page_faults_are_counted_per_op_and_left_out_of_the_bound(monkeypatch):
    """count(floors=True) counts each op's page faults, the mean over FAULT_CALLS calls of the step after FAULT_WARMUP
    uncounted (injected: 3 faults an op); the bound does not charge them (no probe of a fault's cost was a lower
    bound on this course's CPU); without floors nothing is counted."""
    import itertools

    from course_lib.measure import opcount

    ticks = itertools.count(step=3)  # each read of the counter 3 above the last: every op takes 3 faults
    monkeypatch.setattr(opcount, "minor_faults", lambda: next(ticks))
    monkeypatch.setattr(opcount, "_best", lambda fn: 1e-3)  # each op alone: 1 ms
    monkeypatch.setattr(opcount, "replay", lambda chain, died: {})
    monkeypatch.setenv(config.SIZE_ENV, "full")
    x = torch.randn(2**15)
    c = roofline.count(lambda: (x * 2) * 3, floors=True)
    assert [o.faults for o in c.ops] == [3, 3]
    ceil = fake_ceilings(per_op=1e-5)
    assert roofline.op_bound(c.ops[0], ceil) == roofline.op_bound(replace(c.ops[0], faults=0), ceil)
    assert [o.faults for o in roofline.count(lambda: x * 2).ops] == [0]


@pytest.mark.parametrize("size, passes, tries", [("smoke", 1, 1), ("full", 2, 1 + ceilings.RETRIES)])
def test_floors_take_one_pass_without_retries_at_smoke_size_and_two_with_retries_at_full(monkeypatch, size, passes,
                                                                                         tries):
    """make test's smoke runs time each op's floor once (issue 45: the lessons' floors took minutes of it); a full run
    times it in two passes, each retried while its blocks spread past NOISY (injected times, all noisy: 10x)."""
    from course_lib.measure import opcount, timing

    calls = []
    monkeypatch.setattr(timing, "time_calls", lambda fn, **kw: calls.append(fn) or [1e-3, 1e-2, 1e-2, 1e-2])
    monkeypatch.setattr(opcount, "_floors", {})
    monkeypatch.setenv(config.SIZE_ENV, size)
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)  # one convolution; its output under REFERENCE_BYTES
    counted = roofline.count(lambda: F.conv2d(x, w), floors=True)
    assert [o.floor for o in counted.ops] == [1e-3] and len(calls) == passes * tries


def test_the_reference_copies_replay_in_the_steps_order_with_its_lifetimes():
    """replay allocates each large output when the step did and frees it when the step freed its own; it times the
    elementwise ops' copies into new outputs only (a kernel-bound op's is untimed; an in-place op keeps its loop
    reference)."""
    from course_lib.measure import opcount

    chain = [(0, 2**16, True, True, True), (1, 2**16, True, True, False), (2, 2**16, False, False, False)]
    best = opcount.replay(chain, {0: 2})  # op 0's output freed before op 2
    assert set(best) == {1} and best[1] > 0
    x = torch.randn(2**15)  # 128 KiB: past REFERENCE_BYTES
    c = roofline.count(lambda: (x * 2) * 3, floors=True)
    assert [o.name for o in c.ops] == ["mul", "mul"] and all(o.floor > 0 for o in c.ops)


def test_data_movement_kernels_are_timed_alone_at_their_shapes():
    """Gathers, pads and mirrors (lessons 03 and 08's batch augmentation) are replayed alone at their shapes for their
    floor with floors=True, as products and pooling are; a uint8 to float conversion keeps its reference copy."""
    from course_lib.measure.opcount import kernel_bound

    assert all(kernel_bound(n, False) for n in ("gather", "index", "constant_pad_nd", "reflection_pad2d", "flip"))
    assert not any(kernel_bound(n, False) for n in ("add", "_to_copy", "where", "div_"))
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)  # (B, C, H, W), outputs past REFERENCE_BYTES
    rows = torch.randint(0, 9, (64, 1, 32, 1)).expand(64, 3, 32, 40)  # each image's rows of its padded copy

    def augment():
        z = F.pad(x, (4,) * 4).gather(2, rows).flip(3)
        return z.to(torch.float32)
    c = roofline.count(augment, floors=True)
    assert {o.name for o in c.ops if o.floor > 0} >= {"constant_pad_nd", "gather", "flip", "_to_copy"}


# the longest hardware names the course prints (hardware.label) and the lessons' longest step names
LONG_HARDWARE = ("CPU Intel(R) Xeon(R) Platinum 8480+ (2 cores)", "1x NVIDIA H100 80GB HBM3 (CUDA 12.4)")
LONG_STEPS = ("a plain LeNet step with its loader, batch 64", "the final recipe's step, batch 256",
              "- ResNet-9 width 64, batch 256, bf16")


def test_explain_prints_one_fact_a_line_each_within_120_characters():
    """Worst cases: long hardware and step names, 5-digit counts and times, an emulated format: every line fits in
    verdict.LONGEST, and the shape (name and counts, bound, shares, prediction against measurement) is fixed."""
    from course_lib.measure import verdict

    big = [roofline.Op("mm", 12_345 * 10**9, 12_345 * 2**20, True), *[roofline.Op("add", 1, 1)] * 12_344]
    dense = [roofline.Op("mm", 12_345 * 10**9, 12_345 * 2**20 // 10**4, True)]  # 5-digit FLOP/byte
    for hw in LONG_HARDWARE:
        ceil = replace(fake_ceilings(rate=1e3, bandwidth=1e3, per_op=1.0), hardware=hw)
        for name in LONG_STEPS:
            for ops in (big, dense):
                for measured, rate in (([12_345.0, 12_340.0, 99_999.0] * 4_115, None), ([1e-6], 12_345e9)):
                    text = roofline.explain(name, roofline.Counts(ops, 0), ceil, measured, "bf16" if rate else "fp32",
                                            rate)
                    lines = text.splitlines()
                    assert len(lines) == 4 + bool(rate) and lines[0].startswith(f"{name}: ")
                    assert all(line.startswith("  ") for line in lines[1:]) and "x the prediction" in lines[-1]
                    long = [f"{len(t)}: {t}" for t in lines if len(t) > verdict.LONGEST]
                    assert not long, "\n".join(long)


def test_over_bound_names_a_fixed_cost_or_a_slow_rate():
    """A type at 3x its bound or more gets two lines: a time flat in the bytes is a fixed cost, a growing one a rate."""
    flat = [roofline.Layer(f"bn{i}", "BatchNorm2d", 0, b, "memory", 2e-5, 1.9e-4 + 1e-12 * b)
            for i, b in enumerate((6e5, 3.7e6))]
    grows = [roofline.Layer(f"act{i}", "GELU", 0, b, "memory", b / 40e9, b / 4e9) for i, b in enumerate((1e6, 8e6))]
    fast = [roofline.Layer("conv", "Conv2d", 1e9, 1e6, "compute", 1e-3, 1.2e-3)]
    lines = roofline.over_bound(flat + grows + fast)
    assert len(lines) == 4 and lines[0].startswith("BatchNorm2d: 2 layers at")
    assert "fixed cost of up to 191 µs" in lines[1]
    assert lines[2].startswith("GELU: 2 layers at 10.0x their bound, 250 µs–2.00 ms")
    assert "below the bandwidth" in lines[3]
    assert roofline.over_bound(fast) == [] and all(len(line) <= 120 for line in lines)
