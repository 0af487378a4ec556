"""Where the tests get real CIFAR-10: COURSE_DATA, the shared folder, or a download written as JPEG class folders."""
from __future__ import annotations

import hashlib
import http.server
import io
import pickle
import tarfile
import threading

import numpy as np
import pytest
from conftest import DataUnavailable, locate_cifar_folder
from torchvision.datasets import CIFAR10

from course_lib.base import config
from course_lib.data import jpeg
from course_lib.data.data import CIFAR10_CLASSES
from course_lib.data.sources import (
    ImageFolderSource,
    TensorFileSource,
    TorchvisionSource,
    decode_image,
    list_image_folder,
    open_source,
)

PER_CLASS = 3  # real images per class in the local archive: 30 in all, 5 training batches of 6


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def local_mirror(cifar_folder, tmp_path, monkeypatch):
    """A cifar-10-python.tar.gz of 30 real images, served on 127.0.0.1; torchvision's md5 table patched to match.

    Yields (url, images in archive order as (N, 3, 32, 32) uint8, labels, request counter)."""
    files, labels, classes = list_image_folder(cifar_folder / "train")
    picks = sorted({i for c in range(10) for i in [j for j, lab in enumerate(labels) if lab == c][:PER_CLASS]})
    images = np.stack([decode_image(files[i]).numpy() for i in picks])  # (30, 3, 32, 32)
    targets = [CIFAR10_CLASSES.index(classes[labels[i]]) for i in picks]
    members = {f"data_batch_{b + 1}": (images[b::5], targets[b::5]) for b in range(5)}
    members["test_batch"] = (images[:10], targets[:10])
    blobs = {name: pickle.dumps({"data": x.reshape(len(x), -1), "labels": list(y)}) for name, (x, y) in members.items()}
    blobs["batches.meta"] = pickle.dumps({"label_names": CIFAR10_CLASSES})
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        for name, blob in blobs.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "cifar-10-python.tar.gz").write_bytes(archive.getvalue())
    monkeypatch.setattr(CIFAR10, "tgz_md5", md5(archive.getvalue()))
    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{b}", md5(blobs[f"data_batch_{b}"])]
                                                for b in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5(blobs["test_batch"])]])
    monkeypatch.setattr(CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names",
                                          "md5": md5(blobs["batches.meta"])})
    hits = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(tmp_path / "www"), **kwargs)

        def do_GET(self):
            hits.append(self.path)
            try:
                super().do_GET()
            except BrokenPipeError:  # torchvision opens the URL once to follow redirects, then closes it early
                pass

        def log_message(self, *args):  # keep the test output quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    order = [i for b in range(5) for i in range(b, len(picks), 5)]  # torchvision concatenates batch 1..5
    yield (f"http://127.0.0.1:{server.server_port}/cifar-10-python.tar.gz", images[order],
           [targets[i] for i in order], hits)
    server.shutdown()


def test_course_data_wins(tmp_path, monkeypatch):
    """COURSE_DATA is used as given, before the shared folder."""
    (tmp_path / "mine" / "train").mkdir(parents=True)
    (tmp_path / "shared" / "train").mkdir(parents=True)
    monkeypatch.setattr(config, "shared_data_folder", lambda: tmp_path / "shared")
    monkeypatch.setenv(config.DATA_ENV, str(tmp_path / "mine"))
    assert locate_cifar_folder(config.data_source(), tmp_path / "root") == tmp_path / "mine"


def test_course_data_without_train_split_names_the_layout(tmp_path, monkeypatch):
    """A COURSE_DATA folder with no train/ split is an error naming the variable and the layout, not a download."""
    monkeypatch.setenv(config.DATA_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="COURSE_DATA") as err:
        config.data_source()
    assert "<folder>/train/<class>/*.jpg" in str(err.value)


def test_jpeg_folder_takes_the_resolvers_answer_without_resolving_again(tmp_path, monkeypatch):
    """jpeg.jpeg_folder uses config.data_source's answer as it is: a folder is returned, a tensor file refused."""
    (tmp_path / "mine" / "train").mkdir(parents=True)
    (tmp_path / "subset.pt").write_bytes(b"")
    monkeypatch.setattr(config, "data_source", lambda *a, **k: pytest.fail("resolved again"))
    assert jpeg.jpeg_folder(str(tmp_path / "mine"), tmp_path / "root") == tmp_path / "mine"
    with pytest.raises(FileNotFoundError, match="is a file"):
        jpeg.jpeg_folder(str(tmp_path / "subset.pt"), tmp_path / "root")


