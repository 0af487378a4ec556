"""Reference solution, lesson 07 exercise 1: int8 post-training quantization, compiled to oneDNN int8 kernels."""
from course_lib import compress


def serve(model, calibration):
    """A callable on (64, 3, 32, 32) batches: PT2E static int8 calibrated on `calibration`, compiled with freezing."""
    quantized = compress.quantize_ptq(model, calibration)  # export, observers, calibration, convert
    return compress.compile_for_cpu(quantized, calibration[0])  # compiled once here, at batch 64
