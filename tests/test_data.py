"""Data: loading, caching, splits, augmentation, sampling and the errors a student meets with bad folders."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from course_lib.base import config
from course_lib.data.data import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR10DataModule,
    Split,
    augment_batch,
    carve_splits,
    class_folder_split,
    relabel,
    split_indices,
    to_float,
)
from course_lib.data.sampling import EpochSampler
from course_lib.data.sources import load_image_folder, load_torchvision_cifar10

MEAN = torch.tensor(CIFAR10_MEAN)[:, None, None]
STD = torch.tensor(CIFAR10_STD)[:, None, None]


def tiny_dm(folder: Path, tmp_path: Path, **kw) -> CIFAR10DataModule:
    """A datamodule over a small folder with its cache under tmp_path."""
    kw.setdefault("batch_size", 8)
    return CIFAR10DataModule(image_folder=str(folder), data_dir=str(tmp_path / "data"), **kw)


# ---- shapes and normalisation ----------------------------------------------------------------------------------

def test_batches_are_normalised_float_images_with_int64_labels(tiny_folder, tmp_path):
    """A training batch is (B,3,32,32) float32 normalised with CIFAR statistics; labels are int64 class indices."""
    dm = tiny_dm(tiny_folder, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32
    assert y.shape == (8,) and y.dtype == torch.int64
    assert set(y.tolist()) <= {0, 1, 2}
    assert dm.classes == sorted(["airplane", "cat", "ship"])
    raw = dm.train_set.images[:4]  # uint8 in memory
    assert raw.dtype == torch.uint8
    xs, _ = dm.train_set.__getitems__([0, 1, 2, 3])
    torch.testing.assert_close(xs, (raw.float() / 255 - MEAN) / STD)
    assert x.min() < -1 and x.max() > 1  # normalised, not [0, 1]


def test_one_normalisation_for_the_loader_and_the_device_batches(tiny_folder, tmp_path):
    """to_float is the one normalisation: DataLoader batches and DeviceBatches of the same images are equal to it
    (uint8 or float pixels alike), with and without statistics, and it never changes a float input in place."""
    from course_lib.data.ondevice import DeviceBatches

    for normalize in (True, False):
        dm = tiny_dm(tiny_folder, tmp_path, normalize=normalize)
        dm.setup("fit")
        images, labels = dm.val_set.images, dm.val_set.labels
        stats = (CIFAR10_MEAN, CIFAR10_STD) if normalize else (None, None)
        loader_x = torch.cat([x for x, _ in dm.val_dataloader()])
        device_x = torch.cat([x for x, _ in DeviceBatches(images, labels, 4, mean=stats[0], std=stats[1])])
        expected = (images.float() / 255 - MEAN) / STD if normalize else images.float() / 255
        torch.testing.assert_close(loader_x, expected)
        torch.testing.assert_close(device_x, expected)
    pixels = images.float()
    torch.testing.assert_close(to_float(pixels), to_float(images))
    assert torch.equal(pixels, images.float())  # the caller's float tensor is untouched


def test_normalize_false_gives_unit_range(tiny_folder, tmp_path):
    """normalize=False leaves pixel values in [0, 1]."""
    dm = tiny_dm(tiny_folder, tmp_path, normalize=False)
    dm.setup("fit")
    x, _ = next(iter(dm.val_dataloader()))
    assert 0 <= x.min() and x.max() <= 1
    torch.testing.assert_close(x * 255, (x * 255).round(), atol=1e-4, rtol=0)  # pixel levels k/255, not normalised


def test_split_sizes_and_subset(tiny_folder, tmp_path):
    """60 images carve into 48/6/6; subset/eval_subset shrink the splits; a too-large subset keeps the whole split."""
    dm = tiny_dm(tiny_folder, tmp_path)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (48, 6, 6)
    dm = tiny_dm(tiny_folder, tmp_path, subset=10, eval_subset=3)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (10, 3, 3)
    dm = tiny_dm(tiny_folder, tmp_path, subset=2048, eval_subset=1024)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (48, 6, 6)


# ---- seeded splits ---------------------------------------------------------------------------------------------

def test_split_indices_deterministic_per_seed():
    """The same seed gives the same split; another seed gives another."""
    a, b, c = split_indices(1000, [0.1, 0.1], seed=0), split_indices(1000, [0.1, 0.1], seed=0), \
        split_indices(1000, [0.1, 0.1], seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_split_indices_disjoint_and_covering():
    """The carved parts have the requested sizes, do not overlap and together cover range(n)."""
    parts = split_indices(1000, [0.1, 0.2], seed=3)
    assert [len(p) for p in parts] == [100, 200, 700]
    assert torch.equal(torch.cat(parts).sort().values, torch.arange(1000))


@pytest.mark.parametrize("n, fractions, seed", [(60, [0.1, 0.1], 0), (1000, [0.1, 0.2], 3), (1000, [0.0, 0.1], 1),
                                                (50_000, [0.1, 0.1], 0), (50_000, [0.0], 2)])
def test_split_indices_through_random_split_are_the_former_indices(n, fractions, seed):
    """random_split(generator=) carves exactly the parts the former randperm + torch.split did: every lesson's
    held-out images stay the same."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sizes = [int(round(f * n)) for f in fractions]
    former = torch.split(perm, sizes + [n - sum(sizes)])
    parts = split_indices(n, fractions, seed)
    assert len(parts) == len(former) and all(torch.equal(p, q) for p, q in zip(parts, former))


