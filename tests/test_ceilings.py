"""The op-class ceilings (measure.opclasses through measure.ceilings): the rows measured, the bandwidth picked by
working set, the elementwise and first-touch figures, and a saved file from before the op classes measured again.
Injected timings only: no clock decides a test."""
import json

import pytest
import torch

from course_lib.base import config
from course_lib.measure import ceilings, opclasses


def row(name, kind, value, capacity=0):
    """A one-block ceiling: `value` in FLOP/s, bytes/s, elements/s or seconds per op."""
    return ceilings.Ceiling(name, kind, (value,), "", capacity)


def fake(**extra) -> ceilings.Ceilings:
    """DRAM 10 GB/s, cache 80 GB/s up to 32 MiB, adds at 8 (reused) and 2 (fresh) GB/s, clone 1.5 GB/s."""
    rows = [row("matmul fp32", "compute", 1e11), row("memory", "memory", 1e10),
            row("memory cache", "memory", 8e10, 32 * 2**20), row("add reused", "memory", 8e9),
            row("add fresh", "memory", 2e9), row("copy fresh", "memory", 1.5e9), row("tanh", "pointwise", 5e8),
            row("per op", "overhead", 3e-6), row("per call compiled", "overhead", 1.2e-5)]
    return ceilings.Ceilings("test machine", "cpu", "full", torch.get_num_threads(), torch.__version__,
                             {r.name: r for r in rows} | extra)


def test_bandwidth_for_picks_the_cache_inside_it_and_dram_past_it():
    c = fake()
    assert c.bandwidth_for(2**20) == pytest.approx(8e10) and c.bandwidth_for(32 * 2**20) == pytest.approx(8e10)
    assert c.bandwidth_for(32 * 2**20 + 1) == pytest.approx(1e10) == c.bandwidth
    assert c.bandwidth_for(0) == pytest.approx(1e10)  # no working set named: DRAM, the safe bound
    del c.rows["memory cache"]  # a machine whose cache size is unknown: DRAM for every working set
    assert c.bandwidth_for(2**20) == pytest.approx(1e10)


def test_elementwise_first_touch_and_fixed_costs():
    c = fake()
    assert c.elementwise(3, fresh=False) == pytest.approx(8e9) and c.elementwise(3, fresh=True) == pytest.approx(2e9)
    assert c.elementwise(2) == pytest.approx(1e10) and c.elementwise(2, fresh=True) == pytest.approx(1.5e9)
    # 3 streams per output byte: 3/2e9 - 3/8e9 seconds per byte of a new output beyond a reused one
    assert c.first_touch == pytest.approx(3 / 2e9 - 3 / 8e9)
    assert c.per_call_compiled == pytest.approx(1.2e-5) and c.tanh_rate == pytest.approx(5e8)
    assert "G elements/s" in c.rows["tanh"].text()


def test_a_faster_later_timing_raises_its_ceiling_and_a_slower_one_leaves_it():
    c = fake()
    assert not c.observe("add reused", [7e9, 7.9e9]) and c.rows["add reused"].values == (8e9,)  # slower: unchanged
    assert c.observe("add reused", [7e9, 8.4e9]) and c.elementwise(3) == pytest.approx(8.4e9)  # its best block joins
    assert c.rows["add reused"].values == (8e9, 8.4e9)  # the slower block does not widen the spread
    assert c.observe("per op", [2.5e-6, 4e-6]) and c.per_op == pytest.approx(2.5e-6)  # a fixed cost: lower is better
    assert not c.observe("per op", [2.6e-6])


def test_measure_times_every_op_class_with_its_work():
    def fake_time(fn, min_run_time):
        return [0.01, 0.0101, 0.0102, 0.0103]

    found = ceilings.measure("cpu", size="smoke", time_fn=fake_time)
    names = [p.name for p in opclasses.probes("cpu")]
    assert set(names) <= set(found.rows) and "h2d pinned" not in found.rows
    assert {"memory", "add reused", "add fresh", "copy fresh", "tanh", "per op", "per call compiled"} <= set(names)
    add = found.rows["add fresh"]
    assert add.best == pytest.approx(3 * opclasses.ELEMENTWISE * 4 / 0.01)  # 3 streams of 64 MiB in 10 ms
    assert found.rows["tanh"].best == pytest.approx(opclasses.TRANSCENDENTAL / 0.01)
    if opclasses.llc_bytes("cpu"):  # the cache row's figure applies up to the cache's size
        assert found.rows["memory cache"].capacity == opclasses.llc_bytes("cpu")


def test_a_file_saved_before_the_op_classes_is_measured_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path))
    monkeypatch.setenv(config.SIZE_ENV, "full")
    measured = []
    monkeypatch.setattr(ceilings, "measure", lambda device: measured.append(device) or fake())
    ceilings.load("cpu")
    saved = json.loads(ceilings.path("cpu").read_text())
    assert saved["schema"] == ceilings.SCHEMA and saved["rows"]["memory cache"]["capacity"] == 32 * 2**20
    back = ceilings.load("cpu")
    assert measured == ["cpu"] and back.bandwidth_for(2**20) == pytest.approx(8e10)  # capacity read back
    ceilings.path("cpu").write_text(json.dumps({k: v for k, v in saved.items() if k != "schema"}))
    ceilings.load("cpu")
    assert measured == ["cpu", "cpu"] and "before the op classes" in capsys.readouterr().out


def test_the_product_rate_is_the_faster_of_the_matmul_and_the_convolution():
    c = fake()
    assert c.rate("fp32") == pytest.approx(1e11)  # no convolution measured: the matmul's
    c.rows["conv fp32"] = row("conv fp32", "compute", 1.2e11)
    assert c.rate("fp32") == pytest.approx(1.2e11) and c.formats() == ["fp32"]
    assert c.rate_row("fp32") == "conv fp32"  # the label names the ceiling rate takes (lesson 08's line)
    c.rows["conv fp32"] = row("conv fp32", "compute", 0.8e11)
    assert c.rate("fp32") == pytest.approx(1e11) and c.rate_row("fp32") == "matmul fp32"


def test_a_smoke_measurement_takes_one_try_each_and_is_saved_even_when_noisy_for_smoke_runs_only(tmp_path,
                                                                                                 monkeypatch):
    """make test's smoke runs (notebooks side by side on a busy machine) measure each ceiling once and keep the file,
    so later lessons load it instead of measuring again (issue 45); a full run neither reads it nor saves a noisy
    one (test_roofline's retry test). Injected times, all noisy (3x)."""
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path))
    monkeypatch.setenv(config.SIZE_ENV, "smoke")
    calls = []
    busy = ceilings.measure("cpu", size="smoke", time_fn=lambda fn, min_run_time: calls.append(fn) or
                            [0.01, 0.03, 0.01, 0.01])
    assert len(calls) == len(busy.rows) and set(busy.noisy()) == set(busy.rows)  # one try each, flagged
    assert ceilings.save(busy).exists()
    measured = []
    monkeypatch.setattr(ceilings, "measure", lambda device: measured.append(device) or fake())
    assert ceilings.load("cpu").size == "smoke" and measured == []  # a smoke run reads it back
    monkeypatch.setenv(config.SIZE_ENV, "full")
    assert ceilings.load("cpu").size == "full" and measured == ["cpu"]  # a full run measures its own
