"""Where the time goes, without a clock: the step model's classes (matmul, cache or DRAM bandwidth, transcendental,
per-op cost), the breakdown's rows, table, reconciliation and sentence on an injected Breakdown, the profiler's
events grouped by the ops the model counts, and one tiny step broken down for real with injected step times."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.benchmark import breakdown
from course_lib.measure import ceilings, roofline


def fake_ceilings(rate=1e11, bandwidth=1e10, per_op=1e-5) -> ceilings.Ceilings:
    """Ceilings with one block each (no clock): rate FLOP/s, bandwidth bytes/s, per_op seconds."""
    rows = {"matmul fp32": ceilings.Ceiling("matmul fp32", "compute", (rate,)),
            "memory": ceilings.Ceiling("memory", "memory", (bandwidth,)),
            "per op": ceilings.Ceiling("per op", "overhead", (per_op,))}
    return ceilings.Ceilings("test machine", "cpu", "full", torch.get_num_threads(), torch.__version__, rows)


def with_rows(ceil: ceilings.Ceilings, **rows: tuple[str, float]) -> ceilings.Ceilings:
    """ceil with extra one-block ceilings: name=(kind, figure)."""
    for name, (kind, value) in rows.items():
        ceil.rows[name.replace("_", " ")] = ceilings.Ceiling(name.replace("_", " "), kind, (value,))
    return ceil


def test_step_model_sums_each_ops_work_bound_plus_the_per_op_cost():
    ceil = fake_ceilings(rate=1e11, bandwidth=1e10, per_op=1e-5)
    counts = roofline.Counts([roofline.Op("mm", int(1e9), int(1e6), True), roofline.Op("add", 10, int(1e7))], 0)
    m = roofline.step_model(counts, ceil)
    assert m.predicted == pytest.approx(0.01 + 0.001 + 2e-5)  # compute + memory + two ops' fixed cost
    assert m.share["overhead"] == pytest.approx(2e-5 / m.predicted) and m.kind == "compute"
    emulated = roofline.step_model(counts, ceil, rate=1e10)  # a measured, slower rate for an emulated format
    assert emulated.predicted == pytest.approx(0.1 + 0.001 + 2e-5)
    assert "emulated: products at the measured 10.0 GFLOP/s" in roofline.explain("s", counts, ceil, [0.2], rate=1e10)


def test_small_working_sets_take_the_cache_bandwidth_fresh_outputs_their_pages_and_tanh_its_rate():
    ceil = with_rows(fake_ceilings(bandwidth=1e10), tanh=("pointwise", 1e8), add_reused=("memory", 1e10),
                     add_fresh=("memory", 3 / (3 / 1e10 + 1e-10)))  # a fresh byte costs 1e-10 s more
    ceil.rows["memory cache"] = ceilings.Ceiling("memory cache", "memory", (1e11,), capacity=2**20)
    assert ceil.first_touch == pytest.approx(1e-10)
    small, large = roofline.Op("add", 0, 2**19), roofline.Op("add", 0, 2**23)
    assert roofline.op_bound(small, ceil).seconds["memory"] == pytest.approx(2**19 / 1e11)
    assert roofline.op_bound(large, ceil).seconds["memory"] == pytest.approx(2**23 / 1e10)
    fresh = roofline.Op("add", 0, 3 * 2**25, fresh=2**25)  # a 32 MiB output allocated by the op: new pages
    assert roofline.op_bound(fresh, ceil).seconds["memory"] == pytest.approx(3 * 2**25 / 1e10 + 2**25 * 1e-10)
    reused = roofline.Op("add", 0, 3 * 2**23, fresh=2**23)  # 8 MiB: the allocator reuses freed memory
    assert roofline.op_bound(reused, ceil).seconds["memory"] == pytest.approx(3 * 2**23 / 1e10)
    tanh = roofline.Op("tanh", 10**6, 8)
    assert roofline.op_class(tanh) == "transcendental" and roofline.op_bound(tanh, ceil).kind == "compute"
    assert roofline.op_bound(tanh, ceil).seconds["compute"] == pytest.approx(10**6 / 1e8)
    assert roofline.op_class(roofline.Op("convolution", 1, 1, True)) == "matmul"
    x = torch.randn(2**21)  # 8 MiB: x + 1 allocates its output, x.add_(1) does not
    assert [o.fresh for o in roofline.count(lambda: (x + 1, x.add_(1))).ops] == [x.nbytes, 0]


def fake_breakdown(python: float = 0.2e-3, measured=(1.0e-3, 1.1e-3, 1.2e-3)) -> breakdown.Breakdown:
    """A LeNet-like step: a convolution far below its bound, an add at it, Python and the optimiser beside them."""
    ops = {"convolution": {"calls": 2, "measured": 0.5e-3, "bound": 0.1e-3, "kind": "compute"},
           "add_": {"calls": 10, "measured": 0.1e-3, "bound": 0.1e-3, "kind": "memory"}}
    overhead = {"optimiser (Python)": 0.15e-3, "autograd engine": 0.05e-3, breakdown.PYTHON: python}
    return breakdown.rows(breakdown.Breakdown(ops, overhead, list(measured), 1.0e-3 + python - 0.2e-3 + 0.1e-3,
                                              0.2e-3, "test machine", steps=30))


def test_rows_table_and_sentence_name_the_largest_gap_and_its_cause():
    bd = fake_breakdown()
    assert [r["name"] for r in bd.rows][:2] == ["convolution", breakdown.PYTHON]
    text = breakdown.table(bd, top=3)
    assert text.count("\n| ") == 3 and "| convolution | 2 | 500 µs" in text and "20 %" in text  # bound / measured
    assert "not in the model" in text and "test machine" in text
    line = breakdown.sentence(bd)
    assert line.startswith("Largest gap: convolution, 400 µs a step over the model, at 20 % of its bound")
    assert breakdown.CAUSES["compute"] in line and len(line) <= 120
    worse = fake_breakdown(python=0.9e-3)  # Python between ops now the largest gap
    assert breakdown.sentence(worse).startswith(f"Largest gap: {breakdown.PYTHON}, 900 µs")
    # the row is all time outside recorded ops, which can grow with the batch: its cause says so, not 'interpreter'
    assert breakdown.sentence(worse).endswith(": not inside any recorded op (Python or unrecorded work)")
    long = fake_breakdown()
    long.ops["native_batch_norm_backward_with_a_long_name"] = long.ops.pop("convolution")
    two = breakdown.sentence(breakdown.rows(long)).split("\n")  # too long for one line: the cause on a second
    assert len(two) == 2 and two[1] == f"  {breakdown.CAUSES['compute']}" and all(len(x) <= 120 for x in two)


def test_reconcile_prints_the_profilers_own_overhead_and_the_shares():
    bd = fake_breakdown()  # profiled 1.1 ms, measured 1.1 ms median
    assert bd.overhead_s == pytest.approx(0.0, abs=1e-12)
    line = breakdown.reconcile(bd)
    assert "1.10 ms timed outside the profiler (median; 1.00–1.20 ms, 3 runs)" in line
    assert "55 % of the profiled step ran in the 2 kinds of op" in line and "between recorded events" in line
    busy = fake_breakdown(measured=(2e-3,))
    assert "900 µs under the median timed outside it: no profiler overhead measured" in breakdown.reconcile(busy)
    assert bd.recorded == pytest.approx(1 - 0.2 / 1.1)


def test_the_reconciliation_and_the_explain_line_print_one_fact_a_line_within_120_characters():
    """Worst cases: 5-digit times, runs, steps and kinds of op, a long hardware name, the two-timings wording: every
    line of the table's notes and of explain fits in verdict.LONGEST, in a fixed shape (a five-item markdown list)."""
    from course_lib.measure import verdict

    hardware = "CPU Intel(R) Xeon(R) Platinum 8480+ (2 cores)"
    ops = {f"native_batch_norm_backward_{i:05d}": {"calls": 12_345, "measured": 12_345.0, "bound": 1e-9,
                                                   "kind": "memory"} for i in range(12_345)}
    for measured, profiled in (([12_345.0, 99_999.0] * 6_173, 99_999.0), ([99_999.0], 12_345.0)):
        bd = breakdown.rows(breakdown.Breakdown(ops, {breakdown.PYTHON: 12_345.0}, measured, profiled, 12_345.0,
                                                hardware, steps=12_345))
        notes = breakdown.table(bd).split("\n\n", 1)[1].splitlines()
        assert sum(line.startswith("- ") for line in notes) == 5 and hardware in notes[-1]
        long = [f"{len(t)}: {t}" for t in notes + [breakdown.sentence(bd)] if len(t) > verdict.LONGEST]
        assert not long, "\n".join(long)