def test_carve_splits_is_pure_and_keeps_each_images_place():
    """carve_splits: the same arguments give the same splits; val and test are split_indices' parts of train (each
    image keeping its index in the source), the rest trains; a split the source has of its own is used whole."""
    data = {"images": torch.arange(100, dtype=torch.uint8).view(100, 1, 1, 1), "labels": torch.arange(100) % 10}
    train = Split.whole(data)
    a, b = (carve_splits(train, None, None, val_fraction=0.1, test_fraction=0.2, seed=4) for _ in range(2))
    assert all(torch.equal(x.index, y.index) for x, y in zip(a, b))
    val, test, rest = split_indices(100, [0.1, 0.2], seed=4)
    assert [s.index.tolist() for s in a] == [rest.tolist(), val.tolist(), test.tolist()]
    assert torch.equal(a[1].images.flatten().long(), a[1].index) and torch.equal(a[1].labels, a[1].index % 10)
    own = Split.whole({"images": data["images"][:5], "labels": data["labels"][:5]})
    tr, va, te = carve_splits(train, own, None, val_fraction=0.1, test_fraction=0.2, seed=4)
    assert va is own and len(te.labels) == 20 and len(tr.labels) == 80


def test_relabel_maps_by_name_and_refuses_unknown_classes():
    """The class remapping, written once: labels follow the names; a class the reference lacks is refused."""
    data = {"images": torch.zeros(3, 3, 2, 2), "labels": torch.tensor([0, 1, 0]), "classes": ["cat", "ship"]}
    out = relabel(data, ["airplane", "cat", "ship"], lambda unknown: f"unknown {unknown}")
    assert out["labels"].tolist() == [1, 2, 1] and out["classes"] == ["airplane", "cat", "ship"]
    assert relabel(data, ["cat", "ship"], str) is data
    with pytest.raises(ValueError, match=r"unknown \['ship'\]"):
        relabel(data, ["airplane", "cat"], lambda unknown: f"unknown {unknown}")


def test_split_indices_rejects_impossible_fractions():
    """Fractions that leave a part empty by rounding, or negative ones, raise ValueError; exactly 0 asks for none."""
    with pytest.raises(ValueError, match="Cannot carve"):
        split_indices(10, [0.5, 0.5], seed=0)
    with pytest.raises(ValueError, match="Cannot carve"):
        split_indices(10, [0.01], seed=0)
    with pytest.raises(ValueError, match="at least one"):
        split_indices(10, [-0.1], seed=0)
    none, test, rest = split_indices(1000, [0.0, 0.1], seed=0)  # exactly 0: an empty part, asked for
    assert len(none) == 0 and len(test) == 100 and len(rest) == 900


