"""scripts/gpu_capstone.py without a GPU: the dry run goes through every part but airbench's CUDA-only training
(packing, airbench's data files, the course's runs, the twin, the report, lessons 03-06's rows), and the pieces that
only a GPU run reaches (the airbench package from its sdist, reading airbench's printed table) are tested here."""
import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
from course_lib.base import hardware, results  # noqa: E402
from course_lib.training import muon  # noqa: E402
from scripts import airbench_carry  # noqa: E402

#: airbench 0.1.8's own table, printed by its print_training_details (train94, verbose=True)
AIRBENCH_OUTPUT = """\
------------------------------------------------------------------------------------------------------
|  run     |  epoch  |  train_loss  |  train_acc  |  val_acc  |  tta_val_acc  |  total_time_seconds  |
------------------------------------------------------------------------------------------------------
|       1  |      0  |      1.2346  |     0.5000  |   0.6100  |               |              0.5123  |
|          |      9  |      1.2346  |     0.5000  |   0.9300  |               |              0.5123  |
|          |   eval  |      1.2346  |     0.5000  |   0.9300  |       0.9401  |              3.8321  |
------------------------------------------------------------------------------------------------------
"""
NUMBER = r"([0-9.]+)"
SPREAD = rf"{NUMBER}{{u}} ± {NUMBER}{{u}} \({NUMBER}–{NUMBER}{{u}}, (\d+) runs\)"


