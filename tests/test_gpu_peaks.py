"""MFU's denominator: a GPU name torch reports finds its own row of the sourced peak table (flops.GPU_PEAKS) and no
other; a near-miss name (a sparse figure, or the H100 NVL's) finds none and says so, rather than bias MFU."""
import re

import pytest

from course_lib import flops

# torch.cuda.get_device_name() as those GPUs report it -> the part whose row it must find; None: no row may match
NAMES = {
    "Tesla T4": "T4",
    "NVIDIA L4": "L4",
    "NVIDIA A100-SXM4-80GB": "A100",
    "NVIDIA A100-PCIE-40GB": "A100",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": None,  # AWS's variant, with other tensor figures: not the A10's
    "NVIDIA H100 NVL": None,
    "NVIDIA L40S": None,
    "NVIDIA GeForce RTX 4090": None,
}
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@pytest.mark.parametrize("name", NAMES)
def test_a_device_name_finds_its_own_row_only(name):
    """Exactly one row's pattern matches a listed name (no earlier row shadows it), and MFU reads that row's figure for
    each precision, or says 'no peak known' where the row has none; an unlisted name matches no row at all."""
    part = NAMES[name]
    matches = [row_part for pattern, row_part, _, _ in flops.GPU_PEAKS if re.search(pattern, name)]
    assert matches == ([part] if part else [])
    if part is None:
        assert flops.gpu_peaks(name) is None and flops.peak_tflops({"gpu": name}) is None
        assert flops.peak_text({"gpu": name}).startswith(f"no bf16 peak known for {name}")
        return
    found, peaks, source = flops.gpu_peaks(name)
    assert found == part
    for precision in PRECISIONS:
        assert flops.peak_tflops({"gpu": name}, precision) == peaks.get(precision)
        text = flops.peak_text({"gpu": name}, precision)
        assert (part in text and source in text) if precision in peaks else text.startswith(f"no {precision} peak")


def test_every_row_is_dense_sourced_and_ordered_sensibly():
    """Each row has a source link and fp32 below its tensor-core figures (a sparse figure would break fp8 = 2 x
    fp16 where both are listed); a CPU gets the clear message, and MFU uses the precision's own peak."""
    for _, part, peaks, source in flops.GPU_PEAKS:
        assert "https://" in source, part
        assert set(peaks) <= set(PRECISIONS) and "fp32" in peaks, part
        assert all(peaks["fp32"] <= v for v in peaks.values()), part
        if "fp8" in peaks and "fp16" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["fp16"], rel=0.01), part
    assert flops.peak_text({"gpu": None}).startswith("no bf16 peak known for this CPU")
    t4 = {"gpu": "Tesla T4"}
    peak = flops.peak_tflops(t4, "fp16")
    done = flops.achieved(0.1 * peak * 1e12, 1.0, t4, "fp16")  # a tenth of the fp16 peak for one second
    assert done["fraction_of_peak"] == pytest.approx(0.1) and done["peak_tflops"] == peak and "T4" in done["peak_text"]
    assert flops.achieved(1e12, 1.0, t4, "bf16")["fraction_of_peak"] is None  # Turing has no bf16: no MFU, no guess