def test_datamodule_splits_seeded_and_disjoint(tiny_folder, tmp_path):
    """Datamodule train/val/test are disjoint, cover the folder, repeat for a seed and change with it."""
    def split_images(seed):
        dm = tiny_dm(tiny_folder, tmp_path, seed=seed)
        dm.setup("fit")
        return [d.images for d in (dm.train_set, dm.val_set, dm.test_set)]

    a, b, c = split_images(0), split_images(0), split_images(1)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[1], c[1])
    rows = [tuple(img.flatten().tolist()) for part in a for img in part]
    assert len(rows) == 60 and len(set(rows)) == 60  # disjoint and covering (the 60 JPEGs are distinct)


# ---- cache -----------------------------------------------------------------------------------------------------

def test_cache_written_once_and_reused(tiny_folder, tmp_path):
    """The first load writes one uint8 cache file; the second returns the same tensors from it."""
    cache_dir = tmp_path / "cache"
    first = load_image_folder(tiny_folder / "train", cache_dir)
    files = list(cache_dir.glob("train-*.pt"))
    assert len(files) == 1
    assert first["images"].dtype == torch.uint8 and first["images"].shape == (60, 3, 32, 32)
    assert first["labels"].tolist() == [0] * 20 + [1] * 20 + [2] * 20
    mtime = files[0].stat().st_mtime_ns
    second = load_image_folder(tiny_folder / "train", cache_dir)
    assert files[0].stat().st_mtime_ns == mtime and list(cache_dir.glob("*")) == files
    assert torch.equal(first["images"], second["images"]) and second["classes"] == first["classes"]


def test_prepare_data_after_setup_does_not_list_the_folder_again(tiny_folder, tmp_path, monkeypatch):
    """Lightning calls prepare_data on every fit; once a split is decoded, the 50k-file listing is not repeated."""
    import course_lib.data.sources as sources

    dm = tiny_dm(tiny_folder, tmp_path)
    dm.prepare_data()
    dm.setup("fit")
    calls = []
    monkeypatch.setattr(sources, "list_image_folder", lambda *a: calls.append(a) or pytest.fail("listed again"))
    dm.prepare_data()
    dm.setup("fit")
    assert calls == [] and len(dm.train_set) > 0


def test_prepare_data_sets_no_state_and_setup_loads_once(tiny_folder, tmp_path, monkeypatch):
    """prepare_data only writes the on-disk cache (Lightning runs it on one process): no attribute of the module
    changes; setup loads each split once into the DataModule's own `loaded` (no process-wide memo), and a second
    setup (test after fit) reads nothing again; a DataModule given the same `loaded` reads nothing, one without it
    reads the verified disk cache and decodes nothing."""
    from course_lib.data import sources

    dm = tiny_dm(tiny_folder, tmp_path)
    before = dict(vars(dm))
    dm.prepare_data()
    assert vars(dm) == before and not dm.loaded.holds(dm.source, "train")
    assert list((tmp_path / "data" / "cache").glob("train-*.pt"))
    dm.setup("fit")
    assert dm.loaded.holds(dm.source, "train")
    monkeypatch.setattr(sources, "load_image_folder", lambda *a: pytest.fail("read again"))
    dm.setup("test")
    shared = tiny_dm(tiny_folder, tmp_path)
    shared.loaded = dm.loaded
    shared.setup("fit")
    monkeypatch.undo()
    monkeypatch.setattr(sources, "decode_image", lambda *a: pytest.fail("decoded again"))
    again = tiny_dm(tiny_folder, tmp_path)
    again.setup("fit")
    assert torch.equal(again.train_set.images, dm.train_set.images)


