"""`python -m course_lib fit|test` end to end on a tiny folder, run from outside the checkout, COURSE_BUILD in tmp."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cli(tmp_path_factory, tiny_folder):
    """Runs `python -m course_lib <command> --config configs/lenet.yaml <args>` from a folder outside the checkout."""
    out = tmp_path_factory.mktemp("cli")
    (out / "elsewhere").mkdir()
    env = {**os.environ, "COURSE_SIZE": "smoke", "COURSE_DATA": str(tiny_folder),
           "COURSE_DATA_ROOT": str(out / "data"), "COURSE_BUILD": str(out / "build")}

    def run(command: str, *args: str, check: bool = True, **env_extra) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "course_lib", command, "--config", str(REPO / "configs/lenet.yaml"), *args],
            cwd=out / "elsewhere", env={**env, **env_extra}, capture_output=True, text=True, timeout=180)
        if check:
            assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    run.out = out
    run.run_dir = out / "build" / "runs" / "lenet"
    run.fit = run("fit", "--model.num_classes", "3")  # the one training run the tests below share
    return run


def test_fit_writes_checkpoint_and_logs(cli, tiny_folder):
    """fit exits 0 and writes last.ckpt, best.ckpt and the CSV logs under $COURSE_BUILD/runs/lenet, whatever the
    working folder; nothing lands in the working folder."""
    assert (cli.run_dir / "checkpoints" / "last.ckpt").exists() and (cli.run_dir / "checkpoints" / "best.ckpt").exists()
    assert not any((cli.out / "elsewhere").iterdir())
    metrics = next((cli.run_dir / "logs").glob("version_*/metrics.csv")).read_text()
    assert "val_acc" in metrics and "train_loss" in metrics
    saved = yaml.safe_load(next((cli.run_dir / "logs").glob("version_*/config.yaml")).read_text())
    assert saved["trainer"]["max_epochs"] == 1  # COURSE_SIZE=smoke
    assert saved["data"]["subset"] == 2048 and saved["data"]["image_folder"] == str(tiny_folder)


def test_fit_redirected_to_a_file_logs_a_line_per_epoch(cli):
    """With stdout not a terminal (captured here), fit prints one line per epoch and no progress-bar refreshes."""
    log = cli.fit.stdout + cli.fit.stderr
    assert "\r" not in log and len(log.encode()) < 8_000, log[-2000:]
    lines = [line for line in cli.fit.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 1 and "1/1" in lines[0] and "val_acc" in lines[0] and "train_loss" in lines[0]


def test_log_defaults_keep_the_progress_bar_in_a_terminal():
    """In a terminal the usual progress bar stays; redirected, it is replaced by the per-epoch lines."""
    from course_lib.cli import EpochLines, log_defaults

    assert log_defaults(interactive=True) == {}
    quiet = log_defaults(interactive=False)
    assert quiet["enable_progress_bar"] is False and isinstance(quiet["callbacks"][0], EpochLines)


def test_test_on_foreign_folder_reports_accuracy(cli, tiny_folder):
    """test --ckpt_path last.ckpt --data.test_folder grades the checkpoint and prints test_acc."""
    result = cli("test", "--ckpt_path", str(cli.run_dir / "checkpoints" / "last.ckpt"),
                 "--data.test_folder", str(tiny_folder / "train"))
    assert "test_acc" in result.stdout and "test_loss" in result.stdout


def test_fit_resumes_from_last(cli, tmp_path):
    """fit --ckpt_path last finds last.ckpt in the checkpoint dirpath and restores all states (it resumes a copy of
    the shared run, which the other tests read as the one fit left it)."""
    shutil.copytree(cli.out / "build", tmp_path / "build")
    result = cli("fit", "--ckpt_path", "last", COURSE_BUILD=str(tmp_path / "build"))
    log = result.stdout + result.stderr
    assert "Restored all states" in log
    assert str(tmp_path / "build" / "runs" / "lenet" / "checkpoints" / "last.ckpt") in log


def test_new_fit_over_an_earlier_run_refuses_and_names_the_remedies(cli):
    """A fresh fit where last.ckpt of an earlier run exists would overwrite it: it stops first, naming the remedies,
    and prints the message alone (no traceback)."""
    result = cli("fit", "--model.num_classes", "3", check=False)
    assert result.returncode == 1
    assert "--ckpt_path last" in result.stderr and "--run_name" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


def logged_metric(log: str, name: str) -> float:
    """A metric's value from the table `test` prints."""
    match = re.search(rf"{name}\W+([0-9.]+)", log)
    assert match, log[-2000:]
    return float(match.group(1))


