"""Shared fixtures: the real CIFAR-10 JPEG folder (found, or made from a download), small copies of it, per-test
cache isolation, and the GPU machine's fork rule, emulated in every process the tests start. The two tiers: `slow`
marks what trains, starts a Python process or executes a notebook (SLOW, one list); `--shuffle-seed N` shuffles."""
from __future__ import annotations

import importlib.util
import multiprocessing.process
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from course_lib.base import config, hardware
from course_lib.data import jpeg
from course_lib.data.sources import load_image_folder
from course_lib.training import runs

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


# make test runs the test files side by side (pytest-xdist: -n auto --dist loadfile). Each worker, and every process
# it starts (nbval's kernels, spawned workers, scripts), gets its share of the cores, as Lightning gives each DDP
# process: without it, each would start a thread per core and they would fight over the cores.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if XDIST_WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // XDIST_WORKERS))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# on for the whole run, here and (through PYTHONPATH) in every child: nbval's kernels, spawned workers, torchrun ranks
os.environ["PYTHONPATH"] = os.pathsep.join([str(FORK_RULE), *filter(None, [os.environ.get("PYTHONPATH")])])
fork_rule = load_fork_rule()
fork_rule.install(torch)


def pytest_configure(config):
    """The warnings the lessons hide as unactionable (runs.UNACTIONABLE, one list) are hidden in the tests too; a
    fast-tier run (-m "not slow") watches for tests that belong to the slow tier."""
    for message, module in runs.UNACTIONABLE:
        config.addinivalue_line("filterwarnings", f"ignore:{message}::{module}")
    config.addinivalue_line("markers", "class_free: no hardware class changes its outcome (CLASS_FREE); make test's "
                                       "second pass leaves it out")
    if "not slow" in (config.getoption("markexpr") or ""):
        config.pluginmanager.register(SlowGuard(), "slow_guard")
    if hasattr(config.option, "loadscopereorder"):  # xdist: hand out the files in the collected order (HEAVY_FIRST)
        config.option.loadscopereorder = False


# The slow tier (`make test` runs it, `make test-fast` leaves it out): every notebook cell, and these node-id prefixes,
# the tests that train (Trainer.fit), start a Python process (subprocess, spawned workers, torchrun) or take seconds
# for another reason. SlowGuard fails a fast-tier test that trains or starts a Python process, naming this list.
SLOW = tuple(f"tests/{path}" for path in [  # whole files
    "test_classes.py", "test_cli_output.py", "test_cli_robust.py", "test_exercise_pastes.py", "test_exercises.py",
    "test_gpu_fork_rule.py",
    "test_gpu_fp16.py", "test_gpu_ondevice.py", "test_gpu_syncs.py", "test_gpu_tf32.py", "test_repro.py",
    "test_resume.py", "test_site.py",
]) + tuple(f"tests/{path}::{name}" for path, names in {  # tests, by name or name prefix
    "test_capstone.py": ["test_dry_run_writes_every_part_with_parsable_figures",
                         "test_make_data_packs_the_jpegs_and_carries_the_airbench_package"],
    "test_cli.py": ["test_explicit_backbone_that_contradicts_the_checkpoint_is_an_error", "test_failed_fit_",
                    "test_fit_", "test_new_fit_over_an_earlier_run", "test_test_"],
    "test_colab_install.py": ["test_install_cell_"],
    "test_compress.py": ["test_pruning_callback", "test_ptq_", "test_qat_trains", "test_reloaded_int8"],
    "test_data.py": ["test_full_folder_cached_in_repo_data"],
    "test_ddp.py": ["test_ddp_matches_one_process", "test_script_path_lightning", "test_torchrun_cli_ddp",
                    "test_two_nodes_on_localhost", "test_workers_survive_busy_cores"],
    "test_exercise_checks.py": ["test_01_", "test_02_", "test_03_", "test_07_", "test_08_"],
    "test_fidelity.py": ["test_training_matches_airbench_step_for_step"],
    "test_internals.py": ["test_epoch_batch_progress_", "test_profiled_fetch_and_step_s_"],
    "test_modules.py": ["test_barebones_", "test_fast_dev_run_", "test_logged_", "test_module_schedule_",
                        "test_new_fit_from_loaded_weights"],
    "test_muon.py": ["test_module_and_twin_train", "test_muon_recipe_optimizer_steps", "test_twin_trains",
                     "test_module_and_twin_start_from_the_drawn", "test_lightning_trains_as_airbench94_muons_loop"],
    "test_notebook_outputs.py": ["test_quiet_lightning_removes_the_noise"],
    "test_scripts.py": ["test_child_env_lets_a_child_process", "test_gpu_scripts_run_from_a_checkout"],
    "test_speed.py": ["test_bench_", "test_device_data_module_trains", "test_scaling_measures", "test_too_few_steps"],
    "test_speedrun.py": ["test_bad_inputs", "test_datamodule_carves", "test_fractional_epochs",
                         "test_lightning_module_and", "test_recipe_is_the_one_source", "test_tta_levels",
                         "test_twin_compiles", "test_whitening_bias_trains"],
}.items() for name in names)


# In the Makefile's HARDWARE_TESTS files, the costly tests whose outcome no hardware class changes: make test's second
# pass (the same files under another CPU class) leaves them out with -m "not class_free"; the first pass runs them.
CLASS_FREE = (
    # packs JPEGs and carries a stand-in sdist: no precision, dtype or int8 decision on its path
    "tests/test_capstone.py::test_make_data_packs_the_jpegs_and_carries_the_airbench_package",
)