def test_cache_invalidated_when_folder_changes(make_folder, tmp_path):
    """Removing an image changes the cache key, so a stale cache is never read; the superseded one is removed."""
    split = make_folder(tmp_path / "f" / "train", per_class=3)
    load_image_folder(split, tmp_path / "cache")
    sorted((split / "cat").iterdir())[0].unlink()
    data = load_image_folder(split, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("train-*.pt"))) == 1
    assert len(data["labels"]) == 8


def test_full_folder_cached_in_repo_data_and_read_back(cifar_folder, monkeypatch):
    """The 50k folder's cache lives in the repo's data/cache, and a second load reads it back without decoding one
    image (its load time is printed; timing never fails a test)."""
    import course_lib.data.sources as data_module

    monkeypatch.delenv(config.DATA_ROOT_ENV, raising=False)  # use (and keep) the default cache the notebooks use
    assert config.data_root() == Path(__file__).resolve().parents[1] / "data"
    data = load_image_folder(cifar_folder / "train")  # decodes (~25 s) only if no cache exists yet
    assert data["images"].shape == (50_000, 3, 32, 32) and data["images"].dtype == torch.uint8
    assert torch.bincount(data["labels"]).tolist() == [5000] * 10
    assert data["classes"] == CIFAR10_CLASSES
    assert list((config.data_root() / "cache").glob("train-*.pt"))
    del data
    monkeypatch.setattr(data_module, "decode_image", lambda path: pytest.fail(f"decoded {path} again"))
    start = time.perf_counter()
    again = load_image_folder(cifar_folder / "train")
    print(f"cached load of 50,000 images: {time.perf_counter() - start:.2f} s")
    assert again["images"].shape == (50_000, 3, 32, 32)


# ---- bad inputs ------------------------------------------------------------------------------------------------

def test_missing_folder_raises_file_not_found(tmp_path):
    """A folder that does not exist raises FileNotFoundError naming it."""
    missing = tmp_path / "nowhere" / "train"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_image_folder(missing, tmp_path / "cache")


def test_missing_image_folder_in_datamodule(tmp_path):
    """The datamodule reports a missing image folder with FileNotFoundError too."""
    dm = CIFAR10DataModule(image_folder=str(tmp_path / "absent"), data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="absent"):
        dm.prepare_data()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_image_names_the_file(make_folder, tmp_path, damage):
    """A garbage or truncated JPEG raises ValueError naming that file."""
    split = make_folder(tmp_path / "f" / "train", per_class=3)
    bad = split / "cat" / "0001.jpg"
    data = bad.read_bytes()
    bad.write_bytes(b"this is not a jpeg at all" if damage == "garbage" else data[: len(data) // 2])
    with pytest.raises(ValueError) as err:
        load_image_folder(split, tmp_path / "cache")
    assert str(bad) in str(err.value)
    assert not list((tmp_path / "cache").glob("*.pt"))  # no cache written from a failed decode


def test_empty_class_folder_names_the_folder(make_folder, tmp_path):
    """A class folder with no images raises ValueError naming that folder."""
    split = make_folder(tmp_path / "f" / "train", per_class=3)
    (split / "dog").mkdir()
    with pytest.raises(ValueError) as err:
        load_image_folder(split, tmp_path / "cache")
    assert str(split / "dog") in str(err.value)


def test_loose_images_are_a_layout_error(make_folder, tmp_path):
    """Images directly in the split folder (no class sub-folders) raise ValueError naming the folder."""
    split = make_folder(tmp_path / "f" / "train", per_class=3)
    for f in list(split.glob("*/*.jpg")):
        f.rename(split / f"{f.parent.name}_{f.name}")
    for d in split.iterdir():
        if d.is_dir():
            d.rmdir()
    with pytest.raises(ValueError, match="Wrong layout") as err:
        load_image_folder(split, tmp_path / "cache")
    assert str(split) in str(err.value)


def test_split_folder_without_classes_is_a_layout_error(tmp_path):
    """An empty split folder raises ValueError rather than producing an empty dataset."""
    (tmp_path / "train").mkdir()
    with pytest.raises(ValueError, match="Wrong layout"):
        load_image_folder(tmp_path / "train", tmp_path / "cache")


def test_download_failure_names_remedies(tmp_path):
    """A failed download (nothing listens on 127.0.0.1:9) raises RuntimeError listing mirror_url and COURSE_DATA."""
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as err:
        load_torchvision_cifar10(tmp_path / "tv", train=True, mirror_url="http://127.0.0.1:9/cifar-10-python.tar.gz")
    msg = str(err.value)
    assert "mirror_url" in msg and "COURSE_DATA" in msg and str(tmp_path / "tv") in msg
    assert time.perf_counter() - start < 30


# ---- augmentation and sampling ---------------------------------------------------------------------------------

def test_augment_keeps_shape():
    """Padding-crop plus flip keeps the batch shape and dtype."""
    x = torch.rand(16, 3, 32, 32)
    out = augment_batch(x)
    assert out.shape == x.shape and out.dtype == x.dtype


def test_augment_without_padding_only_flips():
    """With pad=0 each image comes back unchanged or horizontally flipped, and both happen."""
    torch.manual_seed(0)
    x = torch.rand(64, 3, 32, 32)
    out = augment_batch(x, pad=0)
    same = [torch.equal(o, i) for o, i in zip(out, x)]
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, x)]
    assert all(s or f for s, f in zip(same, flipped))
    assert any(same) and any(flipped)