def test_open_source_is_the_one_format_decision(tmp_path):
    """None or 'torchvision': the download; a file: a tensor file (whatever its suffix); anything else: a folder."""
    (tmp_path / "f" / "train").mkdir(parents=True)
    (tmp_path / "subset.bin").write_bytes(b"")
    kw = dict(data_dir=tmp_path / "data", mirror_url="http://mirror")
    assert open_source(None, **kw) == open_source("torchvision", **kw) == TorchvisionSource(tmp_path / "data",
                                                                                           "http://mirror")
    assert open_source(tmp_path / "subset.bin", **kw) == TensorFileSource(tmp_path / "subset.bin")
    assert open_source(str(tmp_path / "f"), **kw) == ImageFolderSource(tmp_path / "f", tmp_path / "data" / "cache")
    assert open_source(tmp_path / "absent", **kw).folder("train") == tmp_path / "absent" / "train"  # read later


def test_shared_folder_used_without_course_data(tmp_path, monkeypatch):
    """With COURSE_DATA unset, the shared folder beside the checkout is used; COURSE_DATA=torchvision skips it."""
    (tmp_path / "shared" / "train").mkdir(parents=True)
    monkeypatch.setattr(config, "shared_data_folder", lambda: tmp_path / "shared")
    monkeypatch.delenv(config.DATA_ENV, raising=False)
    assert locate_cifar_folder(config.data_source(), tmp_path / "root") == tmp_path / "shared"
    monkeypatch.setenv(config.DATA_ENV, "torchvision")
    assert config.data_source() is None  # the tests then download, as the lessons do


def test_resolver_order_given_then_course_data_then_shared(tmp_path, monkeypatch):
    """config.data_source: a script's --data wins over COURSE_DATA, which wins over the shared folder; a tensor file
    is a source too (a subset carried to a GPU machine)."""
    for name in ("given", "env", "shared"):
        (tmp_path / name / "train").mkdir(parents=True)
    (tmp_path / "subset.pt").write_bytes(b"")
    monkeypatch.setattr(config, "shared_data_folder", lambda: tmp_path / "shared")
    monkeypatch.setenv(config.DATA_ENV, str(tmp_path / "env"))
    assert config.data_source(tmp_path / "given") == str(tmp_path / "given")
    assert config.data_source(str(tmp_path / "subset.pt")) == str(tmp_path / "subset.pt")
    assert config.data_source() == config.data_source(None) == config.data_source("") == str(tmp_path / "env")
    monkeypatch.delenv(config.DATA_ENV)
    assert config.data_source() == str(tmp_path / "shared")


@pytest.mark.parametrize("env", ["", "torchvision"])
def test_resolver_without_files_names_the_remedy(tmp_path, monkeypatch, env):
    """No COURSE_DATA (or the download asked for) and no shared folder: the lessons download (None), and a script
    that reads the files itself gets an error naming --data, COURSE_DATA and the layout instead of a bad path."""
    monkeypatch.setattr(config, "shared_data_folder", lambda: tmp_path / "absent")
    monkeypatch.setenv(config.DATA_ENV, env)
    assert config.data_source() is None
    with pytest.raises(FileNotFoundError, match=r"Pass --data <folder>, or set COURSE_DATA=<folder>") as err:
        config.data_source(need_files=True)
    assert "<folder>/train/<class>/*.jpg" in str(err.value) and str(tmp_path / "absent") in str(err.value)


@pytest.mark.parametrize("origin", ["given", "env"])
def test_resolver_rejects_a_missing_source_or_one_without_train(tmp_path, monkeypatch, origin):
    """A named source that does not exist, or a folder without train/, fails at once with the remedy: never a
    silent download instead of the data asked for."""
    (tmp_path / "flat").mkdir()
    monkeypatch.delenv(config.DATA_ENV, raising=False)
    for bad, what in ((tmp_path / "missing", "does not exist"), (tmp_path / "flat", "has no train/<class>/")):
        if origin == "env":
            monkeypatch.setenv(config.DATA_ENV, str(bad))
        with pytest.raises(FileNotFoundError, match=what) as err:
            config.data_source(bad if origin == "given" else None)
        assert "COURSE_DATA=torchvision" in str(err.value) and str(bad) in str(err.value)
        assert ("named by COURSE_DATA" in str(err.value)) is (origin == "env")