# make test's costliest files, costliest first (make test's --durations on the 2-core EPYC, issue 45): the xdist
# workers (--dist loadfile) take them first, so the run does not end with one worker in a long file while the others
# idle. pytest_configure keeps this order (xdist would otherwise hand out files by their number of tests). Lesson 00
# goes before them all: it measures and saves the ceilings (a fresh clone has none), which 01, 02, 04, 05, 07 and
# 08 then load instead of each measuring its own.
HEAVY_FIRST = (
    "notebooks/00_setup.ipynb", "tests/test_ddp.py", "notebooks/06_ddp.ipynb", "notebooks/08_capstone.ipynb",
    "notebooks/04_mixed_precision.ipynb", "tests/test_exercises.py", "tests/test_capstone.py",
    "notebooks/01_pytorch_baseline.ipynb", "tests/test_cli_output.py", "notebooks/07_quantization.ipynb",
    "tests/test_resume.py", "tests/test_cli_robust.py", "notebooks/05_compile_and_tuning.ipynb",
    "notebooks/02_lightning.ipynb", "tests/test_gpu_ondevice.py", "notebooks/03_gpu_and_data.ipynb",
    "tests/test_site.py", "tests/test_colab_install.py", "tests/test_gpu_fork_rule.py",
    "tests/test_exercise_checks.py",
)


def pytest_addoption(parser):
    parser.addoption("--shuffle-seed", type=int, default=None, metavar="N",
                     help="run the test files in an order shuffled by seed N, and the tests of each file shuffled "
                          "too (a notebook's cells keep their order)")


def pytest_report_header(config):
    seed = config.getoption("shuffle_seed")
    return None if seed is None else f"shuffled with --shuffle-seed {seed}"


def is_notebook_cell(item) -> bool:
    """An nbval item: one cell of a lesson notebook."""
    return item.path.suffix == ".ipynb"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Mark the slow tier; with --shuffle-seed, shuffle files and the tests within each (notebook cells stay in order,
    and a file's tests stay together so its module-scoped fixtures are built once)."""
    for item in items:
        if is_notebook_cell(item) or item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if item.nodeid.startswith(CLASS_FREE):
            item.add_marker(pytest.mark.class_free)
    seed = config.getoption("shuffle_seed")
    if seed is None:  # the costliest files first (HEAVY_FIRST), the rest in collection order; sorted() is stable
        items[:] = sorted(items, key=lambda item: HEAVY_FIRST.index(item.nodeid.split("::")[0])
                          if item.nodeid.split("::")[0] in HEAVY_FIRST else len(HEAVY_FIRST))
        return
    rng, files = random.Random(seed), {}
    for item in items:
        files.setdefault(item.path, []).append(item)
    order = list(files.values())
    rng.shuffle(order)
    for group in order:
        if not is_notebook_cell(group[0]):
            rng.shuffle(group)
    items[:] = [item for group in order for item in group]


def starts_python(args) -> bool:
    """Whether a subprocess command line starts a Python interpreter (python, torchrun, jupyter), the costly kind."""
    argv = args.split() if isinstance(args, (str, bytes)) else list(args)
    first = str(argv[0]) if argv else ""
    return first == sys.executable or Path(first).name.startswith(("python", "torchrun", "jupyter"))


class SlowGuard:
    """In a fast-tier run: a test (or a fixture it sets up) that trains with Trainer.fit or starts a Python process
    fails at teardown, naming SLOW. The patched calls still run, so the code under test sees no difference."""

    def __init__(self):
        self.current, self.seen = None, {}  # the running item's node id; node id -> what it did

    def note(self, what: str) -> None:
        if self.current is not None:
            self.seen.setdefault(self.current, []).append(what)

    def pytest_sessionstart(self, session):
        process = multiprocessing.process.BaseProcess  # every start method's Process: fork, spawn, forkserver
        popen, start, fit = subprocess.Popen.__init__, process.start, L.Trainer.fit
        guard = self

        def popen_init(self, args, *rest, **kwargs):
            if starts_python(args):
                guard.note(f"starts a Python process: {str(args)[:120]}")
            popen(self, args, *rest, **kwargs)

        def process_start(self):
            guard.note(f"starts a {type(self).__name__}")
            start(self)

        def trainer_fit(self, *args, **kwargs):
            guard.note("trains (Trainer.fit)")
            return fit(self, *args, **kwargs)

        self.restore = [(subprocess.Popen, "__init__", popen), (process, "start", start), (L.Trainer, "fit", fit)]
        subprocess.Popen.__init__, process.start, L.Trainer.fit = popen_init, process_start, trainer_fit

    def pytest_sessionfinish(self, session):
        for owner, name, original in self.restore:
            setattr(owner, name, original)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        try:
            return (yield)
        finally:
            self.current = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        seen = self.seen.pop(item.nodeid, None) if call.when == "teardown" else None
        if seen and report.passed:
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} belongs to the slow tier: it {'; '.join(sorted(set(seen)))}. Add its "
                               f"node id to SLOW in tests/conftest.py.")
        return report


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


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """course_lib.entry.cli.main(args) in this process: its exit code (0 when it returns) and its output."""
    from course_lib.entry.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def hardware_class(monkeypatch):
    """The one seam for the hardware in tests: hardware_class("cpu-avx2") makes every hardware decision, in this test
    and in the processes it starts, answer as on that class (hardware.CLASSES; COURSE_HARDWARE); returns the class."""
    def use(name: str) -> hardware.HardwareClass:
        monkeypatch.setenv(hardware.HARDWARE_ENV, name)
        return hardware.emulated()
    return use


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
def real(tiny_folder, session_data_root):
    """tiny_folder's 60 real CIFAR-10 images (3 classes) as uint8 (N, 3, 32, 32) and their labels, decoded once."""
    data = load_image_folder(tiny_folder / "train", session_data_root / "cache")
    return data["images"], data["labels"]


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
