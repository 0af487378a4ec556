"""Backbones: output shapes, parameter counts worked out by hand, and the model registry."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_lib.training.models import AirNet, LeNet, ResNet9, SimpleCNN, build_model, count_parameters, init_whitening


@pytest.mark.parametrize("make", [SimpleCNN, LeNet, lambda: ResNet9(width=8)], ids=["simple_cnn", "lenet", "resnet9"])
def test_forward_shape(make):
    """Each backbone maps a (4,3,32,32) batch to (4,10) finite logits."""
    torch.manual_seed(0)
    out = make()(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, 10) and torch.isfinite(out).all()


def test_num_classes_sets_output_width():
    """num_classes changes the width of the last layer."""
    assert LeNet(num_classes=3)(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    assert ResNet9(num_classes=5, width=4)(torch.randn(2, 3, 32, 32)).shape == (2, 5)


def test_simple_cnn_parameter_count():
    """SimpleCNN: conv 3->16 (3x3) plus linear 16*16*16 -> 10."""
    conv = 3 * 16 * 9 + 16
    fc = 16 * 16 * 16 * 10 + 10
    assert count_parameters(SimpleCNN()) == conv + fc == 41_418


def test_lenet_parameter_count():
    """LeNet: conv 6 and 16 (5x5), then fc 400->120->84->10."""
    conv1 = 3 * 6 * 25 + 6
    conv2 = 6 * 16 * 25 + 16
    fc1 = 400 * 120 + 120
    fc2 = 120 * 84 + 84
    fc3 = 84 * 10 + 10
    assert count_parameters(LeNet()) == conv1 + conv2 + fc1 + fc2 + fc3 == 62_006


def test_resnet9_parameter_count():
    """ResNet9(width w): bias-free 3x3 convs with BatchNorm (2 params per channel) and a final linear 8w -> 10."""
    w = 8

    def conv_bn(c_in, c_out):
        return c_in * c_out * 9 + 2 * c_out

    expected = (conv_bn(3, w) + conv_bn(w, 2 * w) + 2 * conv_bn(2 * w, 2 * w) + conv_bn(2 * w, 4 * w)
                + conv_bn(4 * w, 8 * w) + 2 * conv_bn(8 * w, 8 * w) + 8 * w * 10 + 10)
    assert count_parameters(ResNet9(width=w)) == expected


def test_count_parameters_ignores_frozen():
    """Frozen parameters are not counted as trainable."""
    model = LeNet()
    model.fc3.requires_grad_(False)
    assert count_parameters(model) == 62_006 - (84 * 10 + 10)


def test_build_model_by_name():
    """build_model returns the named class and passes keyword arguments on."""
    assert isinstance(build_model("simple_cnn"), SimpleCNN)
    assert isinstance(build_model("lenet", num_classes=3), LeNet)
    model = build_model("resnet9", width=4)
    assert isinstance(model, ResNet9) and model.net[-1].in_features == 32


def test_build_model_unknown_name_raises():
    """An unknown backbone name raises ValueError listing the choices."""
    with pytest.raises(ValueError, match="resnet50") as err:
        build_model("resnet50")
    assert "lenet" in str(err.value)


def test_models_import_torch_alone():
    """models.py holds plain nn.Modules: it imports torch and nothing of the course (no data, no metrics)."""
    import ast

    import course_lib.training.models as models

    tree = ast.parse(Path(models.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {"." * node.level + (node.module or "") for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported and all(name == "__future__" or name.split(".")[0] == "torch" for name in imported), imported


def test_init_whitening_takes_normalised_float_images_only():
    """uint8 pixels are refused with the remedy (normalise with data.to_float first): the net knows no statistics."""
    net = AirNet((8, 8, 8))
    with pytest.raises(ValueError, match="to_float"):
        init_whitening(net, torch.zeros(4, 3, 32, 32, dtype=torch.uint8))
    init_whitening(net, torch.randn(16, 3, 8, 8))
    assert bool(net.whitened) and torch.isfinite(net.whiten.weight).all()