def test_a_tiny_step_broken_down_for_real_groups_the_profilers_time_by_the_counted_ops():
    net = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()

    bd = breakdown.measure(step, fake_ceilings(), measured=[1e-3, 1e-3], steps=3)  # the step time injected
    assert {"addmm", "mm", "relu"} <= set(bd.ops) and bd.ops["addmm"]["calls"] == 2 and bd.steps == 3
    assert "_record_function_enter_new" not in bd.ops  # the optimiser's profiler marks move no data
    assert bd.ops["addmm"]["measured"] > 0 and "optimiser (Python)" in bd.overhead
    total = sum(r["measured"] for r in bd.ops.values()) + sum(bd.overhead.values())
    assert total == pytest.approx(bd.profiled, rel=1e-6) or bd.overhead[breakdown.PYTHON] == 0
    assert bd.predicted == pytest.approx(roofline.step_model(bd.counts, fake_ceilings()).predicted)
    assert breakdown.explain(bd, "tiny", fake_ceilings()).startswith("tiny: ")


def test_the_sentence_says_what_was_measured_a_floor_set_bound_and_a_memory_rows_rates():
    """A row whose floor (the op timed alone) set its bound reads 'slower than its fastest call', whatever its class; a
    memory row gives its measured and assumed bytes/s, not a guessed cause."""
    ops = {"max_pool2d_with_indices": {"calls": 1, "measured": 3.5e-3, "bound": 2.6e-3, "kind": "memory",
                                       "bytes": 14 * 2**20, "work": 2.59e-3, "alone": True}}
    bd = breakdown.rows(breakdown.Breakdown(ops, {}, [3.5e-3], 3.5e-3, 2.6e-3, "test machine", steps=3))
    assert breakdown.sentence(bd).endswith(breakdown.CAUSES["alone"])
    ops = {"mul": {"calls": 4, "measured": 2.0e-3, "bound": 0.5e-3, "kind": "memory", "bytes": 50_000_000,
                   "work": 0.5e-3, "alone": False}}
    bd = breakdown.rows(breakdown.Breakdown(ops, {}, [2e-3], 2e-3, 0.5e-3, "test machine", steps=3))
    line = breakdown.sentence(bd)
    assert line.endswith("its bytes moved at 25 GB/s, the bound assumes 100 GB/s") and len(line) <= 120, line
    ops["mul"].update({"faults": 1500.0, "class": "elementwise"})  # new pages counted (not charged), the op class
    line = breakdown.sentence(breakdown.rows(bd))
    assert line.startswith("Largest gap: mul (elementwise), 1.50 ms") and "; 1,500 page faults a step, not in" in line
    ops["mul"]["alone"] = True  # an elementwise op's floor is a copy of its bytes, not the op: its rates, still
    assert "the bound assumes 100 GB/s" in breakdown.sentence(breakdown.rows(bd))
    del ops["mul"]["bytes"]  # no bytes: no rates, and no format field left in the line
    assert "{" not in breakdown.sentence(breakdown.rows(bd))


