"""scripts/airbench_carry.py reads the data files with torch.load(weights_only=True): a crafted pickle is refused,
even where TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns torch's default off."""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import airbench_carry  # noqa: E402

RAN: list[str] = []


def _payload() -> dict:
    RAN.append("code from the file ran")
    return {}


class Crafted:
    """Unpickles by calling _payload: what a malicious data file would do."""

    def __reduce__(self):
        return (_payload, ())


def test_crafted_data_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    root = tmp_path / "cifar10"
    root.mkdir()
    torch.save(Crafted(), root / "train.pt")
    with pytest.raises(pickle.UnpicklingError):
        airbench_carry.check_data(root)
    assert RAN == []