def test_augment_crop_is_a_shifted_window():
    """With padding, every output is a (possibly flipped) shifted window of the zero-padded input."""
    torch.manual_seed(1)
    x = torch.rand(8, 3, 32, 32) + 1  # strictly positive, so padding zeros are recognisable
    out = augment_batch(x, pad=4)
    padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
    for o, p in zip(out, padded):
        windows = [p[:, dy:dy + 32, dx:dx + 32] for dy in range(9) for dx in range(9)]
        assert any(torch.equal(o, w) or torch.equal(o, w.flip(-1)) for w in windows)


def test_epoch_sampler_order_depends_on_epoch_only():
    """Same (seed, epoch) gives the same permutation, even from a fresh sampler; another epoch gives another."""
    s = EpochSampler(100, seed=0)
    s.set_epoch(3)
    a, b = list(s), list(s)
    fresh = EpochSampler(100, seed=0)
    fresh.set_epoch(3)
    s.set_epoch(4)
    c = list(s)
    assert a == b == list(fresh)
    assert a != c
    assert sorted(a) == sorted(c) == list(range(100)) and len(s) == 100


def test_train_loader_reshuffles_each_epoch(tiny_folder, tmp_path):
    """The train loader's EpochSampler changes the order when Lightning sets the epoch."""
    dm = tiny_dm(tiny_folder, tmp_path, batch_size=48)
    dm.setup("fit")
    loader = dm.train_dataloader()
    first = next(iter(loader))[0]
    loader.sampler.set_epoch(1)
    second = next(iter(loader))[0]
    assert not torch.equal(first, second)
    assert torch.allclose(first.sum(), second.sum(), rtol=1e-4)  # same images, other order


# ---- foreign test folders --------------------------------------------------------------------------------------

def held_out(dm: CIFAR10DataModule, folder: Path, tmp_path: Path) -> CIFAR10DataModule:
    """dm testing on `folder` (a <class>/*.jpg folder) as the CLI's --test_folder does: the path stays out of dm."""
    dm.hold_out(*class_folder_split(folder, dm.classes, tmp_path / "data" / "cache"))
    return dm


