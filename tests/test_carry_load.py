"""scripts/airbench_carry.py reads the data files with torch.load(weights_only=True): a crafted pickle is refused,
even where TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD turns torch's default off."""
from __future__ import annotations

import pickle

import pytest
import torch

from scripts import airbench_carry

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
