"""Reference solution, lesson 07 exercise 2: post-training static int8 of the convolutions only, by the PT2E steps
written out (export, observers from the x86 quantizer told to leave nn.Linear in fp32, calibration, conversion);
the check compiles the result to oneDNN int8 kernels."""
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from course_lib import compress


def quantize(model, calibration):
    """The int8 program: int8 convolution weights, an fp32 classifier, quantize/dequantize ops, calibrated."""
    graph = compress.export(model.eval()).module()  # torch.export, dynamic batch dimension
    quantizer = compress.x86_quantizer().set_module_type_qconfig(torch.nn.Linear, None)  # the classifier: fp32
    prepared = prepare_pt2e(graph, quantizer)  # BatchNorm folded, observers inserted (none around the Linear)
    with torch.no_grad():
        for x in calibration:  # (B, 3, 32, 32) training images: each observer records its activation's range
            prepared(x)
    return convert_pt2e(prepared)  # int8 weights, quantize/dequantize around each int8 op