def spread(text: str, label: str, unit: str) -> tuple[float, float, float, float, int]:
    """mean, std, min, max, runs of the report line '- label: mean ± std (min–max, n runs)'."""
    m = re.search(re.escape(f"- {label}: ") + SPREAD.replace("{u}", re.escape(unit)), text)
    assert m, f"no figure {label!r} in:\n{text}"
    mean, std, lo, hi, n = (float(g) for g in m.groups())
    assert lo <= mean <= hi and std >= 0
    return mean, std, lo, hi, int(n)


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_dry_run_writes_every_part_with_parsable_figures(make_folder, cifar_folder, tmp_path):
    classes = sorted(p.name for p in (cifar_folder / "train").iterdir() if p.is_dir())
    folder = tmp_path / "jpeg"
    make_folder(folder / "train", classes, 40)  # 400 real JPEGs: 360 train / 40 test, like the full split
    build = tmp_path / "build"
    env = {**os.environ, "COURSE_BUILD": str(build), "COURSE_DATA_ROOT": str(tmp_path / "data"),
           "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([sys.executable, "-m", "scripts.gpu_capstone", "--dry-run", "--data", str(folder)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    text = (build / "gpu_capstone-dryrun.md").read_text()
    assert "FAILED" not in text, text
    assert f"Command: `python -m scripts.gpu_capstone --dry-run --data {folder}`" in text
    assert "Versions and hardware facts:" in text and "lightning 2." in text
    assert "train 256 / test 40 images" in text and "(6 steps)" in text  # 1.5 epochs of 4 full batches

    a = section(text, "## (a) airbench94 itself")
    assert "256 training and 40 test images" in a and "dry run: not run" in a
    counts = airbench_carry.check_data(build / "capstone" / "airbench" / "cifar10")  # the files airbench would read
    assert counts == {"train": 256, "test": 40}

    b = section(text, "## (b) the course's SpeedrunModule (Lightning)")
    acc = spread(b, "accuracy", " %")
    assert 0 <= acc[0] <= 100 and acc[4] == 2
    for label in ("time (fit + test)", "trainer.fit", "trainer.test"):
        assert spread(b, label, " s")[0] > 0
    c = section(text, "## (c) the plain-PyTorch twin")
    assert spread(c, "accuracy", " %")[4] == 2 and spread(c, "time (whitening + training + TTA)", " s")[0] > 0
    assert spread(c, "Lightning / twin epoch time (target <= 1.05x)", "x")[0] > 0
    losses = [float(x) for x in re.findall(r"\| ([0-9.]+e[-+]\d+) \|", c)]  # largest loss gap, first 10 steps
    assert len(losses) == 2 and max(losses) < 1e-4  # same batches and weights: the same loss curve
    comparison = section(text, "## Comparison")
    assert re.search(r"time, Lightning \(b\) / plain twin \(c\): [0-9.]+x ± [0-9.]+x", comparison)
    assert re.search(r"accuracy, \(b\) - \(c\): [-+][0-9.]+ pt", comparison)
    shown = results.committed("gpu_capstone-dryrun.md", build)  # what lesson 08 prints of a GPU run
    assert len(shown) == 1 and shown[0]["hardware"].startswith("Hardware: CPU")
    assert shown[0]["comparison"] == [ln for ln in comparison.splitlines() if ln.startswith("- ")] != []

    e = section(text, "## (e) airbench94_muon itself")  # the dry run trains its port: the original is CUDA-only
    assert "airbench_muon_port.py" in e and spread(e, "accuracy", " %")[4] == 2 and spread(e, "time", " s")[0] > 0
    f = section(text, "## (f) the course's Muon rung")
    assert spread(f, "accuracy", " %")[4] == 2 and spread(f, "time (fit + test)", " s")[0] > 0
    assert muon.describe(muon.iteration_dtype("cpu")) in f  # the dtype the policy chose on this class, printed
    muon_lines = section(text, "## Muon comparison")
    assert "- time: the course (f)" in muon_lines and "- accuracy: the course (f)" in muon_lines
    assert text.index("## (a)") < text.index("## (e)") < text.index("## (f)") < text.index("## (d)")
    g = section(text, "## (g) hiverge's record (its port)")  # the record's loop, ported (issue 46)
    assert "hiverge_port.py" in g and spread(g, "accuracy", " %")[4] == 2 and spread(g, "time", " s")[0] > 0
    h = section(text, "## (h) the course's record rung")
    assert spread(h, "accuracy", " %")[4] == 2 and "selective TTA" in h
    record = section(text, "## Record comparison")
    assert "- time: the course (h)" in record and "- accuracy: the course (h)" in record
    assert text.index("## (f)") < text.index("## (g)") < text.index("## (h)") < text.index("## (d)")

    d = section(text, "## (d) lessons 03-05 and 06's one-device row")
    check = (build / "gpu_check-dryrun.md").read_text()
    for name in ("small CNN, GPU-resident data", "ResNet-9 fp32", "lesson 06: 1 device"):
        assert re.search(re.escape(name) + r"[^|]*: [0-9,]+ images/s", d), d
        assert name in check
    assert not (REPO / "docs" / "results" / "None-capstone.md").exists()


def test_airbench_table_is_read_from_its_printed_output():
    assert airbench_carry.parse_table(AIRBENCH_OUTPUT) == {"tta_val_acc": 0.9401, "total_time_seconds": 3.8321}
    with pytest.raises(ValueError, match="No 'eval' row"):
        airbench_carry.parse_table(AIRBENCH_OUTPUT.replace("eval", "   9"))


def test_airbench_data_files_have_cifarloaders_layout(tmp_path):
    """(N, 3, H, W) course tensors become torchvision's (N, H, W, 3) uint8 layout; a wrong file fails the check."""
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 3, 9])
    root = airbench_carry.write_data(images, labels, images[:2], labels[:2], [str(i) for i in range(10)], tmp_path)
    assert airbench_carry.check_data(root) == {"train": 5, "test": 2}
    saved = torch.load(root / "train.pt")
    assert torch.equal(saved["images"].permute(0, 3, 1, 2), images) and saved["labels"].dtype == torch.int64
    torch.save({**saved, "images": images}, root / "train.pt")  # channels first: not what CifarLoader reads
    with pytest.raises(ValueError, match="uint8 \\(N, 32, 32, 3\\)"):
        airbench_carry.check_data(root)


