"""MFU's denominator: the dense peak per precision for the GPU torch names, from one sourced table, with a clear
'no peak known' for anything else (a sparse figure, or a near-miss name such as the H100 NVL, would bias MFU)."""
import pytest

from course_lib import flops

# torch.cuda.get_device_name() as those GPUs report it -> (part, fp32, tf32, fp16, bf16, fp8); None: not in the table
NAMES = {
    "Tesla T4": ("T4", 8.141, None, 65.13, None, None),
    "NVIDIA L4": ("L4", 30.29, 60, 121, 121, 242.5),
    "NVIDIA A100-SXM4-80GB": ("A100", 19.5, 156, 312, 312, None),
    "NVIDIA A100-PCIE-40GB": ("A100", 19.5, 156, 312, 312, None),
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 67, 494.5, 989.5, 989.5, 1979),
    "NVIDIA H100 PCIe": ("H100 PCIe", 51, 378, 756.5, 756.5, 1513),
    "NVIDIA H200": ("H200 SXM", 66.91, None, 989, 989, 1979),
    "NVIDIA A10": ("A10", 31.24, None, None, None, None),
    "NVIDIA A10G": None,  # AWS's variant, with other tensor figures: not the A10's
    "NVIDIA H100 NVL": None,
    "NVIDIA L40S": None,
    "NVIDIA GeForce RTX 4090": None,
}


@pytest.mark.parametrize("name", NAMES)
def test_peak_lookup_on_real_device_names(name):
    want = NAMES[name]
    found = flops.gpu_peaks(name)
    if want is None:
        assert found is None
        assert flops.peak_tflops({"gpu": name}) is None
        assert flops.peak_text({"gpu": name}).startswith(f"no bf16 peak known for {name}")
        return
    part, *values = want
    assert found[0] == part and found[2].startswith("https://")
    for precision, value in zip(("fp32", "tf32", "fp16", "bf16", "fp8"), values):
        assert flops.peak_tflops({"gpu": name}, precision) == value


def test_every_row_is_dense_sourced_and_ordered_sensibly():
    """Each row has a source link and fp32 below its tensor-core figures (a sparse figure would break fp8 = 2 x
    fp16 where both are listed); a CPU gets the clear message, and MFU uses the precision's own peak."""
    for _, part, peaks, source in flops.GPU_PEAKS:
        assert "https://" in source, part
        assert all(peaks["fp32"] <= v for v in peaks.values()), part
        if "fp8" in peaks and "fp16" in peaks:
            assert peaks["fp8"] == pytest.approx(2 * peaks["fp16"], rel=0.01), part
    assert flops.peak_text({"gpu": None}).startswith("no bf16 peak known for this CPU")
    t4 = flops.achieved(6.513e12, 1.0, {"gpu": "Tesla T4"}, "fp16")
    assert t4["fraction_of_peak"] == pytest.approx(0.1) and "T4" in t4["peak_text"]