def test_test_folder_with_unknown_class_raises(tiny_folder, make_folder, tmp_path):
    """A test folder with a class the model never saw raises ValueError naming the class."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "dog"), per_class=2)
    with pytest.raises(ValueError, match="dog"):
        held_out(tiny_dm(tiny_folder, tmp_path), foreign, tmp_path)


def test_test_folder_classes_mapped_onto_training_classes(tiny_folder, make_folder, tmp_path):
    """Test-folder class names map to the training class indices, not to their own alphabetical order; its files
    name the predictions."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat",), per_class=3)
    make_folder(foreign, classes=("ship",), per_class=5)  # foreign order cat=0, ship=1; training cat=1, ship=2
    dm = held_out(tiny_dm(tiny_folder, tmp_path), foreign, tmp_path)
    dm.setup("test")
    assert dm.classes == ["airplane", "cat", "ship"]
    assert sorted(dm.test_set.labels.tolist()) == [1] * 3 + [2] * 5
    assert all(Path(name).parent.parent == foreign for name in dm.test_names())


def test_test_folder_without_training_data_uses_cifar_classes(make_folder, tmp_path):
    """With the torchvision source, grading a foreign folder needs no download and maps to CIFAR-10 indices."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "ship"), per_class=2)
    dm = held_out(CIFAR10DataModule(image_folder=None, data_dir=str(tmp_path / "data")), foreign, tmp_path)
    dm.setup("test")
    assert sorted(dm.test_set.labels.tolist()) == [3, 3, 8, 8]
    assert not (tmp_path / "data" / "cifar-10-batches-py").exists()


def test_test_folder_labelled_by_the_models_classes_not_the_data_source(tiny_folder, make_folder, tmp_path):
    """Given a model's class names (classes=, which the CLI links from a checkpoint), a test folder's labels follow
    that list whatever the data source (here a 2-class folder, whose own order would give cat=0, ship=1)."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "ship"), per_class=2)
    other = make_folder(tmp_path / "other" / "train", classes=("cat", "ship"), per_class=2).parent
    labels = []
    for source in (tiny_folder, other):
        dm = held_out(tiny_dm(source, tmp_path, classes=["airplane", "cat", "ship"]), foreign, tmp_path)
        dm.setup("test")
        labels.append(sorted(dm.test_set.labels.tolist()))
    assert labels[0] == labels[1] == [1, 1, 2, 2]


def test_carved_test_split_of_other_classes_than_the_models_is_refused(make_folder, tmp_path):
    """Grading on COURSE_DATA's carved test split with a model trained on other classes would use wrong labels."""
    other = make_folder(tmp_path / "other" / "train", classes=("cat", "ship"), per_class=10).parent
    dm = tiny_dm(other, tmp_path, classes=["airplane", "cat", "ship"])
    with pytest.raises(ValueError, match="labels would be wrong"):
        dm.setup("test")


def test_missing_test_folder_names_the_test_folder(tiny_folder, tmp_path):
    """A --test_folder that does not exist is named as the test folder, not blamed on COURSE_DATA."""
    with pytest.raises(FileNotFoundError, match="Test folder .*nope.*--test_folder") as err:
        held_out(tiny_dm(tiny_folder, tmp_path), tmp_path / "nope", tmp_path)
    assert "COURSE_DATA" not in str(err.value)


def test_data_root_that_is_a_file_fails_before_decoding(tiny_folder, tmp_path, monkeypatch):
    """COURSE_DATA_ROOT naming a file fails at once, naming it and the setting, before any image is decoded; the
    torchvision download says the same instead of blaming a slow host."""
    import course_lib.data.sources as data_module

    blocker = tmp_path / "root.txt"
    blocker.write_text("not a folder")
    monkeypatch.setenv(config.DATA_ROOT_ENV, str(blocker))
    monkeypatch.setattr(data_module, "decode_image", lambda path: pytest.fail("decoded before failing"))
    with pytest.raises(NotADirectoryError, match=f"{blocker}.*is a file.*COURSE_DATA_ROOT"):
        CIFAR10DataModule(image_folder=str(tiny_folder)).prepare_data()
    with pytest.raises(NotADirectoryError, match="COURSE_DATA_ROOT"):
        load_torchvision_cifar10(blocker, train=True, mirror_url="http://127.0.0.1:9/none.tar.gz")