def test_test_folder_graded_by_the_checkpoints_classes_whatever_course_data_says(cli, tiny_folder, make_folder,
                                                                                 tmp_path):
    """The same checkpoint and cat/ship folder give the same accuracy with COURSE_DATA at the 3-class training folder
    and at a 2-class cat/ship folder: the labels come from the classes the checkpoint records, not COURSE_DATA's."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "ship"), per_class=10)
    other = make_folder(tmp_path / "other" / "train", classes=("cat", "ship"), per_class=4).parent
    args = ("--ckpt_path", str(cli.run_dir / "checkpoints" / "last.ckpt"), "--data.test_folder", str(foreign))
    same = cli("test", *args)
    moved = cli("test", *args, COURSE_DATA=str(other))
    for name in ("test_acc", "test_loss"):
        assert logged_metric(same.stdout, name) == logged_metric(moved.stdout, name)
    assert torch.load(cli.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["classes"] \
        == ["airplane", "cat", "ship"]


def test_test_folder_with_a_class_the_checkpoint_lacks_is_refused(cli, make_folder, tmp_path):
    """A test folder with a class the model never learned fails, naming it, without a traceback."""
    foreign = make_folder(tmp_path / "foreign", classes=("cat", "dog"), per_class=2)
    result = cli("test", "--ckpt_path", str(cli.run_dir / "checkpoints" / "last.ckpt"),
                 "--data.test_folder", str(foreign), check=False)
    assert result.returncode == 1 and "dog" in result.stderr and "Traceback" not in result.stderr


def test_failed_fit_prints_the_message_alone_and_leaves_no_empty_run_folder(cli, make_folder, tmp_path):
    """A fit that fails at setup (an 11-class folder on a 10-way head) exits 1 with the course's message and no
    traceback (--debug brings it back), and leaves no empty logs/version_N folder."""
    from course_lib.data import CIFAR10_CLASSES

    make_folder(tmp_path / "eleven" / "train", classes=CIFAR10_CLASSES, per_class=2)
    shutil.copytree(tmp_path / "eleven" / "train" / "cat", tmp_path / "eleven" / "train" / "lynx")
    env = {"COURSE_DATA": str(tmp_path / "eleven"), "COURSE_BUILD": str(tmp_path / "build")}
    result = cli("fit", check=False, **env)
    assert result.returncode == 1 and "--model.num_classes 11" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not list((tmp_path / "build").rglob("version_*"))
    debug = cli("fit", "--debug", check=False, **env)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


def test_16_mixed_on_a_cpu_is_an_error_not_a_silent_bf16_run(capsys):
    """--trainer.precision 16-mixed on a CPU stops with the policy's message (Lightning alone would run bf16-mixed)."""
    from course_lib.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(REPO / "configs/lenet.yaml"), "--trainer.accelerator", "cpu",
              "--trainer.precision", "16-mixed"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "16-mixed" in err and "GPU" in err and "32-true" in err and "Traceback" not in err


def test_precision_the_cpu_has_passes_through():
    """32-true (and its short name 32) pass the policy unchanged on any machine."""
    from course_lib.cli import CourseCLI

    assert CourseCLI._checked_precision("32", "cpu") == "32-true"
    assert CourseCLI._checked_precision(None, "auto") is None


def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    """A broken config names its file and line, before LightningCLI's parser (which names neither file)."""
    from course_lib.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_epochs: 2\n   devices: [1\n")
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(bad)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 3" in err


def test_explicit_backbone_that_contradicts_the_checkpoint_is_an_error(cli, capsys):
    """--model.backbone simple_cnn with a LeNet checkpoint is refused, naming both (LightningCLI alone silently
    replaces the flag with the checkpoint's hyperparameters)."""
    from course_lib.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["test", "--config", str(REPO / "configs/lenet.yaml"), "--model.backbone", "simple_cnn",
              "--ckpt_path", str(cli.run_dir / "checkpoints" / "last.ckpt")])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "--model.backbone simple_cnn contradicts" in err and "backbone=lenet" in err


def test_every_keyword_only_setting_is_set_from_yaml_and_from_a_flag(tmp_path, capsys, monkeypatch):
    """ImageClassifierModule's and CIFAR10DataModule's keyword-only settings all reach LightningCLI's config: a YAML
    value and a command-line flag each override the default (print_config shows the parsed result)."""
    import inspect

    from course_lib.cli import main
    from course_lib.data import CIFAR10DataModule
    from course_lib.modules import ImageClassifierModule

    monkeypatch.setattr(sys, "argv", ["course_lib"])  # pytest's own flags are not the CLI's
    yaml_file = tmp_path / "over.yaml"
    yaml_file.write_text("model:\n  momentum: 0.8\n  warmup_fraction: 0.3\ndata:\n  seed: 7\n  val_fraction: 0.2\n")
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(REPO / "configs/lenet.yaml"), "--config", str(yaml_file), "--model.lr", "0.123",
              "--data.test_fraction", "0.15", "--print_config"])
    assert stop.value.code == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    for cls, section in ((ImageClassifierModule, "model"), (CIFAR10DataModule, "data")):
        keyword_only = [p.name for p in inspect.signature(cls).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert len(keyword_only) >= 11 and set(keyword_only) <= set(cfg[section])
    assert (cfg["model"]["momentum"], cfg["model"]["warmup_fraction"], cfg["model"]["lr"]) == (0.8, 0.3, 0.123)
    assert (cfg["data"]["seed"], cfg["data"]["val_fraction"], cfg["data"]["test_fraction"]) == (7, 0.2, 0.15)
