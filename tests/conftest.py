"""Shared fixtures: the real CIFAR-10 JPEG folder (found, or made from a download), small copies of it, per-test
cache isolation, and the GPU machine's fork rule, emulated in every process the tests start."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from course_lib import config, jpeg, runs

REPO = Path(__file__).resolve().parents[1]
FORK_RULE = REPO / "tests" / "gpu_fork_rule"  # its sitecustomize.py: a fork after a backward fails, as with a GPU


def load_fork_rule():
    """The fork-rule emulation in this process (the one `sitecustomize` loaded, if PYTHONPATH already named it)."""
    loaded = sys.modules.get("sitecustomize")
    if getattr(loaded, "__file__", None) == str(FORK_RULE / "sitecustomize.py"):
        return loaded
    spec = importlib.util.spec_from_file_location("gpu_fork_rule", FORK_RULE / "sitecustomize.py")
    module = sys.modules.setdefault("gpu_fork_rule", importlib.util.module_from_spec(spec))
    if not hasattr(module, "install"):
        spec.loader.exec_module(module)
    return module


# on for the whole run, here and (through PYTHONPATH) in every child: nbval's kernels, spawned workers, torchrun ranks
os.environ["PYTHONPATH"] = os.pathsep.join([str(FORK_RULE), *filter(None, [os.environ.get("PYTHONPATH")])])
fork_rule = load_fork_rule()
fork_rule.install(torch)
def pytest_configure(config):
    """The warnings the lessons hide as unactionable (runs.UNACTIONABLE, one list) are hidden in the tests too."""
    for message in runs.UNACTIONABLE:
        config.addinivalue_line("filterwarnings", f"ignore:{message}")


TINY_CLASSES = ("airplane", "cat", "ship")
TINY_PER_CLASS = 20


def copy_images(src_split: Path, dst_split: Path, classes, per_class: int) -> Path:
    """Copy the first `per_class` JPEGs of each class (mtimes kept) into dst_split/<class>/."""
    for name in classes:
        (dst_split / name).mkdir(parents=True, exist_ok=True)
        for f in sorted((src_split / name).glob("*.jpg"))[:per_class]:
            shutil.copy2(f, dst_split / name / f.name)
    return dst_split


DOWNLOAD_ROOT = config.data_root()  # read at import, before each test points COURSE_DATA_ROOT at a temporary folder


class DataUnavailable(RuntimeError):
    """Neither an image folder nor a download gives the tests real CIFAR-10 images."""


def locate_cifar_folder(source: str | None, data_root: Path, mirror_url: str | None = None) -> Path:
    """The CIFAR-10 JPEG folder for the tests: jpeg.jpeg_folder, the lessons' own, with its errors as DataUnavailable:
    `source` (config.data_source(): COURSE_DATA, else the shared folder), or one written once from a download."""
    try:
        return jpeg.jpeg_folder(source, data_root, mirror_url)
    except (FileNotFoundError, RuntimeError) as err:
        raise DataUnavailable(f"The tests need real CIFAR-10 images. {err}") from err


@pytest.fixture(scope="session")
def cifar_folder() -> Path:
    """The real CIFAR-10 JPEG folder (<folder>/train/<class>/*.jpg); without one the whole run stops, remedies named."""
    try:
        return locate_cifar_folder(config.data_source(), DOWNLOAD_ROOT)
    except DataUnavailable as err:
        pytest.exit(str(err), returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session")
def make_folder(cifar_folder):
    """Factory: make_folder(dst_split, classes, per_class) copies real JPEGs into a new class-folder split."""
    return lambda dst_split, classes=TINY_CLASSES, per_class=TINY_PER_CLASS: copy_images(
        cifar_folder / "train", Path(dst_split), classes, per_class)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, make_folder) -> Path:
    """A <root>/train/<class>/*.jpg folder with 20 real JPEGs for each of 3 classes (treat as read-only)."""
    root = tmp_path_factory.mktemp("tiny")
    make_folder(root / "train")
    return root


@pytest.fixture(scope="session")
def session_data_root(tmp_path_factory) -> Path:
    """Session-wide COURSE_DATA_ROOT for caches of the small test folders."""
    return tmp_path_factory.mktemp("course_data_root")


# set as side effects by L.seed_everything and Trainer(deterministic=True); the notebooks' kernels must not inherit them
LEAKY_ENV = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "CUBLAS_WORKSPACE_CONFIG")


@pytest.fixture(autouse=True)
def _isolate_side_effects(monkeypatch, session_data_root, tmp_path_factory):
    """Point caches and build outputs at tmp dirs for each test, and undo global side effects afterwards.

    Everything is restored after the test, so the notebooks run later in the same session see the defaults.
    Tests that use the big 50k folder delete COURSE_DATA_ROOT so its cache is the repo's data/cache."""
    monkeypatch.setenv(config.DATA_ROOT_ENV, str(session_data_root))
    monkeypatch.setenv(config.BUILD_ENV, str(tmp_path_factory.getbasetemp() / "course_build"))
    saved_env = {k: os.environ.get(k) for k in LEAKY_ENV}
    deterministic = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(deterministic)
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