def test_jpeg_datamodule_resolves_its_source_once(tmp_path, monkeypatch, cifar_folder):
    """JpegDataModule reads the data source when built: a COURSE_DATA changed afterwards does not move it."""
    from course_lib.data.jpeg import JpegDataModule

    monkeypatch.setenv(config.DATA_ENV, str(cifar_folder))
    dm = JpegDataModule(8, subset=16)
    monkeypatch.setenv(config.DATA_ENV, str(tmp_path / "missing"))
    dm.setup("fit")
    assert len(dm.train_set) == 16 and dm.source == str(cifar_folder)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        JpegDataModule(8, subset=16)  # built now: the bad source fails at once


def test_download_writes_real_jpeg_class_folders_once(local_mirror, tmp_path):
    """Neither folder: CIFAR-10 is downloaded (here from a local mirror) and written as JPEG class folders, once."""
    url, images, targets, hits = local_mirror
    folder = locate_cifar_folder(None, tmp_path / "root", mirror_url=url)
    assert folder == tmp_path / "root" / "cifar10-jpeg" and hits
    requests = len(hits)
    files, labels, classes = list_image_folder(folder / "train")
    assert classes == sorted(CIFAR10_CLASSES) and len(files) == len(images)
    for f, label in zip(files, labels):  # each JPEG is its archive image, up to JPEG's rounding
        i = int(f.stem)
        assert classes[label] == CIFAR10_CLASSES[targets[i]]
        assert np.abs(decode_image(f).numpy().astype(int) - images[i].astype(int)).mean() < 4
    assert locate_cifar_folder(None, tmp_path / "root", mirror_url=url) == folder
    assert len(hits) == requests  # the second call neither downloads nor rewrites


def test_half_written_folder_is_rebuilt(local_mirror, tmp_path):
    """A folder without its completion mark (an interrupted run) is written again, not used."""
    url, images, _, _ = local_mirror
    stale = tmp_path / "root" / "cifar10-jpeg" / "train" / "cat"
    stale.mkdir(parents=True)
    (stale / "junk.jpg").write_bytes(b"not an image")
    folder = locate_cifar_folder(None, tmp_path / "root", mirror_url=url)
    assert not (stale / "junk.jpg").exists() and len(list_image_folder(folder / "train")[0]) == len(images)


def test_offline_without_data_names_both_remedies(tmp_path):
    """No folder and no network (nothing listens on 127.0.0.1:9): one error naming COURSE_DATA and the download."""
    with pytest.raises(DataUnavailable) as err:
        locate_cifar_folder(None, tmp_path / "root",
                            mirror_url="http://127.0.0.1:9/cifar-10-python.tar.gz")
    msg = str(err.value)
    assert "COURSE_DATA=<folder>" in msg and "connect to the internet once" in msg and str(tmp_path / "root") in msg
    assert not (tmp_path / "root" / "cifar10-jpeg").exists()


def test_a_jpeg_pack_is_a_source_format(tmp_path):
    """sources.save_jpeg_pack writes a folder's JPEG bytes as one .pt file; load_tensor_file (a TensorFileSource's
    load) recognises it and decodes it to the same pixels as the folder's own files."""
    import torch

    from course_lib.data import sources

    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    data = {"images": images, "labels": torch.tensor([0, 1, 0, 1]), "classes": ["a", "b"]}
    sources.save_image_folder(data, tmp_path / "train", quality=100)
    pack = tmp_path / "pack.pt"
    assert sources.save_jpeg_pack(tmp_path / "train", pack) == 4 and sources.is_jpeg_pack(pack)
    loaded = sources.open_source(pack, data_dir=tmp_path).load("train")
    assert loaded["images"].shape == (4, 3, 32, 32) and loaded["classes"] == ["a", "b"]
    assert loaded["labels"].tolist() == [0, 0, 1, 1]  # the folder's order: by class, then file name
    folder = sources.load_image_folder(tmp_path / "train")
    assert torch.equal(loaded["images"], folder["images"])  # one decoder for files and packs
