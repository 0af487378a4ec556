"""The uint8 data cache is verified: keyed by the folder's contents, checksummed, and rebuilt (one line saying why)
when damaged or stale, with the superseded file removed."""
from __future__ import annotations

import os
import re

import pytest
import torch

from course_lib.data.sources import load_image_folder


@pytest.fixture
def split(make_folder, tmp_path):
    """9 real JPEGs in 3 class folders, and their cache written once."""
    split = make_folder(tmp_path / "f" / "train", per_class=3)
    load_image_folder(split, tmp_path / "cache")
    return split


def only_cache(tmp_path):
    files = list((tmp_path / "cache").iterdir())
    assert len(files) == 1, files
    return files[0]


def test_truncated_cache_is_rebuilt_with_a_reason(split, tmp_path, capsys):
    """A cache cut short (a full disk, a killed copy) is rebuilt, naming the file, instead of torch's error."""
    good = load_image_folder(split, tmp_path / "cache")
    cache = only_cache(tmp_path)
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 2])
    capsys.readouterr()
    data = load_image_folder(split, tmp_path / "cache")
    line = capsys.readouterr().out
    assert str(cache) in line and "damaged" in line and line.count("\n") == 1
    assert torch.equal(data["images"], good["images"])
    assert load_image_folder(split, tmp_path / "cache")["images"].shape == good["images"].shape


def test_byte_flipped_cache_is_rebuilt_not_trained_on(split, tmp_path, capsys):
    """5,000 flipped bytes in the pixel data fail the checksum: the cache is rebuilt with the right pixels."""
    good = load_image_folder(split, tmp_path / "cache")
    cache = only_cache(tmp_path)
    raw = bytearray(cache.read_bytes())
    start = raw.find(good["images"][4].numpy().tobytes())  # the images' storage, uncompressed in torch's zip
    assert start > 0
    for i in range(start, start + 5000):
        raw[i] ^= 0xFF
    cache.write_bytes(bytes(raw))
    capsys.readouterr()
    data = load_image_folder(split, tmp_path / "cache")
    assert "checksum" in capsys.readouterr().out
    assert torch.equal(data["images"], good["images"])


def test_edit_keeping_size_and_mtime_makes_the_cache_stale(split, tmp_path, capsys):
    """An image rewritten with the same size and mtime changes the content hash: the cache is rebuilt, and the one it
    supersedes is removed."""
    old = only_cache(tmp_path)
    image = sorted((split / "cat").iterdir())[1]
    st = image.stat()
    raw = bytearray(image.read_bytes())
    raw[15] ^= 0x03  # the JFIF header's x density: other bytes, same size, same pixels
    image.write_bytes(bytes(raw))
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert image.stat().st_size == st.st_size and image.stat().st_mtime_ns == st.st_mtime_ns
    capsys.readouterr()
    load_image_folder(split, tmp_path / "cache")
    out = capsys.readouterr().out
    assert "stale" in out and not re.search(r"(?:^|[\s(])/", out)  # relative paths: no machine's absolute path
    new = only_cache(tmp_path)
    assert new != old and not old.exists()


def test_cache_of_another_folder_is_kept(split, make_folder, tmp_path):
    """Only the same folder's older cache is superseded: another folder's split of the same name keeps its cache."""
    other = make_folder(tmp_path / "g" / "train", per_class=2)
    load_image_folder(other, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("train-*.pt"))) == 2
