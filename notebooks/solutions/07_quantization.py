"""Reference solution, lesson 07 exercise 2: post-training static int8 of the convolutions only, by the PT2E steps
written out (export, observers from the x86 quantizer told to leave nn.Linear in fp32, calibration, conversion);
the check compiles the result to oneDNN int8 kernels."""
import torch
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from course_lib.compression import compress
from course_lib.measure import roofline


def quantize(model, calibration):
    """The int8 program: int8 convolution weights, an fp32 classifier, quantize/dequantize ops, calibrated."""
    graph = compress.export(model.eval()).module()  # torch.export, dynamic batch dimension
    quantizer = compress.x86_quantizer().set_module_type_qconfig(torch.nn.Linear, None)  # the classifier: fp32
    prepared = prepare_pt2e(graph, quantizer)  # BatchNorm folded, observers inserted (none around the Linear)
    with torch.no_grad():
        for x in calibration:  # (B, 3, 32, 32) training images: each observer records its activation's range
            prepared(x)
    return convert_pt2e(prepared)  # int8 weights, quantize/dequantize around each int8 op


def predict_speedup(ceil, model, x):
    """fp32's latency over int8's at input x (64, 3, 32, 32), from the roofs: the convolutions' FLOPs at each format's
    measured rate, the Linear's at fp32's either way (it stays fp32). Without an int8 ceiling (no VNNI/AMX) the roofs
    allow no gain: 1.0."""
    counts = roofline.count(model, x)  # every aten op with its FLOPs; the products flagged
    conv = sum(o.flops for o in counts.ops if o.matmul and o.name.startswith("convolution"))
    linear = sum(o.flops for o in counts.ops if o.matmul) - conv  # the classifier's product, kept in fp32
    int8 = ceil.rate("int8") if "int8" in ceil.formats() else ceil.rate("fp32")
    return (conv + linear) / ceil.rate("fp32") / (conv / int8 + linear / ceil.rate("fp32"))
