"""course_lib.compression.compress: int8 PTQ accuracy, size and reload; QAT end to end; pruning sparsity. The deprecated
torch.ao.quantization is banned by ruff (TID251 in pyproject.toml) in course_lib, scripts and tests alike."""
from __future__ import annotations

import lightning as L
import pytest
import torch

from course_lib.compression import compress
from course_lib.data.data import CIFAR10DataModule
from course_lib.training.models import LeNet, ResNet9
from course_lib.training.modules import ImageClassifierModule

# PTQ tolerance on fresh random inputs: logits within 5 % relative L2 error of fp32, and the same top-1 class for at
# least 95 % of inputs (int8 rounding moves logits by about 1 %; near-ties may flip)
PTQ_REL_ERR, PTQ_AGREEMENT = 0.05, 0.95
MIN_SIZE_RATIO = 3.5  # fp32 .pt2 / int8 .pt2 at width 32 (1.6 M weights): 4x minus the graph's fixed overhead


def trained_like(model: torch.nn.Module) -> torch.nn.Module:
    """Give BatchNorm non-trivial running statistics (one pass in train mode), as training would; eval mode."""
    model.train()
    with torch.no_grad():
        model(compress.example_input(128))
    return model.eval()


@pytest.fixture(scope="module")
def ptq(tmp_path_factory):
    """A ResNet9 (width 32), its PTQ int8 version calibrated on random batches, and both saved as .pt2."""
    torch.manual_seed(0)
    fp32 = trained_like(ResNet9(width=32))
    calibration = [torch.randn(64, 3, 32, 32) for _ in range(2)]
    int8 = compress.quantize_ptq(fp32, calibration)
    folder = tmp_path_factory.mktemp("ptq")
    return {"fp32": fp32, "int8": int8, "fp32_path": compress.save_program(fp32, folder / "fp32.pt2"),
            "int8_path": compress.save_program(int8, folder / "int8.pt2")}


def test_ptq_agrees_with_fp32_on_fresh_inputs(ptq):
    """On inputs never seen in calibration, int8 logits stay within PTQ_REL_ERR and top-1 agrees >= PTQ_AGREEMENT."""
    x = torch.randn(256, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, out = ptq["fp32"](x), ptq["int8"](x)
    assert ((out - ref).norm() / ref.norm()).item() < PTQ_REL_ERR
    assert (out.argmax(1) == ref.argmax(1)).float().mean().item() >= PTQ_AGREEMENT


def test_ptq_weights_are_int8_and_file_is_smaller(ptq):
    """Every conv and linear weight is stored as int8, and the saved program is >= 3.5x smaller than fp32's."""
    int8 = [t for t in ptq["int8"].state_dict().values() if t.dtype == torch.int8]
    assert len(int8) == 9  # 8 convolutions + 1 linear
    assert not any(t.dtype == torch.float32 and t.numel() > 10_000 for t in ptq["int8"].state_dict().values())
    assert compress.size_mb(ptq["fp32_path"]) / compress.size_mb(ptq["int8_path"]) >= MIN_SIZE_RATIO


def test_reloaded_int8_program_gives_identical_outputs(ptq):
    """torch.export.load of the saved int8 program reproduces the in-memory model bit for bit, at two batch sizes."""
    reloaded = compress.load_program(ptq["int8_path"])
    for batch in (1, 7):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            assert torch.equal(reloaded(x), ptq["int8"](x))


def test_fold_batchnorm_keeps_outputs():
    """Folding BatchNorm into the preceding convs changes eval outputs only by float rounding."""
    torch.manual_seed(0)
    model = trained_like(ResNet9(width=8))
    folded = compress.fold_batchnorm(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in folded.modules())
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-4, atol=1e-4)


def trainer(**kwargs) -> L.Trainer:
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kwargs)


@pytest.fixture(scope="module")
def tiny_dm(tiny_folder, tmp_path_factory):
    """48 training images of 3 classes from the real JPEG folder, in batches of 16."""
    dm = CIFAR10DataModule(image_folder=str(tiny_folder), data_dir=str(tmp_path_factory.mktemp("cache")),
                           batch_size=16, seed=0)
    dm.prepare_data()
    return dm


def test_qat_trains_with_lightning_and_converts(tiny_dm):
    """prepare_qat -> ImageClassifierModule + Trainer.fit (weights change) -> convert_qat gives an int8 model."""
    torch.manual_seed(0)
    fp32 = trained_like(ResNet9(width=8))
    backbone = compress.prepare_qat(fp32)
    before = {k: v.clone() for k, v in backbone.state_dict().items() if v.is_floating_point()}
    trainer(limit_train_batches=2).fit(ImageClassifierModule(backbone, lr=0.01, schedule="constant"),
                                       datamodule=tiny_dm)
    assert any(not torch.equal(before[k], v) for k, v in backbone.state_dict().items() if k in before)
    int8 = compress.convert_qat(backbone)
    assert sum(t.dtype == torch.int8 for t in int8.state_dict().values()) == 9
    with torch.no_grad():
        out = int8(torch.randn(5, 3, 32, 32))
    assert out.shape == (5, 10) and torch.isfinite(out).all()


@pytest.mark.parametrize("amount", [0.3, 0.7])
def test_pruning_callback_reaches_requested_sparsity(tiny_dm, amount):
    """PruneAtStart(amount) leaves exactly that fraction of conv/linear weights at zero (counted), masks removed."""
    torch.manual_seed(0)
    module = ImageClassifierModule(LeNet(num_classes=3), num_classes=3, lr=0.01, schedule="constant")
    trainer(limit_train_batches=2, callbacks=[compress.PruneAtStart(amount)]).fit(module, datamodule=tiny_dm)
    weights = [layer.weight for layer, _ in compress.prunable(module.net)]
    zeros = sum(int((w == 0).sum()) for w in weights)
    assert zeros == pytest.approx(amount * sum(w.numel() for w in weights), abs=1)
    assert compress.sparsity(module.net) == pytest.approx(amount, abs=1e-4)
    assert not any(name.endswith("_orig") for name, _ in module.net.named_parameters())  # pruning made permanent


def test_linear_int8_configs_stay_close():
    """Dynamic and weight-only int8 (quantize_ on Linear layers) keep LeNet's logits within 5 % of fp32."""
    torch.manual_seed(0)
    model = LeNet().eval()
    x = torch.randn(32, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        for mode in ("dynamic", "weight_only"):
            out = compress.quantize_linear_int8(model, mode)(x)
            assert ((out - ref).norm() / ref.norm()).item() < 0.05, mode
    with pytest.raises(ValueError, match="weight_only"):
        compress.quantize_linear_int8(model, "int4")