def test_make_data_packs_the_jpegs_and_carries_the_airbench_package(tiny_folder, tmp_path):
    """--make-data with --airbench-sdist: the JPEG pack, and airbench/*.py out of the sdist into the carry folder,
    importable from there (a stand-in sdist with airbench's layout: the real one is not downloaded in CI)."""
    sdist = tmp_path / "airbench-0.1.8.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for name, body in (("__init__.py", b"from .lib_airbench94 import train94\n"),
                           ("lib_airbench94.py", b"def train94(*a, **k):\n    return 'stand-in'\n")):
            info = tarfile.TarInfo(f"airbench-0.1.8/airbench/{name}")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    carry, pack = tmp_path / "carry", tmp_path / "carry" / "pack.pt"
    res = subprocess.run([sys.executable, "-m", "scripts.gpu_capstone", "--make-data", str(pack), "--data",
                          str(tiny_folder), "--airbench-sdist", str(sdist), "--carry", str(carry)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    data = torch.load(pack, weights_only=True)
    assert len(data["labels"]) == 60 and data["offsets"][-1] == len(data["jpeg"])
    assert sorted(p.name for p in (carry / "airbench").iterdir()) == ["CARRIED.txt", "__init__.py",
                                                                     "lib_airbench94.py"]
    code = (f"from scripts import airbench_carry; from pathlib import "
            f"Path; print(airbench_carry.import_airbench(Path({str(carry)!r})).train94())")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "stand-in", out.stderr[-2000:]


STUB_LIB = '''
import os, torch
hyp = {"opt": {"batch_size": 4, "train_epochs": 9.9}, "aug": {"flip": True, "translate": 2},
       "net": {"tta_level": 2}}
def train94(train_loader, run=0, verbose=True):
    test = torch.load(os.path.join("cifar10", "test.pt"))  # relative, as airbench's train() reads it
    print(f"|  {run}  |  eval  |  1.0  |  0.5  |  0.5  |  {len(test['labels']) / 100:.4f}  |  {1 + run:.4f}  |")
    return len(test["labels"])
'''
STUB_INIT = '''
import os, torch
from . import lib_airbench94
from .lib_airbench94 import train94
class CifarLoader:
    def __init__(self, path, train=True, batch_size=500, aug=None, altflip=False):
        self.labels = torch.load(os.path.join(path, "train.pt" if train else "test.pt"))["labels"]
        self.batch_size = batch_size
    def __len__(self):
        return len(self.labels) // self.batch_size
def evaluate(model, loader, tta_level=0):
    return model / 100
'''


def test_airbench_runs_are_read_from_a_stand_in_package(tmp_path, monkeypatch):
    """airbench_carry.run's loop on the GPU path with a stand-in airbench: a warm-up first (not reported), then one run
    per seed in the data folder (train94 reads cifar10/test.pt relatively), its printed accuracy and time read back."""
    (tmp_path / "carry" / "airbench").mkdir(parents=True)
    (tmp_path / "carry" / "airbench" / "lib_airbench94.py").write_text(STUB_LIB)
    (tmp_path / "carry" / "airbench" / "__init__.py").write_text(STUB_INIT)
    images, labels = torch.zeros(12, 3, 32, 32, dtype=torch.uint8), torch.arange(12) % 10
    airbench_carry.write_data(images, labels, images[:7], labels[:7], [str(i) for i in range(10)], tmp_path / "data")
    monkeypatch.syspath_prepend(str(tmp_path / "carry"))
    try:
        airbench = airbench_carry.import_airbench(tmp_path / "carry")
        seen, logged = [], []
        runs = airbench_carry.run(airbench, tmp_path / "data", [3, 4], on_run=lambda r: seen.append(len(r)),
                                  log=logged.append)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == "airbench"]:
            del sys.modules[name]
    assert [r["seed"] for r in runs] == [3, 4] and seen == [1, 2] and len(logged) == 3  # warm-up + 2 runs
    assert [r["time_s"] for r in runs] == [2.0, 3.0] and all(r["acc"] == r["printed_acc"] == 0.07 for r in runs)
    assert runs[0]["steps"] == 30  # ceil(12 // 4 x 9.9)
    assert Path.cwd() != tmp_path / "data"


def test_lesson_checks_runs_every_gpu_check_row_target_pairs_first():
    """Part (d)'s order comes from the specs: every gpu_check row once, each target's pair before lesson 06's row,
    the other rows after it."""
    from scripts import gpu_check, lesson_checks

    names = [c["name"] for c in gpu_check.configs()]
    order = lesson_checks.order(names)
    assert sorted(order) == sorted([*names, lesson_checks.LESSON_06])
    paired = {n for _, row, base, _ in gpu_check.TARGETS for n in (row, base)}
    six = order.index(lesson_checks.LESSON_06)
    assert set(order[:six]) == paired and paired <= set(names)


def test_gpu_check_on_a_gpu_without_bf16_compiles_in_fp16(monkeypatch):
    """On a T4 (compute capability 7.5, no bf16) the bf16 rows are skipped by the policy, and lesson 05's compile
    still runs, in fp16, so the check says whether torch.compile works there; lesson_checks runs that row too."""
    from scripts import gpu_check, lesson_checks

    monkeypatch.setattr(hardware, "facts", lambda: {"gpu": "Tesla T4", "compute_capability": "7.5",
                                                    "bf16_native": False})
    rows = {c["name"]: c for c in gpu_check.configs()}
    fp16 = rows["ResNet-9 16-mixed + compile + channels_last"]
    assert fp16["precision"] == "16-mixed" and fp16["model"]["compile"]
    assert set(rows) <= set(lesson_checks.order(list(rows)))
    with pytest.raises(ValueError, match="no native bf16"):
        hardware.choose_precision(rows["ResNet-9 bf16 + compile + channels_last"]["precision"])


def test_seed_loop_warms_up_then_stops_at_the_deadline(monkeypatch):
    """experiments.seed_loop, the one seed loop under a time budget (gpu_capstone's parts, airbench's runs): the
    warm-up first and unreported, each run reported as it ends, no run started after the deadline (injected clock)."""
    from course_lib.training import experiments

    clock = iter([0.0, 5.0, 11.0, 20.0])  # time.monotonic() before each run: the third starts past the deadline
    monkeypatch.setattr(experiments.time, "monotonic", lambda: next(clock))
    calls, seen = [], []
    done = experiments.seed_loop(lambda s: calls.append(s) or s * 10, [1, 2, 3, 4], warmup=lambda: calls.append("w"),
                                 deadline=10.0, on_run=lambda runs: seen.append(list(runs)))
    assert calls == ["w", 1, 2] and done == [10, 20] and seen == [[10], [10, 20]]


def test_part_b_reports_each_seed_and_the_spent_budget(tmp_path, monkeypatch):
    """gpu_capstone's part (b) through experiments.seed_runs: the warm-up seed first, a table row per finished seed,
    and a 'time budget spent' line when the deadline stops it (injected runs and clock, nothing trains)."""
    import types

    from course_lib.base import results
    from course_lib.training import experiments
    from scripts import gpu_capstone

    ran = []

    def fake_run(module, dm, *, seed, epochs, precision):
        ran.append(seed)
        return experiments.SeedRun(seed, 0.9, 1.0, [0.5, 0.5], 1.2, 0.1, 1.3, 4, torch.zeros(4))

    clock = iter([0.0, 50.0])  # the second seed would start past the deadline
    monkeypatch.setattr(experiments, "run_seed", fake_run)
    monkeypatch.setattr(experiments.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(experiments, "flop_summary", lambda **kw: types.SimpleNamespace(text="1 GFLOP per epoch"))
    module = types.SimpleNamespace(recipe=types.SimpleNamespace(widths=(8, 16, 16), batch_size=4))
    dm = types.SimpleNamespace(train_dataloader=lambda: [0, 1])
    report = results.Report(tmp_path / "r.md", "t", order=("b",), info={"gpu": None, "cpu": "X", "cpu_cores": 2})
    trials = gpu_capstone.part_b(module, dm, report, seeds=[0, 1], epochs=2, precision="32-true", deadline=10.0,
                                 head=["## (b)"])
    assert ran == [1000, 0] and [t.seed for t in trials] == [0]
    text = (tmp_path / "r.md").read_text()
    assert "| 0 | 90.00% |" in text and "- 1 GFLOP per epoch" in text and "time budget spent after 1 runs" in text
