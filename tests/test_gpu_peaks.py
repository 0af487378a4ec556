"""MFU's denominator: a GPU name torch reports finds its own row of the sourced peak table (flops.GPU_PEAKS) and no
other; a near-miss name (a sparse figure, or the H100 NVL's) finds none and says so, rather than bias MFU."""
import pytest

from course_lib.measure import flops

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
    """gpu_peaks gives the name's own part (first match wins: a family's row must not shadow a variant's), and the text
    MFU prints names the figure it divides by, its part and source; a near-miss name gets no peak in any precision and
    a message naming the listed parts, rather than another GPU's figure."""
    part = NAMES[name]
    found = flops.gpu_peaks(name)
    assert (found[0] if found else None) == part
    for precision in PRECISIONS:
        peak, text = flops.peak_tflops({"gpu": name}, precision), flops.peak_text({"gpu": name}, precision)
        if peak is None:
            assert text.startswith(f"no {precision} peak known for {name} (flops.GPU_PEAKS lists "), text
        else:
            assert part and text.startswith(f"{peak:g} TFLOP/s dense {precision} on the {part} (https://"), text
    assert (part is None) == all(flops.peak_tflops({"gpu": name}, p) is None for p in PRECISIONS)


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
    assert done.fraction_of_peak == pytest.approx(0.1) and done.peak_tflops == peak and "T4" in done.peak_text
    assert flops.achieved(1e12, 1.0, t4, "bf16").fraction_of_peak is None  # Turing has no bf16: no MFU, no guess