def test_a_breakdown_given_the_lessons_counts_predicts_what_they_predict():
    """measure(counts=...) reuses the caller's count, so the explain line and the breakdown print one prediction."""
    x = torch.randn(64, 64)
    counts = roofline.count(lambda: x @ x, floors=True)
    bd = breakdown.measure(lambda: x @ x, fake_ceilings(), measured=[1e-3], steps=3, counts=counts)
    assert bd.counts is counts or bd.counts.ops[0].floor < counts.ops[0].floor  # the same, or a floor seen lower
    assert bd.predicted == pytest.approx(roofline.step_model(bd.counts, fake_ceilings()).predicted)


def test_a_floor_slower_than_the_op_ran_in_the_step_is_lowered_to_the_step_s_fastest_call():
    """A kernel-bound op timed alone at 10 s a call (a busy machine) ran in microseconds in the profiled steps: its
    floor becomes its fastest call there (the fake ceilings' parts of the bound are no floors); a copy's is kept."""
    import dataclasses

    x = torch.randn(64, 64)
    counts = roofline.count(lambda: (x @ x).relu(), floors=True)
    slow = roofline.Counts([dataclasses.replace(o, floor=10.0) for o in counts.ops], counts.matmul_flops)
    bd = breakdown.measure(lambda: (x @ x).relu(), fake_ceilings(), measured=[1e-3], steps=3, counts=slow)
    mm, relu = bd.counts.ops
    assert mm.name == "mm" and mm.floor < 0.5 and relu.floor == 10.0  # relu is not kernel-bound: its floor stays
    assert bd.predicted == pytest.approx(roofline.step_model(bd.counts, fake_ceilings()).predicted)
